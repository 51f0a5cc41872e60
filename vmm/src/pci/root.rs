//! Bus 0 of segment 0: device slots, BAR allocation and config dispatch.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use log::{debug, warn};
use thiserror::Error;
use vm_allocator::{AddressAllocator, AllocPolicy, Error as AllocatorError, RangeInclusive};

use virtio_iommu::locks::Unpoison;

use super::config::{BarKind, BarPlaceError, BarReprogram};
use super::host_bridge::HostBridge;
use super::{PciDevice, SharedPciDevice};
use crate::devices::bus::{Bus, BusDevice, BusError};
use crate::log_limit::RateLimit;
use crate::warn_limited;

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
    /// The window allocator refused a BAR for another reason than space.
    #[error("PCI {kind:?} window cannot allocate a BAR of {size:#x} bytes: {source}")]
    BarAllocation {
        /// Kind of BAR.
        kind: BarKind,
        /// Size requested.
        size: u64,
        /// Why.
        source: AllocatorError,
    },
    /// No function at this address (or one that cannot be removed).
    #[error("no removable PCI function at {0}")]
    NoDevice(PciAddress),
    /// Registering a BAR on a bus failed.
    #[error("cannot map BAR: {0}")]
    Bus(#[from] BusError),
}

/// Why a guest's BAR move was refused (the BAR stays where it was, in the
/// configuration space, on the bus and in any KVM slot).
#[derive(Debug, Error)]
enum MoveError {
    /// The new range is outside the BAR's windows or overlaps another
    /// allocated range.
    #[error("range not free in the {0:?} window")]
    Window(Window),
    /// The bus refused the range (taken by a device outside the windows).
    #[error("{0}")]
    Bus(#[from] BusError),
    /// The function could not decode the BAR there.
    #[error("{0}")]
    Place(#[from] BarPlaceError),
}

/// The window a range comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Window {
    Io,
    Mmio32,
    Mmio64,
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

/// One window's allocator: `vm-allocator`'s interval tree, so the ranges
/// of a removed function are handed out again (a bump allocator leaked
/// them, and a guest that hotplugged and removed functions in a loop ran
/// the window dry). `None` for a window of size 0 (or one that does not
/// fit the address space): every BAR of its kind is then refused.
///
/// The second field, start -> end of every range handed out, is what
/// [`Self::allocate_at`] checks: `vm-allocator` 0.1's `ExactMatch` takes
/// the node holding the start whether it is free or not, so a guest
/// moving a BAR onto another's split that range, and the refused move
/// then freed part of it for the next function plugged (found by the
/// `pci_config` fuzz target).
#[derive(Debug)]
struct WindowAllocator(Option<AddressAllocator>, BTreeMap<u64, u64>);

impl WindowAllocator {
    fn new((start, size): (u64, u64)) -> Self {
        match AddressAllocator::new(start, size) {
            Ok(a) => Self(Some(a), BTreeMap::new()),
            Err(e) => {
                if size != 0 {
                    warn!("PCI window {start:#x}+{size:#x} unusable: {e}");
                }
                Self(None, BTreeMap::new())
            }
        }
    }

    /// A naturally aligned range of `size` bytes (PCI BARs decode only
    /// naturally aligned addresses), the lowest that is free: while
    /// nothing was freed this is where the old bump allocator put it, as
    /// long as no BAR fits in the alignment gap an earlier, larger BAR
    /// left behind (see [`PciRoot::add_device_in`]).
    fn allocate(&mut self, kind: BarKind, size: u64) -> Result<RangeInclusive, PciError> {
        let exhausted = PciError::WindowExhausted { kind, size };
        let Some(a) = self.0.as_mut() else {
            return Err(exhausted);
        };
        match a.allocate(size, size, AllocPolicy::FirstMatch) {
            Ok(r) => {
                self.1.insert(r.start(), r.end());
                Ok(r)
            }
            Err(AllocatorError::ResourceNotAvailable) => Err(exhausted),
            Err(source) => Err(PciError::BarAllocation { kind, size, source }),
        }
    }

    /// Takes exactly `[start, start + size)`, if it lies in the window and
    /// is free (a BAR the guest moves there).
    fn allocate_at(&mut self, start: u64, size: u64) -> Option<RangeInclusive> {
        let end = start.checked_add(size.checked_sub(1)?)?;
        if self
            .1
            .range(..=end)
            .next_back()
            .is_some_and(|(_, taken_end)| *taken_end >= start)
        {
            return None;
        }
        let r = self
            .0
            .as_mut()?
            .allocate(size, size, AllocPolicy::ExactMatch(start))
            .ok()?;
        self.1.insert(r.start(), r.end());
        Some(r)
    }

    /// Whether `[start, start + size)` lies in the window.
    fn holds(&self, start: u64, size: u64) -> bool {
        let Some(a) = self.0.as_ref() else {
            return false;
        };
        let base = a.base();
        start >= base
            && start
                .checked_add(size)
                .is_some_and(|end| end - base <= a.end() - base + 1)
    }

    /// Returns `range` (from [`Self::allocate`]) to the window.
    fn free(&mut self, range: &RangeInclusive) -> Result<(), AllocatorError> {
        match self.0.as_mut() {
            Some(a) => {
                a.free(range)?;
                self.1.remove(&range.start());
                Ok(())
            }
            None => Err(AllocatorError::ResourceNotAvailable),
        }
    }
}

struct Allocators {
    io: WindowAllocator,
    mmio32: WindowAllocator,
    mmio64: WindowAllocator,
    /// Per slot, the range each BAR of its function holds in a window:
    /// where it was allocated, then where the guest moved it (a move
    /// takes the new range and frees the old). What removal frees.
    by_slot: Vec<Vec<(usize, Window, RangeInclusive)>>,
    /// Per slot, the function those ranges are for ([`identity`], 0 for
    /// none): a config write still in flight for a function ejected
    /// meanwhile must not move the BAR of the one plugged in its place.
    owners: Vec<usize>,
}

impl Allocators {
    fn window(&mut self, w: Window) -> &mut WindowAllocator {
        match w {
            Window::Io => &mut self.io,
            Window::Mmio32 => &mut self.mmio32,
            Window::Mmio64 => &mut self.mmio64,
        }
    }

    /// Frees `ranges`; a range the window does not know is logged (it
    /// would be a bookkeeping bug here, not something a guest can cause).
    fn free_all(&mut self, slot: usize, ranges: Vec<(usize, Window, RangeInclusive)>) {
        for (bar, w, range) in ranges {
            if let Err(e) = self.window(w).free(&range) {
                warn!(
                    "PCI slot {slot}: freeing BAR {bar}'s {w:?} range {:#x}..={:#x}: {e}",
                    range.start(),
                    range.end()
                );
            }
        }
    }

    /// The window a BAR of `kind` may be moved to at `[start, +size)`: a
    /// 64-bit BAR may also live below 4 GiB, as on hardware.
    fn window_for_move(&self, kind: BarKind, start: u64, size: u64) -> Window {
        match kind {
            BarKind::Io => Window::Io,
            BarKind::Mem32 => Window::Mmio32,
            BarKind::Mem64 { .. } if self.mmio32.holds(start, size) => Window::Mmio32,
            BarKind::Mem64 { .. } => Window::Mmio64,
        }
    }
}

/// A function's identity while a reference to it is held (its address:
/// no other function can be allocated there meanwhile).
fn identity(device: &SharedPciDevice) -> usize {
    Arc::as_ptr(device).cast::<()>() as usize
}

/// The window a BAR of `kind` is allocated from at plug time.
fn window_of(kind: BarKind) -> Window {
    match kind {
        BarKind::Io => Window::Io,
        BarKind::Mem32 => Window::Mmio32,
        BarKind::Mem64 { .. } => Window::Mmio64,
    }
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
        let mut dev = self.device.lock().unpoisoned();
        if dev.config().bar_decodes(self.bar) {
            dev.read_bar(self.bar, offset, data);
        } else {
            data.fill(0xff);
        }
    }
    fn write(&mut self, _base: u64, offset: u64, data: &[u8]) {
        let mut dev = self.device.lock().unpoisoned();
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
    /// The budget of lines for refused BAR moves. One per root rather
    /// than per call site (`warn_limited!`), so each VM's guest, and each
    /// test's root, spends its own.
    refusals: RateLimit,
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
                by_slot: vec![Vec::new(); NUM_SLOTS],
                owners: vec![0; NUM_SLOTS],
            }),
            mmio_bus,
            pio_bus,
            refusals: RateLimit::new(),
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
        let mut slots = self.slots.write().unpoisoned();
        let slot = range
            .into_iter()
            .find(|&s| slots.get(s).is_some_and(Option::is_none))
            .ok_or(PciError::NoFreeSlot)?;
        // A slot of the 32-entry table: always a valid device number.
        let device_number = u8::try_from(slot).map_err(|_| PciError::NoFreeSlot)?;
        let bars: Vec<_> = {
            let dev = device.lock().unpoisoned();
            dev.config().bars().collect()
        };
        let mut allocated = Vec::new();
        let mut mapped = Vec::new();
        let result = (|| {
            for (index, bar) in bars {
                let window = window_of(bar.kind);
                let range = self
                    .allocators
                    .lock()
                    .unpoisoned()
                    .window(window)
                    .allocate(bar.kind, bar.size)?;
                allocated.push((index, window, range));
                let addr = range.start();
                device
                    .lock()
                    .unpoisoned()
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
        let mut alloc = self.allocators.lock().unpoisoned();
        if let Err(e) = result {
            for (kind, addr) in mapped {
                let _ = self.bus_for(kind).remove(addr);
            }
            alloc.free_all(slot, allocated);
            return Err(e);
        }
        if let Some(entry) = alloc.by_slot.get_mut(slot) {
            *entry = allocated;
        }
        if let Some(owner) = alloc.owners.get_mut(slot) {
            *owner = identity(&device);
        }
        drop(alloc);
        slots[slot] = Some(device);
        Ok(PciAddress {
            bus: 0,
            device: device_number,
            function: 0,
        })
    }

    /// Unplugs the function at `addr`: its BARs leave the buses and its
    /// slot reads as empty. Returns it, so the caller decides when it is
    /// dropped (a guest access already dispatched holds it until done).
    /// The ranges its BARs hold go back to their windows, for the next
    /// function plugged. The bus ranges leave under the function's lock,
    /// so a BAR move cannot slip in between reading where a BAR is and
    /// removing it there (that left a range on the bus holding the
    /// function, and its VFIO fd and container, open for good).
    pub fn remove_device(&self, addr: PciAddress) -> Result<SharedPciDevice, PciError> {
        if addr.bus != 0 || addr.function != 0 || addr.device == 0 {
            return Err(PciError::NoDevice(addr));
        }
        let mut slots = self.slots.write().unpoisoned();
        let device = slots
            .get_mut(usize::from(addr.device))
            .and_then(Option::take)
            .ok_or(PciError::NoDevice(addr))?;
        {
            let mut dev = device.lock().unpoisoned();
            dev.unplugged();
            for (index, bar) in dev.config().bars() {
                if let Err(e) = self.bus_for(bar.kind).remove(bar.addr) {
                    warn!(
                        "PCI {addr}: BAR {index} at {:#x} was not on the bus: {e}",
                        bar.addr
                    );
                }
            }
        }
        let slot = usize::from(addr.device);
        let mut alloc = self.allocators.lock().unpoisoned();
        let ranges = alloc.by_slot.get_mut(slot).map(std::mem::take);
        if let Some(ranges) = ranges {
            alloc.free_all(slot, ranges);
        }
        if let Some(owner) = alloc.owners.get_mut(slot) {
            *owner = 0;
        }
        Ok(device)
    }

    /// The functions plugged in now and their addresses, host bridge
    /// (slot 0) excepted: what a VM's teardown unplugs.
    pub fn plugged(&self) -> Vec<(PciAddress, SharedPciDevice)> {
        let slots = self.slots.read().unpoisoned();
        slots
            .iter()
            .enumerate()
            .skip(1)
            .filter_map(|(i, d)| Some((u8::try_from(i).ok()?, d.clone()?)))
            .map(|(device, d)| {
                let addr = PciAddress {
                    bus: 0,
                    device,
                    function: 0,
                };
                (addr, d)
            })
            .collect()
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
        let slots = self.slots.read().unpoisoned();
        slots.get(usize::from(addr.device)).cloned().flatten()
    }

    /// Reads configuration register `reg` of `addr`; absent functions read
    /// as all-ones, which is how the guest learns a slot is empty.
    pub fn config_read(&self, addr: PciAddress, reg: usize) -> u32 {
        match self.device_at(addr) {
            Some(dev) => dev.lock().unpoisoned().read_config_register(reg),
            None => 0xffff_ffff,
        }
    }

    /// Writes `data` at byte `offset` of register `reg` of `addr`; writes to
    /// absent functions are dropped. A BAR move is carried out in full or
    /// not at all, under the function's lock (see [`Self::move_bar`]).
    pub fn config_write(&self, addr: PciAddress, reg: usize, offset: u64, data: &[u8]) {
        let Some(dev) = self.device_at(addr) else {
            return;
        };
        let mut guard = dev.lock().unpoisoned();
        let moved = guard.write_config_register(reg, offset, data);
        if reg == 1 {
            // Decoding may have come on: no BAR register may then say
            // anything but where the BAR decodes.
            guard.config_mut().settle_bars();
        }
        let Some(m) = moved else {
            return;
        };
        let who = (usize::from(addr.device), identity(&dev));
        match self.move_bar(who, &mut *guard, m) {
            Ok(()) => debug!(
                "PCI {addr}: BAR {} moved {:#x} -> {:#x}",
                m.index, m.old_addr, m.new_addr
            ),
            Err(e) if !guard.config().bar_decodes(m.index) => {
                // Decoding off: maybe the first half of a 64-bit move.
                guard.config_mut().park_bar(m.index, m.old_addr);
                if let Err(e) = guard.bars_moved() {
                    warn_limited!("PCI {addr}: BAR {} back at {:#x}: {e}", m.index, m.old_addr);
                }
                debug!(
                    "PCI {addr}: BAR {} stays at {:#x} while it does not decode ({:#x}: {e})",
                    m.index, m.old_addr, m.new_addr
                );
            }
            Err(e) => {
                guard.config_mut().set_bar_address(m.index, m.old_addr);
                if let Err(e) = guard.bars_moved() {
                    warn_limited!("PCI {addr}: BAR {} back at {:#x}: {e}", m.index, m.old_addr);
                }
                // The guest can aim a BAR at a taken range as often as it
                // likes: its own budget of lines.
                let line = format_args!(
                    "PCI {addr}: BAR {} move {:#x} -> {:#x} refused: {e}",
                    m.index, m.old_addr, m.new_addr
                );
                match self.refusals.allow() {
                    Some(0) => warn!("{line}"),
                    Some(n) => warn!("{line} ({n} similar lines suppressed)"),
                    None => {}
                }
            }
        }
    }

    /// Moves BAR `m` of the function in `slot` (whose lock the caller
    /// holds, its configuration already at the new address) everywhere
    /// else: the window's bookkeeping, the bus, then the function's own
    /// mappings. Each step undoes the earlier ones when a later one
    /// refuses, so that on `Err` the caller only puts the configuration
    /// back. WHY refuse rather than follow the guest halfway: a bus range
    /// or KVM slot left at the old address outlives the BAR there, and
    /// the window hands that range to the next function plugged.
    fn move_bar(
        &self,
        (slot, owner): (usize, usize),
        dev: &mut dyn PciDevice,
        m: BarReprogram,
    ) -> Result<(), MoveError> {
        let mut alloc = self.allocators.lock().unpoisoned();
        let at = alloc
            .by_slot
            .get(slot)
            .filter(|_| alloc.owners.get(slot) == Some(&owner))
            .and_then(|bars| {
                bars.iter()
                    .position(|(bar, _, r)| *bar == m.index && r.start() == m.old_addr)
            });
        // A function removed meanwhile has no ranges left: nothing moves.
        let Some(at) = at else {
            return Err(MoveError::Bus(BusError::NotFound(m.old_addr)));
        };
        let window = alloc.window_for_move(m.kind, m.new_addr, m.size);
        let new = alloc
            .window(window)
            .allocate_at(m.new_addr, m.size)
            .ok_or(MoveError::Window(window))?;
        let undo_alloc = |alloc: &mut Allocators| {
            if let Err(e) = alloc.window(window).free(&new) {
                warn!("PCI slot {slot}: giving back {:#x}: {e}", new.start());
            }
        };
        if let Err(e) = self.bus_for(m.kind).relocate(m.old_addr, m.new_addr) {
            undo_alloc(&mut alloc);
            return Err(e.into());
        }
        if let Err(e) = dev.bars_moved() {
            if let Err(back) = self.bus_for(m.kind).relocate(m.new_addr, m.old_addr) {
                // Cannot happen: the old range is still ours in the window.
                warn!(
                    "PCI slot {slot}: BAR {} back to {:#x}: {back}",
                    m.index, m.old_addr
                );
            }
            undo_alloc(&mut alloc);
            return Err(e.into());
        }
        if let Some(entry) = alloc.by_slot.get_mut(slot).and_then(|b| b.get_mut(at)) {
            let (_, old_window, old) = std::mem::replace(entry, (m.index, window, new));
            if let Err(e) = alloc.window(old_window).free(&old) {
                warn!("PCI slot {slot}: freeing {:#x}: {e}", old.start());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "root_move_tests.rs"]
mod move_tests;

#[cfg(test)]
mod tests {
    use super::super::host_bridge::{HOST_BRIDGE_DEVICE_ID, HOST_BRIDGE_VENDOR_ID};
    use super::super::{PciConfiguration, PciDevice, PciHeader};
    use super::*;
    use crate::log_limit::counting;

    pub(super) struct TestDevice {
        config: PciConfiguration,
        pub(super) last_write: Option<(usize, u64, Vec<u8>)>,
        unplugged: usize,
        /// A fake KVM slot mapping BAR 0 straight into the guest, as an
        /// assigned function's: where it maps now.
        pub(super) direct: Option<u64>,
        /// An address the fake KVM refuses a slot at.
        pub(super) refuse: Option<u64>,
    }

    /// What a refused slot leaves (as `DirectBar::place` does).
    #[derive(Debug, thiserror::Error)]
    #[error("slot refused")]
    struct Refused;

    impl PciDevice for TestDevice {
        fn config(&self) -> &PciConfiguration {
            &self.config
        }
        fn config_mut(&mut self) -> &mut PciConfiguration {
            &mut self.config
        }
        fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
            data.fill(bar.to_le_bytes()[0] << 4 | offset.to_le_bytes()[0]);
        }
        fn write_bar(&mut self, bar: usize, offset: u64, data: &[u8]) {
            self.last_write = Some((bar, offset, data.to_vec()));
        }
        fn unplugged(&mut self) {
            self.unplugged += 1;
        }
        fn bars_moved(&mut self) -> Result<(), BarPlaceError> {
            let want = self.config.bar(0).map(|b| b.addr);
            if want.is_some() && want == self.refuse {
                // The old slot went before the new one was refused.
                self.direct = None;
                return Err(BarPlaceError {
                    bar: 0,
                    addr: want.unwrap_or(0),
                    source: Box::new(Refused),
                });
            }
            self.direct = want;
            Ok(())
        }
    }

    fn windows() -> PciWindows {
        PciWindows {
            io: (0x1000, 0xf000),
            mmio32: (0xc000_0000, 0x2000_0000),
            mmio64: (0x1_0000_0000, 0x4_0000_0000),
        }
    }

    /// The header of the tests' devices (a virtio-net function).
    fn test_header() -> PciHeader {
        PciHeader {
            vendor_id: 0x1af4,
            device_id: 0x1041,
            class: 2,
            subclass: 0,
            prog_if: 0,
            revision: 1,
            subsystem_vendor_id: 0,
            subsystem_id: 0,
            interrupt_pin: 0,
        }
    }

    pub(super) fn test_device() -> Arc<Mutex<TestDevice>> {
        let mut config = PciConfiguration::new(test_header());
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
            unplugged: 0,
            direct: None,
            refuse: None,
        }))
    }

    pub(super) fn root() -> (PciRoot, Arc<Bus>, Arc<Bus>) {
        root_with(windows())
    }

    fn root_with(w: PciWindows) -> (PciRoot, Arc<Bus>, Arc<Bus>) {
        let mmio = Arc::new(Bus::new());
        let pio = Arc::new(Bus::new());
        (PciRoot::new(mmio.clone(), pio.clone(), w), mmio, pio)
    }

    /// A root whose I/O window (32 bytes) cannot hold the test device's
    /// I/O BAR, which comes after its memory BARs.
    fn root_without_io_room() -> (PciRoot, Arc<Bus>, Arc<Bus>) {
        let mut w = windows();
        w.io = (0x1000, 0x20);
        root_with(w)
    }

    pub(super) fn at(device: u8) -> PciAddress {
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

    /// A guest that keeps aiming a BAR at another device's range gets
    /// refused every time, and the host log a burst of lines, not one per
    /// write (issue 28).
    #[test]
    fn refused_bar_moves_log_a_bounded_number_of_lines() {
        let (root, mmio, _) = root();
        let first = root.add_device(test_device()).unwrap();
        let second = root.add_device(test_device()).unwrap();
        assert_ne!(first, second);
        let own = root.config_read(second, 4) & !0xf;
        assert_ne!(own, 0xc000_0000);
        counting::install();
        let before = counting::lines();
        for i in 0..100u32 {
            // Onto the first device's BAR 0, and back: every write is a
            // move the bus refuses (the second device's range stays put).
            let to = if i % 2 == 0 { 0xc000_0000 } else { own };
            root.config_write(second, 4, 0, &to.to_le_bytes());
        }
        let lines = counting::lines() - before;
        assert!(
            (1..=crate::log_limit::BURST as usize).contains(&lines),
            "{lines} lines"
        );
        // The first device still answers at its BAR.
        let mut b = [0u8; 1];
        assert!(mmio.read(0xc000_0000, &mut b));
        assert_eq!(b[0], 0);
    }

    #[test]
    fn exhausted_window_is_an_error_and_unmaps() {
        let (root, mmio, _) = root_without_io_room();
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
        assert_eq!(
            dev.lock().unwrap().unplugged,
            1,
            "told before its ranges go"
        );
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
        // The slot is free again, and so are the ranges its BARs were
        // allocated (BAR 0 was allocated at 0xc000_0000 before the move).
        let again = root.add_device(test_device()).unwrap();
        assert_eq!(again, addr);
        assert_eq!(root.config_read(again, 4), 0xc000_0000);
        assert_eq!(root.config_read(again, 6), 0x4);
        assert_eq!(root.config_read(again, 7), 0x1);
        assert_eq!(root.config_read(again, 8), 0x1001);
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

    /// The old bump allocator, as the reference the boot-time layout
    /// must still match.
    fn bump(next: &mut u64, end: u64, size: u64) -> Option<u64> {
        let addr = next.checked_next_multiple_of(size)?;
        let stop = addr.checked_add(size)?;
        (stop <= end).then(|| {
            *next = stop;
            addr
        })
    }

    #[test]
    fn window_allocator_aligns_naturally() {
        let mut a = WindowAllocator::new((0x1000, 0x10000));
        let r = a.allocate(BarKind::Mem32, 0x100).unwrap();
        assert_eq!((r.start(), r.end()), (0x1000, 0x10ff));
        let r = a.allocate(BarKind::Mem32, 0x4000).unwrap();
        assert_eq!(r.start(), 0x4000);
        assert_eq!(r.start() % 0x4000, 0);
        assert!(matches!(
            a.allocate(BarKind::Mem32, 0x10000),
            Err(PciError::WindowExhausted {
                kind: BarKind::Mem32,
                size: 0x10000
            })
        ));
    }

    #[test]
    fn window_allocator_reuses_freed_ranges() {
        let mut a = WindowAllocator::new((0x1000, 0x3000));
        let first = a.allocate(BarKind::Io, 0x1000).unwrap();
        let second = a.allocate(BarKind::Io, 0x1000).unwrap();
        let third = a.allocate(BarKind::Io, 0x1000).unwrap();
        assert_eq!(
            [first.start(), second.start(), third.start()],
            [0x1000, 0x2000, 0x3000]
        );
        // Full: an error, not a panic.
        assert!(matches!(
            a.allocate(BarKind::Io, 0x1000),
            Err(PciError::WindowExhausted { .. })
        ));
        a.free(&second).unwrap();
        assert_eq!(a.allocate(BarKind::Io, 0x1000).unwrap(), second);
        // A range that was never handed out is refused, not a panic
        // (`vm-allocator` does not refuse freeing a free range twice:
        // `by_slot` is taken on removal, so each range is freed once).
        let stray = RangeInclusive::new(0x1800, 0x18ff).unwrap();
        assert!(a.free(&stray).is_err());
    }

    #[test]
    fn empty_or_overflowing_window_refuses_bars() {
        let mut a = WindowAllocator::new((0x1000, 0));
        assert!(matches!(
            a.allocate(BarKind::Io, 0x10),
            Err(PciError::WindowExhausted { .. })
        ));
        let mut a = WindowAllocator::new((u64::MAX - 0xfff, 0x2000));
        assert!(a
            .allocate(BarKind::Mem64 { prefetchable: true }, 0x10)
            .is_err());
    }

    #[test]
    fn boot_layout_matches_the_old_bump_allocator() {
        // Boot-time devices: virtio transports (one 64-bit BAR of
        // 0x8000), the DMA test device (a 32-bit BAR of 1 MiB) and the
        // test device's three kinds, interleaved as a boot might.
        let w = windows();
        let (mut io, mut m32, mut m64) = (w.io.0, w.mmio32.0, w.mmio64.0);
        let mut a = WindowAllocator::new(w.io);
        let mut b = WindowAllocator::new(w.mmio32);
        let mut c = WindowAllocator::new(w.mmio64);
        let seq: [(BarKind, u64); 9] = [
            (BarKind::Mem32, 0x1000),
            (
                BarKind::Mem64 {
                    prefetchable: false,
                },
                0x4000,
            ),
            (BarKind::Io, 0x40),
            (
                BarKind::Mem64 {
                    prefetchable: false,
                },
                0x8000,
            ),
            (
                BarKind::Mem64 {
                    prefetchable: false,
                },
                0x8000,
            ),
            (BarKind::Mem32, 1 << 20),
            (
                BarKind::Mem64 {
                    prefetchable: false,
                },
                0x8000,
            ),
            (BarKind::Io, 0x40),
            (BarKind::Mem32, 1 << 20),
        ];
        for (kind, size) in seq {
            let (window, next, end) = match kind {
                BarKind::Io => (&mut a, &mut io, w.io.0 + w.io.1),
                BarKind::Mem32 => (&mut b, &mut m32, w.mmio32.0 + w.mmio32.1),
                BarKind::Mem64 { .. } => (&mut c, &mut m64, w.mmio64.0 + w.mmio64.1),
            };
            let got = window.allocate(kind, size).unwrap().start();
            assert_eq!(Some(got), bump(next, end, size), "{kind:?} {size:#x}");
        }
    }

    #[test]
    fn failed_add_frees_what_it_allocated() {
        let (root, _, _) = root_without_io_room();
        assert!(root.add_device(test_device()).is_err());
        // The memory BARs allocated before the I/O BAR failed were freed:
        // a device without an I/O BAR gets them.
        let dev = test_device();
        dev.lock().unwrap().config = {
            let mut config = PciConfiguration::new(test_header());
            config.add_bar(0, 0x1000, BarKind::Mem32).unwrap();
            config
        };
        let addr = root.add_device(dev).unwrap();
        assert_eq!(root.config_read(addr, 4), 0xc000_0000);
    }
}
