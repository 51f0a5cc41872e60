//! An endpoint (PCI requester ID) behind the vIOMMU and its attachment.
//!
//! WHY a per-endpoint `RwLock<Option<Arc<Domain>>>`: the DMA path of a device
//! reads "which domain am I in" on every access, concurrently with the request
//! queues; a read lock on the endpoint's own slot never contends with other
//! endpoints, and attach/detach (rare) swap the `Arc` atomically with respect
//! to readers. A module of its own because the request side (`device`) and
//! the DMA side (`translate`) both use it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use crate::domain::Domain;
use crate::locks::{read, write};
use crate::wire::ResvMem;

/// One endpoint behind the vIOMMU.
pub struct Endpoint {
    id: u32,
    /// Reserved regions specific to this endpoint (reported by PROBE after
    /// the global ones).
    resv: Vec<ResvMem>,
    attached: RwLock<Option<Arc<Domain>>>,
    /// Its DMA does not go through the device's translation (a VFIO
    /// function behind a host IOMMU): its domain must use explicit MAPs,
    /// never a guest page table.
    explicit_maps: AtomicBool,
}

impl Endpoint {
    pub fn new(id: u32, resv: Vec<ResvMem>) -> Self {
        Self {
            id,
            resv,
            attached: RwLock::new(None),
            explicit_maps: AtomicBool::new(false),
        }
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn resv(&self) -> &[ResvMem] {
        &self.resv
    }

    /// True if this endpoint needs explicit MAPs (no page-table mode).
    pub fn explicit_maps(&self) -> bool {
        self.explicit_maps.load(Ordering::Acquire)
    }

    pub fn set_explicit_maps(&self) {
        self.explicit_maps.store(true, Ordering::Release);
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
