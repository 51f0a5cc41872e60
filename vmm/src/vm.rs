//! Building the VM from a [`VmConfig`] and starting its vCPUs; the caller
//! waits on the exit channel for why it ends, and tears it down through
//! the [`VmOwner`] that the build filled.

use std::fs::OpenOptions;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kvm_bindings::{
    kvm_pit_config, kvm_userspace_memory_region, KVM_MAX_CPUID_ENTRIES, KVM_PIT_SPEAKER_DUMMY,
};
use kvm_ioctls::{Cap, Kvm, VmFd};
use log::{debug, info, warn};
use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use virtio_iommu::locks::Unpoison;

use crate::acpi::dsdt::{COM1_IRQ, COM1_PORT};
use crate::acpi::tables::create_acpi_tables_with;
use crate::acpi::AcpiConfig;
use crate::api::controller::Booted;
use crate::api::running_config::boot_ids;
use crate::api::vm_state::CounterSources;
use crate::api::vm_state::Lifecycle;
use crate::api::vm_state::VmState;
use crate::boot::bzimage::{build_zero_page, write_zero_page, ZeroPageParams};
use crate::boot::kernel::{load_cmdline, load_initramfs};
use crate::boot::pvh::write_start_info;
use crate::boot::regs::EntryMode;
use crate::boot::reset_vector;
use crate::boot::{load_kernel, BootProtocol};
use crate::config::{SerialConfig, VmConfig};
use crate::devices::bus::Bus;
use crate::devices::ged::{ged, GedTrigger, GED_IRQ, GED_PORT};
use crate::devices::pci_hotplug::{
    HotplugEvents, PciHotplugRegs, PCI_HOTPLUG_LEN, PCI_HOTPLUG_PORT,
};
use crate::devices::power::{
    I8042Reset, PowerDevice, I8042_COMMAND_PORT, POWER_PORT_BASE, POWER_PORT_COUNT,
};
use crate::devices::pty;
use crate::devices::pty::Pty;
use crate::devices::serial::{spawn_pty_reader, spawn_stdin_reader, uart_sink, SerialDevice};
use crate::devices::socket_console::SocketConsole;
use crate::error::{kvm_err, AcpiError, Error, StartError};
use crate::exit::{ExitEvent, ExitSender};
use crate::kvm_check::open_kvm;
use crate::memory::layout::{
    self, ACPI_START, KVM_IDENTITY_MAP_ADDRESS, KVM_TSS_ADDRESS, PCI_ECAM_SIZE, PCI_ECAM_START,
    PCI_IO_SIZE, PCI_IO_START, PCI_MMIO32_SIZE, PCI_MMIO32_START, ZERO_PAGE_START,
};
use crate::memory::{create_guest_memory, GuestMemoryMmap};
use crate::pci::config_access::{
    PciConfigIo, PciEcam, PCI_CONFIG_IO_PORT, PCI_CONFIG_IO_PORT_SIZE,
};
use crate::pci::root::GENERAL_SLOTS;
use crate::pci::{PciRoot, PciWindows};
use crate::resources::VmResources;
use crate::sandbox::{self, ThreadKind};
use crate::vcpu::{BootEntry, Vcpu};
use crate::vcpu_control::VcpuControl;
use crate::vfio::hotplug;
use crate::vfio::hotplug::VfioHotplug;
use crate::vhost_user::iotlb::BackendIotlb;
use crate::virtio::iommu::IommuPlatform;
use crate::vm_owner::VmOwner;
use crate::width::usize_from_u64;
use std::sync::mpsc::Receiver;

fn register_memory(vm: &VmFd, mem: &GuestMemoryMmap) -> Result<(), Error> {
    // RAM slots count from 0 as KVM's u32 slot numbers.
    for (slot, region) in (0..=u32::MAX).zip(mem.iter()) {
        let host = region
            .get_host_address(vm_memory::MemoryRegionAddress(0))
            .map_err(|e| Error::GuestMemory(Box::new(e)))?;
        let desc = kvm_userspace_memory_region {
            slot,
            flags: 0,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
        };
        // SAFETY: the region is a live mapping owned by `mem`; the VM's
        // owner (`crate::vm_owner`) stops every vCPU and device before it
        // drops the KVM VM, and drops guest RAM only after that.
        unsafe { vm.set_user_memory_region(desc) }
            .map_err(kvm_err("KVM_SET_USER_MEMORY_REGION"))?;
    }
    Ok(())
}

/// The power button's event register on the port bus, its interrupt on
/// [`GED_IRQ`], and the trigger the API presses it with.
fn add_power_button(vm: &VmFd, pio: &Bus) -> Result<GedTrigger, Error> {
    let irq = EventFd::new(libc::EFD_NONBLOCK).map_err(|source| Error::Os {
        what: "eventfd",
        source,
    })?;
    vm.register_irqfd(&irq, GED_IRQ)
        .map_err(kvm_err("KVM_IRQFD"))?;
    let (dev, trigger) = ged(irq);
    pio.insert(u64::from(GED_PORT), 1, Arc::new(Mutex::new(dev)))?;
    Ok(trigger)
}

/// Where COM1's output goes, the pty when it is one (its reader starts
/// with the vCPUs; its path goes to `vm.info`), and the socket when it is
/// one (its thread starts with the vCPUs).
type SerialOutput = (
    Option<Box<dyn Write + Send>>,
    Option<Pty>,
    Option<SocketConsole>,
);

fn serial_output(cfg: &SerialConfig) -> Result<SerialOutput, Error> {
    if let SerialConfig::Socket(path) = cfg {
        let socket = SocketConsole::bind(path, "serial").map_err(|e| Error::Device(Box::new(e)))?;
        let out: Box<dyn Write + Send> = Box::new(socket.writer());
        return Ok((Some(out), None, Some(socket)));
    }
    if let SerialConfig::Pty(_) = cfg {
        let os = |source| Error::Os {
            what: "serial pty",
            source,
        };
        let pty = pty::open().map_err(os)?;
        info!("serial: pty {}", pty.path().display());
        let out: Box<dyn Write + Send> = Box::new(pty.writer().map_err(os)?);
        return Ok((Some(out), Some(pty), None));
    }
    let out: Option<Box<dyn Write + Send>> = match cfg {
        SerialConfig::Off | SerialConfig::Pty(_) | SerialConfig::Socket(_) => None,
        SerialConfig::Tty => Some(Box::new(std::io::stdout())),
        SerialConfig::File(path) => Some(Box::new(
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|source| Error::SerialOutput {
                    path: path.clone(),
                    source,
                })?,
        )),
    };
    Ok((out, None, None))
}

/// Guest RAM with the kernel, its command line, initramfs and boot data
/// in place: what the first step leaves for the others.
struct GuestImage {
    mem: GuestMemoryMmap,
    windows: PciWindows,
    entry: u64,
    boot_mode: EntryMode,
    boot_data: u64,
}

/// Step 1, memory and boot: guest RAM, the kernel, command line,
/// initramfs, reset vector and boot data (zero page or PVH start info).
/// Runs before KVM is opened so that bad files are reported first. The
/// boot data points at the RSDP, which the ACPI step writes at
/// [`ACPI_START`] once every device is known.
fn load_memory_and_boot(config: &VmConfig) -> Result<GuestImage, Error> {
    let mem_size = config.memory.size;
    let mem = create_guest_memory(mem_size, config.memory.thp, config.memory.shared)?;

    let (mmio64_start, mmio64_size) = layout::pci_mmio64_window(mem_size);
    let windows = PciWindows {
        io: (PCI_IO_START, PCI_IO_SIZE),
        mmio32: (PCI_MMIO32_START, PCI_MMIO32_SIZE),
        mmio64: (mmio64_start, mmio64_size),
    };

    let kernel = load_kernel(&mem, &config.kernel)?;
    reset_vector::write_reset_vector(&mem)?;
    let rsdp = ACPI_START;
    let low_end = layout::low_ram_end(mem_size);
    let (boot_mode, boot_data) = match kernel.protocol {
        BootProtocol::Linux64 { header } => {
            let max_cmdline = (header.cmdline_size > 0).then_some(header.cmdline_size as usize);
            let cmdline_len = load_cmdline(&mem, &config.cmdline, max_cmdline)?;
            let initrd_max_end = low_end.min(u64::from(header.initrd_addr_max) + 1);
            let initramfs = match &config.initramfs {
                Some(p) => Some(load_initramfs(&mem, p, kernel.end, initrd_max_end)?),
                None => None,
            };
            let params = build_zero_page(
                &header,
                &ZeroPageParams {
                    cmdline_len,
                    initramfs,
                    mem_size,
                    rsdp,
                },
            )?;
            write_zero_page(&mem, &params)?;
            (EntryMode::Long64, ZERO_PAGE_START)
        }
        BootProtocol::Pvh => {
            load_cmdline(&mem, &config.cmdline, None)?;
            let initramfs = match &config.initramfs {
                Some(p) => Some(load_initramfs(&mem, p, kernel.end, low_end)?),
                None => None,
            };
            (
                EntryMode::Protected32,
                write_start_info(&mem, mem_size, initramfs, rsdp)?,
            )
        }
    };
    Ok(GuestImage {
        mem,
        windows,
        entry: kernel.entry,
        boot_mode,
        boot_data,
    })
}

/// The KVM VM: its vCPU count checked against the host's, the x86 setup
/// (TSS, identity map, irqchip, PIT) done and guest RAM registered.
fn create_kvm_vm(config: &VmConfig, mem: &GuestMemoryMmap) -> Result<(Kvm, Arc<VmFd>), Error> {
    let kvm = open_kvm()?;
    let max_vcpus = kvm.get_max_vcpus();
    if usize::from(config.cpus.boot) > max_vcpus {
        return Err(Error::InvalidOption {
            option: "cpus",
            value: format!("boot={}", config.cpus.boot),
            reason: format!("this host's KVM supports at most {max_vcpus} vCPUs").into(),
        });
    }
    if config.cpus.max > config.cpus.boot {
        warn!(
            "--cpus max={}: vCPU hotplug is not supported; the guest has boot={} vCPUs",
            config.cpus.max, config.cpus.boot
        );
    }
    let vm = Arc::new(kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?);
    vm.set_tss_address(usize_from_u64(KVM_TSS_ADDRESS))
        .map_err(kvm_err("KVM_SET_TSS_ADDR"))?;
    if let Err(e) = vm.set_identity_map_address(KVM_IDENTITY_MAP_ADDRESS) {
        debug!("KVM_SET_IDENTITY_MAP_ADDR: {e} (only needed on old Intel)");
    }
    vm.create_irq_chip()
        .map_err(kvm_err("KVM_CREATE_IRQCHIP"))?;
    vm.create_pit2(kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    })
    .map_err(kvm_err("KVM_CREATE_PIT2"))?;

    register_memory(&vm, mem)?;
    Ok((kvm, vm))
}

/// What the legacy-devices step put on the buses.
struct LegacyDevices {
    pio: Arc<Bus>,
    mmio: Arc<Bus>,
    pci: Arc<PciRoot>,
    serial: Option<Arc<Mutex<SerialDevice>>>,
    serial_pty: Option<Pty>,
    serial_socket: Option<SocketConsole>,
    power_button: GedTrigger,
    hotplug_events: Arc<HotplugEvents>,
    eject_rx: Receiver<u8>,
}

/// Step 2, legacy devices: the port and MMIO buses with COM1, the ACPI
/// power and reset ports, the i8042 reset line, the power button, the PCI
/// hotplug registers, and PCI bus 0 with its two configuration mechanisms.
fn add_legacy_devices(
    config: &VmConfig,
    vm: &VmFd,
    windows: PciWindows,
    exit_tx: &ExitSender,
) -> Result<LegacyDevices, Error> {
    let pio = Arc::new(Bus::new());
    let mmio = Arc::new(Bus::new());
    let device_err = Error::from;
    let (serial_out, serial_pty, serial_socket) = serial_output(&config.serial)?;
    let serial = match serial_out {
        Some(out) => {
            let irq = EventFd::new(libc::EFD_NONBLOCK).map_err(|source| Error::Os {
                what: "eventfd",
                source,
            })?;
            vm.register_irqfd(&irq, COM1_IRQ)
                .map_err(kvm_err("KVM_IRQFD"))?;
            let dev = Arc::new(Mutex::new(SerialDevice::new(irq, out)));
            pio.insert(u64::from(COM1_PORT), 8, dev.clone())
                .map_err(device_err)?;
            Some(dev)
        }
        None => None,
    };
    pio.insert(
        u64::from(POWER_PORT_BASE),
        u64::from(POWER_PORT_COUNT),
        Arc::new(Mutex::new(PowerDevice::new(exit_tx.clone()))),
    )
    .map_err(device_err)?;
    pio.insert(
        u64::from(I8042_COMMAND_PORT),
        1,
        Arc::new(Mutex::new(I8042Reset::new(exit_tx.clone()))),
    )
    .map_err(device_err)?;
    let power_button = add_power_button(vm, &pio)?;
    let hotplug_events = Arc::new(HotplugEvents::default());
    let (eject_tx, eject_rx) = hotplug::eject_channel();
    pio.insert(
        u64::from(PCI_HOTPLUG_PORT),
        u64::from(PCI_HOTPLUG_LEN),
        Arc::new(Mutex::new(PciHotplugRegs::new(
            hotplug_events.clone(),
            eject_tx,
        ))),
    )
    .map_err(device_err)?;
    let pci = Arc::new(PciRoot::new(mmio.clone(), pio.clone(), windows));
    pio.insert(
        PCI_CONFIG_IO_PORT,
        PCI_CONFIG_IO_PORT_SIZE,
        Arc::new(Mutex::new(PciConfigIo::new(pci.clone()))),
    )
    .map_err(device_err)?;
    mmio.insert(
        PCI_ECAM_START,
        PCI_ECAM_SIZE,
        Arc::new(Mutex::new(PciEcam::new(pci.clone()))),
    )
    .map_err(device_err)?;
    Ok(LegacyDevices {
        pio,
        mmio,
        pci,
        serial,
        serial_pty,
        serial_socket,
        power_button,
        hotplug_events,
        eject_rx,
    })
}

/// What the PCI-devices step plugged in.
struct PciDevices {
    iommu: Option<IommuPlatform>,
    net: crate::net_devices::NetDevices,
    assigned: Vec<(crate::vfio::VfioConfig, crate::vfio::AssignedDevice)>,
    /// The slave of the virtio-console's pty, for `vm.info`.
    console_pty: Option<std::path::PathBuf>,
}

/// Step 3, PCI devices: the vIOMMU first (devices with `iommu=on` become
/// its endpoints as they are plugged in), then `--net`, `--disk`,
/// `--dma-test` and `--device`.
fn add_pci_devices(config: &VmConfig, resources: &VmResources) -> Result<PciDevices, Error> {
    let mut iommu = match &config.iommu {
        Some(opts) => Some(IommuPlatform::create(
            opts,
            resources.vm.clone(),
            &resources.irq_router,
            &resources.pci,
            resources.mem.clone(),
        )?),
        None => None,
    };
    let net = crate::net_devices::add_net_devices(resources, &config.net, iommu.as_mut())?;
    crate::block::add_block_devices(resources, &config.disks, iommu.as_mut())?;
    for d in &config.dma_test {
        crate::dma_test::add_dma_test(d, &resources.pci, &resources.mem, iommu.as_mut())?;
    }
    let console_pty = crate::console::add_console(
        resources,
        &config.console,
        config.console_iommu,
        iommu.as_mut(),
    )?;
    let mut assigned = Vec::new();
    for d in &config.devices {
        assigned.push((
            d.clone(),
            crate::vfio::add_vfio_device(d, resources, iommu.as_mut(), GENERAL_SLOTS)?,
        ));
    }
    Ok(PciDevices {
        iommu,
        net,
        assigned,
        console_pty,
    })
}

/// Step 4, ACPI, once: every table, with the VIOT when there is a vIOMMU
/// (it names BDFs known only once the PCI devices are plugged in). The
/// RSDP lands at [`ACPI_START`], where step 1's boot data points.
fn write_acpi(
    config: &VmConfig,
    mem: &GuestMemoryMmap,
    windows: PciWindows,
    iommu: Option<&IommuPlatform>,
) -> Result<(), Error> {
    let extra: Vec<Vec<u8>> = iommu.map(|p| p.viot()).into_iter().collect();
    let rsdp = create_acpi_tables_with(
        mem,
        &AcpiConfig {
            num_vcpus: config.cpus.boot,
            pci_windows: windows,
        },
        &extra,
    )?;
    if rsdp != ACPI_START {
        return Err(AcpiError::RsdpMoved {
            rsdp,
            expected: ACPI_START,
        }
        .into());
    }
    Ok(())
}

/// Step 5, vCPUs: created on the buses and configured (CPUID, MSRs,
/// LAPIC); the boot vCPU gets the entry point and boot data. Not started.
fn create_vcpus(
    kvm: &Kvm,
    config: &VmConfig,
    resources: &VmResources,
    image: &GuestImage,
    vcpu_control: &Arc<VcpuControl>,
) -> Result<Vec<Vcpu>, Error> {
    let supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm_err("KVM_GET_SUPPORTED_CPUID"))?;
    let tsc_deadline = kvm.check_extension(Cap::TscDeadlineTimer);
    let mut vcpus = Vec::new();
    for index in 0..config.cpus.boot {
        let vcpu = Vcpu::new(
            &resources.vm,
            index,
            resources.pio.clone(),
            resources.mmio.clone(),
            resources.exit.clone(),
            vcpu_control.clone(),
        )?;
        let boot = (index == 0).then_some(BootEntry {
            mem: &image.mem,
            mode: image.boot_mode,
            entry: image.entry,
            boot_data: image.boot_data,
        });
        vcpu.configure(supported.as_slice(), config.cpus.boot, tsc_deadline, boot)?;
        vcpus.push(vcpu);
    }
    Ok(vcpus)
}

/// What the VM's end logs: the devices' DMA figures.
struct Figures {
    hotplug: Arc<VfioHotplug>,
    iotlbs: Vec<(String, Arc<BackendIotlb>)>,
    iommu: Option<Arc<virtio_iommu::device::IommuDevice>>,
}

impl Figures {
    fn log(&self) {
        for (_, m) in self.hotplug.mirrors() {
            m.log_stats();
        }
        for (name, iotlb) in &self.iotlbs {
            iotlb.log_stats(name);
        }
        if let Some(p) = &self.iommu {
            let c = p.request_counts();
            info!(
                "virtio-iommu: {} MAP, {} UNMAP, {} ATTACH, {} DETACH, {} PROBE, {} \
                 ATTACH_TABLE, {} INVALIDATE requests ({} failed, INVALIDATEs took {} us); \
                 {} invalidation batches ({} us), {} consumer calls",
                c.map,
                c.unmap,
                c.attach,
                c.detach,
                c.probe,
                c.attach_table,
                c.invalidate,
                c.failed,
                c.invalidate_ns / 1000,
                c.invalidation_batches,
                c.invalidation_ns / 1000,
                c.invalidator_calls
            );
        }
    }
}

/// Builds the VM described by `config` and starts its vCPUs; every reason
/// for it to end is sent on `exit_tx`. Returns without waiting for the
/// guest, so the REST API can boot a VM and go on answering.
///
/// The build is a sequence of named steps: memory and boot, the KVM VM,
/// legacy devices, PCI devices, ACPI (once), vCPUs; a failure says which
/// ([`StartError`]). Every part goes to a [`VmOwner`] as soon as it is
/// made: a failed step drops the owner, which tears down what was built
/// and releases guest RAM. The returned `finish` tears the VM down.
pub fn start(config: &VmConfig, exit_tx: ExitSender) -> Result<Booted, StartError> {
    let step = StartError::step;
    let started = Instant::now();
    // A device that cannot be assigned is the user's first problem.
    for d in &config.devices {
        crate::vfio::check_assignable(d).map_err(step(StartError::CheckDevices))?;
    }
    let loaded = load_memory_and_boot(config).map_err(step(StartError::MemoryAndBoot))?;
    let mut owner = VmOwner::new(loaded.mem.clone());
    // Bound after the owner, so that a failed step drops the image (and its
    // hold on guest RAM) before the owner checks that RAM is gone.
    let image = loaded;
    let (kvm, vm) = create_kvm_vm(config, &image.mem).map_err(step(StartError::KvmVm))?;
    owner.own_vm(vm.clone());
    let LegacyDevices {
        pio,
        mmio,
        pci,
        serial,
        serial_pty,
        mut serial_socket,
        power_button,
        hotplug_events,
        eject_rx,
    } = add_legacy_devices(config, &vm, image.windows, &exit_tx)
        .map_err(step(StartError::LegacyDevices))?;
    owner.own_buses(pio.clone(), mmio.clone(), pci.clone());
    let resources = VmResources {
        vm: vm.clone(),
        mem: image.mem.clone(),
        pio,
        mmio,
        pci,
        exit: exit_tx.clone(),
        irq_router: Arc::new(crate::interrupt::GsiRouter::new(vm.clone())),
    };
    owner.own_resources(resources.clone());
    let devices = add_pci_devices(config, &resources).map_err(step(StartError::PciDevices))?;
    write_acpi(config, &image.mem, image.windows, devices.iommu.as_ref())
        .map_err(step(StartError::Acpi))?;

    // From here on the vIOMMU is shared with the hotplug thread.
    let iommu = devices.iommu.map(|p| Arc::new(Mutex::new(p)));
    owner.own_iommu(iommu.clone());
    let iommu_device = iommu.as_ref().map(|p| p.lock().unpoisoned().device());
    let hotplug = VfioHotplug::start(
        resources.clone(),
        iommu.clone(),
        hotplug_events,
        power_button.clone(),
        devices.assigned,
        eject_rx,
    )
    .map_err(step(StartError::Hotplug))?;
    hotplug.reserve_ids(boot_ids(config));
    owner.own_hotplug(hotplug.clone());
    let vcpu_control = VcpuControl::new(usize::from(config.cpus.boot));
    owner.own_vcpus(vcpu_control.clone());
    let counters = CounterSources {
        iommu: iommu_device.clone(),
        vfio: Some(hotplug.clone()),
        vhost_user: devices.net.iotlbs.clone(),
    };
    let lifecycle = Lifecycle {
        control: vcpu_control.clone(),
        clock: Some(vm.clone()),
        power_button: Some(power_button),
        hotplug: Some(hotplug.clone()),
    };
    // `vm.info` shows the pty a client opens.
    let mut shown = config.clone();
    if let Some(pty) = &serial_pty {
        shown.serial = SerialConfig::Pty(Some(pty.path().to_path_buf()));
    }
    if let Some(path) = &devices.console_pty {
        shown.console = crate::config::ConsoleConfig::Pty(Some(path.clone()));
    }
    let api = Arc::new(VmState::new(&shown, counters, exit_tx.clone(), lifecycle));

    let vcpus = create_vcpus(&kvm, config, &resources, &image, &vcpu_control)
        .map_err(step(StartError::Vcpus))?;
    info!(
        "VM set up in {:?}: {} vCPU(s), {} MiB, entry {:#x} ({:?})",
        started.elapsed(),
        config.cpus.boot,
        config.memory.size >> 20,
        image.entry,
        image.boot_mode
    );

    if let (Some(dev), SerialConfig::Tty) = (&serial, &config.serial) {
        let reader = spawn_stdin_reader(dev.clone()).map_err(|source| {
            StartError::Threads(Box::new(Error::Os {
                what: "stdin thread",
                source,
            }))
        })?;
        owner.own_stdin(reader);
    }
    if let (Some(dev), Some(pty)) = (&serial, &serial_pty) {
        let reader = pty
            .reader()
            .and_then(|master| spawn_pty_reader(master, dev.clone()))
            .map_err(|source| {
                StartError::Threads(Box::new(Error::Os {
                    what: "serial pty thread",
                    source,
                }))
            })?;
        owner.own_stdin(reader);
    }
    if let (Some(dev), Some(socket)) = (&serial, &mut serial_socket) {
        socket
            .start("serial-socket", uart_sink(dev.clone()))
            .map_err(|e| StartError::Threads(Box::new(Error::Device(Box::new(e)))))?;
    }
    for vcpu in vcpus {
        let name = format!("vcpu{}", vcpu.index());
        let handle =
            sandbox::spawn(ThreadKind::Vcpu, name, move || vcpu.run()).map_err(|source| {
                StartError::Threads(Box::new(Error::Os {
                    what: "vCPU thread",
                    source,
                }))
            })?;
        vcpu_control.add_thread(handle);
    }
    drop(exit_tx);
    // Only the owner (and the API's view) hold the VM from here on.
    drop((resources, iommu, image, vm, kvm));

    let figures = Figures {
        hotplug,
        iotlbs: devices.net.iotlbs,
        iommu: iommu_device,
    };
    let finish = move |event: &ExitEvent| {
        if let Some(dev) = &serial {
            dev.lock().unpoisoned().flush();
        }
        info!(
            "{} after {:.3} s",
            event.describe(),
            started.elapsed().as_secs_f64()
        );
        figures.log();
        // What the figures held goes before the owner checks that guest
        // RAM was released.
        drop(figures);
        drop(serial);
        // Its thread stopped and its file removed with the VM.
        drop(serial_socket);
        owner.teardown();
    };
    Ok(Booted {
        api,
        finish: Box::new(finish),
    })
}
