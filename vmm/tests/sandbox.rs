//! The sandbox seen from outside the VMM: the built `dmavisor` run with
//! arguments that fail once the sandbox is in place (no guest can run
//! here), so each check ends in a few milliseconds.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use vmm::sandbox::ThreadKind;

const DMAVISOR: &str = env!("CARGO_BIN_EXE_dmavisor");

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dmavisor-sandbox-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

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
    let dir = scratch("seccomp");
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

/// One HTTP request on the API socket; the whole answer.
fn api(socket: &Path, path: &str, body: &str) -> String {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "PUT /api/v1/{path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // The answer ends after Content-Length bytes of body (the server may
    // keep the connection open).
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
        answer.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&answer).to_string();
    let length = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    s.read_exact(&mut body).unwrap();
    head + &String::from_utf8_lossy(&body)
}

fn wait_for(socket: &Path, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(child.try_wait().unwrap().is_none(), "dmavisor ended early");
        assert!(Instant::now() < deadline, "no API socket");
        std::thread::sleep(Duration::from_millis(20));
    }
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
    let created = api(&socket, "vm.create", &create);
    let booted = api(&socket, "vm.boot", "");
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
    let dir = scratch("landlock");
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
