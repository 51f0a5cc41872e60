//! `vm.create`'s body and `vm.info`'s `config`: cloud-hypervisor's
//! `VmConfig` JSON (field names and units as its OpenAPI description has
//! them, for the subset dmavisor implements) to and from [`VmConfig`].
//!
//! WHY one struct both ways: a management stack reads a VM's `config`
//! from `vm.info` and sends it back to `vm.create` (and a reboot rebuilds
//! the running VM from what it prints the same way), so what is printed
//! must be exactly what is accepted. Every value is
//! checked by the same `from_spec` functions the command line's parsers
//! end in; unknown fields are refused, not ignored, so a request for a
//! feature dmavisor lacks gets a 400 that names it.
//!
//! dmavisor's additions, absent from cloud-hypervisor's description:
//! `iommu_config` (the vIOMMU's options; `iommu: true` alone means the
//! defaults) and `dma_test` (the DMA test devices).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

use crate::block::config::DiskSpec;
use crate::config::{
    ConsoleConfig, ConsoleSpec, CpusConfig, CpusSpec, MemoryConfig, MemorySpec, SerialConfig,
    VmConfig,
};
use crate::dma_test::DmaTestConfig;
use crate::net::config::NetSpec;
use crate::vfio::config::DeviceSpec;
use crate::virtio::iommu::options::IommuSpec;
use crate::virtio::iommu::IommuOptions;

/// cloud-hypervisor's default guest RAM when `memory` is absent.
const DEFAULT_MEMORY: u64 = 512 << 20;

/// Why a `VmConfig` body was refused (the API answers 400 with it).
#[derive(Debug, Error)]
pub enum VmConfigError {
    /// Not JSON, or not of `VmConfig`'s shape (a type, an unknown field).
    #[error("invalid VmConfig: {0}")]
    Json(#[from] serde_json::Error),
    /// A cloud-hypervisor field dmavisor lacks, set to something other
    /// than its unused value.
    #[error(transparent)]
    Unsupported(#[from] super::ch_fields::Unsupported),
    /// A value out of range or unsupported.
    #[error("invalid VmConfig: {field}: {reason}")]
    Invalid {
        /// Where, e.g. `disks[1]`.
        field: String,
        /// What is wrong: the section's own error (`DiskSpecError`, ...)
        /// or a sentence.
        #[source]
        reason: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// `payload`: dmavisor boots a kernel directly (no firmware).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PayloadSpec {
    /// bzImage or PVH vmlinux.
    #[serde(default)]
    pub kernel: Option<PathBuf>,
    /// Initramfs.
    #[serde(default)]
    pub initramfs: Option<PathBuf>,
    /// Kernel command line.
    #[serde(default)]
    pub cmdline: Option<String>,
}

/// cloud-hypervisor's `VmConfig`, the fields dmavisor has.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfigSpec {
    /// vCPUs (default: 1).
    #[serde(default)]
    pub cpus: CpusSpec,
    /// RAM (default: 512 MiB).
    #[serde(default = "default_memory")]
    pub memory: MemorySpec,
    /// What to boot (required).
    pub payload: PayloadSpec,
    /// COM1 (default: none, cloud-hypervisor's `Null`).
    #[serde(default)]
    pub serial: Option<ConsoleSpec>,
    /// The virtio-console (default: none). `Null` is none too: WHY CH
    /// clients send it for "no console", and a device would move the
    /// PCI slots of configurations that had none.
    #[serde(default)]
    pub console: Option<ConsoleSpec>,
    /// virtio-net devices.
    #[serde(default)]
    pub net: Option<Vec<NetSpec>>,
    /// virtio-blk devices.
    #[serde(default)]
    pub disks: Option<Vec<DiskSpec>>,
    /// Assigned host PCI functions.
    #[serde(default)]
    pub devices: Option<Vec<DeviceSpec>>,
    /// A virtio-iommu.
    #[serde(default)]
    pub iommu: bool,
    /// The virtio-iommu's options (dmavisor's addition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu_config: Option<IommuSpec>,
    /// DMA test devices (dmavisor's addition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dma_test: Option<Vec<DmaTestConfig>>,
}

fn default_memory() -> MemorySpec {
    MemorySpec {
        size: DEFAULT_MEMORY,
        ..MemorySpec::default()
    }
}

fn invalid<E: Into<Box<dyn std::error::Error + Send + Sync>>>(
    field: impl Into<String>,
) -> impl FnOnce(E) -> VmConfigError {
    let field = field.into();
    move |reason| VmConfigError::Invalid {
        field,
        reason: reason.into(),
    }
}

/// Checks every entry of a device list with `check`, naming the bad one.
fn each<S, C, E: std::error::Error + Send + Sync + 'static>(
    list: &Option<Vec<S>>,
    name: &str,
    check: impl Fn(&S) -> Result<C, E>,
) -> Result<Vec<C>, VmConfigError> {
    list.iter()
        .flatten()
        .enumerate()
        .map(|(i, s)| check(s).map_err(invalid(format!("{name}[{i}]"))))
        .collect()
}

impl VmConfigSpec {
    /// The VM this describes, checked as the command line is.
    pub fn to_config(&self) -> Result<VmConfig, VmConfigError> {
        let kernel = self
            .payload
            .kernel
            .clone()
            .filter(|k| !k.as_os_str().is_empty())
            .ok_or_else(|| {
                invalid("payload.kernel")("required (dmavisor boots a kernel, not firmware)")
            })?;
        if self.iommu_config.is_some() && !self.iommu {
            return Err(invalid("iommu_config")("needs iommu: true"));
        }
        let serial = match &self.serial {
            Some(s) => SerialConfig::from_spec(s).map_err(invalid("serial"))?,
            None => SerialConfig::Off,
        };
        let console = match &self.console {
            Some(c) => match ConsoleConfig::from_spec(c).map_err(invalid("console"))? {
                ConsoleConfig::Null => ConsoleConfig::Off,
                other => other,
            },
            None => ConsoleConfig::Off,
        };
        console.check_with(&serial).map_err(invalid("console"))?;
        let console_iommu = self.console.as_ref().is_some_and(|c| c.iommu);
        let iommu = match (self.iommu, &self.iommu_config) {
            (false, _) => None,
            (true, None) => Some(IommuOptions::default()),
            (true, Some(o)) => Some(IommuOptions::from_spec(o).map_err(invalid("iommu_config"))?),
        };
        Ok(VmConfig {
            kernel,
            initramfs: self.payload.initramfs.clone(),
            cmdline: self.payload.cmdline.clone().unwrap_or_default(),
            cpus: CpusConfig::from_spec(&self.cpus).map_err(invalid("cpus"))?,
            memory: MemoryConfig::from_spec(&self.memory).map_err(invalid("memory"))?,
            serial,
            console,
            console_iommu,
            net: each(&self.net, "net", crate::net::NetConfig::from_spec)?,
            disks: each(&self.disks, "disks", crate::block::DiskConfig::from_spec)?,
            iommu,
            dma_test: self.dma_test.clone().unwrap_or_default(),
            devices: each(&self.devices, "devices", crate::vfio::VfioConfig::from_spec)?,
        })
    }

    /// The description of `c`, as `vm.info` prints it.
    pub fn from_config(c: &VmConfig) -> Self {
        Self {
            cpus: c.cpus.to_spec(),
            memory: c.memory.to_spec(),
            payload: PayloadSpec {
                kernel: Some(c.kernel.clone()),
                initramfs: c.initramfs.clone(),
                cmdline: Some(c.cmdline.clone()),
            },
            serial: Some(c.serial.to_spec()),
            console: Some(ConsoleSpec {
                iommu: c.console_iommu,
                ..c.console.to_spec()
            }),
            net: Some(c.net.iter().map(|n| n.to_spec()).collect()),
            disks: Some(c.disks.iter().map(|d| d.to_spec()).collect()),
            devices: Some(c.devices.iter().map(|d| d.to_spec()).collect()),
            iommu: c.iommu.is_some(),
            iommu_config: c.iommu.as_ref().map(IommuOptions::to_spec),
            dma_test: (!c.dma_test.is_empty()).then(|| c.dma_test.clone()),
        }
    }
}

/// Parses and checks a `vm.create` body.
pub fn parse(body: &[u8]) -> Result<VmConfig, VmConfigError> {
    let mut body: Value = serde_json::from_slice(body)?;
    super::ch_fields::drop_unused_vm(&mut body)?;
    serde_json::from_value::<VmConfigSpec>(body)?.to_config()
}

/// `vm.info`'s `config` for `c`.
pub fn to_json(c: &VmConfig) -> Value {
    // Plain structs of strings, numbers and booleans: serialising them
    // cannot fail.
    serde_json::to_value(VmConfigSpec::from_config(c)).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_body_gets_cloud_hypervisor_defaults() {
        let c = parse(br#"{"payload": {"kernel": "/k"}}"#).expect("valid");
        assert_eq!(c.kernel, PathBuf::from("/k"));
        assert_eq!((c.cpus.boot, c.cpus.max), (1, 1));
        assert_eq!(c.memory.size, 512 << 20);
        assert!(c.memory.thp && !c.memory.shared);
        assert_eq!(c.serial, SerialConfig::Off);
        assert!(c.net.is_empty() && c.disks.is_empty() && c.devices.is_empty());
        assert!(c.iommu.is_none());
        let c = parse(
            br#"{"payload": {"kernel": "/k"}, "net": null, "disks": null, "iommu": true,
                 "serial": {"mode": "Tty"}, "console": {"mode": "Null"},
                 "cpus": {"boot_vcpus": 2, "max_vcpus": 2}}"#,
        )
        .expect("valid");
        assert_eq!(c.iommu, Some(IommuOptions::default()));
        assert_eq!(c.serial, SerialConfig::Tty);
        assert_eq!(c.cpus.boot, 2);
        let c = parse(br#"{"payload": {"kernel": "/k"}, "serial": {"mode": "Pty"}}"#).unwrap();
        assert_eq!(c.serial, SerialConfig::Pty(None));
        let c = parse(br#"{"payload": {"kernel": "/k"}, "console": {"mode": "Pty"}}"#).unwrap();
        assert_eq!(c.console, ConsoleConfig::Pty(None));
        // vm.info's own output parses back (the controller rebuilds from it).
        let c = parse(
            br#"{"payload": {"kernel": "/k"}, "console": {"mode": "Pty", "file": "/dev/pts/3"},
                 "serial": {"mode": "Pty", "file": "/dev/pts/4"}}"#,
        )
        .unwrap();
        assert_eq!(c.console, ConsoleConfig::Pty(Some("/dev/pts/3".into())));
        assert_eq!(c.serial, SerialConfig::Pty(Some("/dev/pts/4".into())));
        let c = parse(br#"{"payload": {"kernel": "/k"}, "console": {"mode": "Null"}}"#).unwrap();
        assert_eq!(c.console, ConsoleConfig::Off, "no device, as before");
        // libvirt's `<serial type='unix'>`, and a console on a socket too;
        // vm.info prints them back as they came.
        let body = br#"{"payload": {"kernel": "/k"},
                 "serial": {"mode": "Socket", "socket": "/run/s.sock"},
                 "console": {"mode": "Socket", "socket": "/run/c.sock", "iommu": false}}"#;
        let c = parse(body).unwrap();
        assert_eq!(c.serial, SerialConfig::Socket("/run/s.sock".into()));
        assert_eq!(c.console, ConsoleConfig::Socket("/run/c.sock".into()));
        let shown = serde_json::to_value(VmConfigSpec::from_config(&c)).unwrap();
        assert_eq!(
            shown["serial"],
            serde_json::json!({"mode": "Socket", "socket": "/run/s.sock"})
        );
        assert_eq!(shown["console"]["socket"], "/run/c.sock");
        assert!(!c.console_iommu);
        // cloud-hypervisor's console.iommu: the device behind the vIOMMU,
        // printed back by vm.info.
        let body = br#"{"payload": {"kernel": "/k"}, "iommu": true,
                 "console": {"mode": "Pty", "iommu": true}}"#;
        let c = parse(body).unwrap();
        assert!(c.console_iommu);
        let shown = serde_json::to_value(VmConfigSpec::from_config(&c)).unwrap();
        assert_eq!(shown["console"]["iommu"], true);
        assert_eq!(parse(shown.to_string().as_bytes()).unwrap(), c);
    }

    #[test]
    fn invalid_bodies_say_what_is_wrong() {
        for (body, says) in [
            (&b"{"[..], "EOF"),
            (b"[]", "invalid length"),
            (b"1", "invalid type"),
            (b"{}", "payload"),
            (br#"{"payload": {}}"#, "payload.kernel"),
            (br#"{"payload": {"firmware": "/f"}}"#, "firmware"),
            (br#"{"payload": {"kernel": "/k"}, "cpus": {"boot_vcpus": 0}}"#, "cpus"),
            (br#"{"payload": {"kernel": "/k"}, "cpus": {"boot_vcpus": 65}}"#, "cpus"),
            (br#"{"payload": {"kernel": "/k"}, "cpus": {"boot_vcpus": 4, "max_vcpus": 2}}"#, "max"),
            (br#"{"payload": {"kernel": "/k"}, "cpus": {"boot_vcpus": -1}}"#, "invalid value"),
            (br#"{"payload": {"kernel": "/k"}, "memory": {"size": 1048576}}"#, "64 MiB"),
            (br#"{"payload": {"kernel": "/k"}, "memory": {"size": "512M"}}"#, "invalid type"),
            (br#"{"payload": {"kernel": "/k"}, "memory": {"size": 536870912, "hugepages": true}}"#, "hugepages"),
            (br#"{"payload": {"kernel": "/k"}, "serial": {"mode": "Socket"}}"#, "serial"),
            (br#"{"payload": {"kernel": "/k"}, "serial": {"mode": "File"}}"#, "file"),
            (br#"{"payload": {"kernel": "/k"}, "serial": {"mode": "Loud"}}"#, "unknown variant"),
            (br#"{"payload": {"kernel": "/k"}, "serial": {"mode": "Tty"}, "console": {"mode": "Tty"}}"#, "both on tty"),
            (br#"{"payload": {"kernel": "/k"}, "console": {"mode": "Socket"}}"#, "needs a socket path"),
            (br#"{"payload": {"kernel": "/k"}, "serial": {"mode": "Tty", "iommu": true}}"#, "no PCI device"),
            (br#"{"payload": {"kernel": "/k"}, "console": {"mode": "Null", "iommu": true}}"#, "needs a console device"),
            (br#"{"payload": {"kernel": "/k"}, "serial": {"mode": "Pty", "socket": "/s"}}"#, "a socket goes with mode Socket"),
            (br#"{"payload": {"kernel": "/k"}, "serial": {"mode": "Socket", "socket": "/s", "file": "/f"}}"#, "a file goes with mode File"),
            (br#"{"payload": {"kernel": "/k"}, "serial": {"mode": "Socket", "socket": "/s"}, "console": {"mode": "Socket", "socket": "/s"}}"#, "same socket path"),
            (br#"{"payload": {"kernel": "/k"}, "net": [{"tap": "t0"}, {"mac": "01:00:00:00:00:00"}]}"#, "net[1]"),
            (br#"{"payload": {"kernel": "/k"}, "net": [{"num_queues": 3}]}"#, "num_queues"),
            (br#"{"payload": {"kernel": "/k"}, "net": [{"vhost_user": true}]}"#, "socket"),
            (br#"{"payload": {"kernel": "/k"}, "disks": [{"readonly": true}]}"#, "disks[0]"),
            (br#"{"payload": {"kernel": "/k"}, "disks": [{"path": "/d", "direct": true}]}"#, "direct"),
            (br#"{"payload": {"kernel": "/k"}, "disks": [{"path": "/d", "num_queues": 17}]}"#, "num_queues"),
            (br#"{"payload": {"kernel": "/k"}, "devices": [{"iommu": true}]}"#, "devices[0]"),
            (br#"{"payload": {"kernel": "/k"}, "iommu_config": {"queues": 2}}"#, "iommu: true"),
            (br#"{"payload": {"kernel": "/k"}, "iommu": true, "iommu_config": {"queues": 0}}"#, "queues"),
            (br#"{"payload": {"kernel": "/k"}, "iommu": true, "iommu_config": {"impl": "fast"}}"#, "impl"),
            (br#"{"payload": {"kernel": "/k"}, "rng": {"src": "/dev/hwrng"}}"#, "rng.src="),
            (br#"{"payload": {"kernel": "/k"}, "memory": {"size": 536870912, "hugepages": true}}"#, "memory.hugepages=true is not supported by dmavisor"),
            (br#"{"payload": {"kernel": "/k"}, "sound": true}"#, "unknown field `sound`"),
        ] {
            let text = String::from_utf8_lossy(body);
            match parse(body) {
                Ok(c) => panic!("{text} accepted: {c:?}"),
                Err(e) => assert!(e.to_string().contains(says), "{text}: {e}"),
            }
        }
    }
}
