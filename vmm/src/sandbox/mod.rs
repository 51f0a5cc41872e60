//! The VMM's sandbox: what a memory-safety bug in a device model can still
//! do once it has the thread it ran on.
//!
//! WHY: the VMM runs as root (KVM, VFIO, TAP) and turns guest-written
//! descriptors into raw iovecs. Three layers bound the damage, each cheap:
//!
//! - `no_new_privs` ([`set_no_new_privs`]): nothing the VMM executes gains
//!   privileges (and seccomp filters may be installed without
//!   `CAP_SYS_ADMIN`);
//! - Landlock ([`landlock`]): before any thread starts, the process keeps
//!   access to the files its configuration names and the `--landlock-rules`
//!   only, so a path the API hands in later must fall inside those rules;
//! - seccomp ([`seccomp`], [`filters`]): every thread started through
//!   [`spawn`] installs the allow-list of its [`ThreadKind`] before it runs
//!   a line of its own code, so before it touches guest input.
//!
//! This module is a leaf (it imports only `options` and `error`), so every
//! device module can start its threads through [`spawn`].

pub mod filters;
#[cfg(test)]
mod hotplug_filter_tests;
pub mod landlock;
pub mod seccomp;
mod sigsys;
mod syscall_names;

use std::io;
use std::thread::{Builder, JoinHandle};

pub use filters::ThreadKind;
pub use landlock::{LandlockAccess, LandlockRule};
pub use seccomp::SeccompMode;

/// `--seccomp`'s default: `true`, as cloud-hypervisor's. Every guest of
/// the integration suite boots with it, so the suite proves the lists
/// complete (docs/sandbox.md: the calls it found missing and why).
pub const DEFAULT_SECCOMP: &str = "true";

/// Why the sandbox could not be put in place; the VMM refuses to run
/// unconfined when confinement was asked for.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// `prctl(PR_SET_NO_NEW_PRIVS)` failed.
    #[error("cannot set no_new_privs: {0}")]
    NoNewPrivs(#[source] io::Error),
    /// A Landlock rule's path cannot be opened (it must exist).
    #[error("landlock: cannot open {path}: {source}")]
    LandlockPath {
        /// The rule's path.
        path: std::path::PathBuf,
        /// Why it cannot be opened.
        #[source]
        source: io::Error,
    },
    /// The kernel refused the ruleset.
    #[error("landlock: {0}")]
    Landlock(#[from] ::landlock::RulesetError),
    /// `--landlock` was given on a kernel without Landlock.
    #[error("landlock: this kernel does not enforce Landlock (is it in the LSM list?)")]
    LandlockUnsupported,
    /// A thread kind's filter does not compile.
    #[error("seccomp: filter of {kind:?} threads: {source}")]
    SeccompFilter {
        /// The thread kind.
        kind: ThreadKind,
        /// The compiler's complaint.
        #[source]
        source: seccompiler::BackendError,
    },
    /// The kernel refused a filter.
    #[error("seccomp: cannot install the filter of {kind:?} threads: {source}")]
    SeccompInstall {
        /// The thread kind.
        kind: ThreadKind,
        /// The kernel's answer.
        #[source]
        source: seccompiler::Error,
    },
    /// The SIGSYS handler could not be installed.
    #[error("seccomp: cannot install the SIGSYS handler: {0}")]
    SigsysHandler(#[source] io::Error),
}

/// Sets `no_new_privs` for the whole process (threads started later
/// inherit it): nothing the VMM could execute ever gains privileges.
pub fn set_no_new_privs() -> Result<(), SandboxError> {
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only and
    // changes no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
    if rc != 0 {
        return Err(SandboxError::NoNewPrivs(io::Error::last_os_error()));
    }
    Ok(())
}

/// Starts a thread named `name` that installs the seccomp filter of `kind`
/// (as [`seccomp::set_mode`] chose) and then runs `f`.
///
/// WHY one helper: the filter must be in place before the thread reads
/// anything a guest wrote, and a spawn site that forgets it would leave a
/// thread unconfined without anyone noticing. The filter is compiled here,
/// so a filter that does not compile fails the spawn; one the kernel
/// refuses ends the VMM from the new thread (it must not run unconfined).
pub fn spawn<F, T>(kind: ThreadKind, name: impl Into<String>, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let program = seccomp::program_for(kind).map_err(io::Error::other)?;
    Builder::new().name(name.into()).spawn(move || {
        if let Some(program) = program {
            if let Err(e) = seccomp::install(kind, &program) {
                eprintln!("dmavisor: error: {e}; ending the VMM");
                std::process::exit(1);
            }
        }
        seccomp::probe_hook();
        f()
    })
}
