//! Per-domain counters that do not bounce between request queues.
//!
//! WHY: a single shared `AtomicU64` for "live mappings", hit by every MAP and
//! UNMAP of every queue, would move one cache line between cores on every
//! request and undo the scalability of the table. The exact counters are
//! sharded by worker; the limit is enforced with per-worker credits reserved
//! in chunks from the domain (Linux's percpu_counter idea), falling back to
//! exact one-by-one reservation when the domain is more than half full, and
//! given back at the end of every kick. So the limit is never exceeded, and
//! a MAP is refused early only while another queue is in the middle of a
//! kick holding credits it reserved when the domain was less than half full
//! (at most 64 mappings per such queue).

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{Ctx, Table};
use crate::space::{MapError, PAGE_SIZE};

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

/// One shard of a domain's exact counters: mappings in the bits above
/// [`MAPPINGS_SHIFT`], mapped 4 KiB pages below, so one add updates both.
/// A shard alone may "go negative" (one queue maps, another unmaps); the
/// wrapping sum over all shards is exact as long as the domain holds fewer
/// than 2^28 mappings and 2^36 pages (the whole 48-bit IOVA space).
///
/// WHY owners: a locked add per MAP and per UNMAP cost as much as the
/// table entry's own compare-and-swap. Shards 1.. are claimed by at most
/// one worker at a time (`owner`, the worker's id + 1, taken with its
/// credits for the domain and given back with them); the owner is their
/// only writer, so it updates its shard with a plain load and store.
/// Shard 0 is never owned: a worker without a shard of this domain (more
/// workers than shards, or an UNMAP on a domain it holds no credits for)
/// adds to it atomically.
#[derive(Debug, Default)]
pub(crate) struct Shard {
    pub(crate) packed: AtomicU64,
    owner: AtomicU64,
}

impl Shard {
    /// Adds the packed delta `d` as the shard's owner, its only writer.
    #[inline(always)]
    pub(crate) fn add_owned(&self, d: u64) {
        // No locked instruction (see `Shard`). Relaxed like the add it
        // replaces: `totals` is a sum of independent counters, not a
        // synchronisation point.
        self.packed.store(
            self.packed.load(Ordering::Relaxed).wrapping_add(d),
            Ordering::Relaxed,
        );
    }
}

const MAPPINGS_SHIFT: u32 = 36;
const PAGES_MASK: u64 = (1 << MAPPINGS_SHIFT) - 1;

/// Quota a worker holds for one domain.
#[derive(Debug)]
pub(crate) struct Credits {
    pub(crate) table: Arc<Table>,
    pub(crate) count: u64,
    /// The shard of `table` this worker owns, if it got one.
    shard: Option<usize>,
}

impl Credits {
    /// The shard of `t` this worker owns, if these are `t`'s credits and it
    /// got one: what the one-page fast paths (`page.rs`) need to account a
    /// mapping without a locked instruction.
    #[inline(always)]
    pub(crate) fn owned_shard<'a>(&self, t: &'a Table) -> Option<&'a Shard> {
        if !std::ptr::eq(Arc::as_ptr(&self.table), t) {
            return None;
        }
        self.shard.and_then(|i| t.shards.get(i)).map(|s| &**s)
    }

    /// Takes back `n` released mappings of `t` (this worker's table) as
    /// credits, returning to the table what goes beyond two chunks so an
    /// idle worker does not hoard another's quota.
    #[inline]
    pub(crate) fn take_back(&mut self, t: &Table, n: u64) {
        self.count += n;
        if self.count > 2 * CHUNK {
            let back = self.count - CHUNK;
            self.count = CHUNK;
            t.reserved.fetch_sub(back, Ordering::AcqRel);
        }
    }
}

/// Sums the shards.
pub(crate) fn totals(t: &Table) -> (u64, u64) {
    let sum = t.shards.iter().fold(0u64, |acc, s| {
        acc.wrapping_add(s.packed.load(Ordering::Relaxed))
    });
    (sum >> MAPPINGS_SHIFT, (sum & PAGES_MASK) * PAGE_SIZE)
}

/// The packed delta for `mappings` mappings covering `bytes` bytes.
#[inline]
pub(crate) fn delta(mappings: u64, bytes: u64) -> u64 {
    (mappings << MAPPINGS_SHIFT).wrapping_add(bytes / PAGE_SIZE)
}

/// Adds `d` (a packed delta, wrapping) to this worker's shard of `t`.
#[inline]
fn apply(t: &Table, w: &Ctx, d: u64) {
    if let Some(sh) = w
        .state
        .table
        .credits
        .as_ref()
        .and_then(|c| c.owned_shard(t))
    {
        sh.add_owned(d);
        return;
    }
    t.shards[0].packed.fetch_add(d, Ordering::Relaxed);
}

/// Adds mappings to this worker's shard of `t`'s counters.
#[inline]
pub(crate) fn add(t: &Table, w: &Ctx, mappings: u64, bytes: u64) {
    apply(t, w, delta(mappings, bytes));
}

/// Takes mappings off this worker's shard of `t`'s counters (wrapping: see
/// [`Shard`] for why a shard may go below zero).
#[inline]
pub(crate) fn remove(t: &Table, w: &Ctx, mappings: u64, bytes: u64) {
    apply(t, w, delta(mappings, bytes).wrapping_neg());
}

/// [`remove`] and [`give`] of `mappings` that an UNMAP removed, with one
/// look-up of the worker's credits.
#[inline]
pub(crate) fn removed(t: &Arc<Table>, w: &mut Ctx, mappings: u64, bytes: u64) {
    let d = delta(mappings, bytes).wrapping_neg();
    if let Some(c) = w.state.table.credits.as_mut() {
        if Arc::ptr_eq(&c.table, t) {
            match c.shard.and_then(|i| t.shards.get(i)) {
                Some(sh) => sh.add_owned(d),
                None => {
                    t.shards[0].packed.fetch_add(d, Ordering::Relaxed);
                }
            }
            c.take_back(t, mappings);
            return;
        }
    }
    t.shards[0].packed.fetch_add(d, Ordering::Relaxed);
    t.reserved.fetch_sub(mappings, Ordering::AcqRel);
}

/// Gives a worker's credits back to their domain.
pub(crate) fn release(w: &mut Ctx) {
    if let Some(c) = w.state.table.credits.take() {
        if c.count > 0 {
            c.table.reserved.fetch_sub(c.count, Ordering::AcqRel);
        }
        if let Some(sh) = c.shard.and_then(|i| c.table.shards.get(i)) {
            // Publishes our last plain stores to the next owner's claim.
            sh.owner.store(0, Ordering::Release);
        }
    }
}

/// Claims a shard of `t` for worker `id` (its preferred one only: a busy
/// shard means this worker uses shard 0).
fn claim_shard(t: &Table, id: usize) -> Option<usize> {
    let i = 1 + id % (SHARDS - 1);
    let owner = u64::try_from(id).ok()?.checked_add(1)?;
    let sh = t.shards.get(i)?;
    // Acquire: sees the previous owner's last stores (its release).
    sh.owner
        .compare_exchange(0, owner, Ordering::Acquire, Ordering::Relaxed)
        .ok()
        .map(|_| i)
}

/// End of a kick: gives the unused credits back, so that once every queue
/// has finished its kick the limit is exact (a held credit would make
/// another queue's MAP fail early). The reference to the domain is kept so
/// the next kick does not touch the domain's reference count.
pub(crate) fn trim(w: &mut Ctx) {
    if let Some(c) = w.state.table.credits.as_mut() {
        if c.count > 0 {
            c.table.reserved.fetch_sub(c.count, Ordering::AcqRel);
            c.count = 0;
        }
    }
}

/// Takes quota for one new mapping of `t`.
#[inline]
pub(crate) fn take(t: &Arc<Table>, w: &mut Ctx) -> Result<(), MapError> {
    if let Some(c) = w.state.table.credits.as_mut() {
        if Arc::ptr_eq(&c.table, t) && c.count > 0 {
            c.count -= 1;
            return Ok(());
        }
    }
    take_slow(t, w)
}

fn take_slow(t: &Arc<Table>, w: &mut Ctx) -> Result<(), MapError> {
    let max = t.limits.max_mappings;
    let mut chunk = if t.reserved.load(Ordering::Relaxed).saturating_add(2 * CHUNK) <= max / 2 {
        CHUNK
    } else {
        1
    };
    loop {
        let prev = t.reserved.fetch_add(chunk, Ordering::AcqRel);
        if prev.saturating_add(chunk) <= max {
            break;
        }
        t.reserved.fetch_sub(chunk, Ordering::AcqRel);
        if chunk == 1 {
            return Err(MapError::NoMemory);
        }
        chunk = 1;
    }
    let same = matches!(&w.state.table.credits, Some(c) if Arc::ptr_eq(&c.table, t));
    if !same {
        release(w);
        w.state.table.credits = Some(Credits {
            table: Arc::clone(t),
            count: 0,
            shard: claim_shard(t, w.state.table.id),
        });
    }
    if let Some(c) = w.state.table.credits.as_mut() {
        c.count += chunk - 1;
    }
    Ok(())
}

/// Returns quota for `n` mappings of `t` that no longer exist (or were
/// never made).
#[inline]
pub(crate) fn give(t: &Arc<Table>, w: &mut Ctx, n: u64) {
    if n == 0 {
        return;
    }
    if let Some(c) = w.state.table.credits.as_mut() {
        if Arc::ptr_eq(&c.table, t) {
            c.take_back(t, n);
            return;
        }
    }
    t.reserved.fetch_sub(n, Ordering::AcqRel);
}
