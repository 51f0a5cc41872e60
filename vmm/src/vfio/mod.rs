//! Device assignment: host PCI functions bound to vfio-pci, driven through
//! rust-vmm's `vfio-ioctls` (type1 container and group).
//!
//! Without the vIOMMU the whole guest RAM is mapped in the container at
//! boot (IOVA = guest-physical address), so the device can reach any guest
//! page, as on a host without an IOMMU. Behind the vIOMMU (`iommu=on`) the
//! container follows the guest's mappings of the device's domain instead
//! (see [`mirror`]).

pub mod bus_master;
pub mod config;
pub mod device;
mod direct_bar;
pub mod host;
pub mod hotplug;
pub mod hotplug_ids;
pub mod mirror;
#[cfg(test)]
mod mirror_tests;
pub mod msi;
pub mod msix_block;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use vfio_ioctls::{VfioContainer, VfioDevice, VfioOps};

pub use config::VfioConfig;
pub use device::{VfioPciDevice, VfioPciError};

pub use mirror::VfioMirror;

use crate::acpi::viot::bdf;
use crate::error::Error;
use crate::pci::PciAddress;
use crate::resources::VmResources;
use crate::virtio::iommu::IommuPlatform;
use crate::virtio::msix::MsiSink;

/// An assigned function: where it sits, and its mirror behind the vIOMMU.
#[derive(Clone)]
pub struct AssignedDevice {
    /// Its PCI address in the guest.
    pub addr: PciAddress,
    /// The container following its vIOMMU domain (`iommu=on`).
    pub mirror: Option<Arc<VfioMirror>>,
}

/// Why a function could not be assigned.
#[derive(Debug, thiserror::Error)]
pub enum VfioError {
    /// Its sysfs path names nothing.
    #[error("vfio {name}: {} does not exist", path.display())]
    Missing {
        /// The function.
        name: String,
        /// Its sysfs path.
        path: PathBuf,
    },
    /// It is bound to another driver than vfio-pci.
    #[error(
        "vfio {name}: {} is bound to {driver}, not vfio-pci (echo vfio-pci > {}/driver_override, \
         unbind it, then echo the BDF to /sys/bus/pci/drivers_probe)",
        path.display(),
        path.display()
    )]
    NotVfioPci {
        /// The function.
        name: String,
        /// Its sysfs path.
        path: PathBuf,
        /// Its driver ("no driver" when unbound).
        driver: String,
    },
    /// The host IOMMU is off, or the function is outside any group.
    #[error("vfio {name}: {} has no IOMMU group (is the host IOMMU on?)", path.display())]
    NoIommuGroup {
        /// The function.
        name: String,
        /// Its sysfs path.
        path: PathBuf,
    },
    /// A VFIO operation failed.
    #[error("vfio {name}: {what}: {source}")]
    Vfio {
        /// The function.
        name: String,
        /// The operation.
        what: &'static str,
        /// Why.
        source: vfio_ioctls::VfioError,
    },
    /// Its PCI model could not be made.
    #[error(transparent)]
    Device(#[from] VfioPciError),
    /// The vIOMMU could not be told that its domain needs explicit MAPs.
    #[error("vfio {name}: {source}")]
    ExplicitMaps {
        /// The function.
        name: String,
        /// Why.
        source: virtio_iommu::device::DeviceError,
    },
    /// Bus 0 has no free slot for it.
    #[error("vfio {name}: PCI: {source}")]
    Pci {
        /// The function.
        name: String,
        /// Why.
        source: crate::pci::PciError,
    },
}

impl From<VfioError> for Error {
    fn from(e: VfioError) -> Self {
        Self::device(e)
    }
}

fn vfio_err(name: &str, what: &'static str) -> impl FnOnce(vfio_ioctls::VfioError) -> VfioError {
    let name = name.to_string();
    move |source| VfioError::Vfio { name, what, source }
}

/// Why the function `cfg` names cannot be assigned, in one line, before
/// VFIO (or KVM) is asked.
pub fn check_assignable(cfg: &VfioConfig) -> Result<(), Error> {
    check_bound_to_vfio(&cfg.name(), &cfg.path)
}

fn check_bound_to_vfio(name: &str, path: &Path) -> Result<(), Error> {
    if !path.exists() {
        return Err(VfioError::Missing {
            name: name.into(),
            path: path.into(),
        }
        .into());
    }
    let driver = std::fs::read_link(path.join("driver"))
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()));
    if driver.as_deref() != Some("vfio-pci") {
        return Err(VfioError::NotVfioPci {
            name: name.into(),
            path: path.into(),
            driver: driver.unwrap_or_else(|| "no driver".into()),
        }
        .into());
    }
    if !path.join("iommu_group").exists() {
        return Err(VfioError::NoIommuGroup {
            name: name.into(),
            path: path.into(),
        }
        .into());
    }
    Ok(())
}

/// Assigns the function `cfg` names: its own container, the device reset,
/// its PCI function plugged into the first free slot of `slots`; then
/// either all guest RAM mapped in the container, or (`iommu=on`) the
/// device made an endpoint of the vIOMMU whose domain the container
/// mirrors.
pub fn add_vfio_device(
    cfg: &VfioConfig,
    res: &VmResources,
    iommu: Option<&mut IommuPlatform>,
    slots: std::ops::Range<usize>,
) -> Result<AssignedDevice, Error> {
    let name = cfg.name();
    if cfg.iommu && iommu.is_none() {
        return Err(Error::InvalidOption {
            option: "device",
            value: format!("path={},iommu=on", cfg.path.display()),
            reason: "needs --iommu".into(),
        });
    }
    check_bound_to_vfio(&name, &cfg.path)?;
    let container = Arc::new(VfioContainer::new(None).map_err(vfio_err(&name, "container"))?);
    let ops: Arc<dyn VfioOps> = container.clone();
    let device = Arc::new(VfioDevice::new(&cfg.path, ops, false).map_err(vfio_err(&name, "open"))?);
    device.reset();
    let router = res.irq_router.clone();
    let mut vectors = || -> Option<(Box<dyn MsiSink>, vmm_sys_util::eventfd::EventFd)> {
        let v = router.new_vector().ok()?;
        let fd = v.try_clone_eventfd().ok()?;
        Some((Box::new(msix_block::ExternalVector(v)), fd))
    };
    let dev = VfioPciDevice::new(name.clone(), device.clone(), res.vm.clone(), &mut vectors)
        .map_err(VfioError::from)?;
    let gate = dev.bus_master_gate();
    let addr = res
        .pci
        .add_device_in(Arc::new(Mutex::new(dev)), slots)
        .map_err(|source| VfioError::Pci {
            name: name.clone(),
            source,
        })?;
    match iommu.filter(|_| cfg.iommu) {
        Some(platform) => {
            platform.add_endpoint(addr)?;
            // Its DMA goes through the host IOMMU, which follows MAPs only:
            // no guest page table for its domain.
            platform
                .iommu()
                .require_explicit_maps(u32::from(bdf(addr)))
                .map_err(|source| VfioError::ExplicitMaps {
                    name: name.clone(),
                    source,
                })?;
            let host = Arc::new(host::VfioHost::new(container, device, gate));
            let mirror = Arc::new(VfioMirror::new(
                name.clone(),
                u32::from(bdf(addr)),
                host,
                res.mem.clone(),
            ));
            platform.iommu().add_invalidator(mirror.clone());
            platform.iommu().add_map_mirror(mirror.clone());
            log::info!("vfio {name}: assigned at {addr} behind the vIOMMU");
            return Ok(AssignedDevice {
                addr,
                mirror: Some(mirror),
            });
        }
        None => {
            // SAFETY: the regions of `res.mem` stay mapped for the VM's
            // lifetime (guest RAM is never unmapped while the VMM runs), and
            // the VMM only accesses them through vm-memory's volatile
            // slices, never through Rust references, which is what
            // concurrent device DMA requires.
            unsafe { container.vfio_map_guest_memory(&res.mem) }
                .map_err(vfio_err(&name, "mapping guest RAM in the container"))?;
            log::info!("vfio {name}: assigned at {addr}, guest RAM mapped 1:1");
        }
    }
    Ok(AssignedDevice { addr, mirror: None })
}
