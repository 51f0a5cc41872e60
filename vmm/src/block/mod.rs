//! virtio-blk on raw image files (`--disk`).
//!
//! - [`config`]: the `--disk` option.
//! - [`image`]: the image file (positioned vectored I/O, flush, holes).
//! - [`request`]: one request, parsed from its chain, checked, executed.
//! - [`limits`]: segment limits advertised and enforced, bytes per section.
//! - [`section`]: the quiescence section a request runs in, chunk by chunk.
//! - [`worker`]: the thread serving one request queue.
//! - [`device`]: the [`VirtioDevice`](crate::virtio::VirtioDevice)
//!   (features, configuration space, workers).
//!
//! Like every emulated device, a disk reaches guest memory only through its
//! [`DmaSpace`]: with `iommu=on` that space translates through the vIOMMU
//! and its workers are quiescence readers, so the disk is one of the DMA
//! consumers an UNMAP waits for.

pub mod config;
pub mod device;
pub mod image;
pub mod limits;
pub mod request;
pub mod section;
pub mod worker;

pub use config::DiskConfig;
pub use device::Block;
pub use image::DiskImage;

use std::sync::{Arc, Mutex};

use crate::error::Error;
use crate::resources::VmResources;
use crate::virtio::iommu::IommuPlatform;
use crate::virtio::pci::VirtioPciDevice;
use crate::virtio::plug::plug_virtio_pci;
use crate::width::const_u32;
use image::ImageError;

/// virtio-blk sectors are 512 bytes whatever the image's block size.
pub const SECTOR_SIZE: u64 = 512;
/// Segments one DISCARD or WRITE_ZEROES request may carry (Linux sends one
/// per request when told 1).
pub const MAX_DISCARD_SEGMENTS: u32 = 1;
/// Sectors one DISCARD / WRITE_ZEROES segment may cover (2 GiB - 512).
pub const MAX_DISCARD_SECTORS: u32 = (u32::MAX >> 1) / const_u32(SECTOR_SIZE as i128);

/// Why a `--disk` could not be added.
#[derive(Debug, thiserror::Error)]
pub enum DiskSetupError {
    /// Its image cannot be opened.
    #[error("--disk: {0}")]
    Image(#[source] ImageError),
}

impl From<DiskSetupError> for Error {
    fn from(e: DiskSetupError) -> Self {
        Self::device(e)
    }
}

/// Creates one virtio-blk PCI function per `--disk` and plugs it into
/// bus 0; `iommu=on` disks become endpoints of the vIOMMU (their DMA space
/// is replaced by a translating one, as for virtio-net).
pub fn add_block_devices(
    res: &VmResources,
    configs: &[DiskConfig],
    mut iommu: Option<&mut IommuPlatform>,
) -> Result<Vec<Arc<Mutex<VirtioPciDevice>>>, Error> {
    let mut out = Vec::with_capacity(configs.len());
    for cfg in configs {
        let name = cfg.name();
        let image = DiskImage::open(&cfg.path, cfg.readonly, cfg.id.as_deref())
            .map_err(DiskSetupError::Image)?;
        let num_queues = u16::try_from(cfg.num_queues).unwrap_or(1);
        let device = Block::new(image, name.clone(), num_queues, cfg.queue_size);
        let name = format!("virtio-blk {name}");
        let plugged = plug_virtio_pci(
            res,
            Box::new(device),
            &name,
            cfg.iommu,
            "disk",
            iommu.as_deref_mut(),
        )?;
        out.push(plugged.dev);
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod test_util;
