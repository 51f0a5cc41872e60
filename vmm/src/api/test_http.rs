//! A raw HTTP/1.1 client for the API's socket tests, reading replies as
//! `ch-remote` does.
//!
//! WHY raw bytes and not an HTTP crate: the tests check the framing
//! cloud-hypervisor's clients depend on (status line, `Content-Length`,
//! no chunking) and send descriptors with `SCM_RIGHTS` on the request's
//! first bytes, which a client library would hide.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

/// The head of `method /api/v1/NAME` with a JSON body of `body_len` bytes
/// (no body headers when it is 0).
fn request_head(method: &str, name: &str, body_len: usize) -> String {
    let mut head =
        format!("{method} /api/v1/{name} HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n");
    if body_len > 0 {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {body_len}\r\n"
        ));
    }
    head.push_str("\r\n");
    head
}

/// Reads one response: headers to the blank line, then `Content-Length`
/// bytes if there is one. Returns the head and body.
pub fn response(s: &mut UnixStream) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).unwrap(), 1, "EOF in the head: {buf:?}");
        buf.push(byte[0]);
    }
    let head = String::from_utf8(buf).unwrap();
    let len = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .map_or(0, |n| n.trim().parse::<usize>().unwrap());
    let mut body = vec![0; len];
    s.read_exact(&mut body).unwrap();
    (head, body)
}

/// The status as `ch-remote` parses it: between `HTTP/1.1 ` and the CR.
pub fn status(head: &str) -> u16 {
    let start = head.find("HTTP/1.1 ").unwrap() + "HTTP/1.1 ".len();
    let end = head[start..].find('\r').unwrap() + start;
    head[start..end].trim().parse().unwrap()
}

/// Sends `method /api/v1/NAME` with `body`, the descriptors `fds` riding
/// on the head's bytes (as `ch-remote` sends them; none: a plain write),
/// and reads the reply: (status, head, body).
pub fn request(
    s: &mut UnixStream,
    method: &str,
    name: &str,
    body: &str,
    fds: &[RawFd],
) -> (u16, String, Vec<u8>) {
    let head = request_head(method, name, body.len());
    if fds.is_empty() {
        s.write_all(head.as_bytes()).unwrap();
    } else {
        s.send_with_fds(&[head.as_bytes()], fds).unwrap();
    }
    s.write_all(body.as_bytes()).unwrap();
    let (head, body) = response(s);
    (status(&head), head, body)
}

/// The API's listening socket at `api.sock` in a fresh
/// `dmavisor-api-NAME-PID` directory: (its path, the listener).
pub fn listen(name: &str) -> (PathBuf, UnixListener) {
    let dir = std::env::temp_dir().join(format!("dmavisor-api-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("api.sock");
    let listener = crate::api_socket::ApiSocket::Path(path.clone())
        .listen()
        .unwrap();
    (path, listener)
}

/// A pipe: (read end, write end). Its write end is what the tests send
/// as a descriptor, so that EOF on the read end shows the server closed
/// its copies.
pub fn pipe() -> (File, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe() returns.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: pipe2() succeeded: both descriptors are new and ours.
    unsafe { (File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
}

/// Whether every write end of `read_end`'s pipe is closed (EOF within 5 s).
pub fn writers_gone(read_end: &mut File) -> bool {
    let mut p = libc::pollfd {
        fd: read_end.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, for the duration of the call.
    let ready = unsafe { libc::poll(&mut p, 1, 5000) };
    let mut b = [0u8; 1];
    ready == 1 && read_end.read(&mut b).ok() == Some(0)
}
