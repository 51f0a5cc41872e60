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
    /// Guest RAM could not be mapped.
    #[error("cannot allocate guest memory: {0}")]
    GuestMemory(String),
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
    /// Registering a device failed.
    #[error("device setup: {0}")]
    Device(String),
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

/// Shorthand for KVM ioctl errors.
pub fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |source| Error::KvmIoctl { what, source }
}
