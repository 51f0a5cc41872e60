//! The one-page MAP and UNMAP of a worker that holds the page's leaf and
//! owns a counter shard of its domain: one compare-and-swap on the entry,
//! everything else in worker-private memory.
//!
//! WHY a path of its own: a guest's ring of DMA buffers is almost only
//! such requests, and the general path (`ops.rs`) paid more for finding
//! the case (which level, a hold or a pin, a quota look-up, a counter
//! look-up, each an `Option` or a `Result` to unpack) than for the
//! compare-and-swap itself. Here every check is made up front on plain
//! worker state; anything unusual returns `false` before the first write,
//! and the caller runs the general path from scratch, which handles every
//! case (overlaps, claims of range operations, directories, quota).
//!
//! Why that is the same protocol: the entry still moves by one
//! compare-and-swap, from empty to the mapping (MAP) or from exactly the
//! loaded one-page mapping to empty (UNMAP), so two queues racing on one
//! IOVA are still ordered by the entry: one MAP wins and the other sees a
//! non-empty entry (refused by the general path with `S_INVAL`), one UNMAP
//! wins and the other sees the entry gone (nothing left to remove). A
//! range operation's claim (`PENDING`, `LOCKED`) fails the compare or the
//! bit test, so the fast path never writes inside a claimed range. The
//! accounting is what the general path does for a held leaf (`held.rs`:
//! the private delta) and an owned shard (`quota.rs`: the plain store).

use std::sync::atomic::Ordering::{AcqRel, Acquire, SeqCst};

use super::entry::{self, DIR, HEAD, LOCKED, PENDING, TAIL, VALID};
use super::{index, quota, Ctx, Table};
use crate::space::{Perm, GPA_MAX, IOVA_MAX, PAGE_SIZE};

/// The bits that tell an entry is exactly one visible, unclaimed mapping
/// of one page: what an UNMAP of that page may remove by itself.
const KIND: u64 = VALID | DIR | HEAD | TAIL | PENDING | LOCKED;

/// MAP of the one page `iova..=last` to `gpa`. True if done; false if
/// nothing was changed and the general path must decide.
#[inline(always)]
pub(super) fn map(t: &Table, w: &mut Ctx, iova: u64, last: u64, gpa: u64, perm: Perm) -> bool {
    // `check_map_args` for a one-page range: aligned, inside both spaces.
    if last.wrapping_sub(iova) != PAGE_SIZE - 1
        || (iova | gpa) & (PAGE_SIZE - 1) != 0
        || last > IOVA_MAX
        || gpa > GPA_MAX - (PAGE_SIZE - 1)
    {
        return false;
    }
    let tw = &mut w.state.table;
    let (Some(h), Some(c)) = (tw.held.as_mut(), tw.credits.as_mut()) else {
        return false;
    };
    if !h.covers(t, iova) || !h.has_room(true) || c.count == 0 {
        return false;
    }
    let Some(sh) = c.owned_shard(t) else {
        return false;
    };
    let n = h.node(t);
    let i = index(iova, 0);
    let value = entry::leaf(gpa, perm, true, true) | VALID;
    if n.entries[i]
        .compare_exchange(0, value, SeqCst, Acquire)
        .is_err()
    {
        return false;
    }
    n.mark(i);
    h.filled_within_room();
    c.count -= 1;
    sh.add_owned(quota::delta(1, PAGE_SIZE));
    true
}

/// UNMAP of the one page `iova..=last` when a one-page mapping fills it.
/// True if removed (and recorded in the kick's batch); false if nothing was
/// changed and the general path must decide.
#[inline(always)]
pub(super) fn unmap(t: &Table, w: &mut Ctx, iova: u64, last: u64) -> bool {
    if last.wrapping_sub(iova) != PAGE_SIZE - 1 || iova & (PAGE_SIZE - 1) != 0 || last > IOVA_MAX {
        return false;
    }
    let tw = &mut w.state.table;
    let (Some(h), Some(c)) = (tw.held.as_mut(), tw.credits.as_mut()) else {
        return false;
    };
    if !h.covers(t, iova) || !h.has_room(false) {
        return false;
    }
    let Some(sh) = c.owned_shard(t) else {
        return false;
    };
    let slot = &h.node(t).entries[index(iova, 0)];
    let e = slot.load(Acquire);
    if e & KIND != VALID | HEAD | TAIL || slot.compare_exchange(e, 0, AcqRel, Acquire).is_err() {
        return false;
    }
    h.emptied_within_room();
    c.take_back(t, 1);
    sh.add_owned(quota::delta(1, PAGE_SIZE).wrapping_neg());
    w.batch.record(t.domain, iova, last);
    true
}

#[cfg(test)]
mod tests;
