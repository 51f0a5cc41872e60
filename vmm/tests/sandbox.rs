//! The sandbox seen from outside the VMM: the built `dmavisor` run with
//! arguments that fail once the sandbox is in place (no guest can run
//! here), so each check ends in a few milliseconds.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use vmm::sandbox::ThreadKind;

mod common;
use common::{api, scratch, wait_for};

const DMAVISOR: &str = env!("CARGO_BIN_EXE_dmavisor");

/// Runs dmavisor on a file that is no kernel (it fails after the sandbox
/// is up and the probe threads have run) with the seccomp probe `probe`.
fn run_probe(dir: &Path, seccomp: &str, probe: &str) -> Output {
    let kernel = dir.join("not-a-kernel");
    std::fs::write(&kernel, b"no kernel here").unwrap();
    Command::new(DMAVISOR)
        .args(["--serial", "off", "--seccomp", seccomp, "--kernel"])
        .arg(&kernel)
        .env("DMAVISOR_SECCOMP_PROBE", probe)
        .output()
        .unwrap()
}

/// A thread of every kind, under its own filter, calls `ptrace`: the VMM
/// ends with exit code 1 and one line naming the thread and the call.
/// With `log` the call goes through and the VMM goes on to its usual
/// error; threads that stay inside their lists start and end cleanly.
#[test]
fn seccomp_kills_a_thread_that_leaves_its_filter() {
    let dir = scratch("sandbox-seccomp");
    for kind in ThreadKind::ALL {
        let thread = format!("p-{}", kind.short_name());
        let out = run_probe(&dir, "true", &thread);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{kind:?}: {stderr}");
        let line = format!(
            "dmavisor: error: seccomp: thread '{thread}' made a forbidden system call: ptrace (101, args 18446744073709551615, 0); ending the VMM"
        );
        assert!(stderr.contains(&line), "{kind:?}: {stderr}");
        assert!(!stderr.contains("not a Linux kernel"), "{kind:?}: {stderr}");
    }
    for (mode, probe) in [("log", "p-*"), ("false", "p-*"), ("true", "no-such-thread")] {
        let out = run_probe(&dir, mode, probe);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("error: seccomp"), "{mode}: {stderr}");
        assert!(stderr.contains("not a Linux kernel"), "{mode}: {stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What booting `kernel` through the API answers under `--landlock` with
/// one read rule on `allowed` (and `--seccomp true`).
fn boot_through_api(dir: &Path, allowed: &Path, kernel: &Path) -> String {
    // The socket's directory is writable to the VMM: keep it apart.
    let socket = dir.join("sock").join("api.sock");
    std::fs::create_dir_all(dir.join("sock")).unwrap();
    let _ = std::fs::remove_file(&socket);
    let mut child = Command::new(DMAVISOR)
        .arg("--api-socket")
        .arg(format!("path={}", socket.display()))
        // The API's server and worker threads under their filters too.
        .args(["--seccomp", "true", "--landlock", "--landlock-rules"])
        .arg(format!("path={},access=r", allowed.display()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&socket, &mut child);
    let create = format!(
        r#"{{"payload": {{"kernel": "{}"}}, "serial": {{"mode": "Off"}}}}"#,
        kernel.display()
    );
    let (_, created) = api(&socket, "PUT", "vm.create", &create);
    let (_, booted) = api(&socket, "PUT", "vm.boot", "");
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("error: seccomp"), "{stderr}");
    assert!(created.starts_with("HTTP/1.1 204"), "{created}");
    booted
}

/// A kernel path handed in through the API after the VMM confined itself
/// is refused by the kernel when it lies outside `--landlock-rules`; the
/// same file inside them opens (and fails only for not being a kernel).
#[test]
fn landlock_denies_a_path_outside_the_rules() {
    let dir = scratch("sandbox-landlock");
    let (inside, outside) = (dir.join("inside"), dir.join("outside"));
    std::fs::create_dir_all(&inside).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(inside.join("vmlinuz"), b"no kernel here").unwrap();
    std::fs::write(outside.join("vmlinuz"), b"no kernel here").unwrap();

    let denied = boot_through_api(&dir, &inside, &outside.join("vmlinuz"));
    assert!(denied.contains("Permission denied"), "{denied}");

    let opened = boot_through_api(&dir, &inside, &inside.join("vmlinuz"));
    assert!(!opened.contains("Permission denied"), "{opened}");
    assert!(opened.contains("not a Linux kernel"), "{opened}");
    std::fs::remove_dir_all(&dir).unwrap();
}
