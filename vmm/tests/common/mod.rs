//! What the integration tests that run the built `dmavisor` and talk to its
//! API socket share: a scratch directory, waiting for the socket, and one
//! HTTP request as `ch-remote` sends it.
//!
//! WHY a module and not a crate: each file under `tests/` is its own crate;
//! `mod common;` compiles this file into each that needs it, and cargo does
//! not take `tests/common/mod.rs` for a test of its own.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// A fresh, empty `dmavisor-NAME-PID` directory under the temp dir.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dmavisor-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Waits up to 10 s for `child` to create its API socket; fails if it ends
/// first.
pub fn wait_for(socket: &Path, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(child.try_wait().unwrap().is_none(), "dmavisor ended early");
        assert!(Instant::now() < deadline, "no API socket");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One HTTP request (`method /api/v1/PATH`, a JSON `body`) on its own
/// connection: the status code and the whole answer, head and body.
pub fn api(socket: &Path, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} /api/v1/{path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
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
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{path}: no status line: {head:?}"));
    let length = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    s.read_exact(&mut body).unwrap();
    (code, head + &String::from_utf8_lossy(&body))
}
