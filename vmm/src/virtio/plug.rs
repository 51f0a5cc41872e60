//! Plugging a virtio device into PCI bus 0, behind the vIOMMU or not: the
//! steps every `--net` and `--disk` takes, in one place.

use std::sync::{Arc, Mutex, PoisonError};

use super::iommu::IommuPlatform;
use super::pci::VirtioPciDevice;
use super::VirtioDevice;
use crate::dma::DmaSpace;
use crate::error::Error;
use crate::pci::PciAddress;
use crate::resources::VmResources;

/// Why a virtio device could not be plugged into bus 0.
#[derive(Debug, thiserror::Error)]
pub enum PlugError {
    /// Its virtio-pci transport could not be made.
    #[error("{name}: {source}")]
    Transport {
        /// The device, as logged.
        name: String,
        /// Why.
        source: crate::virtio::pci::VirtioPciError,
    },
    /// Bus 0 has no room for it.
    #[error("{name}: {source}")]
    Pci {
        /// The device, as logged.
        name: String,
        /// Why.
        source: crate::pci::PciError,
    },
}

impl From<PlugError> for Error {
    fn from(e: PlugError) -> Self {
        Self::device(e)
    }
}

/// A virtio function on bus 0.
pub struct Plugged {
    /// The transport (shared with the PCI root).
    pub dev: Arc<Mutex<VirtioPciDevice>>,
    /// Where it sits.
    pub bdf: PciAddress,
}

/// Plugs `device` (called `name` in messages) into bus 0. With
/// `behind_iommu` the function offers VIRTIO_F_ACCESS_PLATFORM and becomes
/// an endpoint of the vIOMMU: its DMA space, the identity until then (what
/// a guest sees with the IOMMU in bypass), is replaced by a translating
/// one. `option` names the command-line option for the error when there
/// is no `--iommu`.
pub fn plug_virtio_pci(
    res: &VmResources,
    device: Box<dyn VirtioDevice>,
    name: &str,
    behind_iommu: bool,
    option: &'static str,
    iommu: Option<&mut IommuPlatform>,
) -> Result<Plugged, Error> {
    let dev = VirtioPciDevice::new(
        device,
        res.vm.clone(),
        &res.irq_router,
        DmaSpace::identity(res.mem.clone()),
        behind_iommu,
    )
    .map_err(|source| PlugError::Transport {
        name: name.into(),
        source,
    })?;
    let dev = Arc::new(Mutex::new(dev));
    let bdf = res
        .pci
        .add_device(dev.clone())
        .map_err(|source| PlugError::Pci {
            name: name.into(),
            source,
        })?;
    log::info!(
        "{name} at PCI {bdf}{}",
        if behind_iommu {
            " behind the vIOMMU"
        } else {
            ""
        }
    );
    if behind_iommu {
        let platform = iommu.ok_or_else(|| Error::InvalidOption {
            option,
            value: "iommu=on".into(),
            reason: "needs --iommu".into(),
        })?;
        let dma = platform.add_endpoint(bdf)?;
        dev.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .set_dma_space(dma);
    }
    Ok(Plugged { dev, bdf })
}
