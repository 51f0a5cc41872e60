//! Hostile request rings (issue 28): whatever the guest writes into the
//! avail ring, serving a kick returns, the device asks for a reset once,
//! and the host log gets a line, not a flood.

use std::sync::Arc;
use std::time::{Duration, Instant};

use virtio_iommu::device::{IommuConfig, IommuDevice};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use super::{RequestServing, VirtioIommu};
use crate::dma::DmaSpace;
use crate::log_limit::counting;
use crate::memory::GuestMemoryMmap;
use crate::virtio::chain::{VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE};
use crate::virtio::test_ring::{leaked_ram, returns_in_bound, DriverRing, IrqCount, RingAddrs};
use crate::virtio::{ActivateContext, ActiveQueue, VirtioDevice};

const SIZE: u16 = 16;
const EP: u32 = 8;
/// Rings of queue 0 (requests) and 1 (events).
const RINGS: [RingAddrs; 2] = [
    RingAddrs {
        desc: 0x1000,
        avail: 0x2000,
        used: 0x3000,
    },
    RingAddrs {
        desc: 0x4000,
        avail: 0x5000,
        used: 0x6000,
    },
];

struct Fixture {
    mem: &'static GuestMemoryMmap,
    rings: [DriverRing<'static>; 2],
    dev: VirtioIommu,
    irq: Arc<IrqCount>,
    /// Queue 0's kick (each queue has its own: a shared eventfd could be
    /// consumed by the other queue's thread).
    kick: EventFd,
}

fn activate(serving: RequestServing) -> Fixture {
    let mem = leaked_ram(0x100000);
    let rings = RINGS.map(|a| DriverRing::new(mem, a, SIZE));
    let iommu = Arc::new(IommuDevice::new(IommuConfig::default()).unwrap());
    iommu.add_endpoint(EP).unwrap();
    let mut dev = VirtioIommu::new(iommu, serving).unwrap();
    let irq = Arc::new(IrqCount::default());
    let kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let features = dev.features();
    let queues = rings
        .iter()
        .enumerate()
        .map(|(i, r)| ActiveQueue {
            index: u16::try_from(i).unwrap(),
            queue: r.queue(),
            kick: match i {
                0 => kick.try_clone().unwrap(),
                _ => EventFd::new(libc::EFD_NONBLOCK).unwrap(),
            },
        })
        .collect();
    dev.activate(ActivateContext {
        mem: DmaSpace::identity(mem.clone()),
        interrupt: irq.clone(),
        queues,
        features,
    })
    .unwrap();
    Fixture {
        mem,
        rings,
        dev,
        irq,
        kick,
    }
}

/// Offers ATTACH of EP to domain 1 on the request queue.
fn offer_attach(f: &mut Fixture) {
    let mut attach = vec![1u8, 0, 0, 0];
    attach.extend_from_slice(&1u32.to_le_bytes());
    attach.extend_from_slice(&EP.to_le_bytes());
    attach.extend_from_slice(&[0; 8]);
    f.mem.write_slice(&attach, GuestAddress(0x10000)).unwrap();
    f.rings[0].desc(0, 0x10000, 20, VIRTQ_DESC_F_NEXT, 1);
    f.rings[0].desc(1, 0x11000, 4, VIRTQ_DESC_F_WRITE, 0);
    f.rings[0].offer(0);
}

/// The case: `requests=auto` serves the single request queue on
/// the kicking vCPU; the driver moves the avail index a queue and one
/// ahead of what the device has taken. The kick returns, the device asks
/// for a reset once, and the queue serves nothing more.
#[test]
fn viommu_avail_index_jump_breaks_the_queue_without_spinning() {
    let mut f = activate(RequestServing::Auto);
    assert!(f.dev.serves_inline(0));
    offer_attach(&mut f);
    f.dev.serve_queue(0);
    assert_eq!(f.rings[0].used_idx(), 1, "a sane request is served");
    assert_eq!(f.irq.needs_reset(), 0);

    f.rings[0].set_avail_idx(1 + SIZE + 1);
    let mut dev = f.dev;
    let (dev, lines) = returns_in_bound(move || {
        counting::install();
        let before = counting::lines();
        // The kick, and the driver kicking again.
        dev.serve_queue(0);
        dev.serve_queue(0);
        (dev, counting::lines() - before)
    })
    .expect("serving a jumped avail index spins");
    assert_eq!(f.irq.needs_reset(), 1, "DEVICE_NEEDS_RESET once");
    assert_eq!(f.rings[0].used_idx(), 1, "nothing more is used");
    assert!((1..=3).contains(&lines), "{lines} log lines");
    drop(dev);
}

/// The same with a thread per request queue: the thread ends (a reset,
/// which joins it, returns) instead of spinning.
#[test]
fn viommu_threaded_avail_index_jump_breaks_the_queue_without_spinning() {
    let f = activate(RequestServing::Thread);
    assert!(!f.dev.serves_inline(0));
    // Dropping the device joins its threads: a spinning one would hang
    // the test on a failed assertion here instead of failing it.
    let dev = std::mem::ManuallyDrop::new(f.dev);
    f.rings[0].set_avail_idx(SIZE + 1);
    f.kick.write(1).unwrap();
    let t = Instant::now();
    while f.irq.needs_reset() == 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "no NEEDS_RESET");
        std::thread::sleep(Duration::from_millis(2));
    }
    // The broken queue's thread has ended: more kicks change nothing.
    f.kick.write(1).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(f.irq.needs_reset(), 1);
    let mut dev = std::mem::ManuallyDrop::into_inner(dev);
    assert!(
        returns_in_bound(move || dev.reset()).is_some(),
        "the request thread spins: reset cannot join it"
    );
    assert_eq!(f.rings[0].used_idx(), 0);
}
