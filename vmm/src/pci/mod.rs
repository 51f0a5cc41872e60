//! PCI root complex: one segment, bus 0, reachable through ECAM (MMIO) and
//! the legacy 0xcf8/0xcfc ports.
//!
//! # API for device authors
//!
//! A device implements [`PciDevice`] and usually embeds a
//! [`PciConfiguration`] that holds its header, BARs and capability list:
//!
//! ```text
//! let mut config = PciConfiguration::new(PciHeader { vendor_id: 0x1af4, .. });
//! config.add_bar(0, 0x4000, BarKind::Mem64 { prefetchable: false })?;
//! config.add_capability(0x09, &vendor_cap_body)?;      // returns its offset
//! let dev: Arc<Mutex<dyn PciDevice>> = Arc::new(Mutex::new(MyDevice { config, .. }));
//! let bdf = pci_root.add_device(dev)?;                   // allocates BARs, maps them
//! ```
//!
//! - [`PciRoot::add_device`] takes the next free slot on bus 0, allocates
//!   every declared BAR from the host bridge windows (I/O, 32-bit MMIO or
//!   64-bit MMIO, naturally aligned), writes the addresses into the device's
//!   configuration space via [`PciConfiguration::set_bar_address`] and
//!   registers each BAR on the I/O or MMIO [`Bus`](crate::devices::bus::Bus).
//! - Guest accesses to a BAR arrive at [`PciDevice::read_bar`] /
//!   [`PciDevice::write_bar`] with the BAR index and the offset inside it,
//!   under the device's own mutex only (no global lock).
//! - Configuration accesses arrive at [`PciDevice::read_config_register`] /
//!   [`PciDevice::write_config_register`]; the defaults forward to the
//!   embedded [`PciConfiguration`]. Override them to react to capability
//!   writes (e.g. MSI-X enable), then call the default logic for the rest.
//!   If the guest moves a BAR the write returns a [`BarReprogram`]; the
//!   root takes the new range from its window, moves the bus range and
//!   calls [`PciDevice::bars_moved`], or, if any of these refuses, puts
//!   the BAR back where it was in all of them.
//! - Interrupts: devices are expected to use MSI-X routed through KVM irqfds
//!   (see the VM's interrupt routing); legacy INTx is not wired.
//! - Windows (also published in the DSDT `_CRS`): see
//!   [`crate::memory::layout`] `PCI_MMIO32_*`, `PCI_IO_*` and
//!   `pci_mmio64_window()`.

pub mod config;
pub mod config_access;
pub mod host_bridge;
pub mod root;

pub use config::{
    merge_write, Bar, BarKind, BarPlaceError, BarReprogram, PciConfigError, PciConfiguration,
    PciHeader,
};
pub use root::{PciAddress, PciError, PciRoot, PciWindows};

/// A PCI function shared between the root complex and its BAR regions.
pub type SharedPciDevice = std::sync::Arc<std::sync::Mutex<dyn PciDevice>>;

/// An emulated PCI function.
pub trait PciDevice: Send {
    /// The embedded configuration space.
    fn config(&self) -> &PciConfiguration;
    /// The embedded configuration space, mutable.
    fn config_mut(&mut self) -> &mut PciConfiguration;

    /// Reads configuration register `reg` (byte offset `reg * 4`).
    fn read_config_register(&mut self, reg: usize) -> u32 {
        self.config().read_reg(reg)
    }

    /// Writes 1, 2 or 4 bytes at byte `offset` (0..=3) of register `reg`.
    /// Returns the BAR move this caused, if any.
    fn write_config_register(
        &mut self,
        reg: usize,
        offset: u64,
        data: &[u8],
    ) -> Option<BarReprogram> {
        self.config_mut().write_reg(reg, offset, data)
    }

    /// Guest read of `data.len()` bytes at `offset` inside BAR `bar`.
    fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]);

    /// Guest write of `data` at `offset` inside BAR `bar`.
    fn write_bar(&mut self, bar: usize, offset: u64, data: &[u8]);

    /// The guest moved a BAR and the root moved its bus range: put what
    /// else decodes the function's BARs (a KVM slot mapping a BAR straight
    /// into the guest) where the configuration space now says. An error
    /// refuses the move: the root puts the bus range and the configuration
    /// back and calls this again, so that every view of the BAR agrees.
    fn bars_moved(&mut self) -> Result<(), BarPlaceError> {
        Ok(())
    }

    /// The function is leaving the root complex (hot-unplug): give up
    /// every guest-physical range it decodes outside the buses, such as
    /// BARs mapped straight into the guest as KVM memory slots. Called
    /// before its BAR ranges go back to the windows, so the next function
    /// plugged cannot be handed a range a stale slot still covers (the
    /// device itself may live on a little while an access holds it).
    fn unplugged(&mut self) {}

    /// The VM is being torn down (its vCPUs have stopped): end every
    /// thread of the function and every use of guest memory, and return
    /// only when none is left, as a device reset does. Called before the
    /// VM's memory is unmapped; the default is for functions with no
    /// thread of their own.
    fn stop(&mut self) {}
}
