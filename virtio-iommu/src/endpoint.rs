//! An endpoint (PCI requester ID) behind the vIOMMU and its attachment.
//!
//! WHY a per-endpoint `ArcSwapOption<Domain>`: the DMA path of a device
//! reads "which domain am I in" on every access, concurrently with the request
//! queues. A pointer load (RCU-style: attach/detach, which are rare, swap
//! the pointer; a reader keeps the domain it loaded alive until its access
//! ends) costs the DMA path no lock word and no shared reference count, so
//! readers of one endpoint never write a cache line another reader reads.
//! The swap is a SeqCst read-modify-write, so the quiescence argument
//! (`quiesce.rs`: the reader publishes its slot, then reads; the flush
//! writes, then reads the slots; the barrier pair of `barrier.rs` between
//! each side's write and reads) covers the attachment exactly as it
//! covered the old lock.
//!
//! A device thread does not even pay the pointer load's locked
//! instruction: it keeps the attachment it last saw in a per-thread cache
//! (`translate/attach_cache.rs`) and only compares pointers on each access;
//! [`AttachCell`] is what such a cache holds on to.
//!
//! A module of its own because the request side (`device`) and the DMA
//! side (`translate`) both use it.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::{ArcSwapOption, Guard};

use crate::domain::Domain;
use crate::wire::ResvMem;

/// A loaded attachment: keeps its domain alive without touching the
/// domain's reference count (short-lived: one access).
pub(crate) type Attached = Guard<Option<Arc<Domain>>>;

/// One endpoint behind the vIOMMU.
pub struct Endpoint {
    id: u32,
    /// Reserved regions specific to this endpoint (reported by PROBE after
    /// the global ones).
    resv: Vec<ResvMem>,
    attached: ArcSwapOption<Domain>,
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
            attached: ArcSwapOption::empty(),
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
        self.attached.load_full()
    }

    /// The attachment for one DMA access: no lock, no clone.
    #[inline]
    pub(crate) fn attached(&self) -> Attached {
        self.attached.load()
    }

    /// The endpoint's attachment cell, owned, for a per-thread cache.
    pub(crate) fn cell(self: &Arc<Self>) -> AttachCell {
        AttachCell(Arc::clone(self))
    }

    /// True if `cell` is this endpoint's attachment cell (a cache's key).
    #[inline]
    pub(crate) fn owns_cell(&self, cell: &ArcSwapOption<Domain>) -> bool {
        std::ptr::eq(&self.attached, cell)
    }

    /// Sets the attachment; returns the previous one. Caller holds the
    /// device's topology lock. Once this returns no new access sees the
    /// previous domain; accesses that loaded it before are the
    /// quiescer's to wait for, as they were with a lock (the lock, too, was
    /// released before the access used the domain).
    pub fn set_domain(&self, d: Option<Arc<Domain>>) -> Option<Arc<Domain>> {
        self.attached.swap(d)
    }
}

/// An endpoint's attachment cell, kept alive by the endpoint it belongs
/// to. WHY owned: a cache entry keyed by the cell's address must keep that
/// address from being reused by another endpoint while the entry exists.
#[derive(Clone)]
pub(crate) struct AttachCell(Arc<Endpoint>);

impl Deref for AttachCell {
    type Target = ArcSwapOption<Domain>;

    fn deref(&self) -> &ArcSwapOption<Domain> {
        &self.0.attached
    }
}
