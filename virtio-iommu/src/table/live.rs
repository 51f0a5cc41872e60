//! The layout of a node's `live` word: the count of non-empty slots and
//! pins in the low 48 bits, the node's incarnation (the low 16 bits of
//! `Node::gen`, what the parent entry records) in the high 16.
//!
//! WHY the incarnation sits in the same word as the count: a pin used to be
//! an unconditional increment of the count followed by a re-read of the
//! parent entry, undone if the node turned out to be unlinked. A worker
//! preempted between reading a link and that increment could add its pin
//! to a *later* incarnation of the node (unlinked, recycled and linked
//! again meanwhile, maybe empty and about to be retired). A retirer reading
//! the count in that instant saw it non-zero and left the node linked; the
//! stale pinner then took its pin back without queueing the node (it was
//! not the node it wanted), so nobody was left responsible for an empty
//! linked node: table memory leaked. Now a pin is a compare-and-swap that
//! adds to the count only while the word still names the incarnation the
//! pinner walked to, and a retirer kills an incarnation by a
//! compare-and-swap from (that incarnation, count 0) to the next
//! incarnation: on one word, exactly one of the two wins. A count that a
//! retirer sees non-zero is then always a pin or an entry of that very
//! incarnation, whose owner queues the node when it drops the last one.
//!
//! The count never borrows from the incarnation bits: it is a sum of
//! entries and pins that is never negative (a hold's bias dominates the
//! private deltas, `held.rs`), far below 2^48.

/// Bit position of the incarnation in the word.
const GEN_SHIFT: u32 = 48;

/// The count's bits.
const COUNT_MASK: u64 = (1 << GEN_SHIFT) - 1;

/// Non-empty slots plus pins counted in `word`.
#[inline(always)]
pub(crate) const fn count(word: u64) -> u64 {
    word & COUNT_MASK
}

/// The incarnation `word` belongs to, as a directory entry records it.
#[inline(always)]
pub(crate) const fn gen(word: u64) -> u16 {
    (word >> GEN_SHIFT) as u16
}

/// The word of incarnation `gen` (low 16 bits) with a count of zero.
#[inline(always)]
pub(crate) const fn empty(gen: u64) -> u64 {
    (gen & 0xffff) << GEN_SHIFT
}

#[cfg(test)]
mod tests;
