//! `--device path=/sys/bus/pci/devices/<BDF>[,iommu=on|off][,id=NAME]`, as
//! cloud-hypervisor spells it.

use std::path::PathBuf;

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

impl VfioConfig {
    /// Parses one `--device` value.
    pub fn parse(value: &str) -> Result<Self, Error> {
        let opts = parse_options("device", value, &["path", "iommu", "id"])?;
        let path =
            opts.get("path")
                .filter(|p| !p.is_empty())
                .ok_or_else(|| Error::InvalidOption {
                    option: "device",
                    value: value.into(),
                    reason: "path=/sys/bus/pci/devices/<BDF> is required".into(),
                })?;
        let iommu = match opts.get("iommu") {
            Some(v) => parse_on_off("device", value, "iommu", v)?,
            None => false,
        };
        Ok(Self {
            path: PathBuf::from(path),
            iommu,
            id: opts.get("id").cloned(),
        })
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
