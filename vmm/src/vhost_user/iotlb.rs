//! A vhost-user back-end behind the vIOMMU: its device IOTLB.
//!
//! With VIRTIO_F_ACCESS_PLATFORM the back-end sees only IOVAs (ring
//! addresses and descriptors). On a miss it asks over the back-end channel
//! (`VHOST_USER_BACKEND_IOTLB_MSG`, type MISS); the front-end looks the
//! IOVA up in the endpoint's domain and answers with an UPDATE on the
//! front-end channel carrying the mapping's reach from the IOVA, its host
//! address and permissions. The back-end caches it, so it is a DMA
//! consumer: the UNMAPs of one request-queue kick reach [`BackendIotlb`]
//! as merged ranges ([`Invalidator`]), each sent as one INVALIDATE that the
//! back-end must acknowledge (REPLY_ACK) before the requests complete; an
//! endpoint that changes domain invalidates everything.

use std::io::Read;
use std::ops::RangeInclusive;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use log::{debug, warn};
use vhost::vhost_user::message::{BackendReq, FrontendReq, MAX_MSG_SIZE};
use virtio_iommu::device::EndpointListener;
use virtio_iommu::mapping::{Invalidator, Perm};
use virtio_iommu::mutation::{self, Mutation};
use virtio_iommu::translate::EndpointDma;
use vm_memory::{ByteValued, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use virtio_iommu::locks::Unpoison;

use super::client::{
    decode_header, encode_message, Client, FLAG_NEED_REPLY, FLAG_REPLY, FLAG_VERSION_1, HEADER_LEN,
};
use super::order::SendOrder;
use super::stop::BackendStop;
use super::writer::Writer;
use crate::memory::GuestMemoryMmap;

/// `struct vhost_iotlb_msg` (linux/vhost_types.h), the body of
/// VHOST_USER_IOTLB_MSG in both directions.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IotlbMsg {
    /// First IOVA.
    pub iova: u64,
    /// Bytes.
    pub size: u64,
    /// Host (front-end process) address of `iova`, in UPDATE.
    pub uaddr: u64,
    /// [`ACCESS_RO`], [`ACCESS_WO`] or [`ACCESS_RW`].
    pub perm: u8,
    /// [`MISS`], [`UPDATE`], [`INVALIDATE`] or [`ACCESS_FAIL`].
    pub kind: u8,
    _pad: [u8; 6],
}

// SAFETY: plain integers with explicit padding; every bit pattern is valid.
unsafe impl ByteValued for IotlbMsg {}

/// Read-only access.
pub const ACCESS_RO: u8 = 1;
/// Write-only access.
pub const ACCESS_WO: u8 = 2;
/// Read-write access.
pub const ACCESS_RW: u8 = 3;
/// Back-end to front-end: translate this IOVA.
pub const MISS: u8 = 1;
/// Front-end to back-end: a translation.
pub const UPDATE: u8 = 2;
/// Front-end to back-end: forget translations in a range.
pub const INVALIDATE: u8 = 3;
/// Back-end to front-end: an access failed.
pub const ACCESS_FAIL: u8 = 4;

impl IotlbMsg {
    /// A message of `kind`.
    pub fn new(kind: u8, iova: u64, size: u64, uaddr: u64, perm: u8) -> Self {
        Self {
            iova,
            size,
            uaddr,
            perm,
            kind,
            _pad: [0; 6],
        }
    }
}

fn perm_bits(p: Perm) -> u8 {
    match (p.contains(Perm::READ), p.contains(Perm::WRITE)) {
        (true, true) => ACCESS_RW,
        (false, true) => ACCESS_WO,
        _ => ACCESS_RO,
    }
}

fn access_of(perm: u8) -> Perm {
    match perm {
        ACCESS_WO => Perm::WRITE,
        ACCESS_RW => Perm::READ | Perm::WRITE,
        _ => Perm::READ,
    }
}

/// Message counters (printed at exit, kept for the API).
#[derive(Debug, Default)]
pub struct IotlbStats {
    /// MISS requests from the back-end.
    pub misses: AtomicU64,
    /// Misses the domain could not translate (a fault was reported).
    pub refused: AtomicU64,
    /// INVALIDATE messages sent (each acknowledged).
    pub invalidations: AtomicU64,
    /// Merged ranges those messages covered.
    pub ranges: AtomicU64,
    /// Time spent waiting for the back-end's acknowledgements of those
    /// messages, in microseconds: time the UNMAPs behind them were held.
    pub ack_wait_us: AtomicU64,
    /// UPDATEs not sent because an invalidation overtook their miss.
    pub stale: AtomicU64,
    /// Times the device was stopped for an unacknowledged invalidation.
    pub stops: AtomicU64,
}

/// Why the back-end's IOTLB miss is refused.
#[derive(Debug, thiserror::Error)]
pub enum MissError {
    /// The device is not an endpoint of the vIOMMU yet.
    #[error("the device has no vIOMMU endpoint yet")]
    NoEndpoint,
    /// The vIOMMU refused the translation.
    #[error(transparent)]
    Fault(#[from] virtio_iommu::translate::DmaFault),
    /// The IOVA maps outside guest RAM.
    #[error("IOVA {iova:#x} maps to {gpa:#x}, outside guest RAM")]
    OutsideRam {
        /// The IOVA asked for.
        iova: u64,
        /// The guest-physical address it maps to.
        gpa: u64,
    },
    /// Guest RAM has no host mapping at that address.
    #[error(transparent)]
    HostAddress(#[from] vm_memory::GuestMemoryError),
    /// Bus mastering is off, or the device was stopped.
    #[error("the device may not do DMA now")]
    Stopped,
    /// Invalidations kept overtaking the translation.
    #[error("invalidations overlapping the miss kept overtaking it")]
    Overtaken,
    /// The UPDATE could not be written.
    #[error("sending the update: {0}")]
    Send(std::io::Error),
}

/// The back-end's device IOTLB as a consumer of the vIOMMU.
///
/// Locks, in the order they are taken: the client (the reply reader, held
/// by an invalidation until its acknowledgement), the send order
/// ([`SendOrder`]), the writer (one message). The miss thread takes only
/// the last two, so a back-end that answers nothing before its miss is
/// served cannot deadlock an invalidation waiting for its acknowledgement.
pub struct BackendIotlb {
    client: Arc<Mutex<Client>>,
    writer: Arc<Writer>,
    stop: Arc<BackendStop>,
    mem: GuestMemoryMmap,
    dma: OnceLock<EndpointDma>,
    domain: Mutex<Option<u32>>,
    order: Mutex<SendOrder>,
    /// Counters.
    pub stats: IotlbStats,
}

/// Translations of one miss that an invalidation overtook before it gives
/// up (the back-end asks again).
const MISS_ATTEMPTS: usize = 4;

impl BackendIotlb {
    /// An IOTLB for the back-end behind `client`; it serves misses once
    /// [`BackendIotlb::set_endpoint`] has named the endpoint. A failed
    /// invalidation stops the device through `stop`.
    pub fn new(client: Arc<Mutex<Client>>, stop: Arc<BackendStop>, mem: GuestMemoryMmap) -> Self {
        let writer = client.lock().unpoisoned().writer();
        Self {
            client,
            writer,
            stop,
            mem,
            dma: OnceLock::new(),
            domain: Mutex::new(None),
            order: Mutex::new(SendOrder::default()),
            stats: IotlbStats::default(),
        }
    }

    /// The vIOMMU endpoint whose domain the back-end translates through.
    pub fn set_endpoint(&self, dma: EndpointDma) {
        if self.dma.set(dma).is_err() {
            warn!("vhost-user IOTLB: endpoint set twice; keeping the first");
        }
    }

    /// Logs the counters (at VM exit).
    pub fn log_stats(&self, name: &str) {
        let s = &self.stats;
        log::info!(
            "{name}: IOTLB misses {} (refused {}, {} stale updates dropped), invalidations {} for {} ranges, acknowledged after {} us in all, {} device stops",
            s.misses.load(Ordering::Relaxed),
            s.refused.load(Ordering::Relaxed),
            s.stale.load(Ordering::Relaxed),
            s.invalidations.load(Ordering::Relaxed),
            s.ranges.load(Ordering::Relaxed),
            s.ack_wait_us.load(Ordering::Relaxed),
            s.stops.load(Ordering::Relaxed),
        );
    }

    fn endpoint(&self) -> Option<u32> {
        self.dma.get().map(EndpointDma::endpoint_id)
    }

    fn order(&self) -> MutexGuard<'_, SendOrder> {
        self.order.lock().unpoisoned()
    }

    /// Bus mastering of the device changed: while it is off no UPDATE goes
    /// out (the device's rings are stopped too). Called with the client
    /// held, before the rings are stopped.
    pub fn set_bus_master(&self, on: bool) {
        self.order().bus_master_off = !on;
    }

    /// Answers one miss: the UPDATE for `iova`, or the reason there is none.
    ///
    /// WHY a write-only mapping is granted read-write when the back-end
    /// asks for both: DPDK (22.11) asks read-write for every receive buffer,
    /// which Linux maps write-only (DMA_FROM_DEVICE), and a write-only
    /// answer leaves it unable to deliver a single frame (QEMU answers
    /// write-only, and its guests behind virtio-iommu-pci receive nothing
    /// from testpmd). The widening costs no isolation: a vhost-user
    /// back-end maps all of guest RAM through the memory table, so the
    /// IOTLB's permissions guard against its mistakes (a stale or foreign
    /// IOVA, a write into a read-only buffer), not against its reads.
    /// Unmapped IOVAs and writes into read-only mappings stay refused.
    pub fn translate_miss(&self, iova: u64, perm: u8) -> Result<IotlbMsg, MissError> {
        let dma = self.dma.get().ok_or(MissError::NoEndpoint)?;
        let wanted = access_of(perm);
        let needed = if wanted.contains(Perm::WRITE) {
            Perm::WRITE
        } else {
            Perm::READ
        };
        let mut t = dma.lookup(iova, needed)?;
        if t.perm.contains(Perm::WRITE) {
            t.perm = t.perm | wanted;
        }
        // The back-end maps the host address linearly: stop at the end of
        // the guest RAM region holding the start.
        let region = self
            .mem
            .find_region(GuestAddress(t.gpa))
            .ok_or(MissError::OutsideRam { iova, gpa: t.gpa })?;
        let in_region = region.last_addr().0 - t.gpa + 1;
        let host = self.mem.get_host_address(GuestAddress(t.gpa))?;
        Ok(IotlbMsg::new(
            UPDATE,
            iova,
            t.len.min(in_region),
            host as u64,
            perm_bits(t.perm),
        ))
    }

    /// Serves one miss: translates it and sends the UPDATE, unless an
    /// invalidation overlapping it was written meanwhile ([`SendOrder`]);
    /// then it translates again.
    pub fn answer_miss(&self, iova: u64, perm: u8) -> Result<(), MissError> {
        self.answer_miss_with(iova, perm, || {})
    }

    /// [`BackendIotlb::answer_miss`] running `between` after each
    /// translation (tests widen the race window with it).
    fn answer_miss_with(&self, iova: u64, perm: u8, between: impl Fn()) -> Result<(), MissError> {
        for _ in 0..MISS_ATTEMPTS {
            let seen = self.order().generation();
            let update = self.translate_miss(iova, perm)?;
            between();
            let order = self.order();
            if !order.open() {
                return Err(MissError::Stopped);
            }
            let last = update.iova.saturating_add(update.size.saturating_sub(1));
            if order.stale(seen, update.iova, last)
                && !mutation::active(Mutation::NoIotlbSerialisation)
            {
                drop(order);
                self.stats.stale.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            self.writer
                .write_message(
                    u32::from(FrontendReq::IOTLB_MSG),
                    false,
                    update.as_slice(),
                    &[],
                )
                .map_err(MissError::Send)?;
            return Ok(());
        }
        Err(MissError::Overtaken)
    }

    /// Sends one acknowledged INVALIDATE per range. A range the back-end
    /// does not acknowledge stops the device before this returns.
    fn invalidate_locked(&self, client: &mut Client, ranges: &[RangeInclusive<u64>]) {
        self.stats
            .ranges
            .fetch_add(ranges.len() as u64, Ordering::Relaxed);
        if self.stop.is_stopped() {
            // Its rings are stopped and it is disconnected: it holds no
            // translation it could still use, and gets no new one.
            return;
        }
        for r in ranges {
            let size = (r.end() - r.start()).saturating_add(1);
            let msg = IotlbMsg::new(INVALIDATE, *r.start(), size, 0, ACCESS_RW);
            self.stats.invalidations.fetch_add(1, Ordering::Relaxed);
            let sent = Instant::now();
            let result = {
                let mut order = self.order();
                order.invalidating(*r.start(), *r.end());
                client.send_acked(FrontendReq::IOTLB_MSG, msg.as_slice())
            }
            // Waiting with the send order released: the miss thread can
            // still answer the back-end, which may need that first.
            .and_then(|()| client.wait_ack(FrontendReq::IOTLB_MSG));
            let waited = u64::try_from(sent.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.stats.ack_wait_us.fetch_add(waited, Ordering::Relaxed);
            if let Err(e) = result {
                self.order().stopped = true;
                self.stats.stops.fetch_add(1, Ordering::Relaxed);
                self.stop
                    .stop(client, &format!("INVALIDATE of {r:#x?}: {e}"));
                return;
            }
        }
    }

    fn invalidate_ranges(&self, ranges: &[RangeInclusive<u64>]) {
        let mut client = self.client.lock().unpoisoned();
        self.invalidate_locked(&mut client, ranges);
    }
}

impl Invalidator for BackendIotlb {
    fn invalidate(&self, domain: u32, ranges: &[RangeInclusive<u64>]) {
        let ours = *self.domain.lock().unpoisoned();
        if ours == Some(domain) {
            self.invalidate_ranges(ranges);
        }
    }

    /// Our endpoint left a domain (or bypass): whatever the back-end
    /// cached came from there. Done at the end of the kick, outside the
    /// topology lock [`EndpointListener::endpoint_moved`] runs under, and
    /// still before the request that moved the endpoint completes.
    fn endpoint_left(&self, endpoint: u32, _domain: Option<u32>) {
        if self.endpoint() == Some(endpoint) {
            self.invalidate_ranges(&[0..=u64::MAX]);
        }
    }
}

impl EndpointListener for BackendIotlb {
    /// Follows the domain only, with no round trip under the topology
    /// lock: the kick's flush tells [`Invalidator::endpoint_left`], which
    /// drops what the back-end cached from the old domain.
    fn endpoint_moved(&self, endpoint: u32, _from: Option<u32>, to: Option<u32>) {
        if self.endpoint() == Some(endpoint) {
            *self.domain.lock().unpoisoned() = to;
        }
    }
}

/// Serves the back-end channel until it closes: answers MISS messages with
/// UPDATEs on the front-end channel and acknowledges what asks for it.
pub fn serve_backend_channel(mut sock: UnixStream, iotlb: Arc<BackendIotlb>) {
    loop {
        let mut hdr = [0u8; HEADER_LEN];
        if sock.read_exact(&mut hdr).is_err() {
            debug!("vhost-user back-end channel closed");
            return;
        }
        let (code, flags, size) = decode_header(&hdr);
        let size = size as usize;
        if size > MAX_MSG_SIZE {
            warn!("vhost-user back-end channel: {size}-byte message; closing it");
            return;
        }
        let mut body = vec![0u8; size];
        if sock.read_exact(&mut body).is_err() {
            return;
        }
        let status = if code == u32::from(BackendReq::IOTLB_MSG) {
            handle_iotlb(&iotlb, &body)
        } else {
            warn!("vhost-user back-end channel: request {code} not supported");
            1
        };
        if flags & FLAG_NEED_REPLY != 0 {
            let reply = encode_message(code, FLAG_VERSION_1 | FLAG_REPLY, &status.to_le_bytes());
            if std::io::Write::write_all(&mut sock, &reply).is_err() {
                return;
            }
        }
    }
}

fn handle_iotlb(iotlb: &BackendIotlb, body: &[u8]) -> u64 {
    let mut msg = IotlbMsg::default();
    if body.len() < msg.as_slice().len() {
        warn!("vhost-user IOTLB message of {} bytes", body.len());
        return 1;
    }
    let n = msg.as_slice().len();
    msg.as_mut_slice()
        .copy_from_slice(body.get(..n).unwrap_or_default());
    match msg.kind {
        MISS => {
            iotlb.stats.misses.fetch_add(1, Ordering::Relaxed);
            match iotlb.answer_miss(msg.iova, msg.perm) {
                Ok(()) => 0,
                Err(MissError::Send(e)) => {
                    warn!("vhost-user IOTLB: update for {:#x}: {e}", msg.iova);
                    1
                }
                Err(why) => {
                    iotlb.stats.refused.fetch_add(1, Ordering::Relaxed);
                    debug!("vhost-user IOTLB miss at {:#x} refused: {why}", msg.iova);
                    1
                }
            }
        }
        ACCESS_FAIL => {
            warn!("vhost-user back-end: access at IOVA {:#x} failed", msg.iova);
            0
        }
        other => {
            warn!("vhost-user back-end sent IOTLB message type {other}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dma::test_iommu::{TestIommu, RW};
    use crate::memory::create_guest_memory;
    use crate::vhost_user::stop::{Unconfirmed, STOP_TIMEOUT};
    use crate::virtio::VirtioInterrupt;
    use std::io::Write;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    const EP: u32 = 8;

    /// A vIOMMU with one endpoint in domain 1 mapping 0x10000..0x12000 to
    /// 0x200000, and the IOTLB of a back-end whose socket end is returned.
    fn setup() -> (TestIommu, Arc<BackendIotlb>, UnixStream, GuestMemoryMmap) {
        let (iommu, iotlb, theirs, mem, _) = setup_with(
            Box::new(|why: &str| panic!("unexpected end of the VMM: {why}")),
            None,
        );
        (iommu, iotlb, theirs, mem)
    }

    /// [`setup`] with the stop's unconfirmed action, a reply deadline, and
    /// the stop itself.
    fn setup_with(
        unconfirmed: Unconfirmed,
        reply_timeout: Option<Duration>,
    ) -> (
        TestIommu,
        Arc<BackendIotlb>,
        UnixStream,
        GuestMemoryMmap,
        Arc<BackendStop>,
    ) {
        let mem = create_guest_memory(64 << 20, false, true).unwrap();
        let iommu = TestIommu::new(EP);
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut client = Client::from_stream(ours).unwrap();
        client.enable_reply_ack();
        if let Some(t) = reply_timeout {
            client.set_reply_timeout(t);
        }
        let stop = Arc::new(BackendStop::new(unconfirmed));
        let iotlb = Arc::new(BackendIotlb::new(
            Arc::new(Mutex::new(client)),
            stop.clone(),
            mem.clone(),
        ));
        iotlb.set_endpoint(iommu.dev.endpoint_dma(EP).unwrap());
        iommu.dev.add_endpoint_listener(iotlb.clone());
        iommu.attach(1);
        // After the ATTACH: leaving bypass would owe the back-end (not
        // served yet) a full invalidation.
        iommu.dev.add_invalidator(iotlb.clone());
        iommu.map(1, 0x10000, 0x2000, 0x200000, RW);
        (iommu, iotlb, theirs, mem, stop)
    }

    /// The transport's interrupts: when DEVICE_NEEDS_RESET was set.
    #[derive(Default)]
    struct Irq {
        needs_reset_at: Mutex<Option<Instant>>,
    }

    impl VirtioInterrupt for Irq {
        fn notify_queue(&self, _queue: u16) {}
        fn notify_config(&self) {}
        fn set_needs_reset(&self) {
            self.needs_reset_at
                .lock()
                .unwrap()
                .get_or_insert(Instant::now());
        }
    }

    /// Reads one message of any body: (code, flags, body), or why not.
    fn read_any(sock: &mut UnixStream) -> Result<(u32, u32, Vec<u8>), std::io::ErrorKind> {
        let mut hdr = [0u8; 12];
        sock.read_exact(&mut hdr).map_err(|e| e.kind())?;
        let (code, flags, size) = decode_header(&hdr);
        let mut body = vec![0u8; size as usize];
        sock.read_exact(&mut body).map_err(|e| e.kind())?;
        Ok((code, flags, body))
    }

    /// Acknowledges an IOTLB message.
    fn ack(sock: &mut UnixStream) -> std::io::Result<()> {
        let code = u32::from(FrontendReq::IOTLB_MSG);
        sock.write_all(&encode_message(
            code,
            FLAG_VERSION_1 | FLAG_REPLY,
            &0u64.to_le_bytes(),
        ))
    }

    fn read_message(sock: &mut UnixStream) -> (u32, u32, IotlbMsg) {
        let mut hdr = [0u8; 12];
        sock.read_exact(&mut hdr).unwrap();
        let w = |i: usize| u32::from_le_bytes(hdr[i * 4..i * 4 + 4].try_into().unwrap());
        let mut msg = IotlbMsg::default();
        assert_eq!(w(2) as usize, msg.as_slice().len());
        sock.read_exact(msg.as_mut_slice()).unwrap();
        (w(0), w(1), msg)
    }

    #[test]
    fn unmap_completes_only_after_the_back_end_acknowledged() {
        let (iommu, iotlb, mut backend, mem) = setup();
        // A miss inside the mapping: the reach to its end, the host address
        // of the guest page, the mapping's permissions.
        let update = iotlb.translate_miss(0x11000, ACCESS_RO).unwrap();
        let host = mem.get_host_address(GuestAddress(0x201000)).unwrap() as u64;
        assert_eq!(
            (
                update.kind,
                update.iova,
                update.size,
                update.uaddr,
                update.perm
            ),
            (UPDATE, 0x11000, 0x1000, host, ACCESS_RW)
        );
        let acked_at = Arc::new(Mutex::new(None));
        let acked = acked_at.clone();
        let slow_back_end = std::thread::spawn(move || {
            let (code, flags, msg) = read_message(&mut backend);
            assert_eq!(code, u32::from(FrontendReq::IOTLB_MSG));
            assert_eq!(flags & FLAG_NEED_REPLY, FLAG_NEED_REPLY);
            assert_eq!(
                (msg.kind, msg.iova, msg.size),
                (INVALIDATE, 0x10000, 0x2000)
            );
            std::thread::sleep(Duration::from_millis(300));
            *acked.lock().unwrap() = Some(Instant::now());
            let reply = encode_message(code, FLAG_VERSION_1 | FLAG_REPLY, &0u64.to_le_bytes());
            backend.write_all(&reply).unwrap();
            backend
        });
        iommu.unmap(1, 0x10000, 0x2000);
        let completed = Instant::now();
        let acked = acked_at
            .lock()
            .unwrap()
            .expect("the back-end never acknowledged");
        assert!(acked <= completed, "the UNMAP completed before the ack");
        let _backend = slow_back_end.join().unwrap();
        assert_eq!(iotlb.stats.invalidations.load(Ordering::Relaxed), 1);
        // The wait is accounted (the API's iotlb_ack_wait_us).
        assert!(iotlb.stats.ack_wait_us.load(Ordering::Relaxed) >= 290_000);
        // The back-end's next access misses, and the miss is refused.
        assert!(iotlb.translate_miss(0x11000, ACCESS_RO).is_err());
        assert!(iotlb.translate_miss(0x10000, ACCESS_WO).is_err());
    }

    #[test]
    fn a_dead_back_end_stops_the_device_and_does_not_hold_up_unmaps() {
        let (iommu, iotlb, backend, _mem, stop) = setup_with(
            Box::new(|why: &str| panic!("no ring ran, yet: {why}")),
            None,
        );
        let irq = Arc::new(Irq::default());
        stop.started(Vec::new(), irq.clone());
        iommu.map(1, 0x40000, 0x1000, 0x300000, RW);
        drop(backend);
        let t = Instant::now();
        iommu.unmap(1, 0x10000, 0x2000);
        iommu.unmap(1, 0x40000, 0x1000);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(iotlb.stats.ranges.load(Ordering::Relaxed), 2);
        // The first failed send stopped the device; the second found it
        // stopped.
        assert!(stop.is_stopped());
        assert_eq!(iotlb.stats.stops.load(Ordering::Relaxed), 1);
        assert!(irq.needs_reset_at.lock().unwrap().is_some());
        iommu.map(1, 0x50000, 0x1000, 0x310000, RW);
        assert!(matches!(
            iotlb.answer_miss(0x50000, ACCESS_RO),
            Err(MissError::Stopped)
        ));
    }

    /// A back-end that never acknowledges the INVALIDATE. With `answers`
    /// it still answers GET_VRING_BASE (its rings stop); without, it
    /// answers nothing and the VMM must end. Either way the UNMAP returns
    /// only after the device was stopped.
    fn unacked_invalidation(answers: bool) {
        const ACK_TIMEOUT: Duration = Duration::from_millis(300);
        let ended: Arc<Mutex<Option<(Instant, String)>>> = Arc::default();
        let record = ended.clone();
        let (iommu, iotlb, mut backend, _mem, stop) = setup_with(
            Box::new(move |why: &str| {
                *record.lock().unwrap() = Some((Instant::now(), why.to_string()));
            }),
            Some(ACK_TIMEOUT),
        );
        let irq = Arc::new(Irq::default());
        stop.started(vec![0, 1], irq.clone());
        backend
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let silent_back_end = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut stopped_at = Vec::new();
            let why = loop {
                match read_any(&mut backend) {
                    Ok((code, _, body)) => {
                        seen.push(code);
                        if answers && code == u32::from(FrontendReq::GET_VRING_BASE) {
                            let reply = encode_message(code, FLAG_VERSION_1 | FLAG_REPLY, &body);
                            stopped_at.push(Instant::now());
                            backend.write_all(&reply).unwrap();
                        }
                    }
                    Err(kind) => break kind,
                }
            };
            (seen, stopped_at, why)
        });
        let started = Instant::now();
        iommu.unmap(1, 0x10000, 0x2000);
        let completed = Instant::now();
        let took = completed - started;
        // It waited for the acknowledgement, then for the stop; no longer.
        assert!(took >= ACK_TIMEOUT, "{took:?}");
        assert!(
            took < ACK_TIMEOUT + STOP_TIMEOUT + Duration::from_secs(2),
            "{took:?}"
        );
        let needs_reset = irq.needs_reset_at.lock().unwrap().expect("NEEDS_RESET");
        assert!(needs_reset <= completed);
        let (seen, stopped_at, why) = silent_back_end.join().unwrap();
        // The connection was shut down while the IOTLB still holds it: the
        // back-end read end-of-file, not its time-out.
        assert_eq!(why, std::io::ErrorKind::UnexpectedEof);
        let vring_base = u32::from(FrontendReq::GET_VRING_BASE);
        assert_eq!(
            seen,
            [u32::from(FrontendReq::IOTLB_MSG), vring_base, vring_base]
        );
        iommu.map(1, 0x40000, 0x1000, 0x300000, RW);
        assert!(matches!(
            iotlb.answer_miss(0x40000, ACCESS_RO),
            Err(MissError::Stopped)
        ));
        if answers {
            assert_eq!(stopped_at.len(), 2);
            assert!(stopped_at.iter().all(|t| *t <= completed));
            assert!(ended.lock().unwrap().is_none(), "the rings were stopped");
        } else {
            let (at, why) = ended.lock().unwrap().clone().expect("the VMM must end");
            assert!(at <= completed, "the UNMAP completed before the VMM ended");
            assert!(why.contains("could not be stopped"), "{why}");
        }
    }

    #[test]
    fn unmap_waits_for_unacked_vhost_user_invalidation_then_stops_the_device() {
        unacked_invalidation(true);
        unacked_invalidation(false);
    }

    #[test]
    fn a_back_end_that_needs_its_miss_served_before_acking_does_not_deadlock() {
        let (iommu, iotlb, mut backend, _mem) = setup();
        iommu.map(1, 0x40000, 0x1000, 0x300000, RW);
        let (ours, mut channel) = UnixStream::pair().unwrap();
        let served = iotlb.clone();
        let channel_thread = std::thread::spawn(move || serve_backend_channel(ours, served));
        // On the INVALIDATE it first misses on another IOVA and waits for
        // the answer (as a single-threaded back-end may), then acks.
        let back_end = std::thread::spawn(move || {
            let (_, _, inv) = read_message(&mut backend);
            assert_eq!(inv.kind, INVALIDATE);
            let miss = IotlbMsg::new(MISS, 0x40000, 0, 0, ACCESS_RO);
            let code = u32::from(BackendReq::IOTLB_MSG);
            channel
                .write_all(&encode_message(
                    code,
                    FLAG_VERSION_1 | FLAG_NEED_REPLY,
                    miss.as_slice(),
                ))
                .unwrap();
            let (reply_code, flags, status) = read_any(&mut channel).unwrap();
            assert_eq!((reply_code, flags & FLAG_REPLY), (code, FLAG_REPLY));
            assert_eq!(status, 0u64.to_le_bytes());
            let (_, _, update) = read_message(&mut backend);
            assert_eq!((update.kind, update.iova), (UPDATE, 0x40000));
            ack(&mut backend).unwrap();
            (backend, channel)
        });
        let t = Instant::now();
        iommu.unmap(1, 0x10000, 0x2000);
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(iotlb.stats.stops.load(Ordering::Relaxed), 0);
        let (_backend, channel) = back_end.join().unwrap();
        drop(channel);
        channel_thread.join().unwrap();
    }

    /// Iterations of map, race, unmap in the race test.
    const RACE_ROUNDS: u64 = 3000;

    /// Runs the race and returns (UPDATEs seen, stale ones, UPDATEs the
    /// generation check dropped).
    fn race_misses_against_unmaps() -> (u64, u64, u64) {
        const IOVA: u64 = 0x10000;
        const GPA: u64 = 0x100_0000;
        let (iommu, iotlb, mut backend, mem) = setup();
        let host0 = mem.get_host_address(GuestAddress(GPA)).unwrap() as u64;
        // The back-end: acknowledges INVALIDATEs and counts those of the
        // IOVA; an UPDATE translating to a mapping an earlier INVALIDATE
        // ended is stale.
        let back_end = std::thread::spawn(move || {
            let (mut invalidated, mut updates, mut stale) = (0u64, 0u64, 0u64);
            while let Ok((_, flags, body)) = read_any(&mut backend) {
                let mut m = IotlbMsg::default();
                m.as_mut_slice().copy_from_slice(&body);
                match m.kind {
                    INVALIDATE => {
                        if m.iova <= IOVA && IOVA - m.iova < m.size {
                            invalidated += 1;
                        }
                        if flags & FLAG_NEED_REPLY != 0 && ack(&mut backend).is_err() {
                            break;
                        }
                    }
                    UPDATE => {
                        updates += 1;
                        // Mapping e (to GPA + e pages) is ended by the
                        // INVALIDATE after the setup's: number e + 2.
                        if (m.uaddr - host0) / 0x1000 + 1 < invalidated {
                            stale += 1;
                        }
                    }
                    _ => {}
                }
            }
            (updates, stale)
        });
        // The setup's mapping goes first (INVALIDATE number 1).
        iommu.unmap(1, 0x10000, 0x2000);
        let done = Arc::new(AtomicBool::new(false));
        let missers: Vec<_> = [0u64, 20]
            .into_iter()
            .map(|pause_us| {
                let (iotlb, done) = (iotlb.clone(), done.clone());
                std::thread::spawn(move || {
                    let pause = || {
                        if pause_us > 0 {
                            std::thread::sleep(Duration::from_micros(pause_us));
                        }
                    };
                    let mut answered = 0u64;
                    while !done.load(Ordering::Relaxed) {
                        if iotlb.answer_miss_with(IOVA, ACCESS_RO, pause).is_ok() {
                            answered += 1;
                        }
                    }
                    answered
                })
            })
            .collect();
        for e in 0..RACE_ROUNDS {
            iommu.map(1, IOVA, 0x1000, GPA + e * 0x1000, RW);
            std::thread::yield_now();
            iommu.unmap(1, IOVA, 0x1000);
        }
        done.store(true, Ordering::Relaxed);
        let answered: u64 = missers.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(iotlb.stats.stops.load(Ordering::Relaxed), 0);
        let dropped = iotlb.stats.stale.load(Ordering::Relaxed);
        drop(iommu);
        drop(iotlb);
        let (updates, stale) = back_end.join().unwrap();
        assert_eq!(updates, answered, "every UPDATE sent reached the back-end");
        (updates, stale, dropped)
    }

    #[test]
    fn iotlb_miss_racing_unmap_never_installs_a_stale_translation() {
        let (updates, stale, dropped) = race_misses_against_unmaps();
        eprintln!(
            "{RACE_ROUNDS} unmaps raced by misses: {updates} UPDATEs, {stale} stale, \
             {dropped} dropped by the check (mutation {} active: {})",
            Mutation::NoIotlbSerialisation.name(),
            mutation::active(Mutation::NoIotlbSerialisation)
        );
        assert!(updates > 0, "the misses never hit a mapping");
        if mutation::active(Mutation::NoIotlbSerialisation) {
            assert!(stale > 0, "the race test cannot see the race");
        } else {
            assert_eq!(stale, 0);
        }
    }

    #[test]
    fn a_miss_outside_any_mapping_or_beyond_its_permission_is_refused() {
        let (iommu, iotlb, _backend, _mem) = setup();
        iommu.map(1, 0x40000, 0x1000, 0x300000, 1); // read-only
        assert!(iotlb.translate_miss(0x20000, ACCESS_RO).is_err());
        assert!(iotlb.translate_miss(0x40000, ACCESS_WO).is_err());
        assert!(iotlb.translate_miss(0x40000, ACCESS_RW).is_err());
        let ro = iotlb.translate_miss(0x40800, ACCESS_RO).unwrap();
        assert_eq!((ro.size, ro.perm), (0x800, ACCESS_RO));
    }

    #[test]
    fn a_write_only_receive_buffer_is_granted_what_the_back_end_asked() {
        let (iommu, iotlb, _backend, _mem) = setup();
        iommu.map(1, 0x50000, 0x1000, 0x310000, 2); // write-only
        assert_eq!(
            iotlb.translate_miss(0x50000, ACCESS_WO).unwrap().perm,
            ACCESS_WO
        );
        assert_eq!(
            iotlb.translate_miss(0x50000, ACCESS_RW).unwrap().perm,
            ACCESS_RW
        );
        // Read alone is not what the guest allowed.
        assert!(iotlb.translate_miss(0x50000, ACCESS_RO).is_err());
    }

    #[test]
    fn iotlb_msg_has_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<IotlbMsg>(), 32);
        let m = IotlbMsg::new(UPDATE, 1, 2, 3, ACCESS_RW);
        let b = m.as_slice();
        assert_eq!(b[24], ACCESS_RW);
        assert_eq!(b[25], UPDATE);
    }

    #[test]
    fn permissions_round_trip() {
        for p in [ACCESS_RO, ACCESS_WO, ACCESS_RW] {
            assert_eq!(perm_bits(access_of(p)), p);
        }
    }
}
