//! The contract between request handling (the `device` module) and the
//! per-domain IOVA address spaces: the [`DomainSpace`] trait, the values it
//! takes and returns, and the per-thread [`QueueContext`] it is called with.
//!
//! WHY a module of its own, below every implementation: the scalable table
//! (`crate::table`) and the baseline (`crate::baseline`) both implement this
//! trait, so the trait must not know either of them. The worker's
//! implementation-specific state (the table's node magazines, retire lists
//! and mapping quota) sits behind [`WorkerState`]; this module only says
//! when a flush calls it, and learns the one type a build uses from the
//! facade's alias (`crate::mapping::WorkerImpl`), not from the table.
//! `crate::mapping` is the public facade that puts the implementations
//! together.
//!
//! Request flow: the thread serving one request queue owns one [`QueueContext`]. It
//! handles every request of a kick with that worker and then calls
//! [`QueueContext::flush`] once, before publishing the used-ring entries. The flush
//! invalidates every DMA consumer once for the merged ranges of the kick,
//! advances the translation epoch and only then recycles the table nodes the
//! UNMAPs emptied, so a guest never sees an UNMAP complete while a consumer
//! can still reach the page.

use std::fmt;
use std::sync::Arc;

use crate::counters::CounterBlock;
use crate::invalidation::{Batch, Invalidator};
use crate::mapping::WorkerImpl;

/// Granule of every mapping (the device's `page_size_mask` is `!(PAGE_SIZE - 1)`).
pub const PAGE_SIZE: u64 = 4096;
/// [`PAGE_SIZE`] as a length, for memory APIs that take a `usize`.
pub const PAGE_LEN: usize = 4096;
const _: () = assert!(PAGE_LEN as u64 == PAGE_SIZE);
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

/// One domain's IOVA address space. `iova..=last` ranges are inclusive like
/// the spec's `virt_start`/`virt_end`.
pub trait DomainSpace: Send + Sync {
    /// Adds the mapping `iova..=last -> gpa..` with `perm`.
    fn map(
        &self,
        w: &mut QueueContext,
        iova: u64,
        last: u64,
        gpa: u64,
        perm: Perm,
    ) -> Result<(), MapError>;
    /// Removes every mapping inside `iova..=last` (ranges with no mapping are
    /// fine; a mapping only partly covered => `WouldSplit` and nothing
    /// removed). Records the removed ranges in `w`'s batch.
    fn unmap(&self, w: &mut QueueContext, iova: u64, last: u64) -> Result<(), UnmapError>;
    /// Removes all mappings (domain destroyed or detached); also recorded in the batch.
    fn clear(&self, w: &mut QueueContext);
    /// [`DomainSpace::unmap`] for a caller that keeps every MAP out of the
    /// range meanwhile (page-table mode's INVALIDATE, under the domain's
    /// fill lock). Same result; the scalable table then removes cached
    /// one-page walks at a cost that follows them, not the range.
    fn invalidate(&self, w: &mut QueueContext, iova: u64, last: u64) -> Result<(), UnmapError> {
        self.unmap(w, iova, last)
    }
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

/// A [`SpaceImpl`] name that is neither `baseline` nor `scalable`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown iommu impl '{name}' (baseline|scalable)")]
pub struct UnknownSpaceImpl {
    /// The name given.
    pub name: String,
}

impl std::str::FromStr for SpaceImpl {
    type Err = UnknownSpaceImpl;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "scalable" => Ok(SpaceImpl::Scalable),
            "baseline" => Ok(SpaceImpl::Baseline),
            other => Err(UnknownSpaceImpl { name: other.into() }),
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

/// What one [`DomainSpace`] implementation keeps per worker, and what it
/// must do around the kick's invalidation.
///
/// WHY a trait: the contract decides the order of a flush (retire, then
/// invalidate, then recycle) without knowing what is retired or recycled.
/// The hooks get the state together with the kick's batch ([`Parts`]).
/// The one type a build uses is named by the facade
/// (`crate::mapping::WorkerImpl`), so every call here is static: no
/// virtual call, no type check, no cast on the MAP/UNMAP path.
pub(crate) trait WorkerState: Sized + Send + 'static {
    /// Before the consumers are invalidated (unlink what the kick emptied).
    fn before_invalidate(w: &mut Parts<Self>);
    /// After the invalidation; `invalidated` tells whether any consumer was
    /// called (recycle what no consumer can reach any more).
    fn after_invalidate(w: &mut Parts<Self>, invalidated: bool);
    /// The worker is going away: give everything back.
    fn release(w: &mut Parts<Self>);
    /// The worker's number within its node depot.
    fn id(&self) -> usize;
    /// Table nodes cached by this worker.
    fn cached_nodes(&self) -> u64;
}

/// One worker's implementation state and the kick's invalidation batch,
/// side by side in one allocation.
///
/// WHY together: a MAP or UNMAP reaches both through one pointer (what
/// [`QueueContext::parts`] returns), so the table's operations need no
/// per-request context of several references.
pub(crate) struct Parts<S> {
    /// The pending invalidation batch of the current kick.
    pub(crate) batch: Batch,
    /// The implementation's per-worker state.
    pub(crate) state: S,
}

/// Per-request-queue worker context, owned by the thread serving that queue:
/// the pending invalidation batch of the current kick, the request counters
/// and the implementation's own per-worker state (for the scalable table:
/// magazines of table nodes, retire lists, mapping quota).
///
/// WHY per worker: every piece of state a MAP or UNMAP writes besides the
/// table entries themselves lives here, so two queues never share a cache
/// line on the hot path. The struct is cache-line aligned for the same reason.
#[repr(align(128))]
pub struct QueueContext {
    /// This worker's request counters (a device's workers share a
    /// registry; a bare worker keeps its own).
    pub(crate) counters: Arc<CounterBlock>,
    /// The state and the batch, boxed so the context stays one cache line
    /// of pointers whatever the state's size.
    parts: Box<Parts<WorkerImpl>>,
}

impl QueueContext {
    /// A worker around the build's per-worker state.
    pub(crate) fn with_state(state: WorkerImpl) -> QueueContext {
        QueueContext {
            counters: Arc::default(),
            parts: Box::new(Parts {
                batch: Batch::new(),
                state,
            }),
        }
    }

    /// The implementation's state with the kick's batch: one field access,
    /// no check (the type is fixed at compile time).
    #[inline]
    pub(crate) fn parts(&mut self) -> &mut Parts<WorkerImpl> {
        &mut self.parts
    }

    /// The kick's invalidation batch.
    pub(crate) fn batch_mut(&mut self) -> &mut Batch {
        &mut self.parts.batch
    }

    /// Ends a kick: retires table nodes emptied by this kick's UNMAPs,
    /// invalidates every consumer once for the merged ranges, advances the
    /// translation epoch, and only then returns the retired nodes to the
    /// magazines. Call it before publishing the kick's used-ring entries.
    pub fn flush(&mut self, consumers: &[Arc<dyn Invalidator>]) {
        WorkerImpl::before_invalidate(&mut self.parts);
        let had_work = self.parts.batch.flush(consumers);
        WorkerImpl::after_invalidate(&mut self.parts, had_work);
    }

    /// True if UNMAPs were recorded since the last flush.
    pub fn has_pending(&self) -> bool {
        !self.parts.batch.is_empty()
    }

    /// Invalidator calls made by this worker's flushes so far (for benchmarks).
    pub fn invalidation_calls(&self) -> u64 {
        self.parts.batch.calls()
    }

    /// Table nodes cached in this worker's magazines.
    pub fn cached_nodes(&self) -> u64 {
        self.parts.state.cached_nodes()
    }
}

impl Drop for QueueContext {
    fn drop(&mut self) {
        // Nothing to invalidate at this point that a flush would not have
        // covered; the device flushes before dropping. The state gives its
        // cached nodes and quota back so the depot's counts stay balanced.
        WorkerImpl::release(&mut self.parts);
    }
}

impl fmt::Debug for QueueContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueContext")
            .field("id", &self.parts.state.id())
            .field("cached_nodes", &self.parts.state.cached_nodes())
            .finish()
    }
}
