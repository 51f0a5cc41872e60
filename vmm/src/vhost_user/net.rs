//! virtio-net whose data path is a vhost-user back-end (`--net
//! vhost_user=on,socket=PATH`).
//!
//! The VMM keeps the PCI transport and the device configuration (MAC, link
//! status); the back-end owns the rings. At DRIVER_OK the front-end sends
//! the memory table (the memfd of `--memory shared=on`), each ring's
//! addresses in the VMM's address space, its start index, the ioeventfd
//! the vCPUs signal (kick) and an eventfd the back-end signals (call); a
//! thread turns calls into MSI-X interrupts and watches the socket so a
//! back-end that dies marks the device DEVICE_NEEDS_RESET instead of leaving
//! the guest waiting.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use log::{info, warn};
use thiserror::Error;
use vhost::vhost_user::message::{
    FrontendReq, VhostUserMemory, VhostUserMemoryRegion, VhostUserProtocolFeatures, VhostUserU64,
    VhostUserVirtioFeatures, VhostUserVringAddr, VhostUserVringAddrFlags, VhostUserVringState,
};
use virtio_queue::QueueT;
use vm_memory::{ByteValued, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::eventfd::EventFd;

use virtio_iommu::locks::Unpoison;

use super::calls::{run_call_forwarder, CallForwarder};
use super::client::{Client, ClientError};
use super::ctrl::{run_ctrl_queue, CtrlQueueServer};
use super::iotlb::{serve_backend_channel, BackendIotlb};
use super::stop::{end_vmm, BackendStop};
use crate::memory::GuestMemoryMmap;
use crate::net::device::{config_space, features as net_features, VIRTIO_ID_NET};
use crate::net::queue::WorkerQueue;
use crate::net::NetConfig;
use crate::sandbox::{self, ThreadKind};
use crate::virtio::{
    feature, read_config_window, ActivateContext, ActivateError, QueueSetupError, VirtioDevice,
    VIRTIO_F_ACCESS_PLATFORM, VIRTIO_F_VERSION_1, VIRTIO_RING_F_EVENT_IDX,
    VIRTIO_RING_F_INDIRECT_DESC,
};

/// Most memory regions a vhost-user memory table carries without
/// CONFIGURE_MEM_SLOTS (vhost-user spec, VHOST_USER_SET_MEM_TABLE).
const MAX_MEM_REGIONS: usize = 8;

/// Device features the front-end passes through when the back-end offers
/// them: the data-path bits the back-end implements. MAC and STATUS are
/// the front-end's own (it serves the configuration space).
const PASSTHROUGH_FEATURES: [u32; 10] = [
    net_features::CSUM,
    net_features::GUEST_CSUM,
    net_features::GUEST_TSO4,
    net_features::GUEST_TSO6,
    net_features::HOST_TSO4,
    net_features::HOST_TSO6,
    net_features::MRG_RXBUF,
    VIRTIO_RING_F_EVENT_IDX,
    VIRTIO_RING_F_INDIRECT_DESC,
    VIRTIO_F_VERSION_1,
];

/// Protocol features the front-end uses when the back-end has them.
fn wanted_protocol_features() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::MQ
        | VhostUserProtocolFeatures::REPLY_ACK
        | VhostUserProtocolFeatures::BACKEND_REQ
}

/// What a back-end behind the vIOMMU must have: a channel for its IOTLB
/// misses, and acknowledgements so an invalidation is known to be done.
fn iommu_protocol_features() -> VhostUserProtocolFeatures {
    VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::BACKEND_REQ
}

/// Errors while connecting to or configuring the back-end.
#[derive(Debug, Error)]
pub enum VhostUserNetError {
    /// The protocol exchange failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// Guest RAM cannot be shared with another process.
    #[error("vhost-user needs guest RAM the back-end can map: add shared=on to --memory")]
    MemoryNotShared,
    /// Guest RAM has more regions than a memory table holds.
    #[error("guest RAM has {0} regions, a vhost-user memory table holds {MAX_MEM_REGIONS}")]
    TooManyRegions(usize),
    /// The back-end lacks something the front-end needs.
    #[error("the back-end at {path} {what}")]
    Backend {
        /// Socket path.
        path: PathBuf,
        /// What is missing.
        what: String,
    },
}

/// The device: transport-facing state plus the back-end connection.
pub struct VhostUserNet {
    socket: PathBuf,
    client: Arc<Mutex<Client>>,
    /// Behind the vIOMMU: the back-end's IOTLB and the thread serving its
    /// misses (our end of the back-end channel, to close it at drop).
    iotlb: Option<(Arc<BackendIotlb>, UnixStream, JoinHandle<()>)>,
    mem: GuestMemoryMmap,
    mac: [u8; 6],
    queue_size: u16,
    /// Queue pairs offered (`num_queues / 2`); with more than one the
    /// device has a control queue, served by the VMM.
    pairs: usize,
    backend_features: u64,
    protocol_features: VhostUserProtocolFeatures,
    forwarder: Option<(EventFd, JoinHandle<()>)>,
    /// The control queue's thread (multi-queue only).
    ctrl: Option<(EventFd, JoinHandle<()>)>,
    /// What stopping the back-end needs; it also holds the rings running.
    stop: Arc<BackendStop>,
    /// How the current activation set up each ring, to start it again.
    rings: Vec<RingSetup>,
    /// Rings stopped while bus mastering is off, with their next index.
    paused: Vec<(u16, u32)>,
    /// Queue pairs the driver uses (its last VQ_PAIRS_SET).
    pairs_used: Arc<AtomicUsize>,
    /// The back-end serves one more ring only with protocol features.
    rings_start_disabled: bool,
}

/// One ring as handed to the back-end.
struct RingSetup {
    index: u16,
    size: u16,
    /// The SET_VRING_ADDR body.
    addr: Vec<u8>,
    call: EventFd,
    kick: EventFd,
}

impl RingSetup {
    /// Hands the ring over from available index `base` (SET_VRING_NUM,
    /// _ADDR, _BASE, _CALL, _KICK: the ring starts at the kick), enabled
    /// or not.
    fn start(
        &self,
        client: &mut Client,
        base: u32,
        enable: Option<bool>,
    ) -> Result<(), ClientError> {
        let index = u32::from(self.index);
        let ring = |v: u32| VhostUserVringState::new(index, v).as_slice().to_vec();
        let fd_body = VhostUserU64::new(u64::from(index)).as_slice().to_vec();
        let steps: [(FrontendReq, Vec<u8>, Option<i32>); 5] = [
            (FrontendReq::SET_VRING_NUM, ring(u32::from(self.size)), None),
            (FrontendReq::SET_VRING_ADDR, self.addr.clone(), None),
            (FrontendReq::SET_VRING_BASE, ring(base), None),
            (
                FrontendReq::SET_VRING_CALL,
                fd_body.clone(),
                Some(self.call.as_raw_fd()),
            ),
            (
                FrontendReq::SET_VRING_KICK,
                fd_body,
                Some(self.kick.as_raw_fd()),
            ),
        ];
        for (req, body, fd) in steps {
            let fds: Vec<i32> = fd.into_iter().collect();
            client.set_bytes(req, &body, &fds)?;
        }
        if let Some(on) = enable {
            client.set(
                FrontendReq::SET_VRING_ENABLE,
                &VhostUserVringState::new(index, u32::from(on)),
                &[],
            )?;
        }
        Ok(())
    }
}

impl VhostUserNet {
    /// Connects to the back-end and negotiates what does not depend on the
    /// guest: ownership, the back-end's features and protocol features.
    pub fn connect(cfg: &NetConfig, mem: GuestMemoryMmap) -> Result<Self, VhostUserNetError> {
        let socket = cfg.vhost_user_socket.clone().unwrap_or_default();
        memory_table(&mem)?;
        let mut client = if cfg.vhost_server {
            Client::accept(&socket)?
        } else {
            Client::connect(&socket)?
        };
        let missing = |what: &str| VhostUserNetError::Backend {
            path: socket.clone(),
            what: what.to_string(),
        };
        client.set_bytes(FrontendReq::SET_OWNER, &[], &[])?;
        let backend_features = client.get_u64(FrontendReq::GET_FEATURES)?;
        if backend_features & feature(VIRTIO_F_VERSION_1) == 0 {
            return Err(missing("does not offer VIRTIO_F_VERSION_1"));
        }
        let mut protocol_features = VhostUserProtocolFeatures::empty();
        if backend_features & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits() != 0 {
            let offered = client.get_u64(FrontendReq::GET_PROTOCOL_FEATURES)?;
            protocol_features =
                VhostUserProtocolFeatures::from_bits_truncate(offered) & wanted_protocol_features();
            client.set(
                FrontendReq::SET_PROTOCOL_FEATURES,
                &VhostUserU64::new(protocol_features.bits()),
                &[],
            )?;
            if protocol_features.contains(VhostUserProtocolFeatures::REPLY_ACK) {
                client.enable_reply_ack();
            }
            if protocol_features.contains(VhostUserProtocolFeatures::MQ) {
                let queues = client.get_u64(FrontendReq::GET_QUEUE_NUM)?;
                if queues < cfg.num_queues as u64 {
                    return Err(missing(&format!(
                        "serves {queues} queue(s), num_queues={} are needed",
                        cfg.num_queues
                    )));
                }
            }
        }
        if cfg.num_queues > 2 && !protocol_features.contains(VhostUserProtocolFeatures::MQ) {
            return Err(missing(&format!(
                "lacks the MQ protocol feature num_queues={} needs",
                cfg.num_queues
            )));
        }
        if cfg.iommu {
            if backend_features & feature(VIRTIO_F_ACCESS_PLATFORM) == 0 {
                return Err(missing(
                    "does not offer VIRTIO_F_ACCESS_PLATFORM (a DPDK back-end needs iommu-support=1)",
                ));
            }
            if !protocol_features.contains(iommu_protocol_features()) {
                return Err(missing(
                    "lacks the BACKEND_REQ and REPLY_ACK protocol features a device IOTLB needs",
                ));
            }
        }
        info!(
            "vhost-user-net at {}: features {backend_features:#x}, protocol features {:#x}",
            socket.display(),
            protocol_features.bits()
        );
        let client = Arc::new(Mutex::new(client));
        let stop = Arc::new(BackendStop::new(Box::new(end_vmm)));
        let os = |source: std::io::Error| {
            VhostUserNetError::Client(ClientError::Connect {
                path: socket.clone(),
                source,
            })
        };
        let iotlb = if cfg.iommu {
            let iotlb = Arc::new(BackendIotlb::new(client.clone(), stop.clone(), mem.clone()));
            let (ours, theirs) = UnixStream::pair().map_err(os)?;
            stop.set_channel(ours.try_clone().map_err(os)?);
            lock(&client).set_bytes(FrontendReq::SET_BACKEND_REQ_FD, &[], &[theirs.as_raw_fd()])?;
            drop(theirs);
            let reader = ours.try_clone().map_err(os)?;
            let served = iotlb.clone();
            let handle = sandbox::spawn(ThreadKind::VhostUser, "vhost-user-iotlb", move || {
                serve_backend_channel(reader, served)
            })
            .map_err(os)?;
            Some((iotlb, ours, handle))
        } else {
            None
        };
        Ok(Self {
            socket,
            client,
            iotlb,
            mem,
            mac: cfg.mac,
            queue_size: cfg.queue_size,
            pairs: cfg.num_queues / 2,
            backend_features,
            protocol_features,
            forwarder: None,
            ctrl: None,
            stop,
            rings: Vec::new(),
            paused: Vec::new(),
            pairs_used: Arc::new(AtomicUsize::new(1)),
            rings_start_disabled: !protocol_features.is_empty(),
        })
    }

    /// The back-end's socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The back-end's IOTLB when the device is behind the vIOMMU (to be
    /// registered as a DMA consumer of its endpoint).
    pub fn iotlb(&self) -> Option<Arc<BackendIotlb>> {
        self.iotlb.as_ref().map(|(i, _, _)| i.clone())
    }

    fn start(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        let dev = |e: ClientError| ActivateError::Device(Box::new(e));
        let client = self.client.clone();
        let mut client = lock(&client);
        // Bit 30 (VHOST_USER_F_PROTOCOL_FEATURES) is a vhost-user bit, not a
        // virtio one: it must be acked back when it was negotiated.
        let mut acked = ctx.features & (self.backend_features | feature(VIRTIO_F_VERSION_1));
        if !self.protocol_features.is_empty() {
            acked |= VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        }
        client
            .set(FrontendReq::SET_FEATURES, &VhostUserU64::new(acked), &[])
            .map_err(dev)?;
        let (table, fds) =
            memory_table(&self.mem).map_err(|e| ActivateError::Device(Box::new(e)))?;
        client
            .set_bytes(FrontendReq::SET_MEM_TABLE, &table, &fds)
            .map_err(dev)?;
        // Behind the vIOMMU the ring addresses are IOVAs the back-end
        // translates through its IOTLB; otherwise host addresses.
        let behind_iommu = acked & feature(VIRTIO_F_ACCESS_PLATFORM) != 0;
        let mem = self.mem.clone();
        let ring_addr = |gpa: u64, what: &'static str| {
            if behind_iommu {
                Ok(gpa)
            } else {
                host_addr(&mem, gpa, what)
            }
        };
        let mut calls = Vec::new();
        let mut started = Vec::new();
        // With several pairs the control queue follows the data queues.
        let ctrl_index = (self.pairs > 1).then_some(self.pairs * 2);
        let (ctrl_queue, data): (Vec<_>, Vec<_>) = ctx
            .queues
            .into_iter()
            .partition(|q| Some(usize::from(q.index)) == ctrl_index);
        for q in &data {
            let index = u32::from(q.index);
            let queue = &q.queue;
            let addr = VhostUserVringAddr::new(
                index,
                VhostUserVringAddrFlags::empty(),
                ring_addr(queue.desc_table(), "descriptor table")?,
                ring_addr(queue.used_ring(), "used ring")?,
                ring_addr(queue.avail_ring(), "available ring")?,
                0,
            );
            let call = EventFd::new(libc::EFD_NONBLOCK)?;
            let setup = RingSetup {
                index: q.index,
                size: queue.size(),
                addr: addr.as_slice().to_vec(),
                call: call.try_clone()?,
                kick: q.kick.try_clone()?,
            };
            // With protocol features the rings start disabled (vhost-user
            // spec, "Ring states"). Until the driver picks a number of
            // pairs it uses the first one only (virtio 1.2, 5.1.6.5.5).
            let enable = self.rings_start_disabled.then_some(q.index < 2);
            setup
                .start(&mut client, u32::from(queue.next_avail()), enable)
                .map_err(dev)?;
            started.push(q.index);
            self.rings.push(setup);
            calls.push((q.index, call));
        }
        self.pairs_used.store(1, Ordering::SeqCst);
        self.stop.started(started.clone(), ctx.interrupt.clone());
        drop(client);
        if let Some(q) = ctrl_queue.into_iter().next() {
            let stop = EventFd::new(libc::EFD_NONBLOCK)?;
            let server = CtrlQueueServer {
                queue: WorkerQueue::from(q),
                mem: ctx.mem.clone(),
                interrupt: ctx.interrupt.clone(),
                client: self.client.clone(),
                rings: started,
                pairs: self.pairs,
                pairs_used: self.pairs_used.clone(),
                stop: stop.try_clone()?,
            };
            let handle = sandbox::spawn(ThreadKind::VhostUser, "vhost-user-ctrl", move || {
                run_ctrl_queue(server)
            })?;
            self.ctrl = Some((stop, handle));
        }
        let stop = EventFd::new(libc::EFD_NONBLOCK)?;
        let forwarder = CallForwarder {
            calls,
            socket_fd: lock(&self.client).raw_fd(),
            stop: stop.try_clone()?,
            interrupt: ctx.interrupt.clone(),
            socket: self.socket.clone(),
        };
        let handle = sandbox::spawn(ThreadKind::VhostUser, "vhost-user-call", move || {
            run_call_forwarder(forwarder)
        })?;
        self.forwarder = Some((stop, handle));
        if !ctx.mem.bus_master() {
            self.bus_master_changed(false);
        }
        Ok(())
    }

    /// Bus mastering off: every running ring stopped (GET_VRING_BASE, the
    /// back-end no longer touches it when the answer comes) and no UPDATE
    /// sent; a ring the back-end does not confirm stopped stops the device.
    fn pause_rings(&mut self) {
        let client = self.client.clone();
        let mut client = lock(&client);
        if let Some(iotlb) = self.iotlb() {
            iotlb.set_bus_master(false);
        }
        let mut running = self.stop.take_running().into_iter();
        while let Some(index) = running.next() {
            let state = VhostUserVringState::new(u32::from(index), 0);
            match client.get_with(FrontendReq::GET_VRING_BASE, &state) {
                Ok(s) => self.paused.push((index, s.num)),
                Err(e) => {
                    let mut left = vec![index];
                    left.extend(running);
                    self.stop.restarted(&left);
                    self.stop.stop(
                        &mut client,
                        &format!("bus mastering off: ring {index}: {e}"),
                    );
                    return;
                }
            }
        }
    }

    /// Bus mastering on again: the paused rings start where they stopped.
    fn resume_rings(&mut self) {
        let client = self.client.clone();
        let mut client = lock(&client);
        if self.stop.is_stopped() {
            self.paused.clear();
            return;
        }
        if let Some(iotlb) = self.iotlb() {
            iotlb.set_bus_master(true);
        }
        let pairs = self.pairs_used.load(Ordering::SeqCst);
        for (index, base) in std::mem::take(&mut self.paused) {
            let Some(setup) = self.rings.iter().find(|r| r.index == index) else {
                continue;
            };
            let enable = self
                .rings_start_disabled
                .then_some(usize::from(index / 2) < pairs);
            if let Err(e) = setup.start(&mut client, base, enable) {
                self.stop
                    .stop(&mut client, &format!("bus mastering on: ring {index}: {e}"));
                return;
            }
            self.stop.restarted(&[index]);
        }
    }
}

/// The host address of `gpa`, which the back-end finds in its copy of the
/// memory table.
fn host_addr(mem: &GuestMemoryMmap, gpa: u64, what: &'static str) -> Result<u64, ActivateError> {
    mem.get_host_address(GuestAddress(gpa))
        .map(|p| p as u64)
        .map_err(|_| QueueSetupError::NotInGuestRam { what, gpa }.into())
}

/// The SET_MEM_TABLE body and its file descriptors, one per RAM region.
fn memory_table(mem: &GuestMemoryMmap) -> Result<(Vec<u8>, Vec<i32>), VhostUserNetError> {
    let count = mem.num_regions();
    if count > MAX_MEM_REGIONS {
        return Err(VhostUserNetError::TooManyRegions(count));
    }
    let count32 = u32::try_from(count).map_err(|_| VhostUserNetError::TooManyRegions(count))?;
    let mut body = VhostUserMemory::new(count32).as_slice().to_vec();
    let mut fds = Vec::with_capacity(count);
    for region in mem.iter() {
        let fo = region
            .file_offset()
            .ok_or(VhostUserNetError::MemoryNotShared)?;
        let host = mem
            .get_host_address(region.start_addr())
            .map_err(|_| VhostUserNetError::MemoryNotShared)? as u64;
        let r = VhostUserMemoryRegion::new(region.start_addr().0, region.len(), host, fo.start());
        body.extend_from_slice(r.as_slice());
        fds.push(AsRawFd::as_raw_fd(fo.file()));
    }
    Ok((body, fds))
}

impl VirtioDevice for VhostUserNet {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn pci_class(&self) -> (u8, u8) {
        (0x02, 0x00)
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        let ctrl = usize::from(self.pairs > 1);
        vec![self.queue_size; self.pairs * 2 + ctrl]
    }

    fn features(&self) -> u64 {
        let passthrough = PASSTHROUGH_FEATURES
            .iter()
            .fold(0u64, |acc, b| acc | feature(*b));
        let mut f = (self.backend_features & passthrough)
            | feature(net_features::MAC)
            | feature(net_features::STATUS);
        if self.pairs > 1 {
            f |= feature(net_features::CTRL_VQ) | feature(net_features::MQ);
        }
        f
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        // NetConfig bounds the pairs to MAX_QUEUE_PAIRS: never saturates.
        let pairs = u16::try_from(self.pairs).unwrap_or(u16::MAX);
        read_config_window(&config_space(self.mac, pairs), offset, data);
    }

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        let has = |i: u16| ctx.queues.iter().any(|q| q.index == i);
        if !has(0) || !has(1) {
            return Err(QueueSetupError::NoFirstPair.into());
        }
        // A pair is handed over whole or not at all.
        if let Some(q) = ctx
            .queues
            .iter()
            .find(|q| usize::from(q.index) < self.pairs * 2 && !has(q.index ^ 1))
        {
            return Err(QueueSetupError::Unpaired { index: q.index }.into());
        }
        let result = self.start(ctx);
        if let Err(e) = &result {
            warn!("vhost-user-net at {}: {e}", self.socket.display());
            self.reset();
        }
        result
    }

    fn bus_master_changed(&mut self, enabled: bool) {
        if enabled {
            self.resume_rings();
        } else {
            self.pause_rings();
        }
    }

    fn reset(&mut self) {
        if let Some((stop, handle)) = self.ctrl.take() {
            if stop.write(1).is_err() || handle.join().is_err() {
                warn!("vhost-user-net: the control queue thread did not stop cleanly");
            }
        }
        // GET_VRING_BASE stops a ring: when it returns, the back-end no
        // longer touches it (vhost-user spec, "Ring states"). Paused rings
        // are stopped already.
        self.paused.clear();
        self.rings.clear();
        if let Some(iotlb) = self.iotlb() {
            iotlb.set_bus_master(true);
        }
        for index in self.stop.take_running() {
            let state = VhostUserVringState::new(u32::from(index), 0);
            let stopped = lock(&self.client).get_with(FrontendReq::GET_VRING_BASE, &state);
            if let Err(e) = stopped {
                warn!(
                    "vhost-user-net at {}: stopping ring {index}: {e}",
                    self.socket.display()
                );
            }
        }
        if let Some((stop, handle)) = self.forwarder.take() {
            if let Err(e) = stop.write(1) {
                warn!("vhost-user-net: cannot stop the call forwarder: {e}");
                return;
            }
            if handle.join().is_err() {
                warn!("vhost-user-net call forwarder panicked");
            }
        }
    }
}

impl Drop for VhostUserNet {
    fn drop(&mut self) {
        self.reset();
        if let Some((_, ours, handle)) = self.iotlb.take() {
            // Closing our end ends the channel thread's read.
            let _ = ours.shutdown(std::net::Shutdown::Both);
            if handle.join().is_err() {
                warn!("vhost-user IOTLB thread panicked");
            }
        }
    }
}

fn lock(client: &Mutex<Client>) -> MutexGuard<'_, Client> {
    client.lock().unpoisoned()
}
