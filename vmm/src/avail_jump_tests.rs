//! Issue 28 for every device that drains a guest ring in the VMM: a driver
//! that moves a queue's avail index more than a queue size ahead of the
//! device gets the queue stopped and DEVICE_NEEDS_RESET once, with a log
//! line or two, and the device's loop returns (within
//! [`SPIN_BOUND`](crate::virtio::test_ring::SPIN_BOUND), or the test
//! fails). The vIOMMU's own queues are tested next to them
//! (`virtio::iommu::ring_tests`, `virtio::iommu::event`).
//!
//! WHY one file across devices: the rule is one rule ("guest ring state
//! ends in NEEDS_RESET or is ignored, never in a loop"), and a device
//! added later is checked by adding a case here.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vmm_sys_util::eventfd::EventFd;

use crate::block::limits::Limits;
use crate::block::worker::QueueServer;
use crate::block::DiskImage;
use crate::dma::{DmaSpace, ThreadDma};
use crate::log_limit::counting;
use crate::net::ctrl::serve_ctrl_queue;
use crate::net::queue::WorkerQueue;
use crate::net::tx::{process_tx, FrameSink, TxState};
use crate::vhost_user::client::Client;
use crate::vhost_user::ctrl::{run_ctrl_queue, CtrlQueueServer};
use crate::virtio::chain::Chain;
use crate::virtio::test_ring::{leaked_ram, returns_in_bound, DriverRing, IrqCount, RingAddrs};
use crate::virtio::ActiveQueue;

const SIZE: u16 = 16;
const ADDRS: RingAddrs = RingAddrs {
    desc: 0x1000,
    avail: 0x2000,
    used: 0x3000,
};

/// A ring whose avail index is a queue and one ahead of a device that has
/// taken nothing yet, and the device's queue on it.
fn jumped_queue(index: u16) -> (DriverRing<'static>, WorkerQueue, DmaSpace) {
    let mem = leaked_ram(0x40000);
    let ring = DriverRing::new(mem, ADDRS, SIZE);
    let q = WorkerQueue::from(ActiveQueue {
        index,
        queue: ring.queue(),
        kick: EventFd::new(libc::EFD_NONBLOCK).unwrap(),
    });
    ring.set_avail_idx(SIZE + 1);
    (ring, q, DmaSpace::identity(mem.clone()))
}

/// A TAP that takes every frame (none should reach it here).
struct Sink;

impl FrameSink for Sink {
    fn write_frame_iov(&self, iov: &[libc::iovec]) -> std::io::Result<usize> {
        Ok(iov.iter().map(|v| v.iov_len).sum())
    }
}

/// virtio-net (TAP): the transmit queue and the control queue, each
/// served twice (the kick, and the driver kicking again).
#[test]
fn net_avail_index_jump_breaks_the_queue_without_spinning() {
    let (ring, q, mem) = jumped_queue(1);
    let irq = Arc::new(IrqCount::default());
    let i = irq.clone();
    let (q, lines) = returns_in_bound(move || {
        counting::install();
        let before = counting::lines();
        let (mut q, mut st) = (q, TxState::default());
        let mut dma = ThreadDma::new(mem).unwrap();
        for _ in 0..2 {
            process_tx(&mut q, &mut dma, &*i, &mut st, &Sink);
        }
        (q, counting::lines() - before)
    })
    .expect("transmit spins on a jumped avail index");
    assert!(q.broken());
    assert_eq!((irq.needs_reset(), irq.queue()), (1, 0));
    assert!((1..=2).contains(&lines), "transmit: {lines} log lines");
    assert_eq!(ring.used_idx(), 0);

    let (ring, q, mem) = jumped_queue(2);
    let irq = Arc::new(IrqCount::default());
    let i = irq.clone();
    let (q, executed, lines) = returns_in_bound(move || {
        counting::install();
        let before = counting::lines();
        let (mut q, mut chain, mut executed) = (q, Chain::default(), 0);
        let mut dma = ThreadDma::new(mem).unwrap();
        for _ in 0..2 {
            serve_ctrl_queue(&mut q, &mut dma, &*i, &mut chain, &mut |_| {
                executed += 1;
                true
            });
        }
        (q, executed, counting::lines() - before)
    })
    .expect("the control queue spins on a jumped avail index");
    assert!(q.broken());
    assert_eq!(executed, 0);
    assert_eq!((irq.needs_reset(), irq.queue()), (1, 0));
    assert!((1..=2).contains(&lines), "control: {lines} log lines");
    assert_eq!(ring.used_idx(), 0);
}

/// virtio-blk: one request queue, served twice.
#[test]
fn blk_avail_index_jump_breaks_the_queue_without_spinning() {
    let path = std::env::temp_dir().join(format!("dmavisor-avail-jump-{}.raw", std::process::id()));
    std::fs::File::create(&path)
        .and_then(|mut f| f.write_all(&[0u8; 4096]))
        .unwrap();
    let disk = DiskImage::open(&path, false, None).unwrap();
    let _ = std::fs::remove_file(&path);
    let (ring, q, mem) = jumped_queue(0);
    let irq = Arc::new(IrqCount::default());
    let i = irq.clone();
    let queue = q.queue;
    let (broken, lines) = returns_in_bound(move || {
        counting::install();
        let before = counting::lines();
        // Built here: the server's iovec scratch is not Send.
        let mut server = QueueServer::new(0, queue, Limits::for_queue_size(SIZE));
        let mut dma = ThreadDma::new(mem).unwrap();
        for _ in 0..2 {
            server.process(&mut dma, &disk, &*i);
        }
        (server.broken(), counting::lines() - before)
    })
    .expect("virtio-blk spins on a jumped avail index");
    assert!(broken);
    assert_eq!((irq.needs_reset(), irq.queue()), (1, 0));
    assert!((1..=2).contains(&lines), "{lines} log lines");
    assert_eq!(ring.used_idx(), 0);
}

/// vhost-user-net's control queue, served by the VMM on a thread of its
/// own: kicks after the jump change nothing, and the thread still stops
/// when told.
#[test]
fn vhost_user_ctrl_avail_index_jump_breaks_the_queue_without_spinning() {
    let (ring, queue, mem) = jumped_queue(2);
    let kick = queue.kick.try_clone().unwrap();
    let stop = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let (ours, _backend) = UnixStream::pair().unwrap();
    let irq = Arc::new(IrqCount::default());
    let server = CtrlQueueServer {
        queue,
        mem,
        interrupt: irq.clone(),
        client: Arc::new(Mutex::new(Client::from_stream(ours).unwrap())),
        rings: vec![0, 1],
        pairs: 1,
        pairs_used: Arc::new(AtomicUsize::new(1)),
        stop: stop.try_clone().unwrap(),
    };
    let thread = std::thread::spawn(move || run_ctrl_queue(server));
    kick.write(1).unwrap();
    let t = Instant::now();
    while irq.needs_reset() == 0 {
        assert!(t.elapsed() < Duration::from_secs(5), "no NEEDS_RESET");
        std::thread::sleep(Duration::from_millis(2));
    }
    for _ in 0..10 {
        kick.write(1).unwrap();
    }
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!((irq.needs_reset(), irq.queue()), (1, 0));
    assert_eq!(ring.used_idx(), 0);
    stop.write(1).unwrap();
    assert!(
        returns_in_bound(move || thread.join().is_ok()) == Some(true),
        "the control thread does not stop"
    );
}
