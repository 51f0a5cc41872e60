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
//! instructions: it keeps the attachment it last saw in a per-thread cache
//! (`translate/attach_cache.rs`) and only compares the endpoint's count of
//! attachment changes with the one it saw, one plain load per access.
//!
//! A module of its own because the request side (`device`) and the DMA
//! side (`translate`) both use it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
    /// Attachment changes so far, counted after each swap: what a
    /// per-thread cache compares to know its domain is still the current
    /// one (see [`Endpoint::changes`]).
    changes: AtomicU64,
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
            changes: AtomicU64::new(0),
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

    /// Attachment changes so far. A cache that loaded the attachment
    /// after reading `n` here holds a domain at least as new as the `n`-th
    /// change (the count is bumped after the swap, and this load is an
    /// Acquire); while this still reads `n`, the domain is current, except
    /// for an access racing a change, which the quiescer waits for (see
    /// `translate/attach_cache.rs`).
    #[inline]
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Sets the attachment; returns the previous one. Caller holds the
    /// device's topology lock. Once this returns no new access sees the
    /// previous domain; accesses that loaded it before are the
    /// quiescer's to wait for, as they were with a lock (the lock, too, was
    /// released before the access used the domain).
    pub fn set_domain(&self, d: Option<Arc<Domain>>) -> Option<Arc<Domain>> {
        let old = self.attached.swap(d);
        // After the swap, and before the kick's barrier like it: a cache
        // that sees the new count loads the new domain.
        self.changes.fetch_add(1, Ordering::SeqCst);
        old
    }
}
