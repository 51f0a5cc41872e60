//! Fuzz target: arbitrary bytes drive one virtio-iommu device through a
//! sequence of requests (well-formed and raw), kicks, DMA translations,
//! config writes, feature changes and resets, from two queue workers.
//!
//! Checked on every step, besides "nothing panics":
//! - the used length is 0 or at least one tail and never exceeds the
//!   writable buffer; a written status is a spec status code;
//! - after a successful MAP, every endpoint attached to that domain
//!   translates the first and last byte to the requested guest-physical
//!   addresses with the requested permissions;
//! - after a successful UNMAP, no endpoint of that domain reaches its first
//!   or last byte;
//! - an unattached endpoint is identity-mapped exactly when `bypass` is 1;
//! - live domains, mappings per domain and pending fault events stay within
//!   their configured bounds.

#![no_main]

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};

use libfuzzer_sys::fuzz_target;
use virtio_iommu::device::{DeviceLimits, EndpointListener, IommuConfig, IommuDevice};
use virtio_iommu::mapping::{Invalidator, Perm, SpaceImpl, QueueContext};
use virtio_iommu::wire::*;

/// Mirrors endpoint attachment from listener calls; each call must start
/// where the previous one for that endpoint ended.
#[derive(Default)]
struct Mirror(Mutex<HashMap<u32, Option<u32>>>);

impl EndpointListener for Mirror {
    fn endpoint_moved(&self, endpoint: u32, from: Option<u32>, to: Option<u32>) {
        assert_ne!(from, to);
        let mut m = self.0.lock().unwrap();
        let prev = m.insert(endpoint, to).unwrap_or(None);
        assert_eq!(prev, from, "listener chain broken for {endpoint:#x}");
    }
}

/// Checks invalidation calls are well-formed.
struct CheckRanges;

impl Invalidator for CheckRanges {
    fn invalidate(&self, _domain: u32, ranges: &[RangeInclusive<u64>]) {
        assert!(!ranges.is_empty());
        for r in ranges {
            assert!(r.start() <= r.end());
        }
    }
}

const ENDPOINTS: [u32; 4] = [0x8, 0x10, 0x18, 0x100];
const MAX_DOMAINS: u32 = 4;
const MAX_MAPPINGS: u64 = 64;
const FAULT_CAP: usize = 8;
const PG: u64 = 4096;

/// Byte source that yields zeros once exhausted.
struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Input<'_> {
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        (u64::from(self.u32()) << 32) | u64::from(self.u32())
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u8()).collect()
    }
    /// A domain id: mostly a small set (so domains are shared), sometimes any.
    fn domain(&mut self) -> u32 {
        let b = self.u8();
        if b < 0xf0 {
            u32::from(b % 6)
        } else {
            self.u32()
        }
    }
    fn endpoint(&mut self) -> u32 {
        let b = self.u8();
        match ENDPOINTS.get(usize::from(b % 5)) {
            Some(&e) => e,
            None => self.u32(),
        }
    }
    /// An address: mostly small page-aligned IOVAs, sometimes anything.
    fn addr(&mut self) -> u64 {
        match self.u8() % 4 {
            0 => self.u64(),
            1 => u64::from(self.u16()) * PG + u64::from(self.u8() % 2) * 0x800,
            _ => u64::from(self.u8() % 64) * PG,
        }
    }
}

/// Sends a request and checks the framing invariants; returns the status
/// if one was written at the start of the buffer.
fn send(d: &IommuDevice, w: &mut QueueContext, req: &[u8], wlen: usize) -> Option<Status> {
    let mut out = vec![0xa5u8; wlen];
    let n = d.handle_request(w, req, &mut out);
    assert!(n <= wlen, "used length {n} > writable {wlen}");
    assert!(n == 0 || n >= TAIL_SIZE, "used length {n}");
    if n == 0 {
        assert!(out.iter().all(|&b| b == 0xa5), "wrote with used length 0");
        return None;
    }
    let tail = &out[n - TAIL_SIZE..n];
    let st = Status::from_u8(tail[0]);
    assert!(st.is_some(), "bad status {}", tail[0]);
    assert_eq!(&tail[1..], &[0, 0, 0]);
    st
}

fn attached_to(d: &IommuDevice, domain: u32) -> Vec<u32> {
    ENDPOINTS
        .iter()
        .copied()
        .filter(|&e| d.endpoint_domain(e) == Some(domain))
        .collect()
}

fn check_bounds(d: &IommuDevice) {
    assert!(d.domain_count() <= MAX_DOMAINS as usize);
    for dom in 0..6 {
        if let Some(s) = d.domain_stats(dom) {
            assert!(s.mappings <= MAX_MAPPINGS);
        }
    }
    assert!(d.faults().len() <= FAULT_CAP);
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input { data, pos: 0 };
    let space_impl = if inp.u8() & 1 == 0 {
        SpaceImpl::Scalable
    } else {
        SpaceImpl::Baseline
    };
    let Ok(d) = IommuDevice::new(IommuConfig {
        domain_start: 0,
        domain_end: 1000,
        bypass: inp.u8() & 1 == 1,
        limits: DeviceLimits {
            max_domains: MAX_DOMAINS,
            max_endpoints: 16,
            max_mappings_per_domain: MAX_MAPPINGS,
            max_table_bytes_per_domain: 1 << 20,
        },
        space_impl,
        num_request_queues: 2,
        fault_queue_capacity: FAULT_CAP,
        fault_logs_per_sec: 0,
        ..Default::default()
    }) else {
        panic!("valid config rejected");
    };
    for e in ENDPOINTS {
        assert!(d.add_endpoint(e).is_ok());
    }
    let mirror = Arc::new(Mirror::default());
    d.add_endpoint_listener(mirror.clone());
    d.add_invalidator(Arc::new(CheckRanges));
    d.ack_features(d.device_features());
    let mut workers = [d.new_worker(), d.new_worker()];
    let mut cur = 0usize;

    let mut steps = 0;
    while !inp.done() && steps < 2000 {
        steps += 1;
        let op = inp.u8();
        let w = &mut workers[cur];
        match op % 12 {
            0 => {
                let (dom, ep) = (inp.domain(), inp.endpoint());
                let flags = u32::from(inp.u8() % 4 == 0);
                let st = send(
                    &d,
                    w,
                    &Request::Attach(AttachReq {
                        domain: dom,
                        endpoint: ep,
                        flags,
                        reserved: [0; 4],
                    })
                    .encode(),
                    4,
                );
                if st == Some(Status::Ok) {
                    assert_eq!(d.endpoint_domain(ep), Some(dom));
                }
            }
            1 => {
                let (dom, ep) = (inp.domain(), inp.endpoint());
                let st = send(
                    &d,
                    w,
                    &Request::Detach(DetachReq {
                        domain: dom,
                        endpoint: ep,
                    })
                    .encode(),
                    4,
                );
                if st == Some(Status::Ok) {
                    assert_eq!(d.endpoint_domain(ep), None);
                }
            }
            2 => {
                let dom = inp.domain();
                let start = inp.addr();
                let pages = u64::from(inp.u8() % 8) + 1;
                let end = if inp.u8() == 0 {
                    inp.u64()
                } else {
                    start.wrapping_add(pages * PG - 1)
                };
                let gpa = inp.addr();
                let flags = u32::from(inp.u8() % 9);
                let st = send(
                    &d,
                    w,
                    &Request::Map(MapReq {
                        domain: dom,
                        virt_start: start,
                        virt_end: end,
                        phys_start: gpa,
                        flags,
                    })
                    .encode(),
                    4,
                );
                if st == Some(Status::Ok) {
                    let perm = Perm::from_bits_truncate(flags).intersection(Perm::RW);
                    for ep in attached_to(&d, dom) {
                        let dma = d.endpoint_dma(ep).unwrap();
                        for (iova, want) in [(start, gpa), (end, gpa + (end - start))] {
                            if perm.is_empty() {
                                continue;
                            }
                            let got = dma.translate_contiguous(iova, 1, perm);
                            assert_eq!(
                                got,
                                Ok(want),
                                "MAP {start:#x}-{end:#x} -> {gpa:#x} ep {ep:#x}"
                            );
                        }
                    }
                }
            }
            3 => {
                let dom = inp.domain();
                let start = inp.addr();
                let end = start.wrapping_add(u64::from(inp.u8() % 16) * PG + PG - 1);
                let st = send(
                    &d,
                    w,
                    &Request::Unmap(UnmapReq {
                        domain: dom,
                        virt_start: start,
                        virt_end: end,
                    })
                    .encode(),
                    4,
                );
                if st == Some(Status::Ok) && end >= start {
                    for ep in attached_to(&d, dom) {
                        let dma = d.endpoint_dma(ep).unwrap();
                        for iova in [start, end] {
                            let r: Result<Vec<_>, _> = dma.translate(iova, 1, Perm::READ).collect();
                            assert!(
                                r.is_err(),
                                "UNMAP {start:#x}-{end:#x} left {iova:#x} reachable"
                            );
                        }
                    }
                }
            }
            4 => {
                let ep = inp.endpoint();
                let wlen = match inp.u8() % 3 {
                    0 => usize::from(inp.u16() % 1024),
                    _ => 512 + 4,
                };
                send(
                    &d,
                    w,
                    &Request::Probe(ProbeReq { endpoint: ep }).encode(),
                    wlen,
                );
            }
            5 => {
                // Raw request bytes.
                let rlen = usize::from(inp.u8() % 80);
                let mut raw = inp.bytes(rlen);
                if let Some(t) = raw.first_mut() {
                    if inp.u8() % 2 == 0 {
                        *t = *t % 6;
                    }
                }
                let wlen = usize::from(inp.u16() % 600);
                send(&d, w, &raw, wlen);
            }
            6 => d.complete_kick(w),
            7 => {
                let ep = inp.endpoint();
                let iova = inp.addr();
                let len = u64::from(inp.u16());
                let access = Perm::from_bits_truncate(u32::from(inp.u8() % 4));
                let Ok(dma) = d.endpoint_dma(ep) else {
                    assert!(!ENDPOINTS.contains(&ep));
                    continue;
                };
                let r: Result<Vec<_>, _> = dma.translate(iova, len, access).collect();
                if let Ok(runs) = &r {
                    let total: u64 = runs.iter().map(|r| r.len).sum();
                    assert_eq!(total, len);
                }
                if d.endpoint_domain(ep).is_none() && len > 0 && iova.checked_add(len - 1).is_some()
                {
                    assert_eq!(r.is_ok(), d.bypass(), "bypass semantics");
                }
            }
            8 => {
                let v = inp.u8();
                d.write_config(u64::from(inp.u8() % 48), &[v, inp.u8()]);
                let mut buf = [0u8; 48];
                d.read_config(u64::from(inp.u8()), &mut buf);
                let mut b = [0u8; 1];
                d.read_config(CONFIG_BYPASS_OFFSET as u64, &mut b);
                assert!(b[0] <= 1);
            }
            9 => {
                let mask = inp.u64();
                d.ack_features(d.device_features() & (mask | feature::bit(feature::MAP_UNMAP)));
            }
            10 => {
                if inp.u8() % 8 == 0 {
                    d.reset();
                    assert_eq!(d.domain_count(), 0);
                    d.ack_features(d.device_features());
                }
            }
            _ => {
                cur ^= 1;
                let _ = d.pop_fault_event();
            }
        }
        check_bounds(&d);
        let m = mirror.0.lock().unwrap();
        for e in ENDPOINTS {
            assert_eq!(m.get(&e).copied().flatten(), d.endpoint_domain(e));
        }
    }
    for w in &mut workers {
        d.complete_kick(w);
    }
});
