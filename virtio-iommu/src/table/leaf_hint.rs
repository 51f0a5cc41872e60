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
//! does, and a stale hint costs one failed check and the walk. A slot with
//! no hint names [`NO_NODE`], a node never linked anywhere, whose empty
//! entries send the access to the walk like a stale hint's. Validation
//! (see [`valid`]): the node's generation is read before and after the
//! leaf entry, and its owner and position after the entry. A node is
//! unlinked only when empty and its generation is bumped before it can be
//! linked anywhere again, so an unchanged (64-bit) generation means the
//! node stayed in one incarnation while we read, and owner and position
//! (published before the link that made its entries reachable, so seen by
//! anyone who read one of those entries) say that incarnation is the node
//! of this table at this region. The entry read is then exactly the one the
//! full walk would have found there at that moment. An empty or absent
//! entry (or one whose MAP has not completed) is never answered from a
//! hint: the walk decides faults.
//!
//! The UNMAP guarantee does not change: a hint leads to the node, never to
//! a mapping, and the entry itself is read as the walk reads it, inside the
//! caller's read section.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Release};

use super::entry::{self, TAIL, VALID};
use super::ops::{self, node_tag};
use super::{index, ScalableSpace, Table, ROOT_LEVEL};
use crate::node::{self, Node, ENTRIES};
use crate::space::{Fault, Perm, Translation};

/// Hints per domain: 64 regions of 2 MiB (a 128 MiB working set) in 512
/// bytes.
const HINTS: usize = 64;
// `slot` masks with 0x3f.
const _: () = assert!(HINTS == 64);

/// 4 KiB: what one level-0 entry maps.
const PAGE: u64 = 1 << 12;

/// What a slot without a hint names: a node that is never linked in any
/// table, so its entries stay empty and an access led to it goes to the
/// walk. WHY not 0: the hit then needs no test for "no hint".
static NO_NODE: Node = Node {
    entries: [const { AtomicU64::new(0) }; ENTRIES],
    live: AtomicU64::new(0),
    gen: AtomicU64::new(0),
    owner: AtomicU64::new(0),
    occupied: [const { AtomicU64::new(0) }; ENTRIES / 64],
    base: AtomicU64::new(0),
};

/// The hints of one domain: node addresses ([`NO_NODE`]'s for none).
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct LeafHints {
    slots: [AtomicU64; HINTS],
}

impl LeafHints {
    pub(crate) fn new() -> LeafHints {
        let none = &NO_NODE as *const Node as u64;
        LeafHints {
            slots: std::array::from_fn(|_| AtomicU64::new(none)),
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
/// the hit keeps no register of its caller.
#[inline]
pub(crate) fn translate(s: &ScalableSpace, iova: u64, access: Perm) -> Result<Translation, Fault> {
    match hinted(&s.table, &s.hints, iova, access) {
        Some(r) => r,
        None => slow(s, iova, access),
    }
}

/// The other cases: the hint with the fold of a multi-page mapping, then
/// the full walk, which leaves the hint for the next access.
///
/// WHY cold: the hit on a one-page mapping (or a mapping's last page) is
/// what every DMA of a small buffer takes, and it needs no stack frame;
/// the call out here does. Marked cold, the compiler saves registers on
/// this way only (otherwise it did so on entry, for the hit too: four
/// instructions of about fifty). The attribute places the code apart
/// but optimizes it as usual, so a multi-page mapping pays one far call.
#[cold]
#[inline(never)]
fn slow(s: &ScalableSpace, iova: u64, access: Perm) -> Result<Translation, Fault> {
    let (t, hints) = (&*s.table, &s.hints);
    if let Some(r) = hinted_fold(t, hints, iova, access) {
        return r;
    }
    let r = ops::translate(t, iova, access);
    if r.is_ok() {
        hints.fill(t, iova);
    }
    r
}

/// The hinted node, its generation and `iova`'s entry, as read before the
/// validation of [`valid`].
#[inline(always)]
fn entry_of<'t>(_t: &'t Table, hints: &LeafHints, iova: u64) -> (&'t Node, u64, u64) {
    let addr = hints.slot(iova).load(Acquire);
    // SAFETY: a slot holds NO_NODE's address (a static) or one `fill` read
    // from a directory entry of this table; such nodes are type-stable
    // while the table's depot lives, which `_t` keeps alive for 't.
    let n: &'t Node = unsafe { node::node_at(addr) };
    let gen = n.gen.load(Acquire);
    let e = n.entries[index(iova, 0)].load(Acquire);
    #[cfg(test)]
    tests::between_reads();
    (n, gen, e)
}

/// After the entries: the node is still the incarnation whose generation
/// was `gen`, and that incarnation is this table's leaf of `iova`'s
/// region (see the module doc).
#[inline(always)]
fn valid(t: &Table, n: &Node, gen: u64, iova: u64) -> bool {
    n.owner.load(Acquire) == t.id()
        && n.base.load(Acquire) == node_tag(iova, 0)
        && n.gen.load(Acquire) == gen
}

/// The answer for the valid entry `e` (its permissions checked), `len`
/// bytes from `iova` on.
#[inline(always)]
fn answer(e: u64, iova: u64, len: u64, access: Perm) -> Result<Translation, Fault> {
    let perm = entry::perm(e);
    if !perm.contains(access.intersection(Perm::RW)) {
        return Err(Fault::Permission);
    }
    Ok(Translation {
        gpa: entry::gpa(e) + (iova & (PAGE - 1)),
        len,
        perm,
    })
}

/// The answer through the hint, or `None` when the hint is absent, stale,
/// leads to no mapping (the walk then answers) or to an entry that is not
/// the last of its mapping ([`hinted_fold`] then answers). An `iova`
/// beyond the address space never matches a node's position, so it goes
/// to the walk and its check.
#[inline(always)]
fn hinted(
    t: &Table,
    hints: &LeafHints,
    iova: u64,
    access: Perm,
) -> Option<Result<Translation, Fault>> {
    let (n, gen, e) = entry_of(t, hints, iova);
    // One test for the common case: a valid entry that ends its mapping.
    if e & (VALID | TAIL) != VALID | TAIL || !valid(t, n, gen, iova) {
        return None;
    }
    Some(answer(e, iova, PAGE - (iova & (PAGE - 1)), access))
}

/// [`hinted`] for an entry that may be followed by more of its mapping.
#[inline(always)]
fn hinted_fold(
    t: &Table,
    hints: &LeafHints,
    iova: u64,
    access: Perm,
) -> Option<Result<Translation, Fault>> {
    let (n, gen, e) = entry_of(t, hints, iova);
    if !entry::is_valid(e) {
        return None;
    }
    let mut len = PAGE - (iova & (PAGE - 1));
    if e & TAIL == 0 {
        len += ops::fold(n, index(iova, 0), e, PAGE);
    }
    if !valid(t, n, gen, iova) {
        return None;
    }
    Some(answer(e, iova, len, access))
}

#[cfg(test)]
mod tests;
