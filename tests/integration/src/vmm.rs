//! The `dmavisor` binary under test.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use crate::error::HarnessError;
use crate::paths::repo_root;
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
