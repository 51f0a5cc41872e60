//! Address-range dispatch for port-I/O and MMIO exits.
//!
//! Why: vCPU threads must reach the device that owns an address without a
//! global VM lock. Each device sits behind its own `Arc<Mutex<_>>`; the range
//! map itself is behind an `RwLock` that is only written when devices are added
//! or a PCI BAR moves, so concurrent vCPUs touching different devices never
//! contend on anything but a read lock.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock};

use thiserror::Error;
use virtio_iommu::locks::Unpoison;

/// A device that answers guest accesses inside one address range.
///
/// `base` is the start of the range the device was registered at and
/// `offset` the distance of the access from it, so a device does not need to
/// know where it was placed (PCI BARs move).
pub trait BusDevice: Send {
    /// Fills `data` for a read of `data.len()` bytes at `base + offset`.
    fn read(&mut self, base: u64, offset: u64, data: &mut [u8]);
    /// Handles a write of `data` at `base + offset`.
    fn write(&mut self, base: u64, offset: u64, data: &[u8]);
}

/// A shareable handle to a bus device.
pub type SharedBusDevice = Arc<Mutex<dyn BusDevice>>;

/// Errors while registering devices on a bus.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BusError {
    /// The new range would overlap an existing one.
    #[error("bus range {base:#x}+{len:#x} overlaps an existing device")]
    Overlap {
        /// Start of the rejected range.
        base: u64,
        /// Length of the rejected range.
        len: u64,
    },
    /// Zero-length or wrapping range.
    #[error("invalid bus range {base:#x}+{len:#x}")]
    InvalidRange {
        /// Start of the rejected range.
        base: u64,
        /// Length of the rejected range.
        len: u64,
    },
    /// No device is registered at that base.
    #[error("no device registered at {0:#x}")]
    NotFound(u64),
}

impl From<BusError> for crate::error::Error {
    fn from(e: BusError) -> Self {
        Self::device(e)
    }
}

#[derive(Clone)]
struct Entry {
    len: u64,
    device: SharedBusDevice,
}

/// A set of non-overlapping address ranges, each owned by one device.
#[derive(Default)]
pub struct Bus {
    ranges: RwLock<BTreeMap<u64, Entry>>,
}

impl Bus {
    /// Creates an empty bus.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `device` for `[base, base + len)`.
    pub fn insert(&self, base: u64, len: u64, device: SharedBusDevice) -> Result<(), BusError> {
        if len == 0 || base.checked_add(len).is_none() {
            return Err(BusError::InvalidRange { base, len });
        }
        let mut ranges = self.ranges.write().unpoisoned();
        if let Some((prev_base, prev)) = ranges.range(..base.saturating_add(len)).next_back() {
            if prev_base.saturating_add(prev.len) > base {
                return Err(BusError::Overlap { base, len });
            }
        }
        ranges.insert(base, Entry { len, device });
        Ok(())
    }

    /// Removes every device and returns how many there were. For a VM's
    /// teardown: a bus and PCI bus 0 hold each other (through the
    /// configuration ports), so the graph is freed only once it is cut.
    pub fn clear(&self) -> usize {
        let mut ranges = self.ranges.write().unpoisoned();
        let n = ranges.len();
        ranges.clear();
        n
    }

    /// Removes the device registered at exactly `base` and returns it.
    pub fn remove(&self, base: u64) -> Result<SharedBusDevice, BusError> {
        let mut ranges = self.ranges.write().unpoisoned();
        ranges
            .remove(&base)
            .map(|e| e.device)
            .ok_or(BusError::NotFound(base))
    }

    /// Moves the range registered at `old_base` to `new_base` (same length).
    pub fn relocate(&self, old_base: u64, new_base: u64) -> Result<(), BusError> {
        let mut ranges = self.ranges.write().unpoisoned();
        let entry = ranges
            .remove(&old_base)
            .ok_or(BusError::NotFound(old_base))?;
        let len = entry.len;
        let overlap = new_base.checked_add(len).is_none()
            || ranges
                .range(..new_base.saturating_add(len))
                .next_back()
                .is_some_and(|(b, e)| b.saturating_add(e.len) > new_base);
        if overlap {
            ranges.insert(old_base, entry);
            return Err(BusError::Overlap {
                base: new_base,
                len,
            });
        }
        ranges.insert(new_base, entry);
        Ok(())
    }

    /// Finds the device covering the whole access `[addr, addr + size)`.
    fn resolve(&self, addr: u64, size: usize) -> Option<(u64, SharedBusDevice)> {
        let ranges = self.ranges.read().unpoisoned();
        let (base, entry) = ranges.range(..=addr).next_back()?;
        let end = addr.checked_add(size as u64)?;
        if end <= base.saturating_add(entry.len) {
            Some((*base, entry.device.clone()))
        } else {
            None
        }
    }

    /// Dispatches a read. Returns false (and leaves `data` untouched) if no
    /// device covers the access.
    pub fn read(&self, addr: u64, data: &mut [u8]) -> bool {
        match self.resolve(addr, data.len()) {
            Some((base, dev)) => {
                dev.lock().unpoisoned().read(base, addr - base, data);
                true
            }
            None => false,
        }
    }

    /// Dispatches a write. Returns false if no device covers the access.
    pub fn write(&self, addr: u64, data: &[u8]) -> bool {
        match self.resolve(addr, data.len()) {
            Some((base, dev)) => {
                dev.lock().unpoisoned().write(base, addr - base, data);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Recorder {
        last_write: Option<(u64, u64, Vec<u8>)>,
        fill: u8,
    }

    impl BusDevice for Recorder {
        fn read(&mut self, _base: u64, offset: u64, data: &mut [u8]) {
            data.fill(self.fill.wrapping_add(offset.to_le_bytes()[0]));
        }
        fn write(&mut self, base: u64, offset: u64, data: &[u8]) {
            self.last_write = Some((base, offset, data.to_vec()));
        }
    }

    fn dev(fill: u8) -> Arc<Mutex<Recorder>> {
        Arc::new(Mutex::new(Recorder {
            last_write: None,
            fill,
        }))
    }

    #[test]
    fn dispatches_by_range_with_offsets() {
        let bus = Bus::new();
        let a = dev(0x10);
        let b = dev(0x40);
        bus.insert(0x100, 0x10, a.clone()).unwrap();
        bus.insert(0x110, 0x10, b.clone()).unwrap();
        let mut d = [0u8; 1];
        assert!(bus.read(0x103, &mut d));
        assert_eq!(d[0], 0x13);
        assert!(bus.read(0x110, &mut d));
        assert_eq!(d[0], 0x40);
        assert!(bus.write(0x11f, &[7]));
        assert_eq!(b.lock().unwrap().last_write, Some((0x110, 0xf, vec![7])));
        assert!(a.lock().unwrap().last_write.is_none());
    }

    #[test]
    fn misses_and_straddling_accesses_are_rejected() {
        let bus = Bus::new();
        bus.insert(0x100, 0x10, dev(0)).unwrap();
        let mut d = [0xaau8; 4];
        assert!(!bus.read(0xff, &mut d));
        assert!(!bus.read(0x10e, &mut d));
        assert!(!bus.write(0x110, &[1]));
        assert_eq!(d, [0xaa; 4]);
    }

    #[test]
    fn overlaps_are_refused() {
        let bus = Bus::new();
        bus.insert(0x100, 0x10, dev(0)).unwrap();
        assert!(matches!(
            bus.insert(0x10f, 1, dev(0)),
            Err(BusError::Overlap { .. })
        ));
        assert!(matches!(
            bus.insert(0xf0, 0x11, dev(0)),
            Err(BusError::Overlap { .. })
        ));
        assert!(bus.insert(0xf0, 0x10, dev(0)).is_ok());
        assert!(matches!(
            bus.insert(0, 0, dev(0)),
            Err(BusError::InvalidRange { .. })
        ));
    }

    #[test]
    fn relocate_moves_range_and_checks_overlap() {
        let bus = Bus::new();
        bus.insert(0x1000, 0x100, dev(1)).unwrap();
        bus.insert(0x3000, 0x100, dev(2)).unwrap();
        assert!(bus.relocate(0x1000, 0x2f80).is_err());
        bus.relocate(0x1000, 0x2000).unwrap();
        let mut d = [0u8; 1];
        assert!(!bus.read(0x1000, &mut d));
        assert!(bus.read(0x2000, &mut d));
        assert_eq!(d[0], 1);
        assert!(bus.remove(0x2000).is_ok());
        assert!(bus.remove(0x2000).is_err());
    }
}
