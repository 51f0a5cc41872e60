//! The event queue: fault events from the library's bounded fault queue
//! into driver-supplied buffers.
//!
//! Woken by the driver adding buffers (kick) and by DMA consumers after a
//! fault (the fault eventfd). An event leaves the library's queue only when
//! a buffer is there to hold it; without buffers events wait (bounded; the
//! library drops and counts the excess, as the spec allows).

use std::sync::Arc;
use std::thread::JoinHandle;

use log::warn;
use virtio_iommu::device::IommuDevice;
use virtio_iommu::wire::FAULT_SIZE;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vmm_sys_util::eventfd::EventFd;

use super::{scatter, wait, wake_on};
use crate::dma::DmaSpace;
use crate::sandbox::{self, ThreadKind};
use crate::virtio::chain::{pop_head, walk_into, Chain};
use crate::virtio::{ActiveQueue, VirtioInterrupt};
use crate::warn_limited;
use crate::width::const_u32;

/// A fault event's size as the used ring's 32-bit length.
const FAULT_LEN: u32 = const_u32(FAULT_SIZE as i128);

struct EventQueue {
    iommu: Arc<IommuDevice>,
    index: u16,
    queue: Queue,
    mem: DmaSpace,
    interrupt: Arc<dyn VirtioInterrupt>,
    chain: Chain,
}

/// Starts the thread serving the event queue `q`.
pub(super) fn spawn(
    iommu: Arc<IommuDevice>,
    q: ActiveQueue,
    mem: DmaSpace,
    interrupt: Arc<dyn VirtioInterrupt>,
    faults: Arc<EventFd>,
    stop: Arc<EventFd>,
) -> std::io::Result<JoinHandle<()>> {
    let mut eq = EventQueue {
        iommu,
        index: q.index,
        queue: q.queue,
        mem,
        interrupt,
        chain: Chain::default(),
    };
    let kick = q.kick;
    sandbox::spawn(ThreadKind::IommuEvent, "viommu-event", move || {
        let Some(wake) = wake_on(&[&kick, &faults], &stop) else {
            return;
        };
        while eq.deliver() && wait(&wake) {}
    })
}

impl EventQueue {
    /// Moves as many pending events as there are buffers. Returns false if
    /// the queue is broken.
    fn deliver(&mut self) -> bool {
        let mut delivered = false;
        let ok = loop {
            // A hostile avail index ends the queue here, once: the error
            // is not taken for "no buffers" (which would log it again on
            // every kick and fault, see `chain::pop_head`).
            let head = match pop_head(&mut self.queue, &self.mem) {
                Ok(Some(head)) => head,
                Ok(None) => break true,
                Err(e) => {
                    warn!("virtio-iommu: event queue: avail ring: {e}");
                    break false;
                }
            };
            let Some(ev) = self.iommu.pop_fault_event() else {
                // Keep the buffer for the next fault.
                self.queue.go_to_previous_position();
                break true;
            };
            let (table, size) = (self.queue.desc_table(), self.queue.size());
            if let Err(e) = walk_into(&self.mem, table, size, head, &mut self.chain) {
                warn!("virtio-iommu: event queue: bad chain: {e}");
                break false;
            }
            let len = if self.write_event(&ev) {
                FAULT_LEN
            } else {
                warn_limited!(
                    "virtio-iommu: event buffer too small or not writable; event dropped"
                );
                0
            };
            if let Err(e) = self.queue.add_used(&self.mem, head, len) {
                warn!("virtio-iommu: event used ring: {e}");
                break false;
            }
            delivered = true;
        };
        // With EVENT_IDX the driver kicks only past the index published
        // here: ask for a kick once it adds buffers beyond those we hold.
        if let Err(e) = self.queue.enable_notification(&self.mem) {
            warn!("virtio-iommu: event queue: {e}");
            self.interrupt.set_needs_reset();
            return false;
        }
        if delivered {
            match self.queue.needs_notification(&self.mem) {
                Ok(false) => {}
                _ => self.interrupt.notify_queue(self.index),
            }
        }
        if !ok {
            self.interrupt.set_needs_reset();
        }
        ok
    }

    fn write_event(&self, ev: &[u8; FAULT_SIZE]) -> bool {
        self.chain.writable_len() >= FAULT_SIZE as u64
            && scatter(&self.mem, &self.chain.writable, ev)
    }
}

#[cfg(test)]
mod tests {
    use virtio_iommu::device::IommuConfig;

    use super::*;
    use crate::log_limit::counting;
    use crate::virtio::test_ring::{leaked_ram, returns_in_bound, DriverRing, IrqCount, RingAddrs};

    const SIZE: u16 = 16;

    /// A driver that moves the event queue's avail index a queue and one
    /// ahead: delivering returns, the queue is broken with one reset
    /// request and one log line, and it is not retried on the next wake.
    #[test]
    fn viommu_event_avail_index_jump_breaks_the_queue_without_spinning() {
        let mem = leaked_ram(0x100000);
        let addrs = RingAddrs {
            desc: 0x1000,
            avail: 0x2000,
            used: 0x3000,
        };
        let ring = DriverRing::new(mem, addrs, SIZE);
        let irq = Arc::new(IrqCount::default());
        let mut eq = EventQueue {
            iommu: Arc::new(IommuDevice::new(IommuConfig::default()).unwrap()),
            index: 1,
            queue: ring.queue(),
            mem: DmaSpace::identity(mem.clone()),
            interrupt: irq.clone(),
            chain: Chain::default(),
        };
        assert!(eq.deliver(), "an empty ring is fine");
        ring.set_avail_idx(SIZE + 1);
        let (ok, lines) = returns_in_bound(move || {
            counting::install();
            let before = counting::lines();
            let ok = eq.deliver();
            (ok, counting::lines() - before)
        })
        .expect("delivering on a jumped avail index spins");
        assert!(!ok, "the event thread must end");
        assert_eq!(irq.needs_reset(), 1);
        assert_eq!(irq.queue(), 0);
        assert!((1..=2).contains(&lines), "{lines} log lines");
        assert_eq!(ring.used_idx(), 0);
    }
}
