//! Descriptors passed with `SCM_RIGHTS` on the API socket, byte for byte
//! as `ch-remote add-net fd=[..]` and libvirt send tap fds: they reach
//! `vm.add-net` with their request, unused ones are closed, and a request
//! with too many is refused with all of them closed.

use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use vmm_sys_util::eventfd::EventFd;

use super::fd_stream::MAX_REQUEST_FDS;
use super::routes::{ApiError, VmSlot, VmmApi};
use super::server::{Limits, Server};
use super::test_fakes::FakeVm;
use super::test_http::{listen, pipe, request, writers_gone};
use crate::config::VmConfig;

/// A VMM whose one VM runs and keeps what `vm.add-net` and `vm.add-disk`
/// give it.
struct OneVm(Arc<FakeVm>);

impl VmmApi for OneVm {
    fn slot(&self) -> VmSlot {
        VmSlot::Running(self.0.clone())
    }
    fn create(&self, _config: VmConfig) -> Result<(), ApiError> {
        Ok(())
    }
    fn boot(&self) -> Result<(), ApiError> {
        Ok(())
    }
    fn delete(&self) -> Result<(), ApiError> {
        Ok(())
    }
    fn shutdown(&self) {}
    fn reboot(&self) {}
}

/// Sends `PUT /api/v1/NAME` with `body`, the descriptors `fds` riding on
/// the request line's bytes (as `ch-remote` sends them), and reads the
/// reply: (status, body).
fn put_with_fds(s: &mut UnixStream, name: &str, body: &str, fds: &[RawFd]) -> (u16, Value) {
    let (code, _, body) = request(s, "PUT", name, body, fds);
    (code, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

#[test]
fn add_net_with_passed_tap_fd() {
    let (path, listener) = listen("fds");
    let vm = Arc::new(FakeVm::default().keeping_plugs());
    let server = Server::new(listener, Arc::new(OneVm(vm.clone())), Limits::default()).unwrap();
    std::thread::spawn(move || server.run());
    let mut s = UnixStream::connect(&path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();

    // One tap-like descriptor (an eventfd standing in for the TAP queue):
    // the handler gets that very object with the NetConfig; the body's
    // `fds` numbers (the client's own) are ignored, as cloud-hypervisor
    // does, and num_queues follows the descriptors.
    let tap = EventFd::new(0).unwrap();
    let body = r#"{"fds": [42], "mac": "52:54:00:00:00:09", "id": "net9"}"#;
    let (code, reply) = put_with_fds(&mut s, "vm.add-net", body, &[tap.as_raw_fd()]);
    assert_eq!(code, 200, "{reply}");
    assert_eq!(reply, json!({ "id": "net9", "bdf": "0000:00:05.0" }));
    {
        let nets = vm.nets.lock().unwrap();
        let added = nets.first().expect("the handler ran");
        assert_eq!(added.id.as_deref(), Some("net9"));
        assert_eq!(added.cfg.num_queues, 2);
        assert_eq!(added.cfg.mac, [0x52, 0x54, 0, 0, 0, 9]);
        assert_eq!(added.fds.len(), 1);
        // The same eventfd: a count written here is read through it.
        tap.write(7).unwrap();
        let mut count = [0u8; 8];
        (&added.fds[0]).read_exact(&mut count).unwrap();
        assert_eq!(u64::from_ne_bytes(count), 7);
    }

    // Descriptors the request cannot use are closed: two for one queue
    // pair is a 400 that says so, and the handler never sees them.
    let (mut read_end, write_end) = pipe();
    let raw = write_end.as_raw_fd();
    let (code, reply) = put_with_fds(&mut s, "vm.add-net", r#"{"num_queues": 2}"#, &[raw, raw]);
    assert_eq!(code, 400, "{reply}");
    let msg = reply[0].as_str().unwrap_or_default();
    assert!(msg.contains("one fd per queue pair"), "{msg}");
    assert!(
        msg.contains("2 file descriptors received and closed"),
        "{msg}"
    );
    // On an endpoint that takes none, too.
    let (code, _) = put_with_fds(&mut s, "vm.add-disk", r#"{"path": "/img"}"#, &[raw]);
    assert_eq!(code, 200);
    assert_eq!(vm.disks.lock().unwrap().len(), 1);
    drop(write_end);
    assert!(writers_gone(&mut read_end), "the server kept a descriptor");
    assert_eq!(vm.nets.lock().unwrap().len(), 1);

    // More than the bound on one request: refused, every one closed (the
    // surplus as it arrives), and the connection serves on.
    let (mut read_end, write_end) = pipe();
    let many = vec![write_end.as_raw_fd(); MAX_REQUEST_FDS + 1];
    let (code, reply) = put_with_fds(&mut s, "vm.add-net", "{}", &many);
    assert_eq!(code, 400, "{reply}");
    let msg = reply[0].as_str().unwrap_or_default();
    assert!(
        msg.contains(&format!("more than {MAX_REQUEST_FDS} file descriptors")),
        "{msg}"
    );
    drop(write_end);
    assert!(writers_gone(&mut read_end), "the server kept a descriptor");
    assert_eq!(vm.nets.lock().unwrap().len(), 1, "the handler never ran");
    // Exactly the bound is taken: 8 pairs on 16 descriptors.
    let fds: Vec<EventFd> = (0..MAX_REQUEST_FDS)
        .map(|_| EventFd::new(0).unwrap())
        .collect();
    let raws: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let (code, reply) = put_with_fds(&mut s, "vm.add-net", r#"{"id": "mq"}"#, &raws);
    assert_eq!(code, 200, "{reply}");
    let nets = vm.nets.lock().unwrap();
    let mq = nets.get(1).expect("the second NIC");
    assert_eq!((mq.fds.len(), mq.cfg.num_queues), (16, 32));
}

/// `vm.add-net` and `vm.add-disk` bodies as cloud-hypervisor's clients
/// send them: checked by the same code as `--net` and `--disk`, a bad
/// one refused with 400 before the VM sees it.
#[test]
fn add_net_and_add_disk_bodies_are_checked() {
    use super::routes::handle;
    let vm = Arc::new(FakeVm::default().keeping_plugs());
    let vmm = OneVm(vm.clone());
    let put =
        |name: &str, body: &str| handle("PUT", &format!("/api/v1/{name}"), body.as_bytes(), &vmm);
    for (name, body) in [
        ("vm.add-net", "{"),
        ("vm.add-net", "[]"),
        ("vm.add-net", r#"{"bogus": 1}"#),
        ("vm.add-net", r#"{"id": 7}"#),
        ("vm.add-net", r#"{"fds": 3}"#),
        ("vm.add-net", r#"{"mac": "01:00:00:00:00:01"}"#),
        ("vm.add-net", r#"{"num_queues": 3}"#),
        ("vm.add-disk", "{}"),
        ("vm.add-disk", r#"{"path": "/img", "direct": true}"#),
        ("vm.add-disk", r#"{"path": "/img", "num_queues": 99}"#),
        ("vm.add-disk", r#"{"path": "/img", "bogus": 1}"#),
    ] {
        let r = put(name, body);
        assert_eq!(r.status, 400, "{name} {body}: {r:?}");
    }
    assert!(vm.nets.lock().unwrap().is_empty() && vm.disks.lock().unwrap().is_empty());
    let r = put(
        "vm.add-net",
        r#"{"tap": "hp0", "num_queues": 4, "iommu": true}"#,
    );
    assert_eq!(r.status, 200, "{r:?}");
    let r = put(
        "vm.add-disk",
        r#"{"path": "/img", "id": "d0", "iommu": true, "readonly": true}"#,
    );
    assert_eq!(r.status, 200, "{r:?}");
    let nets = vm.nets.lock().unwrap();
    let n = nets.first().expect("added");
    assert_eq!(
        (n.cfg.tap.as_str(), n.cfg.num_queues, n.cfg.iommu),
        ("hp0", 4, true)
    );
    assert!(n.id.is_none() && n.fds.is_empty());
    let disks = vm.disks.lock().unwrap();
    let d = disks.first().expect("added");
    assert_eq!(
        (d.id.as_deref(), d.iommu, d.readonly),
        (Some("d0"), true, true)
    );
    // Only PUT.
    assert_eq!(handle("GET", "/api/v1/vm.add-net", b"", &vmm).status, 405);
}
