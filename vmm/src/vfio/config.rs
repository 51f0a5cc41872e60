//! `--device path=/sys/bus/pci/devices/<BDF>[,iommu=on|off][,id=NAME]`, as
//! cloud-hypervisor spells it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::options::parse_on_off;
use crate::options::parse_options;

/// One host PCI function to assign to the guest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VfioConfig {
    /// The function's sysfs directory (it must be bound to vfio-pci).
    pub path: PathBuf,
    /// Behind the vIOMMU (needs `--iommu`).
    pub iommu: bool,
    /// A name for logs and the API.
    pub id: Option<String>,
}

/// One entry of `devices` in cloud-hypervisor's `VmConfig`; `--device`
/// fills the same struct, checked by [`VfioConfig::from_spec`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSpec {
    /// The function's sysfs directory.
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// Behind the vIOMMU.
    #[serde(default)]
    pub iommu: bool,
    /// A name.
    #[serde(default)]
    pub id: Option<String>,
    /// PCI segment (only 0 exists).
    #[serde(default)]
    pub pci_segment: u16,
}

/// Why a [`DeviceSpec`] is refused.
#[derive(Debug, thiserror::Error)]
pub enum DeviceSpecError {
    /// No sysfs path.
    #[error("path=/sys/bus/pci/devices/<BDF> is required")]
    NoPath,
    /// A PCI segment other than 0.
    #[error("only PCI segment 0 exists")]
    PciSegment,
}

impl VfioConfig {
    /// Parses one `--device` value.
    pub fn parse(value: &str) -> Result<Self, Error> {
        let opts = parse_options("device", value, &["path", "iommu", "id"])?;
        let iommu = match opts.get("iommu") {
            Some(v) => parse_on_off("device", value, "iommu", v)?,
            None => false,
        };
        let spec = DeviceSpec {
            path: opts.get("path").map(PathBuf::from),
            iommu,
            id: opts.get("id").cloned(),
            pci_segment: 0,
        };
        Self::from_spec(&spec).map_err(|e| Error::InvalidOption {
            option: "device",
            value: value.into(),
            reason: e.into(),
        })
    }

    /// Checks an assigned function's description from the command line or
    /// the API.
    pub fn from_spec(spec: &DeviceSpec) -> Result<Self, DeviceSpecError> {
        let path = spec
            .path
            .as_ref()
            .filter(|p| !p.as_os_str().is_empty())
            .ok_or(DeviceSpecError::NoPath)?;
        if spec.pci_segment != 0 {
            return Err(DeviceSpecError::PciSegment);
        }
        Ok(Self {
            path: path.clone(),
            iommu: spec.iommu,
            id: spec.id.clone(),
        })
    }

    /// The description [`VfioConfig::from_spec`] turns back into `self`.
    pub fn to_spec(&self) -> DeviceSpec {
        DeviceSpec {
            path: Some(self.path.clone()),
            iommu: self.iommu,
            id: self.id.clone(),
            pci_segment: 0,
        }
    }

    /// The name used in messages: the id, else the BDF.
    pub fn name(&self) -> String {
        self.id.clone().unwrap_or_else(|| {
            self.path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| self.path.display().to_string())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cloud_hypervisor_spelling() {
        let c =
            VfioConfig::parse("path=/sys/bus/pci/devices/0000:00:01.0,iommu=on,id=nic0").unwrap();
        assert_eq!(c.path, PathBuf::from("/sys/bus/pci/devices/0000:00:01.0"));
        assert!(c.iommu);
        assert_eq!(c.name(), "nic0");
        let plain = VfioConfig::parse("path=/sys/bus/pci/devices/0000:00:01.0").unwrap();
        assert!(!plain.iommu);
        assert_eq!(plain.name(), "0000:00:01.0");
        assert!(VfioConfig::parse("iommu=on").is_err());
        assert!(VfioConfig::parse("path=").is_err());
        assert!(VfioConfig::parse("path=/x,iommu=maybe").is_err());
        assert!(VfioConfig::parse("path=/x,bogus=1").is_err());
    }
}
