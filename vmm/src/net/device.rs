//! The virtio-net device (virtio 1.2, 5.1) on a TAP back-end.

use std::sync::Arc;
use std::thread::JoinHandle;

use log::{info, warn};
use thiserror::Error;
use vmm_sys_util::eventfd::EventFd;

use super::config::NetConfig;
use super::queue::WorkerQueue;
use super::rx::{MAX_FRAME, MAX_PLAIN_FRAME};
use super::tap::{Tap, TapError, TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6};
use super::worker::{run_worker, WorkerParts};
use crate::sandbox::{self, ThreadKind};
use crate::virtio::{
    feature, read_config_window, ActivateContext, ActivateError, QueueSetupError, VirtioDevice,
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};

/// Virtio device id of a network card.
pub use virtio_bindings::virtio_ids::VIRTIO_ID_NET;

/// Feature bits (virtio 1.2, 5.1.3).
pub mod features {
    /// Device handles partial checksums from the driver.
    pub const CSUM: u32 = 0;
    /// Driver handles partial checksums from the device.
    pub const GUEST_CSUM: u32 = 1;
    /// The device has a MAC address in its config.
    pub const MAC: u32 = 5;
    /// Driver accepts TSOv4 frames.
    pub const GUEST_TSO4: u32 = 7;
    /// Driver accepts TSOv6 frames.
    pub const GUEST_TSO6: u32 = 8;
    /// Device accepts TSOv4 frames.
    pub const HOST_TSO4: u32 = 11;
    /// Device accepts TSOv6 frames.
    pub const HOST_TSO6: u32 = 12;
    /// Driver can merge receive buffers.
    pub const MRG_RXBUF: u32 = 15;
    /// Config has a link status field.
    pub const STATUS: u32 = 16;
    /// A control virtqueue exists.
    pub const CTRL_VQ: u32 = 17;
    /// Several queue pairs.
    pub const MQ: u32 = 22;
}

const LINK_UP: u16 = 1;

/// Errors while creating the device.
#[derive(Debug, Error)]
pub enum NetError {
    /// The TAP could not be set up.
    #[error(transparent)]
    Tap(#[from] TapError),
}

/// A virtio-net device with one TAP queue per queue pair.
pub struct Net {
    mac: [u8; 6],
    queue_size: u16,
    taps: Vec<Arc<Tap>>,
    workers: Vec<(EventFd, JoinHandle<()>)>,
}

impl Net {
    /// Opens (creating if needed) and configures the TAP described by `cfg`,
    /// or, when a client passed that TAP's queues earlier
    /// ([`super::passed_taps`]), drives duplicates of those.
    pub fn new(cfg: &NetConfig) -> Result<Self, NetError> {
        if let Some(taps) = super::passed_taps::clones(&cfg.tap) {
            return Self::from_taps(cfg, taps?);
        }
        let pairs = cfg.num_queues / 2;
        let multi = pairs > 1;
        let mut taps = Vec::with_capacity(pairs);
        let first = Tap::open(&cfg.tap, multi)?;
        let name = first.name().to_string();
        first.configure_host(cfg.ip, cfg.mask)?;
        taps.push(Arc::new(first));
        for _ in 1..pairs {
            taps.push(Arc::new(Tap::open(&name, true)?));
        }
        info!(
            "virtio-net on TAP {name}: {pairs} queue pair(s) of {} entries",
            cfg.queue_size
        );
        Ok(Self {
            mac: cfg.mac,
            queue_size: cfg.queue_size,
            taps,
            workers: Vec::new(),
        })
    }

    /// A device on TAP queues opened by someone else (one per queue pair,
    /// passed to `vm.add-net` with `SCM_RIGHTS`), described by `cfg` (its
    /// MAC and queue size; `cfg.tap` and the host address are not used:
    /// whoever opened the TAP configured its host side).
    pub fn from_taps(cfg: &NetConfig, taps: Vec<Tap>) -> Result<Self, NetError> {
        if taps.is_empty() || taps.len() * 2 != cfg.num_queues {
            return Err(NetError::Tap(TapError::NotUsable(
                "count must be one per queue pair (num_queues / 2)",
            )));
        }
        if taps.len() > 1 && !taps.iter().all(Tap::is_multi_queue) {
            return Err(NetError::Tap(TapError::NotUsable(
                "set must be queues of one IFF_MULTI_QUEUE TAP for several queue pairs",
            )));
        }
        info!(
            "virtio-net on passed TAP {}: {} queue pair(s) of {} entries",
            taps.first().map_or("", |t| t.name()),
            taps.len(),
            cfg.queue_size
        );
        Ok(Self {
            mac: cfg.mac,
            queue_size: cfg.queue_size,
            taps: taps.into_iter().map(Arc::new).collect(),
            workers: Vec::new(),
        })
    }

    /// Name of the TAP interface.
    pub fn tap_name(&self) -> &str {
        self.taps.first().map_or("", |t| t.name())
    }

    fn pairs(&self) -> usize {
        self.taps.len()
    }
}

/// The virtio-net configuration space (virtio 1.2, 5.1.4) up to
/// `max_virtqueue_pairs`: MAC, link up, the queue pairs. Shared by every
/// virtio-net the VMM serves, whatever its data path.
pub fn config_space(mac: [u8; 6], pairs: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[..6].copy_from_slice(&mac);
    c[6..8].copy_from_slice(&LINK_UP.to_le_bytes());
    c[8..10].copy_from_slice(&pairs.to_le_bytes());
    c
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn pci_class(&self) -> (u8, u8) {
        // Network controller, Ethernet.
        (0x02, 0x00)
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        let mut n = self.pairs() * 2;
        if self.pairs() > 1 {
            n += 1;
        }
        vec![self.queue_size; n]
    }

    fn features(&self) -> u64 {
        use features::*;
        let mut f = [
            CSUM, GUEST_CSUM, MAC, GUEST_TSO4, GUEST_TSO6, HOST_TSO4, HOST_TSO6, MRG_RXBUF, STATUS,
        ]
        .iter()
        .fold(0u64, |acc, b| acc | feature(*b));
        // The descriptor walker handles indirect tables (and checks them).
        f |= feature(VIRTIO_RING_F_EVENT_IDX) | feature(VIRTIO_RING_F_INDIRECT_DESC);
        if self.pairs() > 1 {
            f |= feature(CTRL_VQ) | feature(MQ);
        }
        f
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // NetConfig bounds the pairs to MAX_QUEUE_PAIRS: never saturates.
        let pairs = u16::try_from(self.pairs()).unwrap_or(u16::MAX);
        read_config_window(&config_space(self.mac, pairs), offset, data);
    }

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        use features::*;
        let f = ctx.features;
        let has = |b: u32| f & feature(b) != 0;
        let mut offload = 0;
        if has(GUEST_CSUM) {
            offload |= TUN_F_CSUM;
            if has(GUEST_TSO4) {
                offload |= TUN_F_TSO4;
            }
            if has(GUEST_TSO6) {
                offload |= TUN_F_TSO6;
            }
        }
        // The TAP builds GSO frames only when the guest takes TSO.
        let max_frame = if offload & (TUN_F_TSO4 | TUN_F_TSO6) != 0 {
            MAX_FRAME
        } else {
            MAX_PLAIN_FRAME
        };
        for tap in &self.taps {
            tap.set_offload(offload)
                .map_err(|e| ActivateError::Device(Box::new(e)))?;
        }
        let pairs = self.pairs();
        let mut slots: Vec<Option<WorkerQueue>> = (0..pairs * 2 + 1).map(|_| None).collect();
        for q in ctx.queues {
            if let Some(s) = slots.get_mut(usize::from(q.index)) {
                *s = Some(WorkerQueue::from(q));
            }
        }
        let mut ctrl = if pairs > 1 && has(CTRL_VQ) {
            slots.get_mut(pairs * 2).and_then(Option::take)
        } else {
            None
        };
        // Until the driver sends VQ_PAIRS_SET only the first pair is in use
        // (virtio 1.2, 5.1.6.5.5): the TAP must not steer flows elsewhere.
        for (i, tap) in self.taps.iter().enumerate() {
            if pairs > 1 {
                tap.set_queue_enabled(i == 0)
                    .map_err(|e| ActivateError::Device(Box::new(e)))?;
            }
        }
        let mut all_rx_kicks = Vec::with_capacity(pairs);
        for i in 0..pairs {
            // Positions matter (pair i at index i); an absent queue gets
            // an eventfd nobody listens to.
            all_rx_kicks.push(match slots.get(2 * i) {
                Some(Some(q)) => q.kick.try_clone()?,
                _ => EventFd::new(libc::EFD_NONBLOCK)?,
            });
        }
        for (i, tap) in self.taps.iter().enumerate() {
            let rx = slots.get_mut(2 * i).and_then(Option::take);
            let tx = slots.get_mut(2 * i + 1).and_then(Option::take);
            let (Some(rx), Some(tx)) = (rx, tx) else {
                // The driver did not enable this pair (fewer pairs in use).
                continue;
            };
            let stop = EventFd::new(libc::EFD_NONBLOCK)?;
            let parts = WorkerParts {
                mem: ctx.mem.clone(),
                interrupt: ctx.interrupt.clone(),
                tap: tap.clone(),
                rx,
                tx,
                ctrl: ctrl.take(),
                mrg_rxbuf: has(MRG_RXBUF),
                max_frame,
                all_taps: if i == 0 {
                    self.taps.clone()
                } else {
                    Vec::new()
                },
                all_rx_kicks: if i == 0 {
                    std::mem::take(&mut all_rx_kicks)
                } else {
                    Vec::new()
                },
                stop: stop.try_clone()?,
            };
            let handle = sandbox::spawn(ThreadKind::NetWorker, format!("net-q{i}"), move || {
                run_worker(parts)
            })?;
            self.workers.push((stop, handle));
        }
        if self.workers.is_empty() {
            return Err(QueueSetupError::NoQueuePair.into());
        }
        Ok(())
    }

    fn reset(&mut self) {
        for (stop, handle) in self.workers.drain(..) {
            if let Err(e) = stop.write(1) {
                warn!("virtio-net: cannot stop worker: {e}");
                continue;
            }
            if handle.join().is_err() {
                warn!("virtio-net worker panicked");
            }
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.reset();
    }
}
