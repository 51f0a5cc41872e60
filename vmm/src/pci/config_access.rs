//! The two ways a guest reaches configuration space: legacy port I/O
//! (0xcf8 address latch + 0xcfc data) and ECAM (memory-mapped, 4 KiB per
//! function). Both decode the access and hand it to [`PciRoot`].

use std::sync::Arc;

use super::root::{PciAddress, PciRoot};
use crate::devices::bus::BusDevice;
use crate::width::usize_from_u64;

/// First port of the legacy mechanism.
pub const PCI_CONFIG_IO_PORT: u64 = 0xcf8;
/// Number of ports (address latch 0xcf8..0xcfb, data 0xcfc..0xcff).
pub const PCI_CONFIG_IO_PORT_SIZE: u64 = 8;

/// Decoded legacy address latch: (function address, register index), or None
/// when the enable bit is clear.
pub fn decode_config_address(latch: u32) -> Option<(PciAddress, usize)> {
    if latch & 0x8000_0000 == 0 {
        return None;
    }
    Some((
        PciAddress {
            bus: ((latch >> 16) & 0xff) as u8,
            device: ((latch >> 11) & 0x1f) as u8,
            function: ((latch >> 8) & 0x7) as u8,
        },
        ((latch >> 2) & 0x3f) as usize,
    ))
}

/// Decoded ECAM offset: (function address, register index, byte offset).
pub fn decode_ecam_offset(offset: u64) -> (PciAddress, usize, u64) {
    (
        PciAddress {
            bus: ((offset >> 20) & 0xff) as u8,
            device: ((offset >> 15) & 0x1f) as u8,
            function: ((offset >> 12) & 0x7) as u8,
        },
        ((offset & 0xfff) >> 2) as usize,
        offset & 0x3,
    )
}

/// Extracts `data.len()` bytes at byte `offset` from a register value.
fn fill_from_register(value: u32, offset: u64, data: &mut [u8]) {
    let bytes = value.to_le_bytes();
    for (i, d) in data.iter_mut().enumerate() {
        *d = bytes
            .get(usize_from_u64(offset) + i)
            .copied()
            .unwrap_or(0xff);
    }
}

/// Accesses must be 1, 2 or 4 bytes and stay inside one register.
fn valid_access(offset: u64, len: usize) -> bool {
    matches!(len, 1 | 2 | 4) && usize_from_u64(offset) + len <= 4
}

/// The 0xcf8/0xcfc device.
pub struct PciConfigIo {
    root: Arc<PciRoot>,
    latch: u32,
}

impl PciConfigIo {
    /// Creates the port device for `root`.
    pub fn new(root: Arc<PciRoot>) -> Self {
        Self { root, latch: 0 }
    }
}

impl BusDevice for PciConfigIo {
    fn read(&mut self, _base: u64, offset: u64, data: &mut [u8]) {
        if offset < 4 {
            if valid_access(offset, data.len()) {
                fill_from_register(self.latch, offset, data);
            } else {
                data.fill(0xff);
            }
            return;
        }
        let byte = offset - 4;
        match decode_config_address(self.latch) {
            Some((addr, reg)) if valid_access(byte, data.len()) => {
                fill_from_register(self.root.config_read(addr, reg), byte, data)
            }
            _ => data.fill(0xff),
        }
    }

    fn write(&mut self, _base: u64, offset: u64, data: &[u8]) {
        if offset < 4 {
            // Only full 32-bit writes to 0xcf8 set the latch; byte writes to
            // 0xcf9..0xcfb are other chipset registers on real hardware.
            if offset == 0 && data.len() == 4 {
                let mut b = [0u8; 4];
                b.copy_from_slice(data);
                self.latch = u32::from_le_bytes(b);
            }
            return;
        }
        let byte = offset - 4;
        if let Some((addr, reg)) = decode_config_address(self.latch) {
            if valid_access(byte, data.len()) {
                self.root.config_write(addr, reg, byte, data);
            }
        }
    }
}

/// The ECAM MMIO device.
pub struct PciEcam {
    root: Arc<PciRoot>,
}

impl PciEcam {
    /// Creates the ECAM window device for `root`.
    pub fn new(root: Arc<PciRoot>) -> Self {
        Self { root }
    }
}

impl BusDevice for PciEcam {
    fn read(&mut self, _base: u64, offset: u64, data: &mut [u8]) {
        let (addr, reg, byte) = decode_ecam_offset(offset);
        if valid_access(byte, data.len()) {
            fill_from_register(self.root.config_read(addr, reg), byte, data);
        } else {
            data.fill(0xff);
        }
    }

    fn write(&mut self, _base: u64, offset: u64, data: &[u8]) {
        let (addr, reg, byte) = decode_ecam_offset(offset);
        if valid_access(byte, data.len()) {
            self.root.config_write(addr, reg, byte, data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::bus::Bus;
    use crate::pci::host_bridge::{HOST_BRIDGE_DEVICE_ID, HOST_BRIDGE_VENDOR_ID};
    use crate::pci::PciWindows;

    fn root() -> Arc<PciRoot> {
        Arc::new(PciRoot::new(
            Arc::new(Bus::new()),
            Arc::new(Bus::new()),
            PciWindows {
                io: (0x1000, 0xf000),
                mmio32: (0xc000_0000, 0x2000_0000),
                mmio64: (0x1_0000_0000, 0x1_0000_0000),
            },
        ))
    }

    #[test]
    fn legacy_address_decoding() {
        assert_eq!(decode_config_address(0x0000_0800), None);
        let (addr, reg) = decode_config_address(0x8001_1a3c).unwrap();
        assert_eq!(addr.bus, 1);
        assert_eq!(addr.device, 3);
        assert_eq!(addr.function, 2);
        assert_eq!(reg, 0x3c / 4);
    }

    #[test]
    fn ecam_offset_decoding() {
        let (addr, reg, byte) = decode_ecam_offset((2 << 20) | (31 << 15) | (7 << 12) | 0x102);
        assert_eq!((addr.bus, addr.device, addr.function), (2, 31, 7));
        assert_eq!(reg, 0x40);
        assert_eq!(byte, 2);
    }

    #[test]
    fn host_bridge_ids_through_ports() {
        let mut io = PciConfigIo::new(root());
        io.write(0xcf8, 0, &0x8000_0000u32.to_le_bytes());
        let mut latch = [0u8; 4];
        io.read(0xcf8, 0, &mut latch);
        assert_eq!(u32::from_le_bytes(latch), 0x8000_0000);
        let mut d = [0u8; 4];
        io.read(0xcf8, 4, &mut d);
        assert_eq!(
            u32::from_le_bytes(d),
            u32::from(HOST_BRIDGE_VENDOR_ID) | (u32::from(HOST_BRIDGE_DEVICE_ID) << 16)
        );
        // 16-bit read of the device id at 0xcfe.
        let mut w = [0u8; 2];
        io.read(0xcf8, 6, &mut w);
        assert_eq!(u16::from_le_bytes(w), HOST_BRIDGE_DEVICE_ID);
    }

    #[test]
    fn absent_device_and_disabled_latch_read_all_ones() {
        let mut io = PciConfigIo::new(root());
        io.write(0xcf8, 0, &(0x8000_0000u32 | (4 << 11)).to_le_bytes());
        let mut d = [0u8; 4];
        io.read(0xcf8, 4, &mut d);
        assert_eq!(d, [0xff; 4]);
        io.write(0xcf8, 0, &0u32.to_le_bytes());
        io.read(0xcf8, 4, &mut d);
        assert_eq!(d, [0xff; 4]);
    }

    #[test]
    fn ecam_reads_host_bridge_and_absent_slots() {
        let mut ecam = PciEcam::new(root());
        let mut d = [0u8; 2];
        ecam.read(0, 0, &mut d);
        assert_eq!(u16::from_le_bytes(d), HOST_BRIDGE_VENDOR_ID);
        ecam.read(0, 2, &mut d);
        assert_eq!(u16::from_le_bytes(d), HOST_BRIDGE_DEVICE_ID);
        let mut d4 = [0u8; 4];
        ecam.read(0, 1 << 15, &mut d4);
        assert_eq!(d4, [0xff; 4]);
        // Misaligned access that crosses a register reads all-ones.
        ecam.read(0, 3, &mut d4);
        assert_eq!(d4, [0xff; 4]);
    }

    #[test]
    fn ecam_write_reaches_command_register() {
        let root = root();
        let mut ecam = PciEcam::new(root.clone());
        ecam.write(0, 4, &[0x06, 0x00]);
        let addr = PciAddress {
            bus: 0,
            device: 0,
            function: 0,
        };
        assert_eq!(root.config_read(addr, 1) & 0xffff, 0x0006);
    }
}
