//! The bus-master bit of an assigned function, owned by the VMM once the
//! function has been stopped.
//!
//! WHY: when the host IOMMU cannot be made to forget a mapping the guest
//! has unmapped (a failed VFIO unmap), the VMM stops the function: it
//! clears bus mastering in the function's command register and empties
//! the container. The guest still writes the command register (its copy
//! lives in the PCI model) and would set bus mastering again; the gate
//! strips the bit from every write that reaches the device after the stop.
//! One mutex orders the stop against a guest write in flight, so a write
//! that read "not stopped" cannot land after the stop cleared the bit.

use std::sync::Mutex;
use virtio_iommu::locks::Unpoison;

/// PCI command register: bus master enable (bit 2 of the low byte).
pub const COMMAND_BUS_MASTER: u8 = 1 << 2;

/// Whether the function was stopped; see the module doc.
#[derive(Debug, Default)]
pub struct BusMasterGate {
    stopped: Mutex<bool>,
}

impl BusMasterGate {
    /// Forwards a guest write of the command register (`data` at byte
    /// `offset` 0 or 1 of it) through `write`, without the bus-master bit
    /// once the function is stopped.
    pub fn write_command(&self, offset: u64, data: &[u8], write: impl FnOnce(&[u8])) {
        let stopped = self.stopped.lock().unpoisoned();
        let mut bytes = data.to_vec();
        if *stopped && offset == 0 {
            if let Some(low) = bytes.first_mut() {
                *low &= !COMMAND_BUS_MASTER;
            }
        }
        write(&bytes);
        drop(stopped);
    }

    /// Marks the function stopped and runs `clear` (which clears the bit
    /// in the device) with guest command writes held off; its result is
    /// returned. Stopped stays set even if `clear` fails.
    pub fn stop<E>(&self, clear: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        let mut stopped = self.stopped.lock().unpoisoned();
        *stopped = true;
        clear()
    }

    /// Whether the function was stopped.
    pub fn is_stopped(&self) -> bool {
        *self.stopped.lock().unpoisoned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_function_never_gets_bus_mastering_back() {
        let gate = BusMasterGate::default();
        let mut device = Vec::new();
        gate.write_command(0, &[0x07, 0x00], |b| device.push(b.to_vec()));
        assert_eq!(device.last().unwrap(), &vec![0x07, 0x00], "passes before");
        gate.stop(|| Ok::<(), ()>(())).unwrap();
        assert!(gate.is_stopped());
        gate.write_command(0, &[0x07, 0x01], |b| device.push(b.to_vec()));
        assert_eq!(device.last().unwrap(), &vec![0x03, 0x01], "bit 2 stripped");
        // The high byte alone carries no bus-master bit.
        gate.write_command(1, &[0x04], |b| device.push(b.to_vec()));
        assert_eq!(device.last().unwrap(), &vec![0x04]);
        // A failed clear still leaves the gate closed.
        let gate = BusMasterGate::default();
        assert!(gate.stop(|| Err("EIO")).is_err());
        assert!(gate.is_stopped());
    }
}
