//! `--seccomp true|false|log` (cloud-hypervisor's spelling): the action a
//! thread's filter takes on a system call outside its kind's allow-list.
//!
//! WHY per thread and not per process: seccomp filters belong to a thread
//! and are inherited by the threads it starts. A vCPU does not need what
//! the API thread does (open files, create sockets), and a block worker
//! needs neither KVM ioctls nor sockets; one process-wide list would be
//! the union of all of them.
//!
//! The main thread stays unfiltered: it waits for exit events, tears VMs
//! down and, on a reboot, builds them again (`crate::vm_owner`), which
//! takes the calls of every thread kind.

use std::sync::OnceLock;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};

use super::filters::{rules, ThreadKind};
use super::SandboxError;
use crate::error::Error;

/// What a filter does with a system call outside its allow-list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeccompMode {
    /// `true`: the thread gets SIGSYS, whose handler names the thread and
    /// the call on stderr and ends the VMM.
    Enforce,
    /// `log`: the kernel logs the call (audit log / dmesg) and lets it
    /// run, to find what a filter lacks.
    Log,
    /// `false`: no filter.
    Off,
}

impl SeccompMode {
    /// Parses `--seccomp`'s value.
    pub fn parse(value: &str) -> Result<Self, Error> {
        match value {
            "true" => Ok(Self::Enforce),
            "log" => Ok(Self::Log),
            "false" => Ok(Self::Off),
            other => Err(Error::InvalidOption {
                option: "seccomp",
                value: other.to_string(),
                reason: "expected true, false or log".into(),
            }),
        }
    }
}

/// The mode of the process; unset (library users, unit tests) is `Off`.
static MODE: OnceLock<SeccompMode> = OnceLock::new();

/// Chooses the mode for every thread [`super::spawn`] starts from now on;
/// in `Enforce` mode it first installs the SIGSYS handler that reports a
/// violation. Only the first call counts.
pub fn set_mode(mode: SeccompMode) -> Result<(), SandboxError> {
    if mode == SeccompMode::Enforce {
        super::sigsys::install_handler().map_err(SandboxError::SigsysHandler)?;
    }
    let _ = MODE.set(mode);
    Ok(())
}

fn mode() -> SeccompMode {
    MODE.get().copied().unwrap_or(SeccompMode::Off)
}

/// The compiled filter of `kind` in the process's mode (`None` when off).
pub fn program_for(kind: ThreadKind) -> Result<Option<BpfProgram>, SandboxError> {
    let mismatch = match mode() {
        SeccompMode::Off => return Ok(None),
        SeccompMode::Log => SeccompAction::Log,
        SeccompMode::Enforce => SeccompAction::Trap,
    };
    compile(kind, mismatch).map(Some)
}

/// Compiles `kind`'s allow-list with `mismatch` for every other call.
pub fn compile(kind: ThreadKind, mismatch: SeccompAction) -> Result<BpfProgram, SandboxError> {
    let arch = TargetArch::x86_64;
    rules(kind)
        .and_then(|rules| SeccompFilter::new(rules, mismatch, SeccompAction::Allow, arch))
        .and_then(BpfProgram::try_from)
        .map_err(|source| SandboxError::SeccompFilter { kind, source })
}

/// Installs `program` on the calling thread (it stacks on any filter the
/// thread inherited: a call must pass both).
pub fn install(kind: ThreadKind, program: &BpfProgram) -> Result<(), SandboxError> {
    seccompiler::apply_filter(program)
        .map_err(|source| SandboxError::SeccompInstall { kind, source })
}

/// Test-only: `DMAVISOR_SECCOMP_PROBE=<thread name>` (or `<prefix>*`)
/// makes every thread started through [`super::spawn`] of that name call
/// `ptrace` (with an invalid request: harmless where it is let through),
/// which no thread kind allows, right after its filter is in place. It
/// proves, from the outside, that the filter is installed and that a
/// violation ends the VMM with the thread and the call named.
#[cfg(any(debug_assertions, feature = "test-mutations"))]
pub fn probe_hook() {
    let Some(prefix) = probe_prefix() else {
        return;
    };
    let matches = |name: &str| match prefix.strip_suffix('*') {
        Some(p) => name.starts_with(p),
        None => name == prefix,
    };
    if std::thread::current().name().is_some_and(matches) {
        // SAFETY: request -1 is invalid: the kernel answers EIO without
        // looking at the other arguments (when the filter lets it through).
        unsafe { libc::syscall(libc::SYS_ptrace, -1i64, 0, 0, 0) };
    }
}

#[cfg(any(debug_assertions, feature = "test-mutations"))]
fn probe_prefix() -> Option<String> {
    std::env::var("DMAVISOR_SECCOMP_PROBE")
        .ok()
        .filter(|p| !p.is_empty())
}

/// Test-only: with `DMAVISOR_SECCOMP_PROBE` set, starts one thread of each
/// [`ThreadKind`], named `p-<kind>`, through [`super::spawn`], and waits
/// for them. Where no guest can run (no usable KVM), this is how a test
/// gets a thread of each kind under its real filter.
#[cfg(any(debug_assertions, feature = "test-mutations"))]
pub fn start_probes() {
    if probe_prefix().is_none() {
        return;
    }
    let threads: Vec<_> = ThreadKind::ALL
        .iter()
        .filter_map(|&k| super::spawn(k, format!("p-{}", k.short_name()), || ()).ok())
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

/// Release builds without `test-mutations` have no probe.
#[cfg(not(any(debug_assertions, feature = "test-mutations")))]
pub fn probe_hook() {}

/// Release builds without `test-mutations` have no probe.
#[cfg(not(any(debug_assertions, feature = "test-mutations")))]
pub fn start_probes() {}
