//! The virtio-iommu device model, independent of any virtio transport.
//!
//! A transport (virtio-pci in the VMM, or a test) drives it like this:
//!
//! 1. `IommuDevice::new(IommuConfig)`, then `add_endpoint(bdf)` for every PCI
//!    endpoint behind the vIOMMU (and `add_invalidator` for every DMA consumer
//!    that caches translations: vhost-user back-ends, VFIO containers;
//!    `add_endpoint_listener` for consumers that must follow an endpoint
//!    from domain to domain, `add_map_mirror` for those that must also see
//!    every MAP of its domain: a VFIO container).
//! 2. Feature negotiation: `device_features()` / `ack_features()`; config
//!    space accesses: `read_config()` / `write_config()` (bounds-checked; only
//!    `bypass` is writable, and only with BYPASS_CONFIG negotiated).
//!    `num_request_queues()` tells how many request queues to serve (more
//!    than one only when the project multi-queue feature is negotiated); the
//!    event queue comes after the request queues.
//! 3. One thread per request queue, each with its own `QueueContext` from
//!    `new_worker()`. On a kick: for every available descriptor chain, gather
//!    the device-readable bytes and a device-writable buffer, call
//!    `handle_request()`, and remember the returned used length; then call
//!    `complete_kick()` ONCE, and only after it returns publish the used-ring
//!    entries and notify. This ordering is what guarantees the guest never
//!    sees an UNMAP complete while a DMA consumer can still reach the page.
//!    Call `complete_kick()` at least once per queue-size requests, so a
//!    guest that keeps refilling the ring cannot grow the batch unbounded.
//! 4. Event queue: whenever buffers are available, drain
//!    `pop_fault_event()` into them (24 bytes each).
//! 5. DMA from an endpoint goes through `endpoint_dma(id)`, an
//!    [`EndpointDma`] handle that translates
//!    IOVA ranges and reports faults.
//! 6. `reset()` on virtio device reset (all domains and mappings go, the
//!    `bypass` field stays), `system_reset()` on VM reset (also restores
//!    `bypass`).
//!
//! Locking: the hot path (MAP/UNMAP, translation) takes only read locks on
//! the domain registry and on one endpoint slot; ATTACH/DETACH/reset are
//! serialized by a topology mutex and take the registry's write lock briefly.

pub mod config;
mod dispatch;
mod domains;
mod endpoints;
mod features;
mod listener;
mod lookup;
mod maps;
mod mirror;
#[cfg(test)]
mod no_lock_tests;
mod pgtable;
mod probe;
mod topology;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use arc_swap::ArcSwap;
use thiserror::Error;

pub use config::{ConfigError, DeviceLimits, IommuConfig, X86_MSI_END, X86_MSI_START};
pub use features::MULTIQUEUE;
pub use listener::EndpointListener;
pub use mirror::{MapMirror, MirrorError};

use crate::counters::{CounterRegistry, RequestCounts};
use crate::endpoint::Endpoint;
use crate::events::FaultQueue;
use crate::locks::{lock, read, write};
use crate::mapping::{Depot, Invalidator, QueueContext, SpaceStats};
use crate::pgtable::{TableMemory, TableStats};
use crate::translate::EndpointDma;
use crate::wire::{feature, ConfigSpace, ResvMem, CONFIG_BYPASS_OFFSET, FAULT_SIZE};
use domains::DomainRegistry;
use endpoints::EndpointTable;
use features::Features;

/// Host-side API misuse (never caused by guest requests).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DeviceError {
    /// The configuration is not valid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The endpoint was never added.
    #[error("endpoint {0:#x} is not managed by this device")]
    UnknownEndpoint(u32),
    /// The endpoint was added already.
    #[error("endpoint {0:#x} already exists")]
    EndpointExists(u32),
    /// More endpoints than `DeviceLimits` allows.
    #[error("endpoint limit {0} reached")]
    TooManyEndpoints(u32),
}

/// The virtio-iommu device state shared by all queue threads.
pub struct IommuDevice {
    cfg: IommuConfig,
    /// `cfg.global_resv()`, computed once.
    global_resv: Vec<ResvMem>,
    features: Features,
    depot: Arc<Depot>,
    /// The `bypass` config field; shared with every EndpointDma.
    bypass: Arc<AtomicBool>,
    endpoints: EndpointTable,
    domains: DomainRegistry,
    /// Serializes ATTACH, DETACH and reset (membership changes).
    topology: Mutex<()>,
    /// The DMA consumers every kick invalidates. WHY a pointer swap: every
    /// kick of every queue reads the list; registering a consumer (device
    /// realize or unplug) is rare. A kick loads the list with no lock and
    /// no copy, a registration publishes a new list.
    invalidators: ArcSwap<Vec<Arc<dyn Invalidator>>>,
    listeners: RwLock<Vec<Arc<dyn EndpointListener>>>,
    mirrors: RwLock<Vec<Arc<dyn MapMirror>>>,
    /// Some mirror is registered: lets MAP skip the list's lock (a shared
    /// cache line for every request queue) when there is none.
    has_mirrors: AtomicBool,
    faults: Arc<FaultQueue>,
    /// Every worker's request counters.
    counters: CounterRegistry,
    /// Guest memory for page-table walks (page-table feature).
    table_mem: OnceLock<Arc<dyn TableMemory>>,
}

impl IommuDevice {
    /// A device with configuration `cfg` (checked first).
    pub fn new(cfg: IommuConfig) -> Result<Self, DeviceError> {
        cfg.validate()?;
        let features = Features::new(
            cfg.probe_size > 0,
            cfg.num_request_queues > 1,
            cfg.page_table,
        );
        Ok(Self {
            global_resv: cfg.global_resv(),
            features,
            depot: Arc::new(Depot::new()),
            bypass: Arc::new(AtomicBool::new(cfg.bypass)),
            endpoints: EndpointTable::default(),
            domains: DomainRegistry::default(),
            topology: Mutex::new(()),
            invalidators: ArcSwap::from_pointee(Vec::new()),
            listeners: RwLock::new(Vec::new()),
            mirrors: RwLock::new(Vec::new()),
            has_mirrors: AtomicBool::new(false),
            faults: Arc::new(FaultQueue::new(
                cfg.fault_queue_capacity,
                cfg.fault_logs_per_sec,
            )),
            counters: CounterRegistry::default(),
            table_mem: OnceLock::new(),
            cfg,
        })
    }

    /// The configuration the device was built with.
    pub fn config(&self) -> &IommuConfig {
        &self.cfg
    }

    /// Guest memory the page-table walks read (the same memory the DMA
    /// consumers access). Needed for ATTACH_TABLE when `page_table` is
    /// configured; set once, later calls are ignored.
    pub fn set_table_memory(&self, mem: Arc<dyn TableMemory>) {
        if self.table_mem.set(mem).is_err() {
            log::debug!("virtio-iommu: table memory already set");
        }
    }

    /// Marks an endpoint whose DMA bypasses the device's translation (a
    /// VFIO function mirrored into a host IOMMU): its domain keeps explicit
    /// MAPs, ATTACH_TABLE on it answers S_UNSUPP.
    pub fn require_explicit_maps(&self, endpoint_id: u32) -> Result<(), DeviceError> {
        let ep = self
            .endpoints
            .get(endpoint_id)
            .ok_or(DeviceError::UnknownEndpoint(endpoint_id))?;
        ep.set_explicit_maps();
        Ok(())
    }

    /// Page-table mode counters of a live domain (zero before ATTACH_TABLE).
    pub fn table_stats(&self, domain: u32) -> Option<TableStats> {
        self.domains.get(domain).map(|d| d.table().stats())
    }

    /// Registers an endpoint (PCI requester ID) behind this vIOMMU.
    pub fn add_endpoint(&self, endpoint_id: u32) -> Result<(), DeviceError> {
        self.add_endpoint_with_resv(endpoint_id, Vec::new())
    }

    /// Registers an endpoint with reserved regions of its own, reported by
    /// PROBE after the global ones and refused for MAP in its domain.
    pub fn add_endpoint_with_resv(
        &self,
        endpoint_id: u32,
        resv: Vec<ResvMem>,
    ) -> Result<(), DeviceError> {
        self.cfg.check_regions(&resv)?;
        self.cfg.check_probe_fits(resv.len())?;
        let max = self.cfg.limits.max_endpoints;
        if self.endpoints.len() >= max as usize {
            return Err(DeviceError::TooManyEndpoints(max));
        }
        if !self.endpoints.insert(Endpoint::new(endpoint_id, resv)) {
            return Err(DeviceError::EndpointExists(endpoint_id));
        }
        Ok(())
    }

    /// Feature bits the device offers (device-specific bits plus
    /// VIRTIO_F_VERSION_1; the transport adds its ring features).
    pub fn device_features(&self) -> u64 {
        self.features.offered()
    }

    /// Records the features the driver accepted (`acked` is masked by the offer).
    pub fn ack_features(&self, acked: u64) {
        self.features.ack(acked);
    }

    /// The features the driver accepted.
    pub fn acked_features(&self) -> u64 {
        self.features.acked()
    }

    /// Request queues the transport must serve: the configured number when
    /// the multi-queue feature was negotiated, otherwise exactly one.
    pub fn num_request_queues(&self) -> u16 {
        if self.features.is_acked(MULTIQUEUE) {
            self.cfg.num_request_queues
        } else {
            1
        }
    }

    /// The config space (40 bytes). `num_queues` (offset 38, as the drafts
    /// place it) reads the configured request queues when multi-queue is
    /// offered and 0 otherwise, so that a driver that never looks at the
    /// feature sees the standard layout.
    pub fn config_bytes(&self) -> Vec<u8> {
        let cs = ConfigSpace {
            page_size_mask: self.cfg.page_size_mask,
            input_start: self.cfg.input_start,
            input_end: self.cfg.input_end,
            domain_start: self.cfg.domain_start,
            domain_end: self.cfg.domain_end,
            probe_size: self.cfg.probe_size,
            bypass: u8::from(self.bypass.load(Ordering::Acquire)),
            num_queues: if self.features.is_offered(MULTIQUEUE) {
                self.cfg.num_request_queues
            } else {
                0
            },
        };
        cs.encode().to_vec()
    }

    /// Config-space read. Bytes outside the config space read as zero.
    pub fn read_config(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let cfg = self.config_bytes();
        let Ok(start) = usize::try_from(offset) else {
            return;
        };
        if let Some(src) = cfg.get(start..) {
            for (d, s) in data.iter_mut().zip(src) {
                *d = *s;
            }
        }
    }

    /// Config-space write. Only `bypass` is writable, and only when
    /// BYPASS_CONFIG was negotiated; bit 0 is the value. Everything else is
    /// ignored (the driver MUST NOT write it).
    pub fn write_config(&self, offset: u64, data: &[u8]) {
        if !self.features.is_acked(feature::BYPASS_CONFIG) {
            log::debug!("virtio-iommu: config write without BYPASS_CONFIG ignored");
            return;
        }
        let Ok(start) = usize::try_from(offset) else {
            return;
        };
        let Some(idx) = CONFIG_BYPASS_OFFSET.checked_sub(start) else {
            return;
        };
        if let Some(v) = data.get(idx) {
            self.bypass.store(v & 1 == 1, Ordering::Release);
        }
    }

    /// Current value of the `bypass` config field.
    pub fn bypass(&self) -> bool {
        self.bypass.load(Ordering::Acquire)
    }

    /// A worker context for one request-queue thread, counting its
    /// requests in this device's totals ([`IommuDevice::request_counts`]).
    pub fn new_worker(&self) -> QueueContext {
        let mut w = QueueContext::new(&self.depot);
        w.counters = self.counters.register();
        w
    }

    /// Requests handled and invalidation batches flushed so far, summed
    /// over every worker this device handed out.
    pub fn request_counts(&self) -> RequestCounts {
        self.counters.totals()
    }

    /// Ends a kick: one invalidation per consumer covering every UNMAP (and
    /// domain teardown) of the kick. Only after this returns may the transport
    /// publish the kick's used-ring entries.
    ///
    /// This is the one place where a kick waits for its consumers; the
    /// `no-consumer-wait` test mutation removes exactly this wait (the
    /// batch is then dropped untold, as if every consumer had confirmed).
    pub fn complete_kick(&self, w: &mut QueueContext) {
        let loaded = self.invalidators.load();
        let consumers: &[Arc<dyn Invalidator>] =
            if crate::mutation::active(crate::mutation::Mutation::NoConsumerWait) {
                &[]
            } else {
                &loaded
            };
        let pending = w.has_pending();
        let calls_before = w.invalidation_calls();
        // Timed only when there is a batch: most kicks (MAPs) have none.
        let started = pending.then(std::time::Instant::now);
        w.flush(consumers);
        if let Some(t0) = started {
            w.counters.invalidation_time(t0.elapsed());
            let calls = w.invalidation_calls().wrapping_sub(calls_before);
            w.counters.batch(calls);
        }
    }

    /// Registers a DMA consumer that caches translations.
    pub fn add_invalidator(&self, inv: Arc<dyn Invalidator>) {
        self.invalidators.rcu(|all| {
            let mut next = Vec::clone(all);
            next.push(Arc::clone(&inv));
            next
        });
    }

    /// Forgets a consumer registered with [`IommuDevice::add_invalidator`]
    /// (its device was unplugged); true if it was registered.
    pub fn remove_invalidator(&self, inv: &Arc<dyn Invalidator>) -> bool {
        let previous = self.invalidators.rcu(|all| {
            let mut next = Vec::clone(all);
            next.retain(|i| !Arc::ptr_eq(i, inv));
            next
        });
        previous.iter().any(|i| Arc::ptr_eq(i, inv))
    }

    /// Forgets a mirror registered with [`IommuDevice::add_map_mirror`];
    /// true if it was registered.
    pub fn remove_map_mirror(&self, m: &Arc<dyn MapMirror>) -> bool {
        let mut all = write(&self.mirrors);
        let before = all.len();
        all.retain(|x| !Arc::ptr_eq(x, m));
        self.has_mirrors.store(!all.is_empty(), Ordering::Release);
        all.len() != before
    }

    /// Registers a consumer to be told when an endpoint changes domain.
    pub fn add_endpoint_listener(&self, l: Arc<dyn EndpointListener>) {
        write(&self.listeners).push(l);
    }

    /// Registers a consumer that mirrors its endpoint's mappings (see
    /// [`MapMirror`]); register it as an invalidator too, for removals.
    pub fn add_map_mirror(&self, m: Arc<dyn MapMirror>) {
        write(&self.mirrors).push(m);
        self.has_mirrors.store(true, Ordering::Release);
    }

    /// Tells every listener and mirror; caller holds the topology lock.
    /// `identity`: the new domain is a bypass domain.
    fn notify_moved(&self, endpoint: u32, from: Option<u32>, to: Option<u32>, identity: bool) {
        if from == to {
            return;
        }
        for l in read(&self.listeners).iter() {
            l.endpoint_moved(endpoint, from, to);
        }
        for m in read(&self.mirrors).iter() {
            m.endpoint_moved(endpoint, to, identity);
        }
    }

    /// The DMA handle of an endpoint, for the device model doing its DMA.
    pub fn endpoint_dma(&self, endpoint_id: u32) -> Result<EndpointDma, DeviceError> {
        let ep = self
            .endpoints
            .get(endpoint_id)
            .ok_or(DeviceError::UnknownEndpoint(endpoint_id))?;
        Ok(EndpointDma::new(
            ep,
            Arc::clone(&self.bypass),
            Arc::clone(&self.faults),
        ))
    }

    /// Next fault event for the event queue, encoded.
    pub fn pop_fault_event(&self) -> Option<[u8; FAULT_SIZE]> {
        self.faults.pop()
    }

    /// The fault queue (counters for statistics and tests).
    pub fn faults(&self) -> &FaultQueue {
        &self.faults
    }

    /// Domain an endpoint is attached to, if any.
    pub fn endpoint_domain(&self, endpoint_id: u32) -> Option<u32> {
        self.endpoints
            .get(endpoint_id)
            .and_then(|e| e.domain())
            .map(|d| d.id())
    }

    /// Live domains.
    pub fn domain_count(&self) -> usize {
        self.domains.len()
    }

    /// Statistics of a live, non-bypass domain.
    pub fn domain_stats(&self, domain: u32) -> Option<SpaceStats> {
        self.domains
            .get(domain)
            .and_then(|d| d.space().map(|s| s.stats()))
    }

    /// Virtio device reset: every endpoint detached, every domain and mapping
    /// gone (invalidated at consumers before returning), pending fault events
    /// dropped, features to be renegotiated. `bypass` keeps its value.
    pub fn reset(&self) {
        let _t = lock(&self.topology);
        let mut w = self.new_worker();
        self.reset_locked(&mut w);
        self.complete_kick(&mut w);
        self.faults.clear();
        self.features.reset();
    }

    /// VM (system) reset: a device reset that also restores `bypass`.
    pub fn system_reset(&self) {
        self.reset();
        self.bypass.store(self.cfg.bypass, Ordering::Release);
    }
}
