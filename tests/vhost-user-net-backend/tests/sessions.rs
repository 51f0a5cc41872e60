//! The back-end as a process, driven over its socket with raw vhost-user
//! messages: one session and exit 0 by default; with `--reconnect`, one
//! session after another, each from a fresh state (a second SET_OWNER on
//! a reused state would be refused and the connection dropped), which
//! is what a VMM rebuilding its VM on a guest reboot needs.
//!
//! Needs root (it creates TAP interfaces), as the back-end itself does.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const GET_FEATURES: u32 = 1;
const SET_OWNER: u32 = 3;
const VERSION_1: u32 = 0x1;
const REPLY: u32 = 0x4;
const VIRTIO_F_VERSION_1: u64 = 1 << 32;

fn start(name: &str, extra: &[&str]) -> (Child, PathBuf) {
    let dir = std::env::temp_dir().join(format!("vutn-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let sock = dir.join("s.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_vhost-user-test-net"))
        .arg("--socket")
        .arg(&sock)
        .args(["--tap", name])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the back-end");
    let t = Instant::now();
    while !sock.exists() {
        assert!(t.elapsed() < Duration::from_secs(10), "no socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, sock)
}

fn message(code: u32) -> Vec<u8> {
    [code, VERSION_1, 0]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect()
}

/// One session: SET_OWNER, then GET_FEATURES, whose answer must come.
fn session(sock: &Path) -> u64 {
    let mut s = UnixStream::connect(sock).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&message(SET_OWNER)).expect("SET_OWNER");
    s.write_all(&message(GET_FEATURES)).expect("GET_FEATURES");
    let mut reply = [0u8; 20];
    s.read_exact(&mut reply)
        .expect("an answer to GET_FEATURES (the session was refused)");
    let word = |i: usize| u32::from_le_bytes(reply[i..i + 4].try_into().unwrap());
    assert_eq!(word(0), GET_FEATURES);
    assert_eq!(word(4) & REPLY, REPLY);
    u64::from_le_bytes(reply[12..20].try_into().unwrap())
}

fn exited_within(child: &mut Child, limit: Duration) -> Option<i32> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if let Some(status) = child.try_wait().expect("wait") {
            return status.code();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn serves_one_session_and_exits_by_default() {
    let (mut child, sock) = start("vutnone0", &[]);
    assert_ne!(session(&sock) & VIRTIO_F_VERSION_1, 0);
    let code = exited_within(&mut child, Duration::from_secs(10));
    if code.is_none() {
        let _ = child.kill();
    }
    assert_eq!(code, Some(0), "the back-end did not end with its session");
    assert!(!sock.exists(), "the socket file outlived the back-end");
}

#[test]
fn reconnect_serves_one_session_after_another() {
    let (mut child, sock) = start("vutnre0", &["--reconnect"]);
    for n in 0..3 {
        let features = session(&sock);
        assert_ne!(features & VIRTIO_F_VERSION_1, 0, "session {n}");
    }
    // Still serving: it ends only when killed.
    let running = exited_within(&mut child, Duration::from_millis(300)).is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert!(running, "the back-end ended after its sessions");
}
