//! Bus 0 of segment 0: device slots, BAR allocation and config dispatch.

use std::sync::{Arc, Mutex, RwLock};

use log::{debug, warn};
use thiserror::Error;

use super::config::{BarKind, BarReprogram};
use super::host_bridge::HostBridge;
use super::SharedPciDevice;
use crate::devices::bus::{Bus, BusDevice, BusError};

/// Number of device slots on bus 0.
pub const NUM_SLOTS: usize = 32;

/// Slots kept free for functions hotplugged behind the vIOMMU: the guest
/// reads the VIOT once, at boot, so it must already name them. Every
/// other device (cold-plugged, or hotplugged without `iommu=on`) takes
/// one of the [`GENERAL_SLOTS`].
pub const IOMMU_HOTPLUG_SLOTS: std::ops::Range<usize> = 24..NUM_SLOTS;
/// Slots of every device not hotplugged behind the vIOMMU.
pub const GENERAL_SLOTS: std::ops::Range<usize> = 1..IOMMU_HOTPLUG_SLOTS.start;

/// Errors from the root complex.
#[derive(Debug, Error)]
pub enum PciError {
    /// All 32 slots are taken.
    #[error("no free PCI slot on bus 0")]
    NoFreeSlot,
    /// A BAR does not fit in its window.
    #[error("PCI {kind:?} window exhausted for a BAR of {size:#x} bytes")]
    WindowExhausted {
        /// Kind of BAR.
        kind: BarKind,
        /// Size requested.
        size: u64,
    },
    /// No function at this address (or one that cannot be removed).
    #[error("no removable PCI function at {0}")]
    NoDevice(PciAddress),
    /// Registering a BAR on a bus failed.
    #[error("cannot map BAR: {0}")]
    Bus(#[from] BusError),
}

/// A bus/device/function triple.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciAddress {
    /// Bus number.
    pub bus: u8,
    /// Device (slot) number, 0..32.
    pub device: u8,
    /// Function number, 0..8.
    pub function: u8,
}

impl std::fmt::Display for PciAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:02x}:{:02x}.{}", self.bus, self.device, self.function)
    }
}

/// Address windows BARs are allocated from (the host bridge's `_CRS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciWindows {
    /// I/O port window (start, size).
    pub io: (u64, u64),
    /// 32-bit MMIO window (start, size).
    pub mmio32: (u64, u64),
    /// 64-bit MMIO window (start, size).
    pub mmio64: (u64, u64),
}

/// Bump allocator over one window with natural alignment.
#[derive(Debug)]
struct WindowAllocator {
    next: u64,
    end: u64,
}

impl WindowAllocator {
    fn new((start, size): (u64, u64)) -> Self {
        Self {
            next: start,
            end: start.saturating_add(size),
        }
    }

    fn allocate(&mut self, size: u64) -> Option<u64> {
        let addr = self.next.checked_next_multiple_of(size)?;
        let end = addr.checked_add(size)?;
        if end > self.end {
            return None;
        }
        self.next = end;
        Some(addr)
    }
}

struct Allocators {
    io: WindowAllocator,
    mmio32: WindowAllocator,
    mmio64: WindowAllocator,
}

/// Forwards bus accesses inside one BAR to its device.
struct BarRegion {
    device: SharedPciDevice,
    bar: usize,
}

/// A BAR whose decoding the command register disables answers as nothing
/// there would (reads all-ones, writes dropped), so a guest that turned
/// memory or I/O space off reaches no device register.
impl BusDevice for BarRegion {
    fn read(&mut self, _base: u64, offset: u64, data: &mut [u8]) {
        let mut dev = self.device.lock().unwrap_or_else(|e| e.into_inner());
        if dev.config().bar_decodes(self.bar) {
            dev.read_bar(self.bar, offset, data);
        } else {
            data.fill(0xff);
        }
    }
    fn write(&mut self, _base: u64, offset: u64, data: &[u8]) {
        let mut dev = self.device.lock().unwrap_or_else(|e| e.into_inner());
        if dev.config().bar_decodes(self.bar) {
            dev.write_bar(self.bar, offset, data);
        }
    }
}

/// The root complex: host bridge plus devices on bus 0, function 0 each.
pub struct PciRoot {
    slots: RwLock<Vec<Option<SharedPciDevice>>>,
    allocators: Mutex<Allocators>,
    mmio_bus: Arc<Bus>,
    pio_bus: Arc<Bus>,
}

impl PciRoot {
    /// Creates bus 0 with the host bridge at 00:00.0.
    pub fn new(mmio_bus: Arc<Bus>, pio_bus: Arc<Bus>, windows: PciWindows) -> Self {
        let mut slots: Vec<Option<SharedPciDevice>> = vec![None; NUM_SLOTS];
        slots[0] = Some(Arc::new(Mutex::new(HostBridge::new())));
        Self {
            slots: RwLock::new(slots),
            allocators: Mutex::new(Allocators {
                io: WindowAllocator::new(windows.io),
                mmio32: WindowAllocator::new(windows.mmio32),
                mmio64: WindowAllocator::new(windows.mmio64),
            }),
            mmio_bus,
            pio_bus,
        }
    }

    /// Plugs `device` into the next free one of the [`GENERAL_SLOTS`],
    /// allocates and maps its BARs.
    pub fn add_device(&self, device: SharedPciDevice) -> Result<PciAddress, PciError> {
        self.add_device_in(device, GENERAL_SLOTS)
    }

    /// Plugs `device` into the first free slot of `range` (a hotplugged
    /// function behind the vIOMMU must land in the slots the VIOT names
    /// for it), allocates and maps its BARs.
    pub fn add_device_in(
        &self,
        device: SharedPciDevice,
        range: std::ops::Range<usize>,
    ) -> Result<PciAddress, PciError> {
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
        let slot = range
            .into_iter()
            .find(|&s| slots.get(s).is_some_and(Option::is_none))
            .ok_or(PciError::NoFreeSlot)?;
        let bars: Vec<_> = {
            let dev = device.lock().unwrap_or_else(|e| e.into_inner());
            dev.config().bars().collect()
        };
        let mut mapped = Vec::new();
        let result = (|| {
            for (index, bar) in bars {
                let addr = {
                    let mut alloc = self.allocators.lock().unwrap_or_else(|e| e.into_inner());
                    let window = match bar.kind {
                        BarKind::Io => &mut alloc.io,
                        BarKind::Mem32 => &mut alloc.mmio32,
                        BarKind::Mem64 { .. } => &mut alloc.mmio64,
                    };
                    window.allocate(bar.size).ok_or(PciError::WindowExhausted {
                        kind: bar.kind,
                        size: bar.size,
                    })?
                };
                device
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .config_mut()
                    .set_bar_address(index, addr);
                let region = Arc::new(Mutex::new(BarRegion {
                    device: device.clone(),
                    bar: index,
                }));
                self.bus_for(bar.kind).insert(addr, bar.size, region)?;
                mapped.push((bar.kind, addr));
                debug!(
                    "PCI slot {slot}: BAR {index} {:?} at {addr:#x} size {:#x}",
                    bar.kind, bar.size
                );
            }
            Ok(())
        })();
        if let Err(e) = result {
            for (kind, addr) in mapped {
                let _ = self.bus_for(kind).remove(addr);
            }
            return Err(e);
        }
        slots[slot] = Some(device);
        Ok(PciAddress {
            bus: 0,
            device: slot as u8,
            function: 0,
        })
    }

    /// Unplugs the function at `addr`: its BARs leave the buses and its
    /// slot reads as empty. Returns it, so the caller decides when it is
    /// dropped (a guest access already dispatched holds it until done).
    /// Their address space is not handed out again (bump allocators).
    pub fn remove_device(&self, addr: PciAddress) -> Result<SharedPciDevice, PciError> {
        if addr.bus != 0 || addr.function != 0 || addr.device == 0 {
            return Err(PciError::NoDevice(addr));
        }
        let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
        let device = slots
            .get_mut(usize::from(addr.device))
            .and_then(Option::take)
            .ok_or(PciError::NoDevice(addr))?;
        let bars: Vec<_> = {
            let dev = device.lock().unwrap_or_else(|e| e.into_inner());
            dev.config().bars().collect()
        };
        for (index, bar) in bars {
            if let Err(e) = self.bus_for(bar.kind).remove(bar.addr) {
                warn!(
                    "PCI {addr}: BAR {index} at {:#x} was not on the bus: {e}",
                    bar.addr
                );
            }
        }
        Ok(device)
    }

    fn bus_for(&self, kind: BarKind) -> &Bus {
        if kind.is_memory() {
            &self.mmio_bus
        } else {
            &self.pio_bus
        }
    }

    fn device_at(&self, addr: PciAddress) -> Option<SharedPciDevice> {
        if addr.bus != 0 || addr.function != 0 {
            return None;
        }
        let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
        slots.get(usize::from(addr.device)).cloned().flatten()
    }

    /// Reads configuration register `reg` of `addr`; absent functions read
    /// as all-ones, which is how the guest learns a slot is empty.
    pub fn config_read(&self, addr: PciAddress, reg: usize) -> u32 {
        match self.device_at(addr) {
            Some(dev) => dev
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .read_config_register(reg),
            None => 0xffff_ffff,
        }
    }

    /// Writes `data` at byte `offset` of register `reg` of `addr`; writes to
    /// absent functions are dropped.
    pub fn config_write(&self, addr: PciAddress, reg: usize, offset: u64, data: &[u8]) {
        let Some(dev) = self.device_at(addr) else {
            return;
        };
        let moved = dev
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .write_config_register(reg, offset, data);
        if let Some(m) = moved {
            self.move_bar(addr, m);
        }
    }

    fn move_bar(&self, addr: PciAddress, m: BarReprogram) {
        match self.bus_for(m.kind).relocate(m.old_addr, m.new_addr) {
            Ok(()) => debug!(
                "PCI {addr}: BAR {} moved {:#x} -> {:#x}",
                m.index, m.old_addr, m.new_addr
            ),
            Err(e) => warn!(
                "PCI {addr}: BAR {} move {:#x} -> {:#x} not applied: {e}",
                m.index, m.old_addr, m.new_addr
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::host_bridge::{HOST_BRIDGE_DEVICE_ID, HOST_BRIDGE_VENDOR_ID};
    use super::super::{PciConfiguration, PciDevice, PciHeader};
    use super::*;

    struct TestDevice {
        config: PciConfiguration,
        last_write: Option<(usize, u64, Vec<u8>)>,
    }

    impl PciDevice for TestDevice {
        fn config(&self) -> &PciConfiguration {
            &self.config
        }
        fn config_mut(&mut self) -> &mut PciConfiguration {
            &mut self.config
        }
        fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
            data.fill((bar as u8) << 4 | offset as u8);
        }
        fn write_bar(&mut self, bar: usize, offset: u64, data: &[u8]) {
            self.last_write = Some((bar, offset, data.to_vec()));
        }
    }

    fn windows() -> PciWindows {
        PciWindows {
            io: (0x1000, 0xf000),
            mmio32: (0xc000_0000, 0x2000_0000),
            mmio64: (0x1_0000_0000, 0x4_0000_0000),
        }
    }

    fn test_device() -> Arc<Mutex<TestDevice>> {
        let mut config = PciConfiguration::new(PciHeader {
            vendor_id: 0x1af4,
            device_id: 0x1041,
            class: 2,
            subclass: 0,
            prog_if: 0,
            revision: 1,
            subsystem_vendor_id: 0,
            subsystem_id: 0,
            interrupt_pin: 0,
        });
        config.add_bar(0, 0x1000, BarKind::Mem32).unwrap();
        config
            .add_bar(
                2,
                0x4000,
                BarKind::Mem64 {
                    prefetchable: false,
                },
            )
            .unwrap();
        config.add_bar(4, 0x40, BarKind::Io).unwrap();
        // I/O and memory space decoding on.
        config.write_reg(1, 0, &[0x3, 0]);
        Arc::new(Mutex::new(TestDevice {
            config,
            last_write: None,
        }))
    }

    fn root() -> (PciRoot, Arc<Bus>, Arc<Bus>) {
        let mmio = Arc::new(Bus::new());
        let pio = Arc::new(Bus::new());
        (
            PciRoot::new(mmio.clone(), pio.clone(), windows()),
            mmio,
            pio,
        )
    }

    fn at(device: u8) -> PciAddress {
        PciAddress {
            bus: 0,
            device,
            function: 0,
        }
    }

    #[test]
    fn host_bridge_is_at_slot_zero() {
        let (root, _, _) = root();
        let id = root.config_read(at(0), 0);
        assert_eq!(id & 0xffff, u32::from(HOST_BRIDGE_VENDOR_ID));
        assert_eq!(id >> 16, u32::from(HOST_BRIDGE_DEVICE_ID));
        assert_eq!(root.config_read(at(0), 2) >> 16, 0x0600);
    }

    #[test]
    fn absent_functions_read_all_ones() {
        let (root, _, _) = root();
        assert_eq!(root.config_read(at(5), 0), 0xffff_ffff);
        assert_eq!(
            root.config_read(
                PciAddress {
                    bus: 1,
                    device: 0,
                    function: 0
                },
                0
            ),
            0xffff_ffff
        );
        assert_eq!(
            root.config_read(
                PciAddress {
                    bus: 0,
                    device: 0,
                    function: 3
                },
                0
            ),
            0xffff_ffff
        );
    }

    #[test]
    fn add_device_allocates_and_maps_bars() {
        let (root, mmio, pio) = root();
        let dev = test_device();
        let addr = root.add_device(dev.clone()).unwrap();
        assert_eq!(addr, at(1));
        assert_eq!(root.config_read(addr, 4), 0xc000_0000);
        assert_eq!(root.config_read(addr, 6), 0x4);
        assert_eq!(root.config_read(addr, 7), 0x1);
        assert_eq!(root.config_read(addr, 8), 0x1001);
        let mut b = [0u8; 1];
        assert!(mmio.read(0xc000_0010, &mut b));
        assert_eq!(b[0], 0x10);
        assert!(mmio.read(0x1_0000_0003, &mut b));
        assert_eq!(b[0], 0x23);
        assert!(pio.write(0x1002, &[9]));
        assert_eq!(dev.lock().unwrap().last_write, Some((4, 2, vec![9])));
        let second = root.add_device(test_device()).unwrap();
        assert_eq!(second, at(2));
        assert_eq!(root.config_read(second, 4), 0xc000_1000);
    }

    #[test]
    fn bars_decode_only_with_their_space_enabled() {
        let (root, mmio, pio) = root();
        let dev = test_device();
        let addr = root.add_device(dev.clone()).unwrap();
        let mut b = [0u8; 1];
        // Memory space off: memory BARs read all-ones and drop writes;
        // the I/O BAR still decodes.
        root.config_write(addr, 1, 0, &[0x1, 0]);
        assert!(mmio.read(0xc000_0010, &mut b));
        assert_eq!(b[0], 0xff);
        assert!(mmio.write(0xc000_0010, &[7]));
        assert_eq!(dev.lock().unwrap().last_write, None);
        assert!(pio.write(0x1002, &[9]));
        assert_eq!(dev.lock().unwrap().last_write, Some((4, 2, vec![9])));
        // I/O space off, memory on: the other way round.
        root.config_write(addr, 1, 0, &[0x2, 0]);
        assert!(pio.read(0x1002, &mut b));
        assert_eq!(b[0], 0xff);
        assert!(mmio.read(0xc000_0010, &mut b));
        assert_eq!(b[0], 0x10);
    }

    #[test]
    fn guest_bar_move_relocates_bus_range() {
        let (root, mmio, _) = root();
        let addr = root.add_device(test_device()).unwrap();
        root.config_write(addr, 4, 0, &0xd000_0000u32.to_le_bytes());
        let mut b = [0u8; 1];
        assert!(!mmio.read(0xc000_0000, &mut b));
        assert!(mmio.read(0xd000_0000, &mut b));
    }

    #[test]
    fn exhausted_window_is_an_error_and_unmaps() {
        let mmio = Arc::new(Bus::new());
        let pio = Arc::new(Bus::new());
        let mut w = windows();
        w.io = (0x1000, 0x20);
        let root = PciRoot::new(mmio.clone(), pio, w);
        assert!(matches!(
            root.add_device(test_device()),
            Err(PciError::WindowExhausted { .. })
        ));
        let mut b = [0u8; 1];
        assert!(!mmio.read(0xc000_0000, &mut b));
        assert_eq!(root.config_read(at(1), 0), 0xffff_ffff);
    }

    #[test]
    fn removed_device_leaves_the_buses_and_its_slot() {
        let (root, mmio, pio) = root();
        let dev = test_device();
        let addr = root.add_device(dev.clone()).unwrap();
        // The guest moved BAR 0 before the unplug: the current range goes.
        root.config_write(addr, 4, 0, &0xd000_0000u32.to_le_bytes());
        let removed = root.remove_device(addr).unwrap();
        assert!(Arc::ptr_eq(&removed, &(dev as SharedPciDevice)));
        let mut b = [0u8; 1];
        assert!(!mmio.read(0xd000_0000, &mut b));
        assert!(!mmio.read(0x1_0000_0000, &mut b));
        assert!(!pio.read(0x1000, &mut b));
        assert_eq!(root.config_read(addr, 0), 0xffff_ffff);
        assert!(matches!(
            root.remove_device(addr),
            Err(PciError::NoDevice(_))
        ));
        assert!(root.remove_device(at(0)).is_err(), "the host bridge stays");
        // The slot is free again; new BARs come from fresh addresses.
        let again = root.add_device(test_device()).unwrap();
        assert_eq!(again, addr);
        assert_eq!(root.config_read(again, 4), 0xc000_1000);
    }

    #[test]
    fn add_device_in_takes_the_first_free_slot_of_its_range() {
        let (root, _, _) = root();
        assert_eq!(root.add_device_in(test_device(), 24..32).unwrap(), at(24));
        assert_eq!(root.add_device_in(test_device(), 24..32).unwrap(), at(25));
        assert_eq!(root.add_device(test_device()).unwrap(), at(1));
        assert!(matches!(
            root.add_device_in(test_device(), 31..40),
            Ok(a) if a == at(31)
        ));
        assert!(matches!(
            root.add_device_in(test_device(), 31..40),
            Err(PciError::NoFreeSlot)
        ));
    }

    #[test]
    fn window_allocator_aligns_naturally() {
        let mut a = WindowAllocator::new((0x1000, 0x10000));
        assert_eq!(a.allocate(0x100), Some(0x1000));
        assert_eq!(a.allocate(0x4000), Some(0x4000));
        assert_eq!(a.allocate(0x10000), None);
    }
}
