//! A host PCI function assigned to the guest through VFIO.
//!
//! What the guest sees: the function's own configuration space, read and
//! written through VFIO, except for what the VMM must own:
//! - the header's BARs (the guest programs addresses in our copy; accesses
//!   to those addresses are trapped and forwarded to the VFIO regions),
//!   interrupt line/pin (no INTx is offered) and the command register,
//!   which is kept in our copy and forwarded to the device;
//! - the MSI-X capability's control word and the MSI-X table and PBA,
//!   emulated with [`MsixBlock`]: every vector gets a GSI whose irqfd is
//!   handed to VFIO, so the device's interrupts reach the guest without the
//!   VMM on the path (while the vector is unmasked: a masked vector's
//!   irqfd is detached and its signals become pending bits);
//! - the MSI capability, emulated with [`MsiCap`] (one vector, its GSI and
//!   irqfd handed to VFIO in the same way), for guests and devices that use
//!   MSI rather than MSI-X.
//!
//! A BAR that VFIO lets us mmap whole and that holds no MSI-X structure
//! becomes a KVM memory slot ([`DirectBar`]): the guest reaches the device
//! without an exit. Accesses to the other BARs (and to a mapped BAR while
//! its slot is absent) are trapped and forwarded to the VFIO regions.

use std::sync::Arc;

use kvm_ioctls::VmFd;
use log::{debug, info, warn};
use vfio_bindings::bindings::vfio::VFIO_PCI_CONFIG_REGION_INDEX;
use vfio_ioctls::VfioDevice;
use vmm_sys_util::eventfd::EventFd;

use super::bus_master::BusMasterGate;
use super::direct_bar::DirectBar;
#[cfg(test)]
use super::msi::STATUS_CAP_LIST;
use super::msi::{find_capability, MsiCap, MsiChange};
use super::msix_block::{MsixAccess, MsixBlock};
use crate::pci::{
    merge_write, BarKind, BarPlaceError, BarReprogram, PciConfigError, PciConfiguration, PciDevice,
    PciHeader,
};
use crate::virtio::msix::{MsiSink, MSIX_CAP_ID};
use crate::warn_limited;
use crate::width::usize_from_u64;

/// Why an MSI change the guest wrote could not be carried out (logged; the
/// vector stays as it was).
#[derive(Debug, thiserror::Error)]
enum MsiSwitchError {
    /// The vector's GSI route could not follow the message.
    #[error("{0}")]
    Route(#[from] crate::interrupt::InterruptError),
    /// VFIO refused to switch MSI on or off.
    #[error("{0}")]
    Vfio(#[from] vfio_ioctls::VfioError),
}

/// Registers of the type-0 header (bytes 0..0x40).
const HEADER_REGS: usize = 16;
/// Size of the configuration space the guest sees (no extended space).
const CONFIG_SIZE: usize = 256;

/// Where a function's MSI-X capability and structures are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsixLayout {
    /// Byte offset of the capability in configuration space.
    pub cap: usize,
    /// The table: (BAR, offset in the BAR).
    pub table: (usize, u64),
    /// The pending-bit array: (BAR, offset in the BAR).
    pub pba: (usize, u64),
    /// Table entries.
    pub vectors: usize,
}

/// The MSI-X capability of a configuration space image, if any.
pub fn find_msix(cfg: &[u8]) -> Option<MsixLayout> {
    let at = find_capability(cfg, MSIX_CAP_ID)?;
    let dword =
        |o: usize| -> Option<u32> { Some(u32::from_le_bytes(cfg.get(o..o + 4)?.try_into().ok()?)) };
    let ctrl = u16::from_le_bytes([*cfg.get(at + 2)?, *cfg.get(at + 3)?]);
    let table = dword(at + 4)?;
    let pba = dword(at + 8)?;
    Some(MsixLayout {
        cap: at,
        table: ((table & 7) as usize, u64::from(table & !7)),
        pba: ((pba & 7) as usize, u64::from(pba & !7)),
        vectors: usize::from(ctrl & 0x7ff) + 1,
    })
}

/// The BAR kinds of a configuration space image, with each BAR's size from
/// `size_of(index)` (0: absent). The upper half of a 64-bit BAR is skipped.
pub fn bar_layout(cfg: &[u8], size_of: impl Fn(usize) -> u64) -> Vec<(usize, u64, BarKind)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < 6 {
        let off = 0x10 + 4 * i;
        let Some(raw) = cfg
            .get(off..off + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
        else {
            break;
        };
        let size = size_of(i);
        let kind = if raw & 1 != 0 {
            BarKind::Io
        } else if (raw >> 1) & 3 == 2 {
            BarKind::Mem64 {
                prefetchable: raw & 8 != 0,
            }
        } else {
            BarKind::Mem32
        };
        if size > 0 {
            out.push((i, size, kind));
        }
        i += if matches!(kind, BarKind::Mem64 { .. }) {
            2
        } else {
            1
        };
    }
    out
}

/// The emulated MSI capability and its one vector.
struct MsiBlock {
    cap: MsiCap,
    sink: Box<dyn MsiSink>,
    irqfd: EventFd,
    /// MSI is enabled in VFIO.
    live: bool,
}

/// Why an assigned function's PCI model could not be made.
#[derive(Debug, thiserror::Error)]
pub enum VfioPciError {
    /// Its configuration space reads as no device.
    #[error("{name}: configuration space unreadable")]
    Unreadable {
        /// The function.
        name: String,
    },
    /// A BAR the host function has cannot be emulated.
    #[error("{name}: BAR {index} ({size:#x} bytes): {source}")]
    Bar {
        /// The function.
        name: String,
        /// The BAR index.
        index: usize,
        /// Its size as emulated.
        size: u64,
        /// Why.
        source: PciConfigError,
    },
    /// No GSI was left for one of its interrupt vectors.
    #[error("{name}: no GSI for {what}")]
    NoGsi {
        /// The function.
        name: String,
        /// Which vector.
        what: &'static str,
    },
}

/// A VFIO-assigned PCI function.
pub struct VfioPciDevice {
    name: String,
    config: PciConfiguration,
    device: Arc<VfioDevice>,
    msix: Option<MsixBlock>,
    msi: Option<MsiBlock>,
    vm: Arc<VmFd>,
    /// BARs mapped into the guest through KVM slots.
    direct: Vec<DirectBar>,
    /// Guest writes of the command register pass through it, so a
    /// function stopped after a failed unmap keeps bus mastering off.
    gate: Arc<BusMasterGate>,
    /// Left the root complex: no KVM slot may map its BARs again (a
    /// guest config write still in flight must not bring one back).
    unplugged: bool,
}

impl VfioPciDevice {
    /// Wraps `device` (already reset); `vectors` back its MSI-X table;
    /// directly mapped BARs get their slots in `vm`.
    pub fn new(
        name: String,
        device: Arc<VfioDevice>,
        vm: Arc<VmFd>,
        mut vectors: impl FnMut() -> Option<(Box<dyn MsiSink>, EventFd)>,
    ) -> Result<Self, VfioPciError> {
        let mut cfg = vec![0u8; CONFIG_SIZE];
        device.region_read(VFIO_PCI_CONFIG_REGION_INDEX, &mut cfg, 0);
        let b = |o: usize| cfg.get(o).copied().unwrap_or(0);
        let w = |o: usize| u16::from_le_bytes([b(o), b(o + 1)]);
        let vendor_id = w(0);
        if vendor_id == 0xffff || vendor_id == 0 {
            return Err(VfioPciError::Unreadable { name });
        }
        let mut config = PciConfiguration::new(PciHeader {
            vendor_id,
            device_id: w(2),
            class: b(0x0b),
            subclass: b(0x0a),
            prog_if: b(0x09),
            revision: b(0x08),
            subsystem_vendor_id: w(0x2c),
            subsystem_id: w(0x2e),
            interrupt_pin: 0,
        });
        // A BAR index (0..6) is a region index; size 0 is "no BAR".
        let layout = bar_layout(&cfg, |i| {
            u32::try_from(i).map_or(0, |i| device.get_region_size(i))
        });
        for &(i, size, kind) in &layout {
            // A BAR smaller than the minimum decodes as the minimum.
            let size = size
                .next_power_of_two()
                .max(if kind.is_memory() { 16 } else { 4 });
            config
                .add_bar(i, size, kind)
                .map_err(|source| VfioPciError::Bar {
                    name: name.clone(),
                    index: i,
                    size,
                    source,
                })?;
        }
        let msix = match find_msix(&cfg) {
            Some(MsixLayout {
                cap,
                table: (tb, to),
                pba: (pb, po),
                vectors: n,
            }) => {
                let mut lines = Vec::with_capacity(n);
                for _ in 0..n {
                    lines.push(vectors().ok_or_else(|| VfioPciError::NoGsi {
                        name: name.clone(),
                        what: "MSI-X vector",
                    })?);
                }
                Some(MsixBlock::new(cap, (tb, to), (pb, po), lines))
            }
            None => None,
        };
        let msi = match MsiCap::find(&cfg) {
            Some(cap) => {
                let (sink, irqfd) = vectors().ok_or_else(|| VfioPciError::NoGsi {
                    name: name.clone(),
                    what: "the MSI vector",
                })?;
                Some(MsiBlock {
                    cap,
                    sink,
                    irqfd,
                    live: false,
                })
            }
            None => None,
        };
        let holds_msix = |bar: usize| {
            msix.as_ref()
                .is_some_and(|m| m.table_bar == bar || m.pba_bar == bar)
        };
        let direct: Vec<DirectBar> = layout
            .iter()
            .filter(|(i, _, kind)| kind.is_memory() && !holds_msix(*i))
            .filter_map(|&(i, _, _)| DirectBar::try_new(&device, i))
            .collect();
        info!(
            "vfio {name}: {vendor_id:04x}:{:04x} class {:02x}{:02x}, MSI-X vectors {}, MSI {}, BARs mapped into the guest: {:?}",
            w(2),
            b(0x0b),
            b(0x0a),
            msix.as_ref().map_or(0, MsixBlock::vectors),
            if msi.is_some() { "1 vector" } else { "no" },
            direct.iter().map(DirectBar::bar).collect::<Vec<_>>()
        );
        Ok(Self {
            name,
            config,
            device,
            msix,
            msi,
            vm,
            direct,
            gate: Arc::default(),
            unplugged: false,
        })
    }

    /// The gate the guest's command writes pass through; the host side
    /// that may stop the function (`super::host::VfioHost`) shares it.
    pub fn bus_master_gate(&self) -> Arc<BusMasterGate> {
        Arc::clone(&self.gate)
    }

    /// Puts each directly mapped BAR's slot where the guest's configuration
    /// says (absent while the BAR has no address or memory space is off,
    /// and for good once unplugged). Stops at the first slot KVM refuses.
    fn try_place_direct_bars(&mut self) -> Result<(), BarPlaceError> {
        for d in &mut self.direct {
            let want = self
                .config
                .bar(d.bar())
                .filter(|b| !self.unplugged && b.addr != 0 && self.config.bar_decodes(d.bar()))
                .map(|b| b.addr);
            d.place(&self.vm, want).map_err(|e| BarPlaceError {
                bar: d.bar(),
                addr: want.unwrap_or(0),
                source: Box::new(e),
            })?;
        }
        Ok(())
    }

    /// [`Self::try_place_direct_bars`] after a command write: a slot KVM
    /// refuses leaves that BAR trapped, which still reaches the device.
    fn place_direct_bars(&mut self) {
        if let Err(e) = self.try_place_direct_bars() {
            warn_limited!("vfio {}: {e}; the BAR stays trapped", self.name);
        }
    }

    fn device_config_read(&self, offset: u64, data: &mut [u8]) {
        self.device
            .region_read(VFIO_PCI_CONFIG_REGION_INDEX, data, offset);
    }

    fn device_config_write(&self, offset: u64, data: &[u8]) {
        self.device
            .region_write(VFIO_PCI_CONFIG_REGION_INDEX, data, offset);
    }

    /// The guest wrote the MSI-X control word: mask, unmask and enable
    /// follow in the emulation and in VFIO.
    fn set_msix_control(&mut self, control: u16) {
        if let Some(m) = self.msix.as_mut() {
            m.set_control(&self.name, &*self.device, control);
        }
    }

    /// Carries out what a guest write to the MSI capability asks: the
    /// vector's route follows the message, and MSI is switched on or off
    /// in VFIO (the device's interrupts then signal the vector's irqfd).
    fn apply_msi(&mut self, change: MsiChange) {
        let Some(m) = self.msi.as_mut() else {
            return;
        };
        let r: Result<(), MsiSwitchError> = match change {
            MsiChange::None => return,
            MsiChange::Reroute(msg) => m.sink.route(msg).map_err(Into::into),
            MsiChange::Enable(msg) => m
                .sink
                .route(msg)
                .map_err(MsiSwitchError::from)
                .and_then(|()| Ok(self.device.enable_msi(vec![&m.irqfd])?)),
            MsiChange::Disable => self.device.disable_msi().map_err(Into::into),
        };
        match r {
            Ok(()) => {
                m.live = m.cap.enabled();
                debug!("vfio {}: MSI {change:?}", self.name);
            }
            Err(e) => warn_limited!("vfio {}: MSI {change:?}: {e}", self.name),
        }
    }

    /// Which MSI-X structure a BAR access hits, if any.
    fn msix_target(&self, bar: usize, offset: u64) -> Option<MsixAccess> {
        self.msix.as_ref()?.target(bar, offset)
    }
}

impl PciDevice for VfioPciDevice {
    fn config(&self) -> &PciConfiguration {
        &self.config
    }

    /// The BARs mapped straight into the guest leave it now, while their
    /// ranges are still allocated (their mmaps stay until the drop).
    fn unplugged(&mut self) {
        self.unplugged = true;
        for d in &mut self.direct {
            if let Err(e) = d.place(&self.vm, None) {
                warn!("vfio: removing the slot of BAR {}: {e}", d.bar());
            }
        }
    }

    fn config_mut(&mut self) -> &mut PciConfiguration {
        &mut self.config
    }

    /// A moved BAR's slot follows it; KVM refusing the slot (an address
    /// over guest RAM, say) refuses the move.
    fn bars_moved(&mut self) -> Result<(), BarPlaceError> {
        self.try_place_direct_bars()
    }

    fn read_config_register(&mut self, reg: usize) -> u32 {
        if reg >= CONFIG_SIZE / 4 {
            return 0;
        }
        // The header is ours but for two fields; only those and the
        // capabilities are read from the device (a syscall each).
        let dev = || {
            let mut b = [0u8; 4];
            self.device_config_read(reg as u64 * 4, &mut b);
            u32::from_le_bytes(b)
        };
        match reg {
            // Status comes from the device (capability list, errors), the
            // command word from our copy.
            1 => (self.config.read_reg(1) & 0xffff) | (dev() & 0xffff_0000),
            // The capability pointer is the device's.
            13 => dev() & 0xff,
            r if r < HEADER_REGS => self.config.read_reg(r),
            r => {
                let dev = dev();
                if let Some(m) = self.msi.as_ref().filter(|m| m.cap.covers(r)) {
                    return m.cap.read(r, dev);
                }
                match &self.msix {
                    Some(m) if r == m.cap / 4 => {
                        let control = m.control((dev >> 16) as u16);
                        (dev & 0xffff) | (u32::from(control) << 16)
                    }
                    _ => dev,
                }
            }
        }
    }

    fn write_config_register(
        &mut self,
        reg: usize,
        offset: u64,
        data: &[u8],
    ) -> Option<BarReprogram> {
        if reg >= CONFIG_SIZE / 4 || usize_from_u64(offset) + data.len() > 4 {
            return None;
        }
        if reg < HEADER_REGS {
            let moved = self.config.write_reg(reg, offset, data);
            if reg == 1 && offset < 2 {
                // Memory/I-O decoding and bus mastering reach the device.
                let n = (2 - usize_from_u64(offset)).min(data.len());
                if let Some(cmd) = data.get(..n) {
                    let device = &self.device;
                    self.gate.write_command(offset, cmd, |cmd| {
                        device.region_write(VFIO_PCI_CONFIG_REGION_INDEX, cmd, 4 + offset)
                    });
                }
            }
            // The command word changed: the slots follow. A BAR move is
            // the root's to accept first (`bars_moved`).
            if moved.is_none() {
                self.place_direct_bars();
            }
            return moved;
        }
        if self.msi.as_ref().is_some_and(|m| m.cap.covers(reg)) {
            let mut dev = [0u8; 4];
            self.device_config_read(reg as u64 * 4, &mut dev);
            let dev = u32::from_le_bytes(dev);
            let change = self.msi.as_mut().map_or(MsiChange::None, |m| {
                m.cap.write(reg, usize_from_u64(offset), data, dev)
            });
            self.apply_msi(change);
            return None;
        }
        if let Some(cap) = self.msix.as_ref().map(|m| m.cap) {
            if reg == cap / 4 && offset + data.len() as u64 > 2 {
                // The control word (bytes 2..4 of the capability's dword).
                let cur = merge_write(self.read_config_register(reg), usize_from_u64(offset), data);
                self.set_msix_control((cur >> 16) as u16);
                return None;
            }
        }
        self.device_config_write(reg as u64 * 4 + offset, data);
        None
    }

    fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        match (self.msix_target(bar, offset), self.msix.as_mut()) {
            (Some(at), Some(m)) => m.read(at, data),
            _ => match u32::try_from(bar) {
                Ok(index) => self.device.region_read(index, data, offset),
                Err(_) => data.fill(0xff),
            },
        }
    }

    fn write_bar(&mut self, bar: usize, offset: u64, data: &[u8]) {
        match (self.msix_target(bar, offset), self.msix.as_mut()) {
            (Some(at), Some(m)) => m.write(at, data),
            _ => {
                if let Ok(index) = u32::try_from(bar) {
                    self.device.region_write(index, data, offset);
                }
            }
        }
    }
}

impl Drop for VfioPciDevice {
    fn drop(&mut self) {
        // Slots go before their mmaps, and the mmaps before the device
        // (a field dropped before `direct`): an mmap holds the device's
        // file open, and VFIO refuses to release the group's container
        // while it is (EBUSY when the function is hot-unplugged).
        for d in &mut self.direct {
            let _ = d.place(&self.vm, None);
        }
        self.direct.clear();
        if self.msix.as_ref().is_some_and(MsixBlock::live) {
            let _ = self.device.disable_msix();
        }
        if self.msi.as_ref().is_some_and(|m| m.live) {
            let _ = self.device.disable_msi();
        }
        // Leave the function quiet for its next user.
        self.device.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A type-0 header with a capability list: PM at 0x40 -> MSI-X at
    /// 0x50 (8 vectors, table in BAR 3 at 0, PBA in BAR 3 at 0x2000).
    fn image() -> Vec<u8> {
        let mut c = vec![0u8; 256];
        c[0..2].copy_from_slice(&0x8086u16.to_le_bytes());
        c[6] = u8::try_from(STATUS_CAP_LIST).unwrap();
        c[0x34] = 0x40;
        c[0x40] = 0x01;
        c[0x41] = 0x50;
        c[0x50] = MSIX_CAP_ID;
        c[0x51] = 0;
        c[0x52..0x54].copy_from_slice(&7u16.to_le_bytes());
        c[0x54..0x58].copy_from_slice(&3u32.to_le_bytes());
        c[0x58..0x5c].copy_from_slice(&(0x2000u32 | 3).to_le_bytes());
        // BAR0 mem32, BAR1 mem32, BAR2 I/O, BAR3 mem32.
        c[0x18..0x1c].copy_from_slice(&1u32.to_le_bytes());
        c
    }

    #[test]
    fn finds_msix_through_the_capability_list() {
        let c = image();
        assert_eq!(
            find_msix(&c),
            Some(MsixLayout {
                cap: 0x50,
                table: (3, 0),
                pba: (3, 0x2000),
                vectors: 8
            })
        );
        let mut no_list = c.clone();
        no_list[6] = 0;
        assert_eq!(find_msix(&no_list), None);
        // A list that loops on itself ends.
        let mut looping = c;
        looping[0x41] = 0x40;
        assert_eq!(find_msix(&looping), None);
    }

    #[test]
    fn bar_layout_skips_upper_halves_and_absent_bars() {
        let mut c = image();
        c[0x10..0x14].copy_from_slice(&0x4u32.to_le_bytes()); // BAR0 64-bit
        let sizes = [0x20000u64, 0, 0x20, 0x4000, 0, 0];
        let l = bar_layout(&c, |i| sizes[i]);
        assert_eq!(
            l,
            vec![
                (
                    0,
                    0x20000,
                    BarKind::Mem64 {
                        prefetchable: false
                    }
                ),
                (2, 0x20, BarKind::Io),
                (3, 0x4000, BarKind::Mem32),
            ]
        );
    }
}
