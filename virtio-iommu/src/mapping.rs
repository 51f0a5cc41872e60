//! The contract between request handling (the `device` module) and the
//! per-domain IOVA address spaces.
//!
//! WHY a trait: the project keeps two implementations side by side, the
//! scalable lock-free radix table ([`crate::table`]) and the lock-around-a-tree
//! design of today's VMMs ([`crate::baseline`]), selectable at run time, so the
//! benchmark and the integration tests compare like with like.
//!
//! Request flow: the thread serving one request queue owns one [`Worker`]. It
//! handles every request of a kick with that worker and then calls
//! [`Worker::flush`] once, before publishing the used-ring entries. The flush
//! invalidates every DMA consumer once for the merged ranges of the kick,
//! advances the translation epoch and only then recycles the table nodes the
//! UNMAPs emptied, so a guest never sees an UNMAP complete while a consumer
//! can still reach the page.

use std::fmt;
use std::ops::RangeInclusive;
use std::sync::Arc;

use crate::counters::CounterBlock;
use crate::invalidation::Batch;
use crate::magazine::NodeCache;
pub use crate::magazine::{Depot, DepotStats};
use crate::table::WorkerTableState;

/// Granule of every mapping (the device's `page_size_mask` is `!(PAGE_SIZE - 1)`).
pub const PAGE_SIZE: u64 = 4096;
/// Size of the large entries the scalable table uses where a MAP allows it.
pub const HUGE_PAGE_SIZE: u64 = 2 << 20;
/// Width of the IOVA space every domain offers (`input_range` is `0..=IOVA_MAX`).
pub const IOVA_BITS: u32 = 48;
/// Last valid IOVA of a domain.
pub const IOVA_MAX: u64 = (1u64 << IOVA_BITS) - 1;
/// Highest guest-physical address a mapping may target (52-bit like x86 and
/// arm64 hardware page tables; the table stores `gpa >> 12` in 40 bits).
pub const GPA_MAX: u64 = (1u64 << 52) - 1;

/// Access permissions; values equal the spec's `VIRTIO_IOMMU_MAP_F_*` bits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Perm(u32);

impl Perm {
    /// No access.
    pub const NONE: Perm = Perm(0);
    /// `VIRTIO_IOMMU_MAP_F_READ`.
    pub const READ: Perm = Perm(1);
    /// `VIRTIO_IOMMU_MAP_F_WRITE`.
    pub const WRITE: Perm = Perm(2);
    /// `VIRTIO_IOMMU_MAP_F_MMIO`.
    pub const MMIO: Perm = Perm(4);
    /// Read and write.
    pub const RW: Perm = Perm(3);
    /// Every flag this device knows.
    pub const ALL: Perm = Perm(7);

    /// Builds from the wire's flags; `None` if an unknown bit is set (the
    /// device answers `S_INVAL` to those).
    pub const fn from_bits(bits: u32) -> Option<Perm> {
        if bits & !Perm::ALL.0 != 0 {
            None
        } else {
            Some(Perm(bits))
        }
    }

    /// Builds from the wire's flags, dropping unknown bits.
    pub const fn from_bits_truncate(bits: u32) -> Perm {
        Perm(bits & Perm::ALL.0)
    }

    /// The wire value.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// True if every flag of `other` is in `self`.
    pub const fn contains(self, other: Perm) -> bool {
        self.0 & other.0 == other.0
    }

    /// Flags of both.
    pub const fn union(self, other: Perm) -> Perm {
        Perm(self.0 | other.0)
    }

    /// Flags in both.
    pub const fn intersection(self, other: Perm) -> Perm {
        Perm(self.0 & other.0)
    }

    /// True if no flag is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl std::ops::BitOr for Perm {
    type Output = Perm;
    fn bitor(self, rhs: Perm) -> Perm {
        self.union(rhs)
    }
}

impl fmt::Debug for Perm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = if self.contains(Perm::READ) { "r" } else { "-" };
        let w = if self.contains(Perm::WRITE) { "w" } else { "-" };
        let m = if self.contains(Perm::MMIO) { "m" } else { "-" };
        write!(f, "Perm({r}{w}{m})")
    }
}

/// Result of a successful translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    /// Guest-physical address of `iova`.
    pub gpa: u64,
    /// Contiguous bytes valid from `iova` (at least 1, never past the mapping).
    pub len: u64,
    /// Permissions of the mapping.
    pub perm: Perm,
}

/// Why a MAP failed; nothing was changed in any case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    /// The range overlaps an existing mapping (`VIRTIO_IOMMU_S_INVAL`).
    #[error("range overlaps an existing mapping")]
    Overlap,
    /// iova, gpa or size not page-aligned (`VIRTIO_IOMMU_S_RANGE`).
    #[error("range not aligned to the page size")]
    Unaligned,
    /// Outside the domain's input range or the guest-physical limit, or
    /// `last < iova` (`VIRTIO_IOMMU_S_RANGE`).
    #[error("range outside the domain's input range")]
    OutOfRange,
    /// A per-domain limit (mappings, table memory) is reached (`VIRTIO_IOMMU_S_NOMEM`).
    #[error("domain limit reached")]
    NoMemory,
}

/// Why an UNMAP failed; nothing was removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UnmapError {
    /// A mapping is only partly covered by the range (`VIRTIO_IOMMU_S_RANGE`):
    /// the spec forbids splitting a mapping.
    #[error("range would split a mapping")]
    WouldSplit,
}

/// Why a translation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Fault {
    /// No mapping covers the address.
    #[error("address not mapped")]
    Unmapped,
    /// A mapping covers the address but lacks a requested permission.
    #[error("access not permitted by the mapping")]
    Permission,
}

/// Counters of one domain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpaceStats {
    /// Number of mappings (MAP requests that succeeded and are not unmapped).
    pub mappings: u64,
    /// Bytes covered by those mappings.
    pub mapped_bytes: u64,
    /// Memory held by the domain's table (nodes, or tree records for the baseline).
    pub table_bytes: u64,
}

/// A DMA consumer outside the table (VFIO container, vhost-user back-end,
/// translation caches). Receives ONE call per flush and domain with the
/// merged ranges of that domain.
pub trait Invalidator: Send + Sync {
    /// Every translation of `domain` inside `ranges` cached by the consumer
    /// must be gone when this returns.
    fn invalidate(&self, domain: u32, ranges: &[RangeInclusive<u64>]);
}

/// One domain's IOVA address space. `iova..=last` ranges are inclusive like
/// the spec's `virt_start`/`virt_end`.
pub trait DomainSpace: Send + Sync {
    /// Adds the mapping `iova..=last -> gpa..` with `perm`.
    fn map(
        &self,
        w: &mut Worker,
        iova: u64,
        last: u64,
        gpa: u64,
        perm: Perm,
    ) -> Result<(), MapError>;
    /// Removes every mapping inside `iova..=last` (ranges with no mapping are
    /// fine; a mapping only partly covered => `WouldSplit` and nothing
    /// removed). Records the removed ranges in `w`'s batch.
    fn unmap(&self, w: &mut Worker, iova: u64, last: u64) -> Result<(), UnmapError>;
    /// Removes all mappings (domain destroyed or detached); also recorded in the batch.
    fn clear(&self, w: &mut Worker);
    /// Translates one access. Lock-free in the scalable implementation: DMA
    /// consumers call it on their own threads.
    fn translate(&self, iova: u64, access: Perm) -> Result<Translation, Fault>;
    /// Counters.
    fn stats(&self) -> SpaceStats;
}

/// Which [`DomainSpace`] implementation to build (`--iommu impl=baseline|scalable`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SpaceImpl {
    /// Lock-free radix table, magazines, batched invalidation.
    #[default]
    Scalable,
    /// One lock around an ordered map, one invalidation per UNMAP request.
    Baseline,
}

impl std::str::FromStr for SpaceImpl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "scalable" => Ok(SpaceImpl::Scalable),
            "baseline" => Ok(SpaceImpl::Baseline),
            other => Err(format!("unknown iommu impl '{other}' (baseline|scalable)")),
        }
    }
}

impl fmt::Display for SpaceImpl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SpaceImpl::Scalable => "scalable",
            SpaceImpl::Baseline => "baseline",
        })
    }
}

/// Per-domain bounds on what a guest can make the VMM allocate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Maximum live mappings in one domain.
    pub max_mappings: u64,
    /// Maximum table memory of one domain, in bytes.
    pub max_table_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_mappings: 1 << 20,
            max_table_bytes: 256 << 20,
        }
    }
}

/// Checks a MAP request's range; shared by both implementations so they
/// answer identically.
pub(crate) fn check_map_args(iova: u64, last: u64, gpa: u64) -> Result<(), MapError> {
    if last < iova {
        return Err(MapError::OutOfRange);
    }
    if (iova | gpa) & (PAGE_SIZE - 1) != 0 || last & (PAGE_SIZE - 1) != PAGE_SIZE - 1 {
        return Err(MapError::Unaligned);
    }
    if last > IOVA_MAX {
        return Err(MapError::OutOfRange);
    }
    match gpa.checked_add(last - iova) {
        Some(end) if end <= GPA_MAX => Ok(()),
        _ => Err(MapError::OutOfRange),
    }
}

/// Builds the address space of `domain`.
pub fn new_space(
    kind: SpaceImpl,
    domain: u32,
    limits: &Limits,
    depot: &Arc<Depot>,
) -> Arc<dyn DomainSpace> {
    match kind {
        SpaceImpl::Scalable => crate::table::new_scalable(domain, limits, depot),
        SpaceImpl::Baseline => Arc::new(crate::baseline::BaselineSpace::new(domain, limits)),
    }
}

/// Per-request-queue worker context, owned by the thread serving that queue:
/// magazines (per-worker caches of table nodes) and the pending invalidation
/// batch of the current kick.
///
/// WHY per worker: every piece of state a MAP or UNMAP writes besides the
/// table entries themselves lives here, so two queues never share a cache
/// line on the hot path. The struct is cache-line aligned for the same reason.
#[repr(align(128))]
pub struct Worker {
    pub(crate) depot: Arc<Depot>,
    pub(crate) nodes: NodeCache,
    pub(crate) batch: Batch,
    pub(crate) table: WorkerTableState,
    /// This worker's request counters (a device's workers share a
    /// registry; a bare worker keeps its own).
    pub(crate) counters: Arc<CounterBlock>,
}

impl Worker {
    /// A worker drawing table nodes from `depot`.
    pub fn new(depot: &Arc<Depot>) -> Worker {
        let id = depot.next_worker_id();
        Worker {
            depot: Arc::clone(depot),
            nodes: NodeCache::new(),
            batch: Batch::new(),
            table: WorkerTableState::new(id),
            counters: Arc::default(),
        }
    }

    /// Ends a kick: retires table nodes emptied by this kick's UNMAPs,
    /// invalidates every consumer once for the merged ranges, advances the
    /// translation epoch, and only then returns the retired nodes to the
    /// magazines. Call it before publishing the kick's used-ring entries.
    pub fn flush(&mut self, consumers: &[Arc<dyn Invalidator>]) {
        crate::table::retire_candidates(self);
        // The cached leaf link is re-validated on use anyway; dropping it
        // each kick bounds how long a stale one can be kept.
        self.table.leaf_cache = None;
        let had_work = self.batch.flush(consumers);
        if had_work || !self.table.deferred.is_empty() {
            self.depot.advance_epoch();
        }
        while let Some(node) = self.table.deferred.pop() {
            self.nodes.free(&self.depot, node);
        }
        crate::table::trim_credits(self);
    }

    /// True if UNMAPs were recorded since the last flush.
    pub fn has_pending(&self) -> bool {
        !self.batch.is_empty()
    }

    /// Invalidator calls made by this worker's flushes so far (for benchmarks).
    pub fn invalidation_calls(&self) -> u64 {
        self.batch.calls()
    }

    /// Table nodes cached in this worker's magazines.
    pub fn cached_nodes(&self) -> u64 {
        self.nodes.cached()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Nothing to invalidate at this point that a flush would not have
        // covered; the device flushes before dropping. Return the cached
        // nodes so the depot's counts stay balanced.
        crate::table::retire_candidates(self);
        while let Some(node) = self.table.deferred.pop() {
            self.nodes.free(&self.depot, node);
        }
        crate::table::release_credits(self);
        self.nodes.drain_to(&self.depot);
    }
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("id", &self.table.id)
            .field("cached_nodes", &self.nodes.cached())
            .finish()
    }
}
