//! Building the ACPI tables and placing them in the BIOS area.
//!
//! The platform is HW-reduced ACPI (no PM1 blocks, no SCI, no legacy PIC or
//! PIT use by the guest): `poweroff` writes SLP_TYP=5|SLP_EN to the FADT's
//! sleep control register and reboot writes the reset value to the reset
//! register; both are small port devices (see `devices::power`).

use acpi_tables::fadt::{FADTBuilder, Flags, PmProfile};
use acpi_tables::gas::{AccessSize, AddressSpace, GAS};
use acpi_tables::mcfg::MCFG;
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::Aml;
use vm_memory::{Bytes, GuestAddress};

use super::dsdt::{build_dsdt, COM1_IRQ};
use super::{OEM_ID, OEM_REVISION, OEM_TABLE_ID};
use crate::devices::power::{RESET_PORT, RESET_VALUE, SLEEP_CONTROL_PORT, SLEEP_STATUS_PORT};
use crate::error::{AcpiError, Error};
use crate::memory::layout::{
    ACPI_END, ACPI_START, APIC_START, IOAPIC_START, PCI_ECAM_LAST_BUS, PCI_ECAM_START,
};
use crate::memory::GuestMemoryMmap;
use crate::pci::PciWindows;
use crate::width::{const_u32, const_u8};

/// The MADT's 32-bit address fields and its 8-bit source IRQ, narrowed by
/// the compiler (a constant that did not fit would fail the build).
const LAPIC_ADDR: u32 = const_u32(APIC_START as i128);
const IOAPIC_ADDR: u32 = const_u32(IOAPIC_START as i128);
const COM1_ISA_IRQ: u8 = const_u8(COM1_IRQ as i128);

/// FADT IA-PC boot architecture flag: no VGA to probe.
const IAPC_BOOT_ARCH_NO_VGA: u16 = 1 << 2;
/// FADT IA-PC boot architecture flag: no CMOS RTC (time comes from kvmclock).
const IAPC_BOOT_ARCH_NO_CMOS_RTC: u16 = 1 << 5;

/// MADT structure types.
const MADT_LOCAL_APIC: u8 = 0;
const MADT_IO_APIC: u8 = 1;
const MADT_INTERRUPT_SOURCE_OVERRIDE: u8 = 2;

/// What the tables describe.
#[derive(Clone, Copy, Debug)]
pub struct AcpiConfig {
    /// Number of vCPUs (APIC ids 0..n).
    pub num_vcpus: u8,
    /// PCI host bridge windows.
    pub pci_windows: PciWindows,
}

fn byte_gas(port: u16) -> GAS {
    GAS::new(
        AddressSpace::SystemIo,
        8,
        0,
        AccessSize::ByteAccess,
        u64::from(port),
    )
}

fn to_bytes(aml: &dyn Aml) -> Vec<u8> {
    let mut v = Vec::new();
    aml.to_aml_bytes(&mut v);
    v
}

/// The FADT pointing at the DSDT at `dsdt_addr`.
pub fn build_fadt(dsdt_addr: u64) -> Vec<u8> {
    let mut fadt = FADTBuilder::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION)
        .dsdt_64(dsdt_addr)
        .flag(Flags::HwReducedAcpi)
        .flag(Flags::ResetRegSup)
        .flag(Flags::PwrButton)
        .flag(Flags::SlpButton)
        .preferred_pm_profile(PmProfile::EnterpriseServer);
    fadt.reset_reg = byte_gas(RESET_PORT);
    fadt.reset_value = RESET_VALUE;
    fadt.sleep_control_reg = byte_gas(SLEEP_CONTROL_PORT);
    fadt.sleep_status_reg = byte_gas(SLEEP_STATUS_PORT);
    fadt.iapc_boot_arch = (IAPC_BOOT_ARCH_NO_VGA | IAPC_BOOT_ARCH_NO_CMOS_RTC).into();
    fadt.hypervisor_vendor_identity = u64::from_le_bytes(*b"DMAVISOR").into();
    to_bytes(&fadt.finalize())
}

/// The MADT: one enabled local APIC per vCPU, the IOAPIC and the ISA
/// interrupt overrides of the devices we model.
pub fn build_madt(num_vcpus: u8) -> Vec<u8> {
    let mut madt = Sdt::new(*b"APIC", 44, 5, OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    madt.write_bytes(36, &LAPIC_ADDR.to_le_bytes());
    // Flags 0: no dual-8259 setup to mask (HW-reduced platform).
    madt.write_bytes(40, &0u32.to_le_bytes());
    for id in 0..num_vcpus {
        let mut lapic = vec![MADT_LOCAL_APIC, 8, id, id];
        lapic.extend_from_slice(&1u32.to_le_bytes());
        madt.append_slice(&lapic);
    }
    let mut ioapic = vec![MADT_IO_APIC, 12, 0, 0];
    ioapic.extend_from_slice(&IOAPIC_ADDR.to_le_bytes());
    ioapic.extend_from_slice(&0u32.to_le_bytes());
    madt.append_slice(&ioapic);
    // COM1: ISA IRQ 4 is GSI 4, edge, active high (flags 0 = bus default).
    let mut iso = vec![MADT_INTERRUPT_SOURCE_OVERRIDE, 10, 0, COM1_ISA_IRQ];
    iso.extend_from_slice(&COM1_IRQ.to_le_bytes());
    iso.extend_from_slice(&0u16.to_le_bytes());
    madt.append_slice(&iso);
    madt.as_slice().to_vec()
}

/// The MCFG describing the ECAM region of segment 0.
pub fn build_mcfg() -> Vec<u8> {
    let mut mcfg = MCFG::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    mcfg.add_ecam(PCI_ECAM_START, 0, 0, PCI_ECAM_LAST_BUS);
    to_bytes(&mcfg)
}

/// All tables with their guest addresses, RSDP first at [`ACPI_START`].
pub fn build_tables(cfg: &AcpiConfig) -> Result<Vec<(u64, Vec<u8>)>, Error> {
    build_tables_with(cfg, &[])
}

/// Like [`build_tables`], plus `extra` finished tables (e.g. the VIOT when a
/// virtual IOMMU is present) placed after the MCFG and listed in the XSDT.
pub fn build_tables_with(
    cfg: &AcpiConfig,
    extra: &[Vec<u8>],
) -> Result<Vec<(u64, Vec<u8>)>, Error> {
    let align = |x: u64| x.div_ceil(16) * 16;
    let mut placed: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut next = align(ACPI_START + Rsdp::len() as u64);
    let mut place = |bytes: Vec<u8>, placed: &mut Vec<(u64, Vec<u8>)>| {
        let at = next;
        next = align(at + bytes.len() as u64);
        placed.push((at, bytes));
        at
    };
    let dsdt = place(
        build_dsdt(&cfg.pci_windows).as_slice().to_vec(),
        &mut placed,
    );
    let fadt = place(build_fadt(dsdt), &mut placed);
    let madt = place(build_madt(cfg.num_vcpus), &mut placed);
    let mcfg = place(build_mcfg(), &mut placed);
    let mut entries = vec![fadt, madt, mcfg];
    for table in extra {
        entries.push(place(table.clone(), &mut placed));
    }
    let mut xsdt = XSDT::new(OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    for t in entries {
        xsdt.add_entry(t);
    }
    let xsdt_addr = place(to_bytes(&xsdt), &mut placed);
    if next > ACPI_END {
        return Err(AcpiError::TooLarge {
            bytes: next - ACPI_START,
        }
        .into());
    }
    placed.insert(0, (ACPI_START, to_bytes(&Rsdp::new(OEM_ID, xsdt_addr))));
    Ok(placed)
}

/// Writes the tables into guest memory; returns the RSDP address.
pub fn create_acpi_tables(mem: &GuestMemoryMmap, cfg: &AcpiConfig) -> Result<u64, Error> {
    create_acpi_tables_with(mem, cfg, &[])
}

/// Like [`create_acpi_tables`] with `extra` tables (see [`build_tables_with`]).
pub fn create_acpi_tables_with(
    mem: &GuestMemoryMmap,
    cfg: &AcpiConfig,
    extra: &[Vec<u8>],
) -> Result<u64, Error> {
    for (addr, bytes) in build_tables_with(cfg, extra)? {
        mem.write_slice(&bytes, GuestAddress(addr))
            .map_err(|_| Error::GuestWrite("ACPI tables"))?;
    }
    Ok(ACPI_START)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acpi::viot::build_viot;
    use crate::acpi::viot::ViotConfig;

    fn cfg(n: u8) -> AcpiConfig {
        AcpiConfig {
            num_vcpus: n,
            pci_windows: PciWindows {
                io: (0x1000, 0xf000),
                mmio32: (0xc000_0000, 0x2000_0000),
                mmio64: (0x1_0000_0000, 0x4_0000_0000),
            },
        }
    }

    fn sum(b: &[u8]) -> u8 {
        b.iter().fold(0u8, |a, x| a.wrapping_add(*x))
    }

    fn u32_at(b: &[u8], off: usize) -> u32 {
        u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
    }

    fn u64_at(b: &[u8], off: usize) -> u64 {
        u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
    }

    fn find<'a>(t: &'a [(u64, Vec<u8>)], sig: &[u8]) -> &'a (u64, Vec<u8>) {
        t.iter().find(|(_, b)| &b[0..sig.len()] == sig).unwrap()
    }

    #[test]
    fn every_table_checksums_to_zero_and_has_its_length() {
        let t = build_tables(&cfg(2)).unwrap();
        let (rsdp_addr, rsdp) = &t[0];
        assert_eq!(*rsdp_addr, ACPI_START);
        assert_eq!(&rsdp[0..8], b"RSD PTR ");
        assert_eq!(sum(&rsdp[0..20]), 0);
        assert_eq!(sum(rsdp), 0);
        for (_, b) in &t[1..] {
            assert_eq!(u32_at(b, 4) as usize, b.len());
            assert_eq!(sum(b), 0, "checksum of {:?}", std::str::from_utf8(&b[0..4]));
        }
    }

    #[test]
    fn rsdp_xsdt_fadt_dsdt_chain() {
        let t = build_tables(&cfg(1)).unwrap();
        let xsdt_addr = u64_at(&t[0].1, 24);
        let xsdt = &t.iter().find(|(a, _)| *a == xsdt_addr).unwrap().1;
        assert_eq!(&xsdt[0..4], b"XSDT");
        let entries: Vec<u64> = (36..xsdt.len())
            .step_by(8)
            .map(|o| u64_at(xsdt, o))
            .collect();
        assert_eq!(entries.len(), 3);
        let sigs: Vec<&[u8]> = entries
            .iter()
            .map(|a| &t.iter().find(|(x, _)| x == a).unwrap().1[0..4])
            .collect();
        assert_eq!(sigs, vec![&b"FACP"[..], b"APIC", b"MCFG"]);
        let fadt = &find(&t, b"FACP").1;
        let dsdt_addr = u64_at(fadt, 140);
        assert_eq!(
            &t.iter().find(|(a, _)| *a == dsdt_addr).unwrap().1[0..4],
            b"DSDT"
        );
        for (a, b) in &t {
            assert!(*a >= ACPI_START && a + b.len() as u64 <= ACPI_END);
        }
    }

    #[test]
    fn fadt_is_hw_reduced_with_sleep_and_reset_registers() {
        let fadt = build_fadt(0xe0100);
        let flags = u32_at(&fadt, 112);
        assert_ne!(flags & (1 << 20), 0, "HW_REDUCED_ACPI");
        assert_ne!(flags & (1 << 10), 0, "RESET_REG_SUP");
        // reset_reg GAS at 116: space id 1 (I/O), width 8, address.
        assert_eq!(fadt[116], 1);
        assert_eq!(fadt[117], 8);
        assert_eq!(u64_at(&fadt, 120), u64::from(RESET_PORT));
        assert_eq!(fadt[128], RESET_VALUE);
        // sleep control (244) and status (256) registers.
        assert_eq!(fadt[244], 1);
        assert_eq!(u64_at(&fadt, 248), u64::from(SLEEP_CONTROL_PORT));
        assert_eq!(fadt[256], 1);
        assert_eq!(u64_at(&fadt, 260), u64::from(SLEEP_STATUS_PORT));
        assert_eq!(u16::from_le_bytes([fadt[109], fadt[110]]), 0x24);
        assert_eq!(fadt.len(), 276);
    }

    #[test]
    fn madt_has_one_local_apic_per_vcpu() {
        for n in [1u8, 2, 7] {
            let madt = build_madt(n);
            assert_eq!(sum(&madt), 0);
            assert_eq!(u32_at(&madt, 36), LAPIC_ADDR);
            let mut off = 44;
            let mut lapics = Vec::new();
            let mut ioapics = 0;
            let mut overrides = Vec::new();
            while off < madt.len() {
                let (ty, len) = (madt[off], madt[off + 1] as usize);
                match ty {
                    0 => {
                        assert_eq!(len, 8);
                        assert_eq!(madt[off + 2], madt[off + 3], "uid == apic id");
                        assert_eq!(u32_at(&madt, off + 4), 1, "enabled");
                        lapics.push(madt[off + 3]);
                    }
                    1 => {
                        assert_eq!(u32_at(&madt, off + 4), IOAPIC_ADDR);
                        assert_eq!(u32_at(&madt, off + 8), 0);
                        ioapics += 1;
                    }
                    2 => overrides.push((madt[off + 3], u32_at(&madt, off + 4))),
                    _ => panic!("unexpected MADT entry {ty}"),
                }
                off += len;
            }
            assert_eq!(off, madt.len());
            assert_eq!(lapics, (0..n).collect::<Vec<_>>());
            assert_eq!(ioapics, 1);
            assert_eq!(overrides, vec![(4, 4)]);
        }
    }

    #[test]
    fn mcfg_describes_ecam() {
        let mcfg = build_mcfg();
        assert_eq!(&mcfg[0..4], b"MCFG");
        assert_eq!(sum(&mcfg), 0);
        assert_eq!(mcfg.len(), 44 + 16);
        assert_eq!(u64_at(&mcfg, 44), PCI_ECAM_START);
        assert_eq!(u16::from_le_bytes([mcfg[52], mcfg[53]]), 0);
        assert_eq!(mcfg[54], 0);
        assert_eq!(mcfg[55], 0xff);
    }

    #[test]
    fn extra_tables_are_placed_and_listed_in_the_xsdt() {
        let viot = build_viot(&ViotConfig {
            segment: 0,
            iommu: crate::pci::PciAddress {
                bus: 0,
                device: 1,
                function: 0,
            },
            endpoints: vec![],
        });
        let t = build_tables_with(&cfg(1), std::slice::from_ref(&viot)).unwrap();
        let xsdt_addr = u64_at(&t[0].1, 24);
        let xsdt = &t.iter().find(|(a, _)| *a == xsdt_addr).unwrap().1;
        assert_eq!(xsdt.len(), 36 + 4 * 8);
        let last = u64_at(xsdt, 36 + 3 * 8);
        assert_eq!(&t.iter().find(|(a, _)| *a == last).unwrap().1, &viot);
        assert_eq!(sum(xsdt), 0);
    }

    #[test]
    fn many_vcpus_still_fit() {
        assert!(build_tables(&cfg(64)).is_ok());
    }
}
