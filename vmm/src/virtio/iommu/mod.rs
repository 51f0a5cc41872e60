//! The virtio-iommu device (virtio device id 23) on the virtio-pci
//! transport, over the `virtio-iommu` crate's transport-agnostic model.
//!
//! This file is the glue: the [`VirtioDevice`] implementation, feature and
//! config plumbing, and the threads' lifetime. The queue work lives in
//! [`request`] (one thread and one library `Worker` per request queue) and
//! [`event`] (fault events to the event queue).
//!
//! The vIOMMU's own rings are not translated: the transport is given an
//! identity [`DmaSpace`](crate::dma::DmaSpace) for this device, and it never
//! gets `iommu=on` (it is not its own endpoint).
//!
//! WHY features are acknowledged in the library before activation: the
//! transport reports the driver's features only at DRIVER_OK, but the
//! driver may write the `bypass` config field earlier (after FEATURES_OK),
//! and the library accepts that write only with BYPASS_CONFIG acknowledged.
//! So every offered bit is pre-acknowledged, and the negotiated set
//! replaces it at activation. A driver that did not negotiate BYPASS_CONFIG
//! must not write the field, so accepting it earlier changes nothing for a
//! conforming driver.

mod event;
pub mod options;
pub mod platform;
mod request;

pub use options::IommuOptions;
pub use platform::IommuPlatform;

use std::sync::Arc;
use std::thread::JoinHandle;

use log::{info, warn};
use virtio_iommu::device::IommuDevice;
use vmm_sys_util::eventfd::EventFd;

use vm_memory::{Bytes, GuestAddress};

use super::chain::Buffer;
use super::{ActivateContext, ActivateError, VirtioDevice};
use crate::dma::DmaSpace;

/// Virtio device id of the IOMMU.
pub const VIRTIO_ID_IOMMU: u32 = 23;
/// Size of each request queue.
pub const REQUEST_QUEUE_SIZE: u16 = 256;
/// Size of the event queue.
pub const EVENT_QUEUE_SIZE: u16 = 64;

/// The virtio-iommu device.
pub struct VirtioIommu {
    iommu: Arc<IommuDevice>,
    /// Signalled by DMA consumers after a fault (see `dma::iommu`).
    fault_notify: Arc<EventFd>,
    /// Tells the queue threads to stop (reset).
    stop: Option<Arc<EventFd>>,
    threads: Vec<JoinHandle<()>>,
}

impl VirtioIommu {
    /// Wraps `iommu`. Endpoints are added to `iommu` by the VMM as devices
    /// are plugged in.
    pub fn new(iommu: Arc<IommuDevice>) -> std::io::Result<Self> {
        iommu.ack_features(iommu.device_features());
        Ok(Self {
            iommu,
            fault_notify: Arc::new(EventFd::new(libc::EFD_NONBLOCK)?),
            stop: None,
            threads: Vec::new(),
        })
    }

    /// The device model (for `add_endpoint` and `endpoint_dma`).
    pub fn iommu(&self) -> &Arc<IommuDevice> {
        &self.iommu
    }

    /// The eventfd DMA consumers signal after a fault.
    pub fn fault_notify(&self) -> Arc<EventFd> {
        self.fault_notify.clone()
    }

    fn stop_threads(&mut self) {
        if let Some(stop) = self.stop.take() {
            if let Err(e) = stop.write(1) {
                warn!("virtio-iommu: cannot stop queue threads: {e}");
            }
        }
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                warn!("virtio-iommu: a queue thread panicked");
            }
        }
    }
}

impl VirtioDevice for VirtioIommu {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_IOMMU
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        // N request queues (N > 1 only used with the multi-queue feature;
        // without it the driver uses queue 0 for requests and queue 1 for
        // events) and the event queue.
        let n = usize::from(self.iommu.config().num_request_queues.max(1));
        let mut v = vec![REQUEST_QUEUE_SIZE; n];
        v.push(EVENT_QUEUE_SIZE);
        v
    }

    fn features(&self) -> u64 {
        self.iommu.device_features()
    }

    fn pci_class(&self) -> (u8, u8) {
        // Base class 08 (system peripheral), subclass 06 (IOMMU).
        (0x08, 0x06)
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        self.iommu.read_config(offset, data);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        self.iommu.write_config(offset, data);
    }

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        self.stop_threads();
        self.iommu.ack_features(ctx.features);
        let nreq = self.iommu.num_request_queues();
        let stop = Arc::new(EventFd::new(libc::EFD_NONBLOCK)?);
        let mut requests = Vec::new();
        let mut events = None;
        for q in ctx.queues {
            if q.index < nreq {
                requests.push(q);
            } else if q.index == nreq {
                events = Some(q);
            }
        }
        if requests.len() != usize::from(nreq) {
            return Err(ActivateError::Queues(format!(
                "{} of {nreq} request queues enabled",
                requests.len()
            )));
        }
        let mut threads = Vec::new();
        for q in requests {
            threads.push(request::spawn(
                self.iommu.clone(),
                q,
                ctx.mem.clone(),
                ctx.interrupt.clone(),
                stop.clone(),
            )?);
        }
        match events {
            Some(q) => threads.push(event::spawn(
                self.iommu.clone(),
                q,
                ctx.mem.clone(),
                ctx.interrupt.clone(),
                self.fault_notify.clone(),
                stop.clone(),
            )?),
            // Allowed: events are then kept (bounded) and dropped when full.
            None => warn!("virtio-iommu: driver did not enable the event queue"),
        }
        info!(
            "virtio-iommu: active with {nreq} request queue(s), features {:#x}",
            ctx.features
        );
        self.stop = Some(stop);
        self.threads = threads;
        Ok(())
    }

    fn reset(&mut self) {
        self.stop_threads();
        self.iommu.reset();
        self.iommu.ack_features(self.iommu.device_features());
    }
}

impl Drop for VirtioIommu {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// Waits until `wake` or `stop` is readable; returns false on stop.
/// Both eventfds are consumed.
fn wait(fds: &[&EventFd], stop: &EventFd) -> bool {
    use std::os::fd::AsRawFd;
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .chain(std::iter::once(&stop))
        .map(|e| libc::pollfd {
            fd: e.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        // SAFETY: `pfds` is a valid array of pollfd for the whole call.
        let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, -1) };
        if r < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            warn!("virtio-iommu: poll: {err}");
            return false;
        }
        break;
    }
    if pfds.last().is_some_and(|p| p.revents != 0) {
        return false;
    }
    for (p, e) in pfds.iter().zip(fds) {
        if p.revents != 0 {
            // Non-blocking: a spurious wake-up reads EAGAIN, which is fine.
            let _ = e.read();
        }
    }
    true
}

/// Copies `data` into the device-writable buffers `bufs` in order; false if
/// a buffer is not writable guest memory.
fn scatter(mem: &DmaSpace, bufs: &[Buffer], mut data: &[u8]) -> bool {
    for b in bufs {
        if data.is_empty() {
            break;
        }
        let n = (b.len as usize).min(data.len());
        let (head, rest) = data.split_at(n);
        if mem.write_slice(head, GuestAddress(b.addr)).is_err() {
            return false;
        }
        data = rest;
    }
    true
}
