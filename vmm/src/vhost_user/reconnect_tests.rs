//! A reboot in place with a vhost-user NIC: the old VM's device is torn
//! down (rings stopped, connection closed) and the rebuilt VM's device
//! connects to the same socket, with a device IOTLB of its own that
//! knows nothing of the old VM's translations. Played against a scripted
//! back-end on a real Unix socket that serves one connection at a time,
//! as `vhost-user-test-net --reconnect` does: the second connection is
//! served only once the first is closed.

use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::FrontendReq;
use vm_memory::ByteValued;
use vmm_sys_util::eventfd::EventFd;

use super::bus_master_tests::{activate_two_queues, ring_requests, scripted_back_end, Log};
use super::iotlb::{IotlbMsg, MissError, ACCESS_RO, INVALIDATE, UPDATE};
use super::VhostUserNet;
use crate::dma::test_iommu::{TestIommu, RW};
use crate::dma::DmaSpace;
use crate::memory::{create_guest_memory, GuestMemoryMmap};
use crate::net::NetConfig;
use crate::virtio::VirtioDevice;

const IOVA: u64 = 0x10000;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dmv-vu-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn cfg(path: &Path) -> NetConfig {
    NetConfig::parse(&format!(
        "vhost_user=on,socket={},num_queues=2,queue_size=16,iommu=on",
        path.display()
    ))
    .expect("config")
}

/// One VM's side: its guest RAM, vIOMMU and NIC, activated.
struct Vm {
    dev: VhostUserNet,
    iommu: TestIommu,
    _space: DmaSpace,
    _kicks: Vec<EventFd>,
    _mem: GuestMemoryMmap,
}

/// Builds a VM's NIC on `path` behind a new vIOMMU with the endpoint
/// attached and nothing mapped, and activates it as the driver would.
fn build(path: &Path) -> Vm {
    let mem = create_guest_memory(64 << 20, false, true).expect("guest RAM");
    let mut dev = VhostUserNet::connect(&cfg(path), mem.clone()).expect("connect");
    let iotlb = dev.iotlb().expect("behind the vIOMMU");
    let iommu = TestIommu::new(8);
    iotlb.set_endpoint(iommu.dev.endpoint_dma(8).expect("endpoint"));
    // As `crate::net_devices` registers it: a DMA consumer of the vIOMMU.
    iommu.dev.add_invalidator(iotlb.clone());
    iommu.dev.add_endpoint_listener(iotlb);
    iommu.attach(1);
    let (space, kicks) = activate_two_queues(&mut dev, &mem);
    Vm {
        dev,
        iommu,
        _space: space,
        _kicks: kicks,
        _mem: mem,
    }
}

/// The IOTLB messages (kind, iova) the back-end got on `log`.
fn iotlb_msgs(log: &Log) -> Vec<(u8, u64)> {
    let code = u32::from(FrontendReq::IOTLB_MSG);
    log.lock()
        .unwrap()
        .iter()
        .filter(|(c, _)| *c == code)
        .filter_map(|(_, body)| {
            let mut m = IotlbMsg::default();
            m.as_mut_slice()
                .copy_from_slice(body.get(..std::mem::size_of::<IotlbMsg>())?);
            Some((m.kind, m.iova))
        })
        .collect()
}

fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < Duration::from_secs(5), "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_rebuilt_vm_reconnects_with_an_iotlb_of_its_own() {
    let dir = scratch("reconnect");
    let path = dir.join("backend.sock");
    let listener = UnixListener::bind(&path).expect("listen");
    let sessions: Arc<Mutex<Vec<Log>>> = Arc::default();
    let ended = Arc::new(AtomicUsize::new(0));
    let back_end = {
        let (sessions, ended) = (sessions.clone(), ended.clone());
        std::thread::spawn(move || {
            for _ in 0..2 {
                let (sock, _) = listener.accept().expect("accept");
                let log = Log::default();
                sessions.lock().unwrap().push(log.clone());
                scripted_back_end(sock, log);
                ended.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let session = |i: usize| sessions.lock().unwrap()[i].clone();

    // The first VM: a translation reaches the back-end.
    let mut old = build(&path);
    old.iommu.map(1, IOVA, 0x1000, 0x200000, RW);
    let old_iotlb = old.dev.iotlb().expect("iotlb");
    old_iotlb.answer_miss(IOVA, ACCESS_RO).expect("translated");
    wait_until("no UPDATE in session 1", || {
        iotlb_msgs(&session(0)).contains(&(UPDATE, IOVA))
    });
    drop(old_iotlb);

    // The guest reboots: the owner's teardown stops the device (reset:
    // each running ring stopped with GET_VRING_BASE) and drops the VM.
    let before = session(0).lock().unwrap().len();
    old.dev.reset();
    let stopped = ring_requests(&session(0), before);
    assert_eq!(
        stopped,
        [
            (FrontendReq::GET_VRING_BASE, 0, 0),
            (FrontendReq::GET_VRING_BASE, 1, 0)
        ]
    );
    drop(old);
    wait_until("the old connection stayed open", || {
        ended.load(Ordering::SeqCst) == 1
    });

    // The rebuilt VM connects again (served only because the first
    // connection closed) and negotiates from the start.
    let new = build(&path);
    let log = session(1);
    let first = log.lock().unwrap().first().map(|(c, _)| *c);
    assert_eq!(first, Some(u32::from(FrontendReq::SET_OWNER)));
    let iotlb = new.dev.iotlb().expect("iotlb");
    // Fail closed across the rebuild: the old VM's translation is not
    // the new VM's, and the back-end gets nothing for it.
    assert!(
        matches!(iotlb.answer_miss(IOVA, ACCESS_RO), Err(MissError::Fault(_))),
        "the rebuilt VM translated an IOVA its vIOMMU never mapped"
    );
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(iotlb_msgs(&log), [], "a translation reached the back-end");
    // Mapped by the new guest: translated; unmapped: invalidated, and
    // acknowledged on the new connection before the UNMAP completed.
    new.iommu.map(1, IOVA, 0x1000, 0x300000, RW);
    iotlb.answer_miss(IOVA, ACCESS_RO).expect("translated");
    wait_until("no UPDATE in session 2", || {
        iotlb_msgs(&log).contains(&(UPDATE, IOVA))
    });
    new.iommu.unmap(1, IOVA, 0x1000);
    assert!(
        iotlb_msgs(&log).contains(&(INVALIDATE, IOVA)),
        "{:?}",
        iotlb_msgs(&log)
    );
    assert!(iotlb_msgs(&session(0))
        .iter()
        .all(|&(k, _)| k != INVALIDATE));
    drop(iotlb);
    drop(new);
    back_end.join().expect("back-end");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A back-end that ends with its connection (the default of
/// `vhost-user-test-net`): the rebuild's connect fails at once, naming
/// the socket, whether the socket file is left behind or removed.
#[test]
fn a_backend_that_ended_fails_the_reconnect_at_once() {
    let dir = scratch("gone");
    let path = dir.join("backend.sock");
    let listener = UnixListener::bind(&path).expect("listen");
    let back_end = std::thread::spawn(move || {
        let (sock, _) = listener.accept().expect("accept");
        scripted_back_end(sock, Log::default());
        // The listener closes here; the file stays.
    });
    let vm = build(&path);
    drop(vm);
    back_end.join().expect("back-end");
    for left_behind in [true, false] {
        if !left_behind {
            std::fs::remove_file(&path).expect("remove");
        }
        let mem = create_guest_memory(64 << 20, false, true).expect("guest RAM");
        let t = Instant::now();
        let err = VhostUserNet::connect(&cfg(&path), mem)
            .err()
            .expect("no back-end to connect to");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert!(err.to_string().contains("backend.sock"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
