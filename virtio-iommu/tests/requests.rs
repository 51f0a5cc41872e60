//! Request-level tests of the device model: byte-exact requests in, status
//! codes and side effects out, for every request type and status path, plus
//! bypass, fault events, limits, reset, invalidation ordering and a
//! concurrency smoke test.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::Recorder;

use virtio_iommu::device::{
    DeviceLimits, EndpointListener, IommuConfig, IommuDevice, MapMirror, MirrorError, MULTIQUEUE,
};
use virtio_iommu::mapping::{Invalidator, Perm, QueueContext, SpaceImpl};
use virtio_iommu::translate::{DmaFault, DmaRun};
use virtio_iommu::wire::*;

const EP: u32 = 8;
const EP2: u32 = 9;
const PG: u64 = 4096;

fn all_features(d: &IommuDevice) {
    d.ack_features(d.device_features());
}

fn device_with(cfg: IommuConfig) -> IommuDevice {
    let d = IommuDevice::new(cfg).unwrap();
    d.add_endpoint(EP).unwrap();
    d.add_endpoint(EP2).unwrap();
    all_features(&d);
    d
}

fn device() -> IommuDevice {
    device_with(IommuConfig::default())
}

/// Sends one request; asserts the used length is exactly one tail.
fn send(d: &IommuDevice, w: &mut QueueContext, bytes: &[u8]) -> Status {
    let mut out = [0xffu8; 4];
    let n = d.handle_request(w, bytes, &mut out);
    assert_eq!(n, 4, "used length");
    assert_eq!(&out[1..], &[0, 0, 0], "tail reserved bytes");
    Status::from_u8(out[0]).expect("valid status")
}

fn attach(domain: u32, endpoint: u32, flags: u32) -> Vec<u8> {
    Request::Attach(AttachReq {
        domain,
        endpoint,
        flags,
        reserved: [0; 4],
    })
    .encode()
}

fn detach(domain: u32, endpoint: u32) -> Vec<u8> {
    Request::Detach(DetachReq { domain, endpoint }).encode()
}

fn map(domain: u32, virt_start: u64, virt_end: u64, phys_start: u64, flags: u32) -> Vec<u8> {
    Request::Map(MapReq {
        domain,
        virt_start,
        virt_end,
        phys_start,
        flags,
    })
    .encode()
}

fn unmap(domain: u32, virt_start: u64, virt_end: u64) -> Vec<u8> {
    Request::Unmap(UnmapReq {
        domain,
        virt_start,
        virt_end,
    })
    .encode()
}

fn probe(endpoint: u32) -> Vec<u8> {
    Request::Probe(ProbeReq { endpoint }).encode()
}

const RW: u32 = MAP_F_READ | MAP_F_WRITE;

fn runs(d: &IommuDevice, ep: u32, iova: u64, len: u64, p: Perm) -> Result<Vec<DmaRun>, DmaFault> {
    d.endpoint_dma(ep)
        .unwrap()
        .translate(iova, len, p)
        .collect()
}

// ---------------------------------------------------------------- features

#[test]
fn offered_features_follow_the_spec() {
    let d = IommuDevice::new(IommuConfig::default()).unwrap();
    let f = d.device_features();
    for b in [
        feature::INPUT_RANGE,
        feature::DOMAIN_RANGE,
        feature::MAP_UNMAP,
        feature::PROBE,
        feature::MMIO,
        feature::BYPASS_CONFIG,
        feature::VIRTIO_F_VERSION_1,
    ] {
        assert_ne!(f & feature::bit(b), 0, "bit {b} offered");
    }
    // BYPASS and BYPASS_CONFIG SHOULD NOT both be offered.
    assert_eq!(f & feature::bit(feature::BYPASS), 0);
    // Single queue: no multi-queue bit.
    assert_eq!(f & feature::bit(MULTIQUEUE), 0);
    assert_eq!(d.num_request_queues(), 1);
    // Unoffered bits are not recorded as acked.
    d.ack_features(u64::MAX);
    assert_eq!(d.acked_features(), f);
}

#[test]
fn multiqueue_only_when_negotiated() {
    let d = IommuDevice::new(IommuConfig {
        num_request_queues: 4,
        ..Default::default()
    })
    .unwrap();
    let f = d.device_features();
    assert_ne!(f & feature::bit(MULTIQUEUE), 0);
    d.ack_features(f & !feature::bit(MULTIQUEUE));
    assert_eq!(d.num_request_queues(), 1);
    d.ack_features(f);
    assert_eq!(d.num_request_queues(), 4);
    // num_queues is le16 at offset 38 (the drafts' place); nothing follows
    // the 40-byte config space any more.
    let mut nq = [0u8; 2];
    d.read_config(38, &mut nq);
    assert_eq!(nq, [4, 0]);
    let mut past = [0xaau8; 4];
    d.read_config(CONFIG_SIZE as u64, &mut past);
    assert_eq!(past, [0; 4]);
}

#[test]
fn probe_not_offered_when_probe_size_zero() {
    let d = device_with(IommuConfig {
        probe_size: 0,
        ..Default::default()
    });
    assert_eq!(d.device_features() & feature::bit(feature::PROBE), 0);
    let mut w = d.new_worker();
    let mut out = [0xaau8; 64];
    assert_eq!(d.handle_request(&mut w, &probe(EP), &mut out), 0);
    assert!(out.iter().all(|&b| b == 0xaa), "buffer untouched");
}

// ---------------------------------------------------------------- config space

#[test]
fn config_space_reads_and_bypass_writes() {
    let d = IommuDevice::new(IommuConfig {
        domain_start: 1,
        domain_end: 100,
        bypass: true,
        ..Default::default()
    })
    .unwrap();
    let mut c = [0u8; CONFIG_SIZE];
    d.read_config(0, &mut c);
    assert_eq!(u64::from_le_bytes(c[0..8].try_into().unwrap()), !(PG - 1));
    assert_eq!(u64::from_le_bytes(c[8..16].try_into().unwrap()), 0);
    assert_eq!(
        u64::from_le_bytes(c[16..24].try_into().unwrap()),
        (1 << 48) - 1
    );
    assert_eq!(u32::from_le_bytes(c[24..28].try_into().unwrap()), 1);
    assert_eq!(u32::from_le_bytes(c[28..32].try_into().unwrap()), 100);
    assert_eq!(u32::from_le_bytes(c[32..36].try_into().unwrap()), 512);
    assert_eq!(c[36], 1);

    // Partial and out-of-bounds reads.
    let mut b = [0xffu8; 4];
    d.read_config(24, &mut b);
    assert_eq!(b, [1, 0, 0, 0]);
    let mut b = [0xffu8; 8];
    d.read_config(36, &mut b);
    assert_eq!(b, [1, 0, 0, 0, 0, 0, 0, 0]);
    d.read_config(u64::MAX, &mut b);
    assert_eq!(b, [0; 8]);

    // Without BYPASS_CONFIG negotiated, bypass is read-only.
    d.write_config(36, &[0]);
    assert!(d.bypass());
    d.ack_features(feature::bit(feature::BYPASS_CONFIG));
    d.write_config(36, &[0]);
    assert!(!d.bypass());
    // A 4-byte write at the bypass offset sets it too; other fields stay.
    d.write_config(36, &[1, 9, 9, 9]);
    assert!(d.bypass());
    d.write_config(0, &[0u8; 36]);
    d.read_config(0, &mut c);
    assert_eq!(u64::from_le_bytes(c[0..8].try_into().unwrap()), !(PG - 1));
    assert_eq!(c[36], 1);
    assert_eq!(&c[37..40], &[0, 0, 0]);
}

// ---------------------------------------------------------------- framing

#[test]
fn writable_too_small_writes_nothing() {
    let d = device();
    let mut w = d.new_worker();
    for len in 0..4 {
        let mut out = vec![0xaau8; len];
        assert_eq!(d.handle_request(&mut w, &attach(1, EP, 0), &mut out), 0);
        assert!(out.iter().all(|&b| b == 0xaa));
    }
    // Nothing was attached.
    assert_eq!(d.endpoint_domain(EP), None);
}

#[test]
fn unknown_type_gets_zero_used_length() {
    let d = device();
    let mut w = d.new_worker();
    for t in [0u8, 6, 0x7f, 0xff] {
        let mut req = attach(1, EP, 0);
        req[0] = t;
        let mut out = [0xaau8; 4];
        assert_eq!(d.handle_request(&mut w, &req, &mut out), 0);
        assert_eq!(out, [0xaa; 4]);
    }
}

#[test]
fn short_readable_is_inval() {
    let d = device();
    let mut w = d.new_worker();
    let full = [
        attach(1, EP, 0),
        detach(1, EP),
        map(1, 0, PG - 1, 0, RW),
        unmap(1, 0, PG - 1),
    ];
    for req in &full {
        for cut in 0..req.len() {
            assert_eq!(
                send(&d, &mut w, &req[..cut]),
                Status::Inval,
                "{:?} cut {cut}",
                req[0]
            );
        }
    }
    assert_eq!(d.endpoint_domain(EP), None);
    // Short PROBE: tail after probe_size.
    let mut out = vec![0u8; 512 + 4];
    assert_eq!(d.handle_request(&mut w, &probe(EP)[..8], &mut out), 516);
    assert_eq!(out[512], Status::Inval as u8);
}

#[test]
fn head_reserved_bytes_are_ignored() {
    let d = device();
    let mut w = d.new_worker();
    let mut req = attach(1, EP, 0);
    req[1..4].copy_from_slice(&[1, 2, 3]);
    assert_eq!(send(&d, &mut w, &req), Status::Ok);
}

// ---------------------------------------------------------------- ATTACH

#[test]
fn attach_status_paths() {
    let d = device_with(IommuConfig {
        domain_start: 1,
        domain_end: 10,
        ..Default::default()
    });
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, 0x77, 0)), Status::NoEnt);
    assert_eq!(send(&d, &mut w, &attach(0, EP, 0)), Status::Range);
    assert_eq!(send(&d, &mut w, &attach(11, EP, 0)), Status::Range);
    let mut bad = attach(1, EP, 0);
    bad[16] = 1; // reserved
    assert_eq!(send(&d, &mut w, &bad), Status::Inval);
    assert_eq!(send(&d, &mut w, &attach(1, EP, 2)), Status::Inval);
    assert_eq!(d.domain_count(), 0);
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    assert_eq!(d.endpoint_domain(EP), Some(1));
    // Idempotent re-attach.
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    // Second endpoint into the same domain.
    assert_eq!(send(&d, &mut w, &attach(1, EP2, 0)), Status::Ok);
    assert_eq!(d.domain_count(), 1);
    // Bypass flag on an existing non-bypass domain.
    assert_eq!(
        send(&d, &mut w, &attach(1, EP, ATTACH_F_BYPASS)),
        Status::Inval
    );
    // Bypass domain, then the mismatch the other way.
    assert_eq!(
        send(&d, &mut w, &attach(2, EP, ATTACH_F_BYPASS)),
        Status::Ok
    );
    assert_eq!(send(&d, &mut w, &attach(2, EP2, 0)), Status::Inval);
    assert_eq!(d.endpoint_domain(EP2), Some(1));
}

#[test]
fn attach_bypass_flag_needs_bypass_config() {
    let d = device();
    d.ack_features(d.device_features() & !feature::bit(feature::BYPASS_CONFIG));
    let mut w = d.new_worker();
    assert_eq!(
        send(&d, &mut w, &attach(1, EP, ATTACH_F_BYPASS)),
        Status::Inval
    );
    assert_eq!(d.endpoint_domain(EP), None);
}

#[test]
fn attach_moves_endpoint_and_destroys_empty_old_domain() {
    let d = device();
    let rec = Arc::new(Recorder::default());
    d.add_invalidator(rec.clone());
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    assert_eq!(
        send(&d, &mut w, &map(1, 0x10000, 0x1ffff, 0x80000, RW)),
        Status::Ok
    );
    d.complete_kick(&mut w);
    rec.calls.lock().unwrap().clear();
    assert_eq!(send(&d, &mut w, &attach(2, EP, 0)), Status::Ok);
    d.complete_kick(&mut w);
    assert_eq!(d.endpoint_domain(EP), Some(2));
    assert_eq!(d.domain_count(), 1);
    assert!(d.domain_stats(1).is_none());
    // The old domain's mappings were invalidated at consumers.
    let calls = rec.calls.lock().unwrap().clone();
    assert!(
        calls
            .iter()
            .any(|(dom, r)| *dom == 1 && r.iter().any(|r| r.contains(&0x10000))),
        "{calls:?}"
    );
    // Domain 1 id reused: a fresh, empty domain.
    assert_eq!(send(&d, &mut w, &attach(1, EP2, 0)), Status::Ok);
    assert_eq!(d.domain_stats(1).unwrap().mappings, 0);
    assert!(matches!(
        runs(&d, EP2, 0x10000, 16, Perm::READ),
        Err(DmaFault::Unmapped { .. })
    ));
}

#[test]
fn attach_keeps_old_domain_with_other_members() {
    let d = device();
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    assert_eq!(send(&d, &mut w, &attach(1, EP2, 0)), Status::Ok);
    assert_eq!(
        send(&d, &mut w, &map(1, 0x10000, 0x10fff, 0x5000, RW)),
        Status::Ok
    );
    assert_eq!(send(&d, &mut w, &attach(2, EP, 0)), Status::Ok);
    d.complete_kick(&mut w);
    assert_eq!(d.domain_stats(1).unwrap().mappings, 1);
    assert_eq!(
        runs(&d, EP2, 0x10000, 8, Perm::READ).unwrap(),
        vec![DmaRun {
            gpa: 0x5000,
            len: 8
        }]
    );
    // EP moved: no longer reaches domain 1's mapping.
    assert!(runs(&d, EP, 0x10000, 8, Perm::READ).is_err());
}

// ---------------------------------------------------------------- DETACH

#[test]
fn detach_status_paths() {
    let d = device();
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &detach(1, 0x77)), Status::NoEnt);
    assert_eq!(send(&d, &mut w, &detach(1, EP)), Status::Inval);
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    assert_eq!(send(&d, &mut w, &detach(2, EP)), Status::Inval);
    assert_eq!(send(&d, &mut w, &detach(1, EP2)), Status::Inval);
    assert_eq!(send(&d, &mut w, &map(1, 0, PG - 1, 0x1000, RW)), Status::Ok);
    assert_eq!(send(&d, &mut w, &detach(1, EP)), Status::Ok);
    d.complete_kick(&mut w);
    assert_eq!(d.endpoint_domain(EP), None);
    // Last endpoint gone: the domain ceased to exist.
    assert_eq!(d.domain_count(), 0);
    assert_eq!(send(&d, &mut w, &map(1, 0, PG - 1, 0, RW)), Status::NoEnt);
    // Detach ignores its reserved bytes.
    assert_eq!(send(&d, &mut w, &attach(3, EP, 0)), Status::Ok);
    let mut req = detach(3, EP);
    req[12..20].copy_from_slice(&[0xff; 8]);
    assert_eq!(send(&d, &mut w, &req), Status::Ok);
}

// ---------------------------------------------------------------- MAP

#[test]
fn map_status_paths() {
    let d = device_with(IommuConfig {
        input_start: 0x1000,
        input_end: (1 << 40) - 1,
        ..Default::default()
    });
    let mut w = d.new_worker();
    assert_eq!(
        send(&d, &mut w, &map(1, 0x1000, 0x1fff, 0, RW)),
        Status::NoEnt
    );
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    // Alignment of virt_start, phys_start, virt_end + 1.
    assert_eq!(
        send(&d, &mut w, &map(1, 0x1800, 0x1fff, 0, RW)),
        Status::Range
    );
    assert_eq!(
        send(&d, &mut w, &map(1, 0x1000, 0x1fff, 0x10, RW)),
        Status::Range
    );
    assert_eq!(
        send(&d, &mut w, &map(1, 0x1000, 0x1ffe, 0, RW)),
        Status::Range
    );
    // Outside input_range.
    assert_eq!(send(&d, &mut w, &map(1, 0, 0xfff, 0, RW)), Status::Range);
    assert_eq!(
        send(&d, &mut w, &map(1, 1 << 40, (1 << 40) + 0xfff, 0, RW)),
        Status::Range
    );
    assert_eq!(
        send(&d, &mut w, &map(1, 0x1000, u64::MAX, 0, RW)),
        Status::Range
    );
    // phys_end past the guest-physical limit / wrapping.
    assert_eq!(
        send(&d, &mut w, &map(1, 0x1000, 0x2fff, u64::MAX - 0xfff, RW)),
        Status::Range
    );
    // virt_end < virt_start.
    assert_eq!(
        send(&d, &mut w, &map(1, 0x3000, 0x1fff, 0, RW)),
        Status::Inval
    );
    // Unknown flags; MMIO needs the MMIO feature.
    assert_eq!(
        send(&d, &mut w, &map(1, 0x1000, 0x1fff, 0, 8)),
        Status::Inval
    );
    assert_eq!(
        send(&d, &mut w, &map(1, 0x1000, 0x1fff, 0, 1 << 31)),
        Status::Inval
    );
    assert_eq!(d.domain_stats(1).unwrap().mappings, 0);
    // MSI window is reserved.
    assert_eq!(
        send(
            &d,
            &mut w,
            &map(1, 0xfee0_0000, 0xfee0_0fff, 0xfee0_0000, RW)
        ),
        Status::Inval
    );
    assert_eq!(
        send(&d, &mut w, &map(1, 0xfe00_0000, 0xffff_ffff, 0, RW)),
        Status::Inval
    );
    // Success, then overlap.
    assert_eq!(
        send(&d, &mut w, &map(1, 0x1000, 0x2fff, 0x40000, RW)),
        Status::Ok
    );
    assert_eq!(
        send(&d, &mut w, &map(1, 0x2000, 0x3fff, 0x50000, RW)),
        Status::Inval
    );
    assert_eq!(
        send(&d, &mut w, &map(1, 0x0, 0x1fff, 0x50000, RW)),
        Status::Range
    );
    assert_eq!(d.domain_stats(1).unwrap().mappings, 1);
    assert_eq!(
        runs(&d, EP, 0x1800, 0x1000, Perm::WRITE).unwrap(),
        vec![DmaRun {
            gpa: 0x40800,
            len: 0x1000
        }]
    );
}

#[test]
fn map_mmio_flag_and_no_perm() {
    let d = device();
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    d.ack_features(d.device_features() & !feature::bit(feature::MMIO));
    assert_eq!(
        send(&d, &mut w, &map(1, 0, PG - 1, 0, MAP_F_WRITE | MAP_F_MMIO)),
        Status::Inval
    );
    all_features(&d);
    assert_eq!(
        send(
            &d,
            &mut w,
            &map(1, 0, PG - 1, 0xd000_0000, MAP_F_WRITE | MAP_F_MMIO)
        ),
        Status::Ok
    );
    // WRITE without READ: writes pass, reads fault.
    assert!(runs(&d, EP, 0, 4, Perm::WRITE).is_ok());
    assert!(matches!(
        runs(&d, EP, 0, 4, Perm::READ),
        Err(DmaFault::Permission { .. })
    ));
}

#[test]
fn map_unmap_need_map_unmap_feature() {
    let d = device();
    d.ack_features(d.device_features() & !feature::bit(feature::MAP_UNMAP));
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    assert_eq!(send(&d, &mut w, &map(1, 0, PG - 1, 0, RW)), Status::Unsupp);
    assert_eq!(send(&d, &mut w, &unmap(1, 0, PG - 1)), Status::Unsupp);
}

#[test]
fn map_and_unmap_on_bypass_domain_are_inval() {
    let d = device();
    let mut w = d.new_worker();
    assert_eq!(
        send(&d, &mut w, &attach(1, EP, ATTACH_F_BYPASS)),
        Status::Ok
    );
    assert_eq!(send(&d, &mut w, &map(1, 0, PG - 1, 0, RW)), Status::Inval);
    assert_eq!(send(&d, &mut w, &unmap(1, 0, PG - 1)), Status::Inval);
    // Bypass domain: identity.
    assert_eq!(
        runs(&d, EP, 0x1234_5678, 100, Perm::RW).unwrap(),
        vec![DmaRun {
            gpa: 0x1234_5678,
            len: 100
        }]
    );
}

#[test]
fn per_endpoint_reserved_region_is_refused_for_map() {
    let d = device();
    d.add_endpoint_with_resv(
        0x20,
        vec![ResvMem {
            subtype: RESV_MEM_T_RESERVED,
            start: 0x10_0000,
            end: 0x10_ffff,
        }],
    )
    .unwrap();
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, 0x20, 0)), Status::Ok);
    assert_eq!(
        send(&d, &mut w, &map(1, 0x10_f000, 0x10_ffff, 0, RW)),
        Status::Inval
    );
    assert_eq!(
        send(&d, &mut w, &map(1, 0x11_0000, 0x11_0fff, 0, RW)),
        Status::Ok
    );
    // Once that endpoint leaves, the region is free in that domain.
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    assert_eq!(send(&d, &mut w, &detach(1, 0x20)), Status::Ok);
    assert_eq!(
        send(&d, &mut w, &map(1, 0x10_f000, 0x10_ffff, 0, RW)),
        Status::Ok
    );
}

// ---------------------------------------------------------------- UNMAP

/// The spec's UNMAP examples, one page per unit.
#[test]
fn unmap_spec_examples() {
    let p = |n: u64| n * PG;
    let e = |n: u64| (n + 1) * PG - 1;
    let fresh = || {
        let d = device();
        let mut w = d.new_worker();
        assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
        (d, w)
    };
    let count = |d: &IommuDevice| d.domain_stats(1).unwrap().mappings;

    // (1) nothing mapped.
    let (d, mut w) = fresh();
    assert_eq!(send(&d, &mut w, &unmap(1, p(0), e(4))), Status::Ok);
    // (2) exact.
    let (d, mut w) = fresh();
    assert_eq!(send(&d, &mut w, &map(1, p(0), e(9), 0, RW)), Status::Ok);
    assert_eq!(send(&d, &mut w, &unmap(1, p(0), e(9))), Status::Ok);
    assert_eq!(count(&d), 0);
    // (3) two adjacent.
    let (d, mut w) = fresh();
    assert_eq!(send(&d, &mut w, &map(1, p(0), e(4), 0, RW)), Status::Ok);
    assert_eq!(send(&d, &mut w, &map(1, p(5), e(9), 0, RW)), Status::Ok);
    assert_eq!(send(&d, &mut w, &unmap(1, p(0), e(9))), Status::Ok);
    assert_eq!(count(&d), 0);
    // (4) would split: fails, removes nothing.
    let (d, mut w) = fresh();
    assert_eq!(send(&d, &mut w, &map(1, p(0), e(9), 0, RW)), Status::Ok);
    assert_eq!(send(&d, &mut w, &unmap(1, p(0), e(4))), Status::Range);
    assert_eq!(count(&d), 1);
    assert!(runs(&d, EP, p(2), 8, Perm::READ).is_ok());
    // (5) first of two.
    let (d, mut w) = fresh();
    assert_eq!(send(&d, &mut w, &map(1, p(0), e(4), 0, RW)), Status::Ok);
    assert_eq!(
        send(&d, &mut w, &map(1, p(5), e(9), p(100), RW)),
        Status::Ok
    );
    assert_eq!(send(&d, &mut w, &unmap(1, p(0), e(4))), Status::Ok);
    assert_eq!(count(&d), 1);
    assert!(runs(&d, EP, p(0), 8, Perm::READ).is_err());
    assert_eq!(runs(&d, EP, p(5), 8, Perm::READ).unwrap()[0].gpa, p(100));
    // (6) spill over.
    let (d, mut w) = fresh();
    assert_eq!(send(&d, &mut w, &map(1, p(0), e(4), 0, RW)), Status::Ok);
    assert_eq!(send(&d, &mut w, &unmap(1, p(0), e(9))), Status::Ok);
    assert_eq!(count(&d), 0);
    // (7) with a hole.
    let (d, mut w) = fresh();
    assert_eq!(send(&d, &mut w, &map(1, p(0), e(4), 0, RW)), Status::Ok);
    assert_eq!(send(&d, &mut w, &map(1, p(10), e(14), 0, RW)), Status::Ok);
    assert_eq!(send(&d, &mut w, &unmap(1, p(0), e(14))), Status::Ok);
    assert_eq!(count(&d), 0);
    // Tail overlap: last address inside a mapping.
    let (d, mut w) = fresh();
    assert_eq!(send(&d, &mut w, &map(1, p(5), e(9), 0, RW)), Status::Ok);
    assert_eq!(send(&d, &mut w, &unmap(1, p(0), e(6))), Status::Range);
    assert_eq!(count(&d), 1);
}

#[test]
fn unmap_status_paths() {
    let d = device();
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &unmap(1, 0, PG - 1)), Status::NoEnt);
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    assert_eq!(send(&d, &mut w, &unmap(1, PG, 0)), Status::Inval);
    assert_eq!(send(&d, &mut w, &unmap(1, 0, u64::MAX)), Status::Ok);
}

#[test]
fn unmap_completes_only_after_consumers_invalidated_once_per_kick() {
    let d = device_with(IommuConfig {
        space_impl: SpaceImpl::Scalable,
        ..Default::default()
    });
    let rec = Arc::new(Recorder::default());
    d.add_invalidator(rec.clone());
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    for i in 0..8u64 {
        assert_eq!(
            send(&d, &mut w, &map(1, i * PG, i * PG + PG - 1, i * PG, RW)),
            Status::Ok
        );
    }
    d.complete_kick(&mut w);
    rec.calls.lock().unwrap().clear();
    for i in 0..8u64 {
        assert_eq!(
            send(&d, &mut w, &unmap(1, i * PG, i * PG + PG - 1)),
            Status::Ok
        );
    }
    // Translation is already gone for new accesses; the consumers are told
    // at the end of the kick (not per request), once per domain.
    assert!(runs(&d, EP, 0, 8, Perm::READ).is_err());
    assert!(
        rec.calls.lock().unwrap().is_empty(),
        "invalidated before the flush"
    );
    d.complete_kick(&mut w);
    let calls = rec.calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].0, 1);
    let covered: u64 = calls[0].1.iter().map(|r| r.end() - r.start() + 1).sum();
    assert!(calls[0]
        .1
        .iter()
        .any(|r| r.contains(&0) && r.contains(&(8 * PG - 1))));
    assert_eq!(covered, 8 * PG, "{calls:?}");
}

// ---------------------------------------------------------------- PROBE

#[test]
fn probe_reports_msi_and_reserved_regions() {
    let extra = ResvMem {
        subtype: RESV_MEM_T_RESERVED,
        start: 0xa000_0000,
        end: 0xa00f_ffff,
    };
    let ep_only = ResvMem {
        subtype: RESV_MEM_T_RESERVED,
        start: 0x1_0000_0000,
        end: 0x1_0000_ffff,
    };
    let d = device_with(IommuConfig {
        reserved: vec![extra],
        ..Default::default()
    });
    d.add_endpoint_with_resv(0x30, vec![ep_only]).unwrap();
    let mut w = d.new_worker();

    let mut out = vec![0xeeu8; 512 + 4];
    assert_eq!(d.handle_request(&mut w, &probe(0x30), &mut out), 516);
    assert_eq!(out[512], Status::Ok as u8);
    let msi = ResvMem {
        subtype: RESV_MEM_T_MSI,
        start: 0xfee0_0000,
        end: 0xfeef_ffff,
    };
    assert_eq!(
        decode_probe_props(&out[..512]).unwrap(),
        vec![
            ProbeProp::ResvMem(msi),
            ProbeProp::ResvMem(extra),
            ProbeProp::ResvMem(ep_only)
        ]
    );
    // Remaining bytes zero (the NONE terminator).
    assert!(out[3 * RESV_MEM_PROP_SIZE..512].iter().all(|&b| b == 0));

    // Endpoint without its own regions: two properties.
    let mut out = vec![0xeeu8; 516];
    assert_eq!(d.handle_request(&mut w, &probe(EP), &mut out), 516);
    assert_eq!(decode_probe_props(&out[..512]).unwrap().len(), 2);

    // Unknown endpoint.
    let mut out = vec![0xeeu8; 516];
    assert_eq!(d.handle_request(&mut w, &probe(0x99), &mut out), 516);
    assert_eq!(out[512], Status::NoEnt as u8);

    // Buffer smaller than probe_size: INVAL, no property written.
    let mut out = vec![0xeeu8; 100];
    assert_eq!(d.handle_request(&mut w, &probe(EP), &mut out), 100);
    assert_eq!(out[96], Status::Inval as u8);
    assert!(out[..96].iter().all(|&b| b == 0xee));
}

#[test]
fn probe_size_must_hold_properties() {
    let r = IommuDevice::new(IommuConfig {
        probe_size: 16,
        ..Default::default()
    });
    assert!(r.is_err());
    let d = IommuDevice::new(IommuConfig {
        probe_size: u32::try_from(RESV_MEM_PROP_SIZE).unwrap(),
        ..Default::default()
    })
    .unwrap();
    let region = ResvMem {
        subtype: RESV_MEM_T_RESERVED,
        start: 0,
        end: 0xfff,
    };
    assert!(d.add_endpoint_with_resv(1, vec![region]).is_err());
    assert!(d.add_endpoint(1).is_ok());
    assert!(d.add_endpoint(1).is_err(), "duplicate endpoint");
}

// ---------------------------------------------------------------- bypass & faults

#[test]
fn unattached_endpoint_follows_bypass_field() {
    let d = device();
    // Default config: bypass off -> DOMAIN fault with an event.
    assert!(matches!(
        runs(&d, EP, 0x5000, 8, Perm::WRITE),
        Err(DmaFault::NotAttached { .. })
    ));
    let ev = FaultEvent::decode(&d.pop_fault_event().unwrap()).unwrap();
    assert_eq!(ev.reason, FAULT_R_DOMAIN);
    assert_eq!(ev.endpoint, EP);
    assert_eq!(ev.address, 0x5000);
    assert_eq!(ev.flags, FAULT_F_WRITE | FAULT_F_ADDRESS);
    assert!(d.pop_fault_event().is_none());

    d.write_config(CONFIG_BYPASS_OFFSET as u64, &[1]);
    assert_eq!(
        runs(&d, EP, 0x5000, 8, Perm::WRITE).unwrap(),
        vec![DmaRun {
            gpa: 0x5000,
            len: 8
        }]
    );
    // Attached endpoints are translated regardless of bypass.
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    assert!(runs(&d, EP, 0x5000, 8, Perm::WRITE).is_err());
    // Detached again: bypass.
    assert_eq!(send(&d, &mut w, &detach(1, EP)), Status::Ok);
    assert!(runs(&d, EP, 0x5000, 8, Perm::WRITE).is_ok());
}

#[test]
fn bypass_survives_device_reset_not_system_reset() {
    let d = device();
    d.write_config(CONFIG_BYPASS_OFFSET as u64, &[1]);
    d.reset();
    assert!(d.bypass());
    d.system_reset();
    assert!(!d.bypass());
}

#[test]
fn mapping_faults_report_reason_flags_and_address() {
    let d = device();
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    assert_eq!(
        send(&d, &mut w, &map(1, 0x10000, 0x10fff, 0x7000, MAP_F_READ)),
        Status::Ok
    );
    assert!(matches!(
        runs(&d, EP, 0x10000, 4, Perm::WRITE),
        Err(DmaFault::Permission {
            endpoint: EP,
            iova: 0x10000
        })
    ));
    let ev = FaultEvent::decode(&d.pop_fault_event().unwrap()).unwrap();
    assert_eq!(
        ev,
        FaultEvent {
            reason: FAULT_R_MAPPING,
            flags: FAULT_F_WRITE | FAULT_F_ADDRESS,
            endpoint: EP,
            address: 0x10000
        }
    );
    // Crossing the end of the mapping faults at the first unmapped byte.
    assert!(matches!(
        runs(&d, EP, 0x10ff0, 0x20, Perm::READ),
        Err(DmaFault::Unmapped { iova: 0x11000, .. })
    ));
    let ev = FaultEvent::decode(&d.pop_fault_event().unwrap()).unwrap();
    assert_eq!(ev.flags, FAULT_F_READ | FAULT_F_ADDRESS);
    assert_eq!(ev.address, 0x11000);
}

#[test]
fn translation_splits_into_physical_runs() {
    let d = device();
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    assert_eq!(
        send(&d, &mut w, &map(1, 0x0, 0xfff, 0x9000, RW)),
        Status::Ok
    );
    assert_eq!(
        send(&d, &mut w, &map(1, 0x1000, 0x2fff, 0x3000, RW)),
        Status::Ok
    );
    assert_eq!(
        runs(&d, EP, 0x800, 0x1000, Perm::READ).unwrap(),
        vec![
            DmaRun {
                gpa: 0x9800,
                len: 0x800
            },
            DmaRun {
                gpa: 0x3000,
                len: 0x800
            }
        ]
    );
    let dma = d.endpoint_dma(EP).unwrap();
    assert_eq!(
        dma.translate_contiguous(0x1100, 0x1000, Perm::READ),
        Ok(0x3100)
    );
    assert!(dma.translate_contiguous(0x800, 0x1000, Perm::READ).is_err());
    // A consumer's lookup: the reach ends with the mapping, the
    // permissions are the mapping's, and a miss is refused.
    let t = dma.lookup(0x1100, Perm::READ).unwrap();
    assert_eq!(
        (t.gpa, t.len, t.perm),
        (0x3100, 0x1f00, Perm::READ | Perm::WRITE)
    );
    assert_eq!(
        dma.lookup(0x3000, Perm::READ),
        Err(DmaFault::Unmapped {
            endpoint: EP,
            iova: 0x3000
        })
    );
    // Zero-length access touches nothing.
    assert_eq!(runs(&d, EP, 0x7000_0000, 0, Perm::READ).unwrap(), vec![]);
    // Wrapping access.
    assert!(matches!(
        runs(&d, EP, u64::MAX - 1, 4, Perm::READ),
        Err(DmaFault::Overflow { .. })
    ));
}

#[test]
fn fault_queue_is_bounded() {
    let d = device_with(IommuConfig {
        fault_queue_capacity: 4,
        ..Default::default()
    });
    for i in 0..100u64 {
        assert!(runs(&d, EP, i * PG, 1, Perm::READ).is_err());
    }
    assert_eq!(d.faults().len(), 4);
    assert_eq!(d.faults().dropped(), 96);
    let mut n = 0;
    while let Some(ev) = d.pop_fault_event() {
        assert_eq!(FaultEvent::decode(&ev).unwrap().address, n * PG);
        n += 1;
    }
    assert_eq!(n, 4);
}

// ---------------------------------------------------------------- limits

#[test]
fn domain_limit_gives_nomem() {
    let d = IommuDevice::new(IommuConfig {
        limits: DeviceLimits {
            max_domains: 2,
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap();
    all_features(&d);
    for ep in 0..4 {
        d.add_endpoint(ep).unwrap();
    }
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, 0, 0)), Status::Ok);
    assert_eq!(send(&d, &mut w, &attach(2, 1, 0)), Status::Ok);
    assert_eq!(send(&d, &mut w, &attach(3, 2, 0)), Status::NoMem);
    assert_eq!(d.endpoint_domain(2), None);
    // Joining an existing domain is fine.
    assert_eq!(send(&d, &mut w, &attach(2, 2, 0)), Status::Ok);
    // Moving the only member of domain 1 to a new domain frees its slot.
    assert_eq!(send(&d, &mut w, &attach(3, 0, 0)), Status::Ok);
    assert_eq!(d.domain_count(), 2);
    // Reset frees everything.
    d.reset();
    all_features(&d);
    assert_eq!(d.domain_count(), 0);
    assert_eq!(send(&d, &mut w, &attach(5, 3, 0)), Status::Ok);
}

#[test]
fn mapping_limit_gives_nomem() {
    let d = device_with(IommuConfig {
        limits: DeviceLimits {
            max_mappings_per_domain: 3,
            ..Default::default()
        },
        ..Default::default()
    });
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    for i in 0..3u64 {
        assert_eq!(
            send(&d, &mut w, &map(1, i * PG, i * PG + PG - 1, 0, RW)),
            Status::Ok
        );
    }
    assert_eq!(
        send(&d, &mut w, &map(1, 3 * PG, 4 * PG - 1, 0, RW)),
        Status::NoMem
    );
    assert_eq!(send(&d, &mut w, &unmap(1, 0, PG - 1)), Status::Ok);
    d.complete_kick(&mut w);
    assert_eq!(
        send(&d, &mut w, &map(1, 3 * PG, 4 * PG - 1, 0, RW)),
        Status::Ok
    );
    // The limit is per domain.
    assert_eq!(send(&d, &mut w, &attach(2, EP2, 0)), Status::Ok);
    assert_eq!(send(&d, &mut w, &map(2, 0, PG - 1, 0, RW)), Status::Ok);
}

#[test]
fn endpoint_limit() {
    let d = IommuDevice::new(IommuConfig {
        limits: DeviceLimits {
            max_endpoints: 2,
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap();
    d.add_endpoint(1).unwrap();
    d.add_endpoint(2).unwrap();
    assert!(d.add_endpoint(3).is_err());
    assert!(d.endpoint_dma(3).is_err());
}

// ---------------------------------------------------------------- reset

#[test]
fn reset_removes_domains_and_mappings() {
    let d = device();
    let rec = Arc::new(Recorder::default());
    d.add_invalidator(rec.clone());
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    assert_eq!(
        send(&d, &mut w, &attach(2, EP2, ATTACH_F_BYPASS)),
        Status::Ok
    );
    assert_eq!(
        send(&d, &mut w, &map(1, 0, 0xffff, 0x100000, RW)),
        Status::Ok
    );
    d.complete_kick(&mut w);
    rec.calls.lock().unwrap().clear();
    assert!(runs(&d, EP, 0, 4, Perm::READ).is_ok());
    d.reset();
    assert_eq!(d.domain_count(), 0);
    assert_eq!(d.endpoint_domain(EP), None);
    assert_eq!(d.endpoint_domain(EP2), None);
    assert_eq!(d.acked_features(), 0);
    // Consumers were invalidated for domain 1 before reset returned.
    assert!(rec
        .calls
        .lock()
        .unwrap()
        .iter()
        .any(|(dom, r)| *dom == 1 && r.iter().any(|r| r.contains(&0))));
    // Unattached, bypass off: blocked.
    assert!(runs(&d, EP, 0, 4, Perm::READ).is_err());
    assert!(runs(&d, EP2, 0, 4, Perm::READ).is_err());
}

// ---------------------------------------------------------------- concurrency

#[test]
fn two_queues_map_and_unmap_the_same_domain() {
    let d = Arc::new(device());
    {
        let mut w = d.new_worker();
        assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
        // A mapping that stays while the queues churn around it.
        assert_eq!(
            send(
                &d,
                &mut w,
                &map(1, 0x7000_0000, 0x7000_ffff, 0x2000_0000, RW)
            ),
            Status::Ok
        );
        d.complete_kick(&mut w);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (d, stop) = (Arc::clone(&d), Arc::clone(&stop));
        std::thread::spawn(move || {
            let dma = d.endpoint_dma(EP).unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) || n == 0 {
                let off = (n % 16) * PG;
                assert_eq!(
                    dma.translate_contiguous(0x7000_0000 + off, PG, Perm::RW),
                    Ok(0x2000_0000 + off)
                );
                n += 1;
            }
            n
        })
    };
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let d = Arc::clone(&d);
            std::thread::spawn(move || {
                let mut w = d.new_worker();
                let base = t << 32;
                for round in 0..50u64 {
                    for i in 0..16u64 {
                        let iova = base + (round % 4) * 0x100_0000 + i * PG;
                        assert_eq!(
                            send(&d, &mut w, &map(1, iova, iova + PG - 1, iova, RW)),
                            Status::Ok
                        );
                    }
                    d.complete_kick(&mut w);
                    let dma = d.endpoint_dma(EP).unwrap();
                    let iova = base + (round % 4) * 0x100_0000;
                    assert_eq!(dma.translate_contiguous(iova, 16 * PG, Perm::RW), Ok(iova));
                    for i in 0..16u64 {
                        let iova = base + (round % 4) * 0x100_0000 + i * PG;
                        assert_eq!(send(&d, &mut w, &unmap(1, iova, iova + PG - 1)), Status::Ok);
                    }
                    d.complete_kick(&mut w);
                }
                // Leave 10 mappings behind per thread.
                for i in 0..10u64 {
                    let iova = base + i * PG;
                    assert_eq!(
                        send(&d, &mut w, &map(1, iova, iova + PG - 1, 0, RW)),
                        Status::Ok
                    );
                }
                d.complete_kick(&mut w);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    let s = d.domain_stats(1).unwrap();
    assert_eq!(s.mappings, 21);
    assert_eq!(s.mapped_bytes, 20 * PG + 0x10000);
    assert_eq!(d.faults().reported(), 0);
}

#[test]
fn both_space_impls_behave_alike() {
    for imp in [SpaceImpl::Scalable, SpaceImpl::Baseline] {
        let d = device_with(IommuConfig {
            space_impl: imp,
            ..Default::default()
        });
        let mut w = d.new_worker();
        assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
        assert_eq!(send(&d, &mut w, &map(1, 0, 0x3fff, 0x8000, RW)), Status::Ok);
        assert_eq!(
            send(&d, &mut w, &map(1, 0x2000, 0x2fff, 0, RW)),
            Status::Inval,
            "{imp}"
        );
        assert_eq!(
            send(&d, &mut w, &unmap(1, 0, 0x1fff)),
            Status::Range,
            "{imp}"
        );
        assert_eq!(runs(&d, EP, 0x3000, 4, Perm::READ).unwrap()[0].gpa, 0xb000);
        assert_eq!(send(&d, &mut w, &unmap(1, 0, 0x3fff)), Status::Ok);
        d.complete_kick(&mut w);
        assert_eq!(d.domain_stats(1).unwrap().mappings, 0);
    }
}

#[test]
fn domain_teardown_is_invalidated_before_its_id_can_be_reused() {
    let d = device();
    let rec = Arc::new(Recorder::default());
    d.add_invalidator(rec.clone());
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    assert_eq!(
        send(&d, &mut w, &map(1, 0x4000, 0x4fff, 0x8000, RW)),
        Status::Ok
    );
    d.complete_kick(&mut w);
    rec.calls.lock().unwrap().clear();
    // Same kick: destroy domain 1, recreate it, map the same IOVA again.
    assert_eq!(send(&d, &mut w, &detach(1, EP)), Status::Ok);
    let after_detach = rec.calls.lock().unwrap().clone();
    assert!(
        after_detach
            .iter()
            .any(|(dom, r)| *dom == 1 && r.iter().any(|r| r.contains(&0x4000))),
        "teardown not invalidated at once: {after_detach:?}"
    );
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    assert_eq!(
        send(&d, &mut w, &map(1, 0x4000, 0x4fff, 0x9000, RW)),
        Status::Ok
    );
    let n = rec.calls.lock().unwrap().len();
    d.complete_kick(&mut w);
    // Nothing was unmapped after the teardown: no further invalidation of
    // the new domain's mapping.
    assert_eq!(rec.calls.lock().unwrap().len(), n);
    assert_eq!(
        runs(&d, EP, 0x4000, 4, Perm::READ).unwrap(),
        vec![DmaRun {
            gpa: 0x9000,
            len: 4
        }]
    );
}

/// Records endpoint moves.
#[derive(Default)]
struct Moves(Mutex<Vec<Move>>);

/// (endpoint, from, to)
type Move = (u32, Option<u32>, Option<u32>);

impl EndpointListener for Moves {
    fn endpoint_moved(&self, endpoint: u32, from: Option<u32>, to: Option<u32>) {
        self.0.lock().unwrap().push((endpoint, from, to));
    }
}

#[test]
fn endpoint_listeners_see_every_move_before_completion() {
    let d = device();
    let moves = Arc::new(Moves::default());
    d.add_endpoint_listener(moves.clone());
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    assert_eq!(send(&d, &mut w, &attach(1, EP2, 0)), Status::Ok);
    // Re-attach to the same domain and failed requests are not moves.
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    assert_eq!(send(&d, &mut w, &detach(7, EP)), Status::Inval);
    // EP leaves domain 1, which lives on with EP2: nothing is unmapped, but
    // EP's consumers are told before the request returns.
    assert_eq!(send(&d, &mut w, &attach(2, EP, 0)), Status::Ok);
    assert_eq!(
        moves.0.lock().unwrap().last(),
        Some(&(EP, Some(1), Some(2)))
    );
    assert_eq!(send(&d, &mut w, &detach(2, EP)), Status::Ok);
    d.reset();
    let got = moves.0.lock().unwrap().clone();
    assert_eq!(
        got,
        vec![
            (EP, None, Some(1)),
            (EP2, None, Some(1)),
            (EP, Some(1), Some(2)),
            (EP, Some(2), None),
            (EP2, Some(1), None),
        ]
    );
}

#[test]
fn domain_lookup_cache_follows_registry_changes() {
    let d = Arc::new(device());
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    // This thread now has domain 1 in its lookup cache.
    assert_eq!(send(&d, &mut w, &map(1, 0, 0xfff, 0x1000, RW)), Status::Ok);
    // Another queue destroys domain 1 and creates a new domain 1.
    {
        let d = Arc::clone(&d);
        std::thread::spawn(move || {
            let mut w = d.new_worker();
            assert_eq!(send(&d, &mut w, &detach(1, EP)), Status::Ok);
            assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
            d.complete_kick(&mut w);
        })
        .join()
        .unwrap();
    }
    // The same IOVA maps fine: the request reached the new, empty domain.
    assert_eq!(send(&d, &mut w, &map(1, 0, 0xfff, 0x5000, RW)), Status::Ok);
    assert_eq!(runs(&d, EP, 0, 4, Perm::READ).unwrap()[0].gpa, 0x5000);
    // Another device on the same thread with the same domain id.
    let d2 = device();
    let mut w2 = d2.new_worker();
    assert_eq!(send(&d2, &mut w2, &map(1, 0, 0xfff, 0, RW)), Status::NoEnt);
    assert_eq!(send(&d2, &mut w2, &attach(1, EP, 0)), Status::Ok);
    assert_eq!(
        send(&d2, &mut w2, &map(1, 0, 0xfff, 0x7000, RW)),
        Status::Ok
    );
    assert_eq!(send(&d, &mut w, &map(1, 0, 0xfff, 0, RW)), Status::Inval);
    assert_eq!(runs(&d2, EP, 0, 4, Perm::READ).unwrap()[0].gpa, 0x7000);
    assert_eq!(runs(&d, EP, 0, 4, Perm::READ).unwrap()[0].gpa, 0x5000);
    // Reset empties the registry: cached domains are not used afterwards.
    d.reset();
    all_features(&d);
    assert_eq!(send(&d, &mut w, &map(1, 0, 0xfff, 0, RW)), Status::NoEnt);
}

/// A MAP as a mirror hears it: (domain, iova, last, gpa, perm).
type Mapped = (u32, u64, u64, u64, Perm);

/// Records what a mirroring consumer is told; refuses MAPs whose IOVA is
/// `refuse`.
#[derive(Default)]
struct MirrorLog {
    moved: Mutex<Vec<(u32, Option<u32>, bool)>>,
    mapped: Mutex<Vec<Mapped>>,
    refuse: Option<u64>,
}

impl MapMirror for MirrorLog {
    fn endpoint_moved(&self, endpoint: u32, to: Option<u32>, identity: bool) {
        self.moved.lock().unwrap().push((endpoint, to, identity));
    }
    fn mapped(
        &self,
        domain: u32,
        iova: u64,
        last: u64,
        gpa: u64,
        perm: Perm,
    ) -> Result<(), MirrorError> {
        if self.refuse == Some(iova) {
            return Err(MirrorError("no room".into()));
        }
        self.mapped
            .lock()
            .unwrap()
            .push((domain, iova, last, gpa, perm));
        Ok(())
    }
}

/// A mirror hears every attachment (with whether the domain is an identity
/// one) and every MAP before it completes; a MAP it cannot follow is undone
/// and answered S_NOMEM, and the undo reaches the invalidators.
#[test]
fn mirrors_follow_attachments_and_maps_and_can_refuse_a_map() {
    let d = device();
    let log = Arc::new(MirrorLog {
        refuse: Some(0x20_0000),
        ..MirrorLog::default()
    });
    d.add_map_mirror(log.clone());
    let rec = Arc::new(Recorder::default());
    d.add_invalidator(rec.clone());
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    assert_eq!(
        send(
            &d,
            &mut w,
            &map(1, 0x10_0000, 0x10_1fff, 0x4000, MAP_F_READ)
        ),
        Status::Ok
    );
    assert_eq!(
        *log.mapped.lock().unwrap(),
        vec![(1, 0x10_0000, 0x10_1fff, 0x4000, Perm::READ)]
    );
    // Refused: nothing stays in the table and the undo is invalidated.
    assert_eq!(
        send(&d, &mut w, &map(1, 0x20_0000, 0x20_0fff, 0x8000, RW)),
        Status::NoMem
    );
    d.complete_kick(&mut w);
    assert!(runs(&d, EP, 0x20_0000, 16, Perm::READ).is_err());
    assert!(rec
        .calls
        .lock()
        .unwrap()
        .iter()
        .any(|(dom, r)| *dom == 1 && r.iter().any(|r| r.contains(&0x20_0000))));
    assert_eq!(
        send(&d, &mut w, &attach(2, EP, ATTACH_F_BYPASS)),
        Status::Ok
    );
    assert_eq!(send(&d, &mut w, &detach(2, EP)), Status::Ok);
    assert_eq!(
        *log.moved.lock().unwrap(),
        vec![(EP, Some(1), false), (EP, Some(2), true), (EP, None, false)]
    );
}

/// `request_counts` (the API's `vm.counters`) counts every request of every
/// worker by type, the failed ones, and one invalidation batch per kick
/// that unmapped something, with the consumer calls it made.
#[test]
fn request_counts_follow_requests_and_batches() {
    let d = device();
    let rec = Arc::new(Recorder::default());
    d.add_invalidator(rec.clone());
    let mut w1 = d.new_worker();
    let mut w2 = d.new_worker();
    assert_eq!(send(&d, &mut w1, &attach(1, EP, 0)), Status::Ok);
    assert_eq!(send(&d, &mut w1, &map(1, 0, PG - 1, 0, 3)), Status::Ok);
    assert_eq!(
        send(&d, &mut w2, &map(1, PG, 2 * PG - 1, PG, 3)),
        Status::Ok
    );
    // Overlaps an existing mapping: an error status, still a MAP.
    assert_ne!(send(&d, &mut w2, &map(1, 0, PG - 1, 0, 3)), Status::Ok);
    d.complete_kick(&mut w2);
    assert_eq!(send(&d, &mut w1, &unmap(1, 0, 2 * PG - 1)), Status::Ok);
    d.complete_kick(&mut w1);
    // A kick without UNMAP is no batch.
    d.complete_kick(&mut w1);
    let mut bad = attach(1, EP, 0);
    bad[0] = 0x7f;
    let mut out = [0u8; 4];
    assert_eq!(d.handle_request(&mut w1, &bad, &mut out), 0);
    let c = d.request_counts();
    assert_eq!(
        (c.attach, c.map, c.unmap, c.detach, c.probe),
        (1, 3, 1, 0, 0)
    );
    assert_eq!(c.failed, 2, "the overlapping MAP and the unknown type");
    assert_eq!(c.invalidation_batches, 1);
    assert_eq!(c.invalidator_calls, 1, "one consumer, one domain");
    // A worker's counts outlive it.
    drop(w1);
    drop(w2);
    assert_eq!(d.request_counts(), c);
}

// ---------------------------------------------------------------- hot-unplug

/// An unplugged endpoint leaves its domain as a DETACH would: the last
/// member's departure clears the domain's mappings and invalidates them
/// in its consumers before `remove_endpoint` returns; requests naming it
/// answer NOENT afterwards; a consumer removed from the device is no
/// longer called.
#[test]
fn removed_endpoint_leaves_its_domain_and_is_unknown() {
    let d = device();
    let rec = Arc::new(Recorder::default());
    let as_inv: Arc<dyn Invalidator> = rec.clone();
    d.add_invalidator(as_inv.clone());
    let mut w = d.new_worker();
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::Ok);
    assert_eq!(
        send(&d, &mut w, &map(1, 0, PG - 1, 0x10_0000, RW)),
        Status::Ok
    );
    d.complete_kick(&mut w);
    assert!(runs(&d, EP, 0, PG, Perm::READ).is_ok());
    let dma = d.endpoint_dma(EP).unwrap();

    d.remove_endpoint(EP).unwrap();
    let calls = rec.calls.lock().unwrap().clone();
    assert_eq!(calls, vec![(1, vec![0..=PG - 1])], "teardown invalidated");
    assert!(
        dma.lookup(0, Perm::READ).is_err(),
        "old handle translates nothing"
    );
    assert!(d.endpoint_dma(EP).is_err());
    assert_eq!(send(&d, &mut w, &attach(1, EP, 0)), Status::NoEnt);
    assert!(matches!(
        d.remove_endpoint(EP),
        Err(virtio_iommu::device::DeviceError::UnknownEndpoint(EP))
    ));
    // The id can be registered again (a function plugged into the slot).
    d.add_endpoint(EP).unwrap();
    assert_eq!(send(&d, &mut w, &attach(2, EP, 0)), Status::Ok);

    assert!(d.remove_invalidator(&as_inv));
    assert!(!d.remove_invalidator(&as_inv), "only once");
    assert_eq!(
        send(&d, &mut w, &map(2, 0, PG - 1, 0x10_0000, RW)),
        Status::Ok
    );
    assert_eq!(send(&d, &mut w, &unmap(2, 0, PG - 1)), Status::Ok);
    d.complete_kick(&mut w);
    assert_eq!(
        rec.calls.lock().unwrap().len(),
        1,
        "removed consumer not called"
    );
}
