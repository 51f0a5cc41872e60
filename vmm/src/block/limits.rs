//! The data limits a disk advertises and enforces: segments per request
//! (VIRTIO_BLK_F_SEG_MAX), bytes per segment (VIRTIO_BLK_F_SIZE_MAX), and
//! bytes one quiescence section covers.
//!
//! WHY enforced and not only advertised: the limits are what bounds the
//! I/O of one request, and the guest is free to ignore them. A request
//! beyond them is answered IOERR before any of its data is touched.
//! WHY a section bound besides them: the limits bound a request to
//! `seg_max * size_max` bytes (tens of MiB); an UNMAP should wait for far
//! less (see [`super::section`]).

use crate::virtio::chain::{Buffer, MAX_CHAIN_DESCRIPTORS};

use super::request::RequestError;

/// Largest data segment the device takes (`size_max`): 256 KiB, a
/// multiple of every page size Linux uses and above its default
/// `max_sectors_kb` share of a segment.
pub const SIZE_MAX: u32 = 256 * 1024;

/// Bytes of data one quiescence section translates and moves.
pub const SECTION_BYTES: u64 = 256 * 1024;

/// The limits of one disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Data segments per request (`seg_max`).
    pub seg_max: u32,
    /// Bytes per data segment (`size_max`).
    pub size_max: u32,
    /// Bytes of data per quiescence section (at least 1).
    pub section_bytes: u64,
}

impl Limits {
    /// The limits of a disk whose queues have at most `queue_size`
    /// entries: the chain limit (indirect tables may exceed the ring)
    /// less the header and status descriptors.
    pub fn for_queue_size(queue_size: u16) -> Self {
        let chain = u32::try_from(MAX_CHAIN_DESCRIPTORS).unwrap_or(u32::MAX);
        Self {
            seg_max: chain.min(u32::from(queue_size)).saturating_sub(2).max(1),
            size_max: SIZE_MAX,
            section_bytes: SECTION_BYTES,
        }
    }

    /// Checks a request's data segments (header and status cut off, empty
    /// buffers dropped) against `seg_max` and `size_max`.
    pub fn check(&self, data: &[Buffer]) -> Result<(), RequestError> {
        let segments = data.iter().filter(|b| b.len > 0).count();
        if segments > self.seg_max as usize {
            return Err(RequestError::TooManySegments {
                segments,
                max: self.seg_max,
            });
        }
        if let Some(b) = data.iter().find(|b| b.len > self.size_max) {
            return Err(RequestError::SegmentTooLarge {
                len: b.len,
                max: self.size_max,
            });
        }
        Ok(())
    }
}
