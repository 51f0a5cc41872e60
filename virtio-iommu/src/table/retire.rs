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

use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::Arc;

use super::entry::{self, LOCKED};
use super::{index, quota, Ctx, Table, ROOT_LEVEL};
use crate::node::{Node, NodePtr};

/// Tries to unlink every node this worker saw become empty.
pub(super) fn retire_candidates(w: &mut Ctx) {
    let mut cands = std::mem::take(&mut w.state.table.candidates);
    for c in cands.drain(..) {
        try_retire(&c.table, w, c.iova, c.level);
    }
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
        if n.live.load(SeqCst) != 0 {
            return;
        }
        // Lock the link, then re-check: pairs with `Table::pin`.
        if p.entries[i]
            .compare_exchange(e, e | LOCKED, SeqCst, SeqCst)
            .is_err()
        {
            return;
        }
        if n.live.load(SeqCst) != 0 {
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
        if level >= ROOT_LEVEL || p.live.fetch_sub(1, AcqRel) != 1 {
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
            c.gen.fetch_add(1, Release);
            c.live.store(0, Release);
            // SAFETY: the child was linked here and is now unlinked.
            out.push(unsafe { NodePtr::from_addr(entry::addr(e)) });
        }
    }
    n.live.store(0, Release);
}
