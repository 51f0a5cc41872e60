//! Domains and the domain registry.
//!
//! WHY this shape: MAP/UNMAP (the hot path, possibly from several request
//! queues at once) only needs "domain id -> its table". The registry is a
//! `RwLock<HashMap>` behind per-thread lookup caches (see `lookup.rs`): a
//! request reads one generation counter and then works on the domain's own
//! concurrent table with no device-wide lock held and no shared cache line
//! written. Creating and destroying domains (ATTACH/DETACH,
//! rare) take the write lock briefly, serialized by the device's topology
//! mutex so membership bookkeeping never races.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::lookup::{next_uid, with_cached};
use super::sync::{lock, read, write};

use crate::mapping::DomainSpace;
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
}

impl Domain {
    pub fn new(id: u32, kind: DomainKind) -> Self {
        Self {
            id,
            kind,
            members: Mutex::new(BTreeSet::new()),
            member_resv: RwLock::new(Vec::new()),
            has_member_resv: AtomicBool::new(false),
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

/// Live domains by id.
pub struct DomainRegistry {
    /// Process-unique id keying the per-thread lookup caches.
    uid: u64,
    /// Bumped (inside the write lock) by every insert/remove, invalidating
    /// every thread's cached lookups.
    gen: AtomicU64,
    map: RwLock<HashMap<u32, Arc<Domain>>>,
}

impl Default for DomainRegistry {
    fn default() -> Self {
        Self {
            uid: next_uid(),
            gen: AtomicU64::new(0),
            map: RwLock::new(HashMap::new()),
        }
    }
}

impl DomainRegistry {
    /// Locked lookup (topology paths and cache misses).
    pub fn get(&self, id: u32) -> Option<Arc<Domain>> {
        read(&self.map).get(&id).cloned()
    }

    /// Hot-path lookup: runs `f` with the domain, through the calling
    /// thread's cache (no shared cache line written while the registry is
    /// unchanged).
    pub fn with<R>(&self, id: u32, f: impl FnMut(Option<&Arc<Domain>>) -> R) -> R {
        let gen = self.gen.load(Ordering::Acquire);
        with_cached(self.uid, gen, id, || self.get(id), f)
    }

    pub fn len(&self) -> usize {
        read(&self.map).len()
    }

    pub fn insert(&self, d: Arc<Domain>) {
        let mut m = write(&self.map);
        m.insert(d.id(), d);
        self.gen.fetch_add(1, Ordering::Release);
    }

    pub fn remove(&self, id: u32) -> Option<Arc<Domain>> {
        let mut m = write(&self.map);
        let d = m.remove(&id);
        self.gen.fetch_add(1, Ordering::Release);
        d
    }

    /// Removes every domain (device reset).
    pub fn drain(&self) -> Vec<Arc<Domain>> {
        let mut m = write(&self.map);
        let all = m.drain().map(|(_, d)| d).collect();
        self.gen.fetch_add(1, Ordering::Release);
        all
    }
}
