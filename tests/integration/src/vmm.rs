//! The `dmavisor` binary under test.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::error::HarnessError;
use crate::paths::{guest_script, path_arg, repo_root};
use crate::runner::run_checked;

static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// Target directory cargo uses for this checkout (`CARGO_TARGET_DIR` or
/// `<repo>/target`).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => {
            let p = PathBuf::from(d);
            if p.is_absolute() {
                p
            } else {
                repo_root().join(p)
            }
        }
        _ => repo_root().join("target"),
    }
}

/// The command of one `guest/net-host.sh` run: start the TCP peer, boot
/// the guest under VMM `mode` (see the script), print the peer's results.
pub fn net_host_argv(
    mode: &str,
    bin: &str,
    kernel: &std::path::Path,
    initrd: &std::path::Path,
) -> Vec<String> {
    vec![
        "sh".into(),
        path_arg(&guest_script("net-host.sh")),
        mode.into(),
        bin.into(),
        path_arg(kernel),
        path_arg(initrd),
    ]
}

/// Path of the release `dmavisor`, built once per test process with
/// `cargo build --release -p vmm --bin dmavisor` (cheap when up to date).
/// `DMAVISOR_BIN` overrides it with a prebuilt binary.
pub fn dmavisor_binary() -> Result<PathBuf, HarnessError> {
    if let Some(p) = std::env::var_os("DMAVISOR_BIN").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.exists() {
            Ok(p)
        } else {
            Err(HarnessError::Missing(p))
        };
    }
    let res = BINARY.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(repo_root())
            .args(["build", "--release", "-p", "vmm", "--bin", "dmavisor"]);
        run_checked(&mut cmd).map_err(|e| e.to_string())?;
        let bin = target_dir().join("release").join("dmavisor");
        if bin.exists() {
            Ok(bin)
        } else {
            Err(format!("{} not found after cargo build", bin.display()))
        }
    });
    res.clone().map_err(|msg| HarnessError::Command {
        cmd: "cargo build --release -p vmm".into(),
        status: "error".into(),
        stderr: msg,
    })
}

static CH_CLIENT: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// Path of the release `ch-client-call` (tests/ch-client: one REST call
/// through the crates.io cloud-hypervisor-client), built once per test
/// process. `DMAVISOR_CH_CLIENT` overrides it with a prebuilt binary.
pub fn ch_client_binary() -> Result<PathBuf, HarnessError> {
    if let Some(p) = std::env::var_os("DMAVISOR_CH_CLIENT").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.exists() {
            Ok(p)
        } else {
            Err(HarnessError::Missing(p))
        };
    }
    let res = CH_CLIENT.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.current_dir(repo_root())
            .args(["build", "--release", "-p", "ch-client-call"]);
        run_checked(&mut cmd).map_err(|e| e.to_string())?;
        let bin = target_dir().join("release").join("ch-client-call");
        if bin.exists() {
            Ok(bin)
        } else {
            Err(format!("{} not found after cargo build", bin.display()))
        }
    });
    res.clone().map_err(|msg| HarnessError::Command {
        cmd: "cargo build --release -p ch-client-call".into(),
        status: "error".into(),
        stderr: msg,
    })
}

/// A guest boot under dmavisor, turned into a command line with
/// [`GuestBoot::argv`] (cloud-hypervisor-style flags).
#[derive(Debug, Clone)]
pub struct GuestBoot {
    pub kernel: PathBuf,
    pub initramfs: PathBuf,
    pub cmdline: String,
    pub cpus: u32,
    /// `--cpus max=`, when set.
    pub cpus_max: Option<u32>,
    pub memory_mib: u32,
    /// Further flags (devices, `-v`, ...), appended as given.
    pub extra_args: Vec<String>,
}

/// Kernel command line the tests use by default: serial console, quiet
/// (every console byte is a VM exit, expensive in the nested runner), and
/// reboot instead of hanging on a panic.
pub const DEFAULT_CMDLINE: &str = "console=ttyS0 quiet panic=-1";

impl GuestBoot {
    /// 2 vCPUs, 512 MiB, [`DEFAULT_CMDLINE`].
    pub fn new(kernel: impl Into<PathBuf>, initramfs: impl Into<PathBuf>) -> Self {
        GuestBoot {
            kernel: kernel.into(),
            initramfs: initramfs.into(),
            cmdline: DEFAULT_CMDLINE.to_string(),
            cpus: 2,
            cpus_max: None,
            memory_mib: 512,
            extra_args: Vec::new(),
        }
    }

    /// argv for `bin`, with the serial console on the VMM's stdout.
    pub fn argv(&self, bin: &std::path::Path) -> Vec<String> {
        let mut v = vec![
            path_arg(bin),
            "--kernel".into(),
            path_arg(&self.kernel),
            "--initramfs".into(),
            path_arg(&self.initramfs),
            "--cmdline".into(),
            self.cmdline.clone(),
            "--cpus".into(),
            match self.cpus_max {
                Some(max) => format!("boot={},max={max}", self.cpus),
                None => format!("boot={}", self.cpus),
            },
            "--memory".into(),
            format!("size={}M", self.memory_mib),
            "--serial".into(),
            "tty".into(),
        ];
        v.extend(self.extra_args.iter().cloned());
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_has_cloud_hypervisor_style_flags() {
        let mut b = GuestBoot::new("/k", "/i");
        b.cpus = 4;
        b.memory_mib = 1024;
        b.extra_args = vec!["-v".into()];
        let argv = b.argv(std::path::Path::new("/bin/dmavisor"));
        let joined = argv.join(" ");
        assert_eq!(
            joined,
            "/bin/dmavisor --kernel /k --initramfs /i --cmdline console=ttyS0 quiet panic=-1 \
             --cpus boot=4 --memory size=1024M --serial tty -v"
        );
    }
}
