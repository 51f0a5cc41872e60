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
use std::os::fd::AsRawFd;
use std::sync::Arc;

use log::{debug, warn};
use virtio_queue::QueueT;
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use super::ctrl::{serve_ctrl_queue, CtrlCommand};
use super::queue::{break_queue, signal_used, WorkerQueue};
use super::rx::{arm_rx_kick, RxBuffers, RxStep};
use super::tap::Tap;
use super::tx::{process_tx, TxState};
use crate::dma::{DmaSpace, ThreadDma};
use crate::virtio::chain::Chain;
use crate::virtio::wake::epoll_on;
use crate::virtio::VirtioInterrupt;

const TOKEN_STOP: u64 = 0;
const TOKEN_RX: u64 = 1;
const TOKEN_TX: u64 = 2;
const TOKEN_TAP: u64 = 3;
const TOKEN_CTRL: u64 = 4;

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
    /// Largest frame the TAP can hand over with the negotiated offloads.
    pub max_frame: usize,
    /// Every pair's TAP queue (pair 0's worker attaches and detaches them
    /// on VQ_PAIRS_SET).
    pub all_taps: Vec<Arc<Tap>>,
    /// Every pair's receive kick (pair 0's worker wakes a pair whose TAP
    /// queue it attached).
    pub all_rx_kicks: Vec<EventFd>,
    /// Written to stop the worker.
    pub stop: EventFd,
}

/// The state of the thread serving one queue pair (its loop is
/// [`QueuePairWorker::run`]).
struct QueuePairWorker {
    /// The queue pair, its TAP queue and what they share with the device.
    pair: WorkerParts,
    epoll: Epoll,
    /// Receive buffers held between frames, and the frame waiting for
    /// them.
    rx_buffers: RxBuffers,
    /// The control queue's walked chain (kept for its capacity).
    chain: Chain,
    /// The transmit side's chain, iovecs and counters.
    tx: TxState,
    tap_polled: bool,
    /// This thread's way to guest memory: every frame or chain is
    /// translated and used inside one of its sections.
    dma: ThreadDma,
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
        // Past the quiescer's reader limit the worker must not run: no
        // UNMAP would wait for it.
        let dma = ThreadDma::new(pair.mem.clone()).map_err(io::Error::other)?;
        let rx_buffers = RxBuffers::new(pair.mrg_rxbuf, pair.max_frame);
        Ok(Self {
            dma,
            pair,
            epoll,
            rx_buffers,
            chain: Chain::default(),
            tx: TxState::default(),
            tap_polled: true,
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
        if self.dma.bus_master() {
            self.process_tx();
            self.process_rx();
        }
        loop {
            // Parked while asleep: no UNMAP waits for an idle worker.
            let epoll = &self.epoll;
            let n = match self.dma.parked(|| epoll.wait(-1, &mut events)) {
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
                        let rx = self.rx_buffers.counts();
                        debug!(
                            "virtio-net worker stops: {} transmit frames dropped; received \
                             {} in place, {} copied, {} dropped ({} over the held bound), \
                             {} waits for buffers",
                            self.tx.dropped(),
                            rx.in_place,
                            rx.copied,
                            rx.dropped,
                            rx.over_bound,
                            rx.waits
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
                if !self.dma.bus_master() {
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

    fn process_tx(&mut self) {
        process_tx(
            &mut self.pair.tx,
            &mut self.dma,
            &*self.pair.interrupt,
            &mut self.tx,
            &*self.pair.tap,
        );
    }

    fn process_rx(&mut self) {
        if self.pair.rx.broken {
            self.set_tap_polling(false);
            return;
        }
        let mut used_any = false;
        let disabled = self.pair.rx.queue.disable_notification(&*self.dma.access());
        if let Err(e) = disabled {
            break_queue(
                &mut self.pair.rx,
                &*self.pair.interrupt,
                &format!("ring: {e}"),
            );
            self.set_tap_polling(false);
            return;
        }
        loop {
            // One frame per section: translate, read, mark used.
            let mem = self.dma.access();
            let step = self
                .rx_buffers
                .receive_one(&mut self.pair.rx.queue, &mem, &*self.pair.tap);
            drop(mem);
            match step {
                RxStep::Delivered => used_any = true,
                RxStep::Dropped(used) => used_any |= used,
                RxStep::TapEmpty => break,
                RxStep::TapError(e) => {
                    // EBADFD: this queue is detached (pair not in use);
                    // pair 0's worker kicks us when it is attached.
                    debug!("virtio-net: TAP read: {e}");
                    self.set_tap_polling(false);
                    break;
                }
                RxStep::NoBuffers(looked_at) => {
                    // Hand over what was delivered so the driver can refill,
                    // then ask for a kick on its next buffer.
                    if used_any {
                        signal_used(&mut self.pair.rx, &self.dma.access(), &*self.pair.interrupt);
                        used_any = false;
                    }
                    let armed = arm_rx_kick(&mut self.pair.rx.queue, &self.dma.access(), looked_at);
                    match armed {
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
                RxStep::Broken(why) => {
                    break_queue(&mut self.pair.rx, &*self.pair.interrupt, &why.to_string());
                    self.set_tap_polling(false);
                    break;
                }
            }
        }
        if used_any {
            signal_used(&mut self.pair.rx, &self.dma.access(), &*self.pair.interrupt);
        }
    }

    fn process_ctrl(&mut self) {
        let Some(mut c) = self.pair.ctrl.take() else {
            return;
        };
        let (taps, kicks) = (&self.pair.all_taps, &self.pair.all_rx_kicks);
        serve_ctrl_queue(
            &mut c,
            &mut self.dma,
            &*self.pair.interrupt,
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
