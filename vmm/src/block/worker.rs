//! The thread serving one request queue of a virtio-blk device.
//!
//! WHY a thread per queue, woken by epoll on the queue's ioeventfd: a vCPU
//! only signals an eventfd on a kick; parsing, file I/O and completion run
//! here, in parallel with the guest and with the other queues (the image is
//! shared through positioned I/O, without a lock).
//!
//! Every guest-memory access goes through the device's [`DmaSpace`]; behind
//! a vIOMMU each request (walk, data transfer, status, used entry) runs in
//! quiescence sections, one per bounded chunk of its data
//! ([`super::section`]), so an UNMAP the guest sees completed is no longer
//! in use by an I/O in flight, and waits for at most one chunk of it. A malformed ring or a request that cannot be
//! answered stops the queue (logged once, DEVICE_NEEDS_RESET); a bad request
//! is answered IOERR/UNSUPP and the queue goes on. The VMM keeps running.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use log::{debug, warn};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vmm_sys_util::epoll::EpollEvent;
use vmm_sys_util::eventfd::EventFd;

use super::image::DiskImage;
use super::limits::Limits;
use super::request::{serve, Request, RequestError, RequestIo};
use super::section::Section;
use crate::dma::{DmaSpace, ThreadDma};
use crate::virtio::chain::{walk_into, Chain, ChainError};
use crate::virtio::wake::epoll_on;
use crate::virtio::{ActiveQueue, VirtioInterrupt};

const TOKEN_STOP: u64 = 0;
const TOKEN_KICK: u64 = 1;

/// What a worker is given.
pub struct WorkerParts {
    /// The device's DMA space.
    pub mem: DmaSpace,
    /// Interrupt delivery.
    pub interrupt: Arc<dyn VirtioInterrupt>,
    /// The image, shared by every queue of the disk.
    pub disk: Arc<DiskImage>,
    /// The data limits the disk advertises.
    pub limits: Limits,
    /// The queue served.
    pub queue: ActiveQueue,
    /// Written to stop the worker.
    pub stop: EventFd,
}

/// Counts of one worker's requests, logged when it stops.
#[derive(Debug, Default)]
struct Stats {
    served: u64,
    failed: u64,
}

/// Serves requests of one queue until the ring runs dry; returns whether
/// any were completed. On a ring fault or an unanswerable request the
/// queue is marked broken, with the reason.
pub struct QueueServer {
    index: u16,
    queue: Queue,
    broken: bool,
    chain: Chain,
    req: Request,
    iov: Vec<libc::iovec>,
    limits: Limits,
    stats: Stats,
}

/// Why a request queue stops until the driver resets the device.
#[derive(Debug, thiserror::Error)]
enum QueueError {
    /// The available ring cannot be read.
    #[error("avail ring: {0}")]
    AvailRing(#[source] virtio_queue::Error),
    /// The request's descriptor chain is malformed.
    #[error("request chain {head}: {source}")]
    Chain {
        /// The chain's head descriptor.
        head: u16,
        /// What is wrong with it.
        source: ChainError,
    },
    /// The request could not be answered (no status delivered).
    #[error("request chain {head}: {source}")]
    Request {
        /// The chain's head descriptor.
        head: u16,
        /// Why.
        source: RequestError,
    },
    /// The used ring cannot be written.
    #[error("used ring: {0}")]
    UsedRing(#[source] virtio_queue::Error),
}

fn pop_head(q: &mut Queue, mem: &DmaSpace) -> Result<Option<u16>, virtio_queue::Error> {
    let mut it = q.iter(mem)?;
    Ok(it.next().map(|c| c.head_index()))
}

impl QueueServer {
    /// A server for `queue` (index `index` of the device) of a disk with
    /// `limits`.
    pub fn new(index: u16, queue: Queue, limits: Limits) -> Self {
        Self {
            index,
            queue,
            broken: false,
            chain: Chain::default(),
            req: Request::default(),
            iov: Vec::new(),
            limits,
            stats: Stats::default(),
        }
    }

    /// Whether the queue was stopped for a fault.
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// The ring state (tests).
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    fn break_queue(&mut self, interrupt: &dyn VirtioInterrupt, why: &str) {
        if !self.broken {
            self.broken = true;
            warn!(
                "virtio-blk queue {}: {why}; queue stopped until the driver resets the device",
                self.index
            );
            interrupt.set_needs_reset();
        }
    }

    /// Serves every available request, then re-enables notifications
    /// (looping if requests arrived meanwhile), then signals the guest.
    pub fn process(
        &mut self,
        dma: &mut ThreadDma,
        disk: &DiskImage,
        interrupt: &dyn VirtioInterrupt,
    ) {
        if self.broken {
            return;
        }
        let mut used_any = false;
        loop {
            let disabled = self.queue.disable_notification(&*dma.access());
            if let Err(e) = disabled {
                self.break_queue(interrupt, &format!("ring: {e}"));
                break;
            }
            if let Err(why) = self.drain(dma, disk, &mut used_any) {
                self.break_queue(interrupt, &why.to_string());
                break;
            }
            let enabled = self.queue.enable_notification(&*dma.access());
            match enabled {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => {
                    self.break_queue(interrupt, &format!("ring: {e}"));
                    break;
                }
            }
        }
        // On a ring error, notify anyway: a spurious interrupt is harmless.
        if used_any
            && self
                .queue
                .needs_notification(&*dma.access())
                .unwrap_or(true)
        {
            interrupt.notify_queue(self.index);
        }
    }

    /// Serves requests until none is available.
    fn drain(
        &mut self,
        dma: &mut ThreadDma,
        disk: &DiskImage,
        used_any: &mut bool,
    ) -> Result<(), QueueError> {
        loop {
            // A request's sections: translate, transfer a chunk at a
            // time, answer.
            let mut section = Section::enter(dma);
            let Some(head) = pop_head(&mut self.queue, &section).map_err(QueueError::AvailRing)?
            else {
                return Ok(());
            };
            let (table, size) = (self.queue.desc_table(), self.queue.size());
            walk_into(&*section, table, size, head, &mut self.chain)
                .map_err(|source| QueueError::Chain { head, source })?;
            let mut failure = None;
            let mut io = RequestIo {
                limits: self.limits,
                iov: &mut self.iov,
                section: &mut section,
            };
            let served = serve(disk, &self.chain, &mut self.req, &mut io, &mut failure)
                .map_err(|source| QueueError::Request { head, source })?;
            if let Some(e) = failure {
                self.note_failure(&e);
            }
            self.stats.served += 1;
            self.queue
                .add_used(&*section, head, served.used_len)
                .map_err(QueueError::UsedRing)?;
            *used_any = true;
        }
    }

    /// The first failed request is logged as a warning, the rest counted
    /// (a guest can fail requests at will).
    fn note_failure(&mut self, e: &RequestError) {
        self.stats.failed += 1;
        if self.stats.failed == 1 {
            warn!(
                "virtio-blk queue {}: request failed: {e} (further failures counted, not logged)",
                self.index
            );
        }
    }
}

/// Runs a worker on the current thread until its stop eventfd is written.
pub fn run_worker(p: WorkerParts) {
    let epoll = match epoll_on(&[
        (p.stop.as_raw_fd(), TOKEN_STOP),
        (p.queue.kick.as_raw_fd(), TOKEN_KICK),
    ]) {
        Ok(e) => e,
        Err(e) => {
            warn!("virtio-blk worker could not start: {e}");
            p.interrupt.set_needs_reset();
            return;
        }
    };
    // Past the quiescer's reader limit the worker must not run: no
    // UNMAP would wait for it.
    let mut dma = match ThreadDma::new(p.mem.clone()) {
        Ok(d) => d,
        Err(e) => {
            warn!("virtio-blk worker could not start: {e}");
            p.interrupt.set_needs_reset();
            return;
        }
    };
    let mut server = QueueServer::new(p.queue.index, p.queue.queue, p.limits);
    let mut events = vec![EpollEvent::default(); 4];
    // Requests may already be waiting.
    if dma.bus_master() {
        server.process(&mut dma, &p.disk, &*p.interrupt);
    }
    loop {
        // Parked while asleep: no UNMAP waits for an idle worker.
        let n = match dma.parked(|| epoll.wait(-1, &mut events)) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                warn!("virtio-blk worker: epoll: {e}");
                p.interrupt.set_needs_reset();
                return;
            }
        };
        for ev in events.iter().take(n) {
            match ev.data() {
                TOKEN_STOP => {
                    debug!(
                        "virtio-blk queue {} stops: {} requests served, {} failed",
                        server.index, server.stats.served, server.stats.failed
                    );
                    return;
                }
                TOKEN_KICK => {
                    let _ = p.queue.kick.read();
                    // No DMA without bus mastering: the transport kicks
                    // every queue when the bit is set again.
                    if dma.bus_master() {
                        server.process(&mut dma, &p.disk, &*p.interrupt);
                    }
                }
                _ => {}
            }
        }
    }
}
