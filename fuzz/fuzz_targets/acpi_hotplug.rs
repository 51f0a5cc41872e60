//! Fuzzes the ACPI PCI hotplug registers (`PCIU`, `PCID`, `B0EJ` on the
//! I/O port bus) as a hostile guest reads and writes them, interleaved
//! with the VMM plugging functions, asking for their removal and its
//! hotplug thread serving (or not serving) ejects.
//!
//! Input: ops of 6 bytes: kind, offset, len, value (3 bytes, the fourth
//! repeats the first).
//!
//! Invariants beyond "no panic", against a model: a whole, aligned read of
//! `PCIU`/`PCID` returns every slot raised since the last such read, once
//! (read-to-clear), and nothing else does, nor clears anything; bytes
//! past a register read as zero; only a whole write of `B0EJ` ejects, each
//! slot it names once, in slot order, and never more than the eject
//! queue holds (the rest are dropped, so a guest cannot grow the VMM's
//! memory); slots past 31 raise nothing.
#![no_main]

use std::collections::VecDeque;
use std::sync::mpsc::sync_channel;
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use vmm::devices::bus::{Bus, BusDevice};
use vmm::devices::pci_hotplug::{
    HotplugEvents, PciHotplugRegs, B0EJ_OFFSET, EJECT_QUEUE, PCID_OFFSET, PCIU_OFFSET,
    PCI_HOTPLUG_LEN, PCI_HOTPLUG_PORT,
};

fuzz_target!(|data: &[u8]| {
    let events = Arc::new(HotplugEvents::default());
    let (tx, rx) = sync_channel(EJECT_QUEUE);
    let regs = Arc::new(std::sync::Mutex::new(PciHotplugRegs::new(
        events.clone(),
        tx,
    )));
    let bus = Bus::new();
    let base = u64::from(PCI_HOTPLUG_PORT);
    let dev: Arc<std::sync::Mutex<dyn BusDevice>> = regs;
    bus.insert(base, u64::from(PCI_HOTPLUG_LEN), dev)
        .expect("insert");
    let (mut up, mut down) = (0u32, 0u32);
    let mut queue: VecDeque<u8> = VecDeque::new();
    for op in data.chunks_exact(6) {
        let value = u32::from_le_bytes([op[3], op[4], op[5], op[3]]);
        let len = [1usize, 2, 4, 8][usize::from(op[2] & 3)];
        let offset = u64::from(op[1]) % u64::from(PCI_HOTPLUG_LEN + 2);
        match op[0] % 6 {
            0 => {
                let slot = op[1] % 40;
                events.plugged(slot);
                if slot < 32 {
                    up |= 1 << slot;
                }
            }
            1 => {
                let slot = op[1] % 40;
                events.unplug_requested(slot);
                if slot < 32 {
                    down |= 1 << slot;
                }
            }
            2 | 3 => {
                let mut got = [0xaau8; 8];
                let hit = bus.read(base + offset, &mut got[..len]);
                let inside = offset + len as u64 <= u64::from(PCI_HOTPLUG_LEN);
                assert_eq!(hit, inside, "bus answered {hit} at {offset:#x}+{len}");
                if !hit {
                    continue;
                }
                let want = match (offset, len) {
                    (PCIU_OFFSET, 4) => std::mem::take(&mut up),
                    (PCID_OFFSET, 4) => std::mem::take(&mut down),
                    _ => 0,
                };
                let mut w = [0u8; 8];
                w[..4].copy_from_slice(&want.to_le_bytes());
                assert_eq!(got[..len], w[..len], "read at {offset:#x}+{len}");
            }
            4 => {
                let bytes = value.to_le_bytes();
                let mut b = [0u8; 8];
                b[..4].copy_from_slice(&bytes);
                b[4..].copy_from_slice(&bytes);
                if !bus.write(base + offset, &b[..len]) {
                    continue;
                }
                if offset == B0EJ_OFFSET && len == 4 {
                    for slot in 0..32u8 {
                        if value & (1 << slot) != 0 && queue.len() < EJECT_QUEUE {
                            queue.push_back(slot);
                        }
                    }
                }
            }
            // The hotplug thread serves up to `op[1]` ejects.
            _ => {
                for _ in 0..op[1] % 8 {
                    let got = rx.try_recv().ok();
                    assert_eq!(got, queue.pop_front(), "ejects differ from the model");
                }
            }
        }
    }
    while let Some(want) = queue.pop_front() {
        assert_eq!(rx.try_recv().ok(), Some(want), "eject lost");
    }
    assert!(rx.try_recv().is_err(), "an eject the guest never wrote");
});
