//! The reader limit fails closed: a device thread that cannot get a
//! quiescence slot must not leave its device running without one.
//!
//! WHY a test of its own: before, `DmaSpace::reader` logged and returned
//! `None` past the limit, and the device then ran with no section, so an
//! UNMAP completed without waiting for its copies. Here more threads
//! register than the limit allows, on real threads, while UNMAPs complete
//! and the guest reuses the page: a write that lands after an UNMAP
//! completed is a DMA the protocol missed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use virtio_iommu::quiesce::{Quiescer, MAX_READERS};
use vm_memory::{Bytes, GuestAddress};

use crate::dma::iommu::IommuTranslate;
use crate::dma::test_iommu::{TestIommu, RW};
use crate::dma::{DmaAccess, DmaFault, DmaSpace, DmaTranslate, ThreadDma};
use crate::memory::GuestMemoryMmap;

const EP: u32 = 0x18;
const IOVA: u64 = 0x10000;
const GPA: u64 = 0x40000;
/// Threads per device, and devices: 10 * 30 = 300 > 256 readers.
const PER_DEVICE: usize = 10;
const DEVICES: usize = 30;
const _: () = assert!(PER_DEVICE * DEVICES > MAX_READERS);
const ROUNDS: u64 = 200;
/// How long a device thread holds a translation before its copy.
const PREEMPTED: Duration = Duration::from_millis(1);
/// What the guest writes into the page once an UNMAP completed.
const REUSED: u64 = u64::MAX;

/// A translator whose caller is preempted right after each translation:
/// a copy that lands late is then certain to be seen, not rare.
struct Preempted(IommuTranslate);

impl DmaTranslate for Preempted {
    fn translate_run(
        &self,
        iova: u64,
        len: u64,
        access: DmaAccess,
    ) -> Result<(u64, u64), DmaFault> {
        let r = self.0.translate_run(iova, len, access);
        if r.is_ok() {
            thread::sleep(PREEMPTED);
        }
        r
    }
}

#[test]
fn quiescer_never_runs_a_device_unprotected() {
    let iommu = TestIommu::new(EP);
    let q = Quiescer::new();
    iommu.dev.add_invalidator(q.clone());
    iommu.attach(1);
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x100000)]).unwrap();
    // Every device has a space of its own over the same endpoint.
    let spaces: Vec<_> = (0..DEVICES)
        .map(|_| {
            let t = IommuTranslate::new(iommu.dev.endpoint_dma(EP).unwrap(), None);
            DmaSpace::translated(mem.clone(), Arc::new(Preempted(t))).with_quiescer(q.clone())
        })
        .collect();
    // Register in a known order so that some devices are whole and
    // others are not: devices 0..25 get all their slots, device 25 gets
    // 6 of 10, devices 26..30 none.
    let mut slots = Vec::new();
    for (d, space) in spaces.iter().enumerate() {
        for _ in 0..PER_DEVICE {
            slots.push((d, ThreadDma::new(space.clone()).ok()));
        }
    }
    let granted = slots.iter().filter(|(_, s)| s.is_some()).count();
    assert_eq!(granted, MAX_READERS, "every slot up to the limit is real");
    let whole = MAX_READERS / PER_DEVICE;
    for (d, space) in spaces.iter().enumerate() {
        assert_eq!(
            space.refused(),
            d >= whole,
            "device {d}: refused exactly when one of its threads got no slot"
        );
    }

    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(slots.len() + 1));
    let successes: Vec<Arc<AtomicU64>> = (0..DEVICES).map(|_| Arc::default()).collect();
    let threads: Vec<_> = slots
        .into_iter()
        .enumerate()
        .map(|(i, (d, mut handle))| {
            let space = spaces[d].clone();
            let (stop, start, ok) = (stop.clone(), start.clone(), successes[d].clone());
            thread::spawn(move || {
                start.wait();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // A "copy": the device writes its mark through the
                    // mapping, if the mapping is there. A thread refused
                    // its handle tries anyway, through the bare space.
                    let written = match handle.as_mut() {
                        Some(h) => h.access().write_obj(i as u64, GuestAddress(IOVA)),
                        None => space.write_obj(i as u64, GuestAddress(IOVA)),
                    };
                    if written.is_ok() {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    n += 1;
                    if n.is_multiple_of(16) {
                        thread::yield_now();
                    }
                }
            })
        })
        .collect();
    start.wait();
    let mut violations = Vec::new();
    for round in 0..ROUNDS {
        iommu.map(1, IOVA, 0x1000, GPA, RW);
        thread::yield_now();
        // The UNMAP's kick waits for every section through the quiescer.
        iommu.unmap(1, IOVA, 0x1000);
        mem.write_obj(REUSED, GuestAddress(GPA)).unwrap();
        // Longer than any translation is held: a copy the UNMAP did not
        // wait for has landed by now.
        thread::sleep(PREEMPTED * 3);
        let seen: u64 = mem.read_obj(GuestAddress(GPA)).unwrap();
        if seen != REUSED {
            violations.push((round, seen));
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    assert!(
        violations.is_empty(),
        "DMA landed after its UNMAP completed (round, writer): {violations:?}"
    );
    for (d, ok) in successes.iter().enumerate() {
        let ok = ok.load(Ordering::Relaxed);
        if d >= whole {
            assert_eq!(ok, 0, "device {d} ran without every thread in the protocol");
        }
    }
    assert!(
        successes[..whole]
            .iter()
            .any(|s| s.load(Ordering::Relaxed) > 0),
        "no protected device ever reached its page: the test saw nothing"
    );
    // The threads' slots were given back: a new device thread gets one
    // again, but a refused device stays refused.
    assert!(spaces[0].reader().is_some());
    assert!(!spaces[0].refused());
    assert!(spaces[DEVICES - 1].refused());
    assert!(spaces[DEVICES - 1]
        .write_obj(1u64, GuestAddress(IOVA))
        .is_err());
}
