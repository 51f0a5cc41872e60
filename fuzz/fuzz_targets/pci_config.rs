//! Fuzzes PCI configuration space as a hostile guest drives it through the
//! root complex: writes and reads of 1, 2 and 4 bytes at any register,
//! BAR sizing probes, BAR moves (64-bit ones half by half) into free,
//! taken and out-of-window ranges, moves a function refuses, memory and
//! I/O decoding switched on and off, hot-unplug and replug.
//!
//! Input: [bar layout byte][ops of 8 bytes: kind, slot, reg, offset/len,
//! value (4 bytes)]. Two fake functions, each with a 32-bit memory BAR,
//! an I/O BAR and a 64-bit memory BAR whose sizes the layout byte picks.
//!
//! Invariants beyond "no panic": identity registers (ids, class,
//! subsystem, capability pointer) never change; a BAR register keeps its
//! type bits and reads back its size mask after an all-ones probe; every
//! BAR address is aligned to its size and lies in the window of its kind;
//! the buses agree with configuration space: an access reaching a
//! function's BAR arrives at the offset configuration space says, a
//! decoding BAR answers at its address, and a removed function is
//! reached by nothing.
#![no_main]

use std::sync::{Arc, Mutex};

use libfuzzer_sys::fuzz_target;
use vmm::devices::bus::Bus;
use vmm::pci::{
    Bar, BarKind, BarPlaceError, PciAddress, PciConfiguration, PciDevice, PciHeader, PciRoot,
    PciWindows, SharedPciDevice,
};

const WINDOWS: PciWindows = PciWindows {
    io: (0x1000, 0x1000),
    mmio32: (0xc000_0000, 0x10_0000),
    mmio64: (0x10_0000_0000, 0x1000_0000),
};
/// Identity registers: vendor/device, class, subsystem, capability pointer.
const IDENTITY: [usize; 4] = [0, 2, 11, 13];

/// The last BAR access that reached a function: (function, BAR, offset).
type Seen = Arc<Mutex<Option<(usize, usize, u64)>>>;

struct Fake {
    id: usize,
    config: PciConfiguration,
    seen: Seen,
    /// Refuse the next `bars_moved` (as a KVM slot that cannot be placed).
    refuse: Arc<Mutex<bool>>,
}

#[derive(Debug)]
struct Refused;

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("refused by the fuzzer")
    }
}

impl std::error::Error for Refused {}

impl PciDevice for Fake {
    fn config(&self) -> &PciConfiguration {
        &self.config
    }
    fn config_mut(&mut self) -> &mut PciConfiguration {
        &mut self.config
    }
    fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        *self.seen.lock().unwrap() = Some((self.id, bar, offset));
        data.fill(0);
    }
    fn write_bar(&mut self, bar: usize, offset: u64, _data: &[u8]) {
        *self.seen.lock().unwrap() = Some((self.id, bar, offset));
    }
    fn bars_moved(&mut self) -> Result<(), BarPlaceError> {
        let mut r = self.refuse.lock().unwrap();
        if *r {
            *r = false;
            return Err(BarPlaceError {
                bar: 0,
                addr: 0,
                source: Box::new(Refused),
            });
        }
        Ok(())
    }
}

struct Function {
    dev: SharedPciDevice,
    addr: Option<PciAddress>,
    identity: [u32; 4],
    refuse: Arc<Mutex<bool>>,
}

fn config_of(dev: &SharedPciDevice) -> PciConfiguration {
    dev.lock().unwrap().config().clone()
}

fn window_holds(kind: BarKind, bar: &Bar) -> bool {
    let inside =
        |(start, size): (u64, u64)| bar.addr >= start && bar.addr + bar.size <= start + size;
    match kind {
        BarKind::Io => inside(WINDOWS.io),
        BarKind::Mem32 => inside(WINDOWS.mmio32),
        BarKind::Mem64 { .. } => inside(WINDOWS.mmio32) || inside(WINDOWS.mmio64),
    }
}

fn flag_bits(kind: BarKind) -> u32 {
    match kind {
        BarKind::Io => 0x1,
        BarKind::Mem32 => 0,
        BarKind::Mem64 { prefetchable } => 0x4 | if prefetchable { 0x8 } else { 0 },
    }
}

struct World {
    root: PciRoot,
    mmio: Arc<Bus>,
    pio: Arc<Bus>,
    seen: Seen,
    funcs: Vec<Function>,
    /// Every address a BAR ever had: probed after each step.
    history: Vec<(bool, u64)>,
}

impl World {
    /// Reads one byte at `addr` of a bus; returns who answered.
    fn probe(&self, memory: bool, addr: u64) -> Option<(usize, usize, u64)> {
        *self.seen.lock().unwrap() = None;
        let bus = if memory { &self.mmio } else { &self.pio };
        let mut b = [0u8; 1];
        bus.read(addr, &mut b);
        self.seen.lock().unwrap().take()
    }

    fn check(&mut self) {
        for f in &self.funcs {
            let cfg = config_of(&f.dev);
            for (i, reg) in IDENTITY.iter().enumerate() {
                assert_eq!(
                    cfg.read_reg(*reg),
                    f.identity[i],
                    "identity register {reg} changed"
                );
            }
            if f.addr.is_none() {
                continue;
            }
            for (i, bar) in cfg.bars() {
                assert_eq!(
                    bar.addr % bar.size,
                    0,
                    "BAR {i} at {:#x} unaligned",
                    bar.addr
                );
                assert!(
                    window_holds(bar.kind, &bar),
                    "BAR {i} at {:#x} outside its window",
                    bar.addr
                );
                let reg = cfg.read_reg(4 + i);
                assert_eq!(
                    reg & if bar.kind.is_memory() { 0xf } else { 0x3 },
                    flag_bits(bar.kind)
                );
                if !self.history.contains(&(bar.kind.is_memory(), bar.addr)) {
                    self.history.push((bar.kind.is_memory(), bar.addr));
                }
                if cfg.bar_decodes(i) {
                    for off in [0, bar.size - 1] {
                        let got = self.probe(bar.kind.is_memory(), bar.addr + off);
                        assert_eq!(
                            got.map(|g| (g.1, g.2)),
                            Some((i, off)),
                            "BAR {i} at {:#x}+{off:#x} not decoded there",
                            bar.addr
                        );
                    }
                }
            }
        }
        // Whatever answers anywhere a BAR ever was must be where its
        // configuration space puts it now.
        let history = self.history.clone();
        for (memory, addr) in history {
            let Some((id, bar, off)) = self.probe(memory, addr) else {
                continue;
            };
            let f = &self.funcs[id];
            assert!(
                f.addr.is_some(),
                "unplugged function {id} reached at {addr:#x}"
            );
            let b = config_of(&f.dev)
                .bar(bar)
                .expect("reached a BAR that does not exist");
            assert_eq!(
                b.addr + off,
                addr,
                "bus and configuration space disagree on BAR {bar}"
            );
        }
    }
}

fn make(id: usize, layout: u8, seen: &Seen) -> Function {
    let header = PciHeader {
        vendor_id: 0x1234,
        device_id: 0x10 + id as u16,
        class: 2,
        subclass: 0,
        prog_if: 0,
        revision: 1,
        subsystem_vendor_id: 0x1af4,
        subsystem_id: 0x42,
        interrupt_pin: 0,
    };
    let mut config = PciConfiguration::new(header);
    let m32 = 1u64 << (4 + (layout & 7));
    let io = 1u64 << (2 + ((layout >> 3) & 3));
    let m64 = 1u64 << (12 + ((layout >> 5) & 7));
    config.add_bar(0, m32, BarKind::Mem32).expect("bar 0");
    config.add_bar(1, io, BarKind::Io).expect("bar 1");
    config
        .add_bar(
            2,
            m64,
            BarKind::Mem64 {
                prefetchable: id == 1,
            },
        )
        .expect("bar 2");
    config
        .add_capability(0x09, &[4, 1, 2, 3, 4, 5])
        .expect("cap");
    let identity = IDENTITY.map(|r| config.read_reg(r));
    let refuse = Arc::new(Mutex::new(false));
    let dev: SharedPciDevice = Arc::new(Mutex::new(Fake {
        id,
        config,
        seen: seen.clone(),
        refuse: refuse.clone(),
    }));
    Function {
        dev,
        addr: None,
        identity,
        refuse,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&layout, ops)) = data.split_first() else {
        return;
    };
    let mmio = Arc::new(Bus::new());
    let pio = Arc::new(Bus::new());
    let seen: Seen = Arc::default();
    let root = PciRoot::new(mmio.clone(), pio.clone(), WINDOWS);
    let funcs = vec![
        make(0, layout, &seen),
        make(1, layout.rotate_left(3), &seen),
    ];
    let mut w = World {
        root,
        mmio,
        pio,
        seen,
        funcs,
        history: Vec::new(),
    };
    for f in &mut w.funcs {
        f.addr = Some(w.root.add_device(f.dev.clone()).expect("plug"));
    }
    w.check();
    for op in ops.chunks_exact(8) {
        let f = usize::from(op[1] & 1);
        let value = u32::from_le_bytes([op[4], op[5], op[6], op[7]]);
        match op[0] % 8 {
            // Config writes, BAR registers most of the time.
            0..=3 => {
                let Some(addr) = w.funcs[f].addr else {
                    continue;
                };
                let reg = if op[0] & 0x80 != 0 {
                    usize::from(op[2]) % 64
                } else {
                    1 + usize::from(op[2]) % 8
                };
                let len = [1usize, 2, 4, 4][usize::from(op[3] & 3)];
                let offset = if len == 4 {
                    0
                } else {
                    usize::from(op[3] >> 2) % (5 - len)
                };
                let bytes = value.to_le_bytes();
                w.root.config_write(addr, reg, offset as u64, &bytes[..len]);
                if (4..10).contains(&reg) && len == 4 && value == u32::MAX {
                    let cfg = config_of(&w.funcs[f].dev);
                    let got = w.root.config_read(addr, reg);
                    match (cfg.bar(reg - 4), reg > 4) {
                        (Some(b), _) => {
                            let mask = (!(b.size - 1)) as u32
                                & if b.kind.is_memory() { !0xf } else { !0x3 };
                            assert_eq!(
                                got,
                                mask | flag_bits(b.kind),
                                "size probe of BAR {}",
                                reg - 4
                            );
                        }
                        (None, true) => {
                            if let Some(b) = cfg
                                .bar(reg - 5)
                                .filter(|b| matches!(b.kind, BarKind::Mem64 { .. }))
                            {
                                assert_eq!(
                                    got,
                                    ((!(b.size - 1)) >> 32) as u32,
                                    "size probe of a 64-bit BAR's upper half"
                                );
                            }
                        }
                        _ => {}
                    }
                }
            }
            // Moves to an address inside a window, aligned to the BAR.
            4 => {
                let Some(addr) = w.funcs[f].addr else {
                    continue;
                };
                let cfg = config_of(&w.funcs[f].dev);
                let i = [0, 1, 2][usize::from(op[2]) % 3];
                let Some(b) = cfg.bar(i) else { continue };
                let (start, size) = match b.kind {
                    BarKind::Io => WINDOWS.io,
                    BarKind::Mem32 => WINDOWS.mmio32,
                    BarKind::Mem64 { .. } if op[3] & 1 != 0 => WINDOWS.mmio32,
                    BarKind::Mem64 { .. } => WINDOWS.mmio64,
                };
                let slots = size / b.size;
                let to = start + (u64::from(value) % slots.max(1)) * b.size;
                *w.funcs[f].refuse.lock().unwrap() = op[3] & 2 != 0;
                w.root
                    .config_write(addr, 4 + i, 0, &(to as u32).to_le_bytes());
                if matches!(b.kind, BarKind::Mem64 { .. }) {
                    w.root
                        .config_write(addr, 5 + i, 0, &((to >> 32) as u32).to_le_bytes());
                }
                *w.funcs[f].refuse.lock().unwrap() = false;
                let now = config_of(&w.funcs[f].dev).bar(i).map(|b| b.addr);
                assert!(
                    now == Some(b.addr)
                        || now == Some(to)
                        || matches!(b.kind, BarKind::Mem64 { .. })
                );
            }
            // Decoding on (the common case of a driver).
            5 => {
                if let Some(addr) = w.funcs[f].addr {
                    w.root.config_write(addr, 1, 0, &[0x7, 0]);
                }
            }
            // Config reads anywhere.
            6 => {
                if let Some(addr) = w.funcs[f].addr {
                    let got = w
                        .root
                        .config_read(addr, usize::from(op[2]) * 4 + usize::from(op[3]));
                    if usize::from(op[2]) * 4 + usize::from(op[3]) >= 1024 {
                        assert_eq!(got, u32::MAX);
                    }
                }
            }
            // Unplug, or plug again.
            _ => match w.funcs[f].addr.take() {
                Some(addr) => {
                    w.root.remove_device(addr).expect("unplug");
                }
                None => {
                    w.funcs[f] = make(f, value as u8, &w.seen);
                    w.funcs[f].addr =
                        Some(w.root.add_device(w.funcs[f].dev.clone()).expect("replug"));
                }
            },
        }
        w.check();
    }
});
