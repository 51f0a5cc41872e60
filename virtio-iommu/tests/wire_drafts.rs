//! Byte-level checks of the page-table wire formats against the
//! virtio-iommu drafts (docs/wire-formats.md): every request image here is
//! written by hand from the drafts' offsets, not with `wire::Request`, so a
//! parser that drifts from the drafts fails these tests even when its own
//! encoder drifts with it.

use std::sync::Arc;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use virtio_iommu::device::{IommuConfig, IommuDevice};
use virtio_iommu::mapping::{Perm, QueueContext};
use virtio_iommu::wire::{parse_request, Request, Status};

const EP: u32 = 8;
const OTHER_EP: u32 = 9;
const RAM: usize = 4 << 20;
const ROOT: u64 = 0x10_0000;
const L2: u64 = 0x10_1000;
const L1: u64 = 0x10_2000;
const L0: u64 = 0x10_3000;
const DATA: u64 = 0x20_0000;
/// The project's format code in PAGE_TABLE_FMT and ATTACH_TABLE.
const FMT: u16 = 0xff01;
/// Feature bit of page-table mode (project, device-specific range).
const F_PAGE_TABLE: u32 = 22;

/// Drafts: ATTACH_TABLE is 84 bytes, the last 4 the device-written tail.
const AT_READABLE: usize = 80;
/// Drafts: INVALIDATE is 64 bytes, the last 4 the device-written tail.
const INV_READABLE: usize = 60;

type Mem = GuestMemoryMmap<()>;

fn put_le(buf: &mut [u8], off: usize, bytes: &[u8]) {
    buf[off..off + bytes.len()].copy_from_slice(bytes);
}

/// ATTACH_TABLE as the drafts lay it out: type 0x06 at 0, domain le32 at 4,
/// endpoint le32 at 8, flags le32 at 12, format le16 at 16, reserved 18..24,
/// root (pgd) le64 at 24, reserved 32..80.
fn attach_table_image(domain: u32, endpoint: u32, format: u16, root: u64) -> Vec<u8> {
    let mut b = vec![0u8; AT_READABLE];
    b[0] = 0x06;
    put_le(&mut b, 4, &domain.to_le_bytes());
    put_le(&mut b, 8, &endpoint.to_le_bytes());
    put_le(&mut b, 16, &format.to_le_bytes());
    put_le(&mut b, 24, &root.to_le_bytes());
    b
}

/// INVALIDATE as the drafts lay it out: type 0x07 at 0, granularity le16
/// at 4, type le16 at 6, flags le16 at 8, reserved 10..12, domain le32 at
/// 12, pasid le32 at 16, reserved 20..24, archid le64 at 24, virt_start le64
/// at 32, nr_pages le64 at 40, granule u8 at 48, reserved 49..60.
#[allow(clippy::too_many_arguments)]
fn invalidate_image(
    gran: u16,
    ty: u16,
    flags: u16,
    domain: u32,
    pasid: u32,
    archid: u64,
    virt_start: u64,
    nr_pages: u64,
    granule: u8,
) -> Vec<u8> {
    let mut b = vec![0u8; INV_READABLE];
    b[0] = 0x07;
    put_le(&mut b, 4, &gran.to_le_bytes());
    put_le(&mut b, 6, &ty.to_le_bytes());
    put_le(&mut b, 8, &flags.to_le_bytes());
    put_le(&mut b, 12, &domain.to_le_bytes());
    put_le(&mut b, 16, &pasid.to_le_bytes());
    put_le(&mut b, 24, &archid.to_le_bytes());
    put_le(&mut b, 32, &virt_start.to_le_bytes());
    put_le(&mut b, 40, &nr_pages.to_le_bytes());
    b[48] = granule;
    b
}

/// G_VA (bit 2), IOTLB (bit 0), 4 KiB granule.
fn inval_va(domain: u32, virt_start: u64, nr_pages: u64) -> Vec<u8> {
    invalidate_image(4, 1, 0, domain, 0, 0, virt_start, nr_pages, 12)
}

fn device(queues: u16) -> (IommuDevice, Arc<Mem>) {
    let m = Arc::new(Mem::from_ranges(&[(GuestAddress(0), RAM)]).unwrap());
    let d = IommuDevice::new(IommuConfig {
        page_table: true,
        num_request_queues: queues,
        ..IommuConfig::default()
    })
    .unwrap();
    d.set_table_memory(m.clone());
    d.add_endpoint(EP).unwrap();
    d.add_endpoint(OTHER_EP).unwrap();
    let f = d.device_features();
    assert_ne!(f & (1 << F_PAGE_TABLE), 0);
    d.ack_features(f);
    (d, m)
}

fn send(d: &IommuDevice, w: &mut QueueContext, bytes: &[u8]) -> Status {
    let mut out = [0xffu8; 4];
    assert_eq!(d.handle_request(w, bytes, &mut out), 4, "used length");
    Status::from_u8(out[0]).expect("valid status")
}

fn attach(d: &IommuDevice, w: &mut QueueContext, domain: u32, ep: u32) {
    // ATTACH (type 1): domain le32 at 4, endpoint le32 at 8.
    let mut b = vec![0u8; 20];
    b[0] = 1;
    put_le(&mut b, 4, &domain.to_le_bytes());
    put_le(&mut b, 8, &ep.to_le_bytes());
    assert_eq!(send(d, w, &b), Status::Ok);
}

/// Links ROOT -> L2 -> L1 -> L0 -> DATA for `iova` (x86-style 4 levels).
fn map_page(m: &Mem, iova: u64) {
    let idx = |l: u32| (iova >> (12 + 9 * l)) & 511;
    let put = |gpa: u64, v: u64| m.write_obj(v.to_le(), GuestAddress(gpa)).unwrap();
    put(ROOT + idx(3) * 8, L2 | 1);
    put(L2 + idx(2) * 8, L1 | 1);
    put(L1 + idx(1) * 8, L0 | 1);
    put(L0 + idx(0) * 8, DATA | 0b11);
}

#[test]
fn wire_attach_table_matches_draft() {
    // Every field is read at its draft offset.
    let mut img = attach_table_image(0x0403_0201, 0x0807_0605, FMT, 0x1122_3344_5566_7000);
    match parse_request(&img).unwrap() {
        Request::AttachTable(a) => {
            assert_eq!(a.domain, 0x0403_0201);
            assert_eq!(a.endpoint, 0x0807_0605);
            assert_eq!(a.flags, 0);
            assert_eq!(a.format, FMT);
            assert_eq!(a.root, 0x1122_3344_5566_7000);
        }
        other => panic!("type 0x06 parsed as {other:?}"),
    }
    img[12] = 0x5a;
    match parse_request(&img).unwrap() {
        Request::AttachTable(a) => assert_eq!(a.flags, 0x5a),
        other => panic!("{other:?}"),
    }

    let (d, m) = device(1);
    let mut w = d.new_worker();
    attach(&d, &mut w, 1, EP);
    // One byte short of the draft's readable part: S_INVAL.
    let good = attach_table_image(1, EP, FMT, ROOT);
    assert_eq!(send(&d, &mut w, &good[..AT_READABLE - 1]), Status::Inval);
    // A flag bit or any reserved byte set: S_INVAL.
    for off in [12, 13, 14, 15] {
        let mut bad = good.clone();
        bad[off] = 1;
        assert_eq!(send(&d, &mut w, &bad), Status::Inval, "flags byte {off}");
    }
    for off in (18..24).chain(32..AT_READABLE) {
        let mut bad = good.clone();
        bad[off] = 0x80;
        assert_eq!(send(&d, &mut w, &bad), Status::Inval, "reserved {off}");
    }
    // A draft format this device does not walk: S_UNSUPP (1: Arm LPAE,
    // 3: the drafts' virt format).
    for fmt in [1u16, 2, 3, 0xff02] {
        let bad = attach_table_image(1, EP, fmt, ROOT);
        assert_eq!(send(&d, &mut w, &bad), Status::Unsupp, "format {fmt:#x}");
    }
    // An endpoint outside the domain: S_NOENT; an unaligned root: S_RANGE.
    assert_eq!(
        send(&d, &mut w, &attach_table_image(1, OTHER_EP, FMT, ROOT)),
        Status::NoEnt
    );
    assert_eq!(
        send(&d, &mut w, &attach_table_image(1, EP, FMT, ROOT | 0x10)),
        Status::Range
    );
    // The exact image is accepted and the table is walked from `root`.
    assert_eq!(send(&d, &mut w, &good), Status::Ok);
    d.complete_kick(&mut w);
    let iova = 0x4000_0000;
    map_page(&m, iova);
    let dma = d.endpoint_dma(EP).unwrap();
    let gpa = dma.translate_contiguous(iova + 8, 8, Perm::READ).unwrap();
    assert_eq!(gpa, DATA + 8);
}

#[test]
fn wire_invalidate_matches_draft() {
    // Every field is read at its draft offset.
    let img = invalidate_image(
        0x0102,
        0x0304,
        0x0506,
        0x0a0b_0c0d,
        0x1112_1314,
        0x2122_2324_2526_2728,
        0x3132_3334_3536_3738,
        0x4142_4344_4546_4748,
        0x51,
    );
    match parse_request(&img).unwrap() {
        Request::Invalidate(i) => {
            assert_eq!(i.granularity, 0x0102);
            assert_eq!(i.inv_type, 0x0304);
            assert_eq!(i.flags, 0x0506);
            assert_eq!(i.domain, 0x0a0b_0c0d);
            assert_eq!(i.pasid, 0x1112_1314);
            assert_eq!(i.archid, 0x2122_2324_2526_2728);
            assert_eq!(i.virt_start, 0x3132_3334_3536_3738);
            assert_eq!(i.nr_pages, 0x4142_4344_4546_4748);
            assert_eq!(i.granule, 0x51);
        }
        other => panic!("type 0x07 parsed as {other:?}"),
    }

    let (d, m) = device(1);
    let mut w = d.new_worker();
    attach(&d, &mut w, 1, EP);
    assert_eq!(
        send(&d, &mut w, &attach_table_image(1, EP, FMT, ROOT)),
        Status::Ok
    );
    let iova = 0x4000_0000;
    map_page(&m, iova);
    let dma = d.endpoint_dma(EP).unwrap();
    dma.translate_contiguous(iova, 8, Perm::READ).unwrap();
    assert_eq!(d.domain_stats(1).unwrap().mappings, 1);

    let good = inval_va(1, iova, 1);
    // Size and reserved bytes: S_INVAL.
    assert_eq!(send(&d, &mut w, &good[..INV_READABLE - 1]), Status::Inval);
    for off in (10..12).chain(20..24).chain(49..INV_READABLE) {
        let mut bad = good.clone();
        bad[off] = 0x40;
        assert_eq!(send(&d, &mut w, &bad), Status::Inval, "reserved {off}");
    }
    // Undefined bits, an unknown granularity, no cache named, no pages,
    // a granule below 4 KiB: S_INVAL.
    let st = |b: Vec<u8>, d: &IommuDevice, w: &mut QueueContext| send(d, w, &b);
    assert_eq!(
        st(
            invalidate_image(4, 1, 1 << 3, 1, 0, 0, iova, 1, 12),
            &d,
            &mut w
        ),
        Status::Inval
    );
    assert_eq!(
        st(
            invalidate_image(4, 1 << 3, 0, 1, 0, 0, iova, 1, 12),
            &d,
            &mut w
        ),
        Status::Inval
    );
    assert_eq!(
        st(invalidate_image(8, 1, 0, 1, 0, 0, iova, 1, 12), &d, &mut w),
        Status::Inval
    );
    assert_eq!(
        st(invalidate_image(4, 0, 0, 1, 0, 0, iova, 1, 12), &d, &mut w),
        Status::Inval
    );
    assert_eq!(st(inval_va(1, iova, 0), &d, &mut w), Status::Inval);
    assert_eq!(
        st(invalidate_image(4, 1, 0, 1, 0, 0, iova, 1, 11), &d, &mut w),
        Status::Inval
    );
    // PASIDs are defined by the drafts but not implemented: S_UNSUPP.
    assert_eq!(
        st(invalidate_image(2, 1, 1, 1, 5, 0, 0, 0, 0), &d, &mut w),
        Status::Unsupp
    );
    assert_eq!(
        st(invalidate_image(4, 1, 1, 1, 5, 0, iova, 1, 12), &d, &mut w),
        Status::Unsupp
    );
    assert_eq!(
        st(
            invalidate_image(4, 1 << 2, 0, 1, 0, 0, iova, 1, 12),
            &d,
            &mut w
        ),
        Status::Unsupp
    );
    // A span past 2^64: S_RANGE; an unknown domain: S_NOENT.
    assert_eq!(st(inval_va(1, 1 << 63, 1 << 52), &d, &mut w), Status::Range);
    assert_eq!(st(inval_va(2, iova, 1), &d, &mut w), Status::NoEnt);
    d.complete_kick(&mut w);
    // None of the refused requests removed the cached walk.
    assert_eq!(d.domain_stats(1).unwrap().mappings, 1);

    // The page before is not the page: nothing removed.
    assert_eq!(send(&d, &mut w, &inval_va(1, iova - 4096, 1)), Status::Ok);
    d.complete_kick(&mut w);
    assert_eq!(d.domain_stats(1).unwrap().mappings, 1);
    // The exact image removes it (ARCHID and LEAF are accepted hints).
    let hinted = invalidate_image(4, 1, 0b110, 1, 0, 7, iova, 1, 12);
    assert_eq!(send(&d, &mut w, &hinted), Status::Ok);
    d.complete_kick(&mut w);
    assert_eq!(d.domain_stats(1).unwrap().mappings, 0);
    // A 2 MiB granule covers the page too; so does G_DOMAIN.
    dma.translate_contiguous(iova, 8, Perm::READ).unwrap();
    assert_eq!(d.domain_stats(1).unwrap().mappings, 1);
    let two_mib = invalidate_image(4, 1, 0, 1, 0, 0, iova, 1, 21);
    assert_eq!(send(&d, &mut w, &two_mib), Status::Ok);
    d.complete_kick(&mut w);
    assert_eq!(d.domain_stats(1).unwrap().mappings, 0);
    dma.translate_contiguous(iova, 8, Perm::READ).unwrap();
    let dom = invalidate_image(1, 1, 0, 1, 0, 0, 0, 0, 0);
    assert_eq!(send(&d, &mut w, &dom), Status::Ok);
    d.complete_kick(&mut w);
    assert_eq!(d.domain_stats(1).unwrap().mappings, 0);
}

#[test]
fn wire_probe_reports_page_table_fmt_type_6() {
    let (d, _m) = device(1);
    let mut w = d.new_worker();
    // PROBE (type 5): endpoint le32 at 4, 64 reserved bytes.
    let mut probe = vec![0u8; 72];
    probe[0] = 5;
    put_le(&mut probe, 4, &EP.to_le_bytes());
    let mut out = vec![0u8; 512 + 4];
    assert_eq!(d.handle_request(&mut w, &probe, &mut out), 516);
    assert_eq!(out[512], Status::Ok as u8);
    // Walk the list by hand: type le16 (low 12 bits), length le16, value.
    let mut pos = 0;
    let mut found = None;
    while pos + 4 <= 512 {
        let ty = u16::from_le_bytes([out[pos], out[pos + 1]]) & 0xfff;
        let len = usize::from(u16::from_le_bytes([out[pos + 2], out[pos + 3]]));
        if ty == 0 {
            break;
        }
        if ty == 6 {
            found = Some((len, out[pos + 4..pos + 4 + len].to_vec()));
        }
        pos += 4 + len;
    }
    let (len, value) = found.expect("a PAGE_TABLE_FMT (type 6) property");
    assert_eq!(len, 4, "format le16 + 2 reserved bytes");
    assert_eq!(value, [0x01, 0xff, 0, 0]);
}

#[test]
fn wire_config_offset_38_reads_num_queues() {
    for (queues, want) in [(1u16, 0u16), (3, 3), (0x0102, 0x0102)] {
        let (d, _m) = device(queues);
        let mut c = [0xaau8; 40];
        d.read_config(0, &mut c);
        assert_eq!(c[37], 0, "reserved byte");
        assert_eq!(u16::from_le_bytes([c[38], c[39]]), want, "{queues} queues");
        let mut two = [0u8; 2];
        d.read_config(38, &mut two);
        assert_eq!(u16::from_le_bytes(two), want);
    }
}
