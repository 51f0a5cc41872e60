//! `vm.reboot`: the VM is torn down and built again from its configuration
//! by replacing the process image with a fresh one of the same binary and
//! arguments. The process (its PID, its parent, its stdout and stderr)
//! stays; the API's listening socket is handed over open, so the socket
//! path never disappears and requests queued on it are answered by the
//! rebooted VM.
//!
//! WHY a new image rather than a rebuild inside this one: the VM is a web
//! of threads that have no stop protocol (vCPUs, virtio workers, vIOMMU
//! request queues, VFIO and vhost-user state), and `vm::start` deliberately
//! leaks guest memory because vCPU threads may still be inside `KVM_RUN`.
//! `execve` ends every thread and releases every KVM, VFIO, TAP and
//! memory descriptor in the kernel, in one step that cannot forget one;
//! the new image then boots the VM exactly as the first did.
//!
//! Descriptors: the ones this process inherited at start (stdio, an
//! `--api-socket fd=N`, whatever the parent meant for it) stay inherited;
//! every descriptor opened since is closed by the exec (some crates open
//! eventfds and memfds without `O_CLOEXEC`, so each is marked here), except
//! the API socket, whose number the new image finds in
//! [`INHERITED_API_FD`].
//!
//! A VM created through the API (`vm.create`, no `--kernel` in the
//! arguments) would not come back from the arguments alone: its
//! configuration, as `vm.info` prints it, is handed over in
//! [`INHERITED_CONFIG`], and the new image creates and boots it again.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::fd::RawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::OnceLock;

use log::{debug, info};
use thiserror::Error;

/// Environment variable naming the API socket's descriptor in a rebooted
/// image. Internal to dmavisor; it is removed from the environment at
/// start, so nothing the VMM runs inherits it.
pub const INHERITED_API_FD: &str = "DMAVISOR_REBOOT_API_FD";

/// Environment variable with the JSON `VmConfig` of a VM created through
/// the API, for the rebooted image. Internal, removed at start like
/// [`INHERITED_API_FD`].
pub const INHERITED_CONFIG: &str = "DMAVISOR_REBOOT_CONFIG";

/// The executable of the running process, even if its file was replaced
/// or removed since it started.
const SELF_EXE: &str = "/proc/self/exe";

/// Why a reboot could not start the new image.
#[derive(Debug, Error)]
pub enum RebootError {
    /// Listing or flagging open descriptors failed.
    #[error("preparing descriptors for the reboot: {0}")]
    Descriptors(std::io::Error),
    /// `execve` failed (the old VM is already gone).
    #[error("starting the rebooted VMM ({SELF_EXE}): {0}")]
    Exec(std::io::Error),
}

static STARTUP_FDS: OnceLock<BTreeSet<RawFd>> = OnceLock::new();

fn open_fds() -> Result<BTreeSet<RawFd>, std::io::Error> {
    let mut fds = BTreeSet::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        if let Some(fd) = entry?.file_name().to_str().and_then(|n| n.parse().ok()) {
            fds.insert(fd);
        }
    }
    Ok(fds)
}

/// Notes the descriptors inherited at start; call first thing in `main`.
pub fn record_startup_fds() {
    match open_fds() {
        Ok(fds) => {
            let _ = STARTUP_FDS.set(fds);
        }
        Err(e) => debug!("listing inherited descriptors: {e}"),
    }
}

/// The API socket handed over by the image before a reboot, taken out of
/// the environment. Call before any thread is started.
pub fn take_inherited_api_fd() -> Option<RawFd> {
    let fd = parse_inherited_fd(std::env::var(INHERITED_API_FD).ok().as_deref());
    std::env::remove_var(INHERITED_API_FD);
    fd
}

/// The configuration handed over by the image before a reboot, taken out
/// of the environment. Call before any thread is started.
pub fn take_inherited_config() -> Option<String> {
    take_env(INHERITED_CONFIG)
}

fn take_env(name: &str) -> Option<String> {
    let value = std::env::var(name).ok();
    std::env::remove_var(name);
    value.filter(|v| !v.is_empty())
}

/// What the new image finds in its environment: the API socket's number
/// and, for a VM created through the API, its configuration.
fn handover_env(api_fd: Option<RawFd>, config: Option<&str>) -> Vec<(&'static str, String)> {
    let mut env = Vec::new();
    if let Some(fd) = api_fd {
        env.push((INHERITED_API_FD, fd.to_string()));
    }
    if let Some(c) = config {
        env.push((INHERITED_CONFIG, c.to_string()));
    }
    env
}

/// The descriptor number in [`INHERITED_API_FD`]'s value; stdio is never
/// a listening socket.
fn parse_inherited_fd(value: Option<&str>) -> Option<RawFd> {
    value
        .and_then(|v| v.parse::<RawFd>().ok())
        .filter(|fd| *fd > 2)
}

fn set_cloexec(fd: RawFd, on: bool) -> Result<(), std::io::Error> {
    // SAFETY: F_GETFD/F_SETFD only read and write the descriptor's flags;
    // a descriptor closed meanwhile fails with EBADF, reported.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let want = if on {
        flags | libc::FD_CLOEXEC
    } else {
        flags & !libc::FD_CLOEXEC
    };
    // SAFETY: as above.
    if want != flags && unsafe { libc::fcntl(fd, libc::F_SETFD, want) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Which of `open` must be closed by the exec: those above stdio that were
/// not inherited at start and are not `keep`.
fn to_close(
    open: &BTreeSet<RawFd>,
    inherited: &BTreeSet<RawFd>,
    keep: Option<RawFd>,
) -> Vec<RawFd> {
    open.iter()
        .copied()
        .filter(|fd| *fd > 2 && !inherited.contains(fd) && Some(*fd) != keep)
        .collect()
}

/// Replaces the process image with a fresh dmavisor of the same arguments,
/// handing over `api_fd` and, if the VM was created through the API, its
/// JSON `config`. Returns only if that failed.
pub fn reexec(api_fd: Option<RawFd>, config: Option<&str>) -> RebootError {
    let inherited = STARTUP_FDS.get().cloned().unwrap_or_default();
    let open = match open_fds() {
        Ok(o) => o,
        Err(e) => return RebootError::Descriptors(e),
    };
    for fd in to_close(&open, &inherited, api_fd) {
        // The directory handle read_dir used is closed by now: EBADF.
        if let Err(e) = set_cloexec(fd, true) {
            debug!("reboot: fd {fd}: {e}");
        }
    }
    let mut args: Vec<OsString> = std::env::args_os().collect();
    let argv0 = if args.is_empty() {
        OsString::from("dmavisor")
    } else {
        args.remove(0)
    };
    let mut cmd = Command::new(SELF_EXE);
    cmd.arg0(argv0).args(args);
    if let Some(fd) = api_fd {
        if let Err(e) = set_cloexec(fd, false) {
            return RebootError::Descriptors(e);
        }
    }
    cmd.envs(handover_env(api_fd, config));
    info!("rebooting: starting a fresh VM in this process");
    RebootError::Exec(cmd.exec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_descriptors_opened_since_start_are_closed() {
        let open: BTreeSet<RawFd> = [0, 1, 2, 3, 4, 7, 9, 12].into();
        let inherited: BTreeSet<RawFd> = [0, 1, 2, 3].into();
        assert_eq!(to_close(&open, &inherited, Some(9)), vec![4, 7, 12]);
        assert_eq!(to_close(&open, &inherited, None), vec![4, 7, 9, 12]);
        // Unknown start set: everything above stdio but the API socket.
        assert_eq!(
            to_close(&open, &BTreeSet::new(), Some(3)),
            vec![4, 7, 9, 12]
        );
    }

    #[test]
    fn cloexec_flag_round_trips() {
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
        set_cloexec(fd, false).unwrap();
        // SAFETY: reads the flags of a descriptor owned by `f`.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, 0);
        set_cloexec(fd, true).unwrap();
        // SAFETY: as above.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
        assert_ne!(flags & libc::FD_CLOEXEC, 0);
        assert!(set_cloexec(1_000_000, true).is_err());
    }

    #[test]
    fn a_created_vm_is_handed_over_and_comes_back_the_same() {
        use crate::api::controller::{Builder, Controller};
        use crate::api::VmmApi;
        let body = br#"{"payload": {"kernel": "/k", "initramfs": "/i", "cmdline": "quiet"},
            "cpus": {"boot_vcpus": 2}, "memory": {"size": 536870912},
            "serial": {"mode": "File", "file": "/tmp/s"}}"#;
        let created = crate::api::vm_config::parse(body).expect("valid");
        let (tx, _rx) = std::sync::mpsc::channel();
        let never: Builder = Box::new(|_, _| Err(crate::error::Error::VmExists));
        let c = Controller::new(tx, never);
        c.create(created.clone()).expect("create");
        let json = c.config_json().expect("a config");
        let env = handover_env(Some(7), Some(&json));
        assert_eq!(
            env,
            vec![
                (INHERITED_API_FD, "7".to_string()),
                (INHERITED_CONFIG, json.clone())
            ]
        );
        // The new image: the variable is read once and gone.
        let name = "DMAVISOR_TEST_HANDOVER_CONFIG";
        std::env::set_var(name, &json);
        let taken = take_env(name).expect("handed over");
        assert!(std::env::var_os(name).is_none(), "removed at start");
        assert_eq!(take_env(name), None);
        let again = crate::api::vm_config::parse(taken.as_bytes()).expect("valid");
        assert_eq!(again, created);
        // A command-line VM (nothing handed over) and no API.
        assert_eq!(handover_env(None, None), vec![]);
    }

    #[test]
    fn the_inherited_socket_number_is_checked() {
        assert_eq!(parse_inherited_fd(Some("7")), Some(7));
        assert_eq!(parse_inherited_fd(None), None);
        for bad in ["x", "-1", "2", "", "7 "] {
            assert_eq!(parse_inherited_fd(Some(bad)), None, "{bad:?}");
        }
    }
}
