//! The power button (`vm.power-button`): a one-byte event register behind
//! an ACPI Generic Event Device and an edge interrupt.
//!
//! WHY a GED: the platform is HW-reduced ACPI, which has no fixed-feature
//! power button and no GPE blocks to signal one. The DSDT instead
//! describes a Generic Event Device (`ACPI0013`, see `acpi::ged`) whose
//! interrupt is [`GED_IRQ`]; its `_EVT` method reads [`GED_PORT`] and, when
//! the power-button bit is set, notifies the `PNP0C0C` device. Linux's
//! `button` driver turns that notification into a `KEY_POWER` input event,
//! which userspace (logind, acpid, or a test guest's script) answers with
//! an orderly power-off.
//!
//! The register is read-to-clear, so an event raised twice before the
//! guest looked is reported once, and a read with nothing pending is 0.

use std::io;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use super::bus::BusDevice;

/// The event register's I/O port (next to the ACPI power ports at 0x600).
pub const GED_PORT: u16 = 0x610;
/// The GED's interrupt: IOAPIC pin 5, edge-triggered, unused otherwise.
pub const GED_IRQ: u32 = 5;
/// Event bit: the power button was pressed.
pub const EVENT_POWER_BUTTON: u8 = 1 << 0;
/// Event bit: PCI slots changed (`devices::pci_hotplug` says which).
pub const EVENT_PCI_HOTPLUG: u8 = 1 << 1;

/// The guest's side: the event register on the port bus.
pub struct GedDevice {
    pending: Arc<AtomicU8>,
}

/// The VMM's side: raises events (from the API thread).
#[derive(Clone)]
pub struct GedTrigger {
    pending: Arc<AtomicU8>,
    irq: Arc<EventFd>,
}

/// A connected device and trigger; `irq` is an eventfd registered as the
/// irqfd of [`GED_IRQ`].
pub fn ged(irq: EventFd) -> (GedDevice, GedTrigger) {
    let pending = Arc::new(AtomicU8::new(0));
    (
        GedDevice {
            pending: pending.clone(),
        },
        GedTrigger {
            pending,
            irq: Arc::new(irq),
        },
    )
}

impl GedTrigger {
    /// Presses the power button: sets its bit, then raises the interrupt
    /// (in that order, so the guest's `_EVT` finds the bit). While the VM
    /// is paused the interrupt waits in KVM's IOAPIC for the vCPUs.
    pub fn power_button(&self) -> io::Result<()> {
        self.raise(EVENT_POWER_BUTTON)
    }

    /// Tells the guest that PCI slots changed (after the hotplug registers
    /// were updated).
    pub fn pci_hotplug(&self) -> io::Result<()> {
        self.raise(EVENT_PCI_HOTPLUG)
    }

    fn raise(&self, event: u8) -> io::Result<()> {
        self.pending.fetch_or(event, Ordering::SeqCst);
        self.irq.write(1)
    }
}

impl BusDevice for GedDevice {
    fn read(&mut self, _base: u64, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset == 0 {
            if let Some(b) = data.first_mut() {
                *b = self.pending.swap(0, Ordering::SeqCst);
            }
        }
    }

    fn write(&mut self, _base: u64, _offset: u64, _data: &[u8]) {
        // Read-only: writes are ignored.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn press_sets_the_bit_raises_the_irq_and_a_read_clears_it() {
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let probe = irq.try_clone().unwrap();
        let (mut dev, trigger) = ged(irq);
        let base = u64::from(GED_PORT);
        let mut b = [0xffu8];
        dev.read(base, 0, &mut b);
        assert_eq!(b[0], 0, "nothing pending");
        assert!(probe.read().is_err(), "no interrupt yet");
        trigger.power_button().unwrap();
        trigger.power_button().unwrap();
        assert_eq!(probe.read().unwrap(), 2);
        dev.write(base, 0, &[0]);
        dev.read(base, 0, &mut b);
        assert_eq!(b[0], EVENT_POWER_BUTTON);
        dev.read(base, 0, &mut b);
        assert_eq!(b[0], 0, "read-to-clear");
        // Wider or offset reads never panic and never clear.
        trigger.power_button().unwrap();
        let mut wide = [0xffu8; 4];
        dev.read(base, 1, &mut wide);
        assert_eq!(wide, [0; 4]);
        dev.read(base, 0, &mut wide);
        assert_eq!(wide, [EVENT_POWER_BUTTON, 0, 0, 0]);
        dev.read(base, 0, &mut []);
        // Both events in one read: _EVT handles each bit it finds.
        let other = trigger.clone();
        trigger.power_button().unwrap();
        other.pci_hotplug().unwrap();
        dev.read(base, 0, &mut b);
        assert_eq!(b[0], EVENT_POWER_BUTTON | EVENT_PCI_HOTPLUG);
    }
}
