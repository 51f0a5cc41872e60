//! A PCI function's configuration space with BAR sizing and a capability list.
//!
//! Why a shared helper: every emulated PCI device needs the same header rules
//! (read-only ids, BAR size probing by writing all-ones, command register
//! bits, capability chaining). Devices embed a [`PciConfiguration`] and only
//! intercept the registers that mean something to them.

use thiserror::Error;

use crate::width::usize_from_u64;

/// Number of 32-bit registers in a PCI Express configuration space (4 KiB).
pub const NUM_CONFIG_REGISTERS: usize = 1024;
/// Number of BARs in a type 0 header.
pub const NUM_BARS: usize = 6;
/// Register index of BAR 0.
pub const BAR0_REG: usize = 4;
/// First byte offset available for capabilities.
pub const FIRST_CAPABILITY_OFFSET: usize = 0x40;
/// End (exclusive) of the legacy configuration space where capabilities live.
pub const LEGACY_CONFIG_END: usize = 0x100;
/// Status register bit: a capability list is present.
const STATUS_CAP_LIST: u32 = 1 << 20;
/// Command register bits a guest may change: I/O, memory, bus master,
/// parity, SERR, INTx disable.
const COMMAND_WRITABLE: u32 = 0x0547;

/// Errors while building a configuration space.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PciConfigError {
    /// BAR index out of range or already used.
    #[error("BAR {0} is out of range or already in use")]
    BarInUse(usize),
    /// BAR size is not a power of two or below the minimum for its kind.
    #[error("invalid BAR size {0:#x}")]
    BarSize(u64),
    /// Capabilities do not fit in the legacy 256-byte space.
    #[error("no room for a capability of {0} bytes")]
    CapabilitySpace(usize),
}

/// The kind of a BAR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarKind {
    /// I/O port space.
    Io,
    /// 32-bit memory space.
    Mem32,
    /// 64-bit memory space (uses two BAR registers).
    Mem64 {
        /// Whether the region can be prefetched.
        prefetchable: bool,
    },
}

impl BarKind {
    /// The low flag bits of the BAR register.
    fn flag_bits(self) -> u32 {
        match self {
            BarKind::Io => 0x1,
            BarKind::Mem32 => 0x0,
            BarKind::Mem64 { prefetchable } => 0x4 | if prefetchable { 0x8 } else { 0 },
        }
    }

    /// True for memory BARs.
    pub fn is_memory(self) -> bool {
        !matches!(self, BarKind::Io)
    }
}

/// A BAR declared by a device and the address it currently decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bar {
    /// Size in bytes (a power of two).
    pub size: u64,
    /// Address space and width.
    pub kind: BarKind,
    /// Address the BAR is mapped at on the bus (0 until allocated).
    pub addr: u64,
}

/// A BAR whose address the guest changed: the root moves its bus range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BarReprogram {
    /// BAR index.
    pub index: usize,
    /// Previous address.
    pub old_addr: u64,
    /// New address.
    pub new_addr: u64,
    /// Size of the BAR.
    pub size: u64,
    /// Kind of the BAR (selects the I/O or MMIO bus).
    pub kind: BarKind,
}

/// Why a function could not decode a moved BAR at its new address outside
/// the buses (e.g. KVM refused the memory slot of a directly mapped BAR):
/// the root then refuses the whole move.
#[derive(Debug, Error)]
#[error("BAR {bar} cannot be placed at {addr:#x}: {source}")]
pub struct BarPlaceError {
    /// BAR index.
    pub bar: usize,
    /// Where the guest asked for it.
    pub addr: u64,
    /// Why not.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}

/// Identity of a PCI function (the read-only part of a type 0 header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PciHeader {
    /// Vendor id.
    pub vendor_id: u16,
    /// Device id.
    pub device_id: u16,
    /// Base class code.
    pub class: u8,
    /// Subclass code.
    pub subclass: u8,
    /// Programming interface.
    pub prog_if: u8,
    /// Revision id.
    pub revision: u8,
    /// Subsystem vendor id.
    pub subsystem_vendor_id: u16,
    /// Subsystem id.
    pub subsystem_id: u16,
    /// Interrupt pin (0 = none, 1 = INTA#...).
    pub interrupt_pin: u8,
}

/// A configuration space image plus the rules for guest writes.
#[derive(Clone)]
pub struct PciConfiguration {
    regs: Vec<u32>,
    writable: Vec<u32>,
    bars: [Option<Bar>; NUM_BARS],
    next_capability: usize,
    last_capability: Option<usize>,
}

impl PciConfiguration {
    /// A type 0 header for `header`.
    pub fn new(header: PciHeader) -> Self {
        let mut regs = vec![0u32; NUM_CONFIG_REGISTERS];
        let mut writable = vec![0u32; NUM_CONFIG_REGISTERS];
        regs[0] = u32::from(header.vendor_id) | (u32::from(header.device_id) << 16);
        regs[2] = u32::from(header.revision)
            | (u32::from(header.prog_if) << 8)
            | (u32::from(header.subclass) << 16)
            | (u32::from(header.class) << 24);
        regs[11] = u32::from(header.subsystem_vendor_id) | (u32::from(header.subsystem_id) << 16);
        regs[15] = u32::from(header.interrupt_pin) << 8;
        writable[1] = COMMAND_WRITABLE;
        // Cache line size and latency timer are plain storage.
        writable[3] = 0x0000_ffff;
        // Interrupt line is plain storage for the OS.
        writable[15] = 0x0000_00ff;
        Self {
            regs,
            writable,
            bars: [None; NUM_BARS],
            next_capability: FIRST_CAPABILITY_OFFSET,
            last_capability: None,
        }
    }

    /// Declares BAR `index`. A 64-bit BAR also takes register `index + 1`.
    pub fn add_bar(
        &mut self,
        index: usize,
        size: u64,
        kind: BarKind,
    ) -> Result<(), PciConfigError> {
        let slots = if matches!(kind, BarKind::Mem64 { .. }) {
            2
        } else {
            1
        };
        if index + slots > NUM_BARS
            || self.bars[index..index + slots].iter().any(Option::is_some)
            || (index > 0
                && matches!(
                    self.bars[index - 1],
                    Some(Bar {
                        kind: BarKind::Mem64 { .. },
                        ..
                    })
                ))
        {
            return Err(PciConfigError::BarInUse(index));
        }
        let min = if kind.is_memory() { 16 } else { 4 };
        let max = match kind {
            BarKind::Io => 1 << 16,
            BarKind::Mem32 => 1 << 31,
            BarKind::Mem64 { .. } => 1 << 40,
        };
        if !size.is_power_of_two() || size < min || size > max {
            return Err(PciConfigError::BarSize(size));
        }
        self.bars[index] = Some(Bar {
            size,
            kind,
            addr: 0,
        });
        let reg = BAR0_REG + index;
        let mask = !(size - 1);
        self.writable[reg] =
            ((mask & 0xffff_ffff) as u32) & if kind.is_memory() { !0xf } else { !0x3 };
        self.regs[reg] = kind.flag_bits();
        if slots == 2 {
            self.writable[reg + 1] = (mask >> 32) as u32;
            self.regs[reg + 1] = 0;
        }
        Ok(())
    }

    /// The BAR declared at `index`, if any.
    pub fn bar(&self, index: usize) -> Option<Bar> {
        self.bars.get(index).copied().flatten()
    }

    /// All declared BARs with their indices.
    pub fn bars(&self) -> impl Iterator<Item = (usize, Bar)> + '_ {
        self.bars
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.map(|b| (i, b)))
    }

    /// Places BAR `index` at `addr` (done by the root complex at allocation).
    pub fn set_bar_address(&mut self, index: usize, addr: u64) {
        let Some(bar) = self.bars.get_mut(index).and_then(Option::as_mut) else {
            return;
        };
        bar.addr = addr;
        let reg = BAR0_REG + index;
        self.regs[reg] = ((addr & 0xffff_ffff) as u32 & self.writable[reg]) | bar.kind.flag_bits();
        if matches!(bar.kind, BarKind::Mem64 { .. }) {
            self.regs[reg + 1] = (addr >> 32) as u32;
        }
    }

    /// Keeps BAR `index` decoding at `addr` (its bus range, its slots)
    /// while its registers hold what the guest wrote. Only for a BAR that
    /// does not decode: a 64-bit BAR is written one half at a time, and
    /// the address between the two writes may be one the root refuses;
    /// the second write then moves it from `addr` to where the guest
    /// meant. [`Self::settle_bars`] ends it when decoding is turned on.
    pub fn park_bar(&mut self, index: usize, addr: u64) {
        if let Some(bar) = self.bars.get_mut(index).and_then(Option::as_mut) {
            bar.addr = addr;
        }
    }

    /// The address BAR `index`'s registers hold.
    fn register_addr(&self, index: usize) -> Option<u64> {
        let bar = self.bar(index)?;
        let reg = BAR0_REG + index;
        let mut addr = u64::from(self.regs[reg] & self.writable[reg]);
        if matches!(bar.kind, BarKind::Mem64 { .. }) {
            addr |= u64::from(self.regs[reg + 1]) << 32;
        }
        Some(addr)
    }

    /// Puts the registers of every decoding BAR back at the address it
    /// decodes (a parked BAR, or one left mid size-probe, when the
    /// guest turns decoding on): what the guest reads is where it is.
    pub fn settle_bars(&mut self) {
        let stale: Vec<(usize, u64)> = self
            .bars()
            .filter(|(i, b)| self.bar_decodes(*i) && self.register_addr(*i) != Some(b.addr))
            .map(|(i, b)| (i, b.addr))
            .collect();
        for (index, addr) in stale {
            self.set_bar_address(index, addr);
        }
    }

    /// Appends a capability with id `id`; `body` is everything after the
    /// 2-byte (id, next) header. Returns the capability's byte offset.
    pub fn add_capability(&mut self, id: u8, body: &[u8]) -> Result<usize, PciConfigError> {
        let len = 2 + body.len();
        let offset = self.next_capability;
        if offset + len > LEGACY_CONFIG_END {
            return Err(PciConfigError::CapabilitySpace(len));
        }
        // Below LEGACY_CONFIG_END (256): the byte a capability pointer holds.
        let pointer = u8::try_from(offset).map_err(|_| PciConfigError::CapabilitySpace(len))?;
        self.write_bytes_raw(offset, &[id, 0]);
        self.write_bytes_raw(offset + 2, body);
        match self.last_capability {
            Some(prev) => self.write_bytes_raw(prev + 1, &[pointer]),
            None => {
                self.regs[13] = u32::from(pointer);
                self.regs[1] |= STATUS_CAP_LIST;
            }
        }
        self.last_capability = Some(offset);
        self.next_capability = (offset + len).div_ceil(4) * 4;
        Ok(offset)
    }

    /// Lets the guest change the bits of `mask` in register `reg` (e.g. a
    /// capability's control field).
    pub fn set_writable_mask(&mut self, reg: usize, mask: u32) {
        if let Some(w) = self.writable.get_mut(reg) {
            *w = mask;
        }
    }

    /// Stores bytes ignoring write masks (device-side updates).
    pub fn write_bytes_raw(&mut self, offset: usize, data: &[u8]) {
        for (i, byte) in data.iter().enumerate() {
            let pos = offset + i;
            let Some(reg) = self.regs.get_mut(pos / 4) else {
                return;
            };
            let shift = (pos % 4) * 8;
            *reg = (*reg & !(0xff << shift)) | (u32::from(*byte) << shift);
        }
    }

    /// Reads register `reg`; out-of-range registers read as all-ones.
    pub fn read_reg(&self, reg: usize) -> u32 {
        self.regs.get(reg).copied().unwrap_or(0xffff_ffff)
    }

    /// Applies a guest write of 1, 2 or 4 bytes at byte `offset` of register
    /// `reg`. Returns the BAR move it causes, if any.
    pub fn write_reg(&mut self, reg: usize, offset: u64, data: &[u8]) -> Option<BarReprogram> {
        if reg >= NUM_CONFIG_REGISTERS || usize_from_u64(offset) + data.len() > 4 || data.is_empty()
        {
            return None;
        }
        let mut value = 0u32;
        let mut lanes = 0u32;
        for (i, b) in data.iter().enumerate() {
            let shift = (usize_from_u64(offset) + i) * 8;
            value |= u32::from(*b) << shift;
            lanes |= 0xff << shift;
        }
        let mask = self.writable[reg] & lanes;
        let old = self.regs[reg];
        self.regs[reg] = (old & !mask) | (value & mask);
        if (BAR0_REG..BAR0_REG + NUM_BARS).contains(&reg) {
            // Writing all-ones is a size probe, not a move.
            if value & lanes == lanes {
                return None;
            }
            return self.bar_moved(reg - BAR0_REG);
        }
        None
    }

    /// Compares the BAR registers with the applied address after a write.
    fn bar_moved(&mut self, reg_index: usize) -> Option<BarReprogram> {
        let (index, bar) = match self.bars[reg_index] {
            Some(bar) => (reg_index, bar),
            None if reg_index > 0 => match self.bars[reg_index - 1] {
                Some(bar) if matches!(bar.kind, BarKind::Mem64 { .. }) => (reg_index - 1, bar),
                _ => return None,
            },
            None => return None,
        };
        let new_addr = self.register_addr(index)?;
        if new_addr == bar.addr {
            return None;
        }
        if let Some(b) = self.bars[index].as_mut() {
            b.addr = new_addr;
        }
        Some(BarReprogram {
            index,
            old_addr: bar.addr,
            new_addr,
            size: bar.size,
            kind: bar.kind,
        })
    }

    /// Whether the command register enables memory decoding.
    pub fn memory_enabled(&self) -> bool {
        self.regs[1] & 0x2 != 0
    }

    /// Whether BAR `index` decodes: the command register's I/O space bit
    /// for an I/O BAR, its memory space bit for a memory BAR.
    pub fn bar_decodes(&self, index: usize) -> bool {
        match self.bar(index) {
            Some(b) if b.kind.is_memory() => self.memory_enabled(),
            Some(_) => self.regs[1] & 0x1 != 0,
            None => false,
        }
    }

    /// Whether the command register enables bus mastering (DMA).
    pub fn bus_master_enabled(&self) -> bool {
        self.regs[1] & 0x4 != 0
    }
}

/// The dword `old` after a guest write of `data` at byte `offset` of it
/// (bytes beyond the dword are dropped), for registers that emulate a
/// field of a dword the guest may write in 1, 2 or 4 bytes.
pub fn merge_write(old: u32, offset: usize, data: &[u8]) -> u32 {
    let mut bytes = old.to_le_bytes();
    for (i, byte) in data.iter().enumerate() {
        if let Some(slot) = offset.checked_add(i).and_then(|at| bytes.get_mut(at)) {
            *slot = *byte;
        }
    }
    u32::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> PciHeader {
        PciHeader {
            vendor_id: 0x1af4,
            device_id: 0x1041,
            class: 0x02,
            subclass: 0x00,
            prog_if: 0,
            revision: 1,
            subsystem_vendor_id: 0x1af4,
            subsystem_id: 0x0001,
            interrupt_pin: 1,
        }
    }

    #[test]
    fn ids_are_read_only() {
        let mut c = PciConfiguration::new(header());
        assert_eq!(c.read_reg(0), 0x1041_1af4);
        c.write_reg(0, 0, &[0, 0, 0, 0]);
        assert_eq!(c.read_reg(0), 0x1041_1af4);
        assert_eq!(c.read_reg(2) >> 24, 0x02);
        assert_eq!(c.read_reg(11), 0x0001_1af4);
        assert_eq!(c.read_reg(5000), 0xffff_ffff);
    }

    #[test]
    fn command_register_keeps_only_writable_bits() {
        let mut c = PciConfiguration::new(header());
        c.write_reg(1, 0, &[0xff, 0xff]);
        assert_eq!(c.read_reg(1) & 0xffff, 0x0547);
        assert!(c.memory_enabled());
        assert!(c.bus_master_enabled());
    }

    #[test]
    fn mem32_bar_sizing_and_move() {
        let mut c = PciConfiguration::new(header());
        c.add_bar(0, 0x1000, BarKind::Mem32).unwrap();
        c.set_bar_address(0, 0xc000_0000);
        assert_eq!(c.read_reg(4), 0xc000_0000);
        assert_eq!(c.write_reg(4, 0, &[0xff; 4]), None);
        assert_eq!(c.read_reg(4), 0xffff_f000);
        let moved = c.write_reg(4, 0, &0xc000_0000u32.to_le_bytes());
        // Restoring the same address after probing is not a move.
        assert_eq!(moved, None);
        let moved = c.write_reg(4, 0, &0xc010_0000u32.to_le_bytes()).unwrap();
        assert_eq!(moved.old_addr, 0xc000_0000);
        assert_eq!(moved.new_addr, 0xc010_0000);
        assert_eq!(c.bar(0).unwrap().addr, 0xc010_0000);
    }

    #[test]
    fn mem64_bar_spans_two_registers() {
        let mut c = PciConfiguration::new(header());
        c.add_bar(2, 0x4000, BarKind::Mem64 { prefetchable: true })
            .unwrap();
        c.set_bar_address(2, 0x1_0000_0000);
        assert_eq!(c.read_reg(6), 0xc);
        assert_eq!(c.read_reg(7), 1);
        c.write_reg(6, 0, &[0xff; 4]);
        assert_eq!(c.read_reg(6), 0xffff_c00c);
        c.write_reg(7, 0, &[0xff; 4]);
        assert_eq!(c.read_reg(7), 0xffff_ffff);
        c.write_reg(6, 0, &0u32.to_le_bytes());
        let moved = c.write_reg(7, 0, &2u32.to_le_bytes()).unwrap();
        assert_eq!(moved.index, 2);
        assert_eq!(moved.new_addr, 0x2_0000_0000);
        assert!(c.add_bar(3, 0x1000, BarKind::Mem32).is_err());
    }

    #[test]
    fn io_bar_sizing() {
        let mut c = PciConfiguration::new(header());
        c.add_bar(1, 0x20, BarKind::Io).unwrap();
        c.write_reg(5, 0, &[0xff; 4]);
        assert_eq!(c.read_reg(5), 0xffff_ffe1);
    }

    #[test]
    fn bad_bars_are_rejected() {
        let mut c = PciConfiguration::new(header());
        assert_eq!(
            c.add_bar(0, 0x1800, BarKind::Mem32),
            Err(PciConfigError::BarSize(0x1800))
        );
        assert_eq!(
            c.add_bar(0, 8, BarKind::Mem32),
            Err(PciConfigError::BarSize(8))
        );
        assert!(c
            .add_bar(
                5,
                0x1000,
                BarKind::Mem64 {
                    prefetchable: false
                }
            )
            .is_err());
        c.add_bar(0, 0x1000, BarKind::Mem32).unwrap();
        assert_eq!(
            c.add_bar(0, 0x1000, BarKind::Mem32),
            Err(PciConfigError::BarInUse(0))
        );
    }

    #[test]
    fn merge_write_replaces_only_the_written_bytes() {
        assert_eq!(merge_write(0x4433_2211, 2, &[0xaa, 0xbb]), 0xbbaa_2211);
        assert_eq!(merge_write(0x4433_2211, 0, &[1, 2, 3, 4]), 0x0403_0201);
        assert_eq!(merge_write(0x4433_2211, 3, &[0xaa, 0xbb]), 0xaa33_2211);
        assert_eq!(merge_write(0x4433_2211, usize::MAX, &[0xaa]), 0x4433_2211);
    }

    #[test]
    fn capabilities_are_chained() {
        let mut c = PciConfiguration::new(header());
        let first = c.add_capability(0x09, &[1, 2, 3]).unwrap();
        let second = c.add_capability(0x11, &[0; 10]).unwrap();
        assert_eq!(first, 0x40);
        assert_eq!(second, 0x48);
        assert_ne!(c.read_reg(1) & STATUS_CAP_LIST, 0);
        assert_eq!(c.read_reg(13) & 0xff, 0x40);
        let cap0 = c.read_reg(0x40 / 4);
        assert_eq!(cap0 & 0xff, 0x09);
        assert_eq!((cap0 >> 8) & 0xff, 0x48);
        assert_eq!(c.read_reg(0x48 / 4) & 0xffff, 0x0011);
        assert!(c.add_capability(0x09, &[0; 200]).is_err());
    }

    #[test]
    fn writable_mask_applies_to_capability_fields() {
        let mut c = PciConfiguration::new(header());
        let off = c.add_capability(0x11, &[0; 10]).unwrap();
        c.set_writable_mask(off / 4, 0xc000_0000);
        c.write_reg(off / 4, 3, &[0xff]);
        assert_eq!(c.read_reg(off / 4) >> 24, 0xc0);
    }
}
