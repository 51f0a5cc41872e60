//! [`VmOwner`]: the one value that owns a VM's guest memory, its KVM VM,
//! its vCPU threads and its device threads, and tears all of them down in
//! the process, so that `vm.shutdown`, `vm.delete`, a reboot in place and
//! a failed `vm.boot` give everything back without ending the VMM.
//!
//! WHY an explicit teardown rather than dropping the parts: the parts hold
//! each other (the port bus holds PCI bus 0 through the configuration
//! ports, and bus 0 holds the buses its BARs live on), device threads hold
//! guest memory, and a vCPU inside `KVM_RUN` would fault on unmapped RAM.
//! The order is the safety argument, the same one issue 27 makes for an
//! UNMAP: no consumer may touch memory that is going away, so every
//! consumer is stopped and joined first, and memory goes last.
//!
//! 1. vCPUs: told to stop, kicked out of `KVM_RUN`, joined. None can
//!    reach a device or guest RAM after this; one that does not stop in
//!    time ends the VMM (its memory is never unmapped under it).
//! 2. The serial port's input readers (stdin, pty master): stopped and
//!    joined. (The virtio-console's worker goes with step 4's reset.)
//! 3. Hotplugged functions (assigned and virtio): torn down as the guest's
//!    eject would, while the vIOMMU they sit behind still exists.
//! 4. Every PCI function but the vIOMMU, then the vIOMMU: unplugged and
//!    stopped ([`crate::pci::PciDevice::stop`], the device-reset path:
//!    virtio workers joined, vhost-user rings stopped with
//!    `GET_VRING_BASE`, the DMA test stream joined; VFIO functions are
//!    reset and their containers closed when dropped). Consumers go
//!    before the vIOMMU whose mappings they translate through.
//! 5. The buses are emptied (which cuts the bus/PCI cycle and drops the
//!    hotplug registers, ending the hotplug thread, which is joined).
//! 6. The KVM VM and then guest RAM are dropped; [`MemoryProbe`] says
//!    whether the RAM was really unmapped (nothing else held it).

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use kvm_ioctls::VmFd;
use log::{debug, error, info, warn};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};

use virtio_iommu::locks::Unpoison;

use crate::devices::bus::Bus;
use crate::devices::serial::StdinReader;
use crate::memory::GuestMemoryMmap;
use crate::pci::{PciRoot, SharedPciDevice};
use crate::resources::VmResources;
use crate::vcpu_control::VcpuControl;
use crate::vfio::hotplug::VfioHotplug;
use crate::virtio::iommu::IommuPlatform;

/// How long the vCPUs get to leave `KVM_RUN` (a vCPU handles one exit in
/// far less; nested TCG runners are slow, hence the margin).
pub const VCPU_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the hotplug thread gets to end once its channel is closed.
const HOTPLUG_JOIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How long guest RAM may stay referenced after the teardown before it is
/// reported: an API request that was answering about the VM (`vm.info`,
/// or the `vm.shutdown` that asked for this teardown) may hold the VM's
/// view, and its devices, for a moment.
const RELEASE_GRACE: Duration = Duration::from_millis(500);

/// PCI device id of a modern virtio-iommu (0x1040 + device type 23).
const VIRTIO_IOMMU_PCI_ID: u32 = 0x1040 + 23;
const VIRTIO_PCI_VENDOR: u32 = 0x1af4;

/// Weak references to guest RAM's regions: whether the memory was really
/// unmapped once the VM is gone (a region is unmapped when its last
/// reference drops).
pub struct MemoryProbe(Vec<Weak<vm_memory::GuestRegionMmap<()>>>);

impl MemoryProbe {
    /// Probes `mem`'s regions without holding them.
    pub fn of(mem: &GuestMemoryMmap) -> Self {
        let weak = mem
            .iter()
            .filter_map(|r| mem.remove_region(r.start_addr(), r.len()).ok())
            .map(|(_, region)| Arc::downgrade(&region))
            .collect();
        Self(weak)
    }

    /// Regions still mapped (something still holds them).
    pub fn live_regions(&self) -> usize {
        self.0.iter().filter(|w| w.strong_count() > 0).count()
    }

    /// Whether every region was unmapped.
    pub fn released(&self) -> bool {
        self.live_regions() == 0
    }
}

/// What a teardown stopped, for the log and for tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Teardown {
    /// vCPU threads joined.
    pub vcpus: usize,
    /// Hotplugged functions torn down.
    pub hotplugged: usize,
    /// PCI functions unplugged and stopped (hotplugged ones excepted).
    pub devices: usize,
    /// Guest RAM regions still mapped afterwards (0: all released).
    pub live_memory_regions: usize,
}

/// A VM's owner; see the module documentation. Parts are handed over as
/// the build makes them, so a build that fails at any step is torn down
/// (and its guest RAM released) by dropping the owner.
pub struct VmOwner {
    vcpus: Option<Arc<VcpuControl>>,
    stdin: Vec<StdinReader>,
    hotplug: Option<Arc<VfioHotplug>>,
    pci: Option<Arc<PciRoot>>,
    buses: Vec<Arc<Bus>>,
    iommu: Option<Arc<Mutex<IommuPlatform>>>,
    resources: Option<VmResources>,
    vm: Option<Arc<VmFd>>,
    mem: Option<GuestMemoryMmap>,
    probe: MemoryProbe,
    done: bool,
}

impl VmOwner {
    /// The owner of a VM whose guest RAM is `mem`.
    pub fn new(mem: GuestMemoryMmap) -> Self {
        Self {
            probe: MemoryProbe::of(&mem),
            vcpus: None,
            stdin: Vec::new(),
            hotplug: None,
            pci: None,
            buses: Vec::new(),
            iommu: None,
            resources: None,
            vm: None,
            mem: Some(mem),
            done: false,
        }
    }

    /// The KVM VM.
    pub fn own_vm(&mut self, vm: Arc<VmFd>) {
        self.vm = Some(vm);
    }

    /// The buses and PCI bus 0 (every device plugged on them).
    pub fn own_buses(&mut self, pio: Arc<Bus>, mmio: Arc<Bus>, pci: Arc<PciRoot>) {
        self.buses = vec![pio, mmio];
        self.pci = Some(pci);
    }

    /// The handles devices were plugged with.
    pub fn own_resources(&mut self, resources: VmResources) {
        self.resources = Some(resources);
    }

    /// The vIOMMU platform.
    pub fn own_iommu(&mut self, iommu: Option<Arc<Mutex<IommuPlatform>>>) {
        self.iommu = iommu;
    }

    /// The hotplug list and its thread.
    pub fn own_hotplug(&mut self, hotplug: Arc<VfioHotplug>) {
        self.hotplug = Some(hotplug);
    }

    /// The vCPU threads (registered on `control` as they start).
    pub fn own_vcpus(&mut self, control: Arc<VcpuControl>) {
        self.vcpus = Some(control);
    }

    /// A console input reader (stdin, or a pty master).
    pub fn own_stdin(&mut self, reader: StdinReader) {
        self.stdin.push(reader);
    }

    /// Tears the VM down in the order of the module documentation.
    pub fn teardown(mut self) -> Teardown {
        self.tear_down()
    }

    fn tear_down(&mut self) -> Teardown {
        if self.done {
            return Teardown::default();
        }
        self.done = true;
        let started = Instant::now();
        let mut report = Teardown::default();
        // 1. vCPUs.
        if let Some(control) = self.vcpus.take() {
            match control.stop(VCPU_STOP_TIMEOUT) {
                Ok(n) => report.vcpus = n,
                Err(e) => self.fail_closed(&e.to_string()),
            }
        }
        // 2. The stdin reader.
        for reader in self.stdin.drain(..) {
            reader.stop();
        }
        // 3. Hotplugged functions, behind a vIOMMU that still exists.
        if let Some(h) = &self.hotplug {
            report.hotplugged = h.shutdown();
        }
        // 4. Cold-plugged functions: consumers, then the vIOMMU.
        if let Some(pci) = &self.pci {
            report.devices = stop_devices(pci);
        }
        // 5. The buses, then the hotplug thread their registers fed.
        for bus in &self.buses {
            bus.clear();
        }
        if let Some(h) = self.hotplug.take() {
            h.join(HOTPLUG_JOIN_TIMEOUT);
        }
        // 6. Everything else, the KVM VM, and guest RAM last.
        self.buses.clear();
        self.pci = None;
        self.iommu = None;
        self.resources = None;
        self.vm = None;
        self.mem = None;
        let grace = Instant::now();
        while !self.probe.released() && grace.elapsed() < RELEASE_GRACE {
            std::thread::sleep(Duration::from_millis(5));
        }
        report.live_memory_regions = self.probe.live_regions();
        if report.live_memory_regions == 0 {
            info!(
                "VM torn down in {:?}: {} vCPU thread(s) joined, {} device(s) and {} \
                 hotplugged function(s) stopped, guest RAM released",
                started.elapsed(),
                report.vcpus,
                report.devices,
                report.hotplugged
            );
        } else {
            // Still mapped means still safe to touch: whoever holds it
            // (an API request answering about the old VM) lets go soon.
            warn!(
                "VM torn down in {:?}, but {} guest RAM region(s) are still referenced",
                started.elapsed(),
                report.live_memory_regions
            );
        }
        report
    }

    /// A vCPU that cannot be stopped may still be inside `KVM_RUN`, on
    /// guest RAM: nothing is freed, and the VMM ends with an error line
    /// (fail closed, as the DMA safety paths do).
    fn fail_closed(&mut self, why: &str) -> ! {
        error!("VM teardown: {why}");
        eprintln!(
            "dmavisor: error: the VM could not be torn down safely ({why}); \
             ending the VMM rather than unmapping guest RAM under a running vCPU"
        );
        std::mem::forget(self.mem.take());
        std::mem::forget(self.resources.take());
        std::mem::forget(self.vm.take());
        std::process::exit(1)
    }
}

impl Drop for VmOwner {
    /// A build that failed part-way, or a VM dropped without an explicit
    /// teardown, is torn down all the same.
    fn drop(&mut self) {
        if !self.done {
            let r = self.tear_down();
            debug!("VM owner dropped: {r:?}");
        }
    }
}

fn is_viommu(dev: &SharedPciDevice) -> bool {
    let id = dev.lock().unpoisoned().config().read_reg(0);
    id == (VIRTIO_IOMMU_PCI_ID << 16 | VIRTIO_PCI_VENDOR)
}

/// Unplugs and stops every function on `pci`, the vIOMMU last; returns
/// how many.
fn stop_devices(pci: &PciRoot) -> usize {
    let mut last = Vec::new();
    let mut n = 0;
    for (addr, dev) in pci.plugged() {
        if is_viommu(&dev) {
            last.push(addr);
            continue;
        }
        n += stop_device(pci, addr);
    }
    for addr in last {
        n += stop_device(pci, addr);
    }
    n
}

fn stop_device(pci: &PciRoot, addr: crate::pci::PciAddress) -> usize {
    match pci.remove_device(addr) {
        Ok(dev) => {
            dev.lock().unpoisoned().stop();
            1
        }
        Err(e) => {
            warn!("VM teardown: unplugging {addr}: {e}");
            0
        }
    }
}

#[cfg(test)]
#[path = "vm_owner_tests.rs"]
mod tests;
