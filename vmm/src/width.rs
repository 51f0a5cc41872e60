//! Integer widths the VMM relies on, checked by the compiler instead of
//! assumed by an `as`.
//!
//! dmavisor drives KVM on x86_64, where `usize` is 64 bits: a guest address
//! or length held as `u64` then indexes a host buffer without losing a bit.
//! The assertion below turns that assumption into a build failure on any
//! other width, so [`usize_from_u64`] is lossless wherever the crate builds
//! (the workspace's `cast_possible_truncation` lint exists for the 32-bit
//! targets this one refuses).
//!
//! The `const_*` narrowings are for constants only (port numbers, table
//! lengths, layout addresses): called from a `const` item they run in the
//! compiler, so a constant that no longer fits fails the build rather than
//! wrapping in a table the guest reads.

const _: () = assert!(
    usize::BITS == u64::BITS,
    "dmavisor assumes a 64-bit usize (x86_64 KVM host)"
);

/// `x` as a host length or index. Lossless: `usize` is 64 bits (asserted
/// at compile time above).
#[allow(
    clippy::cast_possible_truncation,
    reason = "usize is 64 bits, asserted at compile time in this module"
)]
pub const fn usize_from_u64(x: u64) -> usize {
    x as usize
}

/// The constant `x` as a `u8`; out of range fails the build in a `const`.
/// (`i128` holds every source type losslessly: `X as i128` widens.)
pub const fn const_u8(x: i128) -> u8 {
    assert!(0 <= x && x <= 0xff, "constant does not fit in u8");
    x.to_le_bytes()[0]
}

/// The constant `x` as a `u16`; out of range fails the build in a `const`.
pub const fn const_u16(x: i128) -> u16 {
    assert!(0 <= x && x <= 0xffff, "constant does not fit in u16");
    let b = x.to_le_bytes();
    u16::from_le_bytes([b[0], b[1]])
}

/// The constant `x` as a `u32`; out of range fails the build in a `const`.
pub const fn const_u32(x: i128) -> u32 {
    assert!(0 <= x && x <= 0xffff_ffff, "constant does not fit in u32");
    let b = x.to_le_bytes();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// The constant `x` as an `i32` (a C `int`); out of range fails the build
/// in a `const`.
pub const fn const_i32(x: i128) -> i32 {
    assert!(
        -0x8000_0000 <= x && x <= 0x7fff_ffff,
        "constant does not fit in i32"
    );
    let b = x.to_le_bytes();
    i32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrowings_keep_every_bit_of_values_that_fit() {
        assert_eq!(usize_from_u64(u64::MAX), usize::MAX);
        assert_eq!(const_u8(0xab), 0xab);
        assert_eq!(const_u16(0xcf8), 0xcf8);
        assert_eq!(const_u32(0xfee0_0000), 0xfee0_0000);
        assert_eq!(const_i32(-1), -1);
        assert_eq!(const_i32(0x7fff_ffff), i32::MAX);
    }

    #[test]
    #[should_panic(expected = "does not fit in u16")]
    fn a_constant_too_wide_is_refused() {
        // In a `const` item this is a build error; at run time, a panic.
        let _ = const_u16(0x1_0000);
    }

    #[test]
    #[should_panic(expected = "does not fit in u8")]
    fn a_negative_constant_is_refused_as_unsigned() {
        let _ = const_u8(-1);
    }
}
