//! The DSDT: PCI host bridge with its resource windows, COM1, the power
//! button behind a Generic Event Device (`acpi::ged`) and the S5 sleep
//! state that makes `poweroff` reach the sleep control register.

use acpi_tables::aml::{
    self, AddressSpace, AddressSpaceCacheable, Device, EISAName, Interrupt, Name, Package, Path,
    ResourceTemplate, IO,
};
use acpi_tables::sdt::Sdt;
use acpi_tables::Aml;

use super::{OEM_ID, OEM_REVISION, OEM_TABLE_ID};
use crate::devices::power::S5_SLEEP_TYPE;
use crate::memory::layout::{PCI_ECAM_LAST_BUS, PCI_IO_SIZE, PCI_IO_START};
use crate::pci::config_access::{PCI_CONFIG_IO_PORT, PCI_CONFIG_IO_PORT_SIZE};
use crate::pci::PciWindows;
use crate::width::{const_u16, const_u8};

/// The host bridge's port ranges as the 16-bit fields of its `_CRS`,
/// narrowed by the compiler (a layout change that did not fit would fail the
/// build, not wrap in the table the guest reads).
const CFG_PORT: u16 = const_u16(PCI_CONFIG_IO_PORT as i128);
const CFG_PORT_LEN: u8 = const_u8(PCI_CONFIG_IO_PORT_SIZE as i128);
const IO_WINDOW_FIRST: u16 = const_u16(PCI_IO_START as i128);
const IO_WINDOW_LAST: u16 = const_u16((PCI_IO_START + PCI_IO_SIZE - 1) as i128);

/// COM1's port and IRQ as described to the guest.
pub const COM1_PORT: u16 = 0x3f8;
/// COM1's IRQ (GSI).
pub const COM1_IRQ: u32 = 4;

/// Builds the DSDT AML for the given PCI windows.
pub fn build_dsdt(windows: &PciWindows) -> Sdt {
    let mut sdt = Sdt::new(*b"DSDT", 36, 6, OEM_ID, OEM_TABLE_ID, OEM_REVISION);
    let mut body = Vec::new();
    body.extend(pci_host_bridge(windows));
    body.extend(super::pci_hotplug::slot_devices());
    body.extend(super::pci_hotplug::controller());
    body.extend(com1());
    body.extend(super::ged::power_button());
    body.extend(super::ged::generic_event_device());
    body.extend(s5());
    sdt.append_slice(&body);
    sdt
}

fn pci_host_bridge(windows: &PciWindows) -> Vec<u8> {
    let (m32_start, m32_size) = windows.mmio32;
    let (m64_start, m64_size) = windows.mmio64;
    #[allow(
        clippy::cast_possible_truncation,
        reason = "mmio32 is the 32-bit BAR window, below 4 GiB by construction (vm.rs)"
    )]
    let (m32_first, m32_last) = (m32_start as u32, (m32_start + m32_size - 1) as u32);
    let bus_range = AddressSpace::new_bus_number(0u16, u16::from(PCI_ECAM_LAST_BUS));
    let cfg_ports = IO::new(CFG_PORT, CFG_PORT, 1, CFG_PORT_LEN);
    let io_window = AddressSpace::new_io(IO_WINDOW_FIRST, IO_WINDOW_LAST, None);
    let mmio32 = AddressSpace::new_memory(
        AddressSpaceCacheable::NotCacheable,
        true,
        m32_first,
        m32_last,
        None,
    );
    let mmio64 = AddressSpace::new_memory(
        AddressSpaceCacheable::NotCacheable,
        true,
        m64_start,
        m64_start + m64_size - 1,
        None,
    );
    let crs = ResourceTemplate::new(vec![&bus_range, &cfg_ports, &io_window, &mmio32, &mmio64]);
    let hid = EISAName::new("PNP0A08");
    let cid = EISAName::new("PNP0A03");
    let zero = aml::ZERO;
    let names = [
        Name::new("_HID".into(), &hid),
        Name::new("_CID".into(), &cid),
        Name::new("_ADR".into(), &zero),
        Name::new("_SEG".into(), &zero),
        Name::new("_UID".into(), &zero),
        Name::new("_BBN".into(), &zero),
        Name::new("_CRS".into(), &crs),
    ];
    let children: Vec<&dyn Aml> = names.iter().map(|n| n as &dyn Aml).collect();
    let mut out = Vec::new();
    Device::new(Path::new("\\_SB_.PCI0"), children).to_aml_bytes(&mut out);
    out
}

fn com1() -> Vec<u8> {
    let hid = EISAName::new("PNP0501");
    let zero = aml::ZERO;
    let port = IO::new(COM1_PORT, COM1_PORT, 0, 8);
    let irq = Interrupt::new(true, true, false, false, COM1_IRQ);
    let crs = ResourceTemplate::new(vec![&port, &irq]);
    let names = [
        Name::new("_HID".into(), &hid),
        Name::new("_UID".into(), &zero),
        Name::new("_CRS".into(), &crs),
    ];
    let children: Vec<&dyn Aml> = names.iter().map(|n| n as &dyn Aml).collect();
    let mut out = Vec::new();
    Device::new(Path::new("\\_SB_.COM1"), children).to_aml_bytes(&mut out);
    out
}

fn s5() -> Vec<u8> {
    let typ = S5_SLEEP_TYPE;
    let zero = aml::ZERO;
    let pkg = Package::new(vec![&typ, &zero]);
    let mut out = Vec::new();
    Name::new("_S5_".into(), &pkg).to_aml_bytes(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acpi::test_util::contains;

    fn windows() -> PciWindows {
        PciWindows {
            io: (0x1000, 0xf000),
            mmio32: (0xc000_0000, 0x2000_0000),
            mmio64: (0x1_0000_0000, 0x4_0000_0000),
        }
    }

    #[test]
    fn dsdt_has_valid_checksum_and_objects() {
        let dsdt = build_dsdt(&windows());
        let bytes = dsdt.as_slice();
        assert_eq!(&bytes[0..4], b"DSDT");
        let len = u32::from_le_bytes(bytes[4..8].try_into().unwrap()) as usize;
        assert_eq!(len, bytes.len());
        assert_eq!(bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b)), 0);
        assert!(contains(bytes, b"PCI0"));
        assert!(contains(bytes, b"COM1"));
        assert!(contains(bytes, b"_S5_"));
        assert!(contains(bytes, b"PWRB"));
        assert!(contains(bytes, b"ACPI0013"));
        assert!(contains(bytes, b"_CRS"));
        // EISA id of PNP0A08 encoded as a dword.
        assert!(contains(bytes, &[0x41, 0xd0, 0x0a, 0x08]));
        // QWordMemory descriptor bounds of the 64-bit window.
        assert!(contains(bytes, &0x1_0000_0000u64.to_le_bytes()));
        assert!(contains(bytes, &0x4_ffff_ffffu64.to_le_bytes()));
        // DWordMemory bounds of the 32-bit window.
        assert!(contains(bytes, &0xc000_0000u32.to_le_bytes()));
        assert!(contains(bytes, &0xdfff_ffffu32.to_le_bytes()));
    }
}
