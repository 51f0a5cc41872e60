//! Boot-time register state: GDT, identity page tables, segment and control
//! registers for the two entry protocols.
//!
//! Why two shapes: the 64-bit Linux boot protocol enters `startup_64` in long
//! mode with paging on and low memory identity-mapped, while PVH enters in
//! 32-bit protected mode with paging off (the kernel builds its own tables).

use kvm_bindings::{kvm_fpu, kvm_regs, kvm_segment, kvm_sregs};
use vm_memory::{Bytes, GuestAddress};

use crate::error::Error;
use crate::memory::layout::{
    BOOT_GDT_START, BOOT_IDT_START, BOOT_STACK_POINTER, PDE_START, PDPTE_START, PML4_START,
};
use crate::memory::GuestMemoryMmap;
use crate::width::const_u16;

const CR0_PE: u64 = 1 << 0;
const CR0_ET: u64 = 1 << 4;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;

/// GDT selectors: null, code, data, TSS.
const CODE_SELECTOR: u16 = 0x08;
const DATA_SELECTOR: u16 = 0x10;
const TSS_SELECTOR: u16 = 0x18;
/// Descriptors in the boot GDT.
const GDT_ENTRIES: usize = 4;
/// The GDT's limit (its size in bytes minus one), as the 16-bit register
/// field.
const GDT_LIMIT: u16 = const_u16((GDT_ENTRIES * 8 - 1) as i128);

/// Which entry state to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryMode {
    /// 64-bit long mode, paging on (bzImage `startup_64`).
    Long64,
    /// 32-bit protected mode, paging off (PVH).
    Protected32,
}

/// Encodes a GDT descriptor from access/flag bits, base and limit.
pub fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    let base = u64::from(base);
    let limit = u64::from(limit);
    let flags = u64::from(flags);
    ((base & 0xff00_0000) << 32)
        | ((flags & 0xf0ff) << 40)
        | ((limit & 0x000f_0000) << 32)
        | ((base & 0x00ff_ffff) << 16)
        | (limit & 0xffff)
}

/// Decodes a GDT descriptor into the segment KVM expects.
pub fn segment_from_gdt(entry: u64, selector: u16) -> kvm_segment {
    let granularity = ((entry >> 55) & 1) as u8;
    // Limit bits 0..15 are the entry's bytes 0-1, bits 16..19 the low
    // nibble of its byte 6.
    let b = entry.to_le_bytes();
    let raw_limit = u32::from_le_bytes([b[0], b[1], b[6] & 0x0f, 0]);
    let present = ((entry >> 47) & 1) as u8;
    kvm_segment {
        base: ((entry >> 16) & 0x00ff_ffff) | ((entry >> 32) & 0xff00_0000),
        limit: if granularity == 1 {
            (raw_limit << 12) | 0xfff
        } else {
            raw_limit
        },
        selector,
        type_: ((entry >> 40) & 0xf) as u8,
        present,
        dpl: ((entry >> 45) & 0x3) as u8,
        db: ((entry >> 54) & 1) as u8,
        s: ((entry >> 44) & 1) as u8,
        l: ((entry >> 53) & 1) as u8,
        g: granularity,
        avl: ((entry >> 52) & 1) as u8,
        unusable: u8::from(present == 0),
        padding: 0,
    }
}

/// The boot GDT for `mode`.
pub fn boot_gdt(mode: EntryMode) -> [u64; GDT_ENTRIES] {
    let code = match mode {
        EntryMode::Long64 => gdt_entry(0xa09b, 0, 0xfffff),
        EntryMode::Protected32 => gdt_entry(0xc09b, 0, 0xfffff),
    };
    [
        0,
        code,
        gdt_entry(0xc093, 0, 0xfffff),
        gdt_entry(0x008b, 0, 0xfffff),
    ]
}

/// Writes the identity mapping of the first 4 GiB (2 MiB pages) used by the
/// 64-bit entry; the kernel replaces it early.
pub fn write_identity_page_tables(mem: &GuestMemoryMmap) -> Result<(), Error> {
    let w = |val: u64, addr: u64| {
        mem.write_obj(val, GuestAddress(addr))
            .map_err(|_| Error::GuestWrite("page tables"))
    };
    w(PDPTE_START | 0x3, PML4_START)?;
    for i in 0..4u64 {
        w((PDE_START + i * 0x1000) | 0x3, PDPTE_START + i * 8)?;
    }
    for i in 0..(4 * 512u64) {
        // Present, writable, page size (2 MiB).
        w((i << 21) | 0x83, PDE_START + i * 8)?;
    }
    Ok(())
}

/// Writes the GDT and an empty IDT, and fills `sregs` for `mode`.
pub fn setup_sregs(
    mem: &GuestMemoryMmap,
    sregs: &mut kvm_sregs,
    mode: EntryMode,
) -> Result<(), Error> {
    let gdt = boot_gdt(mode);
    for (i, entry) in gdt.iter().enumerate() {
        mem.write_obj(*entry, GuestAddress(BOOT_GDT_START + i as u64 * 8))
            .map_err(|_| Error::GuestWrite("GDT"))?;
    }
    mem.write_obj(0u64, GuestAddress(BOOT_IDT_START))
        .map_err(|_| Error::GuestWrite("IDT"))?;
    sregs.gdt.base = BOOT_GDT_START;
    sregs.gdt.limit = GDT_LIMIT;
    sregs.idt.base = BOOT_IDT_START;
    sregs.idt.limit = 7;

    let code = segment_from_gdt(gdt[1], CODE_SELECTOR);
    let data = segment_from_gdt(gdt[2], DATA_SELECTOR);
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = segment_from_gdt(gdt[3], TSS_SELECTOR);

    match mode {
        EntryMode::Long64 => {
            write_identity_page_tables(mem)?;
            sregs.cr3 = PML4_START;
            sregs.cr4 |= CR4_PAE;
            sregs.cr0 = CR0_PE | CR0_ET | CR0_PG;
            sregs.efer |= EFER_LME | EFER_LMA;
        }
        EntryMode::Protected32 => {
            sregs.cr0 = CR0_PE | CR0_ET;
            sregs.cr4 = 0;
            sregs.efer = 0;
        }
    }
    Ok(())
}

/// General registers for the boot vCPU. `boot_data` is the zero page
/// (passed in RSI) or the PVH start info (passed in RBX).
pub fn boot_regs(mode: EntryMode, entry: u64, boot_data: u64) -> kvm_regs {
    let mut regs = kvm_regs {
        rip: entry,
        rflags: 0x2,
        ..Default::default()
    };
    match mode {
        EntryMode::Long64 => {
            regs.rsp = BOOT_STACK_POINTER;
            regs.rbp = BOOT_STACK_POINTER;
            regs.rsi = boot_data;
        }
        EntryMode::Protected32 => regs.rbx = boot_data,
    }
    regs
}

/// Initial FPU/SSE state (x87 control word and MXCSR at their reset values).
pub fn boot_fpu() -> kvm_fpu {
    kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestAddress;

    #[test]
    fn gdt_entry_round_trip() {
        let code = gdt_entry(0xa09b, 0, 0xfffff);
        assert_eq!(code, 0x00af_9b00_0000_ffff);
        let seg = segment_from_gdt(code, CODE_SELECTOR);
        assert_eq!(seg.l, 1);
        assert_eq!(seg.db, 0);
        assert_eq!(seg.g, 1);
        assert_eq!(seg.limit, 0xffff_ffff);
        assert_eq!(seg.type_, 0xb);
        assert_eq!(seg.present, 1);
        assert_eq!(seg.unusable, 0);
        let data = segment_from_gdt(gdt_entry(0xc093, 0, 0xfffff), DATA_SELECTOR);
        assert_eq!(data.db, 1);
        assert_eq!(data.type_, 0x3);
        assert_eq!(segment_from_gdt(0, 0).unusable, 1);
    }

    #[test]
    fn protected_mode_code_segment_is_32_bit() {
        let seg = segment_from_gdt(boot_gdt(EntryMode::Protected32)[1], CODE_SELECTOR);
        assert_eq!(seg.l, 0);
        assert_eq!(seg.db, 1);
    }

    #[test]
    fn long_mode_state_and_page_tables() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        let mut sregs = kvm_sregs::default();
        setup_sregs(&mem, &mut sregs, EntryMode::Long64).unwrap();
        assert_eq!(sregs.cr3, PML4_START);
        assert_ne!(sregs.cr0 & CR0_PG, 0);
        assert_ne!(sregs.efer & EFER_LMA, 0);
        assert_eq!(sregs.cs.l, 1);
        let pml4: u64 = mem.read_obj(GuestAddress(PML4_START)).unwrap();
        assert_eq!(pml4, PDPTE_START | 3);
        let pdpte3: u64 = mem.read_obj(GuestAddress(PDPTE_START + 24)).unwrap();
        assert_eq!(pdpte3, (PDE_START + 0x3000) | 3);
        // Last 2 MiB page below 4 GiB.
        let last: u64 = mem.read_obj(GuestAddress(PDE_START + (2047 * 8))).unwrap();
        assert_eq!(last, (2047 << 21) | 0x83);
        let gdt1: u64 = mem.read_obj(GuestAddress(BOOT_GDT_START + 8)).unwrap();
        assert_eq!(gdt1, 0x00af_9b00_0000_ffff);
    }

    #[test]
    fn protected_mode_state_has_paging_off() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        let mut sregs = kvm_sregs::default();
        setup_sregs(&mem, &mut sregs, EntryMode::Protected32).unwrap();
        assert_eq!(sregs.cr0, CR0_PE | CR0_ET);
        assert_eq!(sregs.efer, 0);
        let regs = boot_regs(EntryMode::Protected32, 0x1000000, 0x6000);
        assert_eq!(regs.rbx, 0x6000);
        assert_eq!(regs.rip, 0x1000000);
        let regs = boot_regs(EntryMode::Long64, 0x100200, 0x7000);
        assert_eq!(regs.rsi, 0x7000);
        assert_eq!(regs.rsp, BOOT_STACK_POINTER);
    }
}
