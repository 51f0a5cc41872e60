//! KVM memory slot numbers. Guest RAM takes slots `0..FIRST_DEVICE_SLOT`
//! (one per RAM region, at most two); memory that devices map into the
//! guest (an assigned function's BARs) takes one slot each from above.
//! Devices are never unplugged, so numbers are not reused.

use std::sync::atomic::{AtomicU32, Ordering};

/// The first slot number handed to devices.
pub const FIRST_DEVICE_SLOT: u32 = 16;
/// KVM's smallest limit on slots per address space (KVM_CAP_NR_MEMSLOTS is
/// at least this on every supported kernel).
pub const MAX_SLOTS: u32 = 509;

static NEXT: AtomicU32 = AtomicU32::new(FIRST_DEVICE_SLOT);

/// A slot number of its own for a device mapping, or None once all are used.
pub fn device_slot() -> Option<u32> {
    NEXT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
        (n < MAX_SLOTS).then_some(n + 1)
    })
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_slots_are_distinct_and_above_ram() {
        let a = device_slot().unwrap();
        let b = device_slot().unwrap();
        assert!(a >= FIRST_DEVICE_SLOT && b >= FIRST_DEVICE_SLOT);
        assert_ne!(a, b);
    }
}
