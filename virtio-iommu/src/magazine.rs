//! Magazine caches of table nodes (Bonwick & Adams, "Magazines and vmem",
//! USENIX ATC 2001), as used by Peleg et al. for per-core IOVA caching.
//!
//! WHY: table nodes are allocated and freed on the MAP/UNMAP path of every
//! request queue. A global allocator lock (or the system allocator's own
//! contention) would serialise the queues again. Each worker keeps two
//! magazines of up to [`MAGAZINE_SIZE`] nodes and only touches the locked
//! depot once every `MAGAZINE_SIZE` allocations or frees, to swap a whole
//! magazine.
//!
//! Nodes never go back to the system allocator while the depot lives (the
//! lock-free readers rely on type-stable memory, see `table/node.rs`); the
//! depot frees them when the last table and worker using it are gone.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::locks::Unpoison;
use crate::node::NodePtr;

/// Nodes per magazine.
pub const MAGAZINE_SIZE: usize = 16;

/// A stack of at most [`MAGAZINE_SIZE`] free nodes.
#[derive(Debug, Default)]
struct Magazine(Vec<NodePtr>);

impl Magazine {
    fn empty() -> Magazine {
        Magazine(Vec::with_capacity(MAGAZINE_SIZE))
    }
    fn is_full(&self) -> bool {
        self.0.len() >= MAGAZINE_SIZE
    }
}

#[derive(Debug, Default)]
struct DepotInner {
    full: Vec<Magazine>,
    empty: Vec<Magazine>,
}

/// Counters of a depot (for tests and benchmarks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DepotStats {
    /// Nodes ever taken from the system allocator (and not yet given back).
    pub allocated: u64,
    /// Free nodes held in the depot's full magazines.
    pub in_depot: u64,
    /// Times a worker swapped a magazine with the depot (lock acquisitions).
    pub exchanges: u64,
    /// Translation epoch: advanced by every flush that invalidated something.
    pub epoch: u64,
}

/// The shared back end of all workers' magazines, plus the translation epoch.
#[derive(Debug)]
pub struct Depot {
    inner: Mutex<DepotInner>,
    allocated: AtomicU64,
    exchanges: AtomicU64,
    epoch: AtomicU64,
    workers: AtomicUsize,
}

impl Default for Depot {
    fn default() -> Self {
        Depot {
            inner: Mutex::new(DepotInner::default()),
            allocated: AtomicU64::new(0),
            exchanges: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            workers: AtomicUsize::new(0),
        }
    }
}

impl Depot {
    /// An empty depot.
    pub fn new() -> Depot {
        Depot::default()
    }

    /// Current translation epoch. A consumer caching translations may keep
    /// an entry only while the epoch it was filled in is current.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    pub(crate) fn advance_epoch(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn next_worker_id(&self) -> usize {
        self.workers.fetch_add(1, Ordering::Relaxed)
    }

    /// Counters.
    pub fn stats(&self) -> DepotStats {
        let in_depot = match self.inner.lock() {
            Ok(g) => g.full.iter().map(|m| m.0.len() as u64).sum(),
            Err(p) => p.get_ref().full.iter().map(|m| m.0.len() as u64).sum(),
        };
        DepotStats {
            allocated: self.allocated.load(Ordering::Relaxed),
            in_depot,
            exchanges: self.exchanges.load(Ordering::Relaxed),
            epoch: self.epoch(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DepotInner> {
        // A panic while holding this lock cannot leave the vectors
        // inconsistent (push/pop only), so a poisoned lock is still usable.
        self.exchanges.fetch_add(1, Ordering::Relaxed);
        self.inner.lock().unpoisoned()
    }

    /// Trades an empty magazine for a full one, if the depot has one.
    fn swap_for_full(&self, empty: Magazine) -> Result<Magazine, Magazine> {
        let mut g = self.lock();
        match g.full.pop() {
            Some(full) => {
                g.empty.push(empty);
                Ok(full)
            }
            None => Err(empty),
        }
    }

    /// Trades a full magazine for an empty one.
    fn swap_for_empty(&self, full: Magazine) -> Magazine {
        let mut g = self.lock();
        g.full.push(full);
        g.empty.pop().unwrap_or_else(Magazine::empty)
    }

    /// Takes one node without a worker (table roots are allocated when a
    /// domain is created, outside any kick).
    pub(crate) fn alloc_direct(&self) -> NodePtr {
        {
            let mut g = self.lock();
            if let Some(m) = g.full.last_mut() {
                if let Some(n) = m.0.pop() {
                    if m.0.is_empty() {
                        if let Some(e) = g.full.pop() {
                            g.empty.push(e);
                        }
                    }
                    return n;
                }
            }
        }
        self.allocated.fetch_add(1, Ordering::Relaxed);
        NodePtr::alloc()
    }

    /// Returns nodes without a worker (a dropped table).
    pub(crate) fn free_direct(&self, nodes: Vec<NodePtr>) {
        if nodes.is_empty() {
            return;
        }
        let mut g = self.lock();
        let mut cur = g.empty.pop().unwrap_or_else(Magazine::empty);
        for n in nodes {
            if cur.is_full() {
                g.full.push(cur);
                cur = g.empty.pop().unwrap_or_else(Magazine::empty);
            }
            cur.0.push(n);
        }
        if cur.0.is_empty() {
            g.empty.push(cur);
        } else {
            g.full.push(cur);
        }
    }
}

impl Drop for Depot {
    fn drop(&mut self) {
        // Every table and worker holds an Arc<Depot>: none is left, so no
        // reader can reach these nodes any more.
        let inner = std::mem::take(self.inner.get_mut().unpoisoned());
        for m in inner.full {
            for n in m.0 {
                n.free_to_system();
            }
        }
    }
}

/// A worker's pair of magazines (Bonwick's `loaded` and `previous`).
#[derive(Debug)]
pub(crate) struct NodeCache {
    loaded: Magazine,
    previous: Magazine,
}

impl NodeCache {
    pub(crate) fn new() -> NodeCache {
        NodeCache {
            loaded: Magazine::empty(),
            previous: Magazine::empty(),
        }
    }

    /// Nodes cached in this worker.
    pub(crate) fn cached(&self) -> u64 {
        (self.loaded.0.len() + self.previous.0.len()) as u64
    }

    /// One free node: from the loaded magazine, else the previous one, else a
    /// full magazine from the depot, else the system allocator.
    pub(crate) fn alloc(&mut self, depot: &Depot) -> NodePtr {
        if let Some(n) = self.loaded.0.pop() {
            return n;
        }
        if !self.previous.0.is_empty() {
            std::mem::swap(&mut self.loaded, &mut self.previous);
            if let Some(n) = self.loaded.0.pop() {
                return n;
            }
        }
        let empty = std::mem::replace(&mut self.loaded, Magazine(Vec::new()));
        match depot.swap_for_full(empty) {
            Ok(full) => self.loaded = full,
            Err(empty) => self.loaded = empty,
        }
        if let Some(n) = self.loaded.0.pop() {
            return n;
        }
        depot.allocated.fetch_add(1, Ordering::Relaxed);
        NodePtr::alloc()
    }

    /// Caches a free node (its entries must all be zero).
    pub(crate) fn free(&mut self, depot: &Depot, node: NodePtr) {
        if self.loaded.is_full() {
            if self.previous.0.is_empty() {
                std::mem::swap(&mut self.loaded, &mut self.previous);
            } else {
                let full = std::mem::replace(&mut self.previous, Magazine(Vec::new()));
                self.previous = std::mem::replace(&mut self.loaded, Magazine(Vec::new()));
                self.loaded = depot.swap_for_empty(full);
            }
        }
        self.loaded.0.push(node);
    }

    /// Gives every cached node back to the depot (worker going away).
    pub(crate) fn drain_to(&mut self, depot: &Depot) {
        let mut all = std::mem::take(&mut self.loaded.0);
        all.append(&mut self.previous.0);
        depot.free_direct(all);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magazines_recycle_through_the_depot() {
        let depot = Depot::new();
        let mut a = NodeCache::new();
        let mut b = NodeCache::new();
        let nodes: Vec<NodePtr> = (0..3 * MAGAZINE_SIZE).map(|_| a.alloc(&depot)).collect();
        assert_eq!(depot.stats().allocated, 3 * MAGAZINE_SIZE as u64);
        for n in nodes {
            a.free(&depot, n);
        }
        // Two magazines stay in the worker, the rest went to the depot.
        assert_eq!(a.cached(), 2 * MAGAZINE_SIZE as u64);
        assert_eq!(depot.stats().in_depot, MAGAZINE_SIZE as u64);
        // Another worker gets the depot's magazine instead of new memory.
        let n = b.alloc(&depot);
        assert_eq!(depot.stats().allocated, 3 * MAGAZINE_SIZE as u64);
        b.free(&depot, n);
        a.drain_to(&depot);
        b.drain_to(&depot);
        assert_eq!(depot.stats().in_depot, depot.stats().allocated);
    }
}
