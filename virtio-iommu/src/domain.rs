//! A domain: one guest IOVA address space (or bypass) and the endpoints
//! attached to it.
//!
//! WHY a module of its own: both the request side (`device`) and the DMA
//! side (`translate`) hold domains; neither owns the type, so it sits below
//! both.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crate::locks::{lock, read, write};
use crate::pgtable::TableSlot;
use crate::space::{DomainSpace, Fault, Perm, Translation};
use crate::wire::ResvMem;

/// What a domain does with its endpoints' DMA.
pub enum DomainKind {
    /// Created with VIRTIO_IOMMU_ATTACH_F_BYPASS: identity translation, no
    /// MAP/UNMAP.
    Bypass,
    /// A translated address space.
    Mapped(Arc<dyn DomainSpace>),
}

/// One domain: its table plus the membership the device tracks for it.
pub struct Domain {
    id: u32,
    kind: DomainKind,
    /// Attached endpoints. Changed only under the device's topology lock.
    members: Mutex<BTreeSet<u32>>,
    /// Per-endpoint reserved regions of the members (global ones are checked
    /// separately); MAP over them is refused. Rebuilt on membership change.
    member_resv: RwLock<Vec<ResvMem>>,
    /// `!member_resv.is_empty()`, readable without touching the lock word
    /// (the common case, no per-endpoint regions, costs MAP one load).
    has_member_resv: AtomicBool,
    /// Page-table mode (project feature): the guest table walked on a
    /// miss, empty until ATTACH_TABLE.
    table: TableSlot,
}

impl Domain {
    pub fn new(id: u32, kind: DomainKind) -> Self {
        Self {
            id,
            kind,
            members: Mutex::new(BTreeSet::new()),
            member_resv: RwLock::new(Vec::new()),
            has_member_resv: AtomicBool::new(false),
            table: TableSlot::default(),
        }
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn is_bypass(&self) -> bool {
        matches!(self.kind, DomainKind::Bypass)
    }

    /// The translated space, or `None` for a bypass domain.
    pub fn space(&self) -> Option<&Arc<dyn DomainSpace>> {
        match &self.kind {
            DomainKind::Bypass => None,
            DomainKind::Mapped(s) => Some(s),
        }
    }

    /// The page-table mode state.
    pub fn table(&self) -> &TableSlot {
        &self.table
    }

    /// Translates one access of a translated domain: the domain table, and
    /// on a miss in table mode a walk of the guest's table (cached).
    /// `None` for a bypass domain.
    pub fn translate(&self, iova: u64, access: Perm) -> Option<Result<Translation, Fault>> {
        let space = self.space()?;
        Some(match space.translate(iova, access) {
            Err(Fault::Unmapped) => self.table.fill(space.as_ref(), iova, access),
            r => r,
        })
    }

    /// Attached endpoints.
    pub fn members(&self) -> Vec<u32> {
        lock(&self.members).iter().copied().collect()
    }

    pub fn member_count(&self) -> usize {
        lock(&self.members).len()
    }

    /// Adds a member and its reserved regions. Topology lock held by caller.
    pub fn add_member(&self, endpoint: u32, resv: &[ResvMem]) {
        lock(&self.members).insert(endpoint);
        let mut r = write(&self.member_resv);
        r.extend_from_slice(resv);
        self.has_member_resv.store(!r.is_empty(), Ordering::Release);
    }

    /// Removes a member; `resv_of` gives each remaining member's regions so
    /// the union can be rebuilt. Returns the remaining member count.
    pub fn remove_member(&self, endpoint: u32, resv_of: impl Fn(u32) -> Vec<ResvMem>) -> usize {
        let mut m = lock(&self.members);
        m.remove(&endpoint);
        let rebuilt: Vec<ResvMem> = m.iter().flat_map(|&e| resv_of(e)).collect();
        let mut r = write(&self.member_resv);
        *r = rebuilt;
        self.has_member_resv.store(!r.is_empty(), Ordering::Release);
        m.len()
    }

    /// True if `[start, end]` intersects a member's reserved region.
    pub fn overlaps_member_resv(&self, start: u64, end: u64) -> bool {
        if !self.has_member_resv.load(Ordering::Acquire) {
            return false;
        }
        read(&self.member_resv)
            .iter()
            .any(|r| r.start <= end && start <= r.end)
    }
}
