//! Encoding of a table entry (one `u64`).
//!
//! WHY this shape: every state a concurrent MAP, UNMAP, translator or node
//! reclaimer must see is in the entry itself, so one compare-and-swap moves
//! it from one state to the next and a translator needs a single load.
//!
//! | state            | bits                                                   |
//! |------------------|--------------------------------------------------------|
//! | empty            | `0`                                                    |
//! | mapping (leaf)   | `VALID`, `HEAD`/`TAIL`, perm `<<6`, gpa bits 12..52     |
//! | map claim        | like a leaf but `PENDING` instead of `VALID`: invisible |
//! | unmap claim      | a leaf with `LOCKED` added (still visible), or `LOCKED` alone on an empty slot |
//! | directory        | `DIR`, node address bits 6..48, node generation `<<48`  |
//! | dir being retired| directory with `LOCKED`                                |
//!
//! Spec MAPPING semantics are kept with `HEAD` (the entry holds the first
//! page of its mapping) and `TAIL` (the last page): UNMAP only has to look
//! at the two entries at its range's edges to know whether it would split a
//! mapping, because a mapping partly covered must contain one of them.

use crate::space::Perm;

/// A mapping, visible to translators.
pub const VALID: u64 = 1 << 0;
/// A link to a child node.
pub const DIR: u64 = 1 << 1;
/// First entry of its mapping.
pub const HEAD: u64 = 1 << 2;
/// Last entry of its mapping.
pub const TAIL: u64 = 1 << 3;
/// Claimed by a MAP in progress; not yet visible.
pub const PENDING: u64 = 1 << 4;
/// Claimed by an UNMAP in progress (on a leaf or empty slot), or a
/// directory whose node is being retired.
pub const LOCKED: u64 = 1 << 5;
const PERM_SHIFT: u32 = 6;
const PERM_MASK: u64 = 0x7 << PERM_SHIFT;
/// Guest-physical page bits of a leaf.
pub const GPA_MASK: u64 = ((1u64 << 52) - 1) & !0xfff;
/// Node address bits of a directory entry (nodes are 64-byte aligned and
/// below 2^48).
pub const ADDR_MASK: u64 = ((1u64 << 48) - 1) & !0x3f;
const GEN_SHIFT: u32 = 48;

/// An unmap's claim on an empty slot.
pub const CLAIM_EMPTY: u64 = LOCKED;

/// Leaf bits for a mapping entry whose first byte maps to `gpa`.
#[inline]
pub fn leaf(gpa: u64, perm: Perm, head: bool, tail: bool) -> u64 {
    let mut e = (gpa & GPA_MASK) | ((perm.bits() as u64) << PERM_SHIFT) & PERM_MASK;
    if head {
        e |= HEAD;
    }
    if tail {
        e |= TAIL;
    }
    e
}

/// Directory entry linking the node at `addr` with generation `gen`.
#[inline]
pub fn dir(addr: u64, gen: u64) -> u64 {
    (addr & ADDR_MASK) | DIR | ((gen & 0xffff) << GEN_SHIFT)
}

/// True for a directory entry (locked or not).
#[inline]
pub fn is_dir(e: u64) -> bool {
    e & DIR != 0
}

/// True for a mapping visible to translators (possibly being unmapped).
#[inline]
pub fn is_valid(e: u64) -> bool {
    e & VALID != 0
}

/// True if another operation holds the entry (wait for it to settle).
#[inline]
pub fn is_transient(e: u64) -> bool {
    e & (PENDING | LOCKED) != 0
}

/// Node address of a directory entry.
#[inline]
pub fn addr(e: u64) -> u64 {
    e & ADDR_MASK
}

/// Generation (16 bits) recorded in a directory entry.
#[inline]
pub fn gen(e: u64) -> u16 {
    (e >> GEN_SHIFT) as u16
}

/// A node's generation counter as a directory entry records it: its low 16
/// bits (the compare against [`gen`] detects a node reused since the link was
/// read, and 65,536 reuses between that read and the compare cannot happen).
#[inline]
pub fn short_gen(g: u64) -> u16 {
    (g & 0xffff) as u16
}

/// Guest-physical address of a leaf's first byte.
#[inline]
pub fn gpa(e: u64) -> u64 {
    e & GPA_MASK
}

/// Permissions of a leaf.
#[inline]
pub fn perm(e: u64) -> Perm {
    Perm::from_bits_truncate(((e & PERM_MASK) >> PERM_SHIFT) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let e = leaf(0xf_ffff_ffff_f000, Perm::RW, true, false) | VALID;
        assert_eq!(gpa(e), 0xf_ffff_ffff_f000);
        assert_eq!(perm(e), Perm::RW);
        assert!(e & HEAD != 0 && e & TAIL == 0);
        assert!(is_valid(e) && !is_dir(e) && !is_transient(e));
        let d = dir(0x7fff_ffff_ffc0, 0x1_2345);
        assert_eq!(addr(d), 0x7fff_ffff_ffc0);
        assert_eq!(gen(d), 0x2345);
        assert!(is_dir(d) && !is_valid(d));
        assert!(is_transient(d | LOCKED));
        assert!(!is_valid(CLAIM_EMPTY) && is_transient(CLAIM_EMPTY));
    }
}
