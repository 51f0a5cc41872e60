//! The API server against real clients on a real Unix socket (no guest):
//! slow and hostile clients, limits, and the bytes cloud-hypervisor's
//! clients expect.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use virtio_iommu::locks::Unpoison;

use super::routes::{ApiError, VmApi, VmSlot, VmmApi};
use super::server::{Limits, Server, MAX_BODY};
use super::test_fakes::FakeVm;
use super::test_http::{listen, pipe, request, response, status, writers_gone};
use crate::config::VmConfig;

/// A VMM whose `vm.boot` waits until the test opens `gate`, as a boot
/// waiting for a vhost-user back-end does.
struct SlowVmm {
    vm: Option<Arc<dyn VmApi>>,
    gate: Mutex<Receiver<()>>,
    boots: AtomicU32,
    shutdowns: AtomicU32,
}

impl VmmApi for SlowVmm {
    fn slot(&self) -> VmSlot {
        match &self.vm {
            Some(vm) => VmSlot::Running(vm.clone()),
            None => VmSlot::Created {
                config: json!({}),
                memory: 0,
                booting: false,
            },
        }
    }
    fn create(&self, _config: VmConfig) -> Result<(), ApiError> {
        Ok(())
    }
    fn boot(&self) -> Result<(), ApiError> {
        let gate = self.gate.lock().unpoisoned();
        let _ = gate.recv_timeout(Duration::from_secs(20));
        self.boots.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn delete(&self) -> Result<(), ApiError> {
        Ok(())
    }
    fn shutdown(&self) {
        self.shutdowns.fetch_add(1, Ordering::SeqCst);
    }
    fn reboot(&self) {}
}

fn short_limits() -> Limits {
    Limits {
        max_connections: 16,
        request_timeout: Duration::from_millis(300),
        write_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_secs(30),
    }
}

/// A server for `vm` on a fresh socket, not yet running; the test opens
/// the boot gate with the returned sender.
fn server(
    name: &str,
    vm: Option<Arc<dyn VmApi>>,
    limits: Limits,
) -> (PathBuf, Arc<SlowVmm>, Sender<()>, Server) {
    let (path, listener) = listen(name);
    let (open, gate) = channel();
    let vmm = Arc::new(SlowVmm {
        vm,
        gate: Mutex::new(gate),
        boots: AtomicU32::new(0),
        shutdowns: AtomicU32::new(0),
    });
    let server = Server::new(listener, vmm.clone(), limits).unwrap();
    (path, vmm, open, server)
}

/// [`server`], running on its own thread.
fn serve(
    name: &str,
    vm: Option<Arc<dyn VmApi>>,
    limits: Limits,
) -> (PathBuf, Arc<SlowVmm>, Sender<()>) {
    let (path, vmm, open, server) = server(name, vm, limits);
    std::thread::spawn(move || server.run());
    (path, vmm, open)
}

fn connect(path: &PathBuf) -> UnixStream {
    let s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

fn closed_within(s: &mut UnixStream, limit: Duration) -> bool {
    let start = Instant::now();
    let mut buf = [0u8; 256];
    while start.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => {}
        }
    }
    false
}

#[test]
fn api_slow_client_does_not_block_others() {
    let (path, vmm, open) = serve("slow", None, short_limits());
    // A body announced and never sent.
    let mut silent = connect(&path);
    silent
        .write_all(b"PUT /api/v1/vm.create HTTP/1.1\r\nContent-Length: 2000\r\n\r\n{")
        .unwrap();
    // Half a request line.
    let mut half = connect(&path);
    half.write_all(b"GET /api/v1/vmm.pi").unwrap();
    // A chunked body, then silence.
    let mut chunked = connect(&path);
    chunked
        .write_all(b"PUT /api/v1/vm.create HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n7d0\r\n{")
        .unwrap();
    // A boot that waits (for a vhost-user back-end, say).
    let mut booting = connect(&path);
    booting
        .write_all(b"PUT /api/v1/vm.boot HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();

    // Meanwhile another client is answered at once, several times.
    let mut other = connect(&path);
    for _ in 0..3 {
        let t = Instant::now();
        let (code, _, body) = request(&mut other, "GET", "vmm.ping", "", &[]);
        assert_eq!(code, 200);
        assert!(String::from_utf8_lossy(&body).contains("\"pid\""));
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }
    let (code, _, body) = request(&mut other, "GET", "vm.info", "", &[]);
    assert_eq!(code, 200);
    assert!(String::from_utf8_lossy(&body).contains("Created"));
    assert_eq!(vmm.boots.load(Ordering::SeqCst), 0, "the boot still waits");
    // vmm.shutdown is answered, and acted on, during the boot.
    let (code, head, _) = request(&mut other, "PUT", "vmm.shutdown", "", &[]);
    assert_eq!(code, 204, "{head}");
    // Acted on right after the reply is written, on the server's thread.
    let t = Instant::now();
    while vmm.shutdowns.load(Ordering::SeqCst) == 0 && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(vmm.shutdowns.load(Ordering::SeqCst), 1);

    // The chunked request is refused and its connection closed.
    let (head, body) = response(&mut chunked);
    assert_eq!(status(&head), 400, "{}", String::from_utf8_lossy(&body));
    assert!(closed_within(&mut chunked, Duration::from_secs(2)));
    // The slow clients are timed out and give their slots back.
    assert!(closed_within(&mut silent, Duration::from_secs(3)));
    assert!(closed_within(&mut half, Duration::from_secs(3)));

    // The boot's answer comes once the back-end is there.
    open.send(()).unwrap();
    let (head, _) = response(&mut booting);
    assert_eq!(status(&head), 204, "{head}");
    assert_eq!(vmm.boots.load(Ordering::SeqCst), 1);
}

/// Runs the server's loop on this thread until `until` holds (at most
/// 200 turns of at most a second each), so the test sees exactly what the
/// loop has read.
fn drive(server: &mut Server, mut until: impl FnMut(&Server) -> bool) {
    for _ in 0..200 {
        if until(server) {
            return;
        }
        server.turn().unwrap();
    }
    panic!("the server never got there");
}

fn readable(s: &UnixStream) -> bool {
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, for the duration of the call.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

/// Sends a ping on `s` and answers it with the loop on this thread.
fn ping(server: &mut Server, s: &mut UnixStream) -> u16 {
    s.write_all(b"GET /api/v1/vmm.ping HTTP/1.1\r\n\r\n")
        .unwrap();
    drive(server, |_| readable(s));
    status(&response(s).0)
}

#[test]
fn api_connections_are_capped_and_idle_ones_make_room() {
    let limits = Limits {
        max_connections: 2,
        ..short_limits()
    };
    let (path, _vmm, _open, mut server) = server("cap", None, limits);
    // Two clients mid-request fill the server: a third is refused.
    let mut a = connect(&path);
    a.write_all(b"GET /api/v1/vmm.ping HTTP/1.1\r\n").unwrap();
    drive(&mut server, |s| s.busy_connections() == 1);
    let mut b = connect(&path);
    b.write_all(b"GET /api/v1/vmm.ping HTTP/1.1\r\n").unwrap();
    drive(&mut server, |s| s.busy_connections() == 2);
    let mut c = connect(&path);
    drive(&mut server, |_| readable(&c));
    let (head, _) = response(&mut c);
    assert_eq!(status(&head), 503);
    // They time out and give their slots back.
    std::thread::sleep(Duration::from_millis(350));
    drive(&mut server, |s| s.busy_connections() == 0);
    assert_eq!(a.read(&mut [0u8; 8]).unwrap(), 0);
    assert_eq!(b.read(&mut [0u8; 8]).unwrap(), 0);
    // Idle keep-alive connections make room for newcomers, idlest first.
    let mut idle = connect(&path);
    assert_eq!(ping(&mut server, &mut idle), 200);
    let mut idle2 = connect(&path);
    assert_eq!(ping(&mut server, &mut idle2), 200);
    let mut d = connect(&path);
    assert_eq!(ping(&mut server, &mut d), 200);
    assert_eq!(idle.read(&mut [0u8; 8]).unwrap(), 0, "the idlest went");
    assert_eq!(ping(&mut server, &mut idle2), 200);
}

#[test]
fn api_oversized_body_is_413() {
    let (path, _vmm, _open) = serve("big", None, short_limits());
    // One byte over the limit: refused from the header, before the body.
    let mut s = connect(&path);
    let head = format!(
        "PUT /api/v1/vm.create HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
        MAX_BODY + 1
    );
    s.write_all(head.as_bytes()).unwrap();
    let (head, body) = response(&mut s);
    assert_eq!(status(&head), 413, "{head}");
    let err: Value = serde_json::from_slice(&body).unwrap();
    assert!(err[0]
        .as_str()
        .unwrap()
        .contains(&(MAX_BODY + 1).to_string()));
    assert!(closed_within(&mut s, Duration::from_secs(2)));
    // Exactly the limit is read and routed: an invalid VmConfig is a 400.
    let mut s = connect(&path);
    let body = format!("{}{}", " ".repeat(MAX_BODY - 2), "{}");
    let (code, head, _) = request(&mut s, "PUT", "vm.create", &body, &[]);
    assert_eq!(code, 400, "{head}");
    assert_eq!(request(&mut s, "GET", "vmm.ping", "", &[]).0, 200);
}

#[test]
fn http_responses_match_cloud_hypervisor_framing() {
    // Counters of 40 KiB of JSON: `{"d":{"x":"aaa..."}}` is 14 bytes
    // around the string.
    let counters = json!({ "d": { "x": "a".repeat((40 << 10) - 14) } });
    let big: Arc<dyn VmApi> = Arc::new(FakeVm::default().with_counters(counters));
    let (path, _vmm, _open) = serve("framing", Some(big), short_limits());
    let mut s = connect(&path);

    // A 200 with a body: code without reason phrase, Content-Length.
    let (code, head, body) = request(&mut s, "GET", "vmm.ping", "", &[]);
    assert_eq!(code, 200);
    assert_eq!(
        head,
        format!(
            "HTTP/1.1 200 \r\nServer: dmavisor API\r\nConnection: keep-alive\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
    );
    // A 204 on the same (kept-alive) connection: no body, no length.
    let (code, head, body) = request(&mut s, "PUT", "vm.resume", "", &[]);
    assert_eq!(code, 204);
    assert_eq!(
        head,
        "HTTP/1.1 204 \r\nServer: dmavisor API\r\nConnection: keep-alive\r\n\r\n"
    );
    assert!(body.is_empty());
    // A body over 32 KiB is sent whole with its length, never chunked.
    let (code, head, body) = request(&mut s, "GET", "vm.counters", "", &[]);
    assert_eq!(code, 200);
    assert!(!head.contains("Transfer-Encoding"), "{head}");
    assert_eq!(body.len(), 40 << 10);
    assert!(head.contains(&format!("Content-Length: {}\r\n", 40 << 10)));
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["d"]["x"].as_str().map(str::len), Some((40 << 10) - 14));

    // Expect: 100-continue gets its interim answer before the body.
    s.write_all(
        b"PUT /api/v1/vm.resize HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
    )
    .unwrap();
    let (interim, _) = response(&mut s);
    assert_eq!(status(&interim), 100, "{interim}");
    s.write_all(b"{}").unwrap();
    let (head, _) = response(&mut s);
    assert_eq!(status(&head), 501, "{head}");

    // Descriptors sent with SCM_RIGHTS (as ch-remote sends tap fds with
    // the request line) reach the server, which closes them afterwards.
    let (mut read_end, write_end) = pipe();
    let line = b"PUT /api/v1/vm.add-net HTTP/1.1\r\nHost: localhost\r\n";
    s.send_with_fds(
        &[&line[..]],
        &[write_end.as_raw_fd(), write_end.as_raw_fd()],
    )
    .unwrap();
    s.write_all(b"Content-Length: 2\r\n\r\n{}").unwrap();
    let (head, body) = response(&mut s);
    assert_eq!(status(&head), 501, "{head}");
    let msg = String::from_utf8_lossy(&body);
    assert!(msg.contains("2 file descriptors received"), "{msg}");
    // With our own copy closed, EOF on the pipe shows the server closed its.
    drop(write_end);
    assert!(
        writers_gone(&mut read_end),
        "the server kept a descriptor open"
    );
    // And the connection still serves.
    assert_eq!(request(&mut s, "GET", "vmm.ping", "", &[]).0, 200);
}
