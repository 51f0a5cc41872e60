//! The scalable domain table: a 4-level radix table of atomic entries in the
//! shape of a hardware IOMMU page table (9 IOVA bits per level over a 48-bit
//! space, 4 KiB leaves at level 0, 2 MiB at level 1, 1 GiB at level 2).
//!
//! WHY: MAP and UNMAP on disjoint ranges touch disjoint entries, so they run
//! on different request queues without a domain-wide lock; translators
//! (emulated devices' DMA) read the table with plain acquire loads.
//!
//! The protocol in one paragraph. A one-entry MAP or UNMAP is one
//! compare-and-swap on the entry (`ops.rs`). A MAP or UNMAP over several
//! entries claims every slot of its range in ascending address order
//! (`PENDING` for a MAP, invisible to translators; `LOCKED` for an UNMAP),
//! waits for slots another operation holds, then either publishes or rolls
//! back (`range.rs`); ascending order makes the waits deadlock-free and the
//! claims make overlapping requests linearizable. Every node counts its
//! non-empty slots plus the pins of operations working inside it (`live`,
//! which also names the node's incarnation, `live.rs`); a node whose count
//! drops to zero is unlinked by locking its parent slot and moving `live`
//! to the next incarnation by one compare-and-swap (a pin is a
//! compare-and-swap on the same word), and goes to the worker's
//! deferred list, recycled only by the flush (`retire.rs`). Unlinking bumps
//! the node's generation, which the parent entry also records, so a lock-free
//! reader that followed a stale link notices and retries.

mod audit;
pub mod entry;
mod held;
mod leaf_hint;
mod live;
mod ops;
mod page;
mod quota;
mod range;
mod retire;
mod sweep;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::magazine::{Depot, NodeCache};
use crate::node::{self, Node, NodePtr, NODE_BYTES};
use crate::space::{
    DomainSpace, Fault, Limits, MapError, Parts, Perm, QueueContext, SpaceStats, Translation,
    UnmapError, WorkerState,
};
pub use audit::{Audit, AuditError};
pub(crate) use quota::Padded;
use quota::{Credits, Shard, SHARDS};
use retire::{release_credits, retire_at_flush, retire_candidates, trim_credits};

/// Level of the root node.
pub(crate) const ROOT_LEVEL: u32 = 3;

/// Highest level holding leaves: 1 GiB entries at level 2 (2 MiB at 1).
pub(crate) const MAX_LEAF_LEVEL: u32 = 2;

/// Bit position of the lowest IOVA bit a level indexes.
#[inline]
pub(crate) const fn shift(level: u32) -> u32 {
    12 + 9 * level
}

/// Bytes one entry of `level` covers.
#[inline]
pub(crate) const fn span(level: u32) -> u64 {
    1u64 << shift(level)
}

/// Slot of `iova` in a node of `level`.
#[inline]
pub(crate) const fn index(iova: u64, level: u32) -> usize {
    ((iova >> shift(level)) & 511) as usize
}

/// Waits politely for another operation to release an entry: spin a little,
/// then give the core away (the holder may be preempted on a busy host).
#[inline]
pub(crate) fn backoff(spins: &mut u32) {
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
    *spins = spins.saturating_add(1);
}

/// A node whose `live` count reached zero, to try to unlink at the flush.
#[derive(Debug)]
pub(crate) struct Candidate {
    pub(crate) table: Arc<Table>,
    /// Any IOVA inside the node.
    pub(crate) iova: u64,
    /// Level of the node.
    pub(crate) level: u32,
}

/// A node pinned by a range operation, unpinned when it ends.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pin {
    pub(crate) node: u64,
    pub(crate) iova: u64,
    pub(crate) level: u32,
}

/// Table state private to one worker.
#[derive(Debug)]
pub(crate) struct WorkerTableState {
    pub(crate) id: usize,
    /// Nodes unlinked during this kick, recycled by the flush.
    pub(crate) deferred: Vec<NodePtr>,
    /// Nodes that became empty during this kick.
    pub(crate) candidates: Vec<Candidate>,
    /// Scratch list of a range operation's pins (kept for its capacity).
    pub(crate) pins: Vec<Pin>,
    /// Mapping-count quota reserved from one domain.
    pub(crate) credits: Option<Credits>,
    /// The leaf node this worker's one-page MAPs and UNMAPs work in,
    /// pinned across them (`held.rs`).
    pub(crate) held: Option<held::HeldLeaf>,
    /// Empty nodes kept linked across a flush (`retire.rs`).
    pub(crate) hot: retire::Hot,
    /// Slots visited by this worker's range walks and sweeps: the cost
    /// measure `invalidate_cost_follows_live_entries` asserts on.
    pub(crate) visited_slots: u64,
}

impl WorkerTableState {
    pub(crate) fn new(id: usize) -> WorkerTableState {
        WorkerTableState {
            id,
            deferred: Vec::new(),
            candidates: Vec::new(),
            pins: Vec::new(),
            credits: None,
            held: None,
            hot: retire::Hot::default(),
            visited_slots: 0,
        }
    }
}

/// What the scalable table keeps per worker (behind [`WorkerState`], so
/// the contract in `space.rs` does not know it): the magazines of table
/// nodes and the retire lists and quota of [`WorkerTableState`].
pub(crate) struct TableWorker {
    pub(crate) depot: Arc<Depot>,
    pub(crate) nodes: NodeCache,
    pub(crate) table: WorkerTableState,
}

impl TableWorker {
    /// A worker's table state drawing nodes from `depot`.
    pub(crate) fn new(depot: &Arc<Depot>) -> TableWorker {
        TableWorker {
            depot: Arc::clone(depot),
            nodes: NodeCache::new(),
            table: WorkerTableState::new(depot.next_worker_id()),
        }
    }

    /// Returns the nodes unlinked during the kick to the magazines.
    fn recycle_deferred(&mut self) {
        while let Some(node) = self.table.deferred.pop() {
            self.nodes.free(&self.depot, node);
        }
    }
}

impl WorkerState for TableWorker {
    fn before_invalidate(w: &mut Ctx) {
        // First: the hold's count goes back into `live`, so a leaf the kick
        // emptied is a candidate like any other.
        held::release(w);
        retire_at_flush(w);
    }

    fn after_invalidate(w: &mut Ctx, invalidated: bool) {
        if invalidated || !w.state.table.deferred.is_empty() {
            w.state.depot.advance_epoch();
        }
        w.state.recycle_deferred();
        trim_credits(w);
    }

    fn release(w: &mut Ctx) {
        held::release(w);
        retire_candidates(w);
        w.state.recycle_deferred();
        release_credits(w);
        w.state.nodes.drain_to(&w.state.depot);
    }

    fn id(&self) -> usize {
        self.table.id
    }

    fn cached_nodes(&self) -> u64 {
        self.nodes.cached()
    }
}

/// One worker as the table's operations see it: its table state and the
/// kick's invalidation batch, side by side behind one reference.
pub(crate) type Ctx = Parts<TableWorker>;

/// The table's view of a worker built by `QueueContext::new`.
#[inline]
fn ctx(w: &mut QueueContext) -> &mut Ctx {
    w.parts()
}

/// The shared part of a scalable domain.
pub(crate) struct Table {
    pub(crate) domain: u32,
    pub(crate) limits: Limits,
    pub(crate) depot: Arc<Depot>,
    /// Address of the root node (owned by the table, never unlinked).
    root: u64,
    /// Non-root nodes linked (or being linked) in the table.
    pub(crate) nodes: Padded<AtomicU64>,
    /// Mapping quota reserved by workers (live mappings plus their credits).
    pub(crate) reserved: Padded<AtomicU64>,
    /// Exact mapping and byte counters, one shard per worker id modulo SHARDS.
    pub(crate) shards: [Padded<Shard>; SHARDS],
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("domain", &self.domain)
            .field("nodes", &self.nodes.load(Ordering::Relaxed))
            .finish()
    }
}

impl Table {
    fn new(domain: u32, limits: &Limits, depot: &Arc<Depot>) -> Table {
        let root = depot.alloc_direct().into_addr();
        Table {
            domain,
            limits: *limits,
            depot: Arc::clone(depot),
            root,
            nodes: Padded::new(AtomicU64::new(0)),
            reserved: Padded::new(AtomicU64::new(0)),
            shards: std::array::from_fn(|_| Padded::new(Shard::default())),
        }
    }

    /// The root node.
    #[inline]
    pub(crate) fn root(&self) -> &Node {
        // SAFETY: the root is owned by the table for its whole life.
        unsafe { node::node_at(self.root) }
    }

    /// A node linked (now or earlier) in this table.
    #[inline]
    pub(crate) fn node(&self, addr: u64) -> &Node {
        // SAFETY: `addr` comes from a directory entry of this table; nodes
        // are type-stable while the depot (held by `self`) lives.
        unsafe { node::node_at(addr) }
    }

    /// Identity of the table recorded in its nodes (`Node::owner`).
    #[inline]
    pub(crate) fn id(&self) -> u64 {
        self as *const Table as u64
    }

    /// Table memory: the root plus linked nodes.
    pub(crate) fn table_bytes(&self) -> u64 {
        (self.nodes.load(Ordering::Relaxed) + 1) * NODE_BYTES
    }
}

/// A scalable domain space.
#[derive(Debug)]
pub struct ScalableSpace {
    table: Arc<Table>,
    /// Translation's shortcut to leaf nodes (`leaf_hint.rs`).
    hints: leaf_hint::LeafHints,
}

/// Builds a scalable space.
pub(crate) fn new_scalable(
    domain: u32,
    limits: &Limits,
    depot: &Arc<Depot>,
) -> Arc<dyn DomainSpace> {
    Arc::new(ScalableSpace::new(domain, limits, depot))
}

impl ScalableSpace {
    /// An empty domain whose nodes come from `depot`.
    pub fn new(domain: u32, limits: &Limits, depot: &Arc<Depot>) -> ScalableSpace {
        ScalableSpace {
            table: Arc::new(Table::new(domain, limits, depot)),
            hints: leaf_hint::LeafHints::new(),
        }
    }

    /// Bytes of an empty table (the root node only).
    pub const EMPTY_TABLE_BYTES: u64 = NODE_BYTES;

    /// Checks that the table's redundant state agrees (live counts, head
    /// and tail markers, counters, node count). Only meaningful while no
    /// request is in progress on the domain; for tests and debugging.
    pub fn audit(&self) -> Result<Audit, AuditError> {
        audit::audit(&self.table)
    }
}

impl DomainSpace for ScalableSpace {
    fn map(
        &self,
        w: &mut QueueContext,
        iova: u64,
        last: u64,
        gpa: u64,
        perm: Perm,
    ) -> Result<(), MapError> {
        ops::map(&self.table, ctx(w), iova, last, gpa, perm)
    }

    fn unmap(&self, w: &mut QueueContext, iova: u64, last: u64) -> Result<(), UnmapError> {
        ops::unmap(&self.table, ctx(w), iova, last)
    }

    fn clear(&self, w: &mut QueueContext) {
        ops::clear(&self.table, ctx(w))
    }

    fn invalidate(&self, w: &mut QueueContext, iova: u64, last: u64) -> Result<(), UnmapError> {
        ops::invalidate(&self.table, ctx(w), iova, last)
    }

    fn translate(&self, iova: u64, access: Perm) -> Result<Translation, Fault> {
        leaf_hint::translate(self, iova, access)
    }

    fn stats(&self) -> SpaceStats {
        let (mappings, mapped_bytes) = quota::totals(&self.table);
        SpaceStats {
            mappings,
            mapped_bytes,
            table_bytes: self.table.table_bytes(),
        }
    }
}
