//! ACPI tables: how the guest discovers CPUs, the interrupt controllers, the
//! PCI host bridge, the power button and how to power off or reset.

pub mod dsdt;
pub mod ged;
pub mod pci_hotplug;
pub mod tables;
pub mod viot;

pub use tables::{create_acpi_tables, AcpiConfig};

/// OEM id stamped into every table.
pub const OEM_ID: [u8; 6] = *b"DMAVSR";
/// OEM table id stamped into every table.
pub const OEM_TABLE_ID: [u8; 8] = *b"DMAVISOR";
/// OEM revision.
pub const OEM_REVISION: u32 = 1;

#[cfg(test)]
mod test_util {
    /// Whether the AML (or table) bytes `hay` contain `needle`.
    pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
        hay.windows(needle.len()).any(|w| w == needle)
    }
}
