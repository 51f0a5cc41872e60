//! The thread serving one queue pair of a virtio-net device: frames from
//! the TAP go to the receive queue, transmit chains go to the TAP.
//!
//! WHY a thread per pair, woken by epoll on the TAP fd and the queues'
//! ioeventfds: vCPUs only signal an eventfd (in the kernel) on a kick; all
//! ring and buffer work happens here, in parallel with the guest.
//!
//! Every guest-memory access goes through the device's [`DmaSpace`]. Ring
//! contents are hostile: a malformed chain, a ring index that jumps, or a
//! buffer the IOMMU refuses marks that queue broken (logged once, the
//! transport sets DEVICE_NEEDS_RESET) and the queue is left alone until the
//! driver resets the device. The VMM keeps running.

use std::io;
use std::num::Wrapping;
use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use log::{debug, warn};
use virtio_iommu::quiesce::ReaderSlot;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemory, Permissions};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::ctrl::{serve_ctrl_queue, CtrlCommand};
use super::queue::{break_queue, pop_head, signal_used, WorkerQueue};
use super::tap::{Tap, VNET_HDR_LEN};
use crate::dma::DmaSpace;
use crate::virtio::chain::{walk_into, Chain, ChainError, MAX_CHAIN_DESCRIPTORS};
use crate::virtio::wake::epoll_on;
use crate::virtio::VirtioInterrupt;

const TOKEN_STOP: u64 = 0;
const TOKEN_RX: u64 = 1;
const TOKEN_TX: u64 = 2;
const TOKEN_TAP: u64 = 3;
const TOKEN_CTRL: u64 = 4;

/// Largest frame the TAP hands us: a 64 KiB GSO frame plus headers.
pub const MAX_FRAME: usize = 65536 + 256;

/// What the worker is given (all `Send`; the worker itself holds raw
/// iovec pointers and is built on its thread).
pub struct WorkerParts {
    /// The device's DMA space.
    pub mem: DmaSpace,
    /// Interrupt delivery.
    pub interrupt: Arc<dyn VirtioInterrupt>,
    /// The TAP queue of this pair.
    pub tap: Arc<Tap>,
    /// Receive queue.
    pub rx: WorkerQueue,
    /// Transmit queue.
    pub tx: WorkerQueue,
    /// Control queue (served by the first pair's worker).
    pub ctrl: Option<WorkerQueue>,
    /// VIRTIO_NET_F_MRG_RXBUF was negotiated.
    pub mrg_rxbuf: bool,
    /// Every pair's TAP queue (pair 0's worker attaches and detaches them
    /// on VQ_PAIRS_SET).
    pub all_taps: Vec<Arc<Tap>>,
    /// Every pair's receive kick (pair 0's worker wakes a pair whose TAP
    /// queue it attached).
    pub all_rx_kicks: Vec<EventFd>,
    /// Written to stop the worker.
    pub stop: EventFd,
}

enum Delivery {
    Done,
    /// The frame was dropped; `true` if a buffer was returned used.
    Dropped(bool),
    /// Too few buffers; the driver's avail index that was looked at (every
    /// buffer before it was considered, none after it).
    NoBuffers(Wrapping<u16>),
    /// The receive queue cannot be used any more.
    Broken(RxError),
}

/// Why a frame's delivery broke the receive queue.
#[derive(Debug, thiserror::Error)]
enum RxError {
    /// The avail ring cannot be read.
    #[error("avail ring: {0}")]
    AvailRing(#[source] virtio_queue::Error),
    /// The chain pool did not grow (a bug, not the guest's doing).
    #[error("internal chain pool")]
    ChainPool,
    /// The driver's chain is malformed.
    #[error("receive chain {head}: {source}")]
    Chain {
        /// Its head index.
        head: u16,
        /// What is wrong with it.
        source: ChainError,
    },
    /// A receive chain the device cannot write into.
    #[error("receive chain {head} has no writable buffer")]
    NoWritableBuffer {
        /// Its head index.
        head: u16,
    },
    /// The used ring cannot be written.
    #[error("used ring: {0}")]
    UsedRing(#[source] virtio_queue::Error),
    /// A frame slice out of bounds (a bug, not the guest's doing).
    #[error("internal frame bounds")]
    FrameBounds,
    /// A receive buffer cannot be written (the vIOMMU refuses it, or it is
    /// not guest RAM).
    #[error("receive buffer {addr:#x}: {source}")]
    Buffer {
        /// The buffer's address.
        addr: u64,
        /// The access error.
        source: vm_memory::GuestMemoryError,
    },
}

/// The state of the thread serving one queue pair (its loop is
/// [`QueuePairWorker::run`]).
struct QueuePairWorker {
    /// The queue pair, its TAP queue and what they share with the device.
    pair: WorkerParts,
    epoll: Epoll,
    frame: Vec<u8>,
    frame_len: Option<usize>,
    chain: Chain,
    chains: Vec<Chain>,
    tap_polled: bool,
    tx_dropped: u64,
    /// This thread's quiescence slot (behind a vIOMMU): every chain is
    /// translated and used inside one section.
    reader: Option<Arc<ReaderSlot>>,
}

/// Why the receive queue's kick could not be armed (the queue stops).
#[derive(Debug, thiserror::Error)]
enum ArmKickError {
    /// The rings cannot be read or notifications enabled.
    #[error(transparent)]
    Ring(#[from] virtio_queue::Error),
    /// `avail_event` cannot be written.
    #[error(transparent)]
    Memory(#[from] vm_memory::GuestMemoryError),
    /// The used ring ends past the top of the address space.
    #[error("used ring address overflows")]
    UsedRingOverflow,
}

/// After a receive ran out of buffers: asks the driver to kick on the next
/// buffer it adds, and says whether buffers arrived after `looked_at`, the
/// avail index [`deliver`] stopped at.
///
/// WHY not `Queue::enable_notification`: with EVENT_IDX it sets
/// `avail_event` to `next_avail`, but buffers between `next_avail` and the
/// driver's `avail_idx` are already published and too few for the pending
/// frame; the driver only kicks when its index crosses `avail_event`, which
/// it already has, so no kick would ever come. Here `avail_event` is set to
/// the driver's current index, so its next buffer triggers the kick.
///
/// WHY compare with `looked_at` and not with the index read here: buffers
/// the driver published between `deliver`'s last look and this function
/// were never offered to the pending frame, and the driver did not kick
/// for them (its `avail_event` was older). Reporting "nothing new" then
/// would stop TAP polling while a full ring waits for a kick that never
/// comes: receive stalls for good.
fn arm_rx_kick(
    q: &mut Queue,
    mem: &DmaSpace,
    looked_at: Wrapping<u16>,
) -> Result<bool, ArmKickError> {
    let seen = q.avail_idx(mem, Ordering::Acquire)?;
    if q.event_idx_enabled() {
        // used ring: flags, idx, ring[size], then avail_event.
        let at = q
            .used_ring()
            .checked_add(4 + 8 * u64::from(q.size()))
            .ok_or(ArmKickError::UsedRingOverflow)?;
        mem.store(u16::to_le(seen.0), GuestAddress(at), Ordering::Release)?;
    } else {
        q.enable_notification(mem)?;
    }
    fence(Ordering::SeqCst);
    let now = q.avail_idx(mem, Ordering::Acquire)?;
    Ok(now != looked_at)
}

/// Places one received frame (`frame[..len]`, virtio-net header first) in
/// one chain, or several with mergeable buffers.
fn deliver(
    mem: &DmaSpace,
    q: &mut Queue,
    frame: &mut [u8],
    len: usize,
    chains: &mut Vec<Chain>,
    mrg_rxbuf: bool,
) -> Delivery {
    if len < VNET_HDR_LEN || len > frame.len() {
        return Delivery::Dropped(false);
    }
    let saved = q.next_avail();
    let mut need = len as u64;
    let mut n = 0usize;
    loop {
        let head = match pop_head(q, mem) {
            Ok(Some(h)) => h,
            Ok(None) => {
                // Give back what we took; wait for more buffers.
                let looked_at = Wrapping(q.next_avail());
                q.set_next_avail(saved);
                return Delivery::NoBuffers(looked_at);
            }
            Err(e) => return Delivery::Broken(RxError::AvailRing(e)),
        };
        if chains.len() <= n {
            chains.push(Chain::default());
        }
        let Some(chain) = chains.get_mut(n) else {
            return Delivery::Broken(RxError::ChainPool);
        };
        if let Err(source) = walk_into(mem, q.desc_table(), q.size(), head, chain) {
            return Delivery::Broken(RxError::Chain { head, source });
        }
        let cap = chain.writable_len();
        if cap == 0 {
            return Delivery::Broken(RxError::NoWritableBuffer { head });
        }
        n += 1;
        if cap >= need {
            break;
        }
        need -= cap;
        if !mrg_rxbuf {
            // Too big for the one buffer the driver gave: drop the frame
            // and hand the buffer back empty.
            return match q.add_used(mem, head, 0) {
                Ok(()) => Delivery::Dropped(true),
                Err(e) => Delivery::Broken(RxError::UsedRing(e)),
            };
        }
    }
    // virtio_net_hdr_v1.num_buffers (1 without mergeable buffers).
    let nb = (n as u16).to_le_bytes();
    frame[10] = nb[0];
    frame[11] = nb[1];
    let mut off = 0usize;
    for chain in chains.iter().take(n) {
        let mut written = 0u32;
        for b in &chain.writable {
            if off >= len {
                break;
            }
            let want = (b.len as usize).min(len - off);
            let Some(src) = frame.get(off..off + want) else {
                return Delivery::Broken(RxError::FrameBounds);
            };
            if let Err(source) = mem.write_slice(src, GuestAddress(b.addr)) {
                return Delivery::Broken(RxError::Buffer {
                    addr: b.addr,
                    source,
                });
            }
            off += want;
            written += want as u32;
        }
        if let Err(e) = q.add_used(mem, chain.head, written) {
            return Delivery::Broken(RxError::UsedRing(e));
        }
    }
    Delivery::Done
}

impl QueuePairWorker {
    fn new(pair: WorkerParts) -> io::Result<Self> {
        let mut fds = vec![
            (pair.stop.as_raw_fd(), TOKEN_STOP),
            (pair.rx.kick.as_raw_fd(), TOKEN_RX),
            (pair.tx.kick.as_raw_fd(), TOKEN_TX),
            (pair.tap.as_raw_fd(), TOKEN_TAP),
        ];
        if let Some(c) = &pair.ctrl {
            fds.push((c.kick.as_raw_fd(), TOKEN_CTRL));
        }
        let epoll = epoll_on(&fds)?;
        let reader = pair.mem.reader();
        Ok(Self {
            reader,
            pair,
            epoll,
            frame: vec![0u8; MAX_FRAME],
            frame_len: None,
            chain: Chain::default(),
            chains: Vec::new(),
            tap_polled: true,
            tx_dropped: 0,
        })
    }

    /// Starts or stops watching the TAP fd. Removal rather than an empty
    /// event mask, because epoll always reports EPOLLERR, which a detached
    /// multi-queue TAP fd raises permanently.
    fn set_tap_polling(&mut self, on: bool) {
        if self.tap_polled == on {
            return;
        }
        let fd = self.pair.tap.as_raw_fd();
        let r = if on {
            self.epoll.ctl(
                ControlOperation::Add,
                fd,
                EpollEvent::new(EventSet::IN, TOKEN_TAP),
            )
        } else {
            self.epoll
                .ctl(ControlOperation::Delete, fd, EpollEvent::default())
        };
        match r {
            Ok(()) => self.tap_polled = on,
            Err(e) => warn!("virtio-net: epoll on TAP: {e}"),
        }
    }

    fn run(mut self) {
        let mut events = vec![EpollEvent::default(); 8];
        // Buffers or frames may already be waiting.
        if self.pair.mem.bus_master() {
            self.process_tx();
            self.process_rx();
        }
        loop {
            let n = match self.epoll.wait(-1, &mut events) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    warn!("virtio-net worker: epoll: {e}");
                    self.pair.interrupt.set_needs_reset();
                    return;
                }
            };
            for ev in events.iter().take(n) {
                let token = ev.data();
                match token {
                    TOKEN_STOP => {
                        debug!(
                            "virtio-net worker stops ({} transmit frames dropped)",
                            self.tx_dropped
                        );
                        return;
                    }
                    TOKEN_TX => {
                        let _ = self.pair.tx.kick.read();
                    }
                    TOKEN_RX => {
                        let _ = self.pair.rx.kick.read();
                    }
                    TOKEN_CTRL => {
                        if let Some(c) = &self.pair.ctrl {
                            let _ = c.kick.read();
                        }
                    }
                    _ => {}
                }
                if !self.pair.mem.bus_master() {
                    // No DMA without bus mastering: the rings stay as they
                    // are and frames wait in the TAP until the transport
                    // kicks every queue when the bit is set again.
                    self.set_tap_polling(false);
                    continue;
                }
                match token {
                    TOKEN_TX => self.process_tx(),
                    TOKEN_RX => {
                        self.set_tap_polling(true);
                        self.process_rx();
                    }
                    TOKEN_TAP => self.process_rx(),
                    TOKEN_CTRL => self.process_ctrl(),
                    _ => {}
                }
            }
        }
    }

    /// Gathers the chain's readable buffers into iovecs and writes the
    /// frame to the TAP. Returns false if the chain's memory is refused.
    fn send_chain(&mut self) -> bool {
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(self.chain.readable.len());
        let mut total = 0usize;
        for b in &self.chain.readable {
            let slices = match self.pair.mem.get_slices(
                GuestAddress(b.addr),
                b.len as usize,
                Permissions::Read,
            ) {
                Ok(s) => s,
                Err(_) => return false,
            };
            for s in slices {
                let Ok(s) = s else {
                    return false;
                };
                if s.is_empty() {
                    continue;
                }
                total += s.len();
                iov.push(libc::iovec {
                    iov_base: s.ptr_guard().as_ptr() as *mut libc::c_void,
                    iov_len: s.len(),
                });
            }
        }
        if total < VNET_HDR_LEN || iov.len() > MAX_CHAIN_DESCRIPTORS {
            self.tx_dropped += 1;
            return true;
        }
        if let Err(e) = self.pair.tap.write_iov(&iov) {
            self.tx_dropped += 1;
            debug!("virtio-net: TAP write: {e}");
        }
        true
    }

    fn process_tx(&mut self) {
        if self.pair.tx.broken {
            return;
        }
        let mut used_any = false;
        let reader = self.reader.clone();
        loop {
            if let Err(e) = self.pair.tx.queue.disable_notification(&self.pair.mem) {
                break_queue(
                    &mut self.pair.tx,
                    &*self.pair.interrupt,
                    &format!("ring: {e}"),
                );
                return;
            }
            loop {
                // One chain per section: translate, send, mark used.
                let _section = reader.as_deref().map(ReaderSlot::enter);
                let head = match pop_head(&mut self.pair.tx.queue, &self.pair.mem) {
                    Ok(Some(h)) => h,
                    Ok(None) => break,
                    Err(e) => {
                        let why = format!("avail ring: {e}");
                        break_queue(&mut self.pair.tx, &*self.pair.interrupt, &why);
                        return;
                    }
                };
                let q = &self.pair.tx.queue;
                if let Err(e) = walk_into(
                    &self.pair.mem,
                    q.desc_table(),
                    q.size(),
                    head,
                    &mut self.chain,
                ) {
                    let why = format!("transmit chain {head}: {e}");
                    break_queue(&mut self.pair.tx, &*self.pair.interrupt, &why);
                    return;
                }
                if !self.send_chain() {
                    let why = format!("transmit chain {head}: buffer not accessible");
                    break_queue(&mut self.pair.tx, &*self.pair.interrupt, &why);
                    return;
                }
                if let Err(e) = self.pair.tx.queue.add_used(&self.pair.mem, head, 0) {
                    break_queue(
                        &mut self.pair.tx,
                        &*self.pair.interrupt,
                        &format!("used ring: {e}"),
                    );
                    return;
                }
                used_any = true;
            }
            match self.pair.tx.queue.enable_notification(&self.pair.mem) {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => {
                    break_queue(
                        &mut self.pair.tx,
                        &*self.pair.interrupt,
                        &format!("ring: {e}"),
                    );
                    return;
                }
            }
        }
        if used_any {
            signal_used(&mut self.pair.tx, &self.pair.mem, &*self.pair.interrupt);
        }
    }

    fn process_rx(&mut self) {
        if self.pair.rx.broken {
            self.set_tap_polling(false);
            return;
        }
        let mut used_any = false;
        let reader = self.reader.clone();
        if let Err(e) = self.pair.rx.queue.disable_notification(&self.pair.mem) {
            break_queue(
                &mut self.pair.rx,
                &*self.pair.interrupt,
                &format!("ring: {e}"),
            );
            self.set_tap_polling(false);
            return;
        }
        loop {
            let len = match self.frame_len {
                Some(l) => l,
                None => match self.pair.tap.read_frame(&mut self.frame) {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        // EBADFD: this queue is detached (pair not in use);
                        // pair 0's worker kicks us when it is attached.
                        debug!("virtio-net: TAP read: {e}");
                        self.set_tap_polling(false);
                        break;
                    }
                },
            };
            self.frame_len = Some(len);
            // One frame per section: translate, copy, mark used.
            let section = reader.as_deref().map(ReaderSlot::enter);
            let delivery = deliver(
                &self.pair.mem,
                &mut self.pair.rx.queue,
                &mut self.frame,
                len,
                &mut self.chains,
                self.pair.mrg_rxbuf,
            );
            drop(section);
            match delivery {
                Delivery::Done => {
                    self.frame_len = None;
                    used_any = true;
                }
                Delivery::Dropped(used) => {
                    self.frame_len = None;
                    used_any |= used;
                }
                Delivery::NoBuffers(looked_at) => {
                    // Hand over what was delivered so the driver can refill,
                    // then ask for a kick on its next buffer.
                    if used_any {
                        signal_used(&mut self.pair.rx, &self.pair.mem, &*self.pair.interrupt);
                        used_any = false;
                    }
                    match arm_rx_kick(&mut self.pair.rx.queue, &self.pair.mem, looked_at) {
                        Ok(true) => continue,
                        Ok(false) => {
                            self.set_tap_polling(false);
                            break;
                        }
                        Err(e) => {
                            break_queue(
                                &mut self.pair.rx,
                                &*self.pair.interrupt,
                                &format!("ring: {e}"),
                            );
                            self.set_tap_polling(false);
                            break;
                        }
                    }
                }
                Delivery::Broken(why) => {
                    self.frame_len = None;
                    break_queue(&mut self.pair.rx, &*self.pair.interrupt, &why.to_string());
                    self.set_tap_polling(false);
                    break;
                }
            }
        }
        if used_any {
            signal_used(&mut self.pair.rx, &self.pair.mem, &*self.pair.interrupt);
        }
    }

    fn process_ctrl(&mut self) {
        let Some(mut c) = self.pair.ctrl.take() else {
            return;
        };
        let (taps, kicks) = (&self.pair.all_taps, &self.pair.all_rx_kicks);
        serve_ctrl_queue(
            &mut c,
            &self.pair.mem,
            &*self.pair.interrupt,
            self.reader.as_deref(),
            &mut self.chain,
            &mut |cmd| set_queue_pairs(taps, kicks, cmd),
        );
        self.pair.ctrl = Some(c);
    }
}

/// Carries out a control command for the TAP device: the first `pairs`
/// TAP queues are attached, the rest detached, and the newly attached
/// pairs' workers woken to pick up frames already queued.
fn set_queue_pairs(taps: &[Arc<Tap>], rx_kicks: &[EventFd], cmd: CtrlCommand) -> bool {
    let CtrlCommand::SetQueuePairs(pairs) = cmd;
    let pairs = usize::from(pairs);
    if !(1..=taps.len()).contains(&pairs) {
        return false;
    }
    for (i, tap) in taps.iter().enumerate() {
        if let Err(e) = tap.set_queue_enabled(i < pairs) {
            warn!("virtio-net: VQ_PAIRS_SET {pairs}: {e}");
            return false;
        }
    }
    for k in rx_kicks.iter().take(pairs).skip(1) {
        let _ = k.write(1);
    }
    debug!("virtio-net: driver uses {pairs} queue pair(s)");
    true
}

/// Runs a worker on the current thread until its stop eventfd is written.
pub fn run_worker(parts: WorkerParts) {
    let interrupt = parts.interrupt.clone();
    match QueuePairWorker::new(parts) {
        Ok(w) => w.run(),
        Err(e) => {
            warn!("virtio-net worker could not start: {e}");
            interrupt.set_needs_reset();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::GuestMemoryMmap;
    use crate::virtio::chain::{VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE};
    use crate::virtio::test_ring::{leaked_ram, DriverRing, RingAddrs};

    const DESC: u64 = 0x1000;
    const AVAIL: u64 = 0x2000;
    const USED: u64 = 0x3000;
    const SIZE: u16 = 8;

    struct Ring {
        mem: &'static GuestMemoryMmap,
        dma: DmaSpace,
        queue: Queue,
        driver: DriverRing<'static>,
    }

    impl Ring {
        fn new() -> Self {
            let mem = leaked_ram(0x20000);
            let dma = DmaSpace::identity(mem.clone());
            let addrs = RingAddrs {
                desc: DESC,
                avail: AVAIL,
                used: USED,
            };
            let driver = DriverRing::new(mem, addrs, SIZE);
            Self {
                mem,
                dma,
                queue: driver.queue(),
                driver,
            }
        }

        fn desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
            self.driver.desc(i, addr, len, flags, next);
        }

        fn offer(&mut self, head: u16) {
            self.driver.offer(head);
        }

        fn used_idx(&self) -> u16 {
            self.driver.used_idx()
        }

        fn used(&self, i: u64) -> (u32, u32) {
            self.driver.used(i)
        }

        fn deliver(&mut self, frame: &mut [u8], mrg: bool) -> Delivery {
            let len = frame.len();
            let mut chains = Vec::new();
            deliver(&self.dma, &mut self.queue, frame, len, &mut chains, mrg)
        }
    }

    fn frame(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + 3) as u8).collect()
    }

    #[test]
    fn mergeable_frame_spans_chains() {
        let mut r = Ring::new();
        r.desc(0, 0x8000, 2048, VIRTQ_DESC_F_WRITE, 0);
        r.desc(1, 0x9000, 2048, VIRTQ_DESC_F_WRITE, 0);
        r.offer(0);
        r.offer(1);
        let mut f = frame(3000);
        assert!(matches!(r.deliver(&mut f, true), Delivery::Done));
        assert_eq!(r.used_idx(), 2);
        assert_eq!(r.used(0), (0, 2048));
        assert_eq!(r.used(1), (1, 952));
        let nb: u16 = r.mem.read_obj(GuestAddress(0x8000 + 10)).unwrap();
        assert_eq!(nb, 2);
        let mut back = vec![0u8; 952];
        r.mem.read_slice(&mut back, GuestAddress(0x9000)).unwrap();
        assert_eq!(&back[..], &f[2048..]);
    }

    /// A guest that unmaps a receive buffer it posted (a hostile driver, or
    /// one tearing down) while a frame arrives: the device writes nothing
    /// into the page behind it, reports a fault to the vIOMMU, and breaks
    /// the queue instead of completing the buffer.
    #[test]
    fn rx_into_a_buffer_the_guest_unmapped_writes_nothing_and_faults() {
        use crate::dma::test_iommu::{TestIommu, RW};

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
        r.desc(0, 0x8000, 2048, VIRTQ_DESC_F_WRITE, 0);
        r.desc(1, 0x9000, 2048, VIRTQ_DESC_F_WRITE, 0);
        r.offer(0);
        r.offer(1);
        let mut f = frame(3000);
        assert!(matches!(r.deliver(&mut f, true), Delivery::Broken(_)));
        let mut page = vec![0u8; 4096];
        r.mem.read_slice(&mut page, GuestAddress(0x9000)).unwrap();
        assert!(page.iter().all(|b| *b == 0xc5), "unmapped page written");
        assert_eq!(r.dma.fault_count(), 1);
        assert!(iommu.dev.pop_fault_event().is_some());
        assert_eq!(r.used_idx(), 1, "only the mapped buffer was completed");
    }

    #[test]
    fn missing_buffers_are_given_back() {
        let mut r = Ring::new();
        r.desc(0, 0x8000, 1024, VIRTQ_DESC_F_WRITE, 0);
        r.offer(0);
        let mut f = frame(3000);
        assert!(matches!(r.deliver(&mut f, true), Delivery::NoBuffers(_)));
        assert_eq!(r.queue.next_avail(), 0);
        assert_eq!(r.used_idx(), 0);
        // Once enough buffers exist, the same frame goes through.
        r.desc(1, 0x9000, 4096, VIRTQ_DESC_F_WRITE, 0);
        r.offer(1);
        assert!(matches!(r.deliver(&mut f, true), Delivery::Done));
        assert_eq!(r.used_idx(), 2);
    }

    /// A ring with one 1 KiB buffer and a 3000-byte frame that does not
    /// fit: `deliver` gives up, and says which avail index it looked at.
    fn short_of_buffers(event_idx: bool) -> (Ring, Vec<u8>, Wrapping<u16>) {
        let mut r = Ring::new();
        r.queue.set_event_idx(event_idx);
        r.desc(0, 0x8000, 1024, VIRTQ_DESC_F_WRITE, 0);
        r.offer(0);
        let mut f = frame(3000);
        let Delivery::NoBuffers(looked_at) = r.deliver(&mut f, true) else {
            panic!("expected NoBuffers");
        };
        (r, f, looked_at)
    }

    #[test]
    fn out_of_buffers_arms_a_kick_past_the_published_buffers() {
        let (mut r, _, looked_at) = short_of_buffers(true);
        assert_eq!(looked_at, Wrapping(1));
        // avail_event must be the driver's index (1), not next_avail (0):
        // the driver kicks only when its next buffer crosses it.
        assert!(!arm_rx_kick(&mut r.queue, &r.dma, looked_at).unwrap());
        let event: u16 = r
            .mem
            .read_obj(GuestAddress(USED + 4 + 8 * u64::from(SIZE)))
            .unwrap();
        assert_eq!(event, 1);
        // Without EVENT_IDX the flags route is used and nothing is written.
        let mut r = Ring::new();
        r.offer(0);
        assert!(!arm_rx_kick(&mut r.queue, &r.dma, Wrapping(1)).unwrap());
    }

    #[test]
    fn buffers_published_after_the_last_look_are_not_missed() {
        // The driver adds a buffer after `deliver` gave up at index 1 but
        // before the kick is armed; it did not kick for it (its avail_event
        // was older). Arming must report it, or receive stalls for good.
        for event_idx in [true, false] {
            let (mut r, mut f, looked_at) = short_of_buffers(event_idx);
            r.desc(1, 0x9000, 4096, VIRTQ_DESC_F_WRITE, 0);
            r.offer(1);
            assert!(
                arm_rx_kick(&mut r.queue, &r.dma, looked_at).unwrap(),
                "event_idx={event_idx}: the new buffer must be looked at"
            );
            assert!(matches!(r.deliver(&mut f, true), Delivery::Done));
        }
    }

    #[test]
    fn without_mergeable_buffers_a_short_chain_drops_the_frame() {
        let mut r = Ring::new();
        r.desc(0, 0x8000, 1024, VIRTQ_DESC_F_WRITE, 0);
        r.offer(0);
        let mut f = frame(3000);
        assert!(matches!(r.deliver(&mut f, false), Delivery::Dropped(true)));
        assert_eq!(r.used(0), (0, 0));
        // Runt frames (shorter than the header) are dropped untouched.
        let mut runt = frame(5);
        assert!(matches!(
            r.deliver(&mut runt, true),
            Delivery::Dropped(false)
        ));
    }

    #[test]
    fn malformed_rings_break_the_queue_without_panic() {
        // Head index outside the table.
        let mut r = Ring::new();
        r.offer(SIZE + 1);
        assert!(matches!(
            r.deliver(&mut frame(100), true),
            Delivery::Broken(_)
        ));
        // A descriptor loop.
        let mut r = Ring::new();
        r.desc(0, 0x8000, 10, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, 1);
        r.desc(1, 0x8100, 10, VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT, 0);
        r.offer(0);
        assert!(matches!(
            r.deliver(&mut frame(100), true),
            Delivery::Broken(_)
        ));
        // A receive chain with nothing writable.
        let mut r = Ring::new();
        r.desc(0, 0x8000, 100, 0, 0);
        r.offer(0);
        assert!(matches!(
            r.deliver(&mut frame(50), true),
            Delivery::Broken(_)
        ));
        // A buffer outside guest RAM.
        let mut r = Ring::new();
        r.desc(0, 0xffff_0000, 4096, VIRTQ_DESC_F_WRITE, 0);
        r.offer(0);
        assert!(matches!(
            r.deliver(&mut frame(100), true),
            Delivery::Broken(_)
        ));
        assert_eq!(r.used_idx(), 0);
        // A buffer that wraps the address space.
        let mut r = Ring::new();
        r.desc(0, u64::MAX - 10, 4096, VIRTQ_DESC_F_WRITE, 0);
        r.offer(0);
        assert!(matches!(
            r.deliver(&mut frame(100), true),
            Delivery::Broken(_)
        ));
        // The avail index jumps by more than the queue size.
        let mut r = Ring::new();
        r.driver.set_avail_idx(100);
        assert!(matches!(
            r.deliver(&mut frame(100), true),
            Delivery::Broken(_)
        ));
    }
}
