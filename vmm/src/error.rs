//! The VMM's error type: every failure a user can cause ends as one of these
//! and is printed as a single line by `main`.

use std::path::PathBuf;

use thiserror::Error;

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
        /// What is wrong with it.
        reason: String,
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
        reason: String,
    },
    /// The kernel, initramfs or boot data do not fit in guest memory.
    #[error("guest memory too small: {0}")]
    DoesNotFit(String),
    /// /dev/kvm cannot be opened or used.
    #[error("{0}")]
    Kvm(String),
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
    Acpi(String),
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
    /// The configuration a reboot handed over (`crate::reboot`) is not
    /// valid: only a different dmavisor binary could have written it.
    #[error("the VM configuration handed over by vm.reboot: {0}")]
    HandedOver(String),
    /// Creating a thread or event fd failed.
    #[error("{what}: {source}")]
    Os {
        /// The operation.
        what: &'static str,
        /// OS error.
        source: std::io::Error,
    },
}

impl Error {
    /// A device module's own error, as [`Error::Device`].
    pub fn device(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Device(Box::new(e))
    }
}

/// Shorthand for KVM ioctl errors.
pub fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |source| Error::KvmIoctl { what, source }
}
