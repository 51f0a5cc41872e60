//! A DETACH, or an ATTACH that moves an endpoint away from a shared or a
//! bypass domain, completes only after every device thread that may have
//! translated through the old domain has left its section, as an UNMAP
//! does. Nothing is unmapped in those cases (the domain lives on, or never
//! had a table), so without the departure being part of the kick's batch
//! no consumer would be asked and the copy in flight could land after the
//! guest saw the request complete.
//!
//! Real threads: a device thread translates inside a section and holds
//! it; a request thread sends the DETACH/ATTACH as one kick (handle the
//! request, `complete_kick`, then "publish"). The test checks the request
//! is not published while the section is open, and that it is published
//! once the section ends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use virtio_iommu::device::{IommuConfig, IommuDevice};
use virtio_iommu::mapping::Perm;
use virtio_iommu::quiesce::Quiescer;
use virtio_iommu::wire::{
    AttachReq, DetachReq, MapReq, Request, ATTACH_F_BYPASS, MAP_F_READ, MAP_F_WRITE,
};

const EP: u32 = 8;
const OTHER: u32 = 9;
const IOVA: u64 = 0x10000;
const GPA: u64 = 0x40000;

/// Sends `req` as one kick and returns its status byte.
fn kick(dev: &IommuDevice, req: Request) -> u8 {
    let mut w = dev.new_worker();
    let mut tail = [0xffu8; 4];
    assert_eq!(dev.handle_request(&mut w, &req.encode(), &mut tail), 4);
    dev.complete_kick(&mut w);
    tail[0]
}

fn attach(domain: u32, endpoint: u32, flags: u32) -> Request {
    Request::Attach(AttachReq {
        domain,
        endpoint,
        flags,
        reserved: [0; 4],
    })
}

fn device() -> (Arc<IommuDevice>, Arc<Quiescer>) {
    let dev = IommuDevice::new(IommuConfig::default()).unwrap();
    dev.add_endpoint(EP).unwrap();
    dev.add_endpoint(OTHER).unwrap();
    dev.ack_features(dev.device_features());
    let q = Quiescer::new();
    dev.add_invalidator(q.clone());
    (Arc::new(dev), q)
}

/// Opens a section on a device thread, translates `IOVA` for `EP` inside
/// it (must succeed: `expect_gpa`), and holds the section until told.
/// Returns the release sender and the thread.
fn hold_section(
    dev: &Arc<IommuDevice>,
    q: &Arc<Quiescer>,
    expect_gpa: u64,
) -> (mpsc::Sender<()>, thread::JoinHandle<()>) {
    let slot = q.register().unwrap();
    let dma = dev.endpoint_dma(EP).unwrap();
    let (inside_tx, inside_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let reader = thread::spawn(move || {
        let _section = slot.enter();
        let run = dma
            .translate(IOVA, 0x1000, Perm::WRITE)
            .next()
            .expect("a run")
            .expect("translated inside the section");
        assert_eq!(run.gpa, expect_gpa);
        inside_tx.send(()).unwrap();
        // The "copy" in flight lasts until the test says so.
        release_rx.recv_timeout(Duration::from_secs(60)).ok();
    });
    inside_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    (release_tx, reader)
}

/// Sends `req` on a request thread while a section on the old
/// translation is open; checks it completes only after the section ended.
fn departure_waits(dev: &Arc<IommuDevice>, q: &Arc<Quiescer>, expect_gpa: u64, req: Request) {
    let (release, reader) = hold_section(dev, q, expect_gpa);
    let section_ended = Arc::new(AtomicBool::new(false));
    let waits_before = q.stats().waits;
    let requester = {
        let (dev, section_ended) = (dev.clone(), section_ended.clone());
        thread::spawn(move || {
            let status = kick(&dev, req);
            // "Publish": what the guest would now see.
            (status, section_ended.load(Ordering::SeqCst))
        })
    };
    // Until the request thread is waiting in the quiescer (however slowly
    // a loaded machine schedules it), then a little longer.
    let deadline = Instant::now() + Duration::from_secs(30);
    while q.stats().waits == waits_before && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(1));
    }
    assert!(
        q.stats().waits > waits_before,
        "the departure never reached the quiescer"
    );
    thread::sleep(Duration::from_millis(50));
    assert!(
        !requester.is_finished(),
        "{req:?} completed while a DMA through the old domain was in flight"
    );
    section_ended.store(true, Ordering::SeqCst);
    release.send(()).unwrap();
    reader.join().unwrap();
    let (status, saw_end) = requester.join().unwrap();
    assert_eq!(status, 0, "{req:?}");
    assert!(saw_end, "{req:?} completed before the section ended");
}

#[test]
fn detach_waits_for_dma_in_flight() {
    let (dev, q) = device();
    // A shared domain: OTHER keeps it alive, so DETACH unmaps nothing.
    assert_eq!(kick(&dev, attach(1, EP, 0)), 0);
    assert_eq!(kick(&dev, attach(1, OTHER, 0)), 0);
    let map = Request::Map(MapReq {
        domain: 1,
        virt_start: IOVA,
        virt_end: IOVA + 0xfff,
        phys_start: GPA,
        flags: MAP_F_READ | MAP_F_WRITE,
    });
    assert_eq!(kick(&dev, map), 0);
    departure_waits(
        &dev,
        &q,
        GPA,
        Request::Detach(DetachReq {
            domain: 1,
            endpoint: EP,
        }),
    );
    assert_eq!(dev.endpoint_domain(EP), None);
    assert_eq!(dev.domain_count(), 1, "the shared domain lives on");

    // ATTACH away from a shared domain: back in domain 1, then to 2.
    assert_eq!(kick(&dev, attach(1, EP, 0)), 0);
    departure_waits(&dev, &q, GPA, attach(2, EP, 0));
    assert_eq!(dev.endpoint_domain(EP), Some(2));

    // ATTACH away from a bypass domain (identity: IOVA is the address).
    assert_eq!(kick(&dev, attach(3, EP, ATTACH_F_BYPASS)), 0);
    departure_waits(&dev, &q, IOVA, attach(2, EP, 0));
    // And DETACH from one.
    assert_eq!(kick(&dev, attach(3, EP, ATTACH_F_BYPASS)), 0);
    departure_waits(
        &dev,
        &q,
        IOVA,
        Request::Detach(DetachReq {
            domain: 3,
            endpoint: EP,
        }),
    );
}

/// A departure with no device thread in a section costs one quiescer pass
/// and no wait.
#[test]
fn departure_with_idle_readers_does_not_wait() {
    let (dev, q) = device();
    let _idle = q.register().unwrap();
    assert_eq!(kick(&dev, attach(1, EP, 0)), 0);
    assert_eq!(kick(&dev, attach(1, OTHER, 0)), 0);
    let before = q.stats();
    assert_eq!(
        kick(
            &dev,
            Request::Detach(DetachReq {
                domain: 1,
                endpoint: EP
            })
        ),
        0
    );
    let after = q.stats();
    assert_eq!(after.waits, before.waits + 1);
    assert_eq!(after.waited_for_reader, before.waited_for_reader);
}
