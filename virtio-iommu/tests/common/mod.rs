//! Helpers shared by the integration tests of the device model.

use std::ops::RangeInclusive;
use std::sync::Mutex;

use virtio_iommu::mapping::Invalidator;

/// A DMA consumer that records every invalidation call: (domain, ranges).
#[derive(Default)]
pub struct Recorder {
    /// The calls, in order.
    pub calls: Mutex<Vec<(u32, Vec<RangeInclusive<u64>>)>>,
}

impl Invalidator for Recorder {
    fn invalidate(&self, domain: u32, ranges: &[RangeInclusive<u64>]) {
        self.calls.lock().unwrap().push((domain, ranges.to_vec()));
    }
}
