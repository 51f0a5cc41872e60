//! DSDT objects of the power button: a `PNP0C0C` power button device and
//! the Generic Event Device (`ACPI0013`) that notifies it.
//!
//! The guest's GED driver requests the interrupt named in `_CRS` and, on
//! each edge, calls `_EVT` with the GSI. `_EVT` reads the read-to-clear
//! event register (`devices::ged`) and sends the power button device
//! notification 0x80 ("status changed", i.e. pressed) when its bit is set.
//! The FADT declares the power button a control-method device
//! (`PWR_BUTTON` flag), so this is the only power button the guest sees.

use acpi_tables::aml::{
    self, And, Device, EISAName, Equal, Field, FieldAccessType, FieldEntry, FieldLockRule,
    FieldUpdateRule, If, Interrupt, Local, Method, MethodCall, Name, Notify, OpRegion,
    OpRegionSpace, Path, ResourceTemplate, Store,
};
use acpi_tables::Aml;

use super::pci_hotplug::SCAN_METHOD;
use crate::devices::ged::{EVENT_PCI_HOTPLUG, EVENT_POWER_BUTTON, GED_IRQ, GED_PORT};

/// Path of the power button device.
pub const POWER_BUTTON_PATH: &str = "\\_SB_.PWRB";
/// Path of the Generic Event Device.
pub const GED_PATH: &str = "\\_SB_.GED_";
/// Notification value of a pressed button.
const NOTIFY_STATUS_CHANGE: u8 = 0x80;

/// The power button device.
pub fn power_button() -> Vec<u8> {
    let hid = EISAName::new("PNP0C0C");
    let zero = aml::ZERO;
    let names = [
        Name::new("_HID".into(), &hid),
        Name::new("_UID".into(), &zero),
    ];
    let children: Vec<&dyn Aml> = names.iter().map(|n| n as &dyn Aml).collect();
    let mut out = Vec::new();
    Device::new(Path::new(POWER_BUTTON_PATH), children).to_aml_bytes(&mut out);
    out
}

/// The Generic Event Device with its interrupt, event register and `_EVT`.
pub fn generic_event_device() -> Vec<u8> {
    let hid: &'static str = "ACPI0013";
    let zero = aml::ZERO;
    // Consumer, edge-triggered, active high, exclusive: an irqfd pulses it.
    let irq = Interrupt::new(true, true, false, false, GED_IRQ);
    let crs = ResourceTemplate::new(vec![&irq]);
    let port = u64::from(GED_PORT);
    let one = aml::ONE;
    let region = OpRegion::new("GDST".into(), OpRegionSpace::SystemIO, &port, &one);
    let field = Field::new(
        "GDST".into(),
        FieldAccessType::Byte,
        FieldLockRule::NoLock,
        FieldUpdateRule::WriteAsZeroes,
        vec![FieldEntry::Named(*b"GEVT", 8)],
    );
    // Local0 = GEVT; If ((Local0 & bit) == bit) { Notify (PWRB, 0x80) }
    let local0 = Local(0);
    let gevt = Path::new("GEVT");
    let read = Store::new(&local0, &gevt);
    let bit = EVENT_POWER_BUTTON;
    let masked = And::new(&zero, &local0, &bit);
    let pressed = Equal::new(&masked, &bit);
    let button = Path::new(POWER_BUTTON_PATH);
    let status = NOTIFY_STATUS_CHANGE;
    let notify = Notify::new(&button, &status);
    let on_press = If::new(&pressed, vec![&notify]);
    // If ((Local0 & hotplug) == hotplug) { \_SB_.PCI0.PSCN () }
    let hp_bit = EVENT_PCI_HOTPLUG;
    let hp_masked = And::new(&zero, &local0, &hp_bit);
    let hp_set = Equal::new(&hp_masked, &hp_bit);
    let scan = MethodCall::new(SCAN_METHOD.into(), vec![]);
    let on_hotplug = If::new(&hp_set, vec![&scan]);
    let evt = Method::new("_EVT".into(), 1, true, vec![&read, &on_press, &on_hotplug]);
    let hid_name = Name::new("_HID".into(), &hid);
    let uid = Name::new("_UID".into(), &zero);
    let crs_name = Name::new("_CRS".into(), &crs);
    let children: Vec<&dyn Aml> = vec![&hid_name, &uid, &crs_name, &region, &field, &evt];
    let mut out = Vec::new();
    Device::new(Path::new(GED_PATH), children).to_aml_bytes(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acpi::test_util::contains;

    #[test]
    fn power_button_is_pnp0c0c() {
        let b = power_button();
        assert!(contains(&b, b"PWRB"));
        // EISA id of PNP0C0C as a dword.
        assert!(contains(&b, &[0x41, 0xd0, 0x0c, 0x0c]));
    }

    #[test]
    fn ged_has_its_id_interrupt_register_and_event_method() {
        let g = generic_event_device();
        assert!(contains(&g, b"ACPI0013\0"), "_HID string");
        assert!(contains(&g, b"_EVT"));
        assert!(contains(&g, b"GEVT"));
        // Extended interrupt descriptor: consumer + edge, one GSI.
        let mut irq = vec![0x89, 6, 0, 0b0011, 1];
        irq.extend_from_slice(&GED_IRQ.to_le_bytes());
        assert!(contains(&g, &irq), "interrupt descriptor");
        // OperationRegion (GDST, SystemIO, GED_PORT, 1).
        let mut region = vec![0x5b, 0x80];
        region.extend_from_slice(b"GDST");
        region.push(0x01);
        region.extend_from_slice(&[0x0b]);
        region.extend_from_slice(&GED_PORT.to_le_bytes());
        region.push(0x01);
        assert!(contains(&g, &region), "operation region {g:02x?}");
        // Notify (\_SB_.PWRB, 0x80).
        assert!(contains(&g, &[0x86, b'\\', 0x2e, b'_', b'S', b'B', b'_']));
        assert!(contains(&g, &[b'P', b'W', b'R', b'B', 0x0a, 0x80]));
        // The hotplug bit calls \_SB_.PCI0.PSCN.
        assert!(contains(&g, b"\\/\x03_SB_PCI0PSCN"));
    }
}
