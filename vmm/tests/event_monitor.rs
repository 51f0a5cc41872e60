//! `--event-monitor` seen as libvirt sees it: the built `dmavisor` writes
//! cloud-hypervisor's JSON events into a FIFO whose reader comes only
//! after the VMM started, while the test drives the REST API. No guest
//! boots here (no usable KVM): the VM is created, fails to boot (its
//! kernel is no kernel), is deleted, and the VMM is shut down.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{scratch, wait_for};

const DMAVISOR: &str = env!("CARGO_BIN_EXE_dmavisor");

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// One HTTP request (a GET for `vmm.ping`, a PUT otherwise); the status
/// code.
fn api(socket: &Path, path: &str, body: &str) -> u16 {
    let method = if path == "vmm.ping" { "GET" } else { "PUT" };
    common::api(socket, method, path, body).0
}

/// Ends the VMM if the test fails before it does.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads JSON objects off the FIFO (split on balanced braces, as libvirt
/// does) until every writer is gone.
fn reader(fifo: &Path) -> Receiver<Value> {
    // Blocks until a writer has the FIFO open: dmavisor holds it.
    let mut f = File::open(fifo).unwrap();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut pending = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = match f.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            pending.extend_from_slice(&buf[..n]);
            let mut depth = 0usize;
            let mut start = None;
            let mut consumed = 0;
            for (i, &b) in pending.iter().enumerate() {
                match b {
                    b'{' => {
                        if depth == 0 {
                            start = Some(i);
                        }
                        depth += 1;
                    }
                    b'}' if depth > 0 => {
                        depth -= 1;
                        if let (0, Some(s)) = (depth, start) {
                            let v: Value = serde_json::from_slice(&pending[s..=i])
                                .expect("each event is a JSON object");
                            let _ = tx.send(v);
                            consumed = i + 1;
                        }
                    }
                    _ => {}
                }
            }
            pending.drain(..consumed);
        }
    });
    rx
}

/// `(source, event)` of every event received within `wait`, checking the
/// shape of each.
fn events(rx: &Receiver<Value>, wait: Duration) -> Vec<(String, String)> {
    let deadline = Instant::now() + wait;
    let mut out = Vec::new();
    let mut last = 0f64;
    while let Ok(v) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        let t = &v["timestamp"];
        let at = t["secs"].as_f64().expect("secs") + t["nanos"].as_f64().expect("nanos") / 1e9;
        assert!(at >= last, "timestamps go forward: {v}");
        last = at;
        assert!(v.get("properties").is_some(), "{v}");
        out.push((
            v["source"].as_str().expect("source").to_string(),
            v["event"].as_str().expect("event").to_string(),
        ));
    }
    out
}

#[test]
fn event_monitor_reports_lifecycle() {
    let dir = scratch("events-lifecycle");
    let fifo = dir.join("events.fifo");
    mkfifo(&fifo);
    let socket = dir.join("api.sock");
    let kernel = dir.join("not-a-kernel");
    std::fs::write(&kernel, b"no kernel here").unwrap();
    let mut child = Reaper(
        Command::new(DMAVISOR)
            .arg("--api-socket")
            .arg(format!("path={}", socket.display()))
            .arg("--event-monitor")
            .arg(format!("path={}", fifo.display()))
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // No reader yet: the VMM serves its API all the same.
    wait_for(&socket, &mut child.0);
    assert_eq!(api(&socket, "vmm.ping", ""), 200);
    let rx = reader(&fifo);
    let create = format!(
        r#"{{"payload": {{"kernel": "{}"}}, "serial": {{"mode": "Off"}}}}"#,
        kernel.display()
    );
    assert_eq!(api(&socket, "vm.create", &create), 204);
    assert_eq!(api(&socket, "vm.boot", ""), 500, "not a kernel");
    assert_eq!(api(&socket, "vm.delete", ""), 204);
    assert_eq!(api(&socket, "vmm.shutdown", ""), 204);
    let status = child.0.wait().unwrap();
    assert!(status.success(), "{status}");
    let got = events(&rx, Duration::from_secs(10));
    let want: Vec<(String, String)> = [
        ("vmm", "starting"),
        ("vm", "booting"),
        ("vm", "deleted"),
        ("vmm", "shutdown"),
    ]
    .iter()
    .map(|(s, e)| (s.to_string(), e.to_string()))
    .collect();
    assert_eq!(got, want);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `fd=N`, as Kata passes a pipe: the events arrive on it.
#[test]
fn event_monitor_on_an_inherited_pipe() {
    use std::os::fd::{AsRawFd, FromRawFd};
    use std::os::unix::process::CommandExt;
    let dir = scratch("events-fd");
    let socket = dir.join("api.sock");
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 returns.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just created and are owned here.
    let (read_end, write_end) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
    let w = write_end.as_raw_fd();
    let mut cmd = Command::new(DMAVISOR);
    cmd.arg("--api-socket")
        .arg(format!("path={}", socket.display()))
        .arg("--event-monitor")
        .arg(format!("fd={w}"))
        .stderr(Stdio::null());
    // SAFETY: only async-signal-safe fcntl between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(w, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = Reaper(cmd.spawn().unwrap());
    drop(write_end);
    wait_for(&socket, &mut child.0);
    assert_eq!(api(&socket, "vmm.shutdown", ""), 204);
    assert!(child.0.wait().unwrap().success());
    let mut text = String::new();
    let mut r = read_end;
    r.read_to_string(&mut text).unwrap();
    assert!(
        text.contains("\"starting\"") && text.contains("\"shutdown\""),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
