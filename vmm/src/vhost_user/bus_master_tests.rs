//! Bus mastering and a vhost-user back-end: the back-end does its DMA
//! without the device's `DmaSpace`, so clearing the command register's bit
//! must stop its rings, and setting it again must start them where they
//! stopped. Played against a scripted back-end on a real Unix socket.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{
    FrontendReq, VhostUserProtocolFeatures, VhostUserVirtioFeatures, VhostUserVringState,
};
use virtio_queue::{Queue, QueueT};
use vm_memory::{ByteValued, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use super::client::{decode_header, encode_message, FLAG_NEED_REPLY, FLAG_REPLY, FLAG_VERSION_1};
use super::iotlb::{MissError, ACCESS_RO};
use super::VhostUserNet;
use crate::dma::test_iommu::{TestIommu, RW};
use crate::dma::DmaSpace;
use crate::memory::{create_guest_memory, GuestMemoryMmap};
use crate::net::NetConfig;
use crate::virtio::{
    feature, ActivateContext, ActiveQueue, VirtioDevice, VirtioInterrupt, VIRTIO_F_ACCESS_PLATFORM,
    VIRTIO_F_VERSION_1,
};

/// Every request the back-end got: (code, body).
pub(super) type Log = Arc<Mutex<Vec<(u32, Vec<u8>)>>>;

/// A back-end that answers everything: its features, an acknowledgement
/// where one is asked for, and GET_VRING_BASE with index + 7.
pub(super) fn scripted_back_end(mut sock: UnixStream, log: Log) {
    loop {
        let mut hdr = [0u8; 12];
        if sock.read_exact(&mut hdr).is_err() {
            return;
        }
        let (code, flags, size) = decode_header(&hdr);
        let mut body = vec![0u8; size as usize];
        if sock.read_exact(&mut body).is_err() {
            return;
        }
        log.lock().unwrap().push((code, body.clone()));
        let u64_reply = |v: u64| Some(v.to_le_bytes().to_vec());
        let reply = match FrontendReq::try_from(code) {
            Ok(FrontendReq::GET_FEATURES) => u64_reply(
                feature(VIRTIO_F_VERSION_1)
                    | feature(VIRTIO_F_ACCESS_PLATFORM)
                    | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits(),
            ),
            Ok(FrontendReq::GET_PROTOCOL_FEATURES) => u64_reply(
                (VhostUserProtocolFeatures::MQ
                    | VhostUserProtocolFeatures::REPLY_ACK
                    | VhostUserProtocolFeatures::BACKEND_REQ)
                    .bits(),
            ),
            Ok(FrontendReq::GET_QUEUE_NUM) => u64_reply(2),
            Ok(FrontendReq::GET_VRING_BASE) => {
                let mut s = VhostUserVringState::default();
                s.as_mut_slice().copy_from_slice(&body);
                Some(
                    VhostUserVringState::new(s.index, s.index + 7)
                        .as_slice()
                        .to_vec(),
                )
            }
            _ if flags & FLAG_NEED_REPLY != 0 => u64_reply(0),
            _ => None,
        };
        if let Some(r) = reply {
            let msg = encode_message(code, FLAG_VERSION_1 | FLAG_REPLY, &r);
            if sock.write_all(&msg).is_err() {
                return;
            }
        }
    }
}

#[derive(Default)]
pub(super) struct Irq;

impl VirtioInterrupt for Irq {
    fn notify_queue(&self, _queue: u16) {}
    fn notify_config(&self) {}
    fn set_needs_reset(&self) {}
}

/// The requests logged since `from`, as (code, ring index) for ring
/// messages.
/// Activates `dev`'s two queues (16 entries, rings at 1 MiB and 1 MiB +
/// 64 KiB) with identity DMA over `mem`, as the driver would; returns the
/// DMA space (its bus-master gate) and the kicks, which must outlive the
/// device's use of them.
pub(super) fn activate_two_queues(
    dev: &mut VhostUserNet,
    mem: &GuestMemoryMmap,
) -> (DmaSpace, Vec<EventFd>) {
    let queue = |base: u64| {
        let mut q = Queue::new(16).unwrap();
        q.try_set_desc_table_address(GuestAddress(base)).unwrap();
        q.try_set_avail_ring_address(GuestAddress(base + 0x1000))
            .unwrap();
        q.try_set_used_ring_address(GuestAddress(base + 0x2000))
            .unwrap();
        q.set_ready(true);
        q
    };
    let kicks: Vec<EventFd> = (0..2)
        .map(|_| EventFd::new(libc::EFD_NONBLOCK).unwrap())
        .collect();
    let space = DmaSpace::identity(mem.clone());
    dev.activate(ActivateContext {
        mem: space.clone(),
        interrupt: Arc::new(Irq),
        queues: (0..2u16)
            .map(|i| ActiveQueue {
                index: i,
                queue: queue(0x100000 + u64::from(i) * 0x10000),
                kick: kicks[usize::from(i)].try_clone().unwrap(),
            })
            .collect(),
        features: feature(VIRTIO_F_VERSION_1) | feature(VIRTIO_F_ACCESS_PLATFORM),
    })
    .unwrap();
    (space, kicks)
}

pub(super) fn ring_requests(log: &Log, from: usize) -> Vec<(FrontendReq, u32, u32)> {
    log.lock()
        .unwrap()
        .iter()
        .skip(from)
        .filter_map(|(code, body)| {
            let req = FrontendReq::try_from(*code).ok()?;
            let word = |i: usize| {
                body.get(i * 4..i * 4 + 4)
                    .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            };
            Some((req, word(0)?, word(1).unwrap_or(0)))
        })
        .collect()
}

#[test]
fn bus_master_off_stops_vhost_user_backend() {
    let dir = std::env::temp_dir().join(format!("dmv-vu-bm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("backend.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let log = Log::default();
    let served = log.clone();
    let back_end = std::thread::spawn(move || {
        let (sock, _) = listener.accept().unwrap();
        scripted_back_end(sock, served);
    });
    let mem = create_guest_memory(64 << 20, false, true).unwrap();
    let cfg = NetConfig::parse(&format!(
        "vhost_user=on,socket={},num_queues=2,queue_size=16,iommu=on",
        path.display()
    ))
    .unwrap();
    let mut dev = VhostUserNet::connect(&cfg, mem.clone()).unwrap();
    let iotlb = dev.iotlb().expect("behind the vIOMMU");
    let iommu = TestIommu::new(8);
    iotlb.set_endpoint(iommu.dev.endpoint_dma(8).unwrap());
    iommu.dev.add_endpoint_listener(iotlb.clone());
    iommu.attach(1);
    iommu.map(1, 0x10000, 0x1000, 0x200000, RW);

    let (space, _kicks) = activate_two_queues(&mut dev, &mem);
    // Running: a miss is answered (wait for the UPDATE, which asks for no
    // reply, to be read).
    iotlb.answer_miss(0x10000, ACCESS_RO).unwrap();
    let iotlb_msg = u32::from(FrontendReq::IOTLB_MSG);
    let t = Instant::now();
    while !log.lock().unwrap().iter().any(|(c, _)| *c == iotlb_msg) {
        assert!(t.elapsed() < Duration::from_secs(5), "no UPDATE");
        std::thread::sleep(Duration::from_millis(5));
    }

    // The driver clears bus mastering (the transport closes the space's
    // gate and tells the device).
    let before = log.lock().unwrap().len();
    space.set_bus_master(false);
    dev.bus_master_changed(false);
    let stopped = ring_requests(&log, before);
    // Both rings stopped, and acknowledged as stopped, before it returned.
    assert_eq!(
        stopped,
        [
            (FrontendReq::GET_VRING_BASE, 0, 0),
            (FrontendReq::GET_VRING_BASE, 1, 0)
        ]
    );
    // No translation reaches the back-end while it is off.
    assert!(matches!(
        iotlb.answer_miss(0x10000, ACCESS_RO),
        Err(MissError::Stopped)
    ));
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(log.lock().unwrap().len(), before + 2, "a message went out");

    // On again: each ring starts where the back-end stopped it.
    let before = log.lock().unwrap().len();
    space.set_bus_master(true);
    dev.bus_master_changed(true);
    let restarted = ring_requests(&log, before);
    for ring in 0..2u32 {
        let of_ring: Vec<_> = restarted
            .iter()
            .filter(|(_, i, _)| *i == ring)
            .map(|(r, _, v)| (*r, *v))
            .collect();
        assert_eq!(
            of_ring.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
            [
                FrontendReq::SET_VRING_NUM,
                FrontendReq::SET_VRING_ADDR,
                FrontendReq::SET_VRING_BASE,
                FrontendReq::SET_VRING_CALL,
                FrontendReq::SET_VRING_KICK,
                FrontendReq::SET_VRING_ENABLE,
            ],
            "ring {ring}"
        );
        assert!(of_ring.contains(&(FrontendReq::SET_VRING_BASE, ring + 7)));
        assert!(of_ring.contains(&(FrontendReq::SET_VRING_ENABLE, 1)));
    }
    iotlb.answer_miss(0x10000, ACCESS_RO).unwrap();

    // Off, then a device reset: the paused rings are not stopped twice.
    space.set_bus_master(false);
    dev.bus_master_changed(false);
    let before = log.lock().unwrap().len();
    dev.reset();
    assert!(ring_requests(&log, before)
        .iter()
        .all(|(r, _, _)| *r != FrontendReq::GET_VRING_BASE));
    drop(dev);
    drop(iotlb);
    drop(iommu);
    let t = Instant::now();
    back_end.join().unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
    let _ = std::fs::remove_dir_all(&dir);
}
