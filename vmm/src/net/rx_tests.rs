//! Receive buffers against a driver ring in test RAM and a scripted TAP:
//! both ways a frame is placed (read in place, or copied from the host
//! buffer), buffers held between frames, and hostile rings.

use std::cell::RefCell;
use std::collections::VecDeque;

use super::*;
use crate::memory::GuestMemoryMmap;
use crate::virtio::chain::{VIRTQ_DESC_F_INDIRECT, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE};
use crate::virtio::test_ring::{leaked_ram, put_desc, DriverRing, RingAddrs};

const DESC: u64 = 0x1000;
const AVAIL: u64 = 0x2000;
const USED: u64 = 0x3000;
const SIZE: u16 = 8;

/// A `max_frame` small enough that two 2 KiB buffers take it: frames are
/// read in place.
const IN_PLACE: usize = 4096;
/// A `max_frame` no test ring can hold: frames go through the host buffer.
const BOUNCED: usize = MAX_PLAIN_FRAME;

/// Frames handed out in order, then "would block".
#[derive(Default)]
struct Frames {
    queue: RefCell<VecDeque<Vec<u8>>>,
    /// How many frames were read in place.
    in_place: RefCell<usize>,
}

impl Frames {
    fn with(frames: &[&[u8]]) -> Self {
        let f = Self::default();
        for fr in frames {
            f.queue.borrow_mut().push_back(fr.to_vec());
        }
        f
    }
}

impl FrameSource for Frames {
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        let f = self
            .queue
            .borrow_mut()
            .pop_front()
            .ok_or(io::ErrorKind::WouldBlock)?;
        let n = f.len().min(buf.len());
        buf[..n].copy_from_slice(&f[..n]);
        Ok(n)
    }

    unsafe fn read_frame_iov(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        let f = self
            .queue
            .borrow_mut()
            .pop_front()
            .ok_or(io::ErrorKind::WouldBlock)?;
        *self.in_place.borrow_mut() += 1;
        let mut off = 0;
        for v in iov {
            let n = v.iov_len.min(f.len() - off);
            // SAFETY: the caller guarantees each iovec is writable.
            let dst = unsafe { std::slice::from_raw_parts_mut(v.iov_base.cast::<u8>(), n) };
            dst.copy_from_slice(&f[off..off + n]);
            off += n;
        }
        // Like the TAP, a frame larger than the buffers is an error.
        if off < f.len() {
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        Ok(off)
    }
}

struct Ring {
    mem: &'static GuestMemoryMmap,
    dma: DmaSpace,
    queue: Queue,
    driver: DriverRing<'static>,
}

impl Ring {
    fn new() -> Self {
        let addrs = RingAddrs {
            desc: DESC,
            avail: AVAIL,
            used: USED,
        };
        Self::with(0x20000, addrs, SIZE)
    }

    /// A ring of `size` entries at `addrs` in `ram` bytes of test RAM.
    fn with(ram: usize, addrs: RingAddrs, size: u16) -> Self {
        let mem = leaked_ram(ram);
        let dma = DmaSpace::identity(mem.clone());
        let driver = DriverRing::new(mem, addrs, size);
        Self {
            mem,
            dma,
            queue: driver.queue(),
            driver,
        }
    }

    /// Posts a one-buffer writable chain at descriptor `i`.
    fn post(&mut self, i: u16, addr: u64, len: u32) {
        self.driver.desc(i, addr, len, VIRTQ_DESC_F_WRITE, 0);
        self.driver.offer(i);
    }

    fn receive(&mut self, rx: &mut RxBuffers, src: &Frames) -> RxStep {
        rx.receive_one(&mut self.queue, &self.dma, src)
    }

    fn num_buffers(&self, addr: u64) -> u16 {
        self.mem.read_obj(GuestAddress(addr + 10)).unwrap()
    }

    fn bytes(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }
}

fn frame(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3).to_le_bytes()[0]).collect()
}

/// The header's `num_buffers` as the frame source left it, before the
/// device fills it in.
fn without_num_buffers(f: &[u8]) -> Vec<u8> {
    let mut v = f.to_vec();
    v[10] = 0xee;
    v[11] = 0xee;
    v
}

#[test]
fn mergeable_frame_spans_chains_in_place_and_bounced() {
    for max_frame in [IN_PLACE, BOUNCED] {
        let mut r = Ring::new();
        r.post(0, 0x8000, 2048);
        r.post(1, 0x9000, 2048);
        let f = without_num_buffers(&frame(3000));
        let src = Frames::with(&[&f]);
        let mut rx = RxBuffers::new(true, max_frame);
        assert!(matches!(r.receive(&mut rx, &src), RxStep::Delivered));
        assert_eq!(*src.in_place.borrow(), usize::from(max_frame == IN_PLACE));
        assert_eq!(r.driver.used_idx(), 2);
        assert_eq!(r.driver.used(0), (0, 2048));
        assert_eq!(r.driver.used(1), (1, 952));
        assert_eq!(r.num_buffers(0x8000), 2, "max_frame {max_frame}");
        assert_eq!(r.bytes(0x8000 + 12, 2036), f[12..2048]);
        assert_eq!(r.bytes(0x9000, 952), f[2048..]);
        assert!(matches!(r.receive(&mut rx, &src), RxStep::TapEmpty));
    }
}

#[test]
fn chains_a_small_frame_did_not_fill_are_kept_for_the_next() {
    let mut r = Ring::new();
    for i in 0..3 {
        r.post(i, 0x8000 + 0x1000 * u64::from(i), 2048);
    }
    let (a, b) = (frame(100), frame(200));
    let src = Frames::with(&[&a, &b]);
    let mut rx = RxBuffers::new(true, IN_PLACE);
    assert!(matches!(r.receive(&mut rx, &src), RxStep::Delivered));
    // Two chains were taken to hold a largest frame; one was used.
    assert_eq!(r.queue.next_avail(), 2);
    assert_eq!((r.driver.used_idx(), r.driver.used(0)), (1, (0, 100)));
    assert!(matches!(r.receive(&mut rx, &src), RxStep::Delivered));
    assert_eq!((r.driver.used_idx(), r.driver.used(1)), (2, (1, 200)));
    assert_eq!(r.num_buffers(0x9000), 1);
    assert_eq!(r.bytes(0x9000 + 12, 188), b[12..]);
    assert_eq!(*src.in_place.borrow(), 2);
}

#[test]
fn a_header_split_over_descriptors_gets_its_buffer_count() {
    let mut r = Ring::new();
    // Chain 0: 8 header bytes, then the rest.
    r.driver
        .desc(0, 0x8000, 8, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, 1);
    r.driver.desc(1, 0x9000, 4088, VIRTQ_DESC_F_WRITE, 0);
    r.driver.offer(0);
    let f = without_num_buffers(&frame(500));
    let src = Frames::with(&[&f]);
    let mut rx = RxBuffers::new(true, IN_PLACE);
    assert!(matches!(r.receive(&mut rx, &src), RxStep::Delivered));
    // num_buffers is bytes 10..12 of the chain: bytes 2..4 of buffer 1.
    let nb: u16 = r.mem.read_obj(GuestAddress(0x9002)).unwrap();
    assert_eq!(nb, 1);
    assert_eq!(r.driver.used(0), (0, 500));
    assert_eq!(r.bytes(0x9004, 488), f[12..]);
}

#[test]
fn without_mergeable_buffers_one_chain_takes_one_frame() {
    let mut r = Ring::new();
    r.post(0, 0x8000, 4096);
    r.post(1, 0x9000, 4096);
    let (a, b) = (without_num_buffers(&frame(1500)), frame(60));
    let src = Frames::with(&[&a, &b]);
    let mut rx = RxBuffers::new(false, IN_PLACE);
    assert!(matches!(r.receive(&mut rx, &src), RxStep::Delivered));
    assert_eq!(r.queue.next_avail(), 1, "one chain taken at a time");
    assert_eq!(r.num_buffers(0x8000), 1);
    assert!(matches!(r.receive(&mut rx, &src), RxStep::Delivered));
    assert_eq!(r.driver.used(0), (0, 1500));
    assert_eq!(r.driver.used(1), (1, 60));
    assert_eq!(*src.in_place.borrow(), 2);
}

/// A guest that unmaps a receive buffer it posted (a hostile driver, or one
/// tearing down) while a frame arrives: the device writes nothing into the
/// page behind it, reports a fault to the vIOMMU, and breaks the queue
/// instead of completing the buffer.
#[test]
fn rx_into_a_buffer_the_guest_unmapped_writes_nothing_and_faults() {
    use crate::dma::test_iommu::{TestIommu, RW};

    for max_frame in [IN_PLACE, BOUNCED] {
        let mut r = Ring::new();
        let iommu = TestIommu::new(0x18);
        iommu.attach(1);
        // Everything mapped at IOVA = GPA, then buffer 1's page unmapped
        // (an UNMAP may not split a mapping, so that page is its own).
        iommu.map(1, 0, 0x9000, 0, RW);
        iommu.map(1, 0x9000, 0x1000, 0x9000, RW);
        iommu.map(1, 0xa000, 0x16000, 0xa000, RW);
        iommu.unmap(1, 0x9000, 0x1000);
        r.dma = iommu.space(r.mem);
        r.mem
            .write_slice(&[0xc5; 4096], GuestAddress(0x9000))
            .unwrap();
        r.post(0, 0x8000, 2048);
        r.post(1, 0x9000, 2048);
        let src = Frames::with(&[&frame(3000)]);
        let mut rx = RxBuffers::new(true, max_frame);
        assert!(matches!(r.receive(&mut rx, &src), RxStep::Broken(_)));
        assert!(
            r.bytes(0x9000, 4096).iter().all(|b| *b == 0xc5),
            "unmapped page written"
        );
        assert_eq!(r.dma.fault_count(), 1);
        assert!(iommu.dev.pop_fault_event().is_some());
        assert_eq!(r.driver.used_idx(), 0, "no buffer completed");
    }
}

#[test]
fn a_frame_waits_for_buffers_and_then_goes_through() {
    let mut r = Ring::new();
    r.post(0, 0x8000, 1024);
    let f = frame(3000);
    let src = Frames::with(&[&f]);
    let mut rx = RxBuffers::new(true, BOUNCED);
    let RxStep::NoBuffers(looked_at) = r.receive(&mut rx, &src) else {
        panic!("expected NoBuffers");
    };
    assert_eq!(looked_at, Wrapping(1));
    assert_eq!(r.driver.used_idx(), 0);
    // Once enough buffers exist, the same frame goes through.
    r.post(1, 0x9000, 4096);
    assert!(matches!(r.receive(&mut rx, &src), RxStep::Delivered));
    assert_eq!(r.driver.used_idx(), 2);
    assert_eq!(r.driver.used(0), (0, 1024));
    assert_eq!(r.driver.used(1), (1, 1976));
    assert_eq!(r.bytes(0x9000, 1976), f[1024..]);
}

/// A ring with one 1 KiB buffer and a 3000-byte frame that does not fit:
/// the receive gives up, and says which avail index it looked at.
fn short_of_buffers(event_idx: bool) -> (Ring, RxBuffers, Frames, Wrapping<u16>) {
    let mut r = Ring::new();
    r.queue.set_event_idx(event_idx);
    r.post(0, 0x8000, 1024);
    let src = Frames::with(&[&frame(3000)]);
    let mut rx = RxBuffers::new(true, BOUNCED);
    let RxStep::NoBuffers(looked_at) = r.receive(&mut rx, &src) else {
        panic!("expected NoBuffers");
    };
    (r, rx, src, looked_at)
}

#[test]
fn out_of_buffers_arms_a_kick_past_the_published_buffers() {
    let (mut r, _, _, looked_at) = short_of_buffers(true);
    assert_eq!(looked_at, Wrapping(1));
    // avail_event must be the driver's index (1): the driver kicks only
    // when its next buffer crosses it.
    assert!(!arm_rx_kick(&mut r.queue, &r.dma, looked_at).unwrap());
    let event: u16 = r
        .mem
        .read_obj(GuestAddress(USED + 4 + 8 * u64::from(SIZE)))
        .unwrap();
    assert_eq!(event, 1);
    // Without EVENT_IDX the flags route is used and nothing is written.
    let mut r = Ring::new();
    r.driver.offer(0);
    assert!(!arm_rx_kick(&mut r.queue, &r.dma, Wrapping(1)).unwrap());
}

#[test]
fn buffers_published_after_the_last_look_are_not_missed() {
    // The driver adds a buffer after the receive gave up at index 1 but
    // before the kick is armed; it did not kick for it (its avail_event
    // was older). Arming must report it, or receive stalls for good.
    for event_idx in [true, false] {
        let (mut r, mut rx, src, looked_at) = short_of_buffers(event_idx);
        r.post(1, 0x9000, 4096);
        assert!(
            arm_rx_kick(&mut r.queue, &r.dma, looked_at).unwrap(),
            "event_idx={event_idx}: the new buffer must be looked at"
        );
        assert!(matches!(r.receive(&mut rx, &src), RxStep::Delivered));
    }
}

#[test]
fn without_mergeable_buffers_a_short_chain_drops_the_frame() {
    let mut r = Ring::new();
    r.post(0, 0x8000, 1024);
    let src = Frames::with(&[&frame(3000), &frame(5)]);
    let mut rx = RxBuffers::new(false, BOUNCED);
    assert!(matches!(r.receive(&mut rx, &src), RxStep::Dropped(true)));
    assert_eq!(r.driver.used(0), (0, 0));
    // Runt frames (shorter than the header) are dropped untouched.
    assert!(matches!(r.receive(&mut rx, &src), RxStep::Dropped(false)));
    assert_eq!(r.driver.used_idx(), 1);
}

#[test]
fn malformed_rings_break_the_queue_without_panic() {
    let broken = |r: &mut Ring| {
        let src = Frames::with(&[&frame(100)]);
        let mut rx = RxBuffers::new(true, IN_PLACE);
        matches!(r.receive(&mut rx, &src), RxStep::Broken(_))
    };
    // Head index outside the table.
    let mut r = Ring::new();
    r.driver.offer(SIZE + 1);
    assert!(broken(&mut r));
    // A descriptor loop.
    let mut r = Ring::new();
    let f = VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT;
    r.driver.desc(0, 0x8000, 10, f, 1);
    r.driver.desc(1, 0x8100, 10, f, 0);
    r.driver.offer(0);
    assert!(broken(&mut r));
    // A receive chain with nothing writable.
    let mut r = Ring::new();
    r.driver.desc(0, 0x8000, 100, 0, 0);
    r.driver.offer(0);
    assert!(broken(&mut r));
    // A buffer outside guest RAM.
    let mut r = Ring::new();
    r.post(0, 0xffff_0000, 4096);
    assert!(broken(&mut r));
    assert_eq!(r.driver.used_idx(), 0);
    // A buffer that wraps the address space.
    let mut r = Ring::new();
    r.post(0, u64::MAX - 10, 4096);
    assert!(broken(&mut r));
    // The avail index jumps by more than the queue size.
    let mut r = Ring::new();
    r.driver.set_avail_idx(100);
    assert!(broken(&mut r));
}

#[test]
fn a_frame_larger_than_max_frame_is_dropped_and_receive_goes_on() {
    let mut r = Ring::new();
    r.post(0, 0x8000, 4096);
    r.post(1, 0x9000, 4096);
    // The read offers max_frame (IN_PLACE) bytes, the first chain; a
    // larger frame makes the TAP fail with EFAULT and drop it.
    let (big, small) = (frame(IN_PLACE + 100), frame(300));
    let src = Frames::with(&[&big, &small]);
    let mut rx = RxBuffers::new(true, IN_PLACE);
    assert!(matches!(r.receive(&mut rx, &src), RxStep::Dropped(false)));
    assert_eq!(r.driver.used_idx(), 0, "no buffer used for the lost frame");
    assert!(matches!(r.receive(&mut rx, &src), RxStep::Delivered));
    assert_eq!((r.driver.used_idx(), r.driver.used(0)), (1, (0, 300)));
    assert_eq!(rx.counts().dropped, 1);
}

/// Issue 27 (8): a driver that posts chains of many zero-length
/// descriptors and one byte, re-posting heads the device still holds, over
/// and over across kicks. Bytes alone bounded what the device took, so it
/// held chains by the tens of thousands (about 1 GiB of walked
/// descriptors) and counted a frame's chains past `u16`. Held chains must
/// stay within the queue size and the descriptor bound, host memory must
/// not grow with the rounds, every used entry must name a real head with
/// no more bytes than its one, and the device must keep serving.
#[test]
fn virtio_net_rx_held_chains_are_bounded() {
    // Room for a ring of 32768: table 512 KiB, avail 64 KiB, used 256 KiB.
    const RAM: usize = 0x20_0000;
    const ADDRS: RingAddrs = RingAddrs {
        desc: 0x10_0000,
        avail: 0x18_0000,
        used: 0x1a_0000,
    };
    const INDIRECT: u64 = 0x1f_0000;
    const BYTE: u64 = 0x8000;
    /// Enough for the held chains' descriptors and iovecs, the iovec list,
    /// the host frame buffer and spare chains; far below what unbounded
    /// holding reached (16 KiB of descriptors per chain, per chain held).
    const HOST_BYTES: usize = MAX_FRAME + 512 * 1024;
    let w = VIRTQ_DESC_F_WRITE;
    for size in [256u16, 32768] {
        for indirect in [true, false] {
            let mut r = Ring::with(RAM, ADDRS, size);
            if indirect {
                // Every head is an indirect table of 1,022 empty buffers
                // and one byte (1,024 descriptors with the head: the
                // walker's limit).
                let last = u16::try_from(MAX_CHAIN_DESCRIPTORS - 2).unwrap();
                for i in 0..last {
                    put_desc(r.mem, INDIRECT, i, BYTE, 0, w | VIRTQ_DESC_F_NEXT, i + 1);
                }
                put_desc(r.mem, INDIRECT, last, BYTE, 1, w, 0);
                let len = (u32::try_from(MAX_CHAIN_DESCRIPTORS).unwrap() - 1) * 16;
                for i in 0..size {
                    r.driver.desc(i, INDIRECT, len, VIRTQ_DESC_F_INDIRECT, 0);
                }
            } else {
                // Chains of an empty buffer and one byte.
                for i in (0..size).step_by(2) {
                    r.driver.desc(i, BYTE, 0, w | VIRTQ_DESC_F_NEXT, i + 1);
                    r.driver.desc(i + 1, BYTE, 1, w, 0);
                }
            }
            let heads: Vec<u16> = if indirect {
                (0..size).collect()
            } else {
                (0..size).step_by(2).collect()
            };
            let mut rx = RxBuffers::new(true, MAX_FRAME);
            let (mut offered, mut next_head, mut used_seen) = (0u16, 0usize, 0u64);
            let mut peak = 0usize;
            let rounds = 500;
            for round in 0..rounds {
                // The driver fills the ring up to the device's position
                // plus the queue size, heads still held included.
                while offered.wrapping_sub(r.queue.next_avail()) < size {
                    r.driver.offer(heads[next_head % heads.len()]);
                    next_head += 1;
                    offered = offered.wrapping_add(1);
                }
                let src = Frames::with(&[&frame(60), &frame(100), &frame(2000)]);
                loop {
                    match r.receive(&mut rx, &src) {
                        RxStep::Delivered | RxStep::Dropped(_) => {}
                        RxStep::TapEmpty | RxStep::NoBuffers(_) => break,
                        RxStep::TapError(e) => panic!("tap error {e}"),
                        RxStep::Broken(e) => panic!("size {size}: queue broken: {e}"),
                    }
                    assert!(rx.held_chains() <= usize::from(size));
                    assert!(
                        rx.held_descriptors() < MAX_HELD_DESCRIPTORS + MAX_CHAIN_DESCRIPTORS,
                        "{} descriptors held",
                        rx.held_descriptors()
                    );
                }
                // Every new used entry names a head of the ring and no more
                // than the chain's one writable byte.
                let used_idx = r.driver.used_idx();
                while (used_seen & 0xffff) as u16 != used_idx {
                    let (id, len) = r.driver.used(used_seen);
                    assert!(id < u32::from(size) && len <= 1, "used ({id}, {len})");
                    used_seen += 1;
                }
                let bytes = rx.host_bytes();
                assert!(bytes <= HOST_BYTES, "size {size}: {bytes} host bytes held");
                if round == 10 {
                    peak = bytes;
                }
                if round > 10 {
                    assert!(bytes <= peak, "host memory grows: {bytes} > {peak}");
                }
            }
            let c = rx.counts();
            if indirect {
                // Two such chains (1,023 buffers each) reach the
                // descriptor bound; no frame of these fits their two bytes.
                assert_eq!(rx.held_chains(), 2);
                assert_eq!(c.in_place + c.copied, 0);
            } else {
                // The small frames went through, over tens of thousands of
                // chains in all (past u16), the large ones were dropped.
                assert_eq!(c.copied, 2 * rounds);
                assert!(used_seen > 65_536, "{used_seen} chains returned");
                assert!(c.over_bound >= rounds - 1, "{c:?}");
            }
            assert!(c.dropped >= c.over_bound);
        }
    }
}
