//! The vIOMMU as a platform component: the virtio-iommu PCI function, the
//! endpoints behind it and the VIOT table describing them.
//!
//! WHY one object: the three must agree. An endpoint registered with the
//! device model but missing from the VIOT would be blocked forever (the
//! guest never attaches it); one in the VIOT but not in the model would get
//! S_NOENT on ATTACH. Every `iommu=on` device goes through
//! [`IommuPlatform::add_endpoint`], which does both and returns the
//! device's translated DMA space.

use std::sync::{Arc, Mutex};

use kvm_ioctls::VmFd;
use virtio_iommu::device::{DeviceError, IommuConfig, IommuDevice, MapMirror};
use virtio_iommu::mapping::Invalidator;
use virtio_iommu::quiesce::Quiescer;

use super::options::{IommuOptions, RequestServing};
use super::VirtioIommu;
use crate::acpi::viot::{bdf, build_viot, ViotConfig};
use crate::dma::iommu::IommuTranslate;
use crate::dma::DmaSpace;
use crate::error::Error;
use crate::interrupt::GsiRouter;
use crate::memory::GuestMemoryMmap;
use crate::pci::root::IOMMU_HOTPLUG_SLOTS;
use crate::pci::{PciAddress, PciRoot};
use crate::virtio::pci::VirtioPciDevice;
use crate::virtio::pci::VirtioPciError;

/// Why the vIOMMU could not be set up, or a function put behind it or
/// taken from behind it.
#[derive(Debug, thiserror::Error)]
pub enum IommuPlatformError {
    /// The device model refused its configuration.
    #[error("virtio-iommu config: {0}")]
    Config(#[source] DeviceError),
    /// Its request threads' eventfds could not be made.
    #[error("virtio-iommu eventfd: {0}")]
    EventFd(#[source] std::io::Error),
    /// Its virtio-pci transport could not be made.
    #[error("virtio-iommu transport: {0}")]
    Transport(#[source] VirtioPciError),
    /// Bus 0 has no room for it.
    #[error("virtio-iommu PCI: {0}")]
    Pci(#[source] crate::pci::PciError),
    /// The device model refused the endpoint.
    #[error("vIOMMU endpoint {addr}: {source}")]
    Endpoint {
        /// The function.
        addr: PciAddress,
        /// Why.
        source: DeviceError,
    },
}

impl From<IommuPlatformError> for Error {
    fn from(e: IommuPlatformError) -> Self {
        Self::device(e)
    }
}

/// The PCI segment everything lives on.
const SEGMENT: u16 = 0;

/// The virtio-iommu function and its endpoints.
pub struct IommuPlatform {
    iommu: Arc<IommuDevice>,
    /// The emulated device threads behind the vIOMMU, as one DMA consumer.
    quiescer: Arc<Quiescer>,
    fault_notify: Arc<vmm_sys_util::eventfd::EventFd>,
    address: PciAddress,
    endpoints: Vec<PciAddress>,
    mem: GuestMemoryMmap,
}

impl IommuPlatform {
    /// Plugs a virtio-iommu PCI function into `pci`. Its own rings are
    /// accessed untranslated (identity DMA space).
    pub fn create(
        opts: &IommuOptions,
        vm: Arc<VmFd>,
        router: &Arc<GsiRouter>,
        pci: &PciRoot,
        mem: GuestMemoryMmap,
    ) -> Result<Self, Error> {
        // The default config reports and reserves the x86 MSI doorbell
        // window 0xfee00000-0xfeefffff (the host bridge's MSI window) in
        // PROBE, so the guest never maps DMA over it.
        let cfg = IommuConfig {
            space_impl: opts.space_impl,
            bypass: opts.bypass,
            num_request_queues: opts.queues,
            // Offered always: a driver that does not negotiate it gets the
            // standard device (docs/page-table.md).
            page_table: true,
            ..IommuConfig::default()
        };
        let iommu = Arc::new(IommuDevice::new(cfg).map_err(IommuPlatformError::Config)?);
        // Walks of guest page tables read the guest's RAM directly, as the
        // device's own rings are read.
        iommu.set_table_memory(Arc::new(mem.clone()));
        // Every emulated endpoint's threads are one consumer: a kick's
        // UNMAPs complete only after they left their older sections.
        let quiescer = Quiescer::new();
        iommu.add_invalidator(quiescer.clone());
        let device =
            VirtioIommu::new(iommu.clone(), opts.requests).map_err(IommuPlatformError::EventFd)?;
        let fault_notify = device.fault_notify();
        let transport = VirtioPciDevice::new(
            Box::new(device),
            vm,
            router,
            DmaSpace::identity(mem.clone()),
            false,
        )
        .map_err(IommuPlatformError::Transport)?;
        let address = pci
            .add_device(Arc::new(Mutex::new(transport)))
            .map_err(IommuPlatformError::Pci)?;
        log::info!(
            "virtio-iommu at {address} ({} domain tables, {} request queue(s) served {}, bypass {})",
            opts.space_impl,
            opts.queues,
            match opts.requests {
                RequestServing::Auto => "inline if the driver uses one, else by threads",
                RequestServing::Inline => "inline",
                RequestServing::Thread => "by threads",
            },
            if opts.bypass { "on" } else { "off" }
        );
        Ok(Self {
            iommu,
            quiescer,
            fault_notify,
            address,
            endpoints: Vec::new(),
            mem,
        })
    }

    /// Puts the PCI function at `addr` behind the vIOMMU and returns the
    /// DMA space its device model must use from now on.
    pub fn add_endpoint(&mut self, addr: PciAddress) -> Result<DmaSpace, Error> {
        let id = u32::from(bdf(addr));
        self.iommu
            .add_endpoint(id)
            .map_err(|source| IommuPlatformError::Endpoint { addr, source })?;
        let dma = self
            .iommu
            .endpoint_dma(id)
            .map_err(|source| IommuPlatformError::Endpoint { addr, source })?;
        self.endpoints.push(addr);
        let translator = IommuTranslate::new(dma, Some(self.fault_notify.clone()));
        Ok(DmaSpace::translated(self.mem.clone(), Arc::new(translator))
            .with_quiescer(self.quiescer.clone()))
    }

    /// Takes the function at `addr` from behind the vIOMMU (it was
    /// unplugged): it leaves its domain, and `mirror`, the consumer that
    /// followed it (a VFIO container's mirror, `crate::vfio::VfioMirror`),
    /// is no longer told about maps and invalidations.
    pub fn remove_endpoint<M: MapMirror + Invalidator + 'static>(
        &mut self,
        addr: PciAddress,
        mirror: Option<Arc<M>>,
    ) -> Result<(), Error> {
        if let Some(m) = mirror {
            let inv: Arc<dyn Invalidator> = m.clone();
            let map: Arc<dyn MapMirror> = m;
            self.iommu.remove_map_mirror(&map);
            self.iommu.remove_invalidator(&inv);
        }
        self.endpoints.retain(|a| *a != addr);
        self.iommu
            .remove_endpoint(u32::from(bdf(addr)))
            .map_err(|source| IommuPlatformError::Endpoint { addr, source }.into())
    }

    /// The device model (statistics, tests).
    pub fn iommu(&self) -> &Arc<IommuDevice> {
        &self.iommu
    }

    /// The device model, for its request counters (`vm.counters`).
    pub fn device(&self) -> Arc<IommuDevice> {
        self.iommu.clone()
    }

    /// Where the virtio-iommu function sits.
    pub fn address(&self) -> PciAddress {
        self.address
    }

    /// The VIOT table for the current endpoints and the slots kept for
    /// hotplug behind the vIOMMU.
    pub fn viot(&self) -> Vec<u8> {
        let hotplug = IOMMU_HOTPLUG_SLOTS.filter_map(|slot| {
            Some(PciAddress {
                bus: 0,
                device: u8::try_from(slot).ok()?,
                function: 0,
            })
        });
        build_viot(&ViotConfig {
            segment: SEGMENT,
            iommu: self.address,
            endpoints: self.endpoints.iter().copied().chain(hotplug).collect(),
        })
    }
}
