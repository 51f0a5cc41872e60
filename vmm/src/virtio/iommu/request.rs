//! One request queue with its own library `QueueContext`, served by a thread of
//! its own or inline by the vCPU that kicked it.
//!
//! Per kick: pop every available chain, copy its device-readable part into
//! a bounded buffer, let the library handle it, copy the answer back; then
//! call `complete_kick` ONCE (this flushes the batch's invalidations to all
//! DMA consumers) and only then publish the used entries and interrupt.
//! That order is the guarantee that the guest never sees an UNMAP complete
//! while a device can still reach the page.

use std::sync::Arc;
use std::thread::JoinHandle;

use log::{debug, warn};
use virtio_iommu::device::IommuDevice;
use virtio_iommu::mapping::QueueContext;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use super::{scatter, wait, wake_on};
use crate::dma::DmaSpace;
use crate::sandbox::{self, ThreadKind};
use crate::virtio::chain::{pop_head, walk_into, Buffer, Chain};
use crate::virtio::VirtioInterrupt;
use crate::warn_limited;

/// Largest device-readable part copied per request (requests are at most
/// a few dozen bytes; the rest of a longer buffer is ignored).
const MAX_READABLE: usize = 4096;
/// Largest device-writable part served: probe properties plus the tail.
const MAX_WRITABLE: usize = 4096 + 64 * 1024;

/// How a batch ended.
enum Drain {
    /// No more available chains (notifications re-enabled).
    Empty,
    /// The batch reached its bound; more chains may be waiting.
    Full,
    /// The ring is malformed.
    Broken,
}

/// One request queue's state: served by its own thread ([`RequestQueue::spawn`])
/// or inline by the kicking vCPU ([`RequestQueue::serve`]).
pub(super) struct RequestQueue {
    iommu: Arc<IommuDevice>,
    index: u16,
    queue: Queue,
    mem: DmaSpace,
    interrupt: Arc<dyn VirtioInterrupt>,
    worker: QueueContext,
    chain: Chain,
    readable: Vec<u8>,
    writable: Vec<u8>,
    completed: Vec<(u16, u32)>,
    /// The ring was malformed: nothing more is served until a reset.
    broken: bool,
}

impl RequestQueue {
    pub(super) fn new(
        iommu: Arc<IommuDevice>,
        index: u16,
        queue: Queue,
        mem: DmaSpace,
        interrupt: Arc<dyn VirtioInterrupt>,
    ) -> Self {
        let worker = iommu.new_worker();
        Self {
            iommu,
            index,
            queue,
            mem,
            interrupt,
            worker,
            chain: Chain::default(),
            readable: Vec::with_capacity(64),
            writable: Vec::with_capacity(64),
            completed: Vec::new(),
            broken: false,
        }
    }

    /// The queue's number.
    pub(super) fn index(&self) -> u16 {
        self.index
    }

    /// Serves what is available now, unless the queue is broken.
    pub(super) fn serve(&mut self) {
        if !self.broken {
            self.broken = !self.process();
        }
    }

    /// Starts the thread serving this queue on every `kick` until `stop`.
    pub(super) fn spawn(
        mut self,
        kick: EventFd,
        stop: Arc<EventFd>,
    ) -> std::io::Result<JoinHandle<()>> {
        let name = format!("viommu-req{}", self.index);
        sandbox::spawn(ThreadKind::IommuRequest, name, move || {
            let Some(wake) = wake_on(&[&kick], &stop) else {
                return;
            };
            // Buffers may already be there when the driver set DRIVER_OK.
            while self.process() && wait(&wake) {}
        })
    }
}

/// Copies up to `max` bytes from the buffers into `out`.
fn gather(mem: &DmaSpace, bufs: &[Buffer], max: usize, out: &mut Vec<u8>) -> bool {
    out.clear();
    for b in bufs {
        let room = max.saturating_sub(out.len());
        let n = (b.len as usize).min(room);
        if n == 0 {
            break;
        }
        let start = out.len();
        out.resize(start + n, 0);
        let Some(dst) = out.get_mut(start..) else {
            return false;
        };
        if mem.read_slice(dst, GuestAddress(b.addr)).is_err() {
            return false;
        }
    }
    true
}

impl RequestQueue {
    /// Serves everything available, one batch (kick) at a time. Returns
    /// false if the queue is broken (the driver must reset the device) and
    /// the thread should end.
    fn process(&mut self) -> bool {
        if !self.mem.bus_master() {
            // No DMA without bus mastering; the transport kicks the queue
            // when the driver sets the bit again.
            return true;
        }
        loop {
            let state = self.drain();
            // Complete even after an error: requests already handled must not
            // be lost, and their invalidations must be flushed first.
            self.iommu.complete_kick(&mut self.worker);
            if !self.publish() {
                return false;
            }
            match state {
                Drain::Empty => return true,
                Drain::Full => continue,
                Drain::Broken => {
                    self.interrupt.set_needs_reset();
                    return false;
                }
            }
        }
    }

    /// Adds the batch's used entries and interrupts if the driver wants it.
    fn publish(&mut self) -> bool {
        if self.completed.is_empty() {
            return true;
        }
        for (head, len) in self.completed.drain(..) {
            if let Err(e) = self.queue.add_used(&self.mem, head, len) {
                warn!("virtio-iommu: used ring of queue {}: {e}", self.index);
                self.interrupt.set_needs_reset();
                return false;
            }
        }
        match self.queue.needs_notification(&self.mem) {
            Ok(true) => self.interrupt.notify_queue(self.index),
            Ok(false) => {}
            Err(e) => {
                debug!("virtio-iommu: needs_notification: {e}");
                self.interrupt.notify_queue(self.index);
            }
        }
        true
    }

    /// Handles available chains into `self.completed`, at most a queue's
    /// worth per batch so one batch stays bounded.
    ///
    /// Every way the guest can make the ring lie ends in [`Drain::Broken`]
    /// with one log line, never in another round: an avail index more
    /// than a queue ahead (the pop fails), and an index that moved back
    /// after `enable_notification` reported it ahead (a round then finds
    /// nothing, which a driver that only adds cannot cause).
    fn drain(&mut self) -> Drain {
        let limit = usize::from(self.queue.size()).max(1);
        let mut promised = false;
        loop {
            if let Err(e) = self.queue.disable_notification(&self.mem) {
                warn!("virtio-iommu: queue {}: {e}", self.index);
                return Drain::Broken;
            }
            let mut popped = false;
            loop {
                let head = match pop_head(&mut self.queue, &self.mem) {
                    Ok(Some(head)) => head,
                    Ok(None) => break,
                    Err(e) => {
                        warn!("virtio-iommu: queue {}: avail ring: {e}", self.index);
                        return Drain::Broken;
                    }
                };
                popped = true;
                let Some(len) = self.handle(head) else {
                    return Drain::Broken;
                };
                self.completed.push((head, len));
                if self.completed.len() >= limit {
                    return Drain::Full;
                }
            }
            if promised && !popped {
                warn!(
                    "virtio-iommu: queue {}: avail index moved backwards",
                    self.index
                );
                return Drain::Broken;
            }
            match self.queue.enable_notification(&self.mem) {
                Ok(true) => promised = true,
                Ok(false) => return Drain::Empty,
                Err(e) => {
                    warn!("virtio-iommu: queue {}: {e}", self.index);
                    return Drain::Broken;
                }
            }
        }
    }

    /// Handles one chain; returns its used length, or None if the ring is
    /// malformed.
    fn handle(&mut self, head: u16) -> Option<u32> {
        let (table, size) = (self.queue.desc_table(), self.queue.size());
        if let Err(e) = walk_into(&self.mem, table, size, head, &mut self.chain) {
            warn!("virtio-iommu: queue {}: bad chain: {e}", self.index);
            return None;
        }
        if !gather(
            &self.mem,
            &self.chain.readable,
            MAX_READABLE,
            &mut self.readable,
        ) {
            warn_limited!("virtio-iommu: request buffer not readable");
            return Some(0);
        }
        let wlen = usize::try_from(self.chain.writable_len())
            .unwrap_or(usize::MAX)
            .min(MAX_WRITABLE);
        self.writable.clear();
        self.writable.resize(wlen, 0);
        let used = self
            .iommu
            .handle_request(&mut self.worker, &self.readable, &mut self.writable);
        let answer = self.writable.get(..used).unwrap_or(&[]);
        if !scatter(&self.mem, &self.chain.writable, answer) {
            warn_limited!("virtio-iommu: reply buffer not writable");
            return Some(0);
        }
        Some(u32::try_from(used).unwrap_or(0))
    }
}
