//! Fuzzes the virtio-blk request path (`vmm::block::request::serve`):
//! arbitrary guest memory, queue size, head and descriptor table address,
//! against a small raw image (read-write or read-only).
//!
//! Input: [size u16][head u16][table u16][flags u8][guest memory bytes...].
//! Whatever the chain and the request, serving must not panic, the image
//! keeps its size (no write past the capacity), a read-only image keeps its
//! contents, an answered request reports a spec status (OK, IOERR, UNSUPP)
//! and a used length within the chain's writable bytes.
#![no_main]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use vm_memory::{Bytes, GuestAddress};
use vmm::block::request::{serve, Request};
use vmm::block::DiskImage;
use vmm::dma::DmaSpace;
use vmm::memory::GuestMemoryMmap;
use vmm::virtio::chain::walk;

const MEM_SIZE: usize = 0x10000;
const DISK_LEN: u64 = 16 * 512;

struct Disks {
    path: PathBuf,
    rw: DiskImage,
    ro: DiskImage,
    seed: Vec<u8>,
}

fn disks() -> &'static Disks {
    static D: OnceLock<Disks> = OnceLock::new();
    D.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("blk-fuzz-{}.raw", std::process::id()));
        let seed: Vec<u8> = (0..DISK_LEN).map(|i| (i % 253) as u8).collect();
        std::fs::write(&path, &seed).expect("image");
        let rw = DiskImage::open(&path, false, None).expect("rw image");
        let ro = DiskImage::open(&path, true, None).expect("ro image");
        Disks { path, rw, ro, seed }
    })
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 7 {
        return;
    }
    let size = u16::from_le_bytes([data[0], data[1]]);
    let head = u16::from_le_bytes([data[2], data[3]]);
    let table = u64::from(u16::from_le_bytes([data[4], data[5]]));
    let readonly = data[6] & 1 != 0;
    let Ok(mem) = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]) else {
        return;
    };
    let body = &data[7..];
    let n = body.len().min(MEM_SIZE);
    if mem.write_slice(&body[..n], GuestAddress(0)).is_err() {
        return;
    }
    let dma = DmaSpace::identity(mem);
    let Ok(chain) = walk(&dma, table, size, head) else {
        return;
    };
    let d = disks();
    let f = File::options().write(true).open(&d.path).expect("reopen");
    f.write_all_at(&d.seed, 0).expect("reset image");
    f.set_len(DISK_LEN).expect("reset length");
    let disk = if readonly { &d.ro } else { &d.rw };
    let mut req = Request::default();
    let mut iov = Vec::new();
    let mut failure = None;
    if let Ok(served) = serve(&dma, disk, &chain, &mut req, &mut iov, &mut failure) {
        assert!(served.status <= 2, "status {}", served.status);
        assert!(u64::from(served.used_len) <= chain.writable_len());
        assert_eq!(served.status == 0, failure.is_none());
    }
    let after = std::fs::read(&d.path).expect("image");
    assert_eq!(after.len() as u64, DISK_LEN, "image size changed");
    if readonly {
        assert_eq!(after, d.seed, "read-only image written");
    }
});
