//! [`ThreadDma`]: a device thread's way to guest memory that opens its
//! quiescence section by itself.
//!
//! WHY: with a bare [`DmaSpace`] every device thread must remember to take
//! a reader slot and wrap each translate-and-use in `slot.enter()`; one
//! forgotten call is a copy that an UNMAP does not wait for. Here the
//! memory is reachable only through [`ThreadDma::access`], whose guard
//! holds the section for as long as the memory (and any slice taken from
//! it) is borrowed. `access` takes `&mut self`, so a thread cannot open a
//! second section while one is live (sections do not nest: the inner one
//! ending would end the outer one too). Registration past the quiescer's
//! limit fails here, so the device fails its setup instead of running.
//!
//! The rule is enforced, not only offered: a space behind a quiescing
//! vIOMMU refuses any access made on a thread that holds no guard (the
//! guards alive on a thread are counted in a thread-local; a guard is not
//! `Send`). A device path that forgot its guard fails its DMA instead of
//! racing an UNMAP.

use std::cell::Cell;
use std::marker::PhantomData;
use std::ops::Deref;
use std::sync::Arc;

use virtio_iommu::quiesce::{ReadSection, ReaderSlot, TooManyReaders};

use super::DmaSpace;

thread_local! {
    /// Open sections of access guards alive on this thread (see
    /// [`in_guard`]).
    static OPEN_GUARDS: Cell<u32> = const { Cell::new(0) };
}

fn count_open(delta: i32) {
    OPEN_GUARDS.with(|g| g.set(g.get().saturating_add_signed(delta)));
}

/// Whether this thread holds an access guard with an open section: a
/// quiescing space checks it so that an access outside one is refused. A
/// guard over a space without a quiescer opens nothing and counts not.
pub(super) fn in_guard() -> bool {
    OPEN_GUARDS.with(|g| g.get() > 0)
}

/// One device thread's DMA handle (see the module doc).
pub struct ThreadDma {
    space: DmaSpace,
    /// None when the space is not behind a quiescing vIOMMU.
    slot: Option<Arc<ReaderSlot>>,
}

/// Guest memory as seen by one section: dereferences to the thread's
/// [`DmaSpace`]; the section ends when the guard is dropped.
pub struct DmaGuard<'a> {
    space: &'a DmaSpace,
    slot: Option<&'a ReaderSlot>,
    section: Option<ReadSection<'a>>,
    /// Not `Send`: the guard counts in its thread's [`OPEN_GUARDS`] and
    /// must end on the thread that opened it.
    _not_send: PhantomData<*const ()>,
}

impl ThreadDma {
    /// The handle of one device thread over `space`, with a reader slot of
    /// its own. Fails past the quiescer's limit (the space then refuses
    /// every access, see [`DmaSpace::try_reader`]): the device must not
    /// start.
    pub fn new(space: DmaSpace) -> Result<Self, TooManyReaders> {
        let slot = space.try_reader()?;
        Ok(Self { space, slot })
    }

    /// Opens a section and lends the memory for its duration.
    pub fn access(&mut self) -> DmaGuard<'_> {
        let slot = self.slot.as_deref();
        if slot.is_some() {
            count_open(1);
        }
        DmaGuard {
            space: &self.space,
            slot,
            section: slot.map(ReaderSlot::enter),
            _not_send: PhantomData,
        }
    }

    /// Whether the owning device may do DMA (checked outside a section,
    /// e.g. before a worker waits for work).
    pub fn bus_master(&self) -> bool {
        self.space.bus_master()
    }

    /// Runs `wait`, the thread's blocking wait for work (epoll, poll, a
    /// channel), with its reader slot parked. WHY every worker's wait goes
    /// through here: with the sticky quiescer (the default) a slot keeps
    /// the epoch of the thread's last section, and an UNMAP completes only
    /// when every slot has entered again or parked; a thread asleep with
    /// its slot unparked holds each UNMAP until the quiescer's safety net
    /// (membarrier, logged as a missing park). `&mut self`: no access
    /// guard is alive, so no section is open.
    pub fn parked<T>(&mut self, wait: impl FnOnce() -> T) -> T {
        self.park();
        wait()
    }

    /// Parks the slot without waiting: for a handle whose accesses are one
    /// at a time on whatever thread holds it (the DMA test device's, under
    /// its lock on a vCPU), which then goes back to the guest, or syncs.
    pub fn park(&mut self) {
        if let Some(slot) = self.slot.as_deref() {
            slot.park();
        }
    }
}

impl DmaGuard<'_> {
    /// Ends the section and opens a new one on the same guard, so that a
    /// long job (a virtio-blk request's data, a chunk at a time) makes an
    /// UNMAP wait for one chunk only. `&mut self`: no slice borrowed from
    /// the guard survives; raw pointers taken from it (iovecs) must be
    /// used up before. `between` runs with no section open (tests).
    pub fn renew_with(&mut self, between: impl FnOnce()) {
        if self.section.take().is_some() {
            count_open(-1);
        }
        between();
        self.section = self.slot.map(ReaderSlot::enter);
        if self.section.is_some() {
            count_open(1);
        }
    }

    /// Whether a quiescence section is held (the space is behind a
    /// quiescing vIOMMU).
    pub fn guarded(&self) -> bool {
        self.section.is_some()
    }
}

impl Drop for DmaGuard<'_> {
    fn drop(&mut self) {
        if self.section.is_some() {
            count_open(-1);
        }
    }
}

impl Deref for DmaGuard<'_> {
    type Target = DmaSpace;

    fn deref(&self) -> &DmaSpace {
        self.space
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::thread;
    use std::time::{Duration, Instant};

    use virtio_iommu::quiesce::{Quiescer, MAX_READERS};
    use vm_memory::{Bytes, GuestAddress, GuestMemory};

    use super::*;
    use crate::dma::test_iommu::{TestIommu, RW};
    use crate::memory::GuestMemoryMmap;

    fn ram() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x100000)]).unwrap()
    }

    /// An UNMAP's completion waits for a guard that is still alive, and
    /// the access through the guard uses the mapping it translated.
    #[test]
    fn an_unmap_waits_for_a_live_access_guard() {
        let iommu = TestIommu::new(0x18);
        let q = Quiescer::new();
        iommu.dev.add_invalidator(q.clone());
        let mem = ram();
        let mut dma = ThreadDma::new(iommu.space(&mem).with_quiescer(q.clone())).unwrap();
        iommu.attach(1);
        iommu.map(1, 0x10000, 0x1000, 0x40000, RW);
        let access = dma.access();
        access.write_obj(7u64, GuestAddress(0x10000)).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let unmapper = {
            let (iommu, done) = (iommu.clone(), done.clone());
            thread::spawn(move || {
                iommu.unmap(1, 0x10000, 0x1000);
                done.load(Ordering::SeqCst)
            })
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while q.stats().waits == 0 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(1));
        }
        thread::sleep(Duration::from_millis(20));
        assert!(!unmapper.is_finished(), "UNMAP completed inside a guard");
        done.store(true, Ordering::SeqCst);
        drop(access);
        assert!(
            unmapper.join().unwrap(),
            "UNMAP completed before the guard ended"
        );
        assert!(dma.access().write_obj(8u64, GuestAddress(0x10000)).is_err());
        assert_eq!(mem.read_obj::<u64>(GuestAddress(0x40000)).unwrap(), 7);
    }

    /// Behind a quiescing vIOMMU the space refuses an access made outside
    /// a guard (on a thread that holds none with an open section, even one
    /// over an unprotected space), and between two sections of a renewed
    /// guard; inside one it passes.
    #[test]
    fn an_access_outside_a_guard_is_refused() {
        let iommu = TestIommu::new(0x18);
        let q = Quiescer::new();
        iommu.dev.add_invalidator(q.clone());
        let mem = ram();
        let space = iommu.space(&mem).with_quiescer(q.clone());
        let mut dma = ThreadDma::new(space.clone()).unwrap();
        let mut plain = ThreadDma::new(DmaSpace::identity(mem.clone())).unwrap();
        iommu.attach(1);
        iommu.map(1, 0x10000, 0x1000, 0x40000, RW);
        assert!(space.write_obj(1u64, GuestAddress(0x10000)).is_err());
        // A range check lets no slice out: allowed (the transport checks
        // a queue's rings this way at activation, outside any guard).
        let rw = vm_memory::Permissions::ReadWrite;
        assert!(GuestMemory::check_range(
            &space,
            GuestAddress(0x10000),
            8,
            rw
        ));
        assert!(!GuestMemory::check_range(
            &space,
            GuestAddress(0x11000),
            8,
            rw
        ));
        let unprotected = plain.access();
        assert!(space.write_obj(2u64, GuestAddress(0x10000)).is_err());
        drop(unprotected);
        let mut access = dma.access();
        access.write_obj(3u64, GuestAddress(0x10000)).unwrap();
        let outside = std::cell::Cell::new(true);
        access.renew_with(|| outside.set(space.write_obj(4u64, GuestAddress(0x10000)).is_err()));
        assert!(outside.get(), "an access between two sections passed");
        assert!(access.guarded());
        access.write_obj(5u64, GuestAddress(0x10000)).unwrap();
        drop(access);
        assert!(space.write_obj(6u64, GuestAddress(0x10000)).is_err());
        assert_eq!(mem.read_obj::<u64>(GuestAddress(0x40000)).unwrap(), 5);
    }

    /// A worker waiting parked (its poll) holds no UNMAP; one that waits
    /// without parking holds it until the quiescer's safety net (sticky,
    /// where the process has membarrier; the fence's slot is idle anyway).
    #[test]
    fn a_worker_waiting_parked_holds_no_unmap() {
        use virtio_iommu::barrier::BarrierKind;
        let iommu = TestIommu::new(0x18);
        let q = Quiescer::with_barrier(BarrierKind::Sticky);
        let sticky = q.kind() == BarrierKind::Sticky;
        iommu.dev.add_invalidator(q.clone());
        let mem = ram();
        let mut dma = ThreadDma::new(iommu.space(&mem).with_quiescer(q.clone())).unwrap();
        iommu.attach(1);
        iommu.map(1, 0x10000, 0x1000, 0x40000, RW);
        iommu.map(1, 0x20000, 0x1000, 0x50000, RW);
        let unmap_elsewhere = |iova: u64| {
            let iommu = iommu.clone();
            thread::spawn(move || iommu.unmap(1, iova, 0x1000))
                .join()
                .unwrap();
        };
        dma.access().write_obj(7u64, GuestAddress(0x10000)).unwrap();
        dma.parked(|| unmap_elsewhere(0x10000));
        assert_eq!(q.stats().fallbacks, 0);
        assert!(dma.access().write_obj(8u64, GuestAddress(0x10000)).is_err());
        // The same wait without the park: only the net lets the UNMAP go.
        unmap_elsewhere(0x20000);
        assert_eq!(q.stats().fallbacks, u64::from(sticky));
        assert_eq!(mem.read_obj::<u64>(GuestAddress(0x40000)).unwrap(), 7);
    }

    /// Past the reader limit the handle is refused: the device fails its
    /// setup rather than running without a section.
    #[test]
    fn a_handle_past_the_reader_limit_is_refused() {
        let iommu = TestIommu::new(0x18);
        let q = Quiescer::new();
        let mem = ram();
        let space = iommu.space(&mem).with_quiescer(q.clone());
        let held: Vec<_> = (0..MAX_READERS)
            .map(|_| ThreadDma::new(space.clone()).unwrap())
            .collect();
        assert!(ThreadDma::new(space.clone()).is_err());
        assert!(space.refused());
        drop(held);
        // Without a quiescer nothing is waited for, and nothing refused.
        assert!(ThreadDma::new(DmaSpace::identity(mem)).is_ok());
    }
}
