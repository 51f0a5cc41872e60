//! The running VM as the REST API sees it: a configuration snapshot in
//! cloud-hypervisor's `VmConfig` shape, the devices' counters, and the
//! exit channel that `shutdown` uses.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use virtio_iommu::device::IommuDevice;

use super::routes::VmApi;
use crate::config::{SerialConfig, VmConfig};
use crate::exit::{ExitEvent, ExitSender};
use crate::vfio::VfioMirror;
use crate::vhost_user::iotlb::BackendIotlb;

/// Name of the vIOMMU's entry in `vm.counters`.
pub const IOMMU_COUNTERS: &str = "iommu";

/// The devices that count their DMA work, as `vm.counters` reports them.
#[derive(Default)]
pub struct CounterSources {
    /// The vIOMMU's device model (requests and invalidation batches).
    pub iommu: Option<Arc<IommuDevice>>,
    /// Assigned functions behind the vIOMMU, by name.
    pub vfio: Vec<(String, Arc<VfioMirror>)>,
    /// vhost-user back-ends behind the vIOMMU (their IOTLBs), by name.
    pub vhost_user: Vec<(String, Arc<BackendIotlb>)>,
}

/// What the API reads of a running VM.
pub struct VmState {
    config: Value,
    memory: u64,
    counters: CounterSources,
    exit: ExitSender,
}

impl VmState {
    /// The state of the VM built from `config`.
    pub fn new(config: &VmConfig, counters: CounterSources, exit: ExitSender) -> Self {
        Self {
            config: config_json(config),
            memory: config.memory.size,
            counters,
            exit,
        }
    }
}

/// `config` in the shape of cloud-hypervisor's `VmConfig` (the fields
/// dmavisor has).
pub fn config_json(c: &VmConfig) -> Value {
    let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
    let serial = match &c.serial {
        SerialConfig::Tty => json!({ "mode": "Tty" }),
        SerialConfig::File(p) => json!({ "mode": "File", "file": path(p) }),
        SerialConfig::Off => json!({ "mode": "Off" }),
    };
    let net: Vec<Value> = c
        .net
        .iter()
        .map(|n| {
            let mac = n.mac.map(|b| format!("{b:02x}")).join(":");
            json!({
                "tap": n.tap,
                "mac": mac,
                "ip": n.ip.map(|a| a.to_string()),
                "mask": n.mask.map(|a| a.to_string()),
                "num_queues": n.num_queues,
                "queue_size": n.queue_size,
                "iommu": n.iommu,
                "vhost_user": n.vhost_user_socket.is_some(),
                "vhost_socket": n.vhost_user_socket.as_deref().map(path),
            })
        })
        .collect();
    let disks: Vec<Value> = c
        .disks
        .iter()
        .map(|d| {
            json!({
                "path": path(&d.path),
                "readonly": d.readonly,
                "direct": false,
                "iommu": d.iommu,
                "num_queues": d.num_queues,
                "queue_size": d.queue_size,
                "vhost_user": false,
                "vhost_socket": Value::Null,
                "id": d.id,
                "pci_segment": 0,
            })
        })
        .collect();
    let devices: Vec<Value> = c
        .devices
        .iter()
        .map(|d| json!({ "id": d.name(), "path": path(&d.path), "iommu": d.iommu }))
        .collect();
    json!({
        "cpus": { "boot_vcpus": c.cpus.boot, "max_vcpus": c.cpus.max },
        "memory": { "size": c.memory.size, "thp": c.memory.thp, "shared": c.memory.shared },
        "payload": {
            "kernel": path(&c.kernel),
            "initramfs": c.initramfs.as_deref().map(path),
            "cmdline": c.cmdline,
        },
        "serial": serial,
        "net": net,
        "disks": disks,
        "devices": devices,
        "iommu": c.iommu.is_some(),
    })
}

impl VmApi for VmState {
    fn config(&self) -> Value {
        self.config.clone()
    }

    fn memory_actual_size(&self) -> u64 {
        self.memory
    }

    /// cloud-hypervisor's shape: `{ device: { counter: value } }`.
    fn counters(&self) -> Value {
        let mut out = Map::new();
        if let Some(iommu) = &self.counters.iommu {
            let c = iommu.request_counts();
            out.insert(
                IOMMU_COUNTERS.into(),
                json!({
                    "attach_requests": c.attach,
                    "detach_requests": c.detach,
                    "map_requests": c.map,
                    "unmap_requests": c.unmap,
                    "probe_requests": c.probe,
                    "failed_requests": c.failed,
                    "invalidation_batches": c.invalidation_batches,
                    "invalidator_calls": c.invalidator_calls,
                }),
            );
        }
        for (name, m) in &self.counters.vfio {
            let s = &m.stats;
            out.insert(
                name.clone(),
                json!({
                    "vfio_map_calls": s.map_calls.load(Ordering::Relaxed),
                    "vfio_unmap_calls": s.unmap_calls.load(Ordering::Relaxed),
                    "vfio_pages_mapped": s.pages_mapped.load(Ordering::Relaxed),
                    "invalidated_ranges": s.ranges.load(Ordering::Relaxed),
                }),
            );
        }
        for (name, iotlb) in &self.counters.vhost_user {
            let s = &iotlb.stats;
            out.insert(
                name.clone(),
                json!({
                    "iotlb_misses": s.misses.load(Ordering::Relaxed),
                    "iotlb_misses_refused": s.refused.load(Ordering::Relaxed),
                    "iotlb_invalidations": s.invalidations.load(Ordering::Relaxed),
                    "invalidated_ranges": s.ranges.load(Ordering::Relaxed),
                }),
            );
        }
        Value::Object(out)
    }

    fn shutdown(&self) {
        // The main thread may already be gone with another reason.
        let _ = self.exit.send(ExitEvent::ApiShutdown);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;

    #[test]
    fn config_has_cloud_hypervisor_field_names() {
        let cli = Cli::try_parse_from([
            "dmavisor",
            "--kernel",
            "/k",
            "--cpus",
            "boot=2,max=4",
            "--memory",
            "size=1G",
            "--serial",
            "off",
            "--net",
            "tap=t0,mac=52:54:00:00:00:01,num_queues=2,iommu=on",
            "--iommu",
            "--disk",
            "path=/img/d.raw,readonly=on,num_queues=2,id=disk0",
        ])
        .expect("command line");
        let c = config_json(&cli.to_config().expect("config"));
        assert_eq!(c["cpus"]["boot_vcpus"], json!(2));
        assert_eq!(c["cpus"]["max_vcpus"], json!(4));
        assert_eq!(c["memory"]["size"], json!(1u64 << 30));
        assert_eq!(c["payload"]["kernel"], json!("/k"));
        assert_eq!(c["payload"]["initramfs"], Value::Null);
        assert_eq!(c["serial"]["mode"], json!("Off"));
        assert_eq!(c["net"][0]["mac"], json!("52:54:00:00:00:01"));
        assert_eq!(c["net"][0]["iommu"], json!(true));
        assert_eq!(c["iommu"], json!(true));
        assert_eq!(c["disks"][0]["path"], json!("/img/d.raw"));
        assert_eq!(c["disks"][0]["readonly"], json!(true));
        assert_eq!(c["disks"][0]["iommu"], json!(false));
        assert_eq!(c["disks"][0]["num_queues"], json!(2));
        assert_eq!(c["disks"][0]["queue_size"], json!(128));
        assert_eq!(c["disks"][0]["id"], json!("disk0"));
    }

    #[test]
    fn counters_report_the_viommu_requests() {
        use virtio_iommu::device::IommuConfig;
        use virtio_iommu::wire::{AttachReq, Request};
        let iommu = Arc::new(IommuDevice::new(IommuConfig::default()).expect("device"));
        iommu.add_endpoint(8).expect("endpoint");
        iommu.ack_features(iommu.device_features());
        let mut w = iommu.new_worker();
        let attach = Request::Attach(AttachReq {
            domain: 1,
            endpoint: 8,
            flags: 0,
            reserved: [0; 4],
        })
        .encode();
        let mut tail = [0u8; 4];
        for _ in 0..2 {
            iommu.handle_request(&mut w, &attach, &mut tail);
        }
        iommu.complete_kick(&mut w);
        let (tx, _rx) = std::sync::mpsc::channel();
        let cli = Cli::try_parse_from(["dmavisor", "--kernel", "/k"]).expect("command line");
        let sources = CounterSources {
            iommu: Some(iommu),
            ..CounterSources::default()
        };
        let s = VmState::new(&cli.to_config().expect("config"), sources, tx);
        let c = s.counters();
        assert_eq!(c[IOMMU_COUNTERS]["attach_requests"], json!(2));
        assert_eq!(c[IOMMU_COUNTERS]["map_requests"], json!(0));
        assert_eq!(c[IOMMU_COUNTERS]["invalidation_batches"], json!(0));
    }

    #[test]
    fn shutdown_sends_the_api_exit_event() {
        let (tx, rx) = std::sync::mpsc::channel();
        let cli = Cli::try_parse_from(["dmavisor", "--kernel", "/k"]).expect("command line");
        let s = VmState::new(
            &cli.to_config().expect("config"),
            CounterSources::default(),
            tx,
        );
        assert_eq!(s.counters(), json!({}));
        s.shutdown();
        assert_eq!(rx.try_recv(), Ok(ExitEvent::ApiShutdown));
    }
}
