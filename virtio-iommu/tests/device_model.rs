//! Model-based property test of the device: random sequences of ATTACH,
//! DETACH, MAP, UNMAP, kicks, translations and resets, sent as wire bytes,
//! are checked status by status and translation by translation against a
//! small executable model of the spec's semantics (domains live while they
//! have endpoints, attach moves an endpoint, UNMAP removes whole mappings or
//! fails with S_RANGE without removing anything, limits give S_NOMEM).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proptest::prelude::*;
use virtio_iommu::device::{DeviceLimits, IommuConfig, IommuDevice};
use virtio_iommu::mapping::{Perm, SpaceImpl};
use virtio_iommu::wire::*;

const PG: u64 = 4096;
const EPS: [u32; 3] = [1, 2, 3];
const DOMAIN_END: u32 = 5;
const MAX_DOMAINS: u32 = 3;
const MAX_MAPS: usize = 6;

#[derive(Debug, Clone)]
enum Op {
    Attach {
        dom: u32,
        ep: u32,
        bypass: bool,
    },
    Detach {
        dom: u32,
        ep: u32,
    },
    Map {
        dom: u32,
        pg: u64,
        pages: u64,
        gpa_pg: u64,
        flags: u32,
    },
    Unmap {
        dom: u32,
        pg: u64,
        pages: u64,
    },
    Kick,
    Translate {
        ep: u32,
        pg: u64,
    },
    Reset,
}

fn op() -> impl Strategy<Value = Op> {
    let dom = 0u32..=DOMAIN_END + 1;
    let ep = 0u32..=4;
    prop_oneof![
        3 => (dom.clone(), ep.clone(), prop::bool::weighted(0.2))
            .prop_map(|(dom, ep, bypass)| Op::Attach { dom, ep, bypass }),
        1 => (dom.clone(), ep.clone()).prop_map(|(dom, ep)| Op::Detach { dom, ep }),
        6 => (dom.clone(), 0u64..24, 1u64..5, 0u64..1000, 0u32..8)
            .prop_map(|(dom, pg, pages, gpa_pg, flags)| Op::Map { dom, pg, pages, gpa_pg, flags }),
        4 => (dom, 0u64..24, 1u64..8).prop_map(|(dom, pg, pages)| Op::Unmap { dom, pg, pages }),
        1 => Just(Op::Kick),
        4 => (ep, 0u64..30).prop_map(|(ep, pg)| Op::Translate { ep, pg }),
        1 => prop::bool::weighted(0.2).prop_map(|_| Op::Reset),
    ]
}

#[derive(Default)]
struct MDomain {
    bypass: bool,
    members: BTreeSet<u32>,
    /// first page -> (last page, gpa page, flags)
    maps: BTreeMap<u64, (u64, u64, u32)>,
}

#[derive(Default)]
struct Model {
    eps: HashMap<u32, Option<u32>>,
    domains: HashMap<u32, MDomain>,
}

impl Model {
    fn new() -> Self {
        let mut m = Model::default();
        for e in EPS {
            m.eps.insert(e, None);
        }
        m
    }

    fn leave(&mut self, ep: u32) {
        if let Some(Some(old)) = self.eps.get(&ep).copied() {
            let d = self.domains.get_mut(&old).unwrap();
            d.members.remove(&ep);
            if d.members.is_empty() {
                self.domains.remove(&old);
            }
        }
        self.eps.insert(ep, None);
    }

    fn attach(&mut self, dom: u32, ep: u32, bypass: bool) -> Status {
        let Some(&old) = self.eps.get(&ep) else {
            return Status::NoEnt;
        };
        if dom > DOMAIN_END {
            return Status::Range;
        }
        if let Some(d) = self.domains.get(&dom) {
            if d.bypass != bypass {
                return Status::Inval;
            }
            if old == Some(dom) {
                return Status::Ok;
            }
        } else {
            let freed = old.is_some_and(|o| self.domains[&o].members.len() == 1);
            if self.domains.len() - usize::from(freed) >= MAX_DOMAINS as usize {
                return Status::NoMem;
            }
        }
        self.leave(ep);
        let d = self.domains.entry(dom).or_insert_with(|| MDomain {
            bypass,
            ..Default::default()
        });
        d.members.insert(ep);
        self.eps.insert(ep, Some(dom));
        Status::Ok
    }

    fn detach(&mut self, dom: u32, ep: u32) -> Status {
        let Some(&cur) = self.eps.get(&ep) else {
            return Status::NoEnt;
        };
        if cur != Some(dom) {
            return Status::Inval;
        }
        self.leave(ep);
        Status::Ok
    }

    /// Returns the acceptable statuses (more than one only where the spec
    /// leaves the precedence of two simultaneous errors open).
    fn map(&mut self, dom: u32, first: u64, last: u64, gpa: u64, flags: u32) -> Vec<Status> {
        let Some(d) = self.domains.get_mut(&dom) else {
            return vec![Status::NoEnt];
        };
        if d.bypass {
            return vec![Status::Inval];
        }
        let overlap = d
            .maps
            .range(..=last)
            .next_back()
            .is_some_and(|(_, &(l, _, _))| l >= first);
        let full = d.maps.len() >= MAX_MAPS;
        match (overlap, full) {
            (true, true) => vec![Status::Inval, Status::NoMem],
            (true, false) => vec![Status::Inval],
            (false, true) => vec![Status::NoMem],
            (false, false) => {
                d.maps.insert(first, (last, gpa, flags));
                vec![Status::Ok]
            }
        }
    }

    fn unmap(&mut self, dom: u32, first: u64, last: u64) -> Status {
        let Some(d) = self.domains.get_mut(&dom) else {
            return Status::NoEnt;
        };
        if d.bypass {
            return Status::Inval;
        }
        let hit: Vec<(u64, u64)> = d
            .maps
            .iter()
            .filter(|(&f, &(l, _, _))| f <= last && l >= first)
            .map(|(&f, &(l, _, _))| (f, l))
            .collect();
        if hit.iter().any(|&(f, l)| f < first || l > last) {
            return Status::Range;
        }
        for (f, _) in hit {
            d.maps.remove(&f);
        }
        Status::Ok
    }

    /// Expected guest-physical page for a READ of `pg` by `ep`.
    fn translate(&self, ep: u32, pg: u64) -> Option<u64> {
        let dom = (*self.eps.get(&ep)?)?;
        let d = &self.domains[&dom];
        if d.bypass {
            return Some(pg);
        }
        let (&f, &(l, gpa, flags)) = d.maps.range(..=pg).next_back()?;
        (pg <= l && flags & MAP_F_READ != 0).then(|| gpa + (pg - f))
    }
}

fn send(d: &IommuDevice, w: &mut virtio_iommu::mapping::QueueContext, req: Request) -> Status {
    let mut out = [0u8; 4];
    assert_eq!(d.handle_request(w, &req.encode(), &mut out), 4);
    Status::from_u8(out[0]).unwrap()
}

fn run(space_impl: SpaceImpl, ops: &[Op]) -> Result<(), TestCaseError> {
    let d = IommuDevice::new(IommuConfig {
        domain_start: 0,
        domain_end: DOMAIN_END,
        space_impl,
        limits: DeviceLimits {
            max_domains: MAX_DOMAINS,
            max_mappings_per_domain: MAX_MAPS as u64,
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap();
    for e in EPS {
        d.add_endpoint(e).unwrap();
    }
    d.ack_features(d.device_features());
    let mut w = d.new_worker();
    let mut m = Model::new();

    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Attach { dom, ep, bypass } => {
                let got = send(
                    &d,
                    &mut w,
                    Request::Attach(AttachReq {
                        domain: dom,
                        endpoint: ep,
                        flags: u32::from(bypass),
                        reserved: [0; 4],
                    }),
                );
                prop_assert_eq!(got, m.attach(dom, ep, bypass), "step {} {:?}", i, op);
            }
            Op::Detach { dom, ep } => {
                let got = send(
                    &d,
                    &mut w,
                    Request::Detach(DetachReq {
                        domain: dom,
                        endpoint: ep,
                    }),
                );
                prop_assert_eq!(got, m.detach(dom, ep), "step {} {:?}", i, op);
            }
            Op::Map {
                dom,
                pg,
                pages,
                gpa_pg,
                flags,
            } => {
                let got = send(
                    &d,
                    &mut w,
                    Request::Map(MapReq {
                        domain: dom,
                        virt_start: pg * PG,
                        virt_end: (pg + pages) * PG - 1,
                        phys_start: gpa_pg * PG,
                        flags,
                    }),
                );
                let want = m.map(dom, pg, pg + pages - 1, gpa_pg, flags);
                prop_assert!(
                    want.contains(&got),
                    "step {} {:?}: got {:?} want {:?}",
                    i,
                    op,
                    got,
                    want
                );
            }
            Op::Unmap { dom, pg, pages } => {
                let got = send(
                    &d,
                    &mut w,
                    Request::Unmap(UnmapReq {
                        domain: dom,
                        virt_start: pg * PG,
                        virt_end: (pg + pages) * PG - 1,
                    }),
                );
                prop_assert_eq!(got, m.unmap(dom, pg, pg + pages - 1), "step {} {:?}", i, op);
            }
            Op::Kick => d.complete_kick(&mut w),
            Op::Translate { ep, pg } => {
                let want = m.translate(ep, pg).map(|g| g * PG + 0x10);
                let got = match d.endpoint_dma(ep) {
                    Ok(dma) => dma.translate_contiguous(pg * PG + 0x10, 8, Perm::READ).ok(),
                    Err(_) => None,
                };
                prop_assert_eq!(got, want, "step {} {:?}", i, op);
            }
            Op::Reset => {
                d.reset();
                d.ack_features(d.device_features());
                m = Model::new();
            }
        }
        // Registry and table counters agree with the model.
        prop_assert_eq!(d.domain_count(), m.domains.len(), "step {}", i);
        for (&id, md) in &m.domains {
            if md.bypass {
                prop_assert!(d.domain_stats(id).is_none());
            } else {
                let s = d.domain_stats(id).unwrap();
                prop_assert_eq!(s.mappings, md.maps.len() as u64, "step {} domain {}", i, id);
                let bytes: u64 = md.maps.iter().map(|(f, (l, _, _))| (l - f + 1) * PG).sum();
                prop_assert_eq!(s.mapped_bytes, bytes, "step {} domain {}", i, id);
            }
        }
        for e in EPS {
            prop_assert_eq!(d.endpoint_domain(e), m.eps[&e], "step {} ep {}", i, e);
        }
    }
    d.complete_kick(&mut w);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn scalable_device_matches_model(ops in prop::collection::vec(op(), 1..80)) {
        run(SpaceImpl::Scalable, &ops)?;
    }

    #[test]
    fn baseline_device_matches_model(ops in prop::collection::vec(op(), 1..80)) {
        run(SpaceImpl::Baseline, &ops)?;
    }
}
