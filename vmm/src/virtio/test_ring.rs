//! The driver's side of a split virtqueue for unit tests, on
//! `virtio-queue`'s mock ring types: descriptors, offers and used entries
//! are typed stores and loads, and hostile values (indices out of range,
//! loops, avail index jumps) are written exactly as a test gives them.
//! [`returns_in_bound`] runs the device's side so that a device spinning
//! on such a ring fails its test instead of hanging the test binary.
//!
//! WHY the ring types at explicit addresses and not `MockSplitQueue`'s
//! layout: in virtio-queue 0.18 it puts the used ring at the avail ring's
//! `end()`, which counts ring elements rather than bytes, so for a queue
//! of 16 the used ring would overlap avail entries 8 and up.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use virtio_queue::desc::split::Descriptor;
use virtio_queue::desc::RawDescriptor;
use virtio_queue::mock::{AvailRing, DescriptorTable, UsedRing};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestAddress;

use crate::memory::GuestMemoryMmap;
use crate::virtio::VirtioInterrupt;
use crate::width::usize_from_u64;

/// Test RAM of `size` bytes at guest address 0, leaked so that a fixture
/// can hold both the memory and the [`DriverRing`] that borrows it (one
/// small mapping per test, freed when the test binary exits).
pub fn leaked_ram(size: usize) -> &'static GuestMemoryMmap {
    Box::leak(Box::new(
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size)]).expect("test RAM"),
    ))
}

/// Writes descriptor `i` of the descriptor table at `table`: a ring's, or
/// an indirect table a descriptor points to.
pub fn put_desc(
    mem: &GuestMemoryMmap,
    table: u64,
    i: u16,
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
) {
    DescriptorTable::new(mem, GuestAddress(table), i.saturating_add(1))
        .store(
            i,
            RawDescriptor::from(Descriptor::new(addr, len, flags, next)),
        )
        .expect("descriptor index");
}

/// Where a ring's three parts are: descriptor table, avail ring, used ring.
#[derive(Clone, Copy, Debug)]
pub struct RingAddrs {
    /// Descriptor table.
    pub desc: u64,
    /// Avail (driver) ring.
    pub avail: u64,
    /// Used (device) ring.
    pub used: u64,
}

/// A split ring the test plays the driver of.
pub struct DriverRing<'m> {
    addrs: RingAddrs,
    size: u16,
    table: DescriptorTable<'m, GuestMemoryMmap>,
    avail: AvailRing<'m, GuestMemoryMmap>,
    used: UsedRing<'m, GuestMemoryMmap>,
    /// The avail index the next offer publishes after (the driver's own
    /// count, whatever a test wrote into the ring meanwhile).
    avail_idx: u16,
}

impl<'m> DriverRing<'m> {
    /// A ring of `size` entries at `addrs` in `mem`, its indices and flags
    /// zeroed.
    pub fn new(mem: &'m GuestMemoryMmap, addrs: RingAddrs, size: u16) -> Self {
        Self {
            addrs,
            size,
            table: DescriptorTable::new(mem, GuestAddress(addrs.desc), size),
            avail: AvailRing::new(mem, GuestAddress(addrs.avail), size),
            used: UsedRing::new(mem, GuestAddress(addrs.used), size),
            avail_idx: 0,
        }
    }

    /// The device's view of the ring, as the driver configured it.
    pub fn queue(&self) -> Queue {
        let mut queue = Queue::new(self.size).expect("queue");
        queue.try_set_size(self.size).expect("size");
        queue
            .try_set_desc_table_address(GuestAddress(self.addrs.desc))
            .expect("desc");
        queue
            .try_set_avail_ring_address(GuestAddress(self.addrs.avail))
            .expect("avail");
        queue
            .try_set_used_ring_address(GuestAddress(self.addrs.used))
            .expect("used");
        queue.set_ready(true);
        queue
    }

    /// Writes descriptor `i`.
    pub fn desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        self.table
            .store(
                i,
                RawDescriptor::from(Descriptor::new(addr, len, flags, next)),
            )
            .expect("descriptor index");
    }

    /// Publishes `head` as the next avail entry.
    pub fn offer(&mut self, head: u16) {
        let slot = usize::from(self.avail_idx % self.size);
        self.avail
            .ring()
            .ref_at(slot)
            .expect("avail slot")
            .store(head);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.avail.idx().store(self.avail_idx);
    }

    /// Writes the avail index as a (possibly hostile) driver would.
    pub fn set_avail_idx(&self, idx: u16) {
        self.avail.idx().store(idx);
    }

    /// The device's used index.
    pub fn used_idx(&self) -> u16 {
        self.used.idx().load()
    }

    /// Used entry number `i` (counted from the start, so wrapped into the
    /// ring): (head, length).
    pub fn used(&self, i: u64) -> (u32, u32) {
        let slot = usize_from_u64(i % u64::from(self.size));
        let e = self.used.ring().ref_at(slot).expect("used slot").load();
        (e.id(), e.len())
    }
}

/// How long a device may take to give up on a hostile ring. Generous for
/// a loaded test machine; a device that spins never returns at all.
pub const SPIN_BOUND: Duration = Duration::from_secs(1);

/// Runs `f` on a thread of its own and returns its result, or `None` if it
/// did not return within [`SPIN_BOUND`]: a device that spins on a hostile
/// ring fails the test instead of hanging it (the spinning thread is
/// left behind; the test binary ends with the failure).
pub fn returns_in_bound<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(SPIN_BOUND).ok()
}

/// Counts what a device signalled.
#[derive(Default)]
pub struct IrqCount {
    queue: AtomicU32,
    needs_reset: AtomicU32,
}

impl IrqCount {
    /// Used-buffer interrupts, all queues together.
    pub fn queue(&self) -> u32 {
        self.queue.load(Ordering::SeqCst)
    }

    /// DEVICE_NEEDS_RESET requests.
    pub fn needs_reset(&self) -> u32 {
        self.needs_reset.load(Ordering::SeqCst)
    }
}

impl VirtioInterrupt for IrqCount {
    fn notify_queue(&self, _: u16) {
        self.queue.fetch_add(1, Ordering::SeqCst);
    }
    fn notify_config(&self) {}
    fn set_needs_reset(&self) {
        self.needs_reset.fetch_add(1, Ordering::SeqCst);
    }
}
