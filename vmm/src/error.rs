//! The VMM's error type: every failure a user can cause ends as one of these
//! and is printed as a single line by `main`.

use std::path::PathBuf;

use thiserror::Error;

/// Why a command line option is refused ([`Error::InvalidOption`]).
pub type OptionReason = Box<dyn std::error::Error + Send + Sync>;

/// Everything that can stop the VMM before or while the guest runs.
#[derive(Debug, Error)]
pub enum Error {
    /// A command line option is malformed.
    #[error("invalid --{option} value '{value}': {reason}")]
    InvalidOption {
        /// Flag name without dashes.
        option: &'static str,
        /// The text given.
        value: String,
        /// What is wrong with it: a sentence, or the section's own error
        /// (`NetSpecError`, ...).
        #[source]
        reason: OptionReason,
    },
    /// A file named on the command line cannot be opened or read.
    #[error("cannot read {what} '{path}': {source}")]
    ReadFile {
        /// What the file was supposed to be ("kernel", "initramfs").
        what: &'static str,
        /// Path given.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// The kernel file is neither a bzImage nor an ELF vmlinux.
    #[error("'{path}' is not a Linux kernel: {reason}")]
    NotAKernel {
        /// Path given.
        path: PathBuf,
        /// Why loading failed.
        #[source]
        reason: KernelRejected,
    },
    /// The kernel, initramfs or boot data do not fit in guest memory.
    #[error("guest memory too small: {0}")]
    DoesNotFit(#[from] DoesNotFit),
    /// /dev/kvm cannot be opened or used.
    #[error("{0}")]
    Kvm(#[from] KvmUnusable),
    /// A KVM list (CPUID entries, MSRs) is longer than its ioctl takes.
    #[error("too many {what}: {source}")]
    KvmList {
        /// The list ("CPUID entries", "MSRs").
        what: &'static str,
        /// The size check that failed.
        source: vmm_sys_util::fam::Error,
    },
    /// A KVM ioctl failed during setup.
    #[error("KVM {what} failed: {source}")]
    KvmIoctl {
        /// The operation.
        what: &'static str,
        /// errno.
        source: kvm_ioctls::Error,
    },
    /// Guest RAM could not be mapped (`memory::RamError`, or KVM's view
    /// of a region).
    #[error("cannot allocate guest memory: {0}")]
    GuestMemory(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Writing boot data into guest memory failed.
    #[error("cannot write {0} into guest memory")]
    GuestWrite(&'static str),
    /// Building ACPI tables failed.
    #[error("ACPI: {0}")]
    Acpi(#[from] AcpiError),
    /// Opening or writing the serial output failed.
    #[error("serial output '{path}': {source}")]
    SerialOutput {
        /// File given.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// Setting up a device failed; the source is the device module's own
    /// error (`BusError`, `PlugError`, `VfioError`, ...), turned into this
    /// by [`Error::device`] or the module's `From` impl.
    #[error("device setup: {0}")]
    Device(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The REST API's HTTP server could not start on its socket.
    #[error("device setup: API socket: {0}")]
    ApiServer(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// `vm.create` or a command-line VM while the VMM holds one already.
    #[error("device setup: a VM exists already")]
    VmExists,
    /// `Controller::boot_reserved` without a `Controller::reserve` first.
    #[error("device setup: no VM reserved for booting")]
    NothingReserved,
    /// Building the VM failed at one of `vm::start`'s steps.
    #[error("{0}")]
    Start(#[from] StartError),
    /// Creating a thread or event fd failed.
    #[error("{what}: {source}")]
    Os {
        /// The operation.
        what: &'static str,
        /// OS error.
        source: std::io::Error,
    },
}

/// Why a kernel file cannot be booted ([`Error::NotAKernel`]).
#[derive(Debug, Error)]
pub enum KernelRejected {
    /// An ELF file the loader refuses.
    #[error("{0}")]
    Elf(#[source] linux_loader::loader::Error),
    /// An ELF vmlinux without the PVH entry point.
    #[error("ELF image has no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY); use the bzImage")]
    NoPvhEntry,
    /// Not ELF, and not a bzImage the loader accepts.
    #[error("neither an ELF vmlinux nor a loadable bzImage ({0})")]
    NotBzImage(#[source] linux_loader::loader::Error),
    /// A bzImage without its setup header.
    #[error("bzImage without setup header")]
    NoSetupHeader,
    /// A boot protocol older than 2.12.
    #[error(
        "boot protocol {}.{:02} is too old for 64-bit entry (need 2.12)",
        version >> 8,
        version & 0xff
    )]
    OldProtocol {
        /// The setup header's protocol version.
        version: u16,
    },
    /// A bzImage without XLF_KERNEL_64.
    #[error("bzImage has no 64-bit entry point")]
    No64BitEntry,
}

/// Hint appended to every "no usable KVM" message.
pub const RUNNER_HINT: &str =
    "run dmavisor inside the nested-virt runner: resources/run-kvm -- dmavisor ...";

/// What does not fit in guest memory ([`Error::DoesNotFit`]).
#[derive(Debug, Error)]
pub enum DoesNotFit {
    /// The zero page's e820 table is full.
    #[error("too many e820 entries")]
    E820Entries,
    /// The PVH start info's memory map is full.
    #[error("too many PVH memory map entries")]
    PvhMemmapEntries,
    /// A value the zero page holds in 32 bits is wider.
    #[error("the {0} does not fit the zero page's 32-bit field")]
    ZeroPageField(&'static str),
    /// The initramfs does not fit below the kernel's limit.
    #[error(
        "initramfs '{}' ({size} bytes) does not fit between {min_start:#x} and {max_end:#x}",
        path.display()
    )]
    Initramfs {
        /// Path given.
        path: PathBuf,
        /// Its size in bytes.
        size: u64,
        /// Lowest address it may start at (the kernel's end).
        min_start: u64,
        /// Highest address it may end at.
        max_end: u64,
    },
}

/// Why /dev/kvm (or `$DMAVISOR_KVM_DEVICE`) cannot be used
/// ([`Error::Kvm`]); each message but the first ends with [`RUNNER_HINT`].
#[derive(Debug, Error)]
pub enum KvmUnusable {
    /// The path holds a NUL byte.
    #[error("invalid KVM device path {path}")]
    InvalidPath {
        /// The path, as displayed.
        path: String,
    },
    /// The device node does not exist.
    #[error("{path} does not exist (no KVM on this host); {}", RUNNER_HINT)]
    Missing {
        /// The path, as displayed.
        path: String,
    },
    /// The user may not open it.
    #[error(
        "no permission to open {path} (are you in group 'kvm'?); {}",
        RUNNER_HINT
    )]
    NoPermission {
        /// The path, as displayed.
        path: String,
    },
    /// Opening it failed otherwise.
    #[error("cannot open {path}: {source}; {}", RUNNER_HINT)]
    Open {
        /// The path, as displayed.
        path: String,
        /// errno.
        source: kvm_ioctls::Error,
    },
    /// It answers with another API version.
    #[error(
        "{path} is not a usable KVM device (API version {version}); {}",
        RUNNER_HINT
    )]
    ApiVersion {
        /// The path, as displayed.
        path: String,
        /// What KVM_GET_API_VERSION returned.
        version: i32,
    },
    /// A capability the VMM relies on is missing.
    #[error("{path} lacks {what} (KVM_CAP {cap:?}); {}", RUNNER_HINT)]
    MissingCap {
        /// The path, as displayed.
        path: String,
        /// What the capability provides.
        what: &'static str,
        /// The capability.
        cap: kvm_ioctls::Cap,
    },
}

/// Why the ACPI tables cannot be placed ([`Error::Acpi`]).
#[derive(Debug, Error)]
pub enum AcpiError {
    /// The tables outgrow the BIOS area they are written to.
    #[error("tables need {bytes:#x} bytes, more than the BIOS area holds")]
    TooLarge {
        /// Bytes the tables need.
        bytes: u64,
    },
    /// The RSDP landed elsewhere than where the boot data points.
    #[error("RSDP at {rsdp:#x}, the boot data says {expected:#x}")]
    RsdpMoved {
        /// Where it was written.
        rsdp: u64,
        /// Where the boot data points.
        expected: u64,
    },
}

impl Error {
    /// A device module's own error, as [`Error::Device`].
    pub fn device(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Device(Box::new(e))
    }

    /// The error itself, or the one the failed build step reported: what
    /// decides the exit status.
    pub fn step_error(&self) -> &Error {
        match self {
            Self::Start(e) => e.error().step_error(),
            other => other,
        }
    }
}

/// Why `vm::start` failed: one variant per build step (in their order),
/// each wrapping the error that step reported. The message is the step's
/// error alone, as before the steps were named; the variant says where.
#[derive(Debug, Error)]
pub enum StartError {
    /// An assigned function (`--device`) is not bound to vfio-pci; checked
    /// before anything is built.
    #[error("{0}")]
    CheckDevices(#[source] Box<Error>),
    /// Guest RAM, the kernel, initramfs, command line and boot data.
    #[error("{0}")]
    MemoryAndBoot(#[source] Box<Error>),
    /// Opening KVM and creating the VM (irqchip, PIT, memory slots).
    #[error("{0}")]
    KvmVm(#[source] Box<Error>),
    /// The buses, COM1, power and reset ports, power button, hotplug
    /// registers, PCI configuration access.
    #[error("{0}")]
    LegacyDevices(#[source] Box<Error>),
    /// The vIOMMU, `--net`, `--disk`, `--dma-test` and `--device`.
    #[error("{0}")]
    PciDevices(#[source] Box<Error>),
    /// The ACPI tables.
    #[error("{0}")]
    Acpi(#[source] Box<Error>),
    /// The PCI hotplug thread.
    #[error("{0}")]
    Hotplug(#[source] Box<Error>),
    /// Creating and configuring the vCPUs.
    #[error("{0}")]
    Vcpus(#[source] Box<Error>),
    /// Starting the vCPU and stdin threads.
    #[error("{0}")]
    Threads(#[source] Box<Error>),
}

impl StartError {
    /// The error the step reported.
    pub fn error(&self) -> &Error {
        match self {
            Self::CheckDevices(e)
            | Self::MemoryAndBoot(e)
            | Self::KvmVm(e)
            | Self::LegacyDevices(e)
            | Self::PciDevices(e)
            | Self::Acpi(e)
            | Self::Hotplug(e)
            | Self::Vcpus(e)
            | Self::Threads(e) => e,
        }
    }

    /// `variant` (a step) as a `map_err` argument: `step(StartError::Acpi)`.
    pub fn step(variant: fn(Box<Error>) -> Self) -> impl FnOnce(Error) -> Self {
        move |e| variant(Box::new(e))
    }
}

/// Shorthand for KVM ioctl errors.
pub fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |source| Error::KvmIoctl { what, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_step_prints_its_error_and_keeps_it_for_the_exit_status() {
        let inner = Error::InvalidOption {
            option: "cpus",
            value: "boot=200".into(),
            reason: "this host's KVM supports at most 8 vCPUs".into(),
        };
        let message = inner.to_string();
        let e = Error::from(StartError::step(StartError::KvmVm)(inner));
        assert_eq!(e.to_string(), message);
        assert!(matches!(&e, Error::Start(StartError::KvmVm(_))));
        assert!(matches!(e.step_error(), Error::InvalidOption { .. }));
        let source = std::error::Error::source(&e).map(ToString::to_string);
        assert_eq!(source, Some(message));
    }
}
