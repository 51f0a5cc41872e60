//! Long reads and writes move a bounded chunk per quiescence section:
//! each chunk is used up before its section ends, an UNMAP between two
//! chunks does not wait for the request, and the chunk after it is
//! translated anew.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::Duration;

use virtio_bindings::virtio_blk::VIRTIO_BLK_T_OUT;
use virtio_bindings::virtio_blk::{VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_T_IN};
use virtio_iommu::quiesce::Quiescer;
use virtio_queue::QueueT;
use vm_memory::{Bytes, GuestAddress};

use super::Section;
use crate::block::image::DiskImage;
use crate::block::limits::Limits;
use crate::block::request::{serve, Request, RequestIo};
use crate::block::test_util::{pattern, temp_image, Ring};
use crate::dma::test_iommu::{TestIommu, RW};
use crate::dma::{DmaSpace, ThreadDma};
use crate::virtio::chain::{walk, VIRTQ_DESC_F_NEXT, VIRTQ_DESC_F_WRITE};
use crate::width::{const_u8, usize_from_u64};

const HDR: u64 = 0x8000;
const STATUS: u64 = 0x9000;
const DATA: u64 = 0x10000;
const CHUNK: u64 = 4096;
const LEN: u64 = 4 * CHUNK;
/// [`LEN`] as a buffer length.
const LEN_BYTES: usize = usize_from_u64(LEN);
/// The status bytes as the device writes them.
const OK: u8 = const_u8(VIRTIO_BLK_S_OK as i128);
const IOERR: u8 = const_u8(VIRTIO_BLK_S_IOERR as i128);

fn limits() -> Limits {
    Limits {
        seg_max: 8,
        size_max: 64 * 1024,
        section_bytes: CHUNK,
    }
}

/// Serves the request at head 0 of `ring` in a section of a thread
/// handle over `mem` (with a reader slot of its own when `mem` is behind
/// a quiescer) with `between` run between sections; (status, renewals).
fn serve_with(
    ring: &Ring,
    mem: &DmaSpace,
    disk: &DiskImage,
    between: Box<dyn FnMut() + '_>,
) -> (u8, u64) {
    let q = ring.queue();
    let mut dma = ThreadDma::new(mem.clone()).expect("reader");
    let chain = walk(&*dma.access(), q.desc_table(), q.size(), 0).expect("chain");
    let mut section = Section::enter(&mut dma);
    section.set_between(between);
    let mut iov = Vec::new();
    let mut io = RequestIo {
        limits: limits(),
        iov: &mut iov,
        section: &mut section,
    };
    let (mut req, mut failure) = (Request::default(), None);
    let served = serve(disk, &chain, &mut req, &mut io, &mut failure).expect("answered");
    let renewals = section.renewals();
    (served.status, renewals)
}

/// A 16 KiB read over three unaligned segments moves exactly 4 KiB per
/// section, each chunk complete in guest memory before its section ends.
#[test]
fn blk_long_io_is_split_into_bounded_sections() {
    let (path, _) = temp_image(64 * 1024);
    let disk = DiskImage::open(&path, false, None).unwrap();
    let mut ring = Ring::new();
    ring.header(HDR, VIRTIO_BLK_T_IN, 8);
    // Segments of 3000, 5000 and 8384 bytes, contiguous at DATA.
    let segs = [(DATA, 3000u32), (DATA + 3000, 5000), (DATA + 8000, 8384)];
    ring.desc(0, HDR, 16, VIRTQ_DESC_F_NEXT, 1);
    for (i, (addr, len)) in (1u16..).zip(segs.iter()) {
        ring.desc(
            i,
            *addr,
            *len,
            VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT,
            i + 1,
        );
    }
    ring.desc(4, STATUS, 1, VIRTQ_DESC_F_WRITE, 0);
    ring.offer(0);
    ring.mem
        .write_slice(&[0xc5; LEN_BYTES], GuestAddress(DATA))
        .unwrap();
    let want: Vec<u8> = (8 * 512..8 * 512 + LEN_BYTES).map(pattern).collect();
    // How much of the data had landed each time a section ended.
    let landed = Rc::new(RefCell::new(Vec::new()));
    let seen = landed.clone();
    let mem = ring.mem;
    let probe = Box::new(move || {
        let mut got = vec![0u8; LEN_BYTES];
        mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
        let n = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        seen.borrow_mut().push(n);
    });
    let dma = ring.dma.clone();
    let (status, renewals) = serve_with(&ring, &dma, &disk, probe);
    assert_eq!(status, OK);
    assert_eq!(renewals, LEN / CHUNK - 1);
    // The pattern may repeat a byte of the canary, so "landed" may run a
    // little past a chunk's end, never short of it nor a chunk beyond.
    let landed = landed.borrow();
    assert_eq!(landed.len(), 3);
    for (i, n) in landed.iter().enumerate() {
        let end = (i as u64 + 1) * CHUNK;
        assert!(
            (end..end + CHUNK).contains(&(*n as u64)),
            "chunk {i}: {n} bytes landed"
        );
    }
    let mut got = vec![0u8; LEN_BYTES];
    ring.mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    assert_eq!(
        got,
        (8 * 512..8 * 512 + LEN_BYTES)
            .map(pattern)
            .collect::<Vec<_>>()
    );
    // A write splits the same way.
    ring.header(HDR, VIRTIO_BLK_T_OUT, 0);
    for (i, (addr, len)) in (1u16..).zip(segs.iter()) {
        ring.desc(i, *addr, *len, VIRTQ_DESC_F_NEXT, i + 1);
    }
    ring.offer(0);
    let (status, renewals) = serve_with(&ring, &dma, &disk, Box::new(|| {}));
    assert_eq!((status, renewals), (OK, 3));
    let img = std::fs::read(&path).unwrap();
    assert_eq!(&img[..LEN_BYTES], &got[..]);
    let _ = std::fs::remove_file(path);
}

/// Behind a quiescing vIOMMU: the guest unmaps the third chunk's page
/// while the request is between two chunks. The UNMAP completes at once
/// (the worker is outside its section; inside, it would wait for itself
/// and never return), the chunk after it fails translation, so the
/// request is answered IOERR and the unmapped page is never written.
#[test]
fn an_unmap_between_chunks_waits_for_no_chunk_and_stops_the_request() {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let (path, _) = temp_image(64 * 1024);
        let disk = DiskImage::open(&path, false, None).unwrap();
        let mut ring = Ring::new();
        let iommu = TestIommu::new(0x30);
        let q = Quiescer::new();
        iommu.dev.add_invalidator(q.clone());
        iommu.attach(1);
        iommu.map(1, 0, 0x10000, 0, RW);
        // The data at IOVA 0x100000, one mapping per 4 KiB page.
        for p in 0..LEN / CHUNK {
            iommu.map(1, 0x100000 + p * CHUNK, CHUNK, DATA + p * CHUNK, RW);
        }
        let dma = iommu.space(ring.mem).with_quiescer(q.clone());
        ring.header(HDR, VIRTIO_BLK_T_IN, 0);
        ring.desc(0, HDR, 16, VIRTQ_DESC_F_NEXT, 1);
        ring.desc(
            1,
            0x100000,
            u32::try_from(LEN).unwrap(),
            VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT,
            2,
        );
        ring.desc(2, STATUS, 1, VIRTQ_DESC_F_WRITE, 0);
        ring.offer(0);
        ring.mem
            .write_slice(&[0xc5; LEN_BYTES], GuestAddress(DATA))
            .unwrap();
        let mut calls = 0;
        let unmapper = iommu.clone();
        let between = Box::new(move || {
            calls += 1;
            if calls == 2 {
                unmapper.unmap(1, 0x100000 + 2 * CHUNK, CHUNK);
            }
        });
        let (status, _) = serve_with(&ring, &dma, &disk, between);
        let mut page = vec![0u8; usize_from_u64(CHUNK)];
        ring.mem
            .read_slice(&mut page, GuestAddress(DATA + 2 * CHUNK))
            .unwrap();
        let first = ring.mem.read_obj::<u8>(GuestAddress(DATA + 1)).unwrap();
        let _ = std::fs::remove_file(path);
        let _ = tx.send((
            status,
            page.iter().all(|b| *b == 0xc5),
            first,
            q.stats().waits,
        ));
    });
    let (status, untouched, first, waits) = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the UNMAP waited for the request's section: chunks do not leave it");
    assert_eq!(status, IOERR);
    assert!(untouched, "the unmapped page was written");
    assert_eq!(first, pattern(1), "the chunks before the UNMAP landed");
    assert!(waits >= 1, "the UNMAP went through the quiescer");
}
