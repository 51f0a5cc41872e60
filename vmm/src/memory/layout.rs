//! The x86_64 guest physical address map.
//!
//! Why fixed constants: the boot code, the ACPI tables, the e820 map and the
//! PCI host bridge windows must all agree on one map; keeping it in one file
//! makes a disagreement impossible to write by accident.
//!
//! ```text
//! 0x0000_0500  GDT (boot)           0x0000_0520  IDT (boot, empty)
//! 0x0000_6000  PVH hvm_start_info   0x0000_6040  PVH module list
//! 0x0000_6100  PVH memory map       0x0000_7000  zero page (boot_params)
//! 0x0000_8ff0  boot stack top       0x0000_9000  PML4, PDPT, 4 PDs (4 GiB)
//! 0x0002_0000  kernel command line  0x0009_fc00  EBDA (not RAM in e820)
//! 0x000e_0000  ACPI tables (RSDP first, found by the legacy BIOS-area scan)
//! 0x000f_fff0  reset vector stub (writes the ACPI reset register)
//! 0x0010_0000  kernel load (bzImage code32_start / vmlinux p_paddr)
//! ...          RAM up to min(size, 3 GiB)
//! 0xc000_0000  PCI 32-bit MMIO window (512 MiB)
//! 0xe000_0000  PCI ECAM (256 buses, 256 MiB)
//! 0xfec0_0000  IOAPIC               0xfee0_0000  local APIC
//! 0x1_0000_0000 RAM above 4 GiB (the part of `size` beyond 3 GiB)
//! align_up(end of RAM, 1 GiB): PCI 64-bit MMIO window (16 GiB)
//! ```

use crate::width::usize_from_u64;

/// Boot GDT (4 entries).
pub const BOOT_GDT_START: u64 = 0x500;
/// Boot IDT (empty; the kernel installs its own).
pub const BOOT_IDT_START: u64 = 0x520;
/// PVH `hvm_start_info`.
pub const PVH_INFO_START: u64 = 0x6000;
/// PVH module list (the initramfs).
pub const PVH_MODLIST_START: u64 = 0x6040;
/// PVH memory map entries.
pub const PVH_MEMMAP_START: u64 = 0x6100;
/// Maximum number of PVH memory map entries that fit before the zero page.
pub const PVH_MEMMAP_MAX_ENTRIES: usize = usize_from_u64(ZERO_PAGE_START - PVH_MEMMAP_START) / 24;
/// Linux boot protocol zero page.
pub const ZERO_PAGE_START: u64 = 0x7000;
/// Initial stack pointer for the boot vCPU.
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
/// Page map level 4 of the boot identity mapping.
pub const PML4_START: u64 = 0x9000;
/// Page directory pointer table of the boot identity mapping.
pub const PDPTE_START: u64 = 0xa000;
/// First of four page directories (2 MiB pages) mapping the first 4 GiB.
pub const PDE_START: u64 = 0xb000;
/// Kernel command line.
pub const CMDLINE_START: u64 = 0x20000;
/// Room reserved for the command line (Linux accepts at most 2 KiB by default).
pub const CMDLINE_MAX_SIZE: usize = 0x1000;
/// Start of the extended BIOS data area: low RAM ends here in e820.
pub const EBDA_START: u64 = 0x9fc00;
/// ACPI tables live in the legacy BIOS area where Linux scans for the RSDP.
pub const ACPI_START: u64 = 0xe0000;
/// End (exclusive) of the ACPI table area.
pub const ACPI_END: u64 = 0xffff0;
/// Real-mode reset vector (0xf000:0xfff0), see `boot::reset_vector`.
pub const RESET_VECTOR: u64 = 0xffff0;
/// First byte of "high" RAM, where the kernel is loaded.
pub const HIGH_RAM_START: u64 = 0x100000;
/// The 32-bit device hole starts at 3 GiB.
pub const MEM_32BIT_GAP_START: u64 = 0xc000_0000;
/// PCI 32-bit MMIO window for BARs.
pub const PCI_MMIO32_START: u64 = 0xc000_0000;
/// Size of the 32-bit MMIO window.
pub const PCI_MMIO32_SIZE: u64 = 0x2000_0000;
/// PCI Express enhanced configuration access mechanism (ECAM) region.
pub const PCI_ECAM_START: u64 = 0xe000_0000;
/// ECAM size: 256 buses x 32 devices x 8 functions x 4 KiB.
pub const PCI_ECAM_SIZE: u64 = 0x1000_0000;
/// Last bus number covered by the ECAM region.
pub const PCI_ECAM_LAST_BUS: u8 = 0xff;
/// IOAPIC MMIO base (KVM's in-kernel IOAPIC answers here).
pub const IOAPIC_START: u64 = 0xfec0_0000;
/// Local APIC MMIO base.
pub const APIC_START: u64 = 0xfee0_0000;
/// First address above the 32-bit space.
pub const FIRST_ADDR_PAST_32BITS: u64 = 1 << 32;
/// Size of the 64-bit PCI MMIO window placed above RAM.
pub const PCI_MMIO64_SIZE: u64 = 16 << 30;
/// PCI I/O port window for I/O BARs (the host bridge's `_CRS`).
pub const PCI_IO_START: u64 = 0x1000;
/// Size of the PCI I/O port window.
pub const PCI_IO_SIZE: u64 = 0xf000;
/// TSS address KVM needs on Intel for real-mode emulation (3 pages).
pub const KVM_TSS_ADDRESS: u64 = 0xfffb_d000;
/// Identity map page KVM needs on Intel (1 page, just below the TSS).
pub const KVM_IDENTITY_MAP_ADDRESS: u64 = 0xfffb_c000;

/// Smallest guest RAM we accept: a Debian kernel plus initramfs does not fit in less.
pub const MIN_MEMORY_SIZE: u64 = 64 << 20;
/// Largest guest RAM we accept (also keeps the 64-bit window below 2^46).
pub const MAX_MEMORY_SIZE: u64 = 1 << 40;

/// The kind of an e820 entry, with the values of the e820 ABI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum E820Kind {
    /// Usable RAM.
    Ram = 1,
    /// Reserved: the guest must not use it as RAM.
    Reserved = 2,
}

/// One entry of the guest's physical memory map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct E820Entry {
    /// First address.
    pub addr: u64,
    /// Length in bytes.
    pub size: u64,
    /// RAM or reserved.
    pub kind: E820Kind,
}

/// Guest RAM regions (start, length) for `mem_size` bytes of RAM: one region
/// below the 32-bit hole and, if needed, one above 4 GiB.
pub fn ram_regions(mem_size: u64) -> Vec<(u64, u64)> {
    if mem_size <= MEM_32BIT_GAP_START {
        vec![(0, mem_size)]
    } else {
        vec![
            (0, MEM_32BIT_GAP_START),
            (FIRST_ADDR_PAST_32BITS, mem_size - MEM_32BIT_GAP_START),
        ]
    }
}

/// End (exclusive) of the RAM below 4 GiB.
pub fn low_ram_end(mem_size: u64) -> u64 {
    mem_size.min(MEM_32BIT_GAP_START)
}

/// End (exclusive) of the highest RAM region.
pub fn ram_end(mem_size: u64) -> u64 {
    ram_regions(mem_size)
        .last()
        .map(|(start, len)| start + len)
        .unwrap_or(0)
}

/// The 64-bit PCI MMIO window (start, size): 1 GiB-aligned, above RAM and 4 GiB.
pub fn pci_mmio64_window(mem_size: u64) -> (u64, u64) {
    let base = ram_end(mem_size).max(FIRST_ADDR_PAST_32BITS);
    let aligned = base.div_ceil(1 << 30) * (1 << 30);
    (aligned, PCI_MMIO64_SIZE)
}

/// The e820 map handed to the guest (zero page or PVH memmap).
pub fn e820_entries(mem_size: u64) -> Vec<E820Entry> {
    let mut entries = vec![E820Entry {
        addr: 0,
        size: EBDA_START,
        kind: E820Kind::Ram,
    }];
    let low_end = low_ram_end(mem_size);
    if low_end > HIGH_RAM_START {
        entries.push(E820Entry {
            addr: HIGH_RAM_START,
            size: low_end - HIGH_RAM_START,
            kind: E820Kind::Ram,
        });
    }
    // Linux only trusts the MCFG's ECAM area if firmware reserved it.
    entries.push(E820Entry {
        addr: PCI_ECAM_START,
        size: PCI_ECAM_SIZE,
        kind: E820Kind::Reserved,
    });
    if mem_size > MEM_32BIT_GAP_START {
        entries.push(E820Entry {
            addr: FIRST_ADDR_PAST_32BITS,
            size: mem_size - MEM_32BIT_GAP_START,
            kind: E820Kind::Ram,
        });
    }
    entries
}

// The fixed areas must not collide; checked at compile time.
const _: () = {
    assert!(PCI_MMIO32_START + PCI_MMIO32_SIZE <= PCI_ECAM_START);
    assert!(PCI_ECAM_START + PCI_ECAM_SIZE <= IOAPIC_START);
    assert!(PDE_START + 4 * 0x1000 <= CMDLINE_START);
    assert!(BOOT_STACK_POINTER < PML4_START);
    assert!(PVH_MEMMAP_MAX_ENTRIES >= 8);
    assert!(CMDLINE_START + CMDLINE_MAX_SIZE as u64 <= EBDA_START);
};

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    #[test]
    fn small_memory_is_one_region() {
        assert_eq!(ram_regions(512 * MIB), vec![(0, 512 * MIB)]);
        assert_eq!(low_ram_end(512 * MIB), 512 * MIB);
        assert_eq!(ram_end(512 * MIB), 512 * MIB);
    }

    #[test]
    fn large_memory_splits_around_the_hole() {
        let regions = ram_regions(4 * GIB);
        assert_eq!(regions, vec![(0, 3 * GIB), (4 * GIB, GIB)]);
        assert_eq!(ram_end(4 * GIB), 5 * GIB);
        let total: u64 = regions.iter().map(|r| r.1).sum();
        assert_eq!(total, 4 * GIB);
    }

    #[test]
    fn exactly_three_gib_needs_no_high_region() {
        assert_eq!(ram_regions(3 * GIB).len(), 1);
    }

    #[test]
    fn e820_excludes_legacy_hole_and_reserves_ecam() {
        let e = e820_entries(512 * MIB);
        assert_eq!(e[0].addr, 0);
        assert_eq!(e[0].size, EBDA_START);
        assert_eq!(e[1].addr, HIGH_RAM_START);
        assert_eq!(e[1].addr + e[1].size, 512 * MIB);
        assert!(e
            .iter()
            .any(|x| x.addr == PCI_ECAM_START && x.kind == E820Kind::Reserved));
        // No RAM entry overlaps the ACPI area or the 32-bit hole.
        for x in e.iter().filter(|x| x.kind == E820Kind::Ram) {
            let end = x.addr + x.size;
            assert!(end <= ACPI_START || x.addr >= HIGH_RAM_START);
            assert!(end <= MEM_32BIT_GAP_START || x.addr >= FIRST_ADDR_PAST_32BITS);
        }
    }

    #[test]
    fn e820_ram_above_4g_matches_regions() {
        let e = e820_entries(6 * GIB);
        let high = e.iter().find(|x| x.addr == 4 * GIB).unwrap();
        assert_eq!(high.size, 3 * GIB);
        assert_eq!(high.kind, E820Kind::Ram);
    }

    #[test]
    fn mmio64_window_is_above_ram_and_aligned() {
        let (start, size) = pci_mmio64_window(512 * MIB);
        assert_eq!(start, 4 * GIB);
        assert_eq!(size, PCI_MMIO64_SIZE);
        let (start, _) = pci_mmio64_window(4 * GIB + 1);
        assert_eq!(start, 6 * GIB);
        assert!(start >= ram_end(4 * GIB + 1));
    }
}
