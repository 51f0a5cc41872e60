//! Helpers for the disk's unit tests: image files with known contents, a
//! split ring in test memory, an interrupt recorder.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

use virtio_queue::Queue;
use vm_memory::{Bytes, GuestAddress};

use virtio_iommu::locks::Unpoison;

use crate::dma::DmaSpace;
use crate::memory::GuestMemoryMmap;
use crate::virtio::test_ring::{leaked_ram, DriverRing, RingAddrs};
use crate::virtio::VirtioInterrupt;

/// Byte `i` of a fresh test image.
pub fn pattern(i: usize) -> u8 {
    u8::try_from(i % 251).expect("below 251")
}

/// A file of `len` bytes of [`pattern`] in the temporary directory.
pub fn temp_image(len: usize) -> (PathBuf, File) {
    static N: AtomicU32 = AtomicU32::new(0);
    let p = std::env::temp_dir().join(format!(
        "dmavisor-blk-{}-{}.raw",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let mut f = File::create(&p).expect("temp image");
    let data: Vec<u8> = (0..len).map(pattern).collect();
    f.write_all(&data).expect("temp image contents");
    (p, f)
}

pub const DESC: u64 = 0x1000;
pub const AVAIL: u64 = 0x2000;
pub const USED: u64 = 0x3000;
pub const SIZE: u16 = 16;
/// Test RAM size.
pub const RAM: usize = 0x40000;

/// A split ring the test plays the driver of.
pub struct Ring {
    pub mem: &'static GuestMemoryMmap,
    pub dma: DmaSpace,
    driver: DriverRing<'static>,
}

impl Ring {
    pub fn new() -> Self {
        let mem = leaked_ram(RAM);
        let dma = DmaSpace::identity(mem.clone());
        let addrs = RingAddrs {
            desc: DESC,
            avail: AVAIL,
            used: USED,
        };
        Self {
            mem,
            dma,
            driver: DriverRing::new(mem, addrs, SIZE),
        }
    }

    /// The device's view of the ring, as the driver configured it.
    pub fn queue(&self) -> Queue {
        self.driver.queue()
    }

    pub fn desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        self.driver.desc(i, addr, len, flags, next);
    }

    pub fn offer(&mut self, head: u16) {
        self.driver.offer(head);
    }

    pub fn used_idx(&self) -> u16 {
        self.driver.used_idx()
    }

    /// Used entry `i`: (head, length).
    pub fn used(&self, i: u64) -> (u32, u32) {
        self.driver.used(i)
    }

    /// Writes a request header (type, sector) at `at`.
    pub fn header(&self, at: u64, type_: u32, sector: u64) {
        self.mem.write_obj(type_, GuestAddress(at)).expect("hdr");
        self.mem.write_obj(0u32, GuestAddress(at + 4)).expect("hdr");
        self.mem
            .write_obj(sector, GuestAddress(at + 8))
            .expect("hdr");
    }

    pub fn byte(&self, at: u64) -> u8 {
        self.mem.read_obj(GuestAddress(at)).expect("byte")
    }
}

/// Records what a device signalled.
#[derive(Default)]
pub struct Recorder {
    pub notified: Mutex<Vec<u16>>,
    pub needs_reset: AtomicU32,
}

impl VirtioInterrupt for Recorder {
    fn notify_queue(&self, queue: u16) {
        self.notified.lock().unpoisoned().push(queue);
    }

    fn notify_config(&self) {}

    fn set_needs_reset(&self) {
        self.needs_reset.fetch_add(1, Ordering::Relaxed);
    }
}
