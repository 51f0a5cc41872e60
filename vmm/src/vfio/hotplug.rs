//! Functions added and removed while the guest runs, through ACPI PCI
//! hotplug (`devices::pci_hotplug`, `acpi::pci_hotplug`): assigned ones
//! (`vm.add-device`) and virtio-net / virtio-blk devices (`vm.add-net`,
//! `vm.add-disk`, built by `crate::virtio_hotplug`), all removed with
//! `vm.remove-device`. [`VfioHotplug`] keeps every one of them: the VM
//! owns this list, and tearing the VM down tears them down with it.
//!
//! Bounds: ids are unique (an id in use is refused), bus 0 has 31 slots
//! (a hotplug past them is refused), and an id is at most
//! [`MAX_ID_LEN`] printable characters; nothing else grows per request.
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
//! thread. Only then is the function torn down: unplugged from the bus
//! (a virtio device stops there: its workers joined, its ioeventfds
//! gone), taken from behind the vIOMMU (an assigned function's mirror
//! deregistered), its interrupts and BAR slots released, its container
//! closed. All of it under the list's lock, which every add holds too:
//! no function can take the slot, or the vIOMMU endpoint of its BDF,
//! before the one leaving is stopped. A guest that never ejects keeps
//! the function, as on hardware.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use log::{info, warn};

use virtio_iommu::locks::Unpoison;

use super::hotplug_ids::{check_id, choose, made_up};
use super::{add_vfio_device, AssignedDevice, VfioConfig, VfioMirror};
use crate::block::DiskConfig;
use crate::devices::ged::GedTrigger;
use crate::devices::pci_hotplug::{HotplugEvents, EJECT_QUEUE};
use crate::error::Error;
use crate::net::passed_taps;
use crate::net::NetConfig;
use crate::pci::root::{GENERAL_SLOTS, IOMMU_HOTPLUG_SLOTS};
use crate::pci::{PciAddress, PciError};
use crate::resources::VmResources;
use crate::sandbox::{self, ThreadKind};
use crate::virtio::iommu::IommuPlatform;
use crate::virtio::pci::VirtioPciDevice;
use crate::virtio::plug::{plug_virtio_pci_in, PlugError};
use crate::virtio::VirtioDevice;

/// Longest id a hotplugged function may have.
pub const MAX_ID_LEN: usize = 64;

/// Why a hotplug request was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum HotplugError {
    /// A hotplugged function already has this id.
    #[error("a device with id {0} exists already")]
    DuplicateId(String),
    /// No hotplugged function has this id.
    #[error("no hotplugged device has id {0}")]
    UnknownId(String),
    /// The function is being removed already.
    #[error("device {0} is being removed already (waiting for the guest to eject it)")]
    Removing(String),
    /// The id is empty, too long or has control characters.
    #[error("id must be 1 to {MAX_ID_LEN} printable characters")]
    BadId,
    /// Every slot the function could take is in use.
    #[error("no free PCI slot for {0} (slots {1:?} are taken)")]
    NoSlot(String, Range<usize>),
    /// The request cannot be served as given (a passed descriptor that is
    /// no TAP, an image that cannot be opened, ...); the VM is unchanged.
    #[error("{0}")]
    Refused(String),
    /// Assigning or building the function failed; the VM is unchanged.
    #[error(transparent)]
    Assign(#[from] Error),
    /// The guest could not be told.
    #[error("raising the hotplug interrupt: {0}")]
    Notify(std::io::Error),
}

/// What a hotplugged virtio device was made from (`vm.info` lists it
/// under `net` or `disks`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VirtioConfig {
    /// `vm.add-net`.
    Net(NetConfig),
    /// `vm.add-disk`.
    Disk(DiskConfig),
}

impl VirtioConfig {
    /// `net` or `disk`: what made-up ids of this kind start with.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Net(_) => "net",
            Self::Disk(_) => "disk",
        }
    }

    fn iommu(&self) -> bool {
        match self {
            Self::Net(c) => c.iommu,
            Self::Disk(c) => c.iommu,
        }
    }

    /// Records the id the device goes by (`vm.info` lists it).
    pub fn set_id(&mut self, id: &str) {
        match self {
            Self::Net(c) => c.id = Some(id.to_string()),
            Self::Disk(c) => c.id = Some(id.to_string()),
        }
    }
}

/// What sits in a hotplugged slot.
enum Function {
    Assigned {
        cfg: VfioConfig,
        dev: AssignedDevice,
    },
    Virtio {
        cfg: VirtioConfig,
        /// Kept so the list, and so the VM, owns the device until the
        /// guest ejects it.
        _dev: Arc<Mutex<VirtioPciDevice>>,
    },
}

/// One hotplugged (or cold-plugged assigned) function.
struct Plugged {
    id: String,
    addr: PciAddress,
    function: Function,
    /// The guest was asked to eject it.
    removing: bool,
}

impl Plugged {
    fn iommu(&self) -> bool {
        match &self.function {
            Function::Assigned { cfg, .. } => cfg.iommu,
            Function::Virtio { cfg, .. } => cfg.iommu(),
        }
    }
}

/// The hotplugged functions of a running VM (and its cold-plugged
/// assigned ones, which can be removed too) and what adding or removing
/// one needs.
pub struct VfioHotplug {
    res: VmResources,
    iommu: Option<Arc<Mutex<IommuPlatform>>>,
    events: Arc<HotplugEvents>,
    ged: GedTrigger,
    plugged: Mutex<Vec<Plugged>>,
    /// Ids of the VM's other devices (`--net`, `--disk` at boot), which
    /// no hotplugged function may take ([`VfioHotplug::reserve_ids`]).
    reserved: Mutex<Vec<String>>,
    /// A guest ejected a slot with no hotplugged function (logged once: a
    /// guest can do it at will).
    stray_eject: AtomicBool,
    /// The eject thread, joined by the VM's teardown ([`VfioHotplug::join`]).
    thread: Mutex<Option<JoinHandle<()>>>,
}

fn slot_of(addr: PciAddress) -> u8 {
    addr.device
}

/// The slots a function may take: behind the vIOMMU only those the VIOT
/// named at boot.
fn slots_for(iommu: bool) -> Range<usize> {
    if iommu {
        IOMMU_HOTPLUG_SLOTS
    } else {
        GENERAL_SLOTS
    }
}

/// Whether `e` is bus 0 having no free slot for a virtio device.
fn is_no_slot(e: &Error) -> bool {
    match e {
        Error::Device(d) => d.downcast_ref::<PlugError>().is_some_and(|p| {
            matches!(
                p,
                PlugError::Pci {
                    source: PciError::NoFreeSlot,
                    ..
                }
            )
        }),
        _ => false,
    }
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
                    .map(|(mut cfg, dev)| {
                        // vm.info lists it by the id it can be removed by.
                        let id = cfg.name();
                        cfg.id = Some(id.clone());
                        Plugged {
                            id,
                            addr: dev.addr,
                            function: Function::Assigned { cfg, dev },
                            removing: false,
                        }
                    })
                    .collect(),
            ),
            reserved: Mutex::new(Vec::new()),
            stray_eject: AtomicBool::new(false),
            thread: Mutex::new(None),
        });
        let worker = Arc::downgrade(&me);
        let handle = sandbox::spawn(ThreadKind::Hotplug, "pci-hotplug", move || {
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
        *me.thread.lock().unpoisoned() = Some(handle);
        Ok(me)
    }

    /// The VM is being torn down (its vCPUs have stopped): every function
    /// of the list is torn down as the guest's eject would (unplugged and
    /// stopped, taken from behind the vIOMMU, its container, image or TAP
    /// closed), while guest memory is still mapped. Returns how many.
    pub fn shutdown(&self) -> usize {
        let slots: Vec<u8> = self.lock().iter().map(|p| slot_of(p.addr)).collect();
        for &slot in &slots {
            self.ejected(slot);
        }
        slots.len()
    }

    /// Joins the eject thread, which ends once the hotplug registers (its
    /// channel's sender) are gone with the VM's buses. Bounded: the thread
    /// holds no guest memory (only a weak reference to this list), so one
    /// that has not ended within `timeout` is left behind, with a warning.
    pub fn join(&self, timeout: std::time::Duration) -> bool {
        let Some(handle) = self.thread.lock().unpoisoned().take() else {
            return true;
        };
        let t0 = std::time::Instant::now();
        while !handle.is_finished() {
            if t0.elapsed() >= timeout {
                warn!("the PCI hotplug thread still runs after {timeout:?}; left behind");
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        if handle.join().is_err() {
            warn!("the PCI hotplug thread panicked");
        }
        true
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Plugged>> {
        self.plugged.lock().unpoisoned()
    }

    /// Keeps hotplugged functions off `ids`, those of the VM's boot-time
    /// devices (see `super::hotplug_ids`).
    pub fn reserve_ids(&self, ids: impl IntoIterator<Item = String>) {
        self.reserved.lock().unpoisoned().extend(ids);
    }

    /// Whether a function of the list (`plugged`, its lock held) or a
    /// boot-time device goes by `id`.
    fn taken(&self, plugged: &[Plugged], id: &str) -> bool {
        plugged.iter().any(|p| p.id == id)
            || self.reserved.lock().unpoisoned().iter().any(|r| r == id)
    }

    /// The first made-up id of `kind` (`net`, `disk`) no device uses now:
    /// a disk gets its id before it is built, since it is its serial.
    pub fn free_id(&self, kind: &str) -> Result<String, HotplugError> {
        let plugged = self.lock();
        made_up(kind, |id| self.taken(&plugged, id))
    }

    /// Tells the guest slot `addr` gained a function.
    fn announce(&self, addr: PciAddress) -> Result<(), HotplugError> {
        self.events.plugged(slot_of(addr));
        self.ged.pci_hotplug().map_err(HotplugError::Notify)
    }

    /// Assigns `cfg` and tells the guest; returns the id and address.
    pub fn add(&self, mut cfg: VfioConfig) -> Result<(String, PciAddress), HotplugError> {
        let name = cfg.name();
        check_id(&name)?;
        // Held across the assignment: two requests for one id cannot both
        // pass the check, and no eject tears down a slot meanwhile.
        let mut plugged = self.lock();
        if self.taken(&plugged, &name) {
            return Err(HotplugError::DuplicateId(name));
        }
        cfg.id = Some(name.clone());
        super::check_assignable(&cfg)?;
        let slots = slots_for(cfg.iommu);
        let dev = match &self.iommu {
            Some(p) => {
                let mut platform = p.lock().unpoisoned();
                add_vfio_device(&cfg, &self.res, Some(&mut platform), slots)?
            }
            None => add_vfio_device(&cfg, &self.res, None, slots)?,
        };
        let addr = dev.addr;
        plugged.push(Plugged {
            id: name.clone(),
            addr,
            function: Function::Assigned { cfg, dev },
            removing: false,
        });
        drop(plugged);
        self.announce(addr)?;
        info!("vfio {name}: hotplugged at {addr}; the guest was notified");
        let bdf = format!("0000:{addr}");
        crate::event_monitor::emit("vm", "device-added", &[("id", &name), ("bdf", &bdf)]);
        Ok((name, addr))
    }

    /// Plugs `device`, made from `cfg`, into a free slot (one the VIOT
    /// named, behind the vIOMMU) and tells the guest; returns its id
    /// (`id`, or `_net<N>` / `_disk<N>`, the first unused) and address.
    /// A refused device is dropped: what it opened (TAP, image) closes.
    pub fn add_virtio(
        &self,
        id: Option<String>,
        mut cfg: VirtioConfig,
        device: Box<dyn VirtioDevice>,
    ) -> Result<(String, PciAddress), HotplugError> {
        let mut plugged = self.lock();
        let id = choose(id, cfg.kind(), |c| self.taken(&plugged, c))?;
        cfg.set_id(&id);
        let iommu = cfg.iommu();
        if iommu && self.iommu.is_none() {
            return Err(HotplugError::Refused(format!(
                "{id}: iommu is true, but the VM has no vIOMMU (--iommu)"
            )));
        }
        let slots = slots_for(iommu);
        let what = format!("hotplugged virtio-{} {id}", cfg.kind());
        let option = cfg.kind();
        let plug = |platform: Option<&mut IommuPlatform>| {
            plug_virtio_pci_in(
                &self.res,
                device,
                &what,
                iommu,
                option,
                platform,
                slots.clone(),
            )
        };
        let result = match (&self.iommu, iommu) {
            (Some(p), true) => plug(Some(&mut p.lock().unpoisoned())),
            _ => plug(None),
        };
        let done = match result {
            Ok(done) => done,
            Err(e) if is_no_slot(&e) => return Err(HotplugError::NoSlot(id, slots)),
            Err(e) => return Err(e.into()),
        };
        let addr = done.bdf;
        plugged.push(Plugged {
            id: id.clone(),
            addr,
            function: Function::Virtio {
                cfg,
                _dev: done.dev,
            },
            removing: false,
        });
        drop(plugged);
        self.announce(addr)?;
        info!("{what}: at {addr}; the guest was notified");
        let bdf = format!("0000:{addr}");
        crate::event_monitor::emit("vm", "device-added", &[("id", &id), ("bdf", &bdf)]);
        Ok((id, addr))
    }

    /// Asks the guest to eject the function `id`.
    pub fn request_removal(&self, id: &str) -> Result<(), HotplugError> {
        let addr = {
            let mut plugged = self.lock();
            let p = plugged
                .iter_mut()
                .find(|p| p.id == id)
                .ok_or_else(|| HotplugError::UnknownId(id.into()))?;
            if p.removing {
                return Err(HotplugError::Removing(id.into()));
            }
            p.removing = true;
            p.addr
        };
        self.events.unplug_requested(slot_of(addr));
        self.ged.pci_hotplug().map_err(HotplugError::Notify)?;
        info!("{id}: the guest was asked to eject {addr}");
        Ok(())
    }

    /// The guest ejected `slot` (its `_EJ0`): tears its function down,
    /// under the list's lock (see the module documentation). A slot with
    /// no function of this list (a cold-plugged emulated device the guest
    /// ejected on its own) is left alone.
    fn ejected(&self, slot: u8) {
        let mut plugged = self.lock();
        let Some(i) = plugged.iter().position(|p| slot_of(p.addr) == slot) else {
            drop(plugged);
            if !self.stray_eject.swap(true, Ordering::Relaxed) {
                warn!(
                    "PCI hotplug: the guest ejected slot {slot}, which has no hotplugged \
                     function (only those are removed; not logged again)"
                );
            }
            return;
        };
        let p = plugged.remove(i);
        let id = p.id.clone();
        let addr = p.addr;
        // Off the bus: a virtio device stops here (`unplugged`), before
        // its slot and BAR ranges are free for the next function.
        let device = match self.res.pci.remove_device(addr) {
            Ok(d) => d,
            Err(e) => {
                warn!("{id}: unplugging {addr}: {e}");
                return;
            }
        };
        if p.iommu() {
            if let Some(platform) = &self.iommu {
                let mut platform = platform.lock().unpoisoned();
                let mirror = match &p.function {
                    Function::Assigned { dev, .. } => dev.mirror.clone(),
                    Function::Virtio { .. } => None,
                };
                if let Err(e) = platform.remove_endpoint(addr, mirror) {
                    warn!("{id}: {e}");
                }
            }
        }
        if let Function::Assigned { dev, .. } = &p.function {
            if let Some(m) = &dev.mirror {
                m.log_stats();
            }
        }
        // TAP queues a client passed for this NIC end with it.
        if let Function::Virtio {
            cfg: VirtioConfig::Net(n),
            ..
        } = &p.function
        {
            passed_taps::forget(&n.tap);
        }
        // The last reference: interrupts, BAR slots, the device and its
        // container (or image, or TAP) go now (a guest access still
        // dispatched holds it until it returns; an unplugged virtio
        // device never starts again).
        drop(p);
        drop(device);
        drop(plugged);
        info!("{id}: removed from {addr} (ejected by the guest)");
        let bdf = format!("0000:{addr}");
        crate::event_monitor::emit("vm", "device-removed", &[("id", &id), ("bdf", &bdf)]);
    }

    /// The configurations of the assigned functions, in the order they
    /// were plugged, each with its id (what `vm.info` and a reboot show).
    pub fn configs(&self) -> Vec<VfioConfig> {
        self.lock()
            .iter()
            .filter_map(|p| match &p.function {
                Function::Assigned { cfg, .. } => Some(cfg.clone()),
                Function::Virtio { .. } => None,
            })
            .collect()
    }

    /// The hotplugged virtio devices' ids and configurations (which carry
    /// the id too), in the order they were plugged (`vm.info` lists them
    /// under `net` and `disks`).
    pub fn virtio_configs(&self) -> Vec<(String, VirtioConfig)> {
        self.lock()
            .iter()
            .filter_map(|p| match &p.function {
                Function::Virtio { cfg, .. } => Some((p.id.clone(), cfg.clone())),
                Function::Assigned { .. } => None,
            })
            .collect()
    }

    /// The mirrors of functions behind the vIOMMU, by name (their
    /// counters in `vm.counters` and at exit).
    pub fn mirrors(&self) -> Vec<(String, Arc<VfioMirror>)> {
        self.lock()
            .iter()
            .filter_map(|p| match &p.function {
                Function::Assigned { dev, .. } => dev.mirror.clone().map(|m| (p.id.clone(), m)),
                Function::Virtio { .. } => None,
            })
            .collect()
    }
}

/// The channel the hotplug registers send ejected slots on.
pub fn eject_channel() -> (SyncSender<u8>, Receiver<u8>) {
    sync_channel(EJECT_QUEUE)
}
