//! The socket back-end natively: a client's bytes reach the sink, the
//! guest's reach the client, output with nobody connected is kept
//! (bounded) for the next client and sent once, clients come, go and
//! replace each other, and an existing path is refused.

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
    started_keeping(path, BACKLOG_BYTES)
}

/// [`started`] keeping at most `backlog` bytes for the next client.
fn started_keeping(path: &Path, backlog: usize) -> (SocketConsole, Arc<Mutex<Vec<u8>>>) {
    let mut sock = SocketConsole::bind_keeping(path, "console", backlog).unwrap();
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
    wait_for("accepted", || sock.client.lock().unwrap().client.is_some());
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
    let mut c = connect(&sock);
    out.write_all(b"hello\n").unwrap();
    let seen = read_until(&mut c, b"hello\n");
    assert_eq!(seen, b"hello\n");
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
        sock.client.lock().unwrap().client.is_none()
    });
    // Nobody there again: kept for the next, before what comes after.
    out.write_all(b"away\n").unwrap();
    let mut second = connect(&sock);
    out.write_all(b"again\n").unwrap();
    assert_eq!(read_until(&mut second, b"again\n"), b"away\nagain\n");
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

#[test]
fn output_before_the_first_client_reaches_it_in_order() {
    let path = scratch("early");
    let (sock, _got) = started(&path);
    let mut out = sock.writer();
    for line in [&b"boot: one\n"[..], b"boot: two\n", b"login: "] {
        out.write_all(line).unwrap();
    }
    let mut c = connect(&sock);
    out.write_all(b"live\n").unwrap();
    assert_eq!(
        read_until(&mut c, b"live\n"),
        b"boot: one\nboot: two\nlogin: live\n"
    );
    let shared = sock.client.lock().unwrap();
    assert!(shared.backlog.is_empty(), "replayed bytes still kept");
    assert_eq!(shared.backlog.dropped(), 0);
}

/// The byte at position `i` of a long output: not periodic within the
/// ring, so a shifted or reordered replay cannot compare equal.
fn nth(i: usize) -> u8 {
    u8::try_from(i % 251).unwrap()
}

#[test]
fn more_than_the_bound_keeps_only_the_newest_bytes() {
    let path = scratch("bound");
    let (sock, _got) = started(&path);
    let mut out = sock.writer();
    let extra = 5000;
    let total = BACKLOG_BYTES + extra;
    let all: Vec<u8> = (0..total).map(nth).collect();
    // In uneven pieces, as a guest writes.
    for piece in all.chunks(777) {
        out.write_all(piece).unwrap();
    }
    assert_eq!(
        sock.client.lock().unwrap().backlog.dropped(),
        extra as u64,
        "dropped bytes not counted"
    );
    let mut c = connect(&sock);
    let mut seen = vec![0u8; BACKLOG_BYTES];
    c.read_exact(&mut seen).unwrap();
    assert!(
        seen == all[extra..],
        "not the newest {BACKLOG_BYTES} bytes in order"
    );
    // Nothing more was kept: the next bytes are new output.
    out.write_all(b"end\n").unwrap();
    assert_eq!(read_until(&mut c, b"end\n"), b"end\n");
}

#[test]
fn a_replay_larger_than_the_socket_takes_finishes_before_new_output() {
    let path = scratch("long-replay");
    // Far more than a UNIX socket buffers: the thread must wait for room.
    let keep = 4 << 20;
    let (sock, _got) = started_keeping(&path, keep);
    let mut out = sock.writer();
    let all: Vec<u8> = (0..keep).map(nth).collect();
    out.write_all(&all).unwrap();
    let mut c = connect(&sock);
    // The client has not read yet: new output queues behind the replay,
    // and the writer does not wait.
    let t0 = Instant::now();
    out.write_all(b"after\n").unwrap();
    assert!(t0.elapsed() < Duration::from_secs(1), "the writer waited");
    assert!(
        !sock.client.lock().unwrap().backlog.is_empty(),
        "the whole replay fitted in the socket: the test proves nothing"
    );
    let mut seen = vec![0u8; keep];
    c.read_exact(&mut seen).unwrap();
    assert!(seen == all, "the replay was cut or reordered");
    assert_eq!(read_until(&mut c, b"after\n"), b"after\n");
}

#[test]
fn kept_bytes_are_sent_once() {
    let path = scratch("once");
    let (sock, _got) = started(&path);
    let mut out = sock.writer();
    out.write_all(b"early\n").unwrap();
    let mut first = connect(&sock);
    assert_eq!(read_until(&mut first, b"early\n"), b"early\n");
    drop(first);
    wait_for("the first forgotten", || {
        sock.client.lock().unwrap().client.is_none()
    });
    // Nothing written while nobody was there: the next gets only new output.
    let mut second = connect(&sock);
    out.write_all(b"new\n").unwrap();
    assert_eq!(read_until(&mut second, b"new\n"), b"new\n");
}

#[test]
fn output_as_a_client_leaves_waits_for_the_next() {
    let path = scratch("leaving");
    let (sock, _got) = started(&path);
    let mut out = sock.writer();
    let first = connect(&sock);
    drop(first);
    // At once, before the thread may have seen it leave: the write fails
    // (EPIPE) or finds nobody; either way it is kept.
    out.write_all(b"while-leaving\n").unwrap();
    let mut second = UnixStream::connect(sock.path()).unwrap();
    second
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(
        read_until(&mut second, b"while-leaving\n"),
        b"while-leaving\n"
    );
}

#[test]
fn a_client_that_does_not_read_a_replay_never_blocks_the_writer() {
    let path = scratch("slow-replay");
    let (sock, _got) = started_keeping(&path, 1 << 20);
    let mut out = sock.writer();
    let t0 = Instant::now();
    for _ in 0..2048 {
        out.write_all(&[b'k'; 1024]).unwrap();
    }
    let _idle = connect(&sock);
    for _ in 0..4096 {
        out.write_all(&[b'z'; 1024]).unwrap();
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "the writer waited");
    // Bounded while it waits.
    assert!(sock.client.lock().unwrap().backlog.len() <= 1 << 20);
}
