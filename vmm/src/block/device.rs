//! The virtio-blk device (virtio 1.2, 5.2) on a raw image: features,
//! configuration space, one worker per request queue.

use std::mem::offset_of;
use std::sync::Arc;
use std::thread::JoinHandle;

use log::{info, warn};
use virtio_bindings::virtio_blk::{
    virtio_blk_config, VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH,
    VIRTIO_BLK_F_MQ, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_SIZE_MAX,
    VIRTIO_BLK_F_WRITE_ZEROES,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use vmm_sys_util::eventfd::EventFd;

use super::image::DiskImage;
use super::limits::Limits;
use super::worker::{run_worker, WorkerParts};
use super::{MAX_DISCARD_SECTORS, MAX_DISCARD_SEGMENTS, SECTOR_SIZE};
use crate::sandbox::{self, ThreadKind};
use crate::virtio::{
    feature, read_config_window, ActivateContext, ActivateError, QueueSetupError, VirtioDevice,
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use crate::width::const_u32;

/// `blk_size` in the config space: the sector, as its 32-bit field.
const BLK_SIZE: u32 = const_u32(SECTOR_SIZE as i128);

/// A virtio-blk device.
pub struct Block {
    disk: Arc<DiskImage>,
    name: String,
    num_queues: u16,
    queue_size: u16,
    workers: Vec<(EventFd, JoinHandle<()>)>,
}

impl Block {
    /// A device serving `disk` on `num_queues` queues of `queue_size`.
    pub fn new(disk: DiskImage, name: String, num_queues: u16, queue_size: u16) -> Self {
        info!(
            "virtio-blk {name}: {} sectors{}{}, {num_queues} queue(s) of {queue_size}",
            disk.sectors(),
            if disk.readonly() { ", read-only" } else { "" },
            if disk.punch_hole() { ", discard" } else { "" },
        );
        Self {
            disk: Arc::new(disk),
            name,
            num_queues: num_queues.max(1),
            queue_size,
            workers: Vec::new(),
        }
    }

    /// The data limits advertised and enforced (segments, segment size).
    pub fn limits(&self) -> Limits {
        Limits::for_queue_size(self.queue_size)
    }

    /// The configuration space up to the write-zeroes fields (virtio 1.2,
    /// 5.2.4), laid out by the kernel's `struct virtio_blk_config`.
    pub fn config_space(&self) -> Vec<u8> {
        let mut c = vec![0u8; offset_of!(virtio_blk_config, unused1) + 3];
        let mut put = |at: usize, bytes: &[u8]| {
            if let Some(dst) = c.get_mut(at..at + bytes.len()) {
                dst.copy_from_slice(bytes);
            }
        };
        put(
            offset_of!(virtio_blk_config, capacity),
            &self.disk.sectors().to_le_bytes(),
        );
        let limits = self.limits();
        put(
            offset_of!(virtio_blk_config, size_max),
            &limits.size_max.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, seg_max),
            &limits.seg_max.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, blk_size),
            &BLK_SIZE.to_le_bytes(),
        );
        put(
            offset_of!(virtio_blk_config, num_queues),
            &self.num_queues.to_le_bytes(),
        );
        if self.disk.punch_hole() {
            for (field, value) in [
                (
                    offset_of!(virtio_blk_config, max_discard_sectors),
                    MAX_DISCARD_SECTORS,
                ),
                (
                    offset_of!(virtio_blk_config, max_discard_seg),
                    MAX_DISCARD_SEGMENTS,
                ),
                (offset_of!(virtio_blk_config, discard_sector_alignment), 1),
                (
                    offset_of!(virtio_blk_config, max_write_zeroes_sectors),
                    MAX_DISCARD_SECTORS,
                ),
                (
                    offset_of!(virtio_blk_config, max_write_zeroes_seg),
                    MAX_DISCARD_SEGMENTS,
                ),
            ] {
                put(field, &value.to_le_bytes());
            }
            put(offset_of!(virtio_blk_config, write_zeroes_may_unmap), &[1]);
        }
        c
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn pci_class(&self) -> (u8, u8) {
        // Mass storage controller, SCSI (what virtio-blk functions report).
        (0x01, 0x00)
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![self.queue_size; usize::from(self.num_queues)]
    }

    fn features(&self) -> u64 {
        let mut f = [
            VIRTIO_BLK_F_SIZE_MAX,
            VIRTIO_BLK_F_SEG_MAX,
            VIRTIO_BLK_F_BLK_SIZE,
            VIRTIO_BLK_F_FLUSH,
        ]
        .iter()
        .fold(0u64, |acc, b| acc | feature(*b));
        // The descriptor walker handles indirect tables (and checks them).
        f |= feature(VIRTIO_RING_F_EVENT_IDX) | feature(VIRTIO_RING_F_INDIRECT_DESC);
        if self.disk.readonly() {
            f |= feature(VIRTIO_BLK_F_RO);
        }
        if self.num_queues > 1 {
            f |= feature(VIRTIO_BLK_F_MQ);
        }
        if self.disk.punch_hole() {
            f |= feature(VIRTIO_BLK_F_DISCARD) | feature(VIRTIO_BLK_F_WRITE_ZEROES);
        }
        f
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_window(&self.config_space(), offset, data);
    }

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        for q in ctx.queues {
            let index = q.index;
            let stop = EventFd::new(libc::EFD_NONBLOCK)?;
            let parts = WorkerParts {
                mem: ctx.mem.clone(),
                interrupt: ctx.interrupt.clone(),
                disk: self.disk.clone(),
                limits: self.limits(),
                queue: q,
                stop: stop.try_clone()?,
            };
            let name = format!("blk-q{index}");
            let handle = sandbox::spawn(ThreadKind::BlockWorker, name, move || run_worker(parts))?;
            self.workers.push((stop, handle));
        }
        if self.workers.is_empty() {
            return Err(QueueSetupError::NoRequestQueue.into());
        }
        Ok(())
    }

    fn reset(&mut self) {
        for (stop, handle) in self.workers.drain(..) {
            if let Err(e) = stop.write(1) {
                warn!("virtio-blk {}: cannot stop worker: {e}", self.name);
                continue;
            }
            if handle.join().is_err() {
                warn!("virtio-blk {}: worker panicked", self.name);
            }
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        self.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::test_util::temp_image;
    use crate::virtio::VIRTIO_F_ACCESS_PLATFORM;

    fn le32(c: &[u8], at: usize) -> u32 {
        u32::from_le_bytes([c[at], c[at + 1], c[at + 2], c[at + 3]])
    }

    #[test]
    fn config_space_and_features_follow_the_disk() {
        let (p, _) = temp_image(1 << 20);
        let rw = Block::new(
            DiskImage::open(&p, false, None).unwrap(),
            "rw".into(),
            4,
            128,
        );
        let c = rw.config_space();
        assert_eq!(u64::from_le_bytes(c[0..8].try_into().unwrap()), 2048);
        assert_eq!(le32(&c, 8), 256 * 1024, "size_max");
        assert_eq!(le32(&c, 12), 126, "seg_max");
        assert_eq!(le32(&c, 20), 512, "blk_size");
        assert_eq!(u16::from_le_bytes([c[34], c[35]]), 4, "num_queues");
        let f = rw.features();
        assert_ne!(f & feature(VIRTIO_BLK_F_MQ), 0);
        assert_ne!(f & feature(VIRTIO_BLK_F_FLUSH), 0);
        assert_ne!(f & feature(VIRTIO_BLK_F_SIZE_MAX), 0);
        assert_ne!(f & feature(VIRTIO_BLK_F_SEG_MAX), 0);
        assert_eq!(f & feature(VIRTIO_BLK_F_RO), 0);
        assert_eq!(
            f & feature(VIRTIO_F_ACCESS_PLATFORM),
            0,
            "the transport adds it"
        );
        assert_eq!(rw.queue_max_sizes(), vec![128; 4]);
        if rw.disk.punch_hole() {
            assert_ne!(f & feature(VIRTIO_BLK_F_DISCARD), 0);
            assert_eq!(le32(&c, 36), MAX_DISCARD_SECTORS);
            assert_eq!(le32(&c, 40), 1);
            assert_eq!(c[56], 1, "write_zeroes_may_unmap");
        }
        let ro = Block::new(
            DiskImage::open(&p, true, None).unwrap(),
            "ro".into(),
            1,
            256,
        );
        let f = ro.features();
        assert_ne!(f & feature(VIRTIO_BLK_F_RO), 0);
        assert_eq!(f & feature(VIRTIO_BLK_F_MQ), 0);
        assert_eq!(f & feature(VIRTIO_BLK_F_DISCARD), 0);
        assert_eq!(le32(&ro.config_space(), 36), 0);
        // Reads past the end of the space are zeroes, not a panic.
        let mut d = [0xffu8; 8];
        ro.read_config(u64::MAX - 2, &mut d);
        assert_eq!(d, [0; 8]);
        let _ = std::fs::remove_file(p);
    }
}
