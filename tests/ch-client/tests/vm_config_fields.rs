//! `vm.create` bodies as the crates.io `cloud-hypervisor-client` (generated
//! from cloud-hypervisor's OpenAPI description) serialises them, checked
//! by dmavisor's own parser: every field at cloud-hypervisor's default is
//! accepted, and each field dmavisor lacks, set to anything else, is
//! refused with a message naming it. Here rather than in the vmm crate so
//! that its tests need not build the client's HTTP stack.

use cloud_hypervisor_client::models::{
    BalloonConfig, ConsoleConfig, ConsoleMode, CoreSchedulingMode, CpuFeatures, CpuTopology,
    CpusConfig, DeviceConfig, DiskConfig, FsConfig, ImageType, LockGranularity, MemoryConfig,
    NetConfig, PayloadConfig, PlatformConfig, RngConfig, SerialConfig, VmConfig, VsockConfig,
};
use vmm::api::vm_config::parse as parse_vm_config;

fn payload() -> PayloadConfig {
    PayloadConfig {
        kernel: Some("/k".into()),
        cmdline: Some("console=ttyS0".into()),
        ..PayloadConfig::new()
    }
}

fn parse(c: &VmConfig) -> Result<vmm::config::VmConfig, String> {
    let body = serde_json::to_vec(c).expect("serialisable");
    parse_vm_config(&body).map_err(|e| e.to_string())
}

/// Every field the client knows, each at cloud-hypervisor's default.
fn every_field_at_its_default() -> VmConfig {
    VmConfig {
        cpus: Some(CpusConfig {
            topology: None,
            kvm_hyperv: Some(false),
            max_phys_bits: Some(46),
            nested: Some(true),
            affinity: Some(vec![]),
            features: Some(CpuFeatures { amx: Some(false) }),
            core_scheduling: Some(CoreSchedulingMode::Vm),
            ..CpusConfig::new(2, 2)
        }),
        memory: Some(MemoryConfig {
            mergeable: Some(false),
            hotplug_method: Some("Acpi".into()),
            shared: Some(false),
            hugepages: Some(false),
            prefault: Some(false),
            thp: Some(true),
            zones: Some(vec![]),
            ..MemoryConfig::new(1 << 30)
        }),
        rate_limit_groups: Some(vec![]),
        disks: Some(vec![DiskConfig {
            path: Some("/d.raw".into()),
            readonly: Some(false),
            direct: Some(false),
            iommu: Some(false),
            num_queues: Some(1),
            queue_size: Some(128),
            vhost_user: Some(false),
            pci_segment: Some(0),
            backing_files: Some(false),
            sparse: Some(true),
            image_type: Some(ImageType::Raw),
            lock_granularity: Some(LockGranularity::ByteRange),
            ..DiskConfig::new()
        }]),
        net: Some(vec![NetConfig {
            tap: Some("tap0".into()),
            iommu: Some(false),
            num_queues: Some(2),
            queue_size: Some(256),
            vhost_user: Some(false),
            pci_segment: Some(0),
            offload_tso: Some(true),
            offload_ufo: Some(true),
            offload_csum: Some(true),
            ..NetConfig::new()
        }]),
        rng: Some(RngConfig {
            iommu: Some(false),
            ..RngConfig::new("/dev/urandom".into())
        }),
        fs: Some(vec![]),
        pmem: Some(vec![]),
        serial: Some(SerialConfig::new(ConsoleMode::Tty)),
        console: Some(ConsoleConfig {
            iommu: Some(false),
            ..ConsoleConfig::new(ConsoleMode::Off)
        }),
        devices: Some(vec![DeviceConfig {
            iommu: Some(false),
            pci_segment: Some(0),
            x_exclude_mmap_bars: Some(vec![]),
            ..DeviceConfig::new("/sys/bus/pci/devices/0000:00:03.0".into())
        }]),
        user_devices: Some(vec![]),
        vdpa: Some(vec![]),
        numa: Some(vec![]),
        iommu: Some(false),
        watchdog: Some(false),
        pvpanic: Some(false),
        pci_segments: Some(vec![]),
        platform: Some(PlatformConfig {
            num_pci_segments: Some(1),
            iommu_address_width_bits: Some(64),
            tdx: Some(false),
            sev_snp: Some(false),
            iommufd: Some(false),
            vfio_p2p_dma: Some(true),
            ..PlatformConfig::new()
        }),
        landlock_enable: Some(false),
        landlock_rules: Some(vec![]),
        ..VmConfig::new(payload())
    }
}

#[test]
fn a_client_body_with_defaults_parses() {
    let c = parse(&VmConfig::new(payload())).expect("the client's minimal body");
    assert_eq!(c.cpus.boot, 1);
    let c = parse(&every_field_at_its_default()).expect("every field at its default");
    assert_eq!((c.cpus.boot, c.memory.size), (2, 1 << 30));
    assert_eq!((c.net.len(), c.disks.len(), c.devices.len()), (1, 1, 1));
}

#[test]
fn each_unsupported_field_is_named() {
    type Change = fn(&mut VmConfig);
    let cases: &[(&str, Change)] = &[
        ("watchdog=true", |c| c.watchdog = Some(true)),
        ("pvpanic=true", |c| c.pvpanic = Some(true)),
        ("landlock_enable=true", |c| c.landlock_enable = Some(true)),
        ("rng.src=\"/dev/hwrng\"", |c| {
            c.rng = Some(RngConfig::new("/dev/hwrng".into()))
        }),
        ("balloon=", |c| {
            c.balloon = Some(BalloonConfig::new(1 << 20))
        }),
        ("vsock=", |c| {
            c.vsock = Some(VsockConfig::new(3, "/v".into()))
        }),
        ("fs=", |c| {
            c.fs = Some(vec![FsConfig::new("t".into(), "/s".into(), 1, 128)])
        }),
        ("cpus.topology=", |c| {
            if let Some(cpus) = c.cpus.as_mut() {
                cpus.topology = Some(CpuTopology {
                    threads_per_core: Some(2),
                    ..CpuTopology::new()
                });
            }
        }),
        ("cpus.kvm_hyperv=true", |c| {
            if let Some(cpus) = c.cpus.as_mut() {
                cpus.kvm_hyperv = Some(true);
            }
        }),
        ("memory.hugepages=true", |c| {
            if let Some(m) = c.memory.as_mut() {
                m.hugepages = Some(true);
            }
        }),
        ("memory.hotplug_size=", |c| {
            if let Some(m) = c.memory.as_mut() {
                m.hotplug_size = Some(1 << 30);
            }
        }),
        ("platform.tdx=true", |c| {
            if let Some(p) = c.platform.as_mut() {
                p.tdx = Some(true);
            }
        }),
        ("payload.firmware=", |c| {
            c.payload.firmware = Some("/fw".into())
        }),
        ("net[0].mtu=9000", |c| {
            if let Some(n) = c.net.as_mut().and_then(|n| n.first_mut()) {
                n.mtu = Some(9000);
            }
        }),
        ("net[0].offload_tso=false", |c| {
            if let Some(n) = c.net.as_mut().and_then(|n| n.first_mut()) {
                n.offload_tso = Some(false);
            }
        }),
        ("disks[0].serial=", |c| {
            if let Some(d) = c.disks.as_mut().and_then(|d| d.first_mut()) {
                d.serial = Some("S1".into());
            }
        }),
        ("disks[0].image_type=", |c| {
            if let Some(d) = c.disks.as_mut().and_then(|d| d.first_mut()) {
                d.image_type = Some(ImageType::Qcow2);
            }
        }),
        ("devices[0].x_exclude_mmap_bars=[0]", |c| {
            if let Some(d) = c.devices.as_mut().and_then(|d| d.first_mut()) {
                d.x_exclude_mmap_bars = Some(vec![0]);
            }
        }),
    ];
    for (names, change) in cases {
        let mut c = every_field_at_its_default();
        change(&mut c);
        let err = parse(&c).expect_err(names);
        assert!(
            err.contains(names) && err.ends_with("is not supported by dmavisor"),
            "{names}: {err}"
        );
    }
}
