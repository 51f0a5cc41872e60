//! Translation's shortcut to the leaf node: a small array of hints, per
//! domain, naming the 4 KiB-leaf node a recent translation of each 2 MiB
//! region walked to.
//!
//! WHY: a translation is a chain of dependent loads (the root, one entry
//! per level, four levels), about five L1 latencies even when everything is
//! cached, and the DMA path of every emulated device pays it per access.
//! DMA concentrates on a few 2 MiB regions (the guest's IOVA allocator hands
//! out neighbouring addresses), so one load of a hint replaces the three
//! directory levels above the leaf.
//!
//! A hint is only a guess, validated on every use, so nothing keeps it
//! current: a translation that walked the table writes it, nothing else
//! does, and a stale hint costs one failed check and the walk. Validation
//! (see [`hinted`]): the node's generation is read before and after the
//! leaf entry, and its owner and position after the entry. A node is
//! unlinked only when empty and its generation is bumped before it can be
//! linked anywhere again, so an unchanged (64-bit) generation means the
//! node stayed in one incarnation while we read, and owner and position
//! (published before the link that made its entries reachable, so seen by
//! anyone who read one of those entries) say that incarnation is the node
//! of this table at this region. The entry read is then exactly the one the
//! full walk would have found there at that moment. An empty or absent
//! entry is never answered from a hint: the walk decides faults.
//!
//! The UNMAP guarantee does not change: a hint leads to the node, never to
//! a mapping, and the entry itself is read as the walk reads it, inside the
//! caller's read section.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Release};

use super::entry::{self, HEAD, TAIL, VALID};
use super::ops::{self, node_tag};
use super::{index, ScalableSpace, Table, ROOT_LEVEL};
use crate::node::{Node, ENTRIES};
use crate::space::{Fault, Perm, Translation};

/// Hints per domain: 64 regions of 2 MiB (a 128 MiB working set) in 512
/// bytes.
const HINTS: usize = 64;
// `slot` masks with 0x3f.
const _: () = assert!(HINTS == 64);

/// Longest run of following entries one answer folds (as the walk does).
const MAX_RUN: usize = 64;

/// 4 KiB: what one level-0 entry maps.
const PAGE: u64 = 1 << 12;

/// The hints of one domain: node addresses, 0 for none.
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct LeafHints {
    slots: [AtomicU64; HINTS],
}

impl LeafHints {
    pub(crate) fn new() -> LeafHints {
        LeafHints {
            slots: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// The hint slot of `iova`'s 2 MiB region: the region number folded
    /// once, so that regions 1 GiB apart (per-queue IOVA ranges) do not
    /// collide.
    #[inline(always)]
    fn slot(&self, iova: u64) -> &AtomicU64 {
        let r = iova >> 21;
        &self.slots[((r ^ (r >> 9)) & 0x3f) as usize]
    }

    /// Records the level-0 node the table now has for `iova`'s region,
    /// found by a walk of directory entries only (no validation: the hint
    /// is checked on use). Writes only when the hint changes, so readers
    /// that agree keep the line shared.
    fn fill(&self, t: &Table, iova: u64) {
        let mut n = t.root();
        let mut lvl = ROOT_LEVEL;
        while lvl > 0 {
            let e = n.entries[index(iova, lvl)].load(Acquire);
            if !entry::is_dir(e) {
                return;
            }
            n = t.node(entry::addr(e));
            lvl -= 1;
        }
        let addr = n as *const Node as u64;
        let slot = self.slot(iova);
        if slot.load(Acquire) != addr {
            slot.store(addr, Release);
        }
    }
}

/// Lock-free translation: the hint of `iova`'s region if it holds, the
/// walk (`ops::translate`) otherwise. `slow` takes the same arguments, so
/// the miss is a tail call and the hit keeps no register of its caller.
#[inline]
pub(crate) fn translate(s: &ScalableSpace, iova: u64, access: Perm) -> Result<Translation, Fault> {
    match hinted::<false>(&s.table, &s.hints, iova, access) {
        Some(r) => r,
        None => slow(s, iova, access),
    }
}

/// The other cases, out of line so that the hit on a one-page mapping (or
/// a mapping's last page) needs no stack frame: the hint with the fold of
/// a multi-page mapping, then the full walk, which leaves the hint for the
/// next access.
#[inline(never)]
fn slow(s: &ScalableSpace, iova: u64, access: Perm) -> Result<Translation, Fault> {
    let (t, hints) = (&*s.table, &s.hints);
    if let Some(r) = hinted::<true>(t, hints, iova, access) {
        return r;
    }
    let r = ops::translate(t, iova, access);
    if r.is_ok() {
        hints.fill(t, iova);
    }
    r
}

/// The answer through the hint, or `None` when the hint is absent, stale,
/// or leads to no mapping (the walk then answers), or, unless `FOLD`, to an
/// entry that is not the last of its mapping. An `iova` beyond the address
/// space never matches a node's position, so it goes to the walk and its
/// check.
#[inline(always)]
fn hinted<const FOLD: bool>(
    t: &Table,
    hints: &LeafHints,
    iova: u64,
    access: Perm,
) -> Option<Result<Translation, Fault>> {
    let addr = hints.slot(iova).load(Acquire);
    if addr == 0 {
        return None;
    }
    let n = t.node(addr);
    let gen = n.gen.load(Acquire);
    let i = index(iova, 0);
    let e = n.entries[i].load(Acquire);
    // One test for the common case: a valid entry that ends its mapping.
    if !FOLD && e & (VALID | TAIL) != VALID | TAIL {
        return None;
    }
    if !entry::is_valid(e) {
        return None;
    }
    let perm = entry::perm(e);
    let off = iova & (PAGE - 1);
    let mut len = PAGE - off;
    if e & TAIL == 0 {
        len += fold(n, i, e, perm);
    }
    // After the entries: see the module doc.
    if n.owner.load(Acquire) != t.id()
        || n.base.load(Acquire) != node_tag(iova, 0)
        || n.gen.load(Acquire) != gen
    {
        return None;
    }
    if !perm.contains(access.intersection(Perm::RW)) {
        return Some(Err(Fault::Permission));
    }
    Some(Ok(Translation {
        gpa: entry::gpa(e) + off,
        len,
        perm,
    }))
}

/// Bytes of the following entries of `e`'s mapping that continue its
/// guest-physical range with the same permissions (one answer for a
/// multi-page buffer), as the walk folds them.
#[inline]
fn fold(n: &Node, i: usize, e: u64, perm: Perm) -> u64 {
    let mut len = 0;
    let mut next_gpa = entry::gpa(e) + PAGE;
    for f in n.entries.iter().take(ENTRIES).skip(i + 1).take(MAX_RUN) {
        let f = f.load(Acquire);
        if !entry::is_valid(f)
            || f & HEAD != 0
            || entry::gpa(f) != next_gpa
            || entry::perm(f) != perm
        {
            break;
        }
        len += PAGE;
        next_gpa += PAGE;
        if f & TAIL != 0 {
            break;
        }
    }
    len
}

#[cfg(test)]
mod tests;
