//! Fuzzes the virtio-blk request path (`vmm::block::request::serve`):
//! arbitrary guest memory, queue size, head and descriptor table address,
//! against a small raw image (read-write or read-only).
//!
//! Input: [size u16][head u16][table u16][flags u8][guest memory bytes...].
//! Bits 1-3 of the flags pick small data limits (seg_max, size_max, bytes
//! per section) so that requests beyond them and long transfers in several
//! sections are reached. Whatever the chain and the request, serving must
//! not panic, the image keeps its size (no write past the capacity), a
//! read-only image keeps its contents, an answered request reports a spec
//! status (OK, IOERR, UNSUPP) and a used length within the chain's
//! writable bytes; a request beyond the limits moves no data and fails;
//! the sections are renewed once per chunk of data at most.
#![no_main]

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use vm_memory::{Bytes, GuestAddress};
use vmm::block::limits::Limits;
use vmm::block::request::{serve, Request, RequestIo};
use vmm::block::section::Section;
use vmm::block::DiskImage;
use vmm::dma::{DmaSpace, ThreadDma};
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
    let limits = Limits {
        seg_max: 1 + u32::from(data[6] >> 1 & 3) * 2,
        size_max: 512 << (data[6] >> 3 & 3),
        section_bytes: 512 << (data[6] >> 5 & 3),
    };
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
    let mut thread_dma = ThreadDma::new(dma.clone()).expect("identity space");
    let mut section = Section::enter(&mut thread_dma);
    let mut io = RequestIo {
        limits,
        iov: &mut iov,
        section: &mut section,
    };
    let served = serve(disk, &chain, &mut req, &mut io, &mut failure);
    let mut refused_write = false;
    if let Ok(served) = served {
        assert!(served.status <= 2, "status {}", served.status);
        assert!(u64::from(served.used_len) <= chain.writable_len());
        assert_eq!(served.status == 0, failure.is_none());
        // The data a read fills or a write takes.
        let moved = match req.type_ {
            0 => &req.writable,
            1 => &req.readable,
            _ => &req.writable[..0],
        };
        let data: u64 = moved.iter().map(|b| u64::from(b.len)).sum();
        let over =
            moved.len() > limits.seg_max as usize || moved.iter().any(|b| b.len > limits.size_max);
        if over && matches!(req.type_, 0 | 1) {
            assert_ne!(served.status, 0, "a request beyond the limits was served");
            refused_write = req.type_ == 1;
            assert_eq!(
                section.renewals(),
                0,
                "a request beyond the limits moved data"
            );
        }
        assert!(
            section.renewals() <= data / limits.section_bytes,
            "{} renewals for {data} bytes",
            section.renewals()
        );
    }
    let after = std::fs::read(&d.path).expect("image");
    assert_eq!(after.len() as u64, DISK_LEN, "image size changed");
    if readonly || refused_write {
        assert_eq!(after, d.seed, "read-only image or refused write written");
    }
});
