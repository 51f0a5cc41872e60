//! INVALIDATE's removal: a sweep over the marked entries of a span.
//!
//! WHY not the range walk of `range.rs`: that walk claims every slot of its
//! span inside the nodes it meets (empty ones too, to keep MAPs out while
//! it decides), so a page-table INVALIDATE of a flush batch spread over a
//! sparse span paid for the span, not for the cached walks it removed. A
//! sweep reads each node's occupancy bits (`Node::occupied`) and visits
//! only marked entries: its cost follows the live entries.
//!
//! Its contract is narrower than UNMAP's, and it says so by giving up: it
//! removes only whole one-entry mappings inside the span (what a table
//! walk caches), each with one compare-and-swap like a one-page UNMAP; on
//! anything else (a larger mapping, an entry another operation holds, a
//! node being retired) it stops and the caller runs the full range walk
//! over the span, which removes the rest. A span that would split a
//! mapping at either end goes to the range walk before anything is
//! removed, so it answers `WouldSplit` having removed nothing. The caller
//! excludes concurrent MAPs into the span (page-table mode: the domain's
//! fill lock); a MAP that slips in anyway (a guest racing its own
//! ATTACH_TABLE) is ordered after the sweep, and since every removal is of
//! a whole one-entry mapping, no mapping is ever half removed. Every
//! removal is recorded in the kick's batch, whose flush invalidates the
//! consumers before any node is recycled, exactly as for an UNMAP.

use std::sync::atomic::Ordering::{AcqRel, Acquire, SeqCst};
use std::sync::Arc;

use super::entry::{self, DIR, HEAD, LOCKED, PENDING, TAIL, VALID};
use super::{index, quota, range, span, Ctx, Pin, Table, ROOT_LEVEL};
use crate::node::{self, Node};

/// More removed mappings than this are reported to the consumers as one
/// covering range (bounds the batch, as for an UNMAP).
const MAX_RECORDS: u64 = 64;

/// The sweep met something only the full range walk handles.
struct GiveUp;

/// What a sweep removed so far.
#[derive(Default)]
struct Tally {
    mappings: u64,
    bytes: u64,
    first: u64,
    end: u64,
}

/// Bits of word `wi` of a node's occupancy covering slots `first..=last`.
fn word_mask(wi: usize, first: usize, last: usize) -> u64 {
    let lo = (wi * 64).max(first) - wi * 64;
    let hi = (wi * 64 + 63).min(last) - wi * 64;
    (u64::MAX >> (63 - hi)) & (u64::MAX << lo)
}

/// The slots of `n` in `first..=last` whose occupancy bit is set, in
/// order; each occupancy word is loaded once, when the walk reaches it.
/// WHY one iterator: the generic sweep and its leaf loop walk the bits
/// alike. Its state is the loops' own (word index, its remaining bits),
/// so inlined it keeps them in registers as the loops written out did.
struct Marked<'a> {
    n: &'a Node,
    first: usize,
    last: usize,
    /// The word `bits` came from.
    wi: usize,
    /// Its marked slots not yet returned.
    bits: u64,
}

fn marked(n: &Node, first: usize, last: usize) -> Marked<'_> {
    let wi = first / 64;
    // An empty range (`first > last` across words) loads nothing.
    let bits = match n.occupied.get(wi) {
        Some(w) if wi <= last / 64 => w.load(SeqCst) & word_mask(wi, first, last),
        _ => 0,
    };
    Marked {
        n,
        first,
        last,
        wi,
        bits,
    }
}

impl Iterator for Marked<'_> {
    type Item = usize;

    #[inline(always)]
    fn next(&mut self) -> Option<usize> {
        while self.bits == 0 {
            if self.wi >= self.last / 64 {
                return None;
            }
            self.wi += 1;
            let word = self.n.occupied.get(self.wi)?;
            self.bits = word.load(SeqCst) & word_mask(self.wi, self.first, self.last);
        }
        let i = self.wi * 64 + self.bits.trailing_zeros() as usize;
        self.bits &= self.bits - 1;
        Some(i)
    }
}

/// Removes the marked one-entry mappings of `n` (at `level`, based at
/// `base`) inside `lo..=hi`, descending into marked children.
#[allow(clippy::too_many_arguments)]
fn remove_marked(
    t: &Table,
    w: &mut Ctx,
    n: &Node,
    level: u32,
    base: u64,
    lo: u64,
    hi: u64,
    tally: &mut Tally,
) -> Result<(), GiveUp> {
    if level == 0 {
        return remove_leaf(t, w, n, base, lo, hi, tally);
    }
    let sz = span(level);
    let (first, last) = (index(lo, level), index(hi, level));
    let mut removed = 0u64;
    let mut result = Ok(());
    for i in marked(n, first, last) {
        w.state.table.visited_slots += 1;
        let Some(slot) = n.entries.get(i) else {
            result = Err(GiveUp);
            break;
        };
        let s_base = base + i as u64 * sz;
        let s_last = s_base + (sz - 1);
        let e = slot.load(Acquire);
        if e == 0 {
            // A mark left by an earlier removal: dropped here, where
            // it is found, so removals themselves never pay for it.
            n.unmark(i);
            continue;
        }
        if entry::is_dir(e) {
            if e & LOCKED != 0 || level == 0 {
                result = Err(GiveUp);
                break;
            }
            let child = t.node(entry::addr(e));
            if !t.pin(child, e, node::tag(s_base, level - 1)) {
                result = Err(GiveUp);
                break;
            }
            w.state.table.pins.push(Pin {
                node: entry::addr(e),
                iova: s_base,
                level: level - 1,
            });
            let (sub_lo, sub_hi) = (lo.max(s_base), hi.min(s_last));
            result = remove_marked(t, w, child, level - 1, s_base, sub_lo, sub_hi, tally);
            if result.is_err() {
                break;
            }
            continue;
        }
        let whole = e & (HEAD | TAIL) == HEAD | TAIL && lo <= s_base && s_last <= hi;
        if !entry::is_valid(e) || entry::is_transient(e) || !whole {
            result = Err(GiveUp);
            break;
        }
        if slot.compare_exchange(e, 0, AcqRel, Acquire).is_err() {
            result = Err(GiveUp);
            break;
        }
        removed += 1;
        if tally.mappings < MAX_RECORDS {
            w.batch.record(t.domain, s_base, s_last);
        }
        if tally.mappings == 0 {
            tally.first = s_base;
        }
        tally.mappings += 1;
        tally.bytes += sz;
        tally.end = s_last;
    }
    if removed > 0 && level < ROOT_LEVEL {
        // Never reaches zero here: the sweep's pin is still counted.
        n.live.fetch_sub(removed, AcqRel);
    }
    result
}

/// `remove_marked` at the leaf level, where every marked entry of a
/// sparse batch is: the same checks and the same one compare-and-swap per
/// entry, in a loop of its own.
///
/// WHY apart: inside the generic loop the per-entry path shared its
/// registers with the descent and the batch record, and reloaded six
/// spilled values and stored four tally fields per removed entry
/// (cachegrind on `invalidate_sparse`: 67 instructions per visited slot,
/// 54 before the table work changed the inlining). Here the span's ends
/// are checked once per node, the entry's state bits in one compare, the
/// tally is counted in locals and the record, taken by the first 64
/// removals only, is out of line: 37 per visited slot.
fn remove_leaf(
    t: &Table,
    w: &mut Ctx,
    n: &Node,
    base: u64,
    lo: u64,
    hi: u64,
    tally: &mut Tally,
) -> Result<(), GiveUp> {
    let sz = span(0);
    // Checked once here instead of per entry: with page-aligned ends
    // inside this node's range, every slot between `first` and `last` lies
    // wholly inside `lo..=hi`, so a one-page mapping there is whole.
    let node_last = base.checked_add(span(1) - 1).ok_or(GiveUp)?;
    if lo < base || hi > node_last || lo > hi || lo & (sz - 1) != 0 || hi & (sz - 1) != sz - 1 {
        return Err(GiveUp);
    }
    let (first, last) = (index(lo, 0), index(hi, 0));
    let records_left = MAX_RECORDS.saturating_sub(tally.mappings);
    let mut removed = 0u64;
    let mut visited = 0u64;
    let mut last_removed = None;
    let mut result = Ok(());
    for i in marked(n, first, last) {
        visited += 1;
        let Some(slot) = n.entries.get(i) else {
            result = Err(GiveUp);
            break;
        };
        let e = slot.load(Acquire);
        if e == 0 {
            // As in `remove_marked`: a stale mark, dropped where found.
            n.unmark(i);
            continue;
        }
        // Visible, whole (head and tail: one page), held by no other
        // operation, not a directory (corrupt at this level): else the
        // range walk decides.
        if e & (VALID | DIR | HEAD | TAIL | PENDING | LOCKED) != VALID | HEAD | TAIL {
            result = Err(GiveUp);
            break;
        }
        if slot.compare_exchange(e, 0, AcqRel, Acquire).is_err() {
            result = Err(GiveUp);
            break;
        }
        if removed < records_left {
            let s_base = base + i as u64 * sz;
            record_first(t, w, tally, removed, s_base, s_base + (sz - 1));
        }
        removed += 1;
        last_removed = Some(i);
    }
    w.state.table.visited_slots += visited;
    if let Some(i) = last_removed {
        tally.mappings += removed;
        tally.bytes += removed * sz;
        tally.end = base + i as u64 * sz + (sz - 1);
        // Never reaches zero here: the sweep's pin is still counted.
        n.live.fetch_sub(removed, AcqRel);
    }
    result
}

/// Records a removal among the sweep's first `MAX_RECORDS` in the kick's
/// batch (`in_node`: removals before it in this node); out of line so the
/// leaf loop keeps its registers.
#[cold]
#[inline(never)]
fn record_first(t: &Table, w: &mut Ctx, tally: &mut Tally, in_node: u64, s_base: u64, s_last: u64) {
    w.batch.record(t.domain, s_base, s_last);
    if tally.mappings + in_node == 0 {
        tally.first = s_base;
    }
}

/// Sweeps `lo..=hi` (page-aligned ends, within the IOVA space). False if
/// the caller must run the range walk over the span (what the sweep
/// removed is removed and recorded either way).
pub(crate) fn run(t: &Arc<Table>, w: &mut Ctx, lo: u64, hi: u64) -> bool {
    if range::would_split(t, lo, hi) {
        return false;
    }
    w.state.table.pins.clear();
    let mut tally = Tally::default();
    let ok = remove_marked(t, w, t.root(), ROOT_LEVEL, 0, lo, hi, &mut tally).is_ok();
    if tally.mappings > MAX_RECORDS {
        w.batch.record(t.domain, tally.first, tally.end);
    }
    if tally.mappings > 0 {
        quota::remove(t, w, tally.mappings, tally.bytes);
        quota::give(t, w, tally.mappings);
    }
    let pins = std::mem::take(&mut w.state.table.pins);
    for p in pins.iter().rev() {
        let n = t.node(p.node);
        t.unpin(w, n, p.iova, p.level, 1);
    }
    w.state.table.pins = pins;
    w.state.table.pins.clear();
    ok
}

#[cfg(test)]
mod tests;
