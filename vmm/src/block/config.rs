//! `--disk path=..[,readonly=on][,iommu=on][,num_queues=N][,queue_size=N][,id=..]`
//! as cloud-hypervisor spells it (the subset dmavisor implements: raw
//! images, no vhost-user, no rate limiter).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Error, OptionReason};
use crate::options::parse_options;

/// Most request queues one disk may have (one worker thread each).
pub const MAX_QUEUES: usize = 16;
/// cloud-hypervisor's default queue size for a disk.
pub const DEFAULT_QUEUE_SIZE: u16 = 128;
/// Longest `id=` accepted (it also names the device in logs and the API).
const MAX_ID_LEN: usize = 64;

/// One virtio-blk device on a raw image file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskConfig {
    /// The raw image (or block device) the guest sees as its disk.
    pub path: PathBuf,
    /// The image is opened read-only and the device offers VIRTIO_BLK_F_RO.
    pub readonly: bool,
    /// The device sits behind the virtual IOMMU.
    pub iommu: bool,
    /// Request queues (VIRTIO_BLK_F_MQ when more than one).
    pub num_queues: usize,
    /// Size of each virtqueue.
    pub queue_size: u16,
    /// Name given by the user (GET_ID answers it when set).
    pub id: Option<String>,
}

/// One entry of `disks` in cloud-hypervisor's `VmConfig`: what the API's
/// `vm.create` takes and `vm.info` prints. `--disk` fills the same struct,
/// so both are checked by [`DiskConfig::from_spec`]. The fields dmavisor
/// lacks (`direct`, `vhost_user`, `vhost_socket`, `pci_segment`) are
/// accepted at their defaults, as `vm.info` prints them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskSpec {
    /// The raw image.
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// Read-only.
    #[serde(default)]
    pub readonly: bool,
    /// O_DIRECT (not supported: must be false).
    #[serde(default)]
    pub direct: bool,
    /// Behind the vIOMMU.
    #[serde(default)]
    pub iommu: bool,
    /// Request queues.
    #[serde(default)]
    pub num_queues: Option<u64>,
    /// Size of each virtqueue.
    #[serde(default)]
    pub queue_size: Option<u64>,
    /// vhost-user-blk (not supported: must be false).
    #[serde(default)]
    pub vhost_user: bool,
    /// vhost-user-blk's socket (not supported: must be absent).
    #[serde(default)]
    pub vhost_socket: Option<PathBuf>,
    /// A name (GET_ID, logs, the API).
    #[serde(default)]
    pub id: Option<String>,
    /// PCI segment (only 0 exists).
    #[serde(default)]
    pub pci_segment: u16,
}

fn on_off(value: &str, key: &str, v: Option<&String>) -> Result<bool, Error> {
    match v.map(String::as_str) {
        None | Some("off") | Some("false") => Ok(false),
        Some("on") | Some("true") => Ok(true),
        Some(o) => Err(Error::InvalidOption {
            option: "disk",
            value: value.to_string(),
            reason: format!("{key} must be on or off, not '{o}'").into(),
        }),
    }
}

/// Why a [`DiskSpec`] is refused.
#[derive(Debug, thiserror::Error)]
pub enum DiskSpecError {
    /// No image path.
    #[error("path=... is required")]
    NoPath,
    /// O_DIRECT asked for.
    #[error("direct (O_DIRECT) is not supported")]
    Direct,
    /// A vhost-user disk asked for.
    #[error("vhost-user disks are not supported")]
    VhostUser,
    /// A PCI segment other than 0.
    #[error("only PCI segment 0 exists")]
    PciSegment,
    /// `num_queues` out of range.
    #[error("num_queues must be between 1 and {MAX_QUEUES}")]
    NumQueues,
    /// `queue_size` not a power of two in range.
    #[error("queue_size must be a power of two from 4 to 32768")]
    QueueSize,
    /// `id` empty, too long or with control characters.
    #[error("id must be 1 to {MAX_ID_LEN} printable characters")]
    Id,
}

impl DiskConfig {
    /// Parses and validates one `--disk` value (the file is opened later).
    pub fn parse(value: &str) -> Result<Self, Error> {
        let opts = parse_options(
            "disk",
            value,
            &[
                "path",
                "readonly",
                "iommu",
                "num_queues",
                "queue_size",
                "id",
            ],
        )?;
        let bad = |reason: OptionReason| Error::InvalidOption {
            option: "disk",
            value: value.to_string(),
            reason,
        };
        let number = |key: &str| -> Result<Option<u64>, Error> {
            opts.get(key)
                .map(|t| {
                    t.parse::<u64>()
                        .map_err(|_| bad(format!("{key} '{t}' is not a number").into()))
                })
                .transpose()
        };
        let spec = DiskSpec {
            path: opts.get("path").map(PathBuf::from),
            readonly: on_off(value, "readonly", opts.get("readonly"))?,
            iommu: on_off(value, "iommu", opts.get("iommu"))?,
            num_queues: number("num_queues")?,
            queue_size: number("queue_size")?,
            id: opts.get("id").cloned(),
            ..DiskSpec::default()
        };
        Self::from_spec(&spec).map_err(|e| bad(e.into()))
    }

    /// Checks a disk description from the command line or the API.
    pub fn from_spec(spec: &DiskSpec) -> Result<Self, DiskSpecError> {
        let path = spec
            .path
            .as_ref()
            .filter(|p| !p.as_os_str().is_empty())
            .ok_or(DiskSpecError::NoPath)?;
        if spec.direct {
            return Err(DiskSpecError::Direct);
        }
        if spec.vhost_user || spec.vhost_socket.is_some() {
            return Err(DiskSpecError::VhostUser);
        }
        if spec.pci_segment != 0 {
            return Err(DiskSpecError::PciSegment);
        }
        let num_queues = usize::try_from(spec.num_queues.unwrap_or(1))
            .ok()
            .filter(|n| (1..=MAX_QUEUES).contains(n))
            .ok_or(DiskSpecError::NumQueues)?;
        // A request needs a header and a status descriptor besides its data.
        let queue_size = u16::try_from(spec.queue_size.unwrap_or(DEFAULT_QUEUE_SIZE.into()))
            .ok()
            .filter(|q| q.is_power_of_two() && (4..=32768).contains(q))
            .ok_or(DiskSpecError::QueueSize)?;
        if let Some(id) = &spec.id {
            if id.is_empty() || id.len() > MAX_ID_LEN || id.chars().any(char::is_control) {
                return Err(DiskSpecError::Id);
            }
        }
        Ok(Self {
            path: path.clone(),
            readonly: spec.readonly,
            iommu: spec.iommu,
            num_queues,
            queue_size,
            id: spec.id.clone(),
        })
    }

    /// The description [`DiskConfig::from_spec`] turns back into `self`.
    pub fn to_spec(&self) -> DiskSpec {
        DiskSpec {
            path: Some(self.path.clone()),
            readonly: self.readonly,
            iommu: self.iommu,
            num_queues: Some(self.num_queues as u64),
            queue_size: Some(self.queue_size.into()),
            id: self.id.clone(),
            ..DiskSpec::default()
        }
    }

    /// How logs and the API name this disk: its `id`, else its path.
    pub fn name(&self) -> String {
        self.id
            .clone()
            .unwrap_or_else(|| self.path.display().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_and_default() {
        let c = DiskConfig::parse(
            "path=/img/disk.raw,readonly=on,iommu=on,num_queues=4,queue_size=256,id=disk0",
        )
        .unwrap();
        assert_eq!(c.path, PathBuf::from("/img/disk.raw"));
        assert!(c.readonly && c.iommu);
        assert_eq!((c.num_queues, c.queue_size), (4, 256));
        assert_eq!(c.id.as_deref(), Some("disk0"));
        assert_eq!(c.name(), "disk0");
        let d = DiskConfig::parse("path=/d").unwrap();
        assert!(!d.readonly && !d.iommu);
        assert_eq!((d.num_queues, d.queue_size), (1, DEFAULT_QUEUE_SIZE));
        assert_eq!(d.name(), "/d");
        assert!(DiskConfig::parse("path=/d,readonly=true").unwrap().readonly);
    }

    #[test]
    fn rejects_bad_values() {
        for v in [
            "",
            "readonly=on",
            "path=",
            "path=/d,readonly=yes",
            "path=/d,iommu=1",
            "path=/d,num_queues=0",
            "path=/d,num_queues=17",
            "path=/d,num_queues=x",
            "path=/d,queue_size=100",
            "path=/d,queue_size=2",
            "path=/d,queue_size=65536",
            "path=/d,id=",
            "path=/d,direct=on",
            "path=/d,path=/e",
        ] {
            assert!(DiskConfig::parse(v).is_err(), "{v}");
        }
        let long = format!("path=/d,id={}", "x".repeat(65));
        assert!(DiskConfig::parse(&long).is_err());
    }
}
