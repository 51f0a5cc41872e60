//! MAP and UNMAP over more than one entry: claim, decide, then publish or
//! roll back.
//!
//! WHY claims: a multi-entry request must look atomic to the other queues
//! (the spec's MAP fails whole on overlap; UNMAP removes whole mappings or
//! nothing). Each operation claims every slot of its range in ascending
//! address order, waiting for slots held by others; since everyone claims in
//! the same order no cycle of waits can form. A MAP's claims (`PENDING`) are
//! invisible to translators until published; an UNMAP's claims (`LOCKED`)
//! keep the mapping visible until it commits, and its claims on empty slots
//! keep MAPs out of the range while it decides.

use std::sync::atomic::Ordering::{AcqRel, Acquire, Release, SeqCst};
use std::sync::Arc;

use super::entry::{self, CLAIM_EMPTY, HEAD, LOCKED, PENDING, TAIL, VALID};
use super::{backoff, index, quota, span, Ctx, Pin, Table, MAX_LEAF_LEVEL, ROOT_LEVEL};
use crate::node::{self, Node};
use crate::space::{MapError, Perm, UnmapError};

/// More removed mappings than this in one UNMAP are reported to consumers
/// as one covering range (bounds the batch).
const MAX_RECORDS_PER_OP: usize = 64;

#[derive(Clone, Copy)]
enum Kind {
    Map { gpa: u64, perm: Perm },
    Unmap,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    MapCommit,
    MapRollback,
    UnmapCommit,
    UnmapRollback,
}

/// Why a claim walk stopped; everything below the address is claimed.
enum Stop {
    Conflict(u64),
    NoMemory(u64),
}

/// What an UNMAP commit removed.
#[derive(Default)]
struct Removed {
    mappings: u64,
    bytes: u64,
    head: u64,
    first: Option<u64>,
    end: u64,
    records: usize,
}

struct Op<'t> {
    t: &'t Arc<Table>,
    kind: Kind,
    lo: u64,
    hi: u64,
}

impl Op<'_> {
    fn gpa_of(&self, gpa: u64, iova: u64) -> u64 {
        gpa + (iova - self.lo)
    }

    /// Claims every slot of `n` (a node of `level` based at `base`) inside
    /// `lo..=hi`, descending into children.
    fn claim(
        &self,
        w: &mut Ctx,
        n: &Node,
        level: u32,
        base: u64,
        lo: u64,
        hi: u64,
    ) -> Result<(), Stop> {
        let t = self.t;
        let sz = span(level);
        let mut claimed = 0u64;
        let mut result = Ok(());
        'slots: for i in index(lo, level)..=index(hi, level) {
            w.state.table.visited_slots += 1;
            let s_base = base + i as u64 * sz;
            let s_last = s_base + (sz - 1);
            let sub_lo = lo.max(s_base);
            let sub_hi = hi.min(s_last);
            let slot = &n.entries[i];
            let mut spins = 0;
            loop {
                let e = slot.load(Acquire);
                if entry::is_dir(e) {
                    if e & LOCKED != 0 {
                        backoff(&mut spins);
                        continue;
                    }
                    let child = t.node(entry::addr(e));
                    if !t.pin(child, e, node::tag(s_base, level - 1)) {
                        continue;
                    }
                    w.state.table.pins.push(Pin {
                        node: entry::addr(e),
                        iova: s_base,
                        level: level - 1,
                    });
                    if let Err(s) = self.claim(w, child, level - 1, s_base, sub_lo, sub_hi) {
                        result = Err(s);
                        break 'slots;
                    }
                    break;
                }
                match self.kind {
                    Kind::Map { gpa, perm } => {
                        let full = sub_lo == s_base && sub_hi == s_last;
                        // 4 KiB leaves at level 0; a whole 2 MiB or 1 GiB
                        // slot whose guest range is aligned as much is one
                        // leaf at level 1 or 2 (a 1 GiB MAP is then one
                        // entry, as in a hardware page table).
                        let leaf_here = level == 0
                            || (level <= MAX_LEAF_LEVEL
                                && full
                                && self.gpa_of(gpa, s_base) & (sz - 1) == 0);
                        if e == 0 && leaf_here {
                            let v = entry::leaf(
                                self.gpa_of(gpa, sub_lo),
                                perm,
                                sub_lo == self.lo,
                                sub_hi == self.hi,
                            ) | PENDING;
                            if slot.compare_exchange(0, v, SeqCst, Acquire).is_ok() {
                                n.mark(i);
                                claimed += 1;
                                break;
                            }
                            continue;
                        }
                        if e == 0 {
                            match t.link_new_child(w, n, i, node::tag(s_base, level - 1)) {
                                Ok(true) => claimed += 1,
                                Ok(false) => {}
                                Err(_) => {
                                    result = Err(Stop::NoMemory(sub_lo));
                                    break 'slots;
                                }
                            }
                            continue;
                        }
                        if entry::is_transient(e) {
                            backoff(&mut spins);
                            continue;
                        }
                        result = Err(Stop::Conflict(sub_lo));
                        break 'slots;
                    }
                    Kind::Unmap => {
                        if e == 0 {
                            if slot
                                .compare_exchange(0, CLAIM_EMPTY, AcqRel, Acquire)
                                .is_ok()
                            {
                                claimed += 1;
                                break;
                            }
                            continue;
                        }
                        if entry::is_transient(e) {
                            backoff(&mut spins);
                            continue;
                        }
                        if slot
                            .compare_exchange(e, e | LOCKED, AcqRel, Acquire)
                            .is_ok()
                        {
                            break;
                        }
                    }
                }
            }
        }
        if claimed > 0 && level < ROOT_LEVEL {
            n.live.fetch_add(claimed, AcqRel);
        }
        result
    }

    /// Publishes or rolls back the claims of `n` inside `lo..=hi` (all ours).
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        w: &mut Ctx,
        n: &Node,
        level: u32,
        base: u64,
        lo: u64,
        hi: u64,
        mode: Mode,
        rm: &mut Removed,
    ) {
        let t = self.t;
        let sz = span(level);
        let mut cleared = 0u64;
        for i in index(lo, level)..=index(hi, level) {
            w.state.table.visited_slots += 1;
            let s_base = base + i as u64 * sz;
            let s_last = s_base + (sz - 1);
            let slot = &n.entries[i];
            let e = slot.load(Acquire);
            if entry::is_dir(e) {
                // A child we pinned during the claim (a retirer may hold its
                // link locked for an instant; the address is the same).
                let child = t.node(entry::addr(e));
                self.finish(
                    w,
                    child,
                    level - 1,
                    s_base,
                    lo.max(s_base),
                    hi.min(s_last),
                    mode,
                    rm,
                );
                continue;
            }
            match mode {
                Mode::MapCommit => slot.store((e & !PENDING) | VALID, Release),
                Mode::MapRollback => {
                    slot.store(0, Release);
                    cleared += 1;
                }
                Mode::UnmapRollback => {
                    if e == CLAIM_EMPTY {
                        slot.store(0, Release);
                        cleared += 1;
                    } else {
                        slot.store(e & !LOCKED, Release);
                    }
                }
                Mode::UnmapCommit => {
                    slot.store(0, Release);
                    cleared += 1;
                    if entry::is_valid(e) {
                        rm.bytes += sz;
                        if e & HEAD != 0 {
                            rm.mappings += 1;
                            rm.head = s_base;
                        }
                        if e & TAIL != 0 {
                            if rm.first.is_none() {
                                rm.first = Some(rm.head);
                            }
                            rm.end = s_last;
                            if rm.records < MAX_RECORDS_PER_OP {
                                w.batch.record(t.domain, rm.head, s_last);
                            }
                            rm.records += 1;
                        }
                    }
                }
            }
        }
        if cleared > 0 && level < ROOT_LEVEL {
            // Never reaches zero here: our pin is still counted.
            n.live.fetch_sub(cleared, AcqRel);
        }
    }

    /// The leaf entry covering `x` and its level, if a mapping is there.
    fn leaf_at(&self, x: u64) -> Option<(u64, u32)> {
        let mut n = self.t.root();
        let mut lvl = ROOT_LEVEL;
        loop {
            let e = n.entries[index(x, lvl)].load(Acquire);
            if entry::is_dir(e) && lvl > 0 {
                n = self.t.node(entry::addr(e));
                lvl -= 1;
                continue;
            }
            return if entry::is_valid(e) {
                Some((e, lvl))
            } else {
                None
            };
        }
    }

    /// True if removing `lo..=hi` would split a mapping at either end.
    fn would_split(&self) -> bool {
        let (lo, hi) = (self.lo, self.hi);
        let splits_low = match self.leaf_at(lo) {
            Some((e, lvl)) => e & HEAD == 0 || lo & (span(lvl) - 1) != 0,
            None => false,
        };
        let splits_high = match self.leaf_at(hi) {
            Some((e, lvl)) => e & TAIL == 0 || hi & (span(lvl) - 1) != span(lvl) - 1,
            None => false,
        };
        splits_low || splits_high
    }

    /// Unpins every node the claim walk pinned, deepest first.
    fn unpin_all(&self, w: &mut Ctx) {
        let pins = std::mem::take(&mut w.state.table.pins);
        for p in pins.iter().rev() {
            let n = self.t.node(p.node);
            self.t.unpin(w, n, p.iova, p.level, 1);
        }
        w.state.table.pins = pins;
        w.state.table.pins.clear();
    }
}

/// MAP of `lo..=hi` (checked, page-aligned) to `gpa..`.
pub(crate) fn run_map(
    t: &Arc<Table>,
    w: &mut Ctx,
    lo: u64,
    hi: u64,
    gpa: u64,
    perm: Perm,
) -> Result<(), MapError> {
    let op = Op {
        t,
        kind: Kind::Map { gpa, perm },
        lo,
        hi,
    };
    w.state.table.pins.clear();
    let mut rm = Removed::default();
    let res = match op.claim(w, t.root(), ROOT_LEVEL, 0, lo, hi) {
        Ok(()) => {
            op.finish(w, t.root(), ROOT_LEVEL, 0, lo, hi, Mode::MapCommit, &mut rm);
            Ok(())
        }
        Err(stop) => {
            let (at, err) = match stop {
                Stop::Conflict(at) => (at, MapError::Overlap),
                Stop::NoMemory(at) => (at, MapError::NoMemory),
            };
            if at > lo {
                op.finish(
                    w,
                    t.root(),
                    ROOT_LEVEL,
                    0,
                    lo,
                    at - 1,
                    Mode::MapRollback,
                    &mut rm,
                );
            }
            Err(err)
        }
    };
    op.unpin_all(w);
    res
}

/// True if removing `lo..=hi` would split a mapping at either end (read
/// without claims: exact only when no MAP runs in the range meanwhile).
pub(super) fn would_split(t: &Arc<Table>, lo: u64, hi: u64) -> bool {
    Op {
        t,
        kind: Kind::Unmap,
        lo,
        hi,
    }
    .would_split()
}

/// UNMAP of `lo..=hi` (any alignment, `hi` within the IOVA space).
pub(crate) fn run_unmap(t: &Arc<Table>, w: &mut Ctx, lo: u64, hi: u64) -> Result<(), UnmapError> {
    let op = Op {
        t,
        kind: Kind::Unmap,
        lo,
        hi,
    };
    w.state.table.pins.clear();
    let mut rm = Removed::default();
    // An UNMAP never conflicts: it waits for the slots others hold.
    let _ = op.claim(w, t.root(), ROOT_LEVEL, 0, lo, hi);
    let res = if op.would_split() {
        op.finish(
            w,
            t.root(),
            ROOT_LEVEL,
            0,
            lo,
            hi,
            Mode::UnmapRollback,
            &mut rm,
        );
        Err(UnmapError::WouldSplit)
    } else {
        op.finish(
            w,
            t.root(),
            ROOT_LEVEL,
            0,
            lo,
            hi,
            Mode::UnmapCommit,
            &mut rm,
        );
        if rm.records > MAX_RECORDS_PER_OP {
            if let Some(first) = rm.first {
                w.batch.record(t.domain, first, rm.end);
            }
        }
        if rm.mappings > 0 {
            quota::remove(t, w, rm.mappings, rm.bytes);
            quota::give(t, w, rm.mappings);
        }
        Ok(())
    };
    op.unpin_all(w);
    res
}
