//! The host bridge at 00:00.0.
//!
//! Why a device at all: Linux expects function 00:00.0 to exist on a PCI
//! root bus; it carries no BARs and only identifies the root complex.

use super::{PciConfiguration, PciDevice, PciHeader};

/// Red Hat's vendor id for virtual hardware.
pub const HOST_BRIDGE_VENDOR_ID: u16 = 0x1b36;
/// The "generic PCIe host bridge" device id in that vendor's range.
pub const HOST_BRIDGE_DEVICE_ID: u16 = 0x0008;

/// A PCI host bridge function (class 06/00).
pub struct HostBridge {
    config: PciConfiguration,
}

impl HostBridge {
    /// Creates the bridge's configuration space.
    pub fn new() -> Self {
        Self {
            config: PciConfiguration::new(PciHeader {
                vendor_id: HOST_BRIDGE_VENDOR_ID,
                device_id: HOST_BRIDGE_DEVICE_ID,
                class: 0x06,
                subclass: 0x00,
                prog_if: 0,
                revision: 0,
                subsystem_vendor_id: 0,
                subsystem_id: 0,
                interrupt_pin: 0,
            }),
        }
    }
}

impl Default for HostBridge {
    fn default() -> Self {
        Self::new()
    }
}

impl PciDevice for HostBridge {
    fn config(&self) -> &PciConfiguration {
        &self.config
    }
    fn config_mut(&mut self) -> &mut PciConfiguration {
        &mut self.config
    }
    fn read_bar(&mut self, _bar: usize, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }
    fn write_bar(&mut self, _bar: usize, _offset: u64, _data: &[u8]) {}
}
