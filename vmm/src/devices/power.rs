//! ACPI sleep control/status and reset registers (HW-reduced ACPI), plus the
//! i8042 reset line that Linux tries when ACPI reset is unavailable.

use log::{debug, warn};

use super::bus::BusDevice;
use crate::exit::{ExitEvent, ExitSender};

/// Sleep control register (FADT SLEEP_CONTROL_REG).
pub const SLEEP_CONTROL_PORT: u16 = 0x600;
/// Sleep status register (FADT SLEEP_STATUS_REG).
pub const SLEEP_STATUS_PORT: u16 = 0x601;
/// Reset register (FADT RESET_REG).
pub const RESET_PORT: u16 = 0x602;
/// Value the guest writes to the reset register.
pub const RESET_VALUE: u8 = 0x1;
/// Sleep type value for S5 written to the sleep control register (the
/// DSDT's `_S5` package names it).
pub const S5_SLEEP_TYPE: u8 = 5;
/// First port of the power device.
pub const POWER_PORT_BASE: u16 = SLEEP_CONTROL_PORT;
/// Number of ports of the power device.
pub const POWER_PORT_COUNT: u16 = 3;

/// i8042 command port.
pub const I8042_COMMAND_PORT: u16 = 0x64;
const I8042_PULSE_RESET: u8 = 0xfe;

const SLP_EN: u8 = 1 << 5;

/// Decodes a sleep control write: Some(sleep type) when SLP_EN is set.
pub fn decode_sleep_control(value: u8) -> Option<u8> {
    (value & SLP_EN != 0).then_some((value >> 2) & 0x7)
}

/// The ACPI power management ports.
pub struct PowerDevice {
    exit: ExitSender,
}

impl PowerDevice {
    /// Creates the device; requests go to `exit`.
    pub fn new(exit: ExitSender) -> Self {
        Self { exit }
    }

    fn send(&self, event: ExitEvent) {
        if self.exit.send(event).is_err() {
            debug!("exit event after the VM loop ended");
        }
    }
}

impl BusDevice for PowerDevice {
    fn read(&mut self, _base: u64, _offset: u64, data: &mut [u8]) {
        // Sleep status never reports a wake event; reset reads as 0.
        data.fill(0);
    }

    fn write(&mut self, base: u64, offset: u64, data: &[u8]) {
        let Some(&value) = data.first() else {
            return;
        };
        match base + offset {
            p if p == u64::from(SLEEP_CONTROL_PORT) => match decode_sleep_control(value) {
                Some(S5_SLEEP_TYPE) => self.send(ExitEvent::PowerOff),
                Some(other) => warn!("guest asked for unsupported sleep type {other}"),
                None => {}
            },
            p if p == u64::from(RESET_PORT) && value == RESET_VALUE => self.send(ExitEvent::Reset),
            _ => {}
        }
    }
}

/// Just enough of an i8042 for the "pulse reset line" command.
pub struct I8042Reset {
    exit: ExitSender,
}

impl I8042Reset {
    /// Creates the device; resets go to `exit`.
    pub fn new(exit: ExitSender) -> Self {
        Self { exit }
    }
}

impl BusDevice for I8042Reset {
    fn read(&mut self, _base: u64, _offset: u64, data: &mut [u8]) {
        // Status: output buffer empty, input buffer empty.
        data.fill(0);
    }

    fn write(&mut self, _base: u64, _offset: u64, data: &[u8]) {
        if data.first() == Some(&I8042_PULSE_RESET) && self.exit.send(ExitEvent::Reset).is_err() {
            debug!("exit event after the VM loop ended");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn sleep_control_decoding() {
        assert_eq!(decode_sleep_control((5 << 2) | SLP_EN), Some(5));
        assert_eq!(decode_sleep_control(5 << 2), None);
        assert_eq!(decode_sleep_control((3 << 2) | SLP_EN), Some(3));
    }

    #[test]
    fn s5_powers_off_and_reset_resets() {
        let (tx, rx) = channel();
        let mut dev = PowerDevice::new(tx);
        let base = u64::from(POWER_PORT_BASE);
        dev.write(base, 0, &[(3 << 2) | SLP_EN]);
        assert!(rx.try_recv().is_err(), "S3 is ignored");
        dev.write(base, 0, &[(5 << 2) | SLP_EN]);
        assert_eq!(rx.try_recv().unwrap(), ExitEvent::PowerOff);
        dev.write(base, 2, &[0x7]);
        assert!(rx.try_recv().is_err(), "wrong reset value");
        dev.write(base, 2, &[RESET_VALUE]);
        assert_eq!(rx.try_recv().unwrap(), ExitEvent::Reset);
        let mut d = [0xffu8];
        dev.read(base, 1, &mut d);
        assert_eq!(d[0], 0);
    }

    #[test]
    fn i8042_pulse_resets() {
        let (tx, rx) = channel();
        let mut dev = I8042Reset::new(tx);
        dev.write(0x64, 0, &[0xd1]);
        assert!(rx.try_recv().is_err());
        dev.write(0x64, 0, &[0xfe]);
        assert_eq!(rx.try_recv().unwrap(), ExitEvent::Reset);
    }
}
