//! A virtqueue as a virtio-net thread owns it (the TAP worker's pairs, the
//! control queue of either kind of device), and the ring steps they share.

use log::warn;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vmm_sys_util::eventfd::EventFd;

use crate::dma::DmaSpace;
use crate::virtio::{ActiveQueue, VirtioInterrupt};

/// A queue owned by one thread.
pub struct WorkerQueue {
    pub(crate) index: u16,
    pub(crate) queue: Queue,
    pub(crate) kick: EventFd,
    /// Set once the ring or a chain proved malformed: the queue is left
    /// alone until the driver resets the device.
    pub(crate) broken: bool,
}

impl WorkerQueue {
    /// Whether the queue was stopped for a fault.
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// The ring state.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }
}

impl From<ActiveQueue> for WorkerQueue {
    fn from(q: ActiveQueue) -> Self {
        Self {
            index: q.index,
            queue: q.queue,
            kick: q.kick,
            broken: false,
        }
    }
}

/// Pops the next available chain head, if any.
pub(crate) fn pop_head(q: &mut Queue, mem: &DmaSpace) -> Result<Option<u16>, virtio_queue::Error> {
    let mut it = q.iter(mem)?;
    Ok(it.next().map(|c| c.head_index()))
}

/// Stops `q` for good (until a device reset) and tells the driver through
/// DEVICE_NEEDS_RESET; logged once.
pub(crate) fn break_queue(q: &mut WorkerQueue, interrupt: &dyn VirtioInterrupt, why: &str) {
    if !q.broken {
        q.broken = true;
        warn!(
            "virtio-net queue {}: {why}; queue stopped until the driver resets the device",
            q.index
        );
        interrupt.set_needs_reset();
    }
}

/// Interrupts the driver for `q` unless it asked not to be (EVENT_IDX or
/// the NO_INTERRUPT flag).
pub(crate) fn signal_used(q: &mut WorkerQueue, mem: &DmaSpace, interrupt: &dyn VirtioInterrupt) {
    // On a ring error, notify anyway: a spurious interrupt is harmless.
    if q.queue.needs_notification(mem).unwrap_or(true) {
        interrupt.notify_queue(q.index);
    }
}
