//! Fuzzes the configuration-space emulation of an assigned (VFIO)
//! function over a fake device: a hostile device's configuration image
//! (capability lists that loop, point outside, overlap; BARs of any
//! type), then a hostile guest's writes and reads of its MSI capability
//! and its MSI-X control word, table and PBA, with the host's MSI-X
//! switch failing on demand.
//!
//! Input: [256-byte device configuration image][ops of 8 bytes: kind,
//! a, b, len, value (4 bytes)]. Nothing here needs VFIO or KVM: the parts
//! that parse the device and emulate the guest's side are public, the
//! host's side is the `MsixSwitch` trait (faked here, as in
//! `vfio/msix_block_tests.rs`).
//!
//! Invariants beyond "no panic": a capability found is inside the image,
//! past the header, and has the id asked for; the MSI-X layout names a BAR
//! 0..=7, an 8-byte aligned offset and 1..=2048 vectors; the BAR layout
//! lists BARs in order, none inside a 64-bit BAR's upper half; MSI: the
//! address reads back dword aligned, Multiple Message Enable stays 0, the
//! 64-bit flag stays the device's, every change reported (enable,
//! disable, reroute) matches what the guest reads back, registers outside
//! the capability pass the device's value through; MSI-X: the control
//! word keeps the device's table size, VFIO is on exactly when the guest
//! enabled MSI-X (unless the switch failed), accesses map inside the
//! table or PBA, and no vector fires while masked.
#![no_main]

use std::cell::Cell;
use std::sync::{Arc, Mutex};

use libfuzzer_sys::fuzz_target;
use vfio_ioctls::VfioError;
use vmm::interrupt::{InterruptError, MsiMessage};
use vmm::pci::BarKind;
use vmm::vfio::device::{bar_layout, find_msix};
use vmm::vfio::msi::{find_capability, MsiCap, MsiChange, MSI_CAP_ID};
use vmm::vfio::msix_block::{MsixAccess, MsixBlock, MsixSwitch};
use vmm::virtio::msix::{MsiSink, MSIX_CAP_ID, MSIX_ENABLE, MSIX_FUNCTION_MASK};
use vmm_sys_util::eventfd::EventFd;

/// The host's MSI-X switch: fails while `fail` is set.
struct Switch {
    fail: Cell<bool>,
    on: Cell<bool>,
}

impl MsixSwitch for Switch {
    fn enable_msix(&self, _fds: Vec<&EventFd>) -> Result<(), VfioError> {
        if self.fail.get() {
            return Err(VfioError::VfioDeviceEnableIrq);
        }
        self.on.set(true);
        Ok(())
    }
    fn disable_msix(&self) -> Result<(), VfioError> {
        if self.fail.get() {
            return Err(VfioError::VfioDeviceDisableIrq);
        }
        self.on.set(false);
        Ok(())
    }
}

/// Vectors that fired.
type Fired = Arc<Mutex<Vec<usize>>>;

struct Sink(usize, Fired);

impl MsiSink for Sink {
    fn route(&mut self, _msg: MsiMessage) -> Result<(), InterruptError> {
        Ok(())
    }
    fn trigger(&self) {
        self.1.lock().unwrap().push(self.0);
    }
}

/// Vectors emulated at most (each costs an eventfd).
const MAX_VECTORS: usize = 64;

fn check_image(cfg: &[u8]) {
    for id in [MSI_CAP_ID, MSIX_CAP_ID, 0x09] {
        if let Some(at) = find_capability(cfg, id) {
            assert!(
                at >= 0x40 && at + 4 <= cfg.len(),
                "capability {id:#x} at {at:#x}"
            );
            assert_eq!(cfg[at], id);
        }
    }
    if let Some(l) = find_msix(cfg) {
        assert!(l.table.0 < 8 && l.pba.0 < 8);
        assert_eq!(l.table.1 % 8, 0);
        assert_eq!(l.pba.1 % 8, 0);
        assert!((1..=2048).contains(&l.vectors));
    }
    let bars = bar_layout(cfg, |i| if i % 2 == 0 { 0x1000 } else { 0 });
    let mut next = 0;
    for (i, size, kind) in bars {
        assert!(i >= next && i < 6, "BAR {i} out of order");
        assert_eq!(size, 0x1000);
        next = i + if matches!(kind, BarKind::Mem64 { .. }) {
            2
        } else {
            1
        };
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 256 {
        return;
    }
    let (image, ops) = data.split_at(256);
    let mut cfg = image.to_vec();
    // Most images should have a capability list to walk.
    cfg[6] |= 0x10;
    check_image(&cfg);
    let dev_reg = |reg: usize| -> u32 {
        let o = reg * 4;
        cfg.get(o..o + 4)
            .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let mut msi = MsiCap::find(&cfg);
    let dev_is64 = msi
        .as_ref()
        .map(|m| m.read(m_first(m), dev_reg(m_first(m))) & (1 << 23) != 0);
    let fired: Fired = Arc::default();
    let layout = find_msix(&cfg);
    let mut block = layout.map(|l| {
        let n = l.vectors.min(MAX_VECTORS);
        let lines = (0..n)
            .map(|v| {
                let sink: Box<dyn MsiSink> = Box::new(Sink(v, fired.clone()));
                (sink, EventFd::new(0).expect("eventfd"))
            })
            .collect();
        MsixBlock::new(l.cap, l.table, l.pba, lines)
    });
    let device_ctrl = layout.map_or(0, |l| u16::from_le_bytes([cfg[l.cap + 2], cfg[l.cap + 3]]));
    let switch = Switch {
        fail: Cell::new(false),
        on: Cell::new(false),
    };
    let (mut enabled, mut fmask) = (false, false);
    for op in ops.chunks_exact(8) {
        let value = u32::from_le_bytes([op[4], op[5], op[6], op[7]]);
        let len = [1usize, 2, 4, 8][usize::from(op[3] & 3)];
        match op[0] % 4 {
            // MSI capability writes and reads.
            0 => {
                let Some(m) = msi.as_mut() else { continue };
                let reg = m_first(m) + usize::from(op[1] % 6);
                let len = len.min(4);
                let offset = usize::from(op[2]) % (5 - len);
                let before = m.clone();
                let change = m.write(reg, offset, &value.to_le_bytes()[..len], dev_reg(reg));
                match change {
                    MsiChange::Enable(msg) => {
                        assert!(!before.enabled() && m.enabled());
                        assert_eq!(msg, m.message());
                    }
                    MsiChange::Disable => assert!(before.enabled() && !m.enabled()),
                    MsiChange::Reroute(msg) => {
                        assert!(before.enabled() && m.enabled());
                        assert_ne!(msg, before.message());
                        assert_eq!(msg, m.message());
                    }
                    MsiChange::None => {
                        assert_eq!(before.enabled(), m.enabled());
                        if m.enabled() {
                            assert_eq!(before.message(), m.message());
                        }
                    }
                }
                let first = m_first(m);
                let ctrl = m.read(first, dev_reg(first)) >> 16;
                assert_eq!(ctrl & (7 << 4), 0, "Multiple Message Enable set");
                assert_eq!(Some(ctrl & (1 << 7) != 0), dev_is64, "64-bit flag changed");
                assert_eq!(ctrl & 1 != 0, m.enabled());
                assert_eq!(m.read(first + 1, 0) & 3, 0, "MSI address not dword aligned");
                assert_eq!(
                    u64::from(m.read(first + 1, 0)),
                    m.message().addr & 0xffff_ffff
                );
                let outside = first + if m.covers(first + 3) { 4 } else { 3 };
                assert!(!m.covers(outside));
                assert_eq!(
                    m.read(outside, 0x1234_5678),
                    0x1234_5678,
                    "register outside MSI not passed through"
                );
            }
            // MSI-X control word.
            1 => {
                let Some(b) = block.as_mut() else { continue };
                switch.fail.set(op[1] & 1 != 0);
                let ctrl = (value as u16) | device_ctrl;
                b.set_control("fuzz", &switch, ctrl);
                enabled = ctrl & MSIX_ENABLE != 0;
                fmask = ctrl & MSIX_FUNCTION_MASK != 0;
                let c = b.control(device_ctrl);
                assert_eq!(c & 0x7ff, device_ctrl & 0x7ff, "table size changed");
                assert_eq!(c & MSIX_ENABLE != 0, enabled);
                assert_eq!(c & MSIX_FUNCTION_MASK != 0, fmask);
                assert_eq!(
                    b.live(),
                    switch.on.get(),
                    "VFIO state and emulation disagree"
                );
                if !switch.fail.get() {
                    assert_eq!(b.live(), enabled, "MSI-X in VFIO differs from the guest's");
                }
            }
            // BAR accesses around the table and PBA.
            2 => {
                let (Some(b), Some(l)) = (block.as_mut(), layout) else {
                    continue;
                };
                let (bar, base) = if op[1] & 1 == 0 { l.table } else { l.pba };
                let offset = base
                    .wrapping_add(u64::from(u16::from_le_bytes([op[2], op[4]])))
                    .wrapping_sub(8);
                let n = b.vectors() as u64;
                let Some(at) = b.target(bar, offset) else {
                    continue;
                };
                let mut buf = [0u8; 8];
                match at {
                    MsixAccess::Table(o) => {
                        assert!(o < n * 16, "table offset {o:#x} past {n} entries");
                        if op[1] & 2 != 0 {
                            b.write(MsixAccess::Table(o), &value.to_le_bytes()[..len.min(4)]);
                        } else {
                            b.read(MsixAccess::Table(o), &mut buf[..len]);
                        }
                    }
                    MsixAccess::Pba(o) => {
                        assert!(o < n.div_ceil(64) * 8, "PBA offset {o:#x} past {n} vectors");
                        b.write(MsixAccess::Pba(o), &value.to_le_bytes()[..len.min(4)]);
                        b.read(MsixAccess::Pba(o), &mut buf[..len]);
                    }
                }
            }
            // Nothing fires while masked: check every entry that fired.
            _ => {}
        }
        let fired_now = std::mem::take(&mut *fired.lock().unwrap());
        if let Some(b) = block.as_mut() {
            for v in fired_now {
                assert!(
                    enabled && !fmask,
                    "vector {v} fired with MSI-X off or masked"
                );
                let mut ctrl = [0u8; 4];
                b.read(MsixAccess::Table(v as u64 * 16 + 12), &mut ctrl);
                assert_eq!(ctrl[0] & 1, 0, "vector {v} fired while its entry is masked");
            }
        }
    }
});

/// The register holding the MSI capability's header.
fn m_first(m: &MsiCap) -> usize {
    (0..64).find(|r| m.covers(*r)).unwrap_or(0)
}
