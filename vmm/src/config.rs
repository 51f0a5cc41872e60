//! Typed VM configuration parsed from cloud-hypervisor style option strings
//! (`key=value,key=value`).
//!
//! Why by hand: the syntax is small and its error messages must name the
//! flag and the offending key. To add a flag (e.g. `--net`), add its struct
//! here with a `parse` built on [`parse_options`], a field on [`VmConfig`],
//! and the clap argument in `cli.rs`.

use std::path::PathBuf;

use crate::error::Error;
use crate::memory::layout::{MAX_MEMORY_SIZE, MIN_MEMORY_SIZE};

/// Largest vCPU count accepted: APIC ids must fit the 8-bit MADT field and
/// the xAPIC destination format.
pub const MAX_VCPUS: u8 = 64;

pub use crate::options::parse_options;

/// Parses a byte size with an optional binary suffix: `512M`, `2G`, `65536K`, `1073741824`.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, shift) = match text.char_indices().last()? {
        (i, 'K' | 'k') => (&text[..i], 10),
        (i, 'M' | 'm') => (&text[..i], 20),
        (i, 'G' | 'g') => (&text[..i], 30),
        (i, 'T' | 't') => (&text[..i], 40),
        _ => (text, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    n.checked_mul(1u64 << shift)
}

/// `--memory size=...`
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryConfig {
    /// Guest RAM in bytes.
    pub size: u64,
    /// Back guest RAM with transparent huge pages where the host allows
    /// (`thp=on`, the default, as in cloud-hypervisor).
    pub thp: bool,
    /// Back guest RAM with a memfd that other processes can map
    /// (`shared=on`): vhost-user back-ends need it.
    pub shared: bool,
}

impl MemoryConfig {
    /// Parses and validates `--memory`.
    pub fn parse(value: &str) -> Result<Self, Error> {
        let opts = parse_options("memory", value, &["size", "thp", "shared"])?;
        let bad = |reason: String| Error::InvalidOption {
            option: "memory",
            value: value.to_string(),
            reason,
        };
        let text = opts
            .get("size")
            .ok_or_else(|| bad("size=... is required".into()))?;
        let size = parse_size(text)
            .ok_or_else(|| bad(format!("'{text}' is not a size such as 512M or 2G")))?;
        if size < MIN_MEMORY_SIZE {
            return Err(bad(format!(
                "at least {} MiB are needed",
                MIN_MEMORY_SIZE >> 20
            )));
        }
        if size > MAX_MEMORY_SIZE {
            return Err(bad(format!(
                "at most {} GiB are supported",
                MAX_MEMORY_SIZE >> 30
            )));
        }
        if size % 4096 != 0 {
            return Err(bad("size must be a multiple of 4 KiB".into()));
        }
        let thp = match opts.get("thp").map(String::as_str) {
            None | Some("on") => true,
            Some("off") => false,
            Some(other) => return Err(bad(format!("thp={other}: expected on or off"))),
        };
        let shared = match opts.get("shared").map(String::as_str) {
            None | Some("off") => false,
            Some("on") => true,
            Some(other) => return Err(bad(format!("shared={other}: expected on or off"))),
        };
        Ok(Self { size, thp, shared })
    }
}

/// `--cpus boot=N[,max=M]`, as cloud-hypervisor spells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpusConfig {
    /// Number of vCPUs started at boot.
    pub boot: u8,
    /// The most vCPUs the VM may have (at least `boot`). vCPU hotplug is
    /// not implemented: management stacks pass `max` routinely, so it is
    /// accepted and validated, and the VM has `boot` vCPUs.
    pub max: u8,
}

impl CpusConfig {
    /// Parses and validates `--cpus`.
    pub fn parse(value: &str) -> Result<Self, Error> {
        let opts = parse_options("cpus", value, &["boot", "max"])?;
        let bad = |reason: String| Error::InvalidOption {
            option: "cpus",
            value: value.to_string(),
            reason,
        };
        let text = opts
            .get("boot")
            .ok_or_else(|| bad("boot=N is required".into()))?;
        let boot: u32 = text
            .parse()
            .map_err(|_| bad(format!("'{text}' is not a number")))?;
        if boot == 0 || boot > u32::from(MAX_VCPUS) {
            return Err(bad(format!("boot must be between 1 and {MAX_VCPUS}")));
        }
        let max = match opts.get("max") {
            None => boot,
            Some(text) => text
                .parse()
                .map_err(|_| bad(format!("max: '{text}' is not a number")))?,
        };
        if max < boot || max > u32::from(MAX_VCPUS) {
            return Err(bad(format!(
                "max must be between boot ({boot}) and {MAX_VCPUS}"
            )));
        }
        Ok(Self {
            boot: boot as u8,
            max: max as u8,
        })
    }
}

/// `--serial tty|file=PATH|off`
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SerialConfig {
    /// Output to stdout, input from stdin.
    Tty,
    /// Output appended to a file; no input.
    File(PathBuf),
    /// No serial port.
    Off,
}

impl SerialConfig {
    /// Parses `--serial`.
    pub fn parse(value: &str) -> Result<Self, Error> {
        match value {
            "tty" => Ok(Self::Tty),
            "off" | "null" => Ok(Self::Off),
            _ => match value.strip_prefix("file=") {
                Some(path) if !path.is_empty() => Ok(Self::File(PathBuf::from(path))),
                _ => Err(Error::InvalidOption {
                    option: "serial",
                    value: value.to_string(),
                    reason: "expected tty, file=PATH or off".into(),
                }),
            },
        }
    }
}

/// Everything needed to build and run a VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmConfig {
    /// Kernel image (bzImage or ELF vmlinux).
    pub kernel: PathBuf,
    /// Optional initramfs.
    pub initramfs: Option<PathBuf>,
    /// Kernel command line.
    pub cmdline: String,
    /// vCPUs.
    pub cpus: CpusConfig,
    /// RAM.
    pub memory: MemoryConfig,
    /// COM1.
    pub serial: SerialConfig,
    /// virtio-net devices (`--net`, repeatable).
    pub net: Vec<crate::net::NetConfig>,
    /// virtio-blk devices (`--disk`, repeatable).
    pub disks: Vec<crate::block::DiskConfig>,
    /// The virtio-iommu (`--iommu`), if any.
    pub iommu: Option<crate::virtio::iommu::IommuOptions>,
    /// DMA test devices (`--dma-test`, repeatable).
    pub dma_test: Vec<crate::devices::dma_test::DmaTestConfig>,
    /// Assigned host PCI functions (`--device`, repeatable).
    pub devices: Vec<crate::vfio::VfioConfig>,
    /// Where the REST API listens (`--api-socket`), if anywhere.
    pub api_socket: Option<crate::api::ApiSocket>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M"), Some(512 << 20));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("64k"), Some(64 << 10));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("M"), None);
        assert_eq!(parse_size("-1G"), None);
        assert_eq!(parse_size("1.5G"), None);
        assert_eq!(parse_size("99999999999999999999G"), None);
        assert_eq!(parse_size("20000000000T"), None);
    }

    #[test]
    fn memory_config() {
        assert_eq!(MemoryConfig::parse("size=512M").unwrap().size, 512 << 20);
        assert_eq!(MemoryConfig::parse("size=2G").unwrap().size, 2 << 30);
        assert!(MemoryConfig::parse("size=32M").is_err());
        assert!(MemoryConfig::parse("size=lots").is_err());
        assert!(MemoryConfig::parse("").is_err());
        assert!(MemoryConfig::parse("size=1G,size=2G").is_err());
        assert!(MemoryConfig::parse("size=1G,shared=on").unwrap().shared);
        assert!(!MemoryConfig::parse("size=1G").unwrap().shared);
        assert!(MemoryConfig::parse("size=1G,shared=yes").is_err());
        assert!(MemoryConfig::parse("size=1G,hugepages=on").is_err());
        assert!(
            MemoryConfig::parse("size=1G").unwrap().thp,
            "THP by default"
        );
        assert!(MemoryConfig::parse("size=1G,thp=on").unwrap().thp);
        assert!(!MemoryConfig::parse("size=1G,thp=off").unwrap().thp);
        assert!(MemoryConfig::parse("size=1G,thp=maybe").is_err());
        assert!(MemoryConfig::parse("size=100000001").is_err());
        let err = MemoryConfig::parse("size=1M").unwrap_err().to_string();
        assert!(err.contains("--memory"), "{err}");
        assert!(err.contains("64 MiB"), "{err}");
    }

    #[test]
    fn cpus_config() {
        assert_eq!(CpusConfig::parse("boot=2").unwrap().boot, 2);
        assert!(CpusConfig::parse("boot=0").is_err());
        assert!(CpusConfig::parse("boot=65").is_err());
        assert!(CpusConfig::parse("boot=x").is_err());
        assert!(CpusConfig::parse("max=2").is_err());
        let c = CpusConfig::parse("boot=2,max=8").unwrap();
        assert_eq!((c.boot, c.max), (2, 8));
        assert_eq!(CpusConfig::parse("boot=3").unwrap().max, 3);
        assert!(CpusConfig::parse("boot=4,max=2").is_err());
        assert!(CpusConfig::parse("boot=1,max=65").is_err());
        assert!(CpusConfig::parse("boot=1,max=x").is_err());
        assert!(CpusConfig::parse("boot").is_err());
    }

    #[test]
    fn serial_config() {
        assert_eq!(SerialConfig::parse("tty").unwrap(), SerialConfig::Tty);
        assert_eq!(SerialConfig::parse("off").unwrap(), SerialConfig::Off);
        assert_eq!(
            SerialConfig::parse("file=/tmp/x").unwrap(),
            SerialConfig::File(PathBuf::from("/tmp/x"))
        );
        assert!(SerialConfig::parse("file=").is_err());
        assert!(SerialConfig::parse("pty").is_err());
    }

    #[test]
    fn options_map() {
        let m = parse_options("net", "a=1,b=2,", &["a", "b"]).unwrap();
        assert_eq!(m.get("a").map(String::as_str), Some("1"));
        assert_eq!(m.get("b").map(String::as_str), Some("2"));
        assert!(parse_options("net", "c=1", &["a"]).is_err());
    }
}
