//! The order of UPDATEs and INVALIDATEs on the front-end channel.
//!
//! WHY: a miss is translated without any lock (the domain table is read
//! lock-free) and answered later. If an UNMAP removed the mapping in
//! between and its INVALIDATE went out first, the UPDATE would re-install
//! a translation the guest already saw unmapped. Every INVALIDATE is
//! written under the lock holding this record and bumps its generation;
//! the miss handler notes the generation before it translates and, under
//! the same lock, drops its UPDATE when an invalidation overlapping it was
//! written since (and translates again). An UPDATE written before the
//! INVALIDATE is harmless: the back-end reads both in order.

use std::collections::VecDeque;

/// Invalidations remembered for the overlap check; an older generation
/// than these counts as overlapping everything.
const RECENT: usize = 64;

/// The record kept under the IOTLB's send lock.
#[derive(Debug, Default)]
pub struct SendOrder {
    generation: u64,
    /// (generation, first, last) of the latest invalidations, oldest first.
    recent: VecDeque<(u64, u64, u64)>,
    /// Bus mastering is off: no UPDATE may go out.
    pub bus_master_off: bool,
    /// The device was stopped after a failed invalidation: no UPDATE ever.
    pub stopped: bool,
}

impl SendOrder {
    /// The generation a miss notes before it translates.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// An INVALIDATE of `first..=last` is being written (call under the
    /// lock, before writing it).
    pub fn invalidating(&mut self, first: u64, last: u64) {
        self.generation += 1;
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back((self.generation, first, last));
    }

    /// Whether an invalidation overlapping `first..=last` was written since
    /// generation `seen`.
    pub fn stale(&self, seen: u64, first: u64, last: u64) -> bool {
        if self.generation == seen {
            return false;
        }
        match self.recent.front() {
            // Forgotten invalidations may have overlapped.
            Some(&(oldest, _, _)) if oldest > seen + 1 => true,
            None => true,
            _ => self
                .recent
                .iter()
                .any(|&(g, f, l)| g > seen && f <= last && first <= l),
        }
    }

    /// Whether UPDATEs may be written at all.
    pub fn open(&self) -> bool {
        !self.bus_master_off && !self.stopped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_overlapping_later_invalidations_make_an_update_stale() {
        let mut o = SendOrder::default();
        let seen = o.generation();
        assert!(!o.stale(seen, 0x1000, 0x1fff));
        o.invalidating(0x3000, 0x3fff);
        assert!(!o.stale(seen, 0x1000, 0x1fff));
        assert!(o.stale(seen, 0x2000, 0x3000));
        let later = o.generation();
        assert!(!o.stale(later, 0x3000, 0x3fff));
        o.invalidating(0, u64::MAX);
        assert!(o.stale(later, 0x1000, 0x1000));
    }

    #[test]
    fn a_generation_older_than_the_record_is_stale() {
        let mut o = SendOrder::default();
        let seen = o.generation();
        for i in 0..(RECENT as u64 + 1) {
            o.invalidating(0x10_0000 + i * 0x1000, 0x10_0000 + i * 0x1000 + 0xfff);
        }
        // The one invalidation that could have overlapped was forgotten.
        assert!(o.stale(seen, 0, 0xfff));
        assert!(!o.stale(o.generation() - 1, 0, 0xfff));
    }
}
