//! The `--net` devices of a VM: one virtio-net PCI function per flag, its
//! data path on a TAP interface ([`crate::net`]) or in a vhost-user
//! back-end ([`crate::vhost_user`]).
//!
//! WHY a module of its own: the vhost-user front-end reuses the TAP
//! device's control queue, rings and config space from `crate::net`, so
//! the one place that chooses between the two sits above both.

use std::sync::{Arc, Mutex};

use crate::acpi::viot;
use crate::error::Error;
use crate::net::{Net, NetConfig, NetError};
use crate::resources::VmResources;
use crate::vhost_user::iotlb::BackendIotlb;
use crate::vhost_user::VhostUserNetError;
use crate::virtio::iommu::platform::IommuPlatformError;
use crate::virtio::iommu::IommuPlatform;
use crate::virtio::pci::VirtioPciDevice;
use crate::virtio::plug::{plug_virtio_pci, Plugged};

/// Why a `--net` could not be added.
#[derive(Debug, thiserror::Error)]
pub enum NetSetupError {
    /// Its TAP interface could not be set up.
    #[error("--net: {0}")]
    Tap(#[source] NetError),
    /// Its vhost-user back-end could not be reached or set up.
    #[error("--net: {0}")]
    VhostUser(#[source] VhostUserNetError),
}

impl From<NetSetupError> for Error {
    fn from(e: NetSetupError) -> Self {
        Self::device(e)
    }
}

/// Creates one virtio-net PCI function per `--net` and plugs it into bus 0.
///
/// A device with `iommu=on` offers VIRTIO_F_ACCESS_PLATFORM; its DMA space
/// starts as the identity (what a guest sees with the IOMMU in bypass) and
/// the vIOMMU replaces it with a translating one through
/// [`VirtioPciDevice::set_dma_space`] once the endpoint exists.
pub fn add_net_devices(
    res: &VmResources,
    configs: &[NetConfig],
    mut iommu: Option<&mut IommuPlatform>,
) -> Result<NetDevices, Error> {
    let mut out = NetDevices::default();
    for cfg in configs {
        let mut iotlb = None;
        let (device, name): (Box<dyn crate::virtio::VirtioDevice>, String) =
            match &cfg.vhost_user_socket {
                Some(path) => {
                    let net = crate::vhost_user::VhostUserNet::connect(cfg, res.mem.clone())
                        .map_err(NetSetupError::VhostUser)?;
                    iotlb = net.iotlb();
                    (Box::new(net), format!("vhost-user {}", path.display()))
                }
                None => {
                    let net = Net::new(cfg).map_err(NetSetupError::Tap)?;
                    let name = format!("TAP {}", net.tap_name());
                    (Box::new(net), name)
                }
            };
        let what = format!("virtio-net on {name}");
        let Plugged { dev, bdf } =
            plug_virtio_pci(res, device, &what, cfg.iommu, "net", iommu.as_deref_mut())?;
        if let (true, Some(platform)) = (cfg.iommu, iommu.as_deref_mut()) {
            if let Some(iotlb) = iotlb {
                // The back-end translates through its own IOTLB: it is a
                // DMA consumer of this endpoint (misses, invalidations).
                let id = u32::from(viot::bdf(bdf));
                let endpoint = platform
                    .iommu()
                    .endpoint_dma(id)
                    .map_err(|source| IommuPlatformError::Endpoint { addr: bdf, source })?;
                iotlb.set_endpoint(endpoint);
                platform.iommu().add_invalidator(iotlb.clone());
                platform.iommu().add_endpoint_listener(iotlb.clone());
                out.iotlbs.push((name.clone(), iotlb));
            }
        }
        out.devices.push(dev);
    }
    Ok(out)
}

/// What [`add_net_devices`] made: the PCI functions, and the IOTLBs of
/// vhost-user back-ends behind the vIOMMU (their counters are reported at
/// exit).
#[derive(Default)]
pub struct NetDevices {
    /// One per `--net`.
    pub devices: Vec<Arc<Mutex<VirtioPciDevice>>>,
    /// (device name, its back-end's IOTLB).
    pub iotlbs: Vec<(String, Arc<BackendIotlb>)>,
}
