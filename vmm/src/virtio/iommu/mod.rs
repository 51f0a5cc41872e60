//! The virtio-iommu device (virtio device id 23) on the virtio-pci
//! transport, over the `virtio-iommu` crate's transport-agnostic model.
//!
//! This file is the glue: the [`VirtioDevice`] implementation, feature and
//! config plumbing, and the threads' lifetime. The queue work lives in
//! [`request`] (one thread and one library `QueueContext` per request queue) and
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
#[cfg(test)]
mod ring_tests;

pub use options::{IommuOptions, RequestServing};
pub use platform::IommuPlatform;

use std::sync::Arc;
use std::thread::JoinHandle;

use log::{info, warn};
use virtio_iommu::device::IommuDevice;
use vmm_sys_util::eventfd::EventFd;

use vm_memory::{Bytes, GuestAddress};

use super::chain::Buffer;
use super::wake::Wake;
use super::{ActivateContext, ActivateError, QueueSetupError, VirtioDevice};
use crate::dma::DmaSpace;

/// Virtio device id of the IOMMU.
pub use virtio_bindings::virtio_ids::VIRTIO_ID_IOMMU;
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
    serving: RequestServing,
    /// The request queues of the current activation when served inline
    /// (indexed by queue number); empty otherwise.
    inline: Vec<request::RequestQueue>,
}

impl VirtioIommu {
    /// Wraps `iommu`. Endpoints are added to `iommu` by the VMM as devices
    /// are plugged in.
    pub fn new(iommu: Arc<IommuDevice>, serving: RequestServing) -> std::io::Result<Self> {
        iommu.ack_features(iommu.device_features());
        Ok(Self {
            iommu,
            fault_notify: Arc::new(EventFd::new(libc::EFD_NONBLOCK)?),
            stop: None,
            threads: Vec::new(),
            serving,
            inline: Vec::new(),
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
        self.inline.clear();
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
            return Err(QueueSetupError::RequestQueues {
                enabled: requests.len(),
                needed: nreq,
            }
            .into());
        }
        let mut threads = Vec::new();
        let inline = self.serving.inline_for(nreq);
        for q in requests {
            let mut rq = request::RequestQueue::new(
                self.iommu.clone(),
                q.index,
                q.queue,
                ctx.mem.clone(),
                ctx.interrupt.clone(),
            );
            if inline {
                // Buffers may already be there when the driver set
                // DRIVER_OK (this runs in that vCPU's thread).
                rq.serve();
                self.inline.push(rq);
            } else {
                threads.push(rq.spawn(q.kick, stop.clone())?);
            }
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
            "virtio-iommu: active with {nreq} request queue(s) served {}, features {:#x}",
            if inline { "inline" } else { "by threads" },
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

    fn serves_inline(&self, index: u16) -> bool {
        self.inline.iter().any(|rq| rq.index() == index)
    }

    fn serve_queue(&mut self, index: u16) {
        if let Some(rq) = self.inline.iter_mut().find(|rq| rq.index() == index) {
            rq.serve();
        }
    }
}

impl Drop for VirtioIommu {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// Sleeps on `wake`; false on stop, and on an epoll error (logged: the
/// thread ends as it would on a stop).
fn wait(wake: &Wake) -> bool {
    wake.wait().unwrap_or_else(|err| {
        warn!("virtio-iommu: epoll: {err}");
        false
    })
}

/// The thread's wake-up set, or `None` (logged) if epoll failed.
fn wake_on<'a>(fds: &[&'a EventFd], stop: &EventFd) -> Option<Wake<'a>> {
    Wake::new(fds, stop)
        .map_err(|err| warn!("virtio-iommu: epoll: {err}"))
        .ok()
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{Duration, Instant};

    use virtio_iommu::device::IommuConfig;
    use virtio_iommu::mapping::Perm;
    use virtio_queue::{Queue, QueueT};
    use vm_memory::{Bytes, GuestAddress};

    use super::*;
    use crate::memory::GuestMemoryMmap;
    use crate::virtio::chain::{VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE};
    use crate::virtio::test_ring::{DriverRing, RingAddrs};
    use crate::virtio::{ActiveQueue, VirtioInterrupt};

    const EP: u32 = 8;
    /// (descriptor table, avail ring, used ring) of queues 0 and 1.
    const RINGS: [(u64, u64, u64); 2] = [(0x1000, 0x2000, 0x3000), (0x4000, 0x5000, 0x6000)];

    #[derive(Default)]
    struct Irq {
        queue: [AtomicU32; 2],
        needs_reset: AtomicU32,
    }

    impl VirtioInterrupt for Irq {
        fn notify_queue(&self, queue: u16) {
            if let Some(c) = self.queue.get(usize::from(queue)) {
                c.fetch_add(1, Ordering::SeqCst);
            }
        }
        fn notify_config(&self) {}
        fn set_needs_reset(&self) {
            self.needs_reset.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn queue(mem: &GuestMemoryMmap, i: usize) -> Queue {
        let (d, a, u) = RINGS[i];
        let mut q = Queue::new(16).unwrap();
        q.set_size(16);
        q.set_desc_table_address(Some(u32::try_from(d).unwrap()), Some(0));
        q.set_avail_ring_address(Some(u32::try_from(a).unwrap()), Some(0));
        q.set_used_ring_address(Some(u32::try_from(u).unwrap()), Some(0));
        q.set_ready(true);
        assert!(q.is_valid(mem));
        q
    }

    /// The driver's side of queues 0 and 1 (indices zeroed: build them
    /// before the device starts).
    fn drivers(mem: &GuestMemoryMmap) -> [DriverRing<'_>; 2] {
        RINGS.map(|(desc, avail, used)| DriverRing::new(mem, RingAddrs { desc, avail, used }, 16))
    }

    /// Publishes ATTACH endpoint EP to domain 1 as the first request of
    /// queue 0 (readable request at 0x10000, writable status at 0x11000).
    fn offer_attach(mem: &GuestMemoryMmap, ring: &mut DriverRing<'_>) {
        let mut attach = vec![1u8, 0, 0, 0];
        attach.extend_from_slice(&1u32.to_le_bytes());
        attach.extend_from_slice(&EP.to_le_bytes());
        attach.extend_from_slice(&[0; 8]);
        mem.write_slice(&attach, GuestAddress(0x10000)).unwrap();
        mem.write_slice(&[0xff; 4], GuestAddress(0x11000)).unwrap();
        ring.desc(0, 0x10000, 20, VIRTQ_DESC_F_NEXT, 1);
        ring.desc(1, 0x11000, 4, VIRTQ_DESC_F_WRITE, 0);
        ring.offer(0);
    }

    fn wait_used(rings: &[DriverRing<'_>], q: usize, want: u16) {
        let t = Instant::now();
        while rings[q].used_idx() < want {
            assert!(t.elapsed() < Duration::from_secs(10), "queue {q} stalled");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn requests_are_answered_and_faults_reach_the_event_queue() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x100000)]).unwrap();
        let mut rings = drivers(&mem);
        let iommu = Arc::new(IommuDevice::new(IommuConfig::default()).unwrap());
        iommu.add_endpoint(EP).unwrap();
        let mut dev = VirtioIommu::new(iommu.clone(), RequestServing::Thread).unwrap();
        assert_eq!(dev.queue_max_sizes(), vec![256, 64]);
        assert_eq!(dev.device_type(), 23);
        let irq = Arc::new(Irq::default());
        let kicks = [
            EventFd::new(libc::EFD_NONBLOCK).unwrap(),
            EventFd::new(libc::EFD_NONBLOCK).unwrap(),
        ];
        let features = dev.features();
        dev.activate(ActivateContext {
            mem: DmaSpace::identity(mem.clone()),
            interrupt: irq.clone(),
            queues: vec![
                ActiveQueue {
                    index: 0,
                    queue: queue(&mem, 0),
                    kick: kicks[0].try_clone().unwrap(),
                },
                ActiveQueue {
                    index: 1,
                    queue: queue(&mem, 1),
                    kick: kicks[1].try_clone().unwrap(),
                },
            ],
            features,
        })
        .unwrap();

        offer_attach(&mem, &mut rings[0]);
        kicks[0].write(1).unwrap();
        wait_used(&rings, 0, 1);
        assert_eq!(rings[0].used(0).1, 4);
        assert_eq!(mem.read_obj::<u8>(GuestAddress(0x11000)).unwrap(), 0);
        assert_eq!(iommu.endpoint_domain(EP), Some(1));
        assert_eq!(irq.queue[0].load(Ordering::SeqCst), 1);

        // A malformed request (unknown type) is answered with length 0.
        mem.write_slice(&[0x7f; 20], GuestAddress(0x10000)).unwrap();
        rings[0].offer(0);
        kicks[0].write(1).unwrap();
        wait_used(&rings, 0, 2);
        assert_eq!(rings[0].used(1).1, 0);

        // A fault waits for an event buffer, then lands in it.
        let dma = iommu.endpoint_dma(EP).unwrap();
        assert!(dma.translate_contiguous(0x5000, 8, Perm::READ).is_err());
        dev.fault_notify().write(1).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(rings[1].used_idx(), 0, "no buffer yet");
        rings[1].desc(0, 0x20000, 24, VIRTQ_DESC_F_WRITE, 0);
        rings[1].offer(0);
        kicks[1].write(1).unwrap();
        wait_used(&rings, 1, 1);
        assert_eq!(rings[1].used(0).1, 24);
        let ep: u32 = mem.read_obj(GuestAddress(0x20008)).unwrap();
        let addr: u64 = mem.read_obj(GuestAddress(0x20010)).unwrap();
        assert_eq!((ep, addr), (EP, 0x5000));
        assert_eq!(irq.needs_reset.load(Ordering::SeqCst), 0);

        // Reset stops the threads and forgets the attachment.
        dev.reset();
        assert_eq!(iommu.endpoint_domain(EP), None);
        rings[0].offer(0);
        kicks[0].write(1).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            rings[0].used_idx(),
            2,
            "no thread serves the queue after reset"
        );
    }

    /// Inline serving: the request is answered in the caller's thread by
    /// `serve_queue`, before it returns (no thread, no kick eventfd), and
    /// the event queue keeps its thread.
    #[test]
    fn inline_requests_are_answered_before_serve_queue_returns() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x100000)]).unwrap();
        let mut rings = drivers(&mem);
        let iommu = Arc::new(IommuDevice::new(IommuConfig::default()).unwrap());
        iommu.add_endpoint(EP).unwrap();
        let mut dev = VirtioIommu::new(iommu.clone(), RequestServing::Inline).unwrap();
        let irq = Arc::new(Irq::default());
        let kicks = [
            EventFd::new(libc::EFD_NONBLOCK).unwrap(),
            EventFd::new(libc::EFD_NONBLOCK).unwrap(),
        ];
        let features = dev.features();
        dev.activate(ActivateContext {
            mem: DmaSpace::identity(mem.clone()),
            interrupt: irq.clone(),
            queues: (0..2)
                .map(|i| ActiveQueue {
                    index: u16::try_from(i).unwrap(),
                    queue: queue(&mem, i),
                    kick: kicks[i].try_clone().unwrap(),
                })
                .collect(),
            features,
        })
        .unwrap();
        assert!(dev.serves_inline(0));
        assert!(
            !dev.serves_inline(1),
            "the event queue is not a request queue"
        );

        offer_attach(&mem, &mut rings[0]);
        // A kick through the eventfd reaches nobody...
        kicks[0].write(1).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(rings[0].used_idx(), 0);
        // ...serve_queue answers before it returns.
        dev.serve_queue(0);
        assert_eq!(rings[0].used_idx(), 1);
        assert_eq!(rings[0].used(0).1, 4);
        assert_eq!(mem.read_obj::<u8>(GuestAddress(0x11000)).unwrap(), 0);
        assert_eq!(iommu.endpoint_domain(EP), Some(1));
        assert_eq!(irq.queue[0].load(Ordering::SeqCst), 1);

        // After a reset nothing is served inline any more.
        dev.reset();
        assert!(!dev.serves_inline(0));
        rings[0].offer(0);
        dev.serve_queue(0);
        assert_eq!(rings[0].used_idx(), 1);
    }

    /// The default serving: a driver on the standard single request queue
    /// (multi-queue not negotiated) is served inline.
    #[test]
    fn auto_serves_a_single_request_queue_inline() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x100000)]).unwrap();
        let _rings = drivers(&mem);
        let iommu = Arc::new(IommuDevice::new(IommuConfig::default()).unwrap());
        let mut dev = VirtioIommu::new(iommu, RequestServing::Auto).unwrap();
        let features = dev.features();
        dev.activate(ActivateContext {
            mem: DmaSpace::identity(mem.clone()),
            interrupt: Arc::new(Irq::default()),
            queues: (0..2)
                .map(|i| ActiveQueue {
                    index: u16::try_from(i).unwrap(),
                    queue: queue(&mem, i),
                    kick: EventFd::new(libc::EFD_NONBLOCK).unwrap(),
                })
                .collect(),
            features,
        })
        .unwrap();
        assert!(dev.serves_inline(0));
        dev.reset();
    }
}
