//! Typed VM configuration parsed from cloud-hypervisor style option strings
//! (`key=value,key=value`).
//!
//! Why by hand: the syntax is small and its error messages must name the
//! flag and the offending key. To add a flag (e.g. `--net`), add its struct
//! here with a `parse` built on [`parse_options`], a field on [`VmConfig`],
//! and the clap argument in `cli.rs`.
//!
//! Each flag's checks live in a `from_spec` over a serde struct spelled as
//! cloud-hypervisor's `VmConfig` JSON (`CpusSpec`, `MemorySpec`, ...):
//! `parse` fills it from `key=value` text, the REST API's `vm.create` from
//! JSON (`api/vm_config.rs`), so both refuse the same values.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Error, OptionReason};
use crate::memory::layout::{MAX_MEMORY_SIZE, MIN_MEMORY_SIZE};

/// Largest vCPU count accepted: APIC ids must fit the 8-bit MADT field and
/// the xAPIC destination format.
pub const MAX_VCPUS: u8 = 64;

pub use crate::options::parse_options;
use crate::virtio::iommu::IommuOptions;

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

/// `memory` of cloud-hypervisor's `VmConfig` (sizes in bytes): what the
/// API's `vm.create` takes and `vm.info` prints. `--memory` fills the same
/// struct, so both are checked by [`MemoryConfig::from_spec`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemorySpec {
    /// Guest RAM in bytes.
    pub size: u64,
    /// Transparent huge pages (default on, as in cloud-hypervisor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thp: Option<bool>,
    /// memfd-backed RAM other processes can map.
    #[serde(default)]
    pub shared: bool,
}

/// Why a [`MemorySpec`] is refused.
#[derive(Debug, thiserror::Error)]
pub enum MemorySpecError {
    /// Below [`MIN_MEMORY_SIZE`].
    #[error("at least {} MiB are needed", MIN_MEMORY_SIZE >> 20)]
    TooSmall,
    /// Above [`MAX_MEMORY_SIZE`].
    #[error("at most {} GiB are supported", MAX_MEMORY_SIZE >> 30)]
    TooLarge,
    /// Not whole pages.
    #[error("size must be a multiple of 4 KiB")]
    Unaligned,
}

impl MemoryConfig {
    /// Parses and validates `--memory`.
    pub fn parse(value: &str) -> Result<Self, Error> {
        let opts = parse_options("memory", value, &["size", "thp", "shared"])?;
        let bad = |reason: OptionReason| Error::InvalidOption {
            option: "memory",
            value: value.to_string(),
            reason,
        };
        let text = opts
            .get("size")
            .ok_or_else(|| bad("size=... is required".into()))?;
        let size = parse_size(text)
            .ok_or_else(|| bad(format!("'{text}' is not a size such as 512M or 2G").into()))?;
        let thp = match opts.get("thp").map(String::as_str) {
            None => None,
            Some("on") => Some(true),
            Some("off") => Some(false),
            Some(other) => return Err(bad(format!("thp={other}: expected on or off").into())),
        };
        let shared = match opts.get("shared").map(String::as_str) {
            None | Some("off") => false,
            Some("on") => true,
            Some(other) => return Err(bad(format!("shared={other}: expected on or off").into())),
        };
        Self::from_spec(&MemorySpec { size, thp, shared }).map_err(|e| bad(e.into()))
    }

    /// Checks a memory description from the command line or the API.
    pub fn from_spec(spec: &MemorySpec) -> Result<Self, MemorySpecError> {
        let size = spec.size;
        if size < MIN_MEMORY_SIZE {
            return Err(MemorySpecError::TooSmall);
        }
        if size > MAX_MEMORY_SIZE {
            return Err(MemorySpecError::TooLarge);
        }
        if size & 0xfff != 0 {
            return Err(MemorySpecError::Unaligned);
        }
        Ok(Self {
            size,
            thp: spec.thp.unwrap_or(true),
            shared: spec.shared,
        })
    }

    /// The description [`MemoryConfig::from_spec`] turns back into `self`.
    pub fn to_spec(&self) -> MemorySpec {
        MemorySpec {
            size: self.size,
            thp: Some(self.thp),
            shared: self.shared,
        }
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

/// `cpus` of cloud-hypervisor's `VmConfig`, filled by `--cpus` too.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpusSpec {
    /// vCPUs at boot.
    pub boot_vcpus: u64,
    /// The most vCPUs (default: `boot_vcpus`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_vcpus: Option<u64>,
}

impl Default for CpusSpec {
    fn default() -> Self {
        Self {
            boot_vcpus: 1,
            max_vcpus: None,
        }
    }
}

/// Why a [`CpusSpec`] is refused.
#[derive(Debug, thiserror::Error)]
pub enum CpusSpecError {
    /// `boot_vcpus` is 0 or above [`MAX_VCPUS`].
    #[error("boot must be between 1 and {MAX_VCPUS}")]
    Boot,
    /// `max_vcpus` is below `boot_vcpus` or above [`MAX_VCPUS`].
    #[error("max must be between boot ({boot}) and {MAX_VCPUS}")]
    Max {
        /// `boot_vcpus`.
        boot: u64,
    },
}

impl CpusConfig {
    /// Parses and validates `--cpus`.
    pub fn parse(value: &str) -> Result<Self, Error> {
        let opts = parse_options("cpus", value, &["boot", "max"])?;
        let bad = |reason: OptionReason| Error::InvalidOption {
            option: "cpus",
            value: value.to_string(),
            reason,
        };
        let text = opts
            .get("boot")
            .ok_or_else(|| bad("boot=N is required".into()))?;
        let boot_vcpus = text
            .parse()
            .map_err(|_| bad(format!("'{text}' is not a number").into()))?;
        let max_vcpus = match opts.get("max") {
            None => None,
            Some(text) => Some(
                text.parse()
                    .map_err(|_| bad(format!("max: '{text}' is not a number").into()))?,
            ),
        };
        Self::from_spec(&CpusSpec {
            boot_vcpus,
            max_vcpus,
        })
        .map_err(|e| bad(e.into()))
    }

    /// Checks a vCPU description from the command line or the API.
    pub fn from_spec(spec: &CpusSpec) -> Result<Self, CpusSpecError> {
        let limit = u64::from(MAX_VCPUS);
        let boot = spec.boot_vcpus;
        if boot == 0 || boot > limit {
            return Err(CpusSpecError::Boot);
        }
        let max = spec.max_vcpus.unwrap_or(boot);
        if max < boot || max > limit {
            return Err(CpusSpecError::Max { boot });
        }
        // Both are at most MAX_VCPUS (checked above), so they fit.
        Ok(Self {
            boot: u8::try_from(boot).map_err(|_| CpusSpecError::Boot)?,
            max: u8::try_from(max).map_err(|_| CpusSpecError::Max { boot })?,
        })
    }

    /// The description [`CpusConfig::from_spec`] turns back into `self`.
    pub fn to_spec(&self) -> CpusSpec {
        CpusSpec {
            boot_vcpus: self.boot.into(),
            max_vcpus: Some(self.max.into()),
        }
    }
}

/// `--serial tty|pty|file=PATH|socket=PATH|off`
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SerialConfig {
    /// Output to stdout, input from stdin.
    Tty,
    /// A new pseudo-terminal; the path of its slave once the VM has it
    /// (what `vm.info` reports as `serial.file`, libvirt opens).
    Pty(Option<PathBuf>),
    /// Output appended to a file; no input.
    File(PathBuf),
    /// A UNIX socket the VMM listens on; one client at a time
    /// (`devices::socket_console`).
    Socket(PathBuf),
    /// No serial port.
    Off,
}

/// cloud-hypervisor's `ConsoleMode`: how `serial` and `console` are
/// spelled in its `VmConfig`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConsoleMode {
    /// No device.
    Off,
    /// A pseudo-terminal.
    Pty,
    /// stdout/stdin.
    Tty,
    /// Output to a file.
    File,
    /// A UNIX socket the VMM listens on.
    Socket,
    /// A device whose output goes nowhere (dmavisor: none at all).
    Null,
}

/// `serial` (and `console`) of cloud-hypervisor's `VmConfig`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleSpec {
    /// Where output goes.
    pub mode: ConsoleMode,
    /// The file of [`ConsoleMode::File`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// The socket of [`ConsoleMode::Socket`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<PathBuf>,
    /// The virtio-console behind the vIOMMU (`console` only).
    #[serde(default, skip_serializing_if = "is_false")]
    pub iommu: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl ConsoleSpec {
    /// A description with no file nor socket.
    pub fn mode(mode: ConsoleMode) -> Self {
        Self {
            mode,
            file: None,
            socket: None,
            iommu: false,
        }
    }
}

/// The socket path of `spec`, which must be mode Socket's alone.
fn socket_of(spec: &ConsoleSpec) -> Result<Option<PathBuf>, ConsoleSpecError> {
    match (spec.mode, &spec.socket) {
        (ConsoleMode::Socket, Some(p)) if !p.as_os_str().is_empty() => Ok(Some(p.clone())),
        (ConsoleMode::Socket, _) => Err(ConsoleSpecError::NoSocket),
        (_, Some(_)) => Err(ConsoleSpecError::SocketWithoutSocketMode { mode: spec.mode }),
        (_, None) => Ok(None),
    }
}

/// Why a [`ConsoleSpec`] is refused.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleSpecError {
    /// [`ConsoleMode::File`] without a path.
    #[error("mode File needs a file path")]
    NoFile,
    /// [`ConsoleMode::Socket`] without a path.
    #[error("mode Socket needs a socket path")]
    NoSocket,
    /// A socket with another mode than [`ConsoleMode::Socket`].
    #[error("a socket goes with mode Socket, not {mode:?}")]
    SocketWithoutSocketMode {
        /// The mode given.
        mode: ConsoleMode,
    },
    /// `iommu` on the serial port, which is no PCI device.
    #[error("iommu: the serial port is no PCI device (only the console can be behind the vIOMMU)")]
    SerialIommu,
    /// `iommu` with no console device (`Off`, or `Null` from the API).
    #[error("iommu needs a console device, not mode {mode:?}")]
    IommuWithoutDevice {
        /// The mode given.
        mode: ConsoleMode,
    },
    /// A file with another mode than [`ConsoleMode::File`].
    #[error("a file goes with mode File, not {mode:?}")]
    FileWithoutFileMode {
        /// The mode given.
        mode: ConsoleMode,
    },
}

impl SerialConfig {
    /// Parses `--serial`.
    pub fn parse(value: &str) -> Result<Self, Error> {
        let bad = |reason: OptionReason| Error::InvalidOption {
            option: "serial",
            value: value.to_string(),
            reason,
        };
        let spec = match value {
            "tty" => ConsoleSpec::mode(ConsoleMode::Tty),
            "pty" => ConsoleSpec::mode(ConsoleMode::Pty),
            "off" | "null" => ConsoleSpec::mode(ConsoleMode::Off),
            _ => spec_with_path(value)
                .ok_or_else(|| bad("expected tty, pty, file=PATH, socket=PATH or off".into()))?,
        };
        Self::from_spec(&spec).map_err(|e| bad(e.into()))
    }

    /// Checks a serial port description from the command line or the API.
    pub fn from_spec(spec: &ConsoleSpec) -> Result<Self, ConsoleSpecError> {
        if spec.iommu {
            return Err(ConsoleSpecError::SerialIommu);
        }
        if let Some(socket) = socket_of(spec)? {
            return match &spec.file {
                None => Ok(Self::Socket(socket)),
                Some(_) => Err(ConsoleSpecError::FileWithoutFileMode { mode: spec.mode }),
            };
        }
        match (spec.mode, &spec.file) {
            (ConsoleMode::Tty, None) => Ok(Self::Tty),
            // A file with Pty is the path `vm.info` reported: what the
            // controller reads back to rebuild a VM in place. Each boot
            // opens a new pty whatever it says.
            (ConsoleMode::Pty, file) => Ok(Self::Pty(file.clone())),
            (ConsoleMode::Off | ConsoleMode::Null, None) => Ok(Self::Off),
            (ConsoleMode::File, Some(p)) if !p.as_os_str().is_empty() => Ok(Self::File(p.clone())),
            (ConsoleMode::File, _) => Err(ConsoleSpecError::NoFile),
            // socket_of refused it already.
            (ConsoleMode::Socket, None) => Err(ConsoleSpecError::NoSocket),
            (mode, Some(_)) => Err(ConsoleSpecError::FileWithoutFileMode { mode }),
        }
    }

    /// The description [`SerialConfig::from_spec`] turns back into `self`.
    pub fn to_spec(&self) -> ConsoleSpec {
        let (mode, file) = match self {
            Self::Tty => (ConsoleMode::Tty, None),
            Self::Pty(path) => (ConsoleMode::Pty, path.clone()),
            Self::File(p) => (ConsoleMode::File, Some(p.clone())),
            Self::Socket(p) => return socket_spec(p),
            Self::Off => (ConsoleMode::Off, None),
        };
        ConsoleSpec {
            file,
            ..ConsoleSpec::mode(mode)
        }
    }
}

/// `file=PATH` or `socket=PATH` of `--serial` and `--console`.
fn spec_with_path(value: &str) -> Option<ConsoleSpec> {
    if let Some(path) = value.strip_prefix("file=") {
        return Some(ConsoleSpec {
            file: Some(PathBuf::from(path)),
            ..ConsoleSpec::mode(ConsoleMode::File)
        });
    }
    value.strip_prefix("socket=").map(socket_spec)
}

fn socket_spec(path: impl Into<PathBuf>) -> ConsoleSpec {
    ConsoleSpec {
        socket: Some(path.into()),
        ..ConsoleSpec::mode(ConsoleMode::Socket)
    }
}

/// `--console off|null|tty|pty|file=PATH|socket=PATH`: the virtio-console.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConsoleConfig {
    /// No device (the default: a device at boot would move PCI slots).
    Off,
    /// A device whose output goes nowhere.
    Null,
    /// Output to stdout, input from stdin.
    Tty,
    /// A new pseudo-terminal; its slave's path once the VM has it.
    Pty(Option<PathBuf>),
    /// Output appended to a file; no input.
    File(PathBuf),
    /// A UNIX socket the VMM listens on; one client at a time.
    Socket(PathBuf),
}

impl ConsoleConfig {
    /// Parses `--console` without `iommu=`.
    pub fn parse(value: &str) -> Result<Self, Error> {
        match Self::parse_with_iommu(value)? {
            (c, false) => Ok(c),
            (_, true) => Err(Error::InvalidOption {
                option: "console",
                value: value.to_string(),
                reason: "iommu=on is not taken here".into(),
            }),
        }
    }

    /// Parses `--console MODE[,iommu=on|off]`: the back-end, and whether
    /// the device sits behind the vIOMMU (cloud-hypervisor's spelling;
    /// its `file=`/`socket=` paths cannot hold a comma either).
    pub fn parse_with_iommu(value: &str) -> Result<(Self, bool), Error> {
        let bad = |reason: OptionReason| Error::InvalidOption {
            option: "console",
            value: value.to_string(),
            reason,
        };
        let (value, iommu) = match value.rsplit_once(",iommu=") {
            Some((mode, "on")) => (mode, true),
            Some((mode, "off")) => (mode, false),
            Some((_, o)) => return Err(bad(format!("iommu must be on or off, not '{o}'").into())),
            None => (value, false),
        };
        let spec = ConsoleSpec {
            iommu,
            ..Self::mode_spec(value).ok_or_else(|| {
                bad("expected off, null, tty, pty, file=PATH or socket=PATH".into())
            })?
        };
        let console = Self::from_spec(&spec).map_err(|e| bad(e.into()))?;
        Ok((console, iommu))
    }

    /// The description of a `--console` mode without options.
    fn mode_spec(value: &str) -> Option<ConsoleSpec> {
        Some(match value {
            "off" => ConsoleSpec::mode(ConsoleMode::Off),
            "null" => ConsoleSpec::mode(ConsoleMode::Null),
            "tty" => ConsoleSpec::mode(ConsoleMode::Tty),
            "pty" => ConsoleSpec::mode(ConsoleMode::Pty),
            _ => return spec_with_path(value),
        })
    }

    /// Checks a console description from the command line or the API
    /// (its `iommu` is the caller's: see [`VmConfig::console_iommu`]).
    pub fn from_spec(spec: &ConsoleSpec) -> Result<Self, ConsoleSpecError> {
        if spec.iommu && matches!(spec.mode, ConsoleMode::Off | ConsoleMode::Null) {
            return Err(ConsoleSpecError::IommuWithoutDevice { mode: spec.mode });
        }
        if let Some(socket) = socket_of(spec)? {
            return match &spec.file {
                None => Ok(Self::Socket(socket)),
                Some(_) => Err(ConsoleSpecError::FileWithoutFileMode { mode: spec.mode }),
            };
        }
        match (spec.mode, &spec.file) {
            (ConsoleMode::Off, None) => Ok(Self::Off),
            (ConsoleMode::Null, None) => Ok(Self::Null),
            (ConsoleMode::Tty, None) => Ok(Self::Tty),
            (ConsoleMode::Pty, file) => Ok(Self::Pty(file.clone())),
            (ConsoleMode::File, Some(p)) if !p.as_os_str().is_empty() => Ok(Self::File(p.clone())),
            (ConsoleMode::File, _) => Err(ConsoleSpecError::NoFile),
            // socket_of refused it already.
            (ConsoleMode::Socket, None) => Err(ConsoleSpecError::NoSocket),
            (mode, Some(_)) => Err(ConsoleSpecError::FileWithoutFileMode { mode }),
        }
    }

    /// The description [`ConsoleConfig::from_spec`] turns back into `self`.
    pub fn to_spec(&self) -> ConsoleSpec {
        let (mode, file) = match self {
            Self::Off => (ConsoleMode::Off, None),
            Self::Null => (ConsoleMode::Null, None),
            Self::Tty => (ConsoleMode::Tty, None),
            Self::Pty(p) => (ConsoleMode::Pty, p.clone()),
            Self::File(p) => (ConsoleMode::File, Some(p.clone())),
            Self::Socket(p) => return socket_spec(p),
        };
        ConsoleSpec {
            file,
            ..ConsoleSpec::mode(mode)
        }
    }

    /// Refuses a console and a serial port both on the terminal: WHY only
    /// one can read stdin, and two readers would split the keystrokes.
    pub fn check_with(&self, serial: &SerialConfig) -> Result<(), &'static str> {
        match (self, serial) {
            (Self::Tty, SerialConfig::Tty) => Err(
                "console and serial both on tty: only one can read stdin (put the serial off, on a file or a pty)",
            ),
            (Self::Socket(a), SerialConfig::Socket(b)) if a == b => {
                Err("console and serial on the same socket path: each listens on its own")
            }
            _ => Ok(()),
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
    /// The virtio-console.
    pub console: ConsoleConfig,
    /// The virtio-console sits behind the vIOMMU (`--console ..,iommu=on`,
    /// `console.iommu`). WHY beside `console` and not in it: the back-end
    /// is rebuilt (a pty's path filled in) without touching the placement.
    pub console_iommu: bool,
    /// virtio-net devices (`--net`, repeatable).
    pub net: Vec<crate::net::NetConfig>,
    /// virtio-blk devices (`--disk`, repeatable).
    pub disks: Vec<crate::block::DiskConfig>,
    /// The virtio-iommu (`--iommu`), if any.
    pub iommu: Option<IommuOptions>,
    /// DMA test devices (`--dma-test`, repeatable).
    pub dma_test: Vec<crate::dma_test::DmaTestConfig>,
    /// Assigned host PCI functions (`--device`, repeatable).
    pub devices: Vec<crate::vfio::VfioConfig>,
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
        assert_eq!(SerialConfig::parse("pty").unwrap(), SerialConfig::Pty(None));
        assert!(SerialConfig::parse("socket").is_err());
    }

    #[test]
    fn console_config_and_the_tty_conflict() {
        assert_eq!(ConsoleConfig::parse("off").unwrap(), ConsoleConfig::Off);
        assert_eq!(ConsoleConfig::parse("null").unwrap(), ConsoleConfig::Null);
        assert_eq!(
            ConsoleConfig::parse("pty").unwrap(),
            ConsoleConfig::Pty(None)
        );
        assert_eq!(
            ConsoleConfig::parse("file=/tmp/c").unwrap(),
            ConsoleConfig::File(PathBuf::from("/tmp/c"))
        );
        assert!(ConsoleConfig::parse("file=").is_err());
        assert!(ConsoleConfig::parse("socket").is_err());
        let tty = ConsoleConfig::parse("tty").unwrap();
        assert!(tty
            .check_with(&SerialConfig::Tty)
            .unwrap_err()
            .contains("both on tty"));
        assert!(tty.check_with(&SerialConfig::Off).is_ok());
        assert!(ConsoleConfig::Pty(None)
            .check_with(&SerialConfig::Tty)
            .is_ok());
        let shown = ConsoleConfig::Pty(Some(PathBuf::from("/dev/pts/7"))).to_spec();
        assert_eq!(shown.mode, ConsoleMode::Pty);
        assert_eq!(shown.file, Some(PathBuf::from("/dev/pts/7")));
        assert_eq!(SerialConfig::parse("null").unwrap(), SerialConfig::Off);
    }

    #[test]
    fn options_map() {
        let m = parse_options("net", "a=1,b=2,", &["a", "b"]).unwrap();
        assert_eq!(m.get("a").map(String::as_str), Some("1"));
        assert_eq!(m.get("b").map(String::as_str), Some("2"));
        assert!(parse_options("net", "c=1", &["a"]).is_err());
    }
}
