//! Running commands: plain host commands, and shell scripts inside the KVM
//! environment provided by `resources/run-kvm`.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::HarnessError;
use crate::paths::{resource, scratch_dir};

/// Exit status `resources/run-kvm` uses for a time-out.
pub const EXIT_TIMEOUT: i32 = 124;
/// Exit status `resources/run-kvm` uses when the runner itself failed.
pub const EXIT_RUNNER_FAILED: i32 = 125;

/// Runs `cmd`, returns its stdout, fails with its stderr on a non-zero exit.
pub fn run_checked(cmd: &mut Command) -> Result<String, HarnessError> {
    let name = format!("{cmd:?}");
    let out = cmd.output().map_err(|source| HarnessError::Spawn {
        cmd: name.clone(),
        source,
    })?;
    if !out.status.success() {
        return Err(HarnessError::Command {
            cmd: name,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// What a command run in the KVM environment produced.
#[derive(Debug, Clone)]
pub struct RunOutput {
    /// Exit status (`None` if killed by a signal on the host).
    pub status: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// Host wall time including, in nested mode, the L2 boot.
    pub elapsed: Duration,
}

impl RunOutput {
    /// True when the runner itself (not the command) failed or timed out.
    pub fn runner_failed(&self) -> bool {
        matches!(self.status, Some(EXIT_TIMEOUT) | Some(EXIT_RUNNER_FAILED))
    }

    /// stdout and stderr, for failure messages.
    pub fn describe(&self) -> String {
        format!(
            "status {:?} after {:.1} s\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status,
            self.elapsed.as_secs_f64(),
            self.stdout,
            self.stderr
        )
    }
}

/// Writes `script` (a POSIX shell script) into the scratch directory, which
/// the nested runner shares, and runs it with `sh` inside the KVM
/// environment, bounded by `timeout`. `mem_mib` sizes the nested L2 (ignored
/// when KVM is used directly).
/// How the runner is set up for a session (`resources/run-kvm` flags).
#[derive(Clone, Copy, Debug, Default)]
pub struct RunnerOptions {
    /// Runner memory (nested mode), if not the default.
    pub mem_mib: Option<u32>,
    /// A NIC bound to vfio-pci for the command (`--assign-nic`).
    pub assign_nic: bool,
}

pub fn run_script_in_kvm(
    name: &str,
    script: &str,
    timeout: Duration,
    runner: &RunnerOptions,
) -> Result<RunOutput, HarnessError> {
    let dir = scratch_dir();
    std::fs::create_dir_all(&dir).map_err(|e| HarnessError::io(&dir, e))?;
    let path: PathBuf = dir.join(format!("{name}-{}.sh", std::process::id()));
    std::fs::write(&path, script).map_err(|e| HarnessError::io(&path, e))?;
    let mut cmd = Command::new(resource("run-kvm"));
    cmd.arg("--timeout").arg(timeout.as_secs().to_string());
    if let Some(m) = runner.mem_mib {
        cmd.arg("--mem").arg(m.to_string());
    }
    if runner.assign_nic {
        cmd.arg("--assign-nic");
    }
    cmd.arg("--").arg("/bin/sh").arg(&path);
    let res = run_capture(&mut cmd);
    let _ = std::fs::remove_file(&path);
    // Keep the whole run for post-mortems (assertions show only a tail).
    if let Ok(run) = &res {
        let log = dir.join(format!("{name}.log"));
        let text = format!("{}\n--- stderr ---\n{}", run.stdout, run.stderr);
        if let Err(e) = std::fs::write(&log, text) {
            eprintln!("cannot keep {}: {e}", log.display());
        }
    }
    res
}

/// Runs `cmd` with piped output, capturing both streams.
pub fn run_capture(cmd: &mut Command) -> Result<RunOutput, HarnessError> {
    let name = format!("{cmd:?}");
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| HarnessError::Spawn {
            cmd: name.clone(),
            source,
        })?;
    // Drain stderr on a thread so neither pipe can fill up and block the child.
    let mut err_pipe = child.stderr.take();
    let err_thread = std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(p) = err_pipe.as_mut() {
            let _ = p.read_to_end(&mut buf);
        }
        buf
    });
    let mut out = Vec::new();
    if let Some(p) = child.stdout.as_mut() {
        p.read_to_end(&mut out)
            .map_err(|e| HarnessError::io("<child stdout>", e))?;
    }
    let status = child
        .wait()
        .map_err(|source| HarnessError::Spawn { cmd: name, source })?;
    let err = err_thread.join().unwrap_or_default();
    Ok(RunOutput {
        status: status.code(),
        stdout: String::from_utf8_lossy(&out).into_owned(),
        stderr: String::from_utf8_lossy(&err).into_owned(),
        elapsed: start.elapsed(),
    })
}
