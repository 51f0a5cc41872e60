//! The DMA path and the end of a kick against a control path that is
//! stalled with every one of its locks held (issue 30: translation without
//! locks on the DMA path).
//!
//! WHY a stalled writer rather than a timing: a lock on the DMA path shows
//! as a wait, not as a slower number, so the test holds every device lock
//! the control path takes (topology, listeners, mirrors) and stalls a
//! consumer registration in the middle of its update, then requires a DMA
//! translation, an UNMAP and its kick to finish within a bounded time. On
//! the code before the pointer swaps the consumer list was an `RwLock`
//! whose writer, stalled the same way, held its write guard, and the kick's
//! read lock waited for it: the bounded wait below then failed.
//!
//! The steady state of the DMA path also takes no locked instruction: the
//! endpoint's attachment comes from the thread's cache
//! (`translate/attach_cache.rs`), which the tests here show is neither
//! reloaded while the attachment stays nor kept once it changes.

use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use super::{IommuConfig, IommuDevice};
use crate::locks::{lock, write};
use crate::mapping::{Invalidator, Perm, QueueContext};
use crate::translate::{attach_cache_misses, DmaFault};
use crate::wire::{AttachReq, DetachReq, MapReq, Status, UnmapReq, MAP_F_READ, MAP_F_WRITE};

const EP: u32 = 1;
const DOMAIN: u32 = 1;

#[derive(Default)]
struct Counting(AtomicU64);

impl Invalidator for Counting {
    fn invalidate(&self, _domain: u32, _ranges: &[RangeInclusive<u64>]) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn map_req(iova: u64, gpa: u64) -> MapReq {
    map_in(DOMAIN, iova, gpa)
}

fn map_in(domain: u32, iova: u64, gpa: u64) -> MapReq {
    MapReq {
        domain,
        virt_start: iova,
        virt_end: iova + 0xfff,
        phys_start: gpa,
        flags: MAP_F_READ | MAP_F_WRITE,
    }
}

/// Attaches endpoint [`EP`] to `domain`, which must succeed.
fn attach(dev: &IommuDevice, w: &mut QueueContext, domain: u32) {
    let req = AttachReq {
        domain,
        endpoint: EP,
        flags: 0,
        reserved: [0; 4],
    };
    assert_eq!(dev.attach(w, &req), Status::Ok);
}

#[test]
fn translate_takes_no_lock() {
    let dev = Arc::new(IommuDevice::new(IommuConfig::default()).expect("device"));
    dev.add_endpoint(EP).expect("endpoint");
    dev.ack_features(dev.device_features());
    let inv = Arc::new(Counting::default());
    dev.add_invalidator(Arc::clone(&inv) as Arc<dyn Invalidator>);
    let mut w = dev.new_worker();
    attach(&dev, &mut w, DOMAIN);
    assert_eq!(dev.map(&mut w, &map_req(0x10000, 0x20_0000)), Status::Ok);
    assert_eq!(dev.map(&mut w, &map_req(0x20000, 0x30_0000)), Status::Ok);
    dev.complete_kick(&mut w);
    let dma = dev.endpoint_dma(EP).expect("dma handle");

    // The control path, stalled with its locks held until released.
    let (held_tx, held_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let holder = {
        let dev = Arc::clone(&dev);
        thread::spawn(move || {
            let _topology = lock(&dev.topology);
            let _listeners = write(&dev.listeners);
            let _mirrors = write(&dev.mirrors);
            let mut stalled = false;
            dev.invalidators.rcu(|all| {
                if !stalled {
                    stalled = true;
                    let _ = held_tx.send(());
                    let _ = release_rx.recv_timeout(Duration::from_secs(30));
                }
                Vec::clone(all)
            });
        })
    };
    held_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("holder took the locks");

    // The DMA path and a kick on a thread of their own, with a bounded
    // wait, so a lock on their way fails the test instead of hanging it.
    let (done_tx, done_rx) = mpsc::channel();
    let user = {
        let dev = Arc::clone(&dev);
        thread::spawn(move || {
            let hit = dma.lookup(0x10008, Perm::READ);
            // Steady state: the attachment is this thread's cached one,
            // never loaded again (a load would be a locked instruction).
            let misses = attach_cache_misses();
            let steady = (0..1000u64).all(|k| {
                let iova = 0x10000 + (k % 0x1000);
                dma.translate_contiguous(iova, 1, Perm::READ) == Ok(0x20_0000 + (k % 0x1000))
            });
            let reloads = attach_cache_misses() - misses;
            let unmap = UnmapReq {
                domain: DOMAIN,
                virt_start: 0x20000,
                virt_end: 0x20fff,
            };
            let status = dev.unmap(&mut w, &unmap);
            dev.complete_kick(&mut w);
            let gone = dma.lookup(0x20000, Perm::READ).is_err();
            let _ = done_tx.send((hit, status, gone, steady, reloads, misses));
        })
    };
    let outcome = done_rx.recv_timeout(Duration::from_secs(10));
    let _ = release_tx.send(());
    holder.join().expect("holder");
    let (hit, status, gone, steady, reloads, first) =
        outcome.expect("translate or kick waited for a lock the control path held");
    user.join().expect("user");
    assert_eq!(hit.map(|t| t.gpa), Ok(0x20_0008));
    assert!(steady, "a steady-state translation answered wrongly");
    assert_eq!(first, 1, "the thread's first access filled its cache");
    assert_eq!(reloads, 0, "a steady-state access loaded the attachment");
    assert_eq!(status, Status::Ok);
    assert!(gone, "a translation survived its UNMAP's kick");
    assert_eq!(inv.0.load(Ordering::SeqCst), 1, "the kick invalidated once");
}

/// What a device thread with a warm attachment cache sees, access by
/// access, while the control path detaches and re-attaches its endpoint
/// on another thread: every change is seen by the very next access (the
/// two threads are ordered by a channel, as a kick's completion orders a
/// guest's next request), and an unchanged attachment is never reloaded.
#[test]
fn a_cached_attachment_follows_detach_and_reattach() {
    let dev = Arc::new(IommuDevice::new(IommuConfig::default()).expect("device"));
    dev.add_endpoint(EP).expect("endpoint");
    dev.ack_features(dev.device_features());
    let mut w = dev.new_worker();
    attach(&dev, &mut w, DOMAIN);
    assert_eq!(
        dev.map(&mut w, &map_in(DOMAIN, 0x10000, 0x20_0000)),
        Status::Ok
    );
    dev.complete_kick(&mut w);
    let dma = dev.endpoint_dma(EP).expect("dma handle");

    // The device thread: one access per request, warm-up included.
    let (ask_tx, ask_rx) = mpsc::channel::<u32>();
    let (ans_tx, ans_rx) = mpsc::channel();
    let device = thread::spawn(move || {
        while let Ok(times) = ask_rx.recv() {
            let before = attach_cache_misses();
            let mut last = None;
            for _ in 0..times {
                last = Some(dma.translate_contiguous(0x10008, 8, Perm::READ));
            }
            let _ = ans_tx.send((last, attach_cache_misses() - before));
        }
    });
    let access = |times: u32| {
        ask_tx.send(times).expect("device thread");
        ans_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("device thread answered")
    };

    // Warm: one miss, then hits only.
    assert_eq!(access(1), (Some(Ok(0x20_0008)), 1));
    assert_eq!(access(100), (Some(Ok(0x20_0008)), 0));

    // DETACH (the domain's last endpoint: it is destroyed).
    let detach = DetachReq {
        domain: DOMAIN,
        endpoint: EP,
    };
    assert_eq!(dev.detach(&mut w, &detach), Status::Ok);
    dev.complete_kick(&mut w);
    let (r, misses) = access(1);
    assert!(
        matches!(r, Some(Err(DmaFault::NotAttached { .. }))),
        "the access after DETACH used the cached domain: {r:?}"
    );
    assert_eq!(misses, 1);
    assert!(matches!(
        access(10),
        (Some(Err(DmaFault::NotAttached { .. })), 0)
    ));

    // ATTACH to another domain, with another mapping at the same address.
    attach(&dev, &mut w, 2);
    assert_eq!(dev.map(&mut w, &map_in(2, 0x10000, 0x50_0000)), Status::Ok);
    dev.complete_kick(&mut w);
    assert_eq!(access(1), (Some(Ok(0x50_0008)), 1));
    assert_eq!(access(10), (Some(Ok(0x50_0008)), 0));

    // Re-attach without a DETACH, then back to a domain of the first id
    // (a new, empty domain: its old mapping must not come back).
    attach(&dev, &mut w, 3);
    assert_eq!(dev.map(&mut w, &map_in(3, 0x10000, 0x60_0000)), Status::Ok);
    dev.complete_kick(&mut w);
    assert_eq!(access(1), (Some(Ok(0x60_0008)), 1));
    attach(&dev, &mut w, DOMAIN);
    dev.complete_kick(&mut w);
    let (r, misses) = access(1);
    assert!(
        matches!(r, Some(Err(DmaFault::Unmapped { .. }))),
        "the access after re-attach used a cached domain: {r:?}"
    );
    assert_eq!(misses, 1);

    drop(ask_tx);
    device.join().expect("device thread");
}

/// An access holds its attachment for all its runs: the thread's cache
/// keeps that domain alive even if the endpoint is re-attached and the
/// thread makes another access meanwhile (which loads the new attachment
/// without touching the cache), and lets it go at the next access after.
#[test]
fn an_access_in_progress_keeps_its_cached_domain() {
    let dev = IommuDevice::new(IommuConfig::default()).expect("device");
    dev.add_endpoint(EP).expect("endpoint");
    dev.ack_features(dev.device_features());
    let mut w = dev.new_worker();
    attach(&dev, &mut w, DOMAIN);
    // Two pages, not physically adjacent: an access over both has two runs.
    assert_eq!(
        dev.map(&mut w, &map_in(DOMAIN, 0x10000, 0x20_0000)),
        Status::Ok
    );
    assert_eq!(
        dev.map(&mut w, &map_in(DOMAIN, 0x11000, 0x40_0000)),
        Status::Ok
    );
    dev.complete_kick(&mut w);
    let dma = dev.endpoint_dma(EP).expect("dma handle");
    let old = dev
        .endpoints
        .get(EP)
        .and_then(|ep| ep.domain())
        .map(|d| Arc::downgrade(&d))
        .expect("attached");

    let mut runs = dma.translate(0x10800, 0x1000, Perm::READ);
    assert_eq!(runs.next().map(|r| r.map(|r| r.gpa)), Some(Ok(0x20_0800)));
    // Re-attached elsewhere (the old domain loses its last endpoint), and
    // another access of this thread meanwhile: it sees the new domain.
    attach(&dev, &mut w, 2);
    assert_eq!(dev.map(&mut w, &map_in(2, 0x10000, 0x50_0000)), Status::Ok);
    dev.complete_kick(&mut w);
    assert_eq!(
        dma.translate_contiguous(0x10008, 8, Perm::READ),
        Ok(0x50_0008)
    );
    assert!(old.upgrade().is_some(), "the pinned domain was dropped");
    // The access in progress goes on in its own domain, emptied when it
    // was destroyed: its second run is refused, never another domain's.
    assert!(matches!(
        runs.next(),
        Some(Err(DmaFault::Unmapped { iova: 0x11000, .. }))
    ));
    drop(runs);
    assert_eq!(
        dma.translate_contiguous(0x10008, 8, Perm::READ),
        Ok(0x50_0008)
    );
    assert!(old.upgrade().is_none(), "the cache kept a replaced domain");
}
