//! Virtio devices and their PCI transport (virtio 1.x "modern" only).
//!
//! - [`VirtioDevice`]: what a device type (net, iommu, ...) implements; the
//!   transport knows nothing device-specific.
//! - [`pci::VirtioPciDevice`]: the virtio-pci transport (common/notify/ISR/
//!   device capabilities and MSI-X in one memory BAR, ioeventfd kicks, MSI
//!   through irqfd).
//! - [`chain`]: the descriptor walker every device uses on guest rings,
//!   which treats ring contents as hostile.
//!
//! All guest memory access by devices goes through a [`DmaSpace`].

pub mod chain;
pub mod common_cfg;
pub mod iommu;
pub mod msix;
pub mod pci;
pub mod plug;
#[cfg(test)]
pub(crate) mod test_ring;
pub mod wake;

use std::sync::Arc;

use thiserror::Error;
use virtio_queue::Queue;
use vmm_sys_util::eventfd::EventFd;

use crate::dma::DmaSpace;

// The generic feature bits every device here offers or checks, from the
// bindings rather than written again: VERSION_1 (virtio 1.x, mandatory
// here), ACCESS_PLATFORM (DMA through the platform IOMMU), EVENT_IDX
// (notification suppression), INDIRECT_DESC (indirect tables).
pub use virtio_bindings::virtio_config::{VIRTIO_F_ACCESS_PLATFORM, VIRTIO_F_VERSION_1};
pub use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};

/// Device status bits (virtio 1.2, 2.1).
pub mod status {
    /// The guest noticed the device.
    pub const ACKNOWLEDGE: u8 = 1;
    /// The guest has a driver for it.
    pub const DRIVER: u8 = 2;
    /// The driver is set up and ready to drive the device.
    pub const DRIVER_OK: u8 = 4;
    /// Feature negotiation is complete.
    pub const FEATURES_OK: u8 = 8;
    /// The device hit an error it cannot recover from without a reset.
    pub const DEVICE_NEEDS_RESET: u8 = 0x40;
    /// The driver gave up on the device.
    pub const FAILED: u8 = 0x80;
}

/// Bit `n` as a feature mask.
pub const fn feature(n: u32) -> u64 {
    1u64 << n
}

/// Copies the window `offset..offset + data.len()` of a device's
/// configuration space `cfg` into `data`; bytes past its end read as 0
/// (a driver may read any offset).
pub fn read_config_window(cfg: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Ok(start) = usize::try_from(offset) else {
        return;
    };
    for (i, b) in data.iter_mut().enumerate() {
        if let Some(v) = start.checked_add(i).and_then(|j| cfg.get(j)) {
            *b = *v;
        }
    }
}

/// Interrupts a device raises, delivered by the transport (MSI-X or ISR).
pub trait VirtioInterrupt: Send + Sync {
    /// The device put buffers in the used ring of queue `queue`.
    fn notify_queue(&self, queue: u16);
    /// The device configuration changed.
    fn notify_config(&self);
    /// The device entered an error state (sets DEVICE_NEEDS_RESET and
    /// raises a configuration interrupt so the driver notices).
    fn set_needs_reset(&self);
}

/// One queue handed to a device at activation.
pub struct ActiveQueue {
    /// Queue index (its position in the device's queue list).
    pub index: u16,
    /// Ring state as configured by the driver.
    pub queue: Queue,
    /// Signalled when the driver notifies (kicks) the queue.
    pub kick: EventFd,
}

/// Everything a device needs to run: queues, memory and interrupts.
pub struct ActivateContext {
    /// The device's DMA address space (its only way to guest memory).
    pub mem: DmaSpace,
    /// Interrupt delivery.
    pub interrupt: Arc<dyn VirtioInterrupt>,
    /// Queues the driver enabled, in index order.
    pub queues: Vec<ActiveQueue>,
    /// Features the driver accepted.
    pub features: u64,
}

/// Why a device could not start.
#[derive(Debug, Error)]
pub enum ActivateError {
    /// Queues the device needs were not enabled by the driver.
    #[error("queue configuration not usable: {0}")]
    Queues(#[from] QueueSetupError),
    /// A thread or event fd could not be created.
    #[error("{0}")]
    Os(#[from] std::io::Error),
    /// Device-specific failure: the device's own error.
    #[error("{0}")]
    Device(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Which queues a device cannot start with ([`ActivateError::Queues`]).
#[derive(Debug, Error)]
pub enum QueueSetupError {
    /// virtio-net: not one receive queue enabled with its transmit queue.
    #[error("no complete receive/transmit queue pair enabled")]
    NoQueuePair,
    /// vhost-user-net: the first pair, which the back-end always serves,
    /// is not enabled.
    #[error("vhost-user-net needs the first receive and transmit queues enabled")]
    NoFirstPair,
    /// vhost-user-net: one queue of a pair without the other.
    #[error("queue {index} enabled without its pair")]
    Unpaired {
        /// The queue enabled alone.
        index: u16,
    },
    /// virtio-blk: no request queue enabled.
    #[error("no request queue enabled")]
    NoRequestQueue,
    /// virtio-iommu: not every request queue enabled.
    #[error("{enabled} of {needed} request queues enabled")]
    RequestQueues {
        /// Request queues the driver enabled.
        enabled: usize,
        /// Request queues the device has.
        needed: u16,
    },
    /// A ring address the back-end must map is not guest RAM.
    #[error("{what} at {gpa:#x} is not in guest RAM")]
    NotInGuestRam {
        /// The ring part ("descriptor table", ...).
        what: &'static str,
        /// Its guest physical address.
        gpa: u64,
    },
}

/// A virtio device, independent of the transport.
pub trait VirtioDevice: Send {
    /// Virtio device id (1 = net, 23 = iommu, ...).
    fn device_type(&self) -> u32;
    /// Maximum size of each queue; the length is the number of queues.
    fn queue_max_sizes(&self) -> Vec<u16>;
    /// Device feature bits offered (the transport adds VERSION_1 and,
    /// when the device is behind an IOMMU, ACCESS_PLATFORM).
    fn features(&self) -> u64;
    /// PCI (class, subclass) the transport advertises.
    fn pci_class(&self) -> (u8, u8) {
        (0xff, 0)
    }
    /// Reads `data.len()` bytes of device configuration at `offset`.
    /// Out-of-range bytes read as 0.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes device configuration; the default ignores writes.
    fn write_config(&mut self, _offset: u64, _data: &[u8]) {}
    /// Starts the device on `ctx` (the driver set DRIVER_OK). The device
    /// does its work on its own thread(s).
    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError>;
    /// Stops using the queues: when this returns, no device thread touches
    /// guest memory or the queues of the previous activation.
    fn reset(&mut self);
    /// Whether the driver's notifications of queue `index` are served in
    /// the notifying vCPU's thread by [`VirtioDevice::serve_queue`] instead
    /// of being signalled to a device thread through an ioeventfd. Asked
    /// after `activate`.
    fn serves_inline(&self, _index: u16) -> bool {
        false
    }
    /// Serves queue `index` now, in the caller's thread (a vCPU in an MMIO
    /// exit, or the transport after bus mastering was enabled again).
    fn serve_queue(&mut self, _index: u16) {}
    /// The driver cleared (`false`) or set bus mastering while the device
    /// runs. A device whose DMA bypasses its `DmaSpace` (a vhost-user
    /// back-end) stops and restarts it here; the default does nothing,
    /// since the space's gate stops every access that goes through it.
    fn bus_master_changed(&mut self, _enabled: bool) {}
}

#[cfg(test)]
mod tests {
    use super::read_config_window;

    #[test]
    fn config_window_reads_zero_past_the_end() {
        let cfg = [1u8, 2, 3, 4];
        let mut d = [0xffu8; 3];
        read_config_window(&cfg, 2, &mut d);
        assert_eq!(d, [3, 4, 0]);
        read_config_window(&cfg, u64::MAX, &mut d);
        assert_eq!(d, [0, 0, 0]);
        let mut one = [0u8; 1];
        read_config_window(&cfg, 0, &mut one);
        assert_eq!(one, [1]);
    }
}
