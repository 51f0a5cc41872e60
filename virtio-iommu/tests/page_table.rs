//! The project page-table mode (docs/page-table.md): the walk of a
//! guest-written table, the cache it fills, INVALIDATE through the batched
//! invalidation, and hostile tables and requests.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::Recorder;

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use virtio_iommu::device::{DeviceLimits, IommuConfig, IommuDevice};
use virtio_iommu::mapping::{Perm, QueueContext};
use virtio_iommu::pgtable::{walk, WalkError, FORMAT_X86_4L, PTE_P, PTE_R, PTE_W};
use virtio_iommu::translate::DmaFault;
use virtio_iommu::wire::*;

const EP: u32 = 8;
const EP2: u32 = 9;
const PG: u64 = 4096;
const RAM: u64 = 4 << 20;
/// Table pages the tests use: root, then levels 2, 1, 0.
const ROOT: u64 = 0x10_0000;
const L2: u64 = 0x10_1000;
const L1: u64 = 0x10_2000;
const L0: u64 = 0x10_3000;
/// A data page.
const DATA: u64 = 0x20_0000;

type Mem = GuestMemoryMmap<()>;

fn mem() -> Arc<Mem> {
    Arc::new(
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), usize::try_from(RAM).unwrap())])
            .unwrap(),
    )
}

fn put(m: &Mem, gpa: u64, v: u64) {
    m.write_obj(v.to_le(), GuestAddress(gpa)).unwrap();
}

fn idx(iova: u64, level: u32) -> u64 {
    (iova >> (12 + 9 * level)) & 511
}

/// Links ROOT -> L2 -> L1 -> L0 for `iova` (all tests' IOVAs share them).
fn link(m: &Mem, iova: u64) {
    put(m, ROOT + idx(iova, 3) * 8, L2 | PTE_P);
    put(m, L2 + idx(iova, 2) * 8, L1 | PTE_P);
    put(m, L1 + idx(iova, 1) * 8, L0 | PTE_P);
}

fn set_leaf(m: &Mem, iova: u64, v: u64) {
    put(m, L0 + idx(iova, 0) * 8, v);
}

fn device_with(limits: DeviceLimits, ack_table: bool) -> (IommuDevice, Arc<Mem>) {
    let m = mem();
    let d = IommuDevice::new(IommuConfig {
        page_table: true,
        limits,
        ..IommuConfig::default()
    })
    .unwrap();
    d.set_table_memory(m.clone());
    d.add_endpoint(EP).unwrap();
    d.add_endpoint(EP2).unwrap();
    let mut f = d.device_features();
    assert_ne!(f & feature::bit(feature::PAGE_TABLE), 0, "offered");
    if !ack_table {
        f &= !feature::bit(feature::PAGE_TABLE);
    }
    d.ack_features(f);
    (d, m)
}

fn device() -> (IommuDevice, Arc<Mem>) {
    device_with(DeviceLimits::default(), true)
}

fn send(d: &IommuDevice, w: &mut QueueContext, bytes: &[u8]) -> Status {
    let mut out = [0xffu8; 4];
    let n = d.handle_request(w, bytes, &mut out);
    assert_eq!(n, 4, "used length");
    Status::from_u8(out[0]).expect("valid status")
}

fn attach(domain: u32, endpoint: u32) -> Vec<u8> {
    Request::Attach(AttachReq {
        domain,
        endpoint,
        flags: 0,
        reserved: [0; 4],
    })
    .encode()
}

fn attach_table(domain: u32, root: u64) -> Vec<u8> {
    Request::AttachTable(AttachTableReq::new(domain, EP, root)).encode()
}

fn invalidate(domain: u32, virt_start: u64, virt_end: u64) -> Vec<u8> {
    Request::Invalidate(InvalidateReq::range(domain, virt_start, virt_end)).encode()
}

/// Device with EP in domain 1 in table mode at ROOT.
fn table_device() -> (IommuDevice, Arc<Mem>, QueueContext) {
    let (d, m) = device();
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, EP)), Status::Ok);
    assert_eq!(send(&d, &mut w, &attach_table(1, ROOT)), Status::Ok);
    d.complete_kick(&mut w);
    (d, m, w)
}

#[test]
fn walk_follows_four_levels_and_reads_permissions() {
    let m = mem();
    let iova = 0x1234_5678_9000;
    link(&m, iova);
    set_leaf(&m, iova, DATA | PTE_P | PTE_R);
    let leaf = walk(&*m, ROOT, iova + 0x123).unwrap();
    assert_eq!(leaf.gpa, DATA);
    assert_eq!(leaf.perm, Perm::READ);
    set_leaf(&m, iova, DATA | PTE_P | PTE_R | PTE_W);
    assert_eq!(walk(&*m, ROOT, iova).unwrap().perm, Perm::RW);
    set_leaf(&m, iova, DATA | PTE_R | PTE_W);
    assert_eq!(
        walk(&*m, ROOT, iova),
        Err(WalkError::NotPresent { level: 0 })
    );
    assert_eq!(
        walk(&*m, ROOT, iova + (1 << 39)),
        Err(WalkError::NotPresent { level: 3 })
    );
    assert!(matches!(
        walk(&*m, ROOT, 1 << 48),
        Err(WalkError::OutOfRange(_))
    ));
}

#[test]
fn hostile_tables_fail_closed() {
    let m = mem();
    let iova = 0x4000_0000;
    link(&m, iova);
    // Reserved bits in a leaf and in a directory entry.
    set_leaf(&m, iova, DATA | PTE_P | PTE_R | (1 << 5));
    assert!(matches!(
        walk(&*m, ROOT, iova),
        Err(WalkError::Reserved { level: 0, .. })
    ));
    set_leaf(&m, iova, DATA | PTE_P | PTE_R | (1 << 63));
    assert!(matches!(
        walk(&*m, ROOT, iova),
        Err(WalkError::Reserved { .. })
    ));
    set_leaf(&m, iova, DATA | PTE_P | PTE_R);
    put(&m, L1 + idx(iova, 1) * 8, L0 | PTE_P | PTE_R);
    assert!(matches!(
        walk(&*m, ROOT, iova),
        Err(WalkError::Reserved { level: 1, .. })
    ));
    // A table outside RAM, a page outside RAM, a root outside RAM.
    put(&m, L1 + idx(iova, 1) * 8, (RAM + 0x1000) | PTE_P);
    assert!(matches!(
        walk(&*m, ROOT, iova),
        Err(WalkError::NotRam { level: 0, .. })
    ));
    put(&m, L1 + idx(iova, 1) * 8, L0 | PTE_P);
    set_leaf(&m, iova, (1 << 51) | PTE_P | PTE_R);
    assert!(matches!(
        walk(&*m, ROOT, iova),
        Err(WalkError::NotRam { .. })
    ));
    assert!(matches!(
        walk(&*m, RAM, iova),
        Err(WalkError::NotRam { .. })
    ));
    // A loop: every level points back at the root. The walk reads four
    // entries and ends (here on the root's entry read as a leaf).
    let m2 = mem();
    put(&m2, ROOT, ROOT | PTE_P);
    let leaf = walk(&*m2, ROOT, 0).unwrap();
    assert_eq!(leaf.gpa, ROOT);
    assert_eq!(leaf.perm, Perm::NONE);
}

#[test]
fn miss_walks_and_caches_then_hits() {
    let (d, m, _w) = table_device();
    let iova = 0x8000_0000;
    link(&m, iova);
    set_leaf(&m, iova, DATA | PTE_P | PTE_R | PTE_W);
    let dma = d.endpoint_dma(EP).unwrap();
    let gpa = dma.translate_contiguous(iova + 8, 16, Perm::WRITE).unwrap();
    assert_eq!(gpa, DATA + 8);
    let s = d.table_stats(1).unwrap();
    assert_eq!((s.walks, s.filled), (1, 1));
    assert_eq!(d.domain_stats(1).unwrap().mappings, 1);
    // A hit: no walk, even after the guest changed the entry (a present
    // entry changes only with an INVALIDATE).
    set_leaf(&m, iova, (DATA + PG) | PTE_P | PTE_R | PTE_W);
    let gpa = dma.translate_contiguous(iova, 8, Perm::READ).unwrap();
    assert_eq!(gpa, DATA);
    assert_eq!(d.table_stats(1).unwrap().walks, 1);
    // The vhost-user lookup goes the same way.
    assert_eq!(dma.lookup(iova, Perm::READ).unwrap().gpa, DATA);
}

#[test]
fn fill_ahead_covers_a_multi_page_buffer_with_one_walk() {
    let (d, m, _w) = table_device();
    let iova = 0x8000_0000;
    link(&m, iova);
    for i in 0..4 {
        set_leaf(&m, iova + i * PG, (DATA + i * PG) | PTE_P | PTE_R);
    }
    let dma = d.endpoint_dma(EP).unwrap();
    let runs: Vec<_> = dma
        .translate(iova, 4 * PG, Perm::READ)
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let total: u64 = runs.iter().map(|r| r.len).sum();
    assert_eq!(total, 4 * PG);
    assert_eq!(runs[0].gpa, DATA);
    let s = d.table_stats(1).unwrap();
    assert_eq!((s.walks, s.filled), (1, 4));
}

#[test]
fn invalidate_removes_cached_walks_through_the_batch() {
    let (d, m, mut w) = table_device();
    let rec = Arc::new(Recorder::default());
    d.add_invalidator(rec.clone());
    let iova = 0x8000_0000;
    link(&m, iova);
    set_leaf(&m, iova, DATA | PTE_P | PTE_R);
    let dma = d.endpoint_dma(EP).unwrap();
    dma.translate_contiguous(iova, 8, Perm::READ).unwrap();
    // The guest clears the entry and invalidates (an unaligned range is
    // rounded out to pages).
    set_leaf(&m, iova, 0);
    assert_eq!(
        send(&d, &mut w, &invalidate(1, iova + 5, iova + 9)),
        Status::Ok
    );
    d.complete_kick(&mut w);
    let calls = rec.calls.lock().unwrap().clone();
    assert_eq!(calls, vec![(1, vec![iova..=iova + PG - 1])]);
    assert_eq!(d.domain_stats(1).unwrap().mappings, 0);
    assert!(matches!(
        dma.translate_contiguous(iova, 8, Perm::READ),
        Err(DmaFault::Unmapped { .. })
    ));
    assert_eq!(d.table_stats(1).unwrap().invalidations, 1);
    assert_eq!(d.request_counts().invalidate, 1);
    // A whole-space INVALIDATE is fine too.
    assert_eq!(send(&d, &mut w, &invalidate(1, 0, u64::MAX)), Status::Ok);
    d.complete_kick(&mut w);
}

#[test]
fn hostile_entries_fault_and_cache_nothing() {
    let (d, m, _w) = table_device();
    let iova = 0x8000_0000;
    link(&m, iova);
    let dma = d.endpoint_dma(EP).unwrap();
    for bad in [
        DATA | PTE_P | PTE_R | (1 << 7),
        (RAM + PG) | PTE_P | PTE_R,
        DATA | PTE_R,
    ] {
        set_leaf(&m, iova, bad);
        assert!(dma.translate_contiguous(iova, 8, Perm::READ).is_err());
    }
    // Read-only page written: permission fault.
    set_leaf(&m, iova, DATA | PTE_P | PTE_R);
    assert!(matches!(
        dma.translate_contiguous(iova, 8, Perm::WRITE),
        Err(DmaFault::Permission { .. })
    ));
    assert_eq!(d.table_stats(1).unwrap().walk_faults, 3);
    assert_eq!(d.faults().len(), 4);
}

#[test]
fn cache_is_bounded_by_the_domain_limits() {
    let limits = DeviceLimits {
        max_mappings_per_domain: 4,
        ..DeviceLimits::default()
    };
    let (d, m) = device_with(limits, true);
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, EP)), Status::Ok);
    assert_eq!(send(&d, &mut w, &attach_table(1, ROOT)), Status::Ok);
    let iova = 0x8000_0000;
    link(&m, iova);
    for i in 0..64 {
        set_leaf(&m, iova + i * PG, (DATA + i * PG) | PTE_P | PTE_R);
    }
    let dma = d.endpoint_dma(EP).unwrap();
    for i in (0..64).rev() {
        let gpa = dma
            .translate_contiguous(iova + i * PG, 8, Perm::READ)
            .unwrap();
        assert_eq!(gpa, DATA + i * PG, "translated even when not cached");
    }
    assert!(d.domain_stats(1).unwrap().mappings <= 4);
    assert!(d.table_stats(1).unwrap().uncached > 0);
}

#[test]
fn attach_table_validates_its_arguments() {
    let (d, _m) = device();
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach_table(1, ROOT)), Status::NoEnt);
    assert_eq!(send(&d, &mut w, &attach(1, EP)), Status::Ok);
    assert_eq!(send(&d, &mut w, &attach_table(1, ROOT + 8)), Status::Range);
    assert_eq!(send(&d, &mut w, &attach_table(1, 0)), Status::Range);
    assert_eq!(send(&d, &mut w, &attach_table(1, RAM)), Status::Fault);
    assert_eq!(send(&d, &mut w, &attach_table(1, !0xfff)), Status::Fault);
    let mut bad = attach_table(1, ROOT);
    bad[16] = 2; // format (le16 at 16)
    assert_eq!(send(&d, &mut w, &bad), Status::Unsupp);
    let mut bad = attach_table(1, ROOT);
    bad[18] = 1; // reserved (18..24)
    assert_eq!(send(&d, &mut w, &bad), Status::Inval);
    assert_eq!(
        send(&d, &mut w, &attach_table(1, ROOT)[..12]),
        Status::Inval
    );
    // A domain with explicit MAPs must drop them first.
    let map = Request::Map(MapReq {
        domain: 1,
        virt_start: 0,
        virt_end: PG - 1,
        phys_start: DATA,
        flags: MAP_F_READ,
    })
    .encode();
    assert_eq!(send(&d, &mut w, &map), Status::Ok);
    assert_eq!(send(&d, &mut w, &attach_table(1, ROOT)), Status::Inval);
    let unmap = Request::Unmap(UnmapReq {
        domain: 1,
        virt_start: 0,
        virt_end: PG - 1,
    })
    .encode();
    assert_eq!(send(&d, &mut w, &unmap), Status::Ok);
    assert_eq!(send(&d, &mut w, &attach_table(1, ROOT)), Status::Ok);
    // In table mode MAP and UNMAP are refused; INVALIDATE is checked.
    assert_eq!(send(&d, &mut w, &map), Status::Inval);
    assert_eq!(send(&d, &mut w, &unmap), Status::Inval);
    assert_eq!(send(&d, &mut w, &invalidate(1, 9, 8)), Status::Inval);
    assert_eq!(send(&d, &mut w, &invalidate(2, 0, 8)), Status::NoEnt);
    assert_eq!(
        send(&d, &mut w, &invalidate(1, 1 << 60, u64::MAX)),
        Status::Ok
    );
    // A bypass domain has no table.
    let byp = Request::Attach(AttachReq {
        domain: 7,
        endpoint: EP2,
        flags: ATTACH_F_BYPASS,
        reserved: [0; 4],
    })
    .encode();
    assert_eq!(send(&d, &mut w, &byp), Status::Ok);
    assert_eq!(send(&d, &mut w, &attach_table(7, ROOT)), Status::Inval);
    assert_eq!(send(&d, &mut w, &invalidate(7, 0, 8)), Status::Inval);
    d.complete_kick(&mut w);
}

#[test]
fn vfio_endpoints_keep_explicit_maps() {
    let (d, _m) = device();
    d.require_explicit_maps(EP2).unwrap();
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, EP2)), Status::Ok);
    assert_eq!(send(&d, &mut w, &attach_table(1, ROOT)), Status::Unsupp);
    assert_eq!(send(&d, &mut w, &attach(2, EP)), Status::Ok);
    assert_eq!(send(&d, &mut w, &attach_table(2, ROOT)), Status::Ok);
    // Joining a table domain is refused too.
    assert_eq!(send(&d, &mut w, &attach(2, EP2)), Status::Unsupp);
    d.complete_kick(&mut w);
}

#[test]
fn without_the_feature_the_requests_do_not_exist() {
    let (d, _m) = device_with(DeviceLimits::default(), false);
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, EP)), Status::Ok);
    let mut out = [0xffu8; 4];
    assert_eq!(
        d.handle_request(&mut w, &attach_table(1, ROOT), &mut out),
        0
    );
    assert_eq!(d.handle_request(&mut w, &invalidate(1, 0, 8), &mut out), 0);
    assert_eq!(out, [0xff; 4]);
    // No format property either.
    let mut props = vec![0u8; 512 + 4];
    let probe = Request::Probe(ProbeReq { endpoint: EP }).encode();
    d.handle_request(&mut w, &probe, &mut props);
    assert!(decode_probe_props(&props[..512])
        .unwrap()
        .iter()
        .all(|p| !matches!(p, ProbeProp::PageTableFmt(_))));
}

#[test]
fn probe_announces_the_format() {
    let (d, _m) = device();
    let mut w = d.new_worker();
    let mut props = vec![0u8; 512 + 4];
    let probe = Request::Probe(ProbeReq { endpoint: EP }).encode();
    assert_eq!(d.handle_request(&mut w, &probe, &mut props), 516);
    assert_eq!(props[512], Status::Ok as u8);
    let found = decode_probe_props(&props[..512]).unwrap();
    assert!(found.contains(&ProbeProp::PageTableFmt(PageTableFmt {
        format: FORMAT_X86_4L,
    })));
}

#[test]
fn detach_and_reattach_start_over() {
    let (d, m, mut w) = table_device();
    let iova = 0x8000_0000;
    link(&m, iova);
    set_leaf(&m, iova, DATA | PTE_P | PTE_R);
    let dma = d.endpoint_dma(EP).unwrap();
    dma.translate_contiguous(iova, 8, Perm::READ).unwrap();
    // A new root drops what was cached from the old one.
    let m2root = 0x18_0000;
    assert_eq!(send(&d, &mut w, &attach_table(1, m2root)), Status::Ok);
    d.complete_kick(&mut w);
    assert_eq!(d.domain_stats(1).unwrap().mappings, 0);
    assert!(dma.translate_contiguous(iova, 8, Perm::READ).is_err());
    // DETACH of the last member ends the domain and its table.
    let det = Request::Detach(DetachReq {
        domain: 1,
        endpoint: EP,
    })
    .encode();
    assert_eq!(send(&d, &mut w, &det), Status::Ok);
    d.complete_kick(&mut w);
    assert!(d.table_stats(1).is_none());
}

#[test]
fn concurrent_fills_and_invalidations_leave_nothing_stale() {
    let (d, m, mut w) = table_device();
    let d = Arc::new(d);
    let iova = 0x8000_0000;
    link(&m, iova);
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let d = d.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let dma = d.endpoint_dma(EP).unwrap();
            while !stop.load(Ordering::Relaxed) {
                let _ = dma.translate_contiguous(iova, 8, Perm::READ);
            }
        })
    };
    let dma = d.endpoint_dma(EP).unwrap();
    for round in 0..2000u64 {
        let gpa = DATA + (round % 8) * PG;
        set_leaf(&m, iova, gpa | PTE_P | PTE_R);
        // The new entry is visible without a request.
        let got = dma.translate_contiguous(iova, 8, Perm::READ).unwrap();
        assert_eq!(got, gpa, "round {round}");
        set_leaf(&m, iova, 0);
        assert_eq!(
            send(&d, &mut w, &invalidate(1, iova, iova + PG - 1)),
            Status::Ok
        );
        d.complete_kick(&mut w);
        // After the INVALIDATE completed, nothing is left.
        assert!(dma.translate_contiguous(iova, 8, Perm::READ).is_err());
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
}
