//! Feature negotiation state.
//!
//! WHY a separate type: every request handler asks "was X negotiated?"
//! concurrently; acked features live in one atomic so no lock is needed.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::wire::feature;

/// Project feature bit: N request queues (see docs/multiqueue.md for the
/// proposal text). Offered only when the host configures more than one
/// request queue; without it the device is the standard single-queue device.
pub use crate::wire::feature::MULTIQUEUE;

/// Offered and acknowledged feature bits.
#[derive(Debug)]
pub struct Features {
    offered: u64,
    acked: AtomicU64,
}

impl Features {
    pub fn new(probe: bool, multiqueue: bool, page_table: bool) -> Self {
        let mut offered = feature::bit(feature::VIRTIO_F_VERSION_1)
            | feature::bit(feature::INPUT_RANGE)
            | feature::bit(feature::DOMAIN_RANGE)
            | feature::bit(feature::MAP_UNMAP)
            | feature::bit(feature::MMIO)
            // BYPASS_CONFIG supersedes BYPASS; the spec says not to offer both.
            | feature::bit(feature::BYPASS_CONFIG);
        if probe {
            offered |= feature::bit(feature::PROBE);
        }
        if multiqueue {
            offered |= feature::bit(MULTIQUEUE);
        }
        if page_table {
            offered |= feature::bit(feature::PAGE_TABLE);
        }
        Self {
            offered,
            acked: AtomicU64::new(0),
        }
    }

    pub fn offered(&self) -> u64 {
        self.offered
    }

    /// Records the driver's choice; bits the device never offered are dropped.
    pub fn ack(&self, acked: u64) {
        self.acked.store(acked & self.offered, Ordering::Release);
    }

    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::Acquire)
    }

    pub fn is_offered(&self, bit: u32) -> bool {
        self.offered & feature::bit(bit) != 0
    }

    pub fn is_acked(&self, bit: u32) -> bool {
        self.acked() & feature::bit(bit) != 0
    }

    /// Device reset: the driver negotiates again.
    pub fn reset(&self) {
        self.acked.store(0, Ordering::Release);
    }
}
