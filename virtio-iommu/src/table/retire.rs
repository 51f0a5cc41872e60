//! Reclaiming table memory: unlinking nodes that became empty, and giving
//! every node back to the depot when a table is dropped.
//!
//! WHY deferred: an UNMAP that empties a node leaves a translator possibly
//! still walking it, and a DMA consumer possibly still holding a
//! translation through it. The node is unlinked during the kick's flush
//! (before the consumers are invalidated) but only returned to the worker's
//! magazine after the invalidation, so memory is never reused while the
//! guest still believes the UNMAP incomplete. Retiring at the flush rather
//! than at the moment a node empties also gives hysteresis: a ring of DMA
//! buffers that empties and refills one leaf within a kick keeps its node.
//!
//! WHY a second kick of hysteresis ([`Hot`]): a guest that maps and unmaps
//! one large block per kick (the passthrough policy's 1 GiB MAP, a 2 MiB
//! buffer) empties the same directory node at every flush; unlinking it and
//! linking a fresh one on the next MAP cost more than the mapping itself.
//! A node that was a candidate at the previous flush too stays linked,
//! empty (translators see no mapping in it), until a flush of this worker
//! finds it was not emptied again during the kick. At most [`HOT_MAX`]
//! such nodes per worker, counted in the table's node quota like any
//! linked node; `clear` and a worker going away retire them at once.

use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::Arc;

use super::entry::{self, LOCKED};
use super::{index, live, quota, Candidate, Ctx, Table, ROOT_LEVEL};
use crate::node::{Node, NodePtr};

/// Most empty nodes a worker keeps linked across a flush (see [`Hot`]);
/// a kick emptying more nodes than this keeps none.
const HOT_MAX: usize = 4;

/// What identifies a candidate across flushes: table address, base, level.
type Key = (u64, u64, u32);

fn key(c: &Candidate) -> Key {
    (c.table.id(), c.iova, c.level)
}

/// A worker's empty nodes kept linked across a flush (module doc).
#[derive(Debug, Default)]
pub(crate) struct Hot {
    /// Nodes left linked, empty, at the last flush.
    kept: Vec<Candidate>,
    /// Spare buffer for the next `kept` (no allocation per flush).
    spare: Vec<Candidate>,
    /// The candidates of the last flush, when there were at most HOT_MAX.
    recent: [Key; HOT_MAX],
    recent_len: usize,
}

impl Hot {
    fn was_recent(&self, k: &Key) -> bool {
        self.recent.iter().take(self.recent_len).any(|r| r == k)
    }
}

/// Tries to unlink every node this worker saw become empty, and every
/// node it kept linked (no hysteresis).
pub(super) fn retire_candidates(w: &mut Ctx) {
    let mut cands = std::mem::take(&mut w.state.table.candidates);
    for c in cands.drain(..) {
        try_retire(&c.table, w, c.iova, c.level);
    }
    w.state.table.candidates = cands;
    let mut kept = std::mem::take(&mut w.state.table.hot.kept);
    for c in kept.drain(..) {
        try_retire(&c.table, w, c.iova, c.level);
    }
    w.state.table.hot.kept = kept;
    w.state.table.hot.recent_len = 0;
}

/// The flush's retirement: like [`retire_candidates`], except that a node
/// emptied in this kick and the last one stays linked (see [`Hot`]), and a
/// node kept at the last flush that was not emptied again is retired now.
pub(super) fn retire_at_flush(w: &mut Ctx) {
    let n = w.state.table.candidates.len();
    if n == 0 && w.state.table.hot.kept.is_empty() {
        w.state.table.hot.recent_len = 0;
        return;
    }
    if n > HOT_MAX {
        retire_candidates(w);
        return;
    }
    let mut cands = std::mem::take(&mut w.state.table.candidates);
    let mut old = std::mem::take(&mut w.state.table.hot.kept);
    let mut new = std::mem::take(&mut w.state.table.hot.spare);
    let mut recent = [(0, 0, 0); HOT_MAX];
    let mut recent_len = 0;
    for c in cands.drain(..) {
        let k = key(&c);
        if recent[..recent_len].contains(&k) {
            continue;
        }
        if let Some(r) = recent.get_mut(recent_len) {
            *r = k;
            recent_len += 1;
        }
        if w.state.table.hot.was_recent(&k) {
            new.push(c);
        } else {
            try_retire(&c.table, w, c.iova, c.level);
        }
    }
    for c in old.drain(..) {
        // Not emptied during this kick (or refilled): retire if empty.
        if !new.iter().any(|x| key(x) == key(&c)) {
            try_retire(&c.table, w, c.iova, c.level);
        }
    }
    let hot = &mut w.state.table.hot;
    hot.kept = new;
    hot.spare = old;
    hot.recent = recent;
    hot.recent_len = recent_len;
    w.state.table.candidates = cands;
}

/// End of a kick: gives unused mapping quota back to its domain.
pub(super) fn trim_credits(w: &mut Ctx) {
    quota::trim(w);
}

/// Gives all the worker's mapping quota back (worker going away).
pub(super) fn release_credits(w: &mut Ctx) {
    quota::release(w);
}

/// Unlinks the node of `level` covering `iova` if it is empty and unpinned,
/// then its parent if that emptied it, and so on below the root.
fn try_retire(t: &Arc<Table>, w: &mut Ctx, iova: u64, mut level: u32) {
    while level < ROOT_LEVEL {
        // Walk to the node, validating each step like a translator.
        let mut n = t.root();
        let mut lvl = ROOT_LEVEL;
        let mut link: Option<(&Node, usize, u64)> = None;
        while lvl > level {
            let i = index(iova, lvl);
            let e = n.entries[i].load(Acquire);
            if let Some((_, _, le)) = link {
                if entry::short_gen(n.gen.load(Acquire)) != entry::gen(le) {
                    return;
                }
            }
            if !entry::is_dir(e) || e & LOCKED != 0 {
                return;
            }
            link = Some((n, i, e));
            n = t.node(entry::addr(e));
            lvl -= 1;
        }
        let Some((p, i, e)) = link else { return };
        if live::count(n.live.load(SeqCst)) != 0 {
            return;
        }
        // Lock the link (walkers wait instead of following it), then end
        // the incarnation `e` links if nothing counts in it: pins
        // compare-and-swap the same word expecting this incarnation, so
        // exactly one side wins (`live.rs`). A count seen here belongs to
        // this incarnation, and whoever drops it to zero queues the node.
        if p.entries[i]
            .compare_exchange(e, e | LOCKED, SeqCst, SeqCst)
            .is_err()
        {
            return;
        }
        let g = u64::from(entry::gen(e));
        if n.live
            .compare_exchange(live::empty(g), live::empty(g + 1), SeqCst, SeqCst)
            .is_err()
        {
            p.entries[i].store(e, SeqCst);
            return;
        }
        debug_assert!(n.entries.iter().all(|x| x.load(Relaxed) == 0));
        // A reader that followed the old link sees the new generation and
        // walks again.
        n.gen.fetch_add(1, Release);
        p.entries[i].store(0, SeqCst);
        t.nodes.fetch_sub(1, AcqRel);
        // SAFETY: the node was linked at this address and we just unlinked
        // it; no table or list owns it any more.
        w.state
            .table
            .deferred
            .push(unsafe { NodePtr::from_addr(entry::addr(e)) });
        level += 1;
        if level >= ROOT_LEVEL || live::count(p.live.fetch_sub(1, AcqRel)) != 1 {
            return;
        }
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        // Exclusive access: no worker, candidate or reader holds the table.
        let mut nodes = Vec::new();
        collect(self, self.root, ROOT_LEVEL, &mut nodes);
        // SAFETY: the root is owned by the table, which is going away.
        nodes.push(unsafe { NodePtr::from_addr(self.root) });
        self.depot.free_direct(nodes);
    }
}

/// Empties the node at `addr` and its subtree, appending the children to `out`.
fn collect(t: &Table, addr: u64, level: u32, out: &mut Vec<NodePtr>) {
    let n = t.node(addr);
    for slot in n.entries.iter() {
        let e = slot.swap(0, AcqRel);
        if entry::is_dir(e) && level > 0 {
            collect(t, entry::addr(e), level - 1, out);
            let c = t.node(entry::addr(e));
            // The next incarnation, in both places (`live.rs`).
            let g = c.gen.fetch_add(1, Release).wrapping_add(1);
            c.live.store(live::empty(g), Release);
            // SAFETY: the child was linked here and is now unlinked.
            out.push(unsafe { NodePtr::from_addr(entry::addr(e)) });
        }
    }
    // Count zero, incarnation kept (the caller moves a child's on).
    n.live.fetch_and(live::empty(u64::MAX), Release);
}
