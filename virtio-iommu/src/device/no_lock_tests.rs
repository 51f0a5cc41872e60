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

use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use super::{IommuConfig, IommuDevice};
use crate::locks::{lock, write};
use crate::mapping::{Invalidator, Perm};
use crate::wire::{AttachReq, MapReq, Status, UnmapReq, MAP_F_READ, MAP_F_WRITE};

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
    MapReq {
        domain: DOMAIN,
        virt_start: iova,
        virt_end: iova + 0xfff,
        phys_start: gpa,
        flags: MAP_F_READ | MAP_F_WRITE,
    }
}

#[test]
fn translate_takes_no_lock() {
    let dev = Arc::new(IommuDevice::new(IommuConfig::default()).expect("device"));
    dev.add_endpoint(EP).expect("endpoint");
    dev.ack_features(dev.device_features());
    let inv = Arc::new(Counting::default());
    dev.add_invalidator(Arc::clone(&inv) as Arc<dyn Invalidator>);
    let mut w = dev.new_worker();
    let attach = AttachReq {
        domain: DOMAIN,
        endpoint: EP,
        flags: 0,
        reserved: [0; 4],
    };
    assert_eq!(dev.attach(&mut w, &attach), Status::Ok);
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
            let unmap = UnmapReq {
                domain: DOMAIN,
                virt_start: 0x20000,
                virt_end: 0x20fff,
            };
            let status = dev.unmap(&mut w, &unmap);
            dev.complete_kick(&mut w);
            let gone = dma.lookup(0x20000, Perm::READ).is_err();
            let _ = done_tx.send((hit, status, gone));
        })
    };
    let outcome = done_rx.recv_timeout(Duration::from_secs(10));
    let _ = release_tx.send(());
    holder.join().expect("holder");
    let (hit, status, gone) =
        outcome.expect("translate or kick waited for a lock the control path held");
    user.join().expect("user");
    assert_eq!(hit.map(|t| t.gpa), Ok(0x20_0008));
    assert_eq!(status, Status::Ok);
    assert!(gone, "a translation survived its UNMAP's kick");
    assert_eq!(inv.0.load(Ordering::SeqCst), 1, "the kick invalidated once");
}
