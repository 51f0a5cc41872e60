//! Requests served through a queue the test drives as the guest's driver.

use std::sync::atomic::Ordering;

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_DISCARD,
    VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
    VIRTIO_BLK_T_WRITE_ZEROES,
};
use vm_memory::{Bytes, GuestAddress};

use crate::block::image::DiskImage;
use crate::block::limits::Limits;
use crate::block::test_util::{pattern, temp_image, Recorder, Ring, SIZE};
use crate::block::worker::QueueServer;
use crate::dma::ThreadDma;
use crate::virtio::chain::{VIRTQ_DESC_F_INDIRECT, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE};
use crate::virtio::test_ring::put_desc;
use crate::width::const_u8;

const OK: u8 = const_u8(VIRTIO_BLK_S_OK as i128);
const IOERR: u8 = const_u8(VIRTIO_BLK_S_IOERR as i128);
const UNSUPP: u8 = const_u8(VIRTIO_BLK_S_UNSUPP as i128);
const W: u16 = VIRTQ_DESC_F_WRITE;
const N: u16 = VIRTQ_DESC_F_NEXT;

const HDR: u64 = 0x8000;
const DATA: u64 = 0x10000;
const STATUS: u64 = 0x9000;
/// 64 sectors.
const DISK_LEN: usize = 32 * 1024;

struct Fixture {
    ring: Ring,
    disk: DiskImage,
    server: QueueServer,
    irq: Recorder,
    path: std::path::PathBuf,
}

impl Fixture {
    fn new(readonly: bool) -> Self {
        let (path, _) = temp_image(DISK_LEN);
        let disk = DiskImage::open(&path, readonly, Some("blk-test-id")).expect("image");
        let ring = Ring::new();
        let server = QueueServer::new(0, ring.queue(), Limits::for_queue_size(SIZE));
        Self {
            ring,
            disk,
            server,
            irq: Recorder::default(),
            path,
        }
    }

    /// The usual three-descriptor request at head 0: header, data
    /// (`data_flags`, `len` bytes at DATA), status.
    fn request(&mut self, type_: u32, sector: u64, len: u32, data_flags: u16) {
        self.ring.header(HDR, type_, sector);
        self.ring
            .mem
            .write_obj(0xffu8, GuestAddress(STATUS))
            .unwrap();
        if len == 0 {
            self.ring.desc(0, HDR, 16, N, 2);
        } else {
            self.ring.desc(0, HDR, 16, N, 1);
            self.ring.desc(1, DATA, len, data_flags | N, 2);
        }
        self.ring.desc(2, STATUS, 1, W, 0);
        self.ring.offer(0);
    }

    fn run(&mut self) {
        let mut dma = ThreadDma::new(self.ring.dma.clone()).unwrap();
        self.server.process(&mut dma, &self.disk, &self.irq);
    }

    /// Runs the queue; returns (status byte, used length) of the only new
    /// used entry.
    fn serve(&mut self) -> (u8, u32) {
        let before = self.ring.used_idx();
        self.run();
        assert_eq!(
            self.ring.used_idx(),
            before.wrapping_add(1),
            "one completion"
        );
        assert!(!self.server.broken());
        let (head, len) = self.ring.used(u64::from(before));
        assert_eq!(head, 0);
        (self.ring.byte(STATUS), len)
    }

    fn disk_bytes(&self) -> Vec<u8> {
        std::fs::read(&self.path).unwrap()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[test]
fn read_fills_the_buffer_and_counts_it() {
    let mut f = Fixture::new(false);
    f.request(VIRTIO_BLK_T_IN, 3, 1024, W);
    assert_eq!(f.serve(), (OK, 1025));
    let mut got = vec![0u8; 1024];
    f.ring.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    let want: Vec<u8> = (3 * 512..5 * 512).map(pattern).collect();
    assert_eq!(got, want);
    assert_eq!(*f.irq.notified.lock().unwrap(), vec![0]);
}

#[test]
fn write_lands_in_the_image_and_flush_succeeds() {
    let mut f = Fixture::new(false);
    f.ring
        .mem
        .write_slice(&[0x5a; 1536], GuestAddress(DATA))
        .unwrap();
    f.request(VIRTIO_BLK_T_OUT, 10, 1536, 0);
    assert_eq!(f.serve(), (OK, 1));
    let img = f.disk_bytes();
    assert!(img[10 * 512..13 * 512].iter().all(|b| *b == 0x5a));
    assert_eq!(img[13 * 512], pattern(13 * 512), "nothing past the range");
    assert_eq!(img[10 * 512 - 1], pattern(10 * 512 - 1));
    f.request(VIRTIO_BLK_T_FLUSH, 0, 0, 0);
    assert_eq!(f.serve(), (OK, 1));
}

#[test]
fn get_id_answers_twenty_bytes() {
    let mut f = Fixture::new(false);
    f.ring
        .mem
        .write_slice(&[0xee; 32], GuestAddress(DATA))
        .unwrap();
    f.request(VIRTIO_BLK_T_GET_ID, 0, 20, W);
    assert_eq!(f.serve(), (OK, 21));
    let mut got = [0u8; 21];
    f.ring.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    assert_eq!(&got[..11], b"blk-test-id");
    assert!(got[11..20].iter().all(|b| *b == 0));
    assert_eq!(got[20], 0xee, "nothing written past 20 bytes");
}

#[test]
fn out_of_range_and_overflowing_requests_fail() {
    let mut f = Fixture::new(false);
    let before = f.disk_bytes();
    // Last sector: fine; one more: refused.
    f.request(VIRTIO_BLK_T_IN, 63, 512, W);
    assert_eq!(f.serve(), (OK, 513));
    for (t, sector, flags) in [
        (VIRTIO_BLK_T_IN, 63, W),
        (VIRTIO_BLK_T_OUT, 63, 0),
        (VIRTIO_BLK_T_IN, 64, W),
        (VIRTIO_BLK_T_OUT, u64::MAX, 0),
        (VIRTIO_BLK_T_IN, u64::MAX / 512, W),
        (VIRTIO_BLK_T_OUT, u64::MAX / 512 + 1, 0),
    ] {
        f.request(t, sector, 1024, flags);
        assert_eq!(f.serve(), (IOERR, 1), "type {t} sector {sector}");
    }
    // Not a whole number of sectors.
    f.request(VIRTIO_BLK_T_OUT, 0, 700, 0);
    assert_eq!(f.serve(), (IOERR, 1));
    assert_eq!(f.disk_bytes(), before, "nothing written");
}

#[test]
fn read_only_disk_refuses_writes() {
    let mut f = Fixture::new(true);
    let before = f.disk_bytes();
    f.request(VIRTIO_BLK_T_OUT, 0, 512, 0);
    assert_eq!(f.serve(), (IOERR, 1));
    f.request(VIRTIO_BLK_T_WRITE_ZEROES, 0, 16, 0);
    assert_eq!(f.serve(), (IOERR, 1));
    f.request(VIRTIO_BLK_T_IN, 0, 512, W);
    assert_eq!(f.serve(), (OK, 513));
    f.request(VIRTIO_BLK_T_FLUSH, 0, 0, 0);
    assert_eq!(f.serve(), (OK, 1));
    assert_eq!(f.disk_bytes(), before);
}

#[test]
fn unknown_types_are_unsupported_and_short_headers_fail() {
    let mut f = Fixture::new(false);
    f.request(0x7777, 0, 0, 0);
    assert_eq!(f.serve(), (UNSUPP, 1));
    // An 8-byte header.
    f.ring.desc(0, HDR, 8, N, 2);
    f.ring.desc(2, STATUS, 1, W, 0);
    f.ring.offer(0);
    assert_eq!(f.serve(), (IOERR, 1));
}

#[test]
fn a_request_without_a_writable_status_stops_the_queue() {
    let mut f = Fixture::new(false);
    // Status descriptor not device-writable.
    f.ring.header(HDR, VIRTIO_BLK_T_IN, 0);
    f.ring.desc(0, HDR, 16, N, 2);
    f.ring.desc(2, STATUS, 1, 0, 0);
    f.ring.offer(0);
    f.run();
    assert!(f.server.broken());
    assert_eq!(f.ring.used_idx(), 0);
    assert_eq!(f.irq.needs_reset.load(Ordering::Relaxed), 1);
    // A broken queue is left alone until the device is reset.
    f.request(VIRTIO_BLK_T_FLUSH, 0, 0, 0);
    f.run();
    assert_eq!(f.ring.used_idx(), 0);
}

#[test]
fn a_status_outside_ram_stops_the_queue() {
    let mut f = Fixture::new(false);
    f.ring.header(HDR, VIRTIO_BLK_T_FLUSH, 0);
    f.ring.desc(0, HDR, 16, N, 2);
    f.ring.desc(2, 0xffff_0000, 1, W, 0);
    f.ring.offer(0);
    f.run();
    assert!(f.server.broken());
    assert_eq!(f.ring.used_idx(), 0);
}

/// Any layout: header split over two descriptors, header and data in one
/// buffer, data and status in one buffer, through an indirect table.
#[test]
fn any_layout_is_accepted() {
    let mut f = Fixture::new(false);
    // Header split 5 + 11, write of one sector from the same buffer.
    f.ring.header(HDR, VIRTIO_BLK_T_OUT, 2);
    f.ring
        .mem
        .write_slice(&[0x11; 512], GuestAddress(HDR + 16))
        .unwrap();
    f.ring.desc(0, HDR, 5, N, 1);
    f.ring.desc(1, HDR + 5, 11 + 512, N, 2);
    f.ring.desc(2, STATUS, 1, W, 0);
    f.ring.offer(0);
    assert_eq!(f.serve(), (OK, 1));
    assert!(f.disk_bytes()[1024..1536].iter().all(|b| *b == 0x11));
    // Read with data and status in one writable buffer, via an indirect
    // table at 0xa000.
    let table = 0xa000u64;
    let put = |i, addr, len, flags, next| put_desc(f.ring.mem, table, i, addr, len, flags, next);
    put(0, HDR, 16, N, 1);
    put(1, DATA, 513, W, 0);
    f.ring.header(HDR, VIRTIO_BLK_T_IN, 2);
    f.ring.desc(0, table, 32, VIRTQ_DESC_F_INDIRECT, 0);
    f.ring.offer(0);
    f.run();
    assert_eq!(f.ring.used(1), (0, 513));
    assert_eq!(f.ring.byte(DATA + 512), OK);
    assert_eq!(f.ring.byte(DATA), 0x11);
}

#[test]
fn discard_and_write_zeroes() {
    let mut f = Fixture::new(false);
    if !f.disk.punch_hole() {
        // The test directory's file system cannot punch holes: the device
        // does not offer the features and answers UNSUPP.
        f.request(VIRTIO_BLK_T_DISCARD, 0, 16, 0);
        assert_eq!(f.serve(), (UNSUPP, 1));
        return;
    }
    let seg = |sector: u64, n: u32, flags: u32| {
        let mut s = [0u8; 16];
        s[..8].copy_from_slice(&sector.to_le_bytes());
        s[8..12].copy_from_slice(&n.to_le_bytes());
        s[12..].copy_from_slice(&flags.to_le_bytes());
        s
    };
    for (t, s, want) in [
        (VIRTIO_BLK_T_WRITE_ZEROES, seg(4, 2, 1), OK),
        (VIRTIO_BLK_T_DISCARD, seg(8, 8, 0), OK),
        (VIRTIO_BLK_T_DISCARD, seg(8, 8, 1), UNSUPP),
        (VIRTIO_BLK_T_WRITE_ZEROES, seg(0, 2, 4), UNSUPP),
        (VIRTIO_BLK_T_DISCARD, seg(60, 8, 0), IOERR),
        (VIRTIO_BLK_T_DISCARD, seg(u64::MAX, 1, 0), IOERR),
    ] {
        f.ring.mem.write_slice(&s, GuestAddress(DATA)).unwrap();
        f.request(t, 0, 16, 0);
        assert_eq!(f.serve(), (want, 1), "type {t} {s:?}");
    }
    // Two segments when one is allowed; a partial segment.
    f.request(VIRTIO_BLK_T_DISCARD, 0, 32, 0);
    assert_eq!(f.serve(), (IOERR, 1));
    f.request(VIRTIO_BLK_T_DISCARD, 0, 12, 0);
    assert_eq!(f.serve(), (IOERR, 1));
    let img = f.disk_bytes();
    assert_eq!(img.len(), DISK_LEN, "the image keeps its size");
    assert!(img[4 * 512..6 * 512].iter().all(|b| *b == 0));
    assert!(img[8 * 512..16 * 512].iter().all(|b| *b == 0));
    assert_eq!(img[6 * 512], pattern(6 * 512));
    assert_eq!(img[16 * 512], pattern(16 * 512));
}

/// Behind the vIOMMU: a data buffer the guest did not map is refused (the
/// request fails, nothing lands in the page, a fault is counted) and the
/// queue goes on; a mapped one goes through translation.
#[test]
fn behind_the_iommu_only_mapped_buffers_are_used() {
    use crate::dma::test_iommu::{TestIommu, RW};

    let mut f = Fixture::new(false);
    let iommu = TestIommu::new(0x20);
    iommu.attach(1);
    // Rings, header and status at IOVA = GPA; IOVA 0x100000 -> GPA DATA.
    iommu.map(1, 0, 0x10000, 0, RW);
    iommu.map(1, 0x100000, 0x1000, DATA, RW);
    f.ring.dma = iommu.space(f.ring.mem);
    f.ring.header(HDR, VIRTIO_BLK_T_IN, 1);
    f.ring.desc(0, HDR, 16, N, 1);
    f.ring.desc(1, 0x100000, 512, W | N, 2);
    f.ring.desc(2, STATUS, 1, W, 0);
    f.ring.offer(0);
    assert_eq!(f.serve(), (OK, 513));
    assert_eq!(f.ring.byte(DATA), pattern(512));
    // IOVA DATA itself is not mapped.
    f.ring
        .mem
        .write_slice(&[0xc5; 512], GuestAddress(DATA + 0x1000))
        .unwrap();
    f.ring.desc(1, DATA + 0x1000, 512, W | N, 2);
    f.ring.offer(0);
    assert_eq!(f.serve(), (IOERR, 1));
    assert_eq!(f.ring.byte(DATA + 0x1000), 0xc5);
    assert_eq!(f.ring.dma.fault_count(), 1);
    assert!(iommu.dev.pop_fault_event().is_some());
}

/// A fixture whose disk advertises `seg_max` and `size_max` as given.
fn with_limits(seg_max: u32, size_max: u32) -> Fixture {
    let mut f = Fixture::new(false);
    let limits = Limits {
        seg_max,
        size_max,
        section_bytes: 4096,
    };
    f.server = QueueServer::new(0, f.ring.queue(), limits);
    f
}

/// Issue 27 (6): a request beyond the advertised `size_max` or `seg_max`
/// is answered IOERR and none of its data moves (neither into the guest's
/// buffers nor into the image); within them it is served.
#[test]
fn blk_request_over_size_max_is_refused() {
    let mut f = with_limits(2, 1024);
    let before = f.disk_bytes();
    let canary = [0xc5u8; 2048];
    f.ring.mem.write_slice(&canary, GuestAddress(DATA)).unwrap();
    // One segment of 1536 bytes > size_max: read and write refused.
    f.request(VIRTIO_BLK_T_IN, 0, 1536, W);
    assert_eq!(f.serve(), (IOERR, 1));
    let mut got = [0u8; 2048];
    f.ring.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    assert_eq!(got, canary, "a refused read wrote guest memory");
    f.request(VIRTIO_BLK_T_OUT, 0, 1536, 0);
    assert_eq!(f.serve(), (IOERR, 1));
    assert_eq!(f.disk_bytes(), before, "a refused write reached the image");
    // At size_max: served.
    f.request(VIRTIO_BLK_T_IN, 0, 1024, W);
    assert_eq!(f.serve(), (OK, 1025));
    assert_eq!(f.ring.byte(DATA + 1023), pattern(1023));
}

/// Three data segments where two are advertised: refused, untouched; two:
/// served.
#[test]
fn blk_request_over_seg_max_is_refused() {
    let mut f = with_limits(2, 1024);
    let before = f.disk_bytes();
    let three = |f: &mut Fixture, type_: u32, flags: u16| {
        f.ring.header(HDR, type_, 0);
        f.ring.desc(0, HDR, 16, N, 1);
        f.ring.desc(1, DATA, 512, flags | N, 3);
        f.ring.desc(3, DATA + 0x1000, 512, flags | N, 4);
        f.ring.desc(4, DATA + 0x2000, 512, flags | N, 2);
        f.ring.desc(2, STATUS, 1, W, 0);
        f.ring.offer(0);
    };
    f.ring
        .mem
        .write_slice(&[0xc5; 512], GuestAddress(DATA + 0x2000))
        .unwrap();
    three(&mut f, VIRTIO_BLK_T_IN, W);
    assert_eq!(f.serve(), (IOERR, 1));
    assert_eq!(f.ring.byte(DATA + 0x2000), 0xc5, "a refused read wrote");
    three(&mut f, VIRTIO_BLK_T_OUT, 0);
    assert_eq!(f.serve(), (IOERR, 1));
    assert_eq!(f.disk_bytes(), before, "a refused write reached the image");
    // Empty descriptors are not segments.
    f.ring.header(HDR, VIRTIO_BLK_T_IN, 0);
    f.ring.desc(1, DATA, 512, W | N, 3);
    f.ring.desc(3, DATA + 0x1000, 0, W | N, 4);
    f.ring.desc(4, DATA + 0x2000, 512, W | N, 2);
    f.ring.offer(0);
    assert_eq!(f.serve(), (OK, 1025));
    assert_eq!(f.ring.byte(DATA + 0x2000), pattern(512));
}

/// The limits of a real disk: what the configuration space says is what
/// the queue enforces (seg_max of a 16-entry ring is 14: 15 segments
/// through an indirect table are refused).
#[test]
fn advertised_seg_max_is_enforced() {
    let mut f = Fixture::new(false);
    let l = Limits::for_queue_size(SIZE);
    assert_eq!((l.seg_max, l.size_max), (14, 256 * 1024));
    let table = 0xa000u64;
    for (segments, want) in [(14u16, (OK, 14 * 512 + 1)), (15, (IOERR, 1))] {
        let put =
            |i, addr, len, flags, next| put_desc(f.ring.mem, table, i, addr, len, flags, next);
        f.ring.header(HDR, VIRTIO_BLK_T_IN, 0);
        put(0, HDR, 16, N, 1);
        for s in 0..segments {
            put(s + 1, DATA + 512 * u64::from(s), 512, W | N, s + 2);
        }
        put(segments + 1, STATUS, 1, W, 0);
        let len = 16 * u32::from(segments + 2);
        f.ring.desc(0, table, len, VIRTQ_DESC_F_INDIRECT, 0);
        f.ring.offer(0);
        assert_eq!(f.serve(), want, "{segments} segments");
    }
}
