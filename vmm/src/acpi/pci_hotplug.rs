//! DSDT objects of PCI hotplug on bus 0 (Linux's `acpiphp` drives them):
//! one device per slot with `_ADR`, `_SUN` and `_EJ0`, and, in the host
//! bridge's scope, the hotplug registers (`devices::pci_hotplug`) and the
//! method the Generic Event Device calls when they changed (`PSCN`).
//!
//! `PSCN` reads the read-to-clear `PCIU` and `PCID` registers and sends
//! each slot they name a "device check" (1: rescan the slot, a function
//! appeared) or an "eject request" (3: release the function, then call
//! `_EJ0`). `_EJ0` writes the slot's bit to `B0EJ`, which is when the VMM
//! tears the function down. Slots without a function read as empty in
//! configuration space, so no `_STA` is needed.

use acpi_tables::aml::{
    self, And, Arg, Device, Field, FieldAccessType, FieldEntry, FieldLockRule, FieldUpdateRule, If,
    Local, Method, MethodCall, Name, Notify, OpRegion, OpRegionSpace, Path, Scope, Store,
};
use acpi_tables::Aml;

use crate::devices::pci_hotplug::{PCI_HOTPLUG_LEN, PCI_HOTPLUG_PORT};
use crate::pci::root::NUM_SLOTS;

/// The host bridge, whose scope holds the slots and the registers.
const BRIDGE: &str = "\\_SB_.PCI0";
/// Path of the scan method the GED's `_EVT` calls.
pub const SCAN_METHOD: &str = "\\_SB_.PCI0.PSCN";
/// Notify value: re-enumerate the slot.
const DEVICE_CHECK: u8 = 1;
/// Notify value: the guest should release and eject the slot.
const EJECT_REQUEST: u8 = 3;

fn slot_path(slot: usize) -> String {
    format!("{BRIDGE}.S{slot:03}")
}

/// A device per hotpluggable slot (every slot but the host bridge's).
pub fn slot_devices() -> Vec<u8> {
    let mut out = Vec::new();
    // `sun` counts along with `slot`: the slot number as the u32 AML wants.
    for (slot, sun) in (1..NUM_SLOTS).zip(1u32..) {
        let adr = sun << 16;
        let bit = 1u32 << sun;
        let b0ej = Path::new(&format!("{BRIDGE}.B0EJ"));
        let eject = Store::new(&b0ej, &bit);
        let ej0 = Method::new("_EJ0".into(), 1, false, vec![&eject]);
        let adr_name = Name::new("_ADR".into(), &adr);
        let sun_name = Name::new("_SUN".into(), &sun);
        Device::new(
            Path::new(&slot_path(slot)),
            vec![&adr_name, &sun_name, &ej0],
        )
        .to_aml_bytes(&mut out);
    }
    out
}

/// The registers and the `DVNT`/`PSCN` methods, in the bridge's scope.
pub fn controller() -> Vec<u8> {
    let port = u64::from(PCI_HOTPLUG_PORT);
    let len = u64::from(PCI_HOTPLUG_LEN);
    let region = OpRegion::new("PCST".into(), OpRegionSpace::SystemIO, &port, &len);
    let field = Field::new(
        "PCST".into(),
        FieldAccessType::DWord,
        FieldLockRule::NoLock,
        FieldUpdateRule::WriteAsZeroes,
        vec![
            FieldEntry::Named(*b"PCIU", 32),
            FieldEntry::Named(*b"PCID", 32),
            FieldEntry::Named(*b"B0EJ", 32),
        ],
    );
    // DVNT (slots, event): Notify (Snnn, event) for every slot bit set.
    let zero = aml::ZERO;
    let slots = Arg(0);
    let event = Arg(1);
    let bits: Vec<u32> = (1..NUM_SLOTS).map(|s| 1u32 << s).collect();
    let paths: Vec<Path> = (1..NUM_SLOTS).map(|s| Path::new(&slot_path(s))).collect();
    let masks: Vec<And> = bits.iter().map(|b| And::new(&zero, &slots, b)).collect();
    let notifies: Vec<Notify> = paths.iter().map(|p| Notify::new(p, &event)).collect();
    let ifs: Vec<If> = masks
        .iter()
        .zip(&notifies)
        .map(|(m, n)| If::new(m, vec![n]))
        .collect();
    let dvnt = Method::new(
        "DVNT".into(),
        2,
        false,
        ifs.iter().map(|i| i as &dyn Aml).collect(),
    );
    // PSCN (): each register read once (they clear on read).
    let (up, down) = (Local(0), Local(1));
    let pciu = Path::new("PCIU");
    let pcid = Path::new("PCID");
    let read_up = Store::new(&up, &pciu);
    let read_down = Store::new(&down, &pcid);
    let check = DEVICE_CHECK;
    let eject = EJECT_REQUEST;
    let notify_up = MethodCall::new("DVNT".into(), vec![&up, &check]);
    let notify_down = MethodCall::new("DVNT".into(), vec![&down, &eject]);
    let pscn = Method::new(
        "PSCN".into(),
        0,
        true,
        vec![&read_up, &read_down, &notify_up, &notify_down],
    );
    let mut out = Vec::new();
    Scope::new(Path::new(BRIDGE), vec![&region, &field, &dvnt, &pscn]).to_aml_bytes(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acpi::test_util::contains;

    #[test]
    fn every_slot_but_the_bridge_is_ejectable() {
        let s = slot_devices();
        assert!(!contains(&s, b"S000"));
        for slot in 1..NUM_SLOTS {
            assert!(
                contains(&s, format!("S{slot:03}").as_bytes()),
                "slot {slot}"
            );
        }
        // Slot 5: _ADR 0x50000 (DWordConst), _EJ0 stores bit 5 to B0EJ.
        assert!(contains(&s, &[b'_', b'A', b'D', b'R', 0x0c, 0, 0, 5, 0]));
        let mut store = vec![0x70, 0x0a, 1 << 5];
        store.extend_from_slice(b"\\/\x03_SB_PCI0B0EJ");
        assert!(contains(&s, &store), "Store (0x20, B0EJ)");
        assert_eq!(s.windows(4).filter(|w| w == b"_EJ0").count(), NUM_SLOTS - 1);
    }

    #[test]
    fn controller_has_its_registers_and_methods() {
        let c = controller();
        // OperationRegion (PCST, SystemIO, 0x620, 12).
        let mut region = vec![0x5b, 0x80];
        region.extend_from_slice(b"PCST");
        region.push(0x01);
        region.push(0x0b);
        region.extend_from_slice(&PCI_HOTPLUG_PORT.to_le_bytes());
        region.extend_from_slice(&[0x0a, u8::try_from(PCI_HOTPLUG_LEN).unwrap()]);
        assert!(contains(&c, &region), "{c:02x?}");
        for name in [b"PCIU", b"PCID", b"B0EJ", b"DVNT", b"PSCN"] {
            assert!(contains(&c, name));
        }
        // DVNT (Local0, 1) and DVNT (Local1, 3).
        assert!(contains(&c, b"DVNT\x60\x01"));
        assert!(contains(&c, b"DVNT\x61\x0a\x03"));
        assert!(SCAN_METHOD.ends_with("PSCN"));
    }
}
