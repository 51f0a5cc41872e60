//! MAP, UNMAP and translate on the scalable table: argument checks, the
//! one-entry fast paths (one compare-and-swap each), and the lock-free walk.

use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, SeqCst};
use std::sync::Arc;

use super::entry::{self, HEAD, LOCKED, TAIL, VALID};
use super::{backoff, index, quota, span, Candidate, Ctx, Table, MAX_LEAF_LEVEL, ROOT_LEVEL};
use super::{held, live, page, range};
use crate::node::{self, Node};
use crate::space::{
    check_map_args, Fault, MapError, Perm, Translation, UnmapError, IOVA_MAX, PAGE_SIZE,
};

/// What a walk found at the requested level.
pub(crate) enum Found<'a> {
    /// The node at the requested level, pinned by the caller.
    Node(&'a Node),
    /// No node there (only when not installing).
    Absent,
    /// A leaf (2 MiB or 1 GiB mapping) above the requested level.
    Leaf,
}

impl Table {
    /// Pins `n`, which the caller found linked by directory entry `e`:
    /// afterwards `n` cannot be unlinked until unpinned. False if that
    /// incarnation of `n` was unlinked first (`live` then is left alone).
    ///
    /// The pin is a compare-and-swap on `live` that only succeeds while the
    /// word names the incarnation `e` recorded; `retire` kills an
    /// incarnation by a compare-and-swap on the same word from a count of
    /// zero (`live.rs` says why an unconditional increment leaked nodes).
    ///
    /// `tag` is the position the caller expects `n` at; a node linked
    /// elsewhere (possible only if its 16-bit generation wrapped while the
    /// caller was preempted) is refused like an unlinked one.
    #[inline]
    pub(crate) fn pin(&self, n: &Node, e: u64, tag: u64) -> bool {
        self.pin_by(n, e, tag, 1)
    }

    /// [`Table::pin`] with a weight of `k` in `live` instead of 1 (a
    /// worker's hold, `held.rs`, pins with its whole weight at once). The
    /// argument is the same: any non-zero count keeps the retirer off.
    #[inline]
    pub(crate) fn pin_by(&self, n: &Node, e: u64, tag: u64, k: u64) -> bool {
        let want = entry::gen(e);
        let mut cur = n.live.load(Acquire);
        loop {
            if live::gen(cur) != want {
                // Unlinked since the walk read `e`: the node is dead to us
                // (a later incarnation, if any, is reached by a new walk).
                return false;
            }
            match n
                .live
                .compare_exchange_weak(cur, cur.wrapping_add(k), SeqCst, Acquire)
            {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        if n.owner.load(Acquire) == self.id() && n.base.load(Acquire) == tag {
            return true;
        }
        // The generation wrapped: the pin counts in a node linked elsewhere.
        // Take it back; if that empties the node, its table's own retirer
        // may have seen our pin and left it, which no one here can repair
        // (it may belong to another table). 2^16 unlinks of one node while
        // this worker was preempted between two loads: accepted.
        n.live.fetch_sub(k, SeqCst);
        false
    }

    /// Drops `k` from the live count of `n` (a node at `level` covering
    /// `iova`); queues it for retirement if that empties it.
    #[inline]
    pub(crate) fn unpin(self: &Arc<Self>, w: &mut Ctx, n: &Node, iova: u64, level: u32, k: u64) {
        if level >= ROOT_LEVEL || k == 0 {
            return;
        }
        if live::count(n.live.fetch_sub(k, AcqRel)) == k {
            push_candidate(self, w, iova, level);
        }
    }

    /// Walks to the node of `level` covering `iova` and pins it (with a
    /// weight of `weight`, see [`Table::pin_by`]). Missing directory nodes
    /// are installed if `install`.
    pub(crate) fn find<'a>(
        self: &'a Arc<Self>,
        w: &mut Ctx,
        iova: u64,
        level: u32,
        install: bool,
        weight: u64,
    ) -> Result<Found<'a>, MapError> {
        let mut spins = 0;
        'retry: loop {
            let mut n = self.root();
            let mut lvl = ROOT_LEVEL;
            // (parent, slot, entry) that linked `n`, and the generation it recorded.
            let mut link: Option<(&Node, usize, u64)> = None;
            loop {
                if lvl == level {
                    return match link {
                        Some((_, _, e)) if self.pin_by(n, e, node_tag(iova, lvl), weight) => {
                            Ok(Found::Node(n))
                        }
                        Some(_) => continue 'retry,
                        None => Ok(Found::Node(n)),
                    };
                }
                let i = index(iova, lvl);
                let e = n.entries[i].load(Acquire);
                if let Some((_, _, le)) = link {
                    if entry::short_gen(n.gen.load(Acquire)) != entry::gen(le) {
                        continue 'retry;
                    }
                }
                if entry::is_dir(e) {
                    if e & LOCKED != 0 {
                        backoff(&mut spins);
                        continue;
                    }
                    link = Some((n, i, e));
                    n = self.node(entry::addr(e));
                    lvl -= 1;
                    continue;
                }
                if e == 0 {
                    if !install {
                        return Ok(Found::Absent);
                    }
                    if !self.install(w, n, lvl, iova, link, i)? {
                        continue 'retry;
                    }
                    continue;
                }
                if entry::is_valid(e) && !entry::is_transient(e) {
                    return Ok(Found::Leaf);
                }
                backoff(&mut spins);
            }
        }
    }

    /// Installs a fresh child in empty slot `i` of `n` (at `lvl`, linked by
    /// `link`). Ok(false): `n` was unlinked meanwhile, walk again.
    fn install(
        self: &Arc<Self>,
        w: &mut Ctx,
        n: &Node,
        lvl: u32,
        iova: u64,
        link: Option<(&Node, usize, u64)>,
        i: usize,
    ) -> Result<bool, MapError> {
        if let Some((_, _, pe)) = link {
            if !self.pin(n, pe, node_tag(iova, lvl)) {
                return Ok(false);
            }
        }
        // The pin on `n` becomes the count of the new child link on success.
        match self.link_new_child(w, n, i, node_tag(iova, lvl - 1)) {
            Ok(true) => Ok(true),
            Ok(false) => {
                self.unpin(w, n, iova, lvl, 1);
                Ok(true)
            }
            Err(err) => {
                self.unpin(w, n, iova, lvl, 1);
                Err(err)
            }
        }
    }

    /// Links a node from the worker's magazine into empty slot `i` of `n`
    /// (which the caller keeps alive). Ok(false) if the slot was taken
    /// first; the caller then re-reads it. The caller accounts the new link
    /// in `n.live`.
    pub(crate) fn link_new_child(
        &self,
        w: &mut Ctx,
        n: &Node,
        i: usize,
        child_tag: u64,
    ) -> Result<bool, MapError> {
        let max_nodes = self.limits.max_table_bytes / crate::node::NODE_BYTES;
        // +1: the root.
        if self.nodes.fetch_add(1, AcqRel) + 2 > max_nodes {
            self.nodes.fetch_sub(1, AcqRel);
            return Err(MapError::NoMemory);
        }
        let child = w.state.nodes.alloc(&w.state.depot);
        if child.addr() & !entry::ADDR_MASK != 0 {
            // Not representable in an entry (above 2^48): keep it cached.
            w.state.nodes.free(&w.state.depot, child);
            self.nodes.fetch_sub(1, AcqRel);
            return Err(MapError::NoMemory);
        }
        child.node().owner.store(self.id(), Relaxed);
        child.node().base.store(child_tag, Relaxed);
        // A recycled node may keep marks of its last life; it is empty now.
        for word in &child.node().occupied {
            word.store(0, Relaxed);
        }
        // The compare-and-swap below (release) publishes owner and base.
        let e = entry::dir(child.addr(), child.node().gen.load(Acquire));
        match n.entries[i].compare_exchange(0, e, SeqCst, Acquire) {
            Ok(_) => {
                n.mark(i);
                child.into_addr();
                Ok(true)
            }
            Err(_) => {
                w.state.nodes.free(&w.state.depot, child);
                self.nodes.fetch_sub(1, AcqRel);
                Ok(false)
            }
        }
    }
}

/// Position tag of the node of `level` covering `iova`.
#[inline]
pub(crate) fn node_tag(iova: u64, level: u32) -> u64 {
    node::tag(iova & !(span(level + 1) - 1), level)
}

/// Queues the node of `level` covering `iova` for retirement at the flush.
pub(crate) fn push_candidate(t: &Arc<Table>, w: &mut Ctx, iova: u64, level: u32) {
    let base = iova & !(span(level + 1) - 1);
    if let Some(c) = w.state.table.candidates.last() {
        if Arc::ptr_eq(&c.table, t) && c.iova == base && c.level == level {
            return;
        }
    }
    w.state.table.candidates.push(Candidate {
        table: Arc::clone(t),
        iova: base,
        level,
    });
    if w.state.table.candidates.len() >= 256 {
        // Bound the list: retiring early is safe (nodes still wait for the
        // flush in the deferred list).
        super::retire::retire_candidates(w);
    }
}

enum Fast {
    Done(Result<(), MapError>),
    /// A 2 MiB or 1 GiB slot holds a node: map with smaller entries instead.
    Fallback,
}

/// MAP: the one-page fast path (`page.rs`), or the general path.
#[inline]
pub(crate) fn map(
    t: &Arc<Table>,
    w: &mut Ctx,
    iova: u64,
    last: u64,
    gpa: u64,
    perm: Perm,
) -> Result<(), MapError> {
    if page::map(t, w, iova, last, gpa, perm) {
        return Ok(());
    }
    map_general(t, w, iova, last, gpa, perm)
}

/// MAP of any range. Not inlined: the fast path's caller then keeps only
/// what the fast path needs in registers.
#[inline(never)]
fn map_general(
    t: &Arc<Table>,
    w: &mut Ctx,
    iova: u64,
    last: u64,
    gpa: u64,
    perm: Perm,
) -> Result<(), MapError> {
    check_map_args(iova, last, gpa)?;
    quota::take(t, w)?;
    let size = last - iova + 1;
    // One call site, so the one-entry path is inlined here.
    let res = match one_entry_level(iova, last) {
        Some(level) if gpa & (span(level) - 1) == 0 => {
            match map_one(
                t,
                w,
                iova,
                level,
                entry::leaf(gpa, perm, true, true) | VALID,
            ) {
                Fast::Done(r) => r,
                Fast::Fallback => range::run_map(t, w, iova, last, gpa, perm),
            }
        }
        _ => range::run_map(t, w, iova, last, gpa, perm),
    };
    match res {
        Ok(()) => quota::add(t, w, 1, size),
        Err(_) => quota::give(t, w, 1),
    }
    res
}

/// One-entry MAP: a single compare-and-swap from empty to the mapping.
/// A one-page entry goes into the worker's held leaf (`held.rs`), which
/// needs no pin of its own; a larger one into a node pinned by the walk.
/// Always inlined: its one caller is `map`, and the call cost as much as
/// the fast path's own work.
#[inline(always)]
fn map_one(t: &Arc<Table>, w: &mut Ctx, iova: u64, level: u32, value: u64) -> Fast {
    let hold = level == 0;
    let found = if hold {
        held::leaf(t, w, iova, true)
    } else {
        t.find(w, iova, level, true, 1)
    };
    let n = match found {
        Ok(Found::Node(n)) => n,
        Ok(Found::Leaf) => return Fast::Done(Err(MapError::Overlap)),
        Ok(Found::Absent) => return Fast::Fallback,
        Err(e) => return Fast::Done(Err(e)),
    };
    let i = index(iova, level);
    let slot = &n.entries[i];
    let mut spins = 0;
    loop {
        match slot.compare_exchange(0, value, SeqCst, Acquire) {
            Ok(_) => {
                n.mark(i);
                if hold {
                    held::filled(w);
                }
                // Otherwise the pin taken by `find` now counts the entry.
                return Fast::Done(Ok(()));
            }
            Err(cur) if entry::is_dir(cur) => {
                if !hold {
                    t.unpin(w, n, iova, level, 1);
                }
                return Fast::Fallback;
            }
            Err(cur) if entry::is_transient(cur) => backoff(&mut spins),
            Err(_) => {
                if !hold {
                    t.unpin(w, n, iova, level, 1);
                }
                return Fast::Done(Err(MapError::Overlap));
            }
        }
    }
}

/// UNMAP: the one-page fast path (`page.rs`), or the general path.
#[inline]
pub(crate) fn unmap(t: &Arc<Table>, w: &mut Ctx, iova: u64, last: u64) -> Result<(), UnmapError> {
    if page::unmap(t, w, iova, last) {
        return Ok(());
    }
    unmap_general(t, w, iova, last)
}

/// UNMAP of any range (not inlined, like [`map_general`]).
#[inline(never)]
fn unmap_general(t: &Arc<Table>, w: &mut Ctx, iova: u64, last: u64) -> Result<(), UnmapError> {
    if last < iova || iova > IOVA_MAX {
        return Ok(());
    }
    let last = last.min(IOVA_MAX);
    if let Some(level) = one_entry_level(iova, last) {
        if let Some(r) = unmap_one(t, w, iova, level) {
            return r;
        }
    }
    range::run_unmap(t, w, iova, last)
}

/// The level whose single entry is exactly `iova..=last` (a 4 KiB page, or
/// an aligned 2 MiB or 1 GiB block), if any.
#[inline]
fn one_entry_level(iova: u64, last: u64) -> Option<u32> {
    let len = last - iova;
    if len == PAGE_SIZE - 1 {
        return (iova & (PAGE_SIZE - 1) == 0).then_some(0);
    }
    (1..=MAX_LEAF_LEVEL).find(|&l| len == span(l) - 1 && iova & (span(l) - 1) == 0)
}

/// UNMAP of the one entry of `level` at `iova`, when a single mapping fills
/// it: one compare-and-swap to empty. `None`: the entry holds a claim of a
/// range operation or a node of smaller entries; use the range path.
#[inline]
fn unmap_one(t: &Arc<Table>, w: &mut Ctx, iova: u64, level: u32) -> Option<Result<(), UnmapError>> {
    let hold = level == 0;
    let found = if hold {
        held::leaf(t, w, iova, false)
    } else {
        t.find(w, iova, level, false, 1)
    };
    let n = match found {
        Ok(Found::Node(n)) => n,
        Ok(Found::Absent) => return Some(Ok(())),
        // A larger mapping covers the range: unmapping part of it would
        // split it.
        Ok(Found::Leaf) => return Some(Err(UnmapError::WouldSplit)),
        Err(_) => return None,
    };
    // What the walk's pin is dropped with (a held leaf has none).
    let unpin = |w: &mut Ctx, k: u64| {
        if !hold {
            t.unpin(w, n, iova, level, k);
        }
    };
    let slot = &n.entries[index(iova, level)];
    let mut spins = 0;
    loop {
        let e = slot.load(Acquire);
        if e == 0 {
            unpin(w, 1);
            return Some(Ok(()));
        }
        if entry::is_dir(e) {
            unpin(w, 1);
            return None;
        }
        if entry::is_transient(e) {
            backoff(&mut spins);
            continue;
        }
        if e & (HEAD | TAIL) != HEAD | TAIL {
            unpin(w, 1);
            return Some(Err(UnmapError::WouldSplit));
        }
        if slot.compare_exchange(e, 0, AcqRel, Acquire).is_ok() {
            if hold {
                held::emptied(w);
            } else {
                // The entry and our pin.
                unpin(w, 2);
            }
            let sz = span(level);
            w.batch.record(t.domain, iova, iova + (sz - 1));
            quota::removed(t, w, 1, sz);
            return Some(Ok(()));
        }
    }
}

/// INVALIDATE (page-table mode): an UNMAP whose caller excludes concurrent
/// MAPs into the range. The sweep (`sweep.rs`) removes the cached one-page
/// walks at a cost that follows them; the range walk does the rest.
pub(crate) fn invalidate(
    t: &Arc<Table>,
    w: &mut Ctx,
    iova: u64,
    last: u64,
) -> Result<(), UnmapError> {
    if last < iova || iova > IOVA_MAX {
        return Ok(());
    }
    let last = last.min(IOVA_MAX);
    let pages = iova & (PAGE_SIZE - 1) == 0 && last & (PAGE_SIZE - 1) == PAGE_SIZE - 1;
    if pages && super::sweep::run(t, w, iova, last) {
        return Ok(());
    }
    range::run_unmap(t, w, iova, last)
}

/// Removes every mapping.
pub(crate) fn clear(t: &Arc<Table>, w: &mut Ctx) {
    // Let go of the held leaf first, so the walk below can empty it.
    held::release(w);
    // A range covering the whole space cannot split anything.
    let _ = range::run_unmap(t, w, 0, IOVA_MAX);
    // The domain is being emptied on purpose: keep no empty node linked
    // (retiring before the flush is safe, the nodes wait in the deferred
    // list for it).
    super::retire::retire_candidates(w);
}

/// Longest run of following entries `translate` folds into one answer.
const MAX_RUN: usize = 64;

/// Bytes of the entries after `e` (slot `i` of `n`, each mapping `sz`
/// bytes) that belong to its mapping and continue its guest-physical range
/// with the same permissions: one answer for a multi-page buffer. The walk
/// and the leaf hints (`leaf_hint.rs`) both fold with it; the caller
/// validates the node after reading.
#[inline]
pub(crate) fn fold(n: &Node, i: usize, e: u64, sz: u64) -> u64 {
    let perm = entry::perm(e);
    let mut len = 0;
    let mut next_gpa = entry::gpa(e) + sz;
    for f in n.entries.iter().skip(i + 1).take(MAX_RUN) {
        let f = f.load(Acquire);
        if !entry::is_valid(f)
            || f & HEAD != 0
            || entry::gpa(f) != next_gpa
            || entry::perm(f) != perm
        {
            break;
        }
        len += sz;
        next_gpa += sz;
        if f & TAIL != 0 {
            break;
        }
    }
    len
}

/// Lock-free translation.
pub(crate) fn translate(t: &Table, iova: u64, access: Perm) -> Result<Translation, Fault> {
    if iova > IOVA_MAX {
        return Err(Fault::Unmapped);
    }
    'retry: loop {
        let mut n = t.root();
        let mut want_gen: Option<u16> = None;
        let mut lvl = ROOT_LEVEL;
        loop {
            let i = index(iova, lvl);
            let e = n.entries[i].load(Acquire);
            if entry::is_dir(e) {
                if let Some(g) = want_gen {
                    if entry::short_gen(n.gen.load(Acquire)) != g {
                        continue 'retry;
                    }
                }
                if lvl == 0 {
                    return Err(Fault::Unmapped);
                }
                want_gen = Some(entry::gen(e));
                n = t.node(entry::addr(e));
                lvl -= 1;
                continue;
            }
            if !entry::is_valid(e) || lvl > MAX_LEAF_LEVEL {
                // Nothing mapped here (or, after a stale link, in a node
                // that is no longer ours): unmapped either way.
                if let Some(g) = want_gen {
                    if entry::short_gen(n.gen.load(Acquire)) != g {
                        continue 'retry;
                    }
                }
                return Err(Fault::Unmapped);
            }
            let perm = entry::perm(e);
            let sz = span(lvl);
            let off = iova & (sz - 1);
            let mut len = sz - off;
            if e & TAIL == 0 {
                len += fold(n, i, e, sz);
            }
            if let Some(g) = want_gen {
                if entry::short_gen(n.gen.load(Acquire)) != g
                    || n.owner.load(Acquire) != t.id()
                    || n.base.load(Acquire) != node_tag(iova, lvl)
                {
                    continue 'retry;
                }
            }
            if !perm.contains(access.intersection(Perm::RW)) {
                return Err(Fault::Permission);
            }
            return Ok(Translation {
                gpa: entry::gpa(e) + off,
                len,
                perm,
            });
        }
    }
}
