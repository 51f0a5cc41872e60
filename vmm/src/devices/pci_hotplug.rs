//! The PCI hotplug controller's registers: which slots gained a function
//! (`PCIU`), which the VMM asks the guest to give up (`PCID`), and the
//! guest's eject of a slot (`B0EJ`), as ACPI's PCI hotplug methods
//! (`acpi::pci_hotplug`) read and write them.
//!
//! WHY ACPI hotplug on the root bus: the platform has one PCI bus and no
//! PCIe root ports, so the guest's native PCIe hotplug has no slot
//! capability to use; Linux's `acpiphp` drives slots that the DSDT
//! describes with `_EJ0`, rescans one when notified "device check", and
//! ejects one when notified "eject request", calling `_EJ0` after it
//! released the function. That write of `B0EJ` is when the VMM may tear
//! the function down: the guest no longer touches it.
//!
//! Layout (I/O ports, 32-bit little endian, bit N = slot N):
//! - `PCIU` at +0: slots plugged since last read (read-to-clear);
//! - `PCID` at +4: slots to eject (read-to-clear);
//! - `B0EJ` at +8: written by `_EJ0` with the slot the guest ejected.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{SyncSender, TrySendError};
use std::sync::Arc;

use log::warn;

use super::bus::BusDevice;

/// First I/O port of the registers.
pub const PCI_HOTPLUG_PORT: u16 = 0x620;
/// Bytes of registers.
pub const PCI_HOTPLUG_LEN: u16 = 12;
/// Offset of `PCIU`.
pub const PCIU_OFFSET: u64 = 0;
/// Offset of `PCID`.
pub const PCID_OFFSET: u64 = 4;
/// Offset of `B0EJ`.
pub const B0EJ_OFFSET: u64 = 8;

/// Slots with pending up and down events, shared by the registers (the
/// guest's side) and the VMM's hotplug requests.
#[derive(Default)]
pub struct HotplugEvents {
    up: AtomicU32,
    down: AtomicU32,
}

impl HotplugEvents {
    /// Slot `slot` gained a function (the GED interrupt follows).
    pub fn plugged(&self, slot: u8) {
        if let Some(bit) = 1u32.checked_shl(u32::from(slot)) {
            self.up.fetch_or(bit, Ordering::SeqCst);
        }
    }

    /// The guest is asked to give up the function in `slot`.
    pub fn unplug_requested(&self, slot: u8) {
        if let Some(bit) = 1u32.checked_shl(u32::from(slot)) {
            self.down.fetch_or(bit, Ordering::SeqCst);
        }
    }
}

/// Ejects waiting for the hotplug thread. A guest writes `B0EJ` once
/// per slot it releases; one that writes it in a loop fills this and
/// its further ejects are dropped (the bound keeps its memory bounded).
pub const EJECT_QUEUE: usize = 32;

/// The registers on the port bus. An eject is sent to the VMM's hotplug
/// thread, never handled here: tearing a function down takes bus and
/// VFIO locks that a vCPU in the middle of an I/O exit must not wait on.
pub struct PciHotplugRegs {
    events: Arc<HotplugEvents>,
    ejected: SyncSender<u8>,
    /// Ejects dropped because the queue was full (logged once).
    dropped: u64,
}

impl PciHotplugRegs {
    /// Registers over `events`; ejected slots are sent on `ejected`
    /// (a channel of [`EJECT_QUEUE`] entries).
    pub fn new(events: Arc<HotplugEvents>, ejected: SyncSender<u8>) -> Self {
        Self {
            events,
            ejected,
            dropped: 0,
        }
    }
}

impl BusDevice for PciHotplugRegs {
    fn read(&mut self, _base: u64, offset: u64, data: &mut [u8]) {
        // Only whole, aligned registers: a partial read would clear bits
        // the guest never saw.
        let value = match (offset, data.len()) {
            (PCIU_OFFSET, 4) => self.events.up.swap(0, Ordering::SeqCst),
            (PCID_OFFSET, 4) => self.events.down.swap(0, Ordering::SeqCst),
            _ => 0,
        };
        for (d, s) in data.iter_mut().zip(value.to_le_bytes()) {
            *d = s;
        }
        for d in data.iter_mut().skip(4) {
            *d = 0;
        }
    }

    fn write(&mut self, _base: u64, offset: u64, data: &[u8]) {
        let (B0EJ_OFFSET, Ok(bytes)) = (offset, <[u8; 4]>::try_from(data)) else {
            return;
        };
        let slots = u32::from_le_bytes(bytes);
        for slot in (0..32u8).filter(|s| slots & (1 << s) != 0) {
            match self.ejected.try_send(slot) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    self.dropped += 1;
                    if self.dropped == 1 {
                        warn!("PCI hotplug: the guest ejects faster than they are served; dropped");
                    }
                }
                Err(TrySendError::Disconnected(_)) => {
                    warn!("PCI hotplug: slot {slot} ejected, but no hotplug thread listens");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn events_read_once_and_ejects_reach_the_thread() {
        let events = Arc::new(HotplugEvents::default());
        let (tx, rx) = mpsc::sync_channel(2);
        let mut regs = PciHotplugRegs::new(events.clone(), tx);
        let base = u64::from(PCI_HOTPLUG_PORT);
        let read = |regs: &mut PciHotplugRegs, off: u64| {
            let mut b = [0xffu8; 4];
            regs.read(base, off, &mut b);
            u32::from_le_bytes(b)
        };
        assert_eq!(read(&mut regs, PCIU_OFFSET), 0);
        events.plugged(3);
        events.plugged(24);
        events.unplug_requested(5);
        events.plugged(40); // out of range: ignored
                            // A byte read neither reports nor clears.
        let mut one = [0xffu8];
        regs.read(base, PCIU_OFFSET, &mut one);
        assert_eq!(one, [0]);
        assert_eq!(read(&mut regs, PCIU_OFFSET), (1 << 3) | (1 << 24));
        assert_eq!(read(&mut regs, PCIU_OFFSET), 0, "read-to-clear");
        assert_eq!(read(&mut regs, PCID_OFFSET), 1 << 5);
        assert_eq!(read(&mut regs, B0EJ_OFFSET), 0);
        regs.write(base, B0EJ_OFFSET, &((1u32 << 5) | (1 << 7)).to_le_bytes());
        regs.write(base, B0EJ_OFFSET, &[1, 0]); // not a whole register
        regs.write(base, PCIU_OFFSET, &1u32.to_le_bytes()); // read-only
        assert_eq!(rx.try_iter().collect::<Vec<_>>(), vec![5, 7]);
        // A guest that ejects in a loop fills the queue; the rest is dropped.
        for _ in 0..10 {
            regs.write(base, B0EJ_OFFSET, &(1u32 << 9).to_le_bytes());
        }
        assert_eq!(rx.try_iter().count(), 2);
        assert_eq!(regs.dropped, 8);
        drop(rx);
        regs.write(base, B0EJ_OFFSET, &1u32.to_le_bytes()); // no panic
    }
}
