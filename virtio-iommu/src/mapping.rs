//! The public face of the per-domain IOVA address spaces: the contract
//! (re-exported from [`crate::space`]), the node depot, and the two
//! constructors that pick an implementation.
//!
//! WHY a facade: the project keeps two implementations side by side, the
//! scalable lock-free radix table ([`crate::table`]) and the lock-around-a-tree
//! design of today's VMMs ([`crate::baseline`]), selectable at run time, so the
//! benchmark and the integration tests compare like with like. The contract
//! they implement lives below both (`space.rs`); only this module knows
//! them all, and nothing inside the crate's implementations imports it.

use std::sync::Arc;

pub use crate::invalidation::Invalidator;
pub use crate::magazine::{Depot, DepotStats};
pub use crate::space::{
    DomainSpace, Fault, Limits, MapError, Perm, QueueContext, SpaceImpl, SpaceStats, Translation,
    UnknownSpaceImpl, UnmapError, GPA_MAX, HUGE_PAGE_SIZE, IOVA_BITS, IOVA_MAX, PAGE_SIZE,
};
use crate::table::TableWorker;

/// The per-worker state every [`QueueContext`] carries. The same state
/// serves both implementations (the baseline ignores the table's part),
/// so one type per build suffices and the contract (`space.rs`) calls its
/// hooks statically.
pub(crate) type WorkerImpl = TableWorker;

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

impl QueueContext {
    /// A worker drawing table nodes from `depot`. The same worker serves
    /// both implementations: the baseline ignores the table's state.
    pub fn new(depot: &Arc<Depot>) -> QueueContext {
        QueueContext::with_state(TableWorker::new(depot))
    }
}
