//! Endpoints (PCI requester IDs) managed by the device and their attachment.
//!
//! WHY a per-endpoint `RwLock<Option<Arc<Domain>>>`: the DMA path of a device
//! reads "which domain am I in" on every access, concurrently with the request
//! queues; a read lock on the endpoint's own slot never contends with other
//! endpoints, and attach/detach (rare) swap the `Arc` atomically with respect
//! to readers. Endpoints are registered by the host (never by the guest), so
//! the table is bounded by the host's `max_endpoints` limit.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::domains::Domain;
use super::sync::{read, write};
use crate::wire::ResvMem;

/// One endpoint behind the vIOMMU.
pub struct Endpoint {
    id: u32,
    /// Reserved regions specific to this endpoint (reported by PROBE after
    /// the global ones).
    resv: Vec<ResvMem>,
    attached: RwLock<Option<Arc<Domain>>>,
}

impl Endpoint {
    pub fn new(id: u32, resv: Vec<ResvMem>) -> Self {
        Self {
            id,
            resv,
            attached: RwLock::new(None),
        }
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn resv(&self) -> &[ResvMem] {
        &self.resv
    }

    /// The domain this endpoint is attached to, if any.
    pub fn domain(&self) -> Option<Arc<Domain>> {
        read(&self.attached).clone()
    }

    /// Sets the attachment; returns the previous one. Caller holds the
    /// device's topology lock.
    pub fn set_domain(&self, d: Option<Arc<Domain>>) -> Option<Arc<Domain>> {
        std::mem::replace(&mut *write(&self.attached), d)
    }
}

/// All endpoints by id.
#[derive(Default)]
pub struct EndpointTable {
    map: RwLock<HashMap<u32, Arc<Endpoint>>>,
}

impl EndpointTable {
    pub fn get(&self, id: u32) -> Option<Arc<Endpoint>> {
        read(&self.map).get(&id).cloned()
    }

    pub fn len(&self) -> usize {
        read(&self.map).len()
    }

    /// Inserts unless present; returns false if the id already exists.
    pub fn insert(&self, ep: Endpoint) -> bool {
        let mut m = write(&self.map);
        if m.contains_key(&ep.id) {
            return false;
        }
        m.insert(ep.id, Arc::new(ep));
        true
    }

    /// Forgets an endpoint (its function was unplugged); returns it.
    pub fn remove(&self, id: u32) -> Option<Arc<Endpoint>> {
        write(&self.map).remove(&id)
    }

    pub fn all(&self) -> Vec<Arc<Endpoint>> {
        read(&self.map).values().cloned().collect()
    }
}
