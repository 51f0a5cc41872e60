//! The MSI capability of an assigned function, emulated.
//!
//! vfio-pci virtualizes the capability's registers (the guest's address
//! and data never reach the device; the host kernel programs its own), so
//! the VMM keeps the guest's view here and turns it into a KVM route and
//! a VFIO irqfd: when the guest sets the enable bit, the vector's GSI is
//! pointed at the guest's message and VFIO signals that GSI's eventfd on
//! each interrupt, without the VMM on the path.
//!
//! One vector is offered (Multiple Message Capable reads 0) and per-vector
//! masking is hidden, so the guest never writes the mask registers: what
//! is left is the control word, the address and the data.

use crate::interrupt::MsiMessage;
use crate::pci::merge_write;

/// Capability ID of MSI.
pub const MSI_CAP_ID: u8 = 0x05;
/// Control word: MSI enable.
const CTRL_ENABLE: u16 = 1 << 0;
/// Control word: 64-bit address capable (read-only, the device's).
const CTRL_64BIT: u16 = 1 << 7;
/// Status register bit: a capability list is present.
pub(super) const STATUS_CAP_LIST: u16 = 1 << 4;

/// Byte offset of the first capability with ID `id` in a configuration
/// space image, following the list from the capability pointer. A
/// malformed or looping list ends the search (it is the device's, and a
/// device can be hostile too).
pub fn find_capability(cfg: &[u8], id: u8) -> Option<usize> {
    let status = u16::from_le_bytes([*cfg.get(6)?, *cfg.get(7)?]);
    if status & STATUS_CAP_LIST == 0 {
        return None;
    }
    let mut at = usize::from(*cfg.get(0x34)? & !3);
    // At most as many capabilities as fit after the header.
    for _ in 0..48 {
        if at < 0x40 || at + 4 > cfg.len() {
            return None;
        }
        if *cfg.get(at)? == id {
            return Some(at);
        }
        at = usize::from(*cfg.get(at + 1)? & !3);
    }
    None
}

/// What a guest write to the capability asks of the VMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsiChange {
    /// Nothing for VFIO or KVM to do.
    None,
    /// Route the vector to this message and enable MSI in VFIO.
    Enable(MsiMessage),
    /// Disable MSI in VFIO.
    Disable,
    /// MSI stays on; the vector's route follows the new message.
    Reroute(MsiMessage),
}

/// The guest's view of the MSI capability.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MsiCap {
    /// Byte offset of the capability in configuration space.
    cap: usize,
    /// The device has a 64-bit address register.
    is64: bool,
    enabled: bool,
    /// Multiple Message Enable as written (kept for reads, always 1 vector).
    mme: u16,
    addr_lo: u32,
    addr_hi: u32,
    data: u16,
}

impl MsiCap {
    /// The function's MSI capability, from its configuration space image.
    pub fn find(cfg: &[u8]) -> Option<Self> {
        let cap = find_capability(cfg, MSI_CAP_ID)?;
        let ctrl = u16::from_le_bytes([*cfg.get(cap + 2)?, *cfg.get(cap + 3)?]);
        Some(Self {
            cap,
            is64: ctrl & CTRL_64BIT != 0,
            enabled: false,
            mme: 0,
            addr_lo: 0,
            addr_hi: 0,
            data: 0,
        })
    }

    /// Whether the guest enabled MSI.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The message the guest programmed.
    pub fn message(&self) -> MsiMessage {
        MsiMessage {
            addr: u64::from(self.addr_lo) | (u64::from(self.addr_hi) << 32),
            data: u32::from(self.data),
        }
    }

    /// Index (from 0) of `reg` among the emulated dwords, if it is one:
    /// 0 header and control, 1 address, 2 upper address (64-bit) or data,
    /// 3 data (64-bit).
    fn dword(&self, reg: usize) -> Option<usize> {
        let first = self.cap / 4;
        let n = if self.is64 { 4 } else { 3 };
        reg.checked_sub(first).filter(|i| *i < n)
    }

    /// Whether the dword register `reg` is emulated here.
    pub fn covers(&self, reg: usize) -> bool {
        self.dword(reg).is_some()
    }

    /// The guest's read of dword `reg`; `dev` is the device's value (its
    /// ID and next pointer are kept).
    pub fn read(&self, reg: usize, dev: u32) -> u32 {
        match (self.dword(reg), self.is64) {
            (Some(0), _) => {
                let mut ctrl = self.mme << 4;
                if self.is64 {
                    ctrl |= CTRL_64BIT;
                }
                if self.enabled {
                    ctrl |= CTRL_ENABLE;
                }
                (dev & 0xffff) | (u32::from(ctrl) << 16)
            }
            (Some(1), _) => self.addr_lo,
            (Some(2), true) => self.addr_hi,
            (Some(2), false) | (Some(3), true) => u32::from(self.data),
            _ => dev,
        }
    }

    /// Applies a guest write of `data` at byte `offset` of dword `reg`.
    pub fn write(&mut self, reg: usize, offset: usize, data: &[u8], dev: u32) -> MsiChange {
        let Some(i) = self.dword(reg) else {
            return MsiChange::None;
        };
        let value = merge_write(self.read(reg, dev), offset, data);
        let (was_on, was_msg) = (self.enabled, self.message());
        match (i, self.is64) {
            (0, _) => {
                let ctrl = (value >> 16) as u16;
                self.enabled = ctrl & CTRL_ENABLE != 0;
                // One vector: the guest may only enable one.
                self.mme = 0;
            }
            // The low two bits of the address are reserved.
            (1, _) => self.addr_lo = value & !3,
            (2, true) => self.addr_hi = value,
            (2, false) | (3, true) => self.data = (value & 0xffff) as u16,
            _ => {}
        }
        match (was_on, self.enabled) {
            (false, true) => MsiChange::Enable(self.message()),
            (true, false) => MsiChange::Disable,
            (true, true) if self.message() != was_msg => MsiChange::Reroute(self.message()),
            _ => MsiChange::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header whose list is PM at 0x40 -> MSI at 0xd0 (64-bit, per-vector
    /// masking, 4 vectors capable).
    fn image() -> Vec<u8> {
        let mut c = vec![0u8; 256];
        c[6] = u8::try_from(STATUS_CAP_LIST).unwrap();
        c[0x34] = 0x40;
        c[0x40] = 0x01;
        c[0x41] = 0xd0;
        c[0xd0] = MSI_CAP_ID;
        let ctrl: u16 = CTRL_64BIT | (1 << 8) | (2 << 1);
        c[0xd2..0xd4].copy_from_slice(&ctrl.to_le_bytes());
        c
    }

    #[test]
    fn finds_the_capability_and_stops_on_bad_lists() {
        let c = image();
        assert_eq!(find_capability(&c, MSI_CAP_ID), Some(0xd0));
        assert_eq!(find_capability(&c, 0x11), None);
        let mut looping = c.clone();
        looping[0x41] = 0x40;
        assert_eq!(find_capability(&looping, MSI_CAP_ID), None);
        let mut outside = c.clone();
        outside[0x41] = 0xfe;
        assert_eq!(find_capability(&outside, MSI_CAP_ID), None);
        let mut no_list = c;
        no_list[6] = 0;
        assert_eq!(find_capability(&no_list, MSI_CAP_ID), None);
    }

    #[test]
    fn offers_one_vector_without_masking() {
        let m = MsiCap::find(&image()).expect("MSI capability");
        // The device says enabled, next capability at 0xe0.
        let dev = 0x0001_0000 | (0xe0 << 8) | u32::from(MSI_CAP_ID);
        let r = m.read(0xd0 / 4, dev);
        assert_eq!(r & 0xffff, dev & 0xffff, "ID and next pointer kept");
        let ctrl = (r >> 16) as u16;
        assert_eq!(ctrl & (7 << 1), 0, "multiple messages hidden");
        assert_eq!(ctrl & (1 << 8), 0, "per-vector masking hidden");
        assert_eq!(
            ctrl & CTRL_ENABLE,
            0,
            "the guest's enable bit, not the device's"
        );
        assert_ne!(ctrl & CTRL_64BIT, 0);
        assert!(m.covers(0xdc / 4) && !m.covers(0xe0 / 4) && !m.covers(0xcc / 4));
    }

    #[test]
    fn enable_reroute_disable() {
        let mut m = MsiCap::find(&image()).expect("MSI capability");
        let reg = 0xd0 / 4;
        assert_eq!(
            m.write(reg + 1, 0, &0xfee0_1003u32.to_le_bytes(), 0),
            MsiChange::None
        );
        assert_eq!(m.write(reg + 2, 0, &0u32.to_le_bytes(), 0), MsiChange::None);
        assert_eq!(
            m.write(reg + 3, 0, &0x21u16.to_le_bytes(), 0),
            MsiChange::None
        );
        // Enable with 4 messages asked: one is granted.
        let ctrl = CTRL_ENABLE | (2 << 4);
        let want = MsiMessage {
            addr: 0xfee0_1000,
            data: 0x21,
        };
        assert_eq!(
            m.write(reg, 2, &ctrl.to_le_bytes(), 0),
            MsiChange::Enable(want)
        );
        assert!(m.enabled());
        assert_eq!((m.read(reg, 0) >> 20) & 7, 0, "MME reads 0");
        // A new vector number while enabled moves the route.
        assert_eq!(
            m.write(reg + 3, 0, &0x22u16.to_le_bytes(), 0),
            MsiChange::Reroute(MsiMessage { data: 0x22, ..want })
        );
        // The same value again changes nothing.
        assert_eq!(
            m.write(reg + 3, 0, &0x22u16.to_le_bytes(), 0),
            MsiChange::None
        );
        assert_eq!(m.write(reg, 2, &0u16.to_le_bytes(), 0), MsiChange::Disable);
        assert!(!m.enabled());
    }

    #[test]
    fn a_32_bit_capability_keeps_data_in_its_third_dword() {
        let mut c = image();
        c[0xd2..0xd4].copy_from_slice(&0u16.to_le_bytes());
        let mut m = MsiCap::find(&c).expect("MSI capability");
        let reg = 0xd0 / 4;
        assert!(!m.covers(reg + 3));
        m.write(reg + 2, 0, &0x41u32.to_le_bytes(), 0);
        assert_eq!(m.message().data, 0x41);
        assert_eq!(m.read(reg + 2, 0), 0x41);
    }
}
