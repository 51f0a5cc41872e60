//! Per-domain counters that do not bounce between request queues.
//!
//! WHY: a single shared `AtomicU64` for "live mappings", hit by every MAP and
//! UNMAP of every queue, would move one cache line between cores on every
//! request and undo the scalability of the table. The exact counters are
//! sharded by worker; the limit is enforced with per-worker credits reserved
//! in chunks from the domain (Linux's percpu_counter idea), falling back to
//! exact one-by-one reservation when the domain is more than half full so
//! the limit is never exceeded and, with one queue, never reported early.

use std::ops::Deref;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use super::Table;
use crate::mapping::{MapError, Worker};

/// Number of counter shards per domain.
pub(crate) const SHARDS: usize = 8;
/// Mappings a worker reserves at once while the domain is far from its limit.
const CHUNK: u64 = 32;

/// A value on its own cache-line pair (no false sharing with neighbours).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Padded<T>(T);

impl<T> Padded<T> {
    pub(crate) const fn new(v: T) -> Padded<T> {
        Padded(v)
    }
}

impl<T> Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// One shard of a domain's exact counters (may go negative alone; the sum
/// over shards is exact).
#[derive(Debug, Default)]
pub(crate) struct Shard {
    pub(crate) mappings: AtomicI64,
    pub(crate) bytes: AtomicI64,
}

/// Quota a worker holds for one domain.
#[derive(Debug)]
pub(crate) struct Credits {
    pub(crate) table: Arc<Table>,
    pub(crate) count: u64,
}

/// Sums the shards.
pub(crate) fn totals(t: &Table) -> (u64, u64) {
    let mut m = 0i64;
    let mut b = 0i64;
    for s in &t.shards {
        m += s.mappings.load(Ordering::Relaxed);
        b += s.bytes.load(Ordering::Relaxed);
    }
    (m.max(0) as u64, b.max(0) as u64)
}

/// Adds to this worker's shard of `t`'s counters.
#[inline]
pub(crate) fn account(t: &Table, w: &Worker, mappings: i64, bytes: i64) {
    let s = &t.shards[w.table.id % SHARDS];
    s.mappings.fetch_add(mappings, Ordering::Relaxed);
    s.bytes.fetch_add(bytes, Ordering::Relaxed);
}

/// Gives a worker's credits back to their domain.
pub(crate) fn release(w: &mut Worker) {
    if let Some(c) = w.table.credits.take() {
        if c.count > 0 {
            c.table.reserved.fetch_sub(c.count, Ordering::AcqRel);
        }
    }
}

/// Takes quota for one new mapping of `t`.
#[inline]
pub(crate) fn take(t: &Arc<Table>, w: &mut Worker) -> Result<(), MapError> {
    if let Some(c) = w.table.credits.as_mut() {
        if Arc::ptr_eq(&c.table, t) && c.count > 0 {
            c.count -= 1;
            return Ok(());
        }
    }
    take_slow(t, w)
}

fn take_slow(t: &Arc<Table>, w: &mut Worker) -> Result<(), MapError> {
    let max = t.limits.max_mappings;
    let mut chunk = if t.reserved.load(Ordering::Relaxed) + 2 * CHUNK <= max / 2 {
        CHUNK
    } else {
        1
    };
    loop {
        let prev = t.reserved.fetch_add(chunk, Ordering::AcqRel);
        if prev + chunk <= max {
            break;
        }
        t.reserved.fetch_sub(chunk, Ordering::AcqRel);
        if chunk == 1 {
            return Err(MapError::NoMemory);
        }
        chunk = 1;
    }
    let same = matches!(&w.table.credits, Some(c) if Arc::ptr_eq(&c.table, t));
    if !same {
        release(w);
        w.table.credits = Some(Credits {
            table: Arc::clone(t),
            count: 0,
        });
    }
    if let Some(c) = w.table.credits.as_mut() {
        c.count += chunk - 1;
    }
    Ok(())
}

/// Returns quota for `n` mappings of `t` that no longer exist (or were
/// never made).
#[inline]
pub(crate) fn give(t: &Arc<Table>, w: &mut Worker, n: u64) {
    if n == 0 {
        return;
    }
    if let Some(c) = w.table.credits.as_mut() {
        if Arc::ptr_eq(&c.table, t) {
            c.count += n;
            if c.count > 2 * CHUNK {
                let back = c.count - CHUNK;
                c.count = CHUNK;
                t.reserved.fetch_sub(back, Ordering::AcqRel);
            }
            return;
        }
    }
    t.reserved.fetch_sub(n, Ordering::AcqRel);
}
