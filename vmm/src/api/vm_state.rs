//! The running VM as the REST API sees it: a configuration snapshot in
//! cloud-hypervisor's `VmConfig` shape, the devices' counters, and the
//! exit channel that `shutdown` uses.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::routes::VmApi;
use crate::config::{SerialConfig, VmConfig};
use crate::exit::{ExitEvent, ExitSender};
use crate::vfio::VfioMirror;

/// What the API reads of a running VM.
pub struct VmState {
    config: Value,
    memory: u64,
    /// Assigned functions behind the vIOMMU, by name.
    mirrors: Vec<(String, Arc<VfioMirror>)>,
    exit: ExitSender,
}

impl VmState {
    /// The state of the VM built from `config`.
    pub fn new(
        config: &VmConfig,
        mirrors: Vec<(String, Arc<VfioMirror>)>,
        exit: ExitSender,
    ) -> Self {
        Self {
            config: config_json(config),
            memory: config.memory.size,
            mirrors,
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

    fn counters(&self) -> Value {
        let mut out = Map::new();
        for (name, m) in &self.mirrors {
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
    }

    #[test]
    fn shutdown_sends_the_api_exit_event() {
        let (tx, rx) = std::sync::mpsc::channel();
        let cli = Cli::try_parse_from(["dmavisor", "--kernel", "/k"]).expect("command line");
        let s = VmState::new(&cli.to_config().expect("config"), Vec::new(), tx);
        assert_eq!(s.counters(), json!({}));
        s.shutdown();
        assert_eq!(rx.try_recv(), Ok(ExitEvent::ApiShutdown));
    }
}
