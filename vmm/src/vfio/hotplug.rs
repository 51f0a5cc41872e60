//! Assigned functions added and removed while the guest runs
//! (`vm.add-device`, `vm.remove-device`), through ACPI PCI hotplug
//! (`devices::pci_hotplug`, `acpi::pci_hotplug`).
//!
//! Adding: the function is assigned as at boot (its own container; all
//! guest RAM mapped, or behind the vIOMMU in one of the slots the VIOT
//! names for hotplug), then its slot's bit is set in `PCIU` and the
//! Generic Event Device interrupts the guest, whose `acpiphp` rescans the
//! slot and binds a driver.
//!
//! Removing: the slot's bit is set in `PCID` and the guest is interrupted;
//! it unbinds the driver, detaches the function from its vIOMMU domain
//! and calls `_EJ0`, whose write of `B0EJ` reaches [`VfioHotplug`]'s
//! thread. Only then is the function torn down: unplugged from the bus,
//! taken from behind the vIOMMU, its mirror deregistered, its interrupts
//! and BAR slots released, its container closed. A guest that never
//! ejects keeps the function, as on hardware.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};

use log::{info, warn};

use super::{add_vfio_device, AssignedDevice, VfioConfig, VfioMirror};
use crate::devices::ged::GedTrigger;
use crate::devices::pci_hotplug::{HotplugEvents, EJECT_QUEUE};
use crate::error::Error;
use crate::pci::root::{GENERAL_SLOTS, IOMMU_HOTPLUG_SLOTS};
use crate::pci::PciAddress;
use crate::resources::VmResources;
use crate::sandbox::{self, ThreadKind};
use crate::virtio::iommu::IommuPlatform;

/// Why a hotplug request was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum HotplugError {
    /// An assigned function already has this id.
    #[error("a device with id {0} exists already")]
    DuplicateId(String),
    /// No assigned function has this id.
    #[error("no assigned device has id {0}")]
    UnknownId(String),
    /// The function is being removed already.
    #[error("device {0} is being removed already (waiting for the guest to eject it)")]
    Removing(String),
    /// Assigning the function failed; the VM is unchanged.
    #[error(transparent)]
    Assign(#[from] Error),
    /// The guest could not be told.
    #[error("raising the hotplug interrupt: {0}")]
    Notify(std::io::Error),
}

/// One assigned function.
struct Plugged {
    cfg: VfioConfig,
    dev: AssignedDevice,
    /// The guest was asked to eject it.
    removing: bool,
}

/// The assigned functions of a running VM and what adding or removing
/// one needs.
pub struct VfioHotplug {
    res: VmResources,
    iommu: Option<Arc<Mutex<IommuPlatform>>>,
    events: Arc<HotplugEvents>,
    ged: GedTrigger,
    plugged: Mutex<Vec<Plugged>>,
    /// A guest ejected a slot with no assigned function (logged once: a
    /// guest can do it at will).
    stray_eject: AtomicBool,
}

fn slot_of(addr: PciAddress) -> u8 {
    addr.device
}

impl VfioHotplug {
    /// The manager of a VM whose cold-plugged functions are `assigned`;
    /// starts the thread that tears down what the guest ejects (sent on
    /// `ejected` by the hotplug registers).
    pub fn start(
        res: VmResources,
        iommu: Option<Arc<Mutex<IommuPlatform>>>,
        events: Arc<HotplugEvents>,
        ged: GedTrigger,
        assigned: Vec<(VfioConfig, AssignedDevice)>,
        ejected: Receiver<u8>,
    ) -> Result<Arc<Self>, Error> {
        let me = Arc::new(Self {
            res,
            iommu,
            events,
            ged,
            plugged: Mutex::new(
                assigned
                    .into_iter()
                    .map(|(cfg, dev)| Plugged {
                        cfg,
                        dev,
                        removing: false,
                    })
                    .collect(),
            ),
            stray_eject: AtomicBool::new(false),
        });
        let worker = Arc::downgrade(&me);
        sandbox::spawn(ThreadKind::Hotplug, "pci-hotplug", move || {
            for slot in ejected {
                match worker.upgrade() {
                    Some(h) => h.ejected(slot),
                    None => return,
                }
            }
        })
        .map_err(|source| Error::Os {
            what: "PCI hotplug thread",
            source,
        })?;
        Ok(me)
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Plugged>> {
        self.plugged.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Assigns `cfg` and tells the guest; returns the id and address.
    pub fn add(&self, cfg: VfioConfig) -> Result<(String, PciAddress), HotplugError> {
        let name = cfg.name();
        // Held across the assignment: two requests for one id cannot both
        // pass the check.
        let mut plugged = self.lock();
        if plugged.iter().any(|p| p.cfg.name() == name) {
            return Err(HotplugError::DuplicateId(name));
        }
        super::check_assignable(&cfg)?;
        let slots: Range<usize> = if cfg.iommu {
            IOMMU_HOTPLUG_SLOTS
        } else {
            GENERAL_SLOTS
        };
        let dev = match &self.iommu {
            Some(p) => {
                let mut platform = p.lock().unwrap_or_else(|e| e.into_inner());
                add_vfio_device(&cfg, &self.res, Some(&mut platform), slots)?
            }
            None => add_vfio_device(&cfg, &self.res, None, slots)?,
        };
        let addr = dev.addr;
        plugged.push(Plugged {
            cfg,
            dev,
            removing: false,
        });
        drop(plugged);
        self.events.plugged(slot_of(addr));
        self.ged.pci_hotplug().map_err(HotplugError::Notify)?;
        info!("vfio {name}: hotplugged at {addr}; the guest was notified");
        Ok((name, addr))
    }

    /// Asks the guest to eject the function `id`.
    pub fn request_removal(&self, id: &str) -> Result<(), HotplugError> {
        let addr = {
            let mut plugged = self.lock();
            let p = plugged
                .iter_mut()
                .find(|p| p.cfg.name() == id)
                .ok_or_else(|| HotplugError::UnknownId(id.into()))?;
            if p.removing {
                return Err(HotplugError::Removing(id.into()));
            }
            p.removing = true;
            p.dev.addr
        };
        self.events.unplug_requested(slot_of(addr));
        self.ged.pci_hotplug().map_err(HotplugError::Notify)?;
        info!("vfio {id}: the guest was asked to eject {addr}");
        Ok(())
    }

    /// The guest ejected `slot` (its `_EJ0`): tears its function down.
    /// A slot with no assigned function (an emulated device the guest
    /// ejected on its own) is left alone: only assigned functions can be
    /// removed.
    fn ejected(&self, slot: u8) {
        let taken = {
            let mut plugged = self.lock();
            plugged
                .iter()
                .position(|p| slot_of(p.dev.addr) == slot)
                .map(|i| plugged.remove(i))
        };
        let Some(p) = taken else {
            if !self.stray_eject.swap(true, Ordering::Relaxed) {
                warn!(
                    "PCI hotplug: the guest ejected slot {slot}, which has no assigned \
                     function (only assigned functions are removed; not logged again)"
                );
            }
            return;
        };
        let name = p.cfg.name();
        let addr = p.dev.addr;
        let device = match self.res.pci.remove_device(addr) {
            Ok(d) => d,
            Err(e) => {
                warn!("vfio {name}: unplugging {addr}: {e}");
                return;
            }
        };
        if p.cfg.iommu {
            if let Some(platform) = &self.iommu {
                let mut platform = platform.lock().unwrap_or_else(|e| e.into_inner());
                if let Err(e) = platform.remove_endpoint(addr, p.dev.mirror.clone()) {
                    warn!("vfio {name}: {e}");
                }
            }
        }
        if let Some(m) = &p.dev.mirror {
            m.log_stats();
        }
        // The last reference: interrupts, BAR slots, the device and its
        // container go now (a guest access still dispatched holds it until
        // it returns).
        drop(p);
        drop(device);
        info!("vfio {name}: removed from {addr} (ejected by the guest)");
    }

    /// The configurations of the assigned functions, in the order they
    /// were plugged (what `vm.info` and a reboot show).
    pub fn configs(&self) -> Vec<VfioConfig> {
        self.lock().iter().map(|p| p.cfg.clone()).collect()
    }

    /// The mirrors of functions behind the vIOMMU, by name (their
    /// counters in `vm.counters` and at exit).
    pub fn mirrors(&self) -> Vec<(String, Arc<VfioMirror>)> {
        self.lock()
            .iter()
            .filter_map(|p| p.dev.mirror.clone().map(|m| (p.cfg.name(), m)))
            .collect()
    }
}

/// The channel the hotplug registers send ejected slots on.
pub fn eject_channel() -> (SyncSender<u8>, Receiver<u8>) {
    sync_channel(EJECT_QUEUE)
}
