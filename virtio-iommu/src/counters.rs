//! Request counters of a virtio-iommu device, for the VMM's API
//! (`vm.counters`) and its exit report.
//!
//! WHY one block per worker: the request path is built so that request
//! queues write no shared cache line (per-queue invalidation batches, per
//! worker node caches); a device-wide counter bumped by every request would
//! be one, bouncing between the CPUs that serve the queues. Each
//! request-queue worker owns one block, aligned to its own cache lines and
//! written only by that worker (plain load and store, no locked
//! instruction); a reader sums the blocks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::locks::Unpoison;

/// The request types a worker counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Counted {
    Attach,
    Detach,
    Map,
    Unmap,
    Probe,
    AttachTable,
    Invalidate,
}

/// One worker's counters. Only its worker writes them.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct CounterBlock {
    attach: AtomicU64,
    detach: AtomicU64,
    map: AtomicU64,
    unmap: AtomicU64,
    probe: AtomicU64,
    attach_table: AtomicU64,
    invalidate: AtomicU64,
    failed: AtomicU64,
    invalidation_batches: AtomicU64,
    invalidator_calls: AtomicU64,
    invalidate_ns: AtomicU64,
    invalidation_ns: AtomicU64,
}

/// Single-writer increment: no read-modify-write instruction needed.
fn bump(c: &AtomicU64, by: u64) {
    c.store(
        c.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

impl CounterBlock {
    /// One request of `kind`; `ok` when it was answered with S_OK.
    pub(crate) fn request(&self, kind: Counted, ok: bool) {
        let c = match kind {
            Counted::Attach => &self.attach,
            Counted::Detach => &self.detach,
            Counted::Map => &self.map,
            Counted::Unmap => &self.unmap,
            Counted::Probe => &self.probe,
            Counted::AttachTable => &self.attach_table,
            Counted::Invalidate => &self.invalidate,
        };
        bump(c, 1);
        if !ok {
            bump(&self.failed, 1);
        }
    }

    /// A request that could not be parsed (unknown type, too short).
    pub(crate) fn malformed(&self) {
        bump(&self.failed, 1);
    }

    /// A kick whose UNMAPs were flushed to the consumers in `calls`
    /// invalidator calls.
    pub(crate) fn batch(&self, calls: u64) {
        bump(&self.invalidation_batches, 1);
        bump(&self.invalidator_calls, calls);
    }

    /// Time one INVALIDATE took to handle (not timed for MAP and UNMAP:
    /// two clock reads would double their cost).
    pub(crate) fn invalidate_time(&self, d: std::time::Duration) {
        bump(&self.invalidate_ns, duration_ns(d));
    }

    /// Time one batch took to reach the consumers.
    pub(crate) fn invalidation_time(&self, d: std::time::Duration) {
        bump(&self.invalidation_ns, duration_ns(d));
    }

    fn add_to(&self, t: &mut RequestCounts) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        t.attach += get(&self.attach);
        t.detach += get(&self.detach);
        t.map += get(&self.map);
        t.unmap += get(&self.unmap);
        t.probe += get(&self.probe);
        t.attach_table += get(&self.attach_table);
        t.invalidate += get(&self.invalidate);
        t.failed += get(&self.failed);
        t.invalidation_batches += get(&self.invalidation_batches);
        t.invalidator_calls += get(&self.invalidator_calls);
        t.invalidate_ns += get(&self.invalidate_ns);
        t.invalidation_ns += get(&self.invalidation_ns);
    }
}

fn duration_ns(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The device's totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// ATTACH requests.
    pub attach: u64,
    /// DETACH requests.
    pub detach: u64,
    /// MAP requests.
    pub map: u64,
    /// UNMAP requests.
    pub unmap: u64,
    /// PROBE requests.
    pub probe: u64,
    /// ATTACH_TABLE requests (project page-table mode).
    pub attach_table: u64,
    /// INVALIDATE requests (project page-table mode).
    pub invalidate: u64,
    /// Requests answered with an error status, or not answered (malformed).
    pub failed: u64,
    /// Kicks whose UNMAPs were flushed to the DMA consumers, one batch each.
    pub invalidation_batches: u64,
    /// Invalidator calls those batches made (per consumer and domain).
    pub invalidator_calls: u64,
    /// Nanoseconds spent handling INVALIDATE requests (the table walk
    /// cache's removal), so a guest's flush cost splits into the device's
    /// share and the rest.
    pub invalidate_ns: u64,
    /// Nanoseconds the invalidation batches took to reach the consumers.
    pub invalidation_ns: u64,
}

/// Every block handed out, so that the totals survive the workers.
#[derive(Debug, Default)]
pub struct CounterRegistry {
    blocks: Mutex<Vec<Arc<CounterBlock>>>,
}

impl CounterRegistry {
    /// A block for a new worker. The block of a worker that is gone is
    /// reused (its counts carry on), so re-creating workers, at each device
    /// reset for example, does not grow the list: it holds at most as many
    /// blocks as workers ever lived at the same time.
    pub fn register(&self) -> Arc<CounterBlock> {
        let mut blocks = self.blocks.lock().unpoisoned();
        if let Some(free) = blocks.iter().find(|b| Arc::strong_count(b) == 1) {
            return Arc::clone(free);
        }
        let block = Arc::new(CounterBlock::default());
        blocks.push(Arc::clone(&block));
        block
    }

    /// The sum of every block.
    pub fn totals(&self) -> RequestCounts {
        let blocks = self.blocks.lock().unpoisoned();
        let mut t = RequestCounts::default();
        for b in blocks.iter() {
            b.add_to(&mut t);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_sum_every_worker_and_count_failures() {
        let r = CounterRegistry::default();
        let a = r.register();
        let b = r.register();
        a.request(Counted::Map, true);
        a.request(Counted::Map, false);
        b.request(Counted::Unmap, true);
        b.malformed();
        b.batch(3);
        a.invalidate_time(std::time::Duration::from_nanos(5));
        b.invalidate_time(std::time::Duration::from_nanos(7));
        b.invalidation_time(std::time::Duration::from_micros(1));
        let t = r.totals();
        assert_eq!((t.map, t.unmap, t.failed), (2, 1, 2));
        assert_eq!((t.invalidation_batches, t.invalidator_calls), (1, 3));
        assert_eq!((t.invalidate_ns, t.invalidation_ns), (12, 1000));
    }

    #[test]
    fn a_gone_worker_s_block_is_reused_and_its_counts_kept() {
        let r = CounterRegistry::default();
        let a = r.register();
        a.request(Counted::Attach, true);
        drop(a);
        for _ in 0..100 {
            let b = r.register();
            b.request(Counted::Attach, true);
        }
        assert_eq!(r.blocks.lock().map(|v| v.len()).unwrap_or(0), 1);
        assert_eq!(r.totals().attach, 101);
        let live = r.register();
        let other = r.register();
        assert!(
            !Arc::ptr_eq(&live, &other),
            "a live worker's block is never shared"
        );
    }

    #[test]
    fn blocks_do_not_share_cache_lines() {
        assert!(std::mem::align_of::<CounterBlock>() >= 128);
    }
}
