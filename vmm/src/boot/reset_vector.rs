//! A stand-in for the BIOS reset vector.
//!
//! Why: on a HW-reduced ACPI platform without EFI, Linux's reboot falls
//! through EFI (absent) to its "BIOS" method: it drops to real mode and
//! jumps to 0xf000:0xfff0. There is no BIOS here, so that would execute
//! zeroed memory forever. A few bytes at the reset vector write the ACPI
//! reset register instead, which ends the VM like any other reboot.

use vm_memory::{Bytes, GuestAddress};

use crate::devices::power::{RESET_PORT, RESET_VALUE};
use crate::error::Error;
use crate::memory::layout::RESET_VECTOR;
use crate::memory::GuestMemoryMmap;

/// Real-mode code: `mov al, RESET_VALUE; mov dx, RESET_PORT; out dx, al;
/// cli; hlt; jmp $-2`.
pub fn reset_vector_code() -> [u8; 10] {
    let port = RESET_PORT.to_le_bytes();
    [
        0xb0,
        RESET_VALUE,
        0xba,
        port[0],
        port[1],
        0xee,
        0xfa,
        0xf4,
        0xeb,
        0xfe,
    ]
}

/// Writes the stub at [`RESET_VECTOR`].
pub fn write_reset_vector(mem: &GuestMemoryMmap) -> Result<(), Error> {
    mem.write_slice(&reset_vector_code(), GuestAddress(RESET_VECTOR))
        .map_err(|_| Error::GuestWrite("reset vector"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stub_writes_the_reset_register() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        write_reset_vector(&mem).unwrap();
        let mut code = [0u8; 10];
        mem.read_slice(&mut code, GuestAddress(0xffff0)).unwrap();
        assert_eq!(code[0..2], [0xb0, RESET_VALUE]);
        assert_eq!(u16::from_le_bytes([code[3], code[4]]), RESET_PORT);
        assert_eq!(code[5], 0xee, "out dx, al");
        // The stub fits before the 1 MiB boundary.
        assert!(RESET_VECTOR + code.len() as u64 <= 0x100000);
    }
}
