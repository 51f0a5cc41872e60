//! Plugging a virtio device into PCI bus 0, behind the vIOMMU or not: the
//! steps every `--net` and `--disk` takes, in one place.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use virtio_iommu::locks::Unpoison;

use super::iommu::IommuPlatform;
use super::pci::VirtioPciDevice;
use super::VirtioDevice;
use crate::dma::DmaSpace;
use crate::error::Error;
use crate::pci::root::GENERAL_SLOTS;
use crate::pci::PciAddress;
use crate::resources::VmResources;
use crate::virtio::pci::VirtioPciError;

/// Why a virtio device could not be plugged into bus 0.
#[derive(Debug, thiserror::Error)]
pub enum PlugError {
    /// Its virtio-pci transport could not be made.
    #[error("{name}: {source}")]
    Transport {
        /// The device, as logged.
        name: String,
        /// Why.
        source: VirtioPciError,
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
    plug_virtio_pci_in(
        res,
        device,
        name,
        behind_iommu,
        option,
        iommu,
        GENERAL_SLOTS,
    )
}

/// [`plug_virtio_pci`] into the first free slot of `slots` (a device
/// hotplugged behind the vIOMMU must land in the slots the VIOT names for
/// hotplug). Leaves bus 0 as it found it when it fails: a refused hotplug
/// changes nothing the guest can see.
pub fn plug_virtio_pci_in(
    res: &VmResources,
    device: Box<dyn VirtioDevice>,
    name: &str,
    behind_iommu: bool,
    option: &'static str,
    iommu: Option<&mut IommuPlatform>,
    slots: Range<usize>,
) -> Result<Plugged, Error> {
    let platform = match (behind_iommu, iommu) {
        (true, None) => {
            return Err(Error::InvalidOption {
                option,
                value: "iommu=on".into(),
                reason: "needs --iommu".into(),
            })
        }
        (true, Some(p)) => Some(p),
        (false, _) => None,
    };
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
        .add_device_in(dev.clone(), slots)
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
    if let Some(platform) = platform {
        let dma = match platform.add_endpoint(bdf) {
            Ok(dma) => dma,
            Err(e) => {
                // Not started (no guest has seen it): off the bus again.
                if let Err(r) = res.pci.remove_device(bdf) {
                    log::warn!("{name}: taking it off bus 0 again: {r}");
                }
                return Err(e);
            }
        };
        dev.lock().unpoisoned().set_dma_space(dma);
    }
    Ok(Plugged { dev, bdf })
}
