//! Fuzzes virtio-net's receive, transmit and control queues as a hostile
//! driver drives them: arbitrary descriptor tables and buffers in guest
//! memory, heads offered (again and again, held ones included), avail
//! indices written at will, frames of any length from the TAP side.
//!
//! Input: [size][flags][op count n][n ops of 3 bytes][guest memory...].
//! `size` picks a queue size 1..=256, `flags` mergeable receive buffers,
//! EVENT_IDX, the largest frame, and what control commands answer. Ops:
//! offer a head on a queue, set a queue's avail index, queue a frame,
//! run receive, transmit or control.
//!
//! Invariants beyond "no panic": the receive side never holds more chains
//! than the queue size nor more descriptors than its bound, and its host
//! memory stays bounded; every iovec handed to the TAP (read or write)
//! lies inside guest RAM; every used entry names a head inside the queue;
//! a delivered frame's used lengths add up to the frame, a dropped one
//! uses one empty buffer at most; transmit entries are empty and control
//! entries one byte; a queue broken on a fault asks for a reset.
#![no_main]

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::num::Wrapping;
use std::sync::atomic::{AtomicU32, Ordering};

use libfuzzer_sys::fuzz_target;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};
use vmm::dma::{DmaSpace, ThreadDma};
use vmm::memory::GuestMemoryMmap;
use vmm::net::ctrl::{serve_ctrl_queue, CtrlCommand};
use vmm::net::queue::WorkerQueue;
use vmm::net::rx::{
    arm_rx_kick, FrameSource, RxBuffers, RxStep, MAX_FRAME, MAX_HELD_DESCRIPTORS, MAX_PLAIN_FRAME,
};
use vmm::net::tx::{process_tx, FrameSink, TxState};
use vmm::virtio::chain::{Chain, MAX_CHAIN_DESCRIPTORS};
use vmm::virtio::{ActiveQueue, VirtioInterrupt};
use vmm_sys_util::eventfd::EventFd;

const MEM_SIZE: usize = 0x10000;
/// Descriptor tables of the receive, transmit and control queues: all in
/// the first 4 KiB, which the input fills (run.sh caps inputs at 4 KiB),
/// overlapping once a queue has more than 64 entries (hostile, allowed).
const DESC: [u64; 3] = [0x0, 0x400, 0x800];
/// Their avail rings and used rings (a queue of 256 needs 2,054 bytes).
const AVAIL: [u64; 3] = [0x4000, 0x5000, 0x6000];
const USED: [u64; 3] = [0x8000, 0x9000, 0xa000];
/// What the receive side may hold at most: descriptors and iovecs of the
/// held chains, recycled chains, the host frame buffer.
const HOST_BYTES: usize = MAX_FRAME + 1024 * 1024;

/// Guest RAM as the host sees it: every iovec must fall inside.
#[derive(Clone, Copy)]
struct Ram {
    base: usize,
}

impl Ram {
    fn check(&self, iov: &[libc::iovec]) -> usize {
        let mut total = 0;
        for v in iov {
            let start = v.iov_base as usize;
            assert!(
                start >= self.base && start + v.iov_len <= self.base + MEM_SIZE,
                "iovec {start:#x}+{} outside guest RAM",
                v.iov_len
            );
            total += v.iov_len;
        }
        total
    }
}

/// The TAP's side: frames of the lengths queued, read as the TAP would.
struct Frames {
    ram: Ram,
    lens: RefCell<VecDeque<usize>>,
    /// Length of the last frame handed over.
    last: Cell<usize>,
}

fn byte(i: usize) -> u8 {
    (i * 13 + 7) as u8
}

impl FrameSource for Frames {
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        let len = self
            .lens
            .borrow_mut()
            .pop_front()
            .ok_or(io::ErrorKind::WouldBlock)?;
        let n = len.min(buf.len());
        for (i, b) in buf.iter_mut().take(n).enumerate() {
            *b = byte(i);
        }
        self.last.set(n);
        Ok(n)
    }

    unsafe fn read_frame_iov(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        let room = self.ram.check(iov);
        assert!(iov.len() <= 1024, "{} iovecs for one readv", iov.len());
        let len = self
            .lens
            .borrow_mut()
            .pop_front()
            .ok_or(io::ErrorKind::WouldBlock)?;
        if len > room {
            // The TAP drops a frame its buffers cannot take.
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        let mut done = 0;
        for v in iov {
            let n = v.iov_len.min(len - done);
            for k in 0..n {
                // SAFETY: checked inside guest RAM above, which the fuzz
                // input owns; writable for its length.
                unsafe {
                    v.iov_base
                        .cast::<u8>()
                        .add(k)
                        .write_volatile(byte(done + k))
                };
            }
            done += n;
        }
        self.last.set(len);
        Ok(len)
    }
}

/// The TAP's side of transmit: checks and counts frames.
struct Sink {
    ram: Ram,
    frames: Cell<u64>,
}

impl FrameSink for Sink {
    fn write_frame_iov(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        let total = self.ram.check(iov);
        assert!(total >= 12, "a transmit frame shorter than its header");
        assert!(iov.len() <= MAX_CHAIN_DESCRIPTORS);
        self.frames.set(self.frames.get() + 1);
        Ok(total)
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

fn make_queue(size: u16, q: usize, event_idx: bool) -> Option<Queue> {
    let mut queue = Queue::new(256).ok()?;
    queue.try_set_size(size).ok()?;
    queue
        .try_set_desc_table_address(GuestAddress(DESC[q]))
        .ok()?;
    queue
        .try_set_avail_ring_address(GuestAddress(AVAIL[q]))
        .ok()?;
    queue
        .try_set_used_ring_address(GuestAddress(USED[q]))
        .ok()?;
    queue.set_ready(true);
    queue.set_event_idx(event_idx);
    Some(queue)
}

fn worker_queue(index: u16, queue: Queue) -> Option<WorkerQueue> {
    let kick = EventFd::new(libc::EFD_NONBLOCK).ok()?;
    Some(WorkerQueue::from(ActiveQueue { index, queue, kick }))
}

/// The used entries `from..to` of the used ring at `ring`: (id, len).
fn used(mem: &GuestMemoryMmap, ring: u64, size: u16, from: u16, to: u16) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let mut i = Wrapping(from);
    while i.0 != to {
        let at = ring + 4 + 8 * u64::from(i.0 % size);
        let id: u32 = mem.read_obj(GuestAddress(at)).unwrap_or(u32::MAX);
        let len: u32 = mem.read_obj(GuestAddress(at + 4)).unwrap_or(u32::MAX);
        out.push((id, len));
        i += 1;
    }
    out
}

fn check_ids(entries: &[(u32, u32)], size: u16) {
    for (id, _) in entries {
        assert!(*id < u32::from(size), "used id {id} in a queue of {size}");
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let size = 1u16 << (data[0] % 9);
    let flags = data[1];
    let mergeable = flags & 1 != 0;
    let event_idx = flags & 2 != 0;
    let max_frame = match flags >> 2 & 3 {
        0 => 4096,
        1 => MAX_PLAIN_FRAME,
        _ => MAX_FRAME,
    };
    let ctrl_ok = flags & 16 != 0;
    let nops = usize::from(data[2]);
    let Some(ops) = data.get(3..3 + 3 * nops) else {
        return;
    };
    let image = &data[3 + 3 * nops..];
    let Ok(mem) = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]) else {
        return;
    };
    let n = image.len().min(MEM_SIZE);
    if mem.write_slice(&image[..n], GuestAddress(0)).is_err() {
        return;
    }
    // Rings start empty: avail flags and index, the whole used ring.
    for q in 0..3 {
        let _ = mem.write_slice(&[0u8; 4], GuestAddress(AVAIL[q]));
        let _ = mem.write_slice(&[0u8; 0x810], GuestAddress(USED[q]));
    }
    let Ok(host) = mem.get_host_address(GuestAddress(0)) else {
        return;
    };
    let ram = Ram {
        base: host as usize,
    };
    let dma = DmaSpace::identity(mem.clone());
    let mut thread_dma = ThreadDma::new(dma.clone()).expect("identity space");
    let Some(mut rxq) = make_queue(size, 0, event_idx) else {
        return;
    };
    let (Some(txq), Some(cq)) = (
        make_queue(size, 1, event_idx),
        make_queue(size, 2, event_idx),
    ) else {
        return;
    };
    let (Some(mut txq), Some(mut cq)) = (worker_queue(1, txq), worker_queue(2, cq)) else {
        return;
    };
    let irq = Irq::default();
    let frames = Frames {
        ram,
        lens: RefCell::new(VecDeque::new()),
        last: Cell::new(0),
    };
    let sink = Sink {
        ram,
        frames: Cell::new(0),
    };
    let mut rx = RxBuffers::new(mergeable, max_frame);
    let mut tx = TxState::default();
    let mut chain = Chain::default();
    let mut rx_broken = false;
    let mut avail = [Wrapping(0u16); 3];

    for op in ops.chunks_exact(3) {
        let (kind, a, b) = (op[0] % 8, op[1], op[2]);
        match kind {
            // Offer head `a | b << 8` (masked to a little past the size)
            // on queue `kind`.
            0..=2 => {
                let q = usize::from(kind);
                let head = u16::from_le_bytes([a, b]) % (size.saturating_mul(2).max(2));
                let slot = AVAIL[q] + 4 + 2 * u64::from(avail[q].0 % size);
                let _ = mem.write_obj(head, GuestAddress(slot));
                avail[q] += 1;
                let _ = mem.write_obj(avail[q].0, GuestAddress(AVAIL[q] + 2));
            }
            // A hostile avail index.
            3 => {
                let q = usize::from(a % 3);
                avail[q] = Wrapping(u16::from(b) << 4 | u16::from(a >> 4));
                let _ = mem.write_obj(avail[q].0, GuestAddress(AVAIL[q] + 2));
            }
            // A frame of up to 64 KiB + 255.
            4 => frames
                .lens
                .borrow_mut()
                .push_back(usize::from(a) << 8 | usize::from(b)),
            // Receive until the TAP is empty or buffers run out.
            5 if !rx_broken => {
                for _ in 0..64 {
                    let before = rxq.next_used();
                    let step = rx.receive_one(&mut rxq, &dma, &frames);
                    let entries = used(&mem, USED[0], size, before, rxq.next_used());
                    check_ids(&entries, size);
                    let sum: u64 = entries.iter().map(|e| u64::from(e.1)).sum();
                    assert!(rx.held_chains() <= usize::from(size));
                    assert!(rx.held_descriptors() < MAX_HELD_DESCRIPTORS + MAX_CHAIN_DESCRIPTORS);
                    assert!(rx.host_bytes() <= HOST_BYTES, "{}", rx.host_bytes());
                    match step {
                        RxStep::Delivered => {
                            assert!(!entries.is_empty());
                            assert_eq!(sum, frames.last.get() as u64, "delivered bytes");
                            if !mergeable {
                                assert_eq!(entries.len(), 1);
                            }
                        }
                        RxStep::Dropped(true) => {
                            assert!(
                                entries.len() == 1 && sum == 0,
                                "a dropped frame returned {entries:?}"
                            );
                        }
                        RxStep::Dropped(false) => assert!(entries.is_empty()),
                        RxStep::TapEmpty | RxStep::TapError(_) => {
                            assert!(entries.is_empty());
                            break;
                        }
                        RxStep::NoBuffers(looked_at) => {
                            assert!(entries.is_empty());
                            match arm_rx_kick(&mut rxq, &dma, looked_at) {
                                Ok(true) => continue,
                                Ok(false) => break,
                                Err(_) => {
                                    rx_broken = true;
                                    break;
                                }
                            }
                        }
                        RxStep::Broken(_) => {
                            assert_eq!(rx.held_chains(), 0, "a broken queue holds chains");
                            rx_broken = true;
                            break;
                        }
                    }
                }
            }
            6 => {
                let before = txq.queue().next_used();
                let sent = sink.frames.get();
                process_tx(&mut txq, &mut thread_dma, &irq, &mut tx, &sink);
                let entries = used(&mem, USED[1], size, before, txq.queue().next_used());
                check_ids(&entries, size);
                assert!(entries.iter().all(|e| e.1 == 0), "transmit used length");
                assert!(sink.frames.get() - sent <= entries.len() as u64);
                assert_eq!(tx.sent(), sink.frames.get());
            }
            7 => {
                let before = cq.queue().next_used();
                serve_ctrl_queue(&mut cq, &mut thread_dma, &irq, &mut chain, &mut |cmd| {
                    let CtrlCommand::SetQueuePairs(_) = cmd;
                    ctrl_ok
                });
                let entries = used(&mem, USED[2], size, before, cq.queue().next_used());
                check_ids(&entries, size);
                assert!(entries.iter().all(|e| e.1 == 1), "control used length");
            }
            _ => {}
        }
    }
    let broken = u32::from(txq.broken()) + u32::from(cq.broken());
    assert!(
        irq.resets.load(Ordering::Relaxed) >= broken.min(1),
        "a broken queue did not ask for a reset"
    );
});
