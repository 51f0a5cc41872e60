//! Transmit against a driver ring in test RAM and a recording sink:
//! frames gathered across descriptors, short frames dropped with their
//! chain returned, hostile chains breaking the queue.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};

use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use super::*;
use crate::memory::GuestMemoryMmap;
use crate::virtio::chain::{VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE};
use crate::virtio::test_ring::{leaked_ram, DriverRing, RingAddrs};
use crate::virtio::ActiveQueue;

/// Frames as the TAP would get them.
#[derive(Default)]
struct Recorder {
    frames: RefCell<Vec<Vec<u8>>>,
}

impl FrameSink for Recorder {
    fn write_frame_iov(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        let mut f = Vec::new();
        for v in iov {
            // SAFETY: the device hands over iovecs valid for reads.
            f.extend_from_slice(unsafe {
                std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len)
            });
        }
        let n = f.len();
        self.frames.borrow_mut().push(f);
        Ok(n)
    }
}

#[derive(Default)]
struct Irq {
    resets: AtomicU32,
}

impl VirtioInterrupt for Irq {
    fn notify_queue(&self, _queue: u16) {}
    fn notify_config(&self) {}
    fn set_needs_reset(&self) {
        self.resets.fetch_add(1, Ordering::Relaxed);
    }
}

struct Fixture {
    mem: &'static GuestMemoryMmap,
    dma: DmaSpace,
    driver: DriverRing<'static>,
    q: WorkerQueue,
    st: TxState,
    sink: Recorder,
    irq: Irq,
}

impl Fixture {
    fn new() -> Self {
        let mem = leaked_ram(0x20000);
        let addrs = RingAddrs {
            desc: 0x1000,
            avail: 0x2000,
            used: 0x3000,
        };
        let driver = DriverRing::new(mem, addrs, 8);
        let q = WorkerQueue::from(ActiveQueue {
            index: 1,
            queue: driver.queue(),
            kick: EventFd::new(libc::EFD_NONBLOCK).unwrap(),
        });
        Self {
            mem,
            dma: DmaSpace::identity(mem.clone()),
            driver,
            q,
            st: TxState::default(),
            sink: Recorder::default(),
            irq: Irq::default(),
        }
    }

    fn run(&mut self) {
        let mut dma = ThreadDma::new(self.dma.clone()).unwrap();
        process_tx(&mut self.q, &mut dma, &self.irq, &mut self.st, &self.sink);
    }
}

#[test]
fn a_frame_is_gathered_across_descriptors_and_returned_empty() {
    let mut f = Fixture::new();
    let frame: Vec<u8> = (0..300u32).map(|i| ((i * 7) & 0xff) as u8).collect();
    f.mem
        .write_slice(&frame[..12], GuestAddress(0x8000))
        .unwrap();
    f.mem
        .write_slice(&frame[12..], GuestAddress(0x9000))
        .unwrap();
    f.driver.desc(0, 0x8000, 12, VIRTQ_DESC_F_NEXT, 1);
    f.driver.desc(1, 0x9000, 288, 0, 0);
    f.driver.offer(0);
    // Too short for a header: dropped, chain still returned.
    f.driver.desc(2, 0x8000, 11, 0, 0);
    f.driver.offer(2);
    f.run();
    assert_eq!(*f.sink.frames.borrow(), vec![frame]);
    assert_eq!((f.st.sent(), f.st.dropped()), (1, 1));
    assert_eq!(f.driver.used_idx(), 2);
    assert_eq!(f.driver.used(0), (0, 0));
    assert_eq!(f.driver.used(1), (2, 0));
    assert!(!f.q.broken());
}

#[test]
fn hostile_transmit_chains_break_the_queue_and_ask_for_a_reset() {
    for bad in 0..3 {
        let mut f = Fixture::new();
        match bad {
            // A buffer outside guest RAM.
            0 => f.driver.desc(0, 0xffff_0000, 64, 0, 0),
            // A loop.
            1 => {
                f.driver.desc(0, 0x8000, 64, VIRTQ_DESC_F_NEXT, 1);
                f.driver.desc(1, 0x8000, 64, VIRTQ_DESC_F_NEXT, 0);
            }
            // A head outside the table.
            _ => {}
        }
        f.driver.offer(if bad == 2 { 9 } else { 0 });
        f.run();
        assert!(f.q.broken(), "case {bad}");
        assert_eq!(f.irq.resets.load(Ordering::Relaxed), 1);
        assert_eq!(f.driver.used_idx(), 0);
        assert!(f.sink.frames.borrow().is_empty());
        // A broken queue is left alone.
        f.driver.desc(3, 0x8000, 64, VIRTQ_DESC_F_WRITE, 0);
        f.driver.offer(3);
        f.run();
        assert_eq!(f.driver.used_idx(), 0);
    }
}
