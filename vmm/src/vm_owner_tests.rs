//! The VM owner's teardown without KVM: fake vCPU threads on the real
//! [`VcpuControl`], fake PCI functions with a worker thread each on a real
//! PCI bus 0 and real buses (the configuration ports make the bus/PCI
//! cycle of a real VM), and real guest RAM.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use vm_memory::{Bytes, GuestAddress};

use super::*;
use crate::memory::create_guest_memory;
use crate::pci::config_access::{PciConfigIo, PCI_CONFIG_IO_PORT, PCI_CONFIG_IO_PORT_SIZE};
use crate::pci::{PciConfiguration, PciDevice, PciHeader, PciWindows};

/// A PCI function whose worker thread reads guest RAM until stopped, as a
/// virtio queue worker does; `stops` records the order functions stop in.
struct FakeDevice {
    config: PciConfiguration,
    name: &'static str,
    quit: Arc<AtomicBool>,
    worker: Option<JoinHandle<()>>,
    stops: Arc<Mutex<Vec<&'static str>>>,
}

impl FakeDevice {
    fn new(
        name: &'static str,
        device_id: u16,
        mem: GuestMemoryMmap,
        token: Arc<()>,
        stops: Arc<Mutex<Vec<&'static str>>>,
    ) -> Arc<Mutex<Self>> {
        let quit = Arc::new(AtomicBool::new(false));
        let q = quit.clone();
        let worker = thread::spawn(move || {
            let _token = token;
            while !q.load(Ordering::Relaxed) {
                let _: u64 = mem
                    .read_obj(GuestAddress(0x1000))
                    .expect("guest RAM mapped");
                thread::sleep(Duration::from_millis(1));
            }
        });
        Arc::new(Mutex::new(Self {
            config: PciConfiguration::new(PciHeader {
                vendor_id: 0x1af4,
                device_id,
                class: 0xff,
                subclass: 0,
                prog_if: 0,
                revision: 1,
                subsystem_vendor_id: 0,
                subsystem_id: 0,
                interrupt_pin: 0,
            }),
            name,
            quit,
            worker: Some(worker),
            stops,
        }))
    }
}

impl PciDevice for FakeDevice {
    fn config(&self) -> &PciConfiguration {
        &self.config
    }
    fn config_mut(&mut self) -> &mut PciConfiguration {
        &mut self.config
    }
    fn read_bar(&mut self, _bar: usize, _offset: u64, _data: &mut [u8]) {}
    fn write_bar(&mut self, _bar: usize, _offset: u64, _data: &[u8]) {}
    fn stop(&mut self) {
        self.quit.store(true, Ordering::Relaxed);
        if let Some(w) = self.worker.take() {
            w.join().expect("worker");
        }
        self.stops.lock().unwrap().push(self.name);
    }
}

/// A fake vCPU: runs until its checkpoint says the VM is torn down,
/// touching guest RAM as a vCPU in KVM_RUN would.
fn fake_vcpu(ctl: &Arc<VcpuControl>, mem: GuestMemoryMmap, token: Arc<()>) -> JoinHandle<()> {
    let ctl = ctl.clone();
    thread::spawn(move || {
        let _token = token;
        let _running = ctl.running_guard();
        while ctl.checkpoint() {
            let _: u64 = mem.read_obj(GuestAddress(0)).expect("guest RAM mapped");
            thread::sleep(Duration::from_millis(1));
        }
    })
}

struct Vm {
    owner: VmOwner,
    probe: MemoryProbe,
    token: Arc<()>,
    pci: Weak<PciRoot>,
    stops: Arc<Mutex<Vec<&'static str>>>,
}

/// A VM with `vcpus` running fake vCPUs, a consumer function in slot 1 and
/// a fake vIOMMU in slot 2 (plugged before it would be in a real VM the
/// other way round: the order of teardown must not follow the slots).
fn vm(vcpus: usize) -> Vm {
    let mem = create_guest_memory(4 << 20, false, false).expect("guest RAM");
    let probe = MemoryProbe::of(&mem);
    assert!(!probe.released());
    let mut owner = VmOwner::new(mem.clone());
    let pio = Arc::new(Bus::new());
    let mmio = Arc::new(Bus::new());
    let pci = Arc::new(PciRoot::new(
        mmio.clone(),
        pio.clone(),
        PciWindows {
            io: (0x1000, 0xf000),
            mmio32: (0xc000_0000, 0x2000_0000),
            mmio64: (0x1_0000_0000, 0x4_0000_0000),
        },
    ));
    // The cycle every real VM has: the port bus holds bus 0.
    pio.insert(
        PCI_CONFIG_IO_PORT,
        PCI_CONFIG_IO_PORT_SIZE,
        Arc::new(Mutex::new(PciConfigIo::new(pci.clone()))),
    )
    .expect("config ports");
    let token = Arc::new(());
    let stops = Arc::new(Mutex::new(Vec::new()));
    let iommu = FakeDevice::new(
        "viommu",
        u16::try_from(VIRTIO_IOMMU_PCI_ID).unwrap(),
        mem.clone(),
        token.clone(),
        stops.clone(),
    );
    let net = FakeDevice::new("net", 0x1041, mem.clone(), token.clone(), stops.clone());
    pci.add_device(iommu).expect("slot");
    pci.add_device(net).expect("slot");
    owner.own_buses(pio, mmio, pci.clone());
    let control = VcpuControl::new(vcpus);
    for _ in 0..vcpus {
        control.add_thread(fake_vcpu(&control, mem.clone(), token.clone()));
    }
    owner.own_vcpus(control);
    Vm {
        owner,
        probe,
        token,
        pci: Arc::downgrade(&pci),
        stops,
    }
}

#[test]
fn teardown_joins_every_thread_then_releases_guest_ram() {
    let v = vm(2);
    // 2 vCPUs and 2 device workers hold the token, and guest RAM.
    assert_eq!(Arc::strong_count(&v.token), 5);
    let report = v.owner.teardown();
    assert_eq!(report.vcpus, 2, "{report:?}");
    assert_eq!(report.devices, 2, "{report:?}");
    assert_eq!(report.live_memory_regions, 0, "{report:?}");
    assert_eq!(Arc::strong_count(&v.token), 1, "a thread still runs");
    assert!(v.probe.released(), "guest RAM still mapped");
    // Consumers before the vIOMMU, whatever their slots.
    assert_eq!(*v.stops.lock().unwrap(), vec!["net", "viommu"]);
    // The bus/PCI cycle was cut: bus 0 itself is gone.
    assert!(v.pci.upgrade().is_none(), "PCI bus 0 leaked");
}

#[test]
fn a_paused_vm_is_torn_down_too() {
    let v = vm(3);
    // Paused: every vCPU parked in its checkpoint.
    let control = v.owner.vcpus.clone().expect("vCPUs");
    control.pause(Duration::from_secs(5)).expect("pause");
    let report = v.owner.teardown();
    assert_eq!(report.vcpus, 3);
    assert_eq!(Arc::strong_count(&v.token), 1);
    assert!(v.probe.released());
}

#[test]
fn dropping_a_half_built_vm_releases_its_ram() {
    // What a failed vm.boot leaves: the owner of the steps done so far,
    // dropped with the error.
    let v = vm(1);
    let (probe, token, pci) = (v.probe, v.token, v.pci);
    drop(v.owner);
    assert_eq!(Arc::strong_count(&token), 1);
    assert!(probe.released(), "a failed boot kept guest RAM");
    assert!(pci.upgrade().is_none());
    // Memory alone (the build failed before KVM): released as well.
    let mem = create_guest_memory(2 << 20, false, false).expect("guest RAM");
    let probe = MemoryProbe::of(&mem);
    drop(VmOwner::new(mem));
    assert!(probe.released());
}

#[test]
fn ram_still_held_elsewhere_is_reported() {
    let mem = create_guest_memory(2 << 20, false, false).expect("guest RAM");
    let held = mem.clone();
    let report = VmOwner::new(mem).teardown();
    assert_eq!(report.live_memory_regions, held.num_regions());
    drop(held);
}
