//! Guest BAR moves through the root complex: all or nothing (issue 28).

use std::sync::{Arc, Mutex};

use super::tests::{at, root, test_device, TestDevice};
use super::{identity, Bus, SharedPciDevice};
use crate::pci::PciDevice;

#[test]
fn guest_bar_move_relocates_bus_range() {
    let (root, mmio, _) = root();
    let addr = root.add_device(test_device()).unwrap();
    root.config_write(addr, 4, 0, &0xd000_0000u32.to_le_bytes());
    let mut b = [0u8; 1];
    assert!(!mmio.read(0xc000_0000, &mut b));
    assert!(mmio.read(0xd000_0000, &mut b));
}

/// Which device a write at `at` of the MMIO bus reaches, if any.
fn owner_of(mmio: &Bus, at: u64, devs: &[&Arc<Mutex<TestDevice>>]) -> Option<usize> {
    for d in devs {
        d.lock().unwrap().last_write = None;
    }
    if !mmio.write(at, &[0x5a]) {
        return None;
    }
    devs.iter()
        .position(|d| d.lock().unwrap().last_write.is_some())
}

/// Issue 28: a BAR move the root cannot honour leaves the BAR at its
/// old address in the configuration space, on the bus and in the
/// function's KVM slot; an accepted one moves all three, and the
/// windows' bookkeeping with them.
#[test]
fn bar_move_refused_consistently() {
    let (root, mmio, pio) = root();
    let first = test_device();
    let second = test_device();
    root.add_device(first.clone()).unwrap();
    let addr = root.add_device(second.clone()).unwrap();
    let own = u64::from(root.config_read(addr, 4));
    assert_eq!(own, 0xc000_1000);
    second.lock().unwrap().direct = Some(own);
    second.lock().unwrap().refuse = Some(0xd000_0000);
    let devs = [&first, &second];
    let stays = |what: &str| {
        assert_eq!(u64::from(root.config_read(addr, 4)), own, "{what}: config");
        assert_eq!(owner_of(&mmio, own, &devs), Some(1), "{what}: bus");
        assert_eq!(second.lock().unwrap().direct, Some(own), "{what}: slot");
    };
    let write = |to: u32| root.config_write(addr, 4, 0, &to.to_le_bytes());

    // Onto the first device's BAR.
    write(0xc000_0000);
    stays("overlap");
    assert_eq!(owner_of(&mmio, 0xc000_0000, &devs), Some(0));
    // Outside the 32-bit window, where the bus has nothing.
    write(0x8000_0000);
    stays("outside the window");
    assert_eq!(owner_of(&mmio, 0x8000_0000, &devs), None);
    // Where the function's slot cannot go.
    write(0xd000_0000);
    stays("slot refused");
    assert_eq!(owner_of(&mmio, 0xd000_0000, &devs), None);
    // An I/O BAR outside the I/O window.
    root.config_write(addr, 8, 0, &0x10u32.to_le_bytes());
    assert_eq!(root.config_read(addr, 8), 0x1041);
    let mut b = [0u8; 1];
    assert!(pio.read(0x1040, &mut b) && !pio.read(0x10, &mut b));

    // The refused ranges were not kept: the first device may move
    // where the second's slot could not go.
    root.config_write(at(1), 4, 0, &0xd000_0000u32.to_le_bytes());
    assert_eq!(root.config_read(at(1), 4), 0xd000_0000);
    assert_eq!(owner_of(&mmio, 0xd000_0000, &devs), Some(0));
    assert_eq!(owner_of(&mmio, 0xc000_0000, &devs), None);

    // Accepted: config, bus and slot move together.
    write(0xd010_0000);
    assert_eq!(root.config_read(addr, 4), 0xd010_0000);
    assert_eq!(owner_of(&mmio, 0xd010_0000, &devs), Some(1));
    assert_eq!(owner_of(&mmio, own, &devs), None);
    assert_eq!(second.lock().unwrap().direct, Some(0xd010_0000));
    // And the ranges left behind go to the next function plugged.
    let third = root.add_device(test_device()).unwrap();
    assert_eq!(root.config_read(third, 4), 0xc000_0000);
    // The moved BARs' ranges are taken: nothing else may move there.
    root.config_write(third, 4, 0, &0xd010_0000u32.to_le_bytes());
    assert_eq!(root.config_read(third, 4), 0xc000_0000);
}

/// A config write that reached a function just before it was ejected
/// does not move the BAR of the function plugged into its slot next.
#[test]
fn a_late_bar_move_of_an_ejected_function_moves_nothing() {
    let (root, mmio, _) = root();
    let gone = test_device();
    let addr = root.add_device(gone.clone()).unwrap();
    drop(root.remove_device(addr).unwrap());
    let next = test_device();
    assert_eq!(root.add_device(next.clone()).unwrap(), addr);
    // The write, dispatched to the ejected function before removal,
    // lands now (what `config_write` does after `device_at`).
    let mut guard = gone.lock().unwrap();
    let m = guard
        .write_config_register(4, 0, &0xd000_0000u32.to_le_bytes())
        .unwrap();
    let who = (
        usize::from(addr.device),
        identity(&(gone.clone() as SharedPciDevice)),
    );
    assert!(root.move_bar(who, &mut *guard, m).is_err());
    drop(guard);
    let mut b = [0u8; 1];
    assert!(mmio.read(0xc000_0000, &mut b), "the next one stays");
    assert!(!mmio.read(0xd000_0000, &mut b));
    // And the function plugged there moves its own BAR.
    root.config_write(addr, 4, 0, &0xd000_0000u32.to_le_bytes());
    assert!(mmio.read(0xd000_0000, &mut b));
}

/// A 64-bit BAR moved one half at a time with memory decoding off
/// (as Linux does) lands where the guest meant even if the address
/// between the two writes is refused; a half-written BAR left so when
/// decoding comes back on reads where it decodes.
#[test]
fn a_64_bit_bar_moves_one_half_at_a_time() {
    let (root, mmio, _) = root();
    let first = test_device();
    let second = test_device();
    root.add_device(first).unwrap();
    let addr = root.add_device(second.clone()).unwrap();
    // The first device's 64-bit BAR is at 0x1_0000_0000, the
    // second's at 0x1_0000_4000; the second goes to 0x2_0000_0000.
    assert_eq!(root.config_read(addr, 6), 0x4004);
    root.config_write(addr, 1, 0, &[0x1, 0]);
    root.config_write(addr, 6, 0, &0x4u32.to_le_bytes());
    // In between: 0x1_0000_0000, the first device's. Parked.
    assert_eq!(root.config_read(addr, 6), 0x4);
    root.config_write(addr, 7, 0, &2u32.to_le_bytes());
    root.config_write(addr, 1, 0, &[0x3, 0]);
    assert_eq!(root.config_read(addr, 6), 0x4);
    assert_eq!(root.config_read(addr, 7), 2);
    let mut b = [0u8; 1];
    assert!(mmio.read(0x2_0000_0000, &mut b));
    assert!(!mmio.read(0x1_0000_4000, &mut b));
    assert!(mmio.read(0x1_0000_0000, &mut b), "the first stays");

    // Half written onto the first device's BAR, then decoding on:
    // the registers go back to where the BAR decodes.
    root.config_write(addr, 1, 0, &[0x1, 0]);
    root.config_write(addr, 7, 0, &1u32.to_le_bytes());
    assert_eq!(root.config_read(addr, 7), 1);
    root.config_write(addr, 1, 0, &[0x3, 0]);
    assert_eq!(root.config_read(addr, 6), 0x4);
    assert_eq!(root.config_read(addr, 7), 2);
    assert!(mmio.read(0x2_0000_0000, &mut b));
    // A size probe with decoding on still reads the size.
    root.config_write(addr, 6, 0, &[0xff; 4]);
    assert_eq!(root.config_read(addr, 6), 0xffff_c004);
    root.config_write(addr, 6, 0, &0x4u32.to_le_bytes());
    assert_eq!(root.config_read(addr, 6), 0x4);
}

/// Issue 28: after a refused move, ejecting the function leaves no
/// range on the bus holding it (its VFIO fd and container would stay
/// open), and its ranges go back to the window once.
#[test]
fn eject_after_a_refused_move_releases_the_function() {
    let (root, mmio, _) = root();
    let dev = test_device();
    let addr = root.add_device(dev.clone()).unwrap();
    root.config_write(addr, 4, 0, &0x8000_0000u32.to_le_bytes());
    let removed = root.remove_device(addr).unwrap();
    let mut b = [0u8; 1];
    assert!(!mmio.read(0xc000_0000, &mut b));
    assert!(!mmio.read(0x8000_0000, &mut b));
    drop(removed);
    assert_eq!(Arc::strong_count(&dev), 1, "a bus range still holds it");
    let again = root.add_device(test_device()).unwrap();
    assert_eq!(root.config_read(again, 4), 0xc000_0000);
    let next = root.add_device(test_device()).unwrap();
    assert_eq!(root.config_read(next, 4), 0xc000_1000);
}

/// A move onto another function's BAR is refused without giving any of
/// that BAR's range back to the window: the next function plugged gets
/// a range of its own. A smaller BAR moved onto a larger one once split
/// the larger's range in the window's allocator and the refusal freed it
/// all (found by the `pci_config` fuzz target).
#[test]
fn a_refused_move_onto_a_taken_range_frees_none_of_it() {
    let (root, mmio, _) = root();
    let first = test_device();
    let second = test_device();
    second
        .lock()
        .unwrap()
        .config_mut()
        .add_bar(1, 0x10, crate::pci::BarKind::Mem32)
        .unwrap();
    root.add_device(first.clone()).unwrap();
    let addr = root.add_device(second.clone()).unwrap();
    let small = root.config_read(addr, 5);
    // The 16-byte BAR onto the first function's 4 KiB BAR 0.
    root.config_write(addr, 5, 0, &0xc000_0000u32.to_le_bytes());
    assert_eq!(root.config_read(addr, 5), small, "the move is refused");
    let third_dev = test_device();
    let third = root
        .add_device(third_dev.clone())
        .expect("the window still has room: nothing of the first BAR was freed");
    let bar = u64::from(root.config_read(third, 4));
    assert!(
        bar >= 0xc000_2000,
        "third BAR at {bar:#x}, inside a taken range"
    );
    let devs = [&first, &second, &third_dev];
    assert_eq!(owner_of(&mmio, 0xc000_0000, &devs), Some(0));
    assert_eq!(owner_of(&mmio, bar, &devs), Some(2));
}
