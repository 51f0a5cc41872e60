//! The virtio-net device logic behind the vhost-user protocol, which the
//! `vhost-user-backend` framework handles: one queue pair, no offloads.
//!
//! Everything runs on the framework's single vring worker thread: guest
//! kicks on either queue and readiness of the TAP fd all arrive as
//! `handle_event` calls, so no queue is ever touched from two threads.
//!
//! Flow control on receive: the TAP fd sits in the worker's epoll set only
//! while the receive queue has buffers. When the guest runs out, the fd is
//! removed (no busy loop on a readable TAP, no frames read just to be
//! dropped) and the next receive-queue kick puts it back. This cannot miss a
//! wake-up because notifications are never suppressed (no `EVENT_IDX`, no
//! `disable_notification`), so every buffer the guest adds comes with a kick.
//!
//! Everything in guest memory is treated as hostile: descriptor chains are
//! read and written only through `virtio_queue::{Reader, Writer}`, which
//! check every descriptor against the guest memory map, and a chain that is
//! malformed, too short or too long is logged and returned to the guest with
//! a used length of 0 instead of stopping the device.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use log::{debug, error, info, warn};
use thiserror::Error;
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackendMut, VringEpollHandler, VringRwLock, VringT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_queue::{DescriptorChain, QueueT, Reader, Writer};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryLoadGuard, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use crate::tap::Tap;
use crate::vnet_hdr::{self, TxLenError};

/// Receive queue index (virtio-net: even queues receive).
pub const RX_QUEUE: u16 = 0;
/// Transmit queue index.
pub const TX_QUEUE: u16 = 1;
/// One queue pair (a u16 like the queue indices; [`NUM_QUEUES`] widens it).
const QUEUES: u16 = 2;
/// One queue pair.
pub const NUM_QUEUES: usize = QUEUES as usize;
/// Largest queue size a front-end may set.
pub const MAX_QUEUE_SIZE: usize = 256;
/// epoll token of the TAP fd. The framework reserves `0..NUM_QUEUES` for
/// queue kicks and `NUM_QUEUES` for its own exit / vring-enabled event, and
/// `register_listener` refuses any token up to and including `NUM_QUEUES`.
pub const TAP_EVENT: u16 = QUEUES + 1;

/// Frames moved from the TAP per TAP event before returning to epoll, so a
/// flood on receive cannot starve transmit; the TAP fd is level-triggered,
/// so frames left behind raise the event again at once.
const RX_BATCH: usize = 64;

/// The guest memory the framework maps from the front-end's memory table.
/// Descriptor addresses are guest-physical (no IOMMU / IOTLB).
pub type GuestMem = GuestMemoryAtomic<GuestMemoryMmap>;
type MemGuard = GuestMemoryLoadGuard<GuestMemoryMmap>;
type Chain = DescriptorChain<MemGuard>;

/// The type the framework is instantiated with: the backend is shared
/// between the vhost-user request thread and the vring worker thread.
pub type SharedBackend = Arc<Mutex<NetBackend>>;
/// The framework's per-thread epoll loop, through which the TAP fd is added.
pub type EpollHandler = VringEpollHandler<SharedBackend>;

/// Why one descriptor chain was skipped. These never stop the device.
#[derive(Debug, Error)]
enum ChainError {
    #[error("bad descriptor chain: {0}")]
    Descriptors(#[source] virtio_queue::Error),
    #[error(transparent)]
    TxLen(#[from] TxLenError),
    #[error("receive buffer of {have} bytes is too small for {need} bytes")]
    RxTooSmall { have: usize, need: usize },
    #[error("copying to or from guest memory: {0}")]
    Copy(#[source] io::Error),
}

/// A vhost-user-net device on one TAP interface.
pub struct NetBackend {
    tap: Tap,
    mem: GuestMem,
    acked_features: u64,
    /// Set once, right after the daemon is created (the handler does not
    /// exist before); `None` only in that window.
    epoll: Option<Arc<EpollHandler>>,
    /// Whether the TAP fd is currently in the epoll set.
    tap_listening: bool,
    /// Holds one frame from the TAP on its way to the guest.
    rx_frame: Vec<u8>,
    /// Holds one frame from the guest on its way to the TAP.
    tx_frame: Vec<u8>,
    /// Frames forwarded from the guest so far.
    tx_frames: u64,
    /// Fault injection: the process exits after this many frames.
    pub die_after_tx_frames: Option<u64>,
}

impl NetBackend {
    pub fn new(tap: Tap, mem: GuestMem) -> Self {
        NetBackend {
            tap,
            mem,
            acked_features: 0,
            epoll: None,
            tap_listening: false,
            rx_frame: vec![0; vnet_hdr::MAX_FRAME_LEN],
            tx_frame: Vec::with_capacity(vnet_hdr::MAX_FRAME_LEN),
            tx_frames: 0,
            die_after_tx_frames: None,
        }
    }

    /// Hands over the worker's epoll handler, which the backend needs to add
    /// and remove the TAP fd. Must be called before the front-end connects.
    pub fn set_epoll_handler(&mut self, handler: Arc<EpollHandler>) {
        self.epoll = Some(handler);
    }

    fn hdr_len(&self) -> usize {
        vnet_hdr::hdr_len(self.acked_features)
    }

    /// Adds the TAP fd to the epoll set (idempotent).
    fn start_tap(&mut self) {
        if self.tap_listening {
            return;
        }
        let Some(epoll) = &self.epoll else {
            error!("no epoll handler: cannot listen on the TAP");
            return;
        };
        let fd = self.tap.as_raw_fd();
        match epoll.register_listener(fd, EventSet::IN, u64::from(TAP_EVENT)) {
            Ok(()) => self.tap_listening = true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => self.tap_listening = true,
            Err(e) => error!("cannot add the TAP fd to epoll: {e}"),
        }
        if self.tap_listening {
            debug!("rx: listening on the TAP");
        }
    }

    /// Removes the TAP fd from the epoll set (idempotent).
    fn stop_tap(&mut self) {
        if !self.tap_listening {
            return;
        }
        self.tap_listening = false;
        if let Some(epoll) = &self.epoll {
            let fd = self.tap.as_raw_fd();
            if let Err(e) = epoll.unregister_listener(fd, EventSet::IN, u64::from(TAP_EVENT)) {
                warn!("cannot remove the TAP fd from epoll: {e}");
            }
        }
        debug!("rx: stopped listening on the TAP");
    }

    /// A kick on the receive queue means the guest added buffers: resume
    /// reading the TAP.
    fn on_rx_kick(&mut self, rx: &VringRwLock) {
        if vring_usable(rx) {
            self.start_tap();
        }
    }

    /// Moves frames from the TAP into receive buffers until the TAP is
    /// empty, the guest has no more buffers, or the batch is done.
    fn process_rx(&mut self, rx: &VringRwLock) {
        if !vring_usable(rx) {
            self.stop_tap();
            return;
        }
        let mem = self.mem.memory();
        let hdr_len = self.hdr_len();
        let mut state = rx.get_mut();
        let mut returned = 0usize;
        for _ in 0..RX_BATCH {
            if !has_available(state.get_queue(), &mem) {
                self.stop_tap();
                break;
            }
            let len = match self.tap.read_frame(&mut self.rx_frame) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    error!("rx: reading the TAP failed, pausing until the next kick: {e}");
                    self.stop_tap();
                    break;
                }
            };
            let Some(chain) = state.get_queue_mut().pop_descriptor_chain(mem.clone()) else {
                // The available index said there was a buffer but no chain
                // could be fetched (e.g. a bogus index): the queue is broken
                // until the guest kicks again.
                warn!("rx: no usable chain in the available ring, dropping a {len}-byte frame");
                self.stop_tap();
                break;
            };
            let head = chain.head_index();
            let used_len = match write_rx_chain(&mem, chain, hdr_len, &self.rx_frame[..len]) {
                Ok(n) => n,
                Err(e) => {
                    warn!("rx: chain {head}: {e}; dropping a {len}-byte frame");
                    0
                }
            };
            if let Err(e) = state.add_used(head, used_len) {
                error!("rx: cannot add chain {head} to the used ring: {e}");
                break;
            }
            returned += 1;
        }
        if returned > 0 {
            signal_guest(&mut state, "rx");
        }
    }

    /// Sends every frame the guest has queued for transmission.
    fn process_tx(&mut self, tx: &VringRwLock) {
        if !vring_usable(tx) {
            return;
        }
        let mem = self.mem.memory();
        let hdr_len = self.hdr_len();
        let mut state = tx.get_mut();
        let mut returned = 0usize;
        while let Some(chain) = state.get_queue_mut().pop_descriptor_chain(mem.clone()) {
            let head = chain.head_index();
            match read_tx_chain(&mem, chain, hdr_len, &mut self.tx_frame) {
                Ok(()) => match self.tap.write_frame(&self.tx_frame) {
                    Ok(_) => {
                        self.tx_frames += 1;
                        if Some(self.tx_frames) == self.die_after_tx_frames {
                            // Mid-transfer, rings in use, nothing said.
                            error!("dying after {} frames (fault injection)", self.tx_frames);
                            std::process::exit(3);
                        }
                    }
                    // A full TAP queue drops the frame, as a real link would.
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        debug!("tx: TAP queue full, dropping a frame")
                    }
                    Err(e) => warn!("tx: writing a {}-byte frame: {e}", self.tx_frame.len()),
                },
                Err(e) => warn!("tx: skipping chain {head}: {e}"),
            }
            // Transmit buffers are only read by the device: used length 0.
            if let Err(e) = state.add_used(head, 0) {
                error!("tx: cannot add chain {head} to the used ring: {e}");
                break;
            }
            returned += 1;
        }
        if returned > 0 {
            signal_guest(&mut state, "tx");
        }
    }
}

/// Whether the front-end has set the queue up and enabled it; events can
/// still arrive for a queue being stopped.
fn vring_usable(vring: &VringRwLock) -> bool {
    let state = vring.get_ref();
    state.is_enabled() && state.get_queue().ready()
}

/// Whether the guest has published chains not consumed yet. A failure to
/// read the ring counts as "no": the next kick tries again.
fn has_available(queue: &virtio_queue::Queue, mem: &MemGuard) -> bool {
    match queue.avail_idx(&**mem, Ordering::Acquire) {
        Ok(idx) => idx.0 != queue.next_avail(),
        Err(e) => {
            warn!("cannot read the available index: {e}");
            false
        }
    }
}

/// Interrupts the guest unless it asked not to be.
fn signal_guest(state: &mut vhost_user_backend::VringState<GuestMem>, queue: &str) {
    let needed = state.needs_notification().unwrap_or_else(|e| {
        warn!("{queue}: cannot check whether the guest wants an interrupt ({e}), sending one");
        true
    });
    if needed {
        if let Err(e) = state.signal_used_queue() {
            warn!("{queue}: cannot signal the used queue: {e}");
        }
    }
}

/// Copies the frame of a transmit chain, without its header, into `frame`.
fn read_tx_chain(
    mem: &MemGuard,
    chain: Chain,
    hdr_len: usize,
    frame: &mut Vec<u8>,
) -> Result<(), ChainError> {
    let mut reader = Reader::new(&**mem, chain).map_err(ChainError::Descriptors)?;
    let frame_len = vnet_hdr::tx_frame_len(reader.available_bytes(), hdr_len)?;
    let mut hdr = [0u8; vnet_hdr::HDR_LEN_V1];
    let hdr = hdr.get_mut(..hdr_len).unwrap_or_default();
    reader.read_exact(hdr).map_err(ChainError::Copy)?;
    frame.resize(frame_len, 0);
    reader.read_exact(frame).map_err(ChainError::Copy)
}

/// Writes the receive header and `frame` into a receive chain; returns the
/// used length to report. A frame that does not fit is not truncated: the
/// caller drops it.
fn write_rx_chain(
    mem: &MemGuard,
    chain: Chain,
    hdr_len: usize,
    frame: &[u8],
) -> Result<u32, ChainError> {
    let mut writer = Writer::new(&**mem, chain).map_err(ChainError::Descriptors)?;
    let need = hdr_len + frame.len();
    let have = writer.available_bytes();
    if have < need {
        return Err(ChainError::RxTooSmall { have, need });
    }
    let hdr = vnet_hdr::rx_header();
    let hdr = hdr.get(..hdr_len).unwrap_or_default();
    writer.write_all(hdr).map_err(ChainError::Copy)?;
    writer.write_all(frame).map_err(ChainError::Copy)?;
    u32::try_from(need).map_err(|_| ChainError::RxTooSmall { have, need })
}

impl VhostUserBackendMut for NetBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    /// VERSION_1 and the vhost-user protocol-features bit only: no
    /// checksum/TSO offloads, so frames are plain; no MRG_RXBUF, so each
    /// frame takes one chain; no EVENT_IDX, so every guest update kicks
    /// (see the module comment on receive flow control).
    fn features(&self) -> u64 {
        (1u64 << VIRTIO_F_VERSION_1) | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn acked_features(&mut self, features: u64) {
        info!("front-end acknowledged features {features:#x}");
        if features & (1u64 << VIRTIO_F_VERSION_1) == 0 {
            warn!("VIRTIO_F_VERSION_1 not negotiated: using the legacy 10-byte header");
        }
        self.acked_features = features;
    }

    /// MQ so the front-end may ask how many queues there are, REPLY_ACK so
    /// it learns when a request failed, CONFIGURE_MEM_SLOTS so it may add
    /// memory regions one by one (all handled by the framework).
    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
    }

    fn reset_device(&mut self) {
        info!("device reset");
        self.stop_tap();
        self.acked_features = 0;
    }

    fn set_event_idx(&mut self, enabled: bool) {
        // Never offered, so the framework cannot turn it on; log if a
        // front-end somehow did.
        if enabled {
            warn!("EVENT_IDX enabled although it was not offered");
        }
    }

    fn update_memory(&mut self, mem: GuestMem) -> io::Result<()> {
        debug!("guest memory map updated");
        self.mem = mem;
        Ok(())
    }

    /// Both queues and the TAP on one worker thread.
    fn queues_per_thread(&self) -> Vec<u64> {
        vec![(1u64 << NUM_QUEUES) - 1]
    }

    /// Lets the daemon end the worker's epoll loop when the front-end has
    /// gone, instead of leaving it blocked until the process exits.
    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK | EventFlag::CLOEXEC)
            .map_err(|e| error!("cannot create the worker's exit event: {e}"))
            .ok()
    }

    /// The front-end stops a queue (GET_VRING_BASE) before tearing it down;
    /// stop reading the TAP with it, so nothing touches the old rings.
    fn stop_vring(&mut self, queue_index: u32) -> io::Result<()> {
        if queue_index == u32::from(RX_QUEUE) {
            self.stop_tap();
        }
        Ok(())
    }

    /// Errors are logged, never returned: the framework ends the worker's
    /// loop on an error, which would silently kill the device.
    fn handle_event(
        &mut self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> io::Result<()> {
        let (Some(rx), Some(tx)) = (
            vrings.get(usize::from(RX_QUEUE)),
            vrings.get(usize::from(TX_QUEUE)),
        ) else {
            error!("worker has {} vrings, expected {NUM_QUEUES}", vrings.len());
            return Ok(());
        };
        match device_event {
            RX_QUEUE => self.on_rx_kick(rx),
            TX_QUEUE => self.process_tx(tx),
            TAP_EVENT => self.process_rx(rx),
            other => warn!("unexpected event {other}"),
        }
        Ok(())
    }
}
