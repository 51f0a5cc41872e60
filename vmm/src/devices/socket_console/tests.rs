//! The socket back-end natively: a client's bytes reach the sink, the
//! guest's reach the client, nobody connected drops output, clients come,
//! go and replace each other, and an existing path is refused.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dmavisor-sock-{}-{name}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir.join("console.sock")
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < Duration::from_secs(5), "{what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A started back-end whose sink collects what clients send.
fn started(path: &Path) -> (SocketConsole, Arc<Mutex<Vec<u8>>>) {
    let mut sock = SocketConsole::bind(path, "console").unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let into = got.clone();
    sock.start("t-sock", move |b: &[u8]| {
        into.lock().unwrap().extend_from_slice(b);
        b.len()
    })
    .unwrap();
    (sock, got)
}

fn connect(sock: &SocketConsole) -> UnixStream {
    let c = UnixStream::connect(sock.path()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    wait_for("accepted", || sock.client.lock().unwrap().is_some());
    c
}

fn read_until(c: &mut UnixStream, needle: &[u8]) -> Vec<u8> {
    let mut seen = Vec::new();
    while !seen.windows(needle.len()).any(|w| w == needle) {
        let mut b = [0u8; 64];
        let n = c.read(&mut b).unwrap();
        assert!(n > 0, "EOF before {needle:?}: {seen:?}");
        seen.extend_from_slice(&b[..n]);
    }
    seen
}

#[test]
fn a_client_sees_output_and_its_input_reaches_the_sink() {
    let path = scratch("io");
    let (sock, got) = started(&path);
    let mut out = sock.writer();
    // Nobody connected: dropped at once, not kept for later.
    out.write_all(b"before-anyone\n").unwrap();
    let mut c = connect(&sock);
    out.write_all(b"hello\n").unwrap();
    let seen = read_until(&mut c, b"hello\n");
    assert_eq!(seen, b"hello\n", "output from before the client was kept");
    c.write_all(b"typed").unwrap();
    wait_for("input", || got.lock().unwrap().as_slice() == b"typed");
    drop(sock);
    assert!(!path.exists(), "the socket file outlived the back-end");
    // The thread is gone: the client's end reads EOF.
    let mut b = [0u8; 4];
    assert_eq!(c.read(&mut b).unwrap(), 0);
}

#[test]
fn a_client_that_leaves_lets_the_next_connect() {
    let path = scratch("reconnect");
    let (sock, got) = started(&path);
    let mut out = sock.writer();
    let first = connect(&sock);
    drop(first);
    wait_for("the client forgotten", || {
        sock.client.lock().unwrap().is_none()
    });
    // Nobody there again: dropped.
    out.write_all(b"lost\n").unwrap();
    let mut second = connect(&sock);
    out.write_all(b"again\n").unwrap();
    assert_eq!(read_until(&mut second, b"again\n"), b"again\n");
    second.write_all(b"2").unwrap();
    wait_for("input of the second", || {
        got.lock().unwrap().as_slice() == b"2"
    });
}

#[test]
fn a_newcomer_replaces_the_client_before_it() {
    let path = scratch("replace");
    let (sock, got) = started(&path);
    let mut out = sock.writer();
    let mut first = connect(&sock);
    let mut second = UnixStream::connect(sock.path()).unwrap();
    second
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    // The first is closed by the VMM.
    let mut b = [0u8; 4];
    assert_eq!(first.read(&mut b).unwrap(), 0, "the first client kept");
    out.write_all(b"to-second\n").unwrap();
    assert_eq!(read_until(&mut second, b"to-second\n"), b"to-second\n");
    second.write_all(b"s").unwrap();
    wait_for("input", || got.lock().unwrap().as_slice() == b"s");
}

#[test]
fn a_client_that_does_not_read_never_blocks_the_writer() {
    let path = scratch("slow");
    let (sock, _got) = started(&path);
    let mut out = sock.writer();
    let _idle = connect(&sock);
    let t0 = Instant::now();
    // Far more than a socket buffers.
    for _ in 0..4096 {
        out.write_all(&[b'z'; 1024]).unwrap();
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "the writer waited");
}

#[test]
fn input_the_sink_cannot_take_yet_waits_for_it() {
    let path = scratch("partial");
    let mut sock = SocketConsole::bind(&path, "console").unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let into = got.clone();
    // Takes one byte per offer, as a full UART FIFO frees one at a time.
    sock.start("t-sock", move |b: &[u8]| {
        into.lock().unwrap().extend_from_slice(&b[..1]);
        1
    })
    .unwrap();
    let mut c = connect(&sock);
    c.write_all(b"abcdef").unwrap();
    wait_for("all input", || got.lock().unwrap().as_slice() == b"abcdef");
}

#[test]
fn an_existing_path_is_refused_and_left_alone() {
    let path = scratch("exists");
    fs::write(&path, b"not mine").unwrap();
    let e = SocketConsole::bind(&path, "console")
        .err()
        .expect("bound over a file");
    assert!(
        matches!(e, SocketError::Exists { socket: false, .. }),
        "{e}"
    );
    assert!(e.to_string().starts_with("console socket"), "{e}");
    assert!(e.to_string().contains("the path exists"), "{e}");
    assert_eq!(fs::read(&path).unwrap(), b"not mine");
    // A live socket at the path (another VM's) is refused too.
    let other = scratch("exists-socket");
    let held = SocketConsole::bind(&other, "serial").unwrap();
    let e = SocketConsole::bind(&other, "serial")
        .err()
        .expect("bound twice");
    assert!(matches!(e, SocketError::Exists { socket: true, .. }), "{e}");
    drop(held);
    // A directory that does not exist: a bind error naming the path.
    let e = SocketConsole::bind(Path::new("/nonexistent-dmavisor/x.sock"), "console")
        .err()
        .expect("bound in no directory");
    assert!(
        e.to_string().contains("/nonexistent-dmavisor/x.sock"),
        "{e}"
    );
}

#[test]
fn a_stream_sink_hands_input_to_the_other_end() {
    let (a, mut b) = UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    let mut sink = stream_sink(a);
    assert_eq!(sink(b"xy"), 2);
    let mut got = [0u8; 2];
    b.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"xy");
    // Full: it takes nothing rather than block.
    let big = vec![0u8; 1 << 20];
    let mut total = 0;
    loop {
        let n = sink(&big);
        if n == 0 {
            break;
        }
        total += n;
        assert!(total < 64 << 20, "never full");
    }
}
