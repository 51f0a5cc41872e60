//! A guest-side thread: one request queue (its own `QueueContext`) of the
//! vIOMMU, one domain with one endpoint per consumer kind, and the slots
//! it maps, unmaps, detaches and reattaches. After every completed UNMAP
//! or DETACH it checks the evidence (see the parent module) and poisons
//! what it got back; before it hands a page out again it checks the
//! poison.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use virtio_iommu::device::IommuDevice;
use virtio_iommu::mapping::QueueContext;
use virtio_iommu::wire::{AttachReq, DetachReq, MapReq, Request, UnmapReq};
use vmm::width::usize_from_u64;

use super::rng::Rng;
use super::vfio::RecordingHost;
use super::{domain, gpa, iova, Kind, Shared, KINDS, PAGE, SLOTS};

/// MAP flags: read and write.
const RW: u32 = 3;

/// One guest thread's state.
pub struct Guest<'a> {
    index: usize,
    shared: &'a Shared,
    dev: &'a IommuDevice,
    container: Arc<RecordingHost>,
    worker: QueueContext,
    rng: Rng,
    mapped: Vec<bool>,
    attached: [bool; 3],
}

impl<'a> Guest<'a> {
    /// Guest thread `index`, its endpoints not attached yet.
    pub fn new(
        index: usize,
        shared: &'a Shared,
        dev: &'a IommuDevice,
        container: Arc<RecordingHost>,
        rng: Rng,
    ) -> Self {
        Self {
            index,
            shared,
            dev,
            container,
            worker: dev.new_worker(),
            rng,
            mapped: vec![false; usize_from_u64(SLOTS)],
            attached: [false; 3],
        }
    }

    /// Runs until the shared stop flag is set.
    pub fn run(mut self) {
        self.attach_all();
        while !self.shared.stopped() {
            let r = self.rng.below(1000);
            let attached = self.attached.iter().filter(|a| **a).count();
            if r < 15 && attached >= 2 {
                let k = self.pick_kind(true);
                self.detach(&[k]);
            } else if r < 30 && attached < 3 {
                let k = self.pick_kind(false);
                self.reattach(k);
            } else if r < 32 {
                let all: Vec<Kind> = KINDS
                    .into_iter()
                    .filter(|k| self.attached[*k as usize])
                    .collect();
                self.detach(&all);
                self.attach_all();
            } else {
                self.map_unmap();
            }
        }
    }

    /// A random kind whose endpoint is (`attached`) or is not attached.
    fn pick_kind(&mut self, attached: bool) -> Kind {
        let start = usize_from_u64(self.rng.below(3));
        (0..3)
            .map(|i| KINDS[(start + i) % 3])
            .find(|k| self.attached[*k as usize] == attached)
            .unwrap_or(Kind::Emulated)
    }

    /// One kick: handles `reqs` and completes it; counts bad statuses.
    fn kick(&mut self, reqs: &[Request]) {
        for req in reqs {
            let mut tail = [0xffu8; 4];
            let used = self
                .dev
                .handle_request(&mut self.worker, &req.encode(), &mut tail);
            if used != 4 || tail[0] != 0 {
                let before = self.shared.bad_status.fetch_add(1, Ordering::Relaxed);
                if before < 5 {
                    eprintln!("guest {}: {req:?} answered {tail:?}", self.index);
                }
            }
        }
        self.dev.complete_kick(&mut self.worker);
        self.shared
            .requests
            .fetch_add(reqs.len() as u64, Ordering::Relaxed);
    }

    fn attach_req(&self, kind: Kind) -> Request {
        Request::Attach(AttachReq {
            domain: domain(self.index),
            endpoint: kind.endpoint(self.index),
            flags: 0,
            reserved: [0; 4],
        })
    }

    fn attach_all(&mut self) {
        let reqs: Vec<Request> = KINDS
            .into_iter()
            .filter(|k| !self.attached[*k as usize])
            .map(|k| self.attach_req(k))
            .collect();
        self.kick(&reqs);
        self.attached = [true; 3];
    }

    /// Reattaches `kind`'s endpoint after checking that nothing reached
    /// its regions while it was detached.
    fn reattach(&mut self, kind: Kind) {
        let before = self.shared.violations();
        for s in 0..SLOTS {
            self.shared
                .check_poison(gpa(self.index, s), kind, "its endpoint's DETACH");
        }
        self.count_detach_violations(before);
        let req = self.attach_req(kind);
        self.kick(&[req]);
        self.attached[kind as usize] = true;
    }

    /// DETACHes the endpoints of `kinds` in one kick (all of them: the
    /// domain goes, and with it every mapping).
    fn detach(&mut self, kinds: &[Kind]) {
        let reqs: Vec<Request> = kinds
            .iter()
            .map(|k| {
                Request::Detach(DetachReq {
                    domain: domain(self.index),
                    endpoint: k.endpoint(self.index),
                })
            })
            .collect();
        self.kick(&reqs);
        let done = self.shared.ticket();
        let before = self.shared.violations();
        let domain_gone = kinds.len() == self.attached.iter().filter(|a| **a).count();
        for k in kinds {
            self.attached[*k as usize] = false;
        }
        // A domain that lost its last endpoint lost its mappings too.
        let reclaimed: Vec<Kind> = if domain_gone {
            self.mapped.fill(false);
            KINDS.to_vec()
        } else {
            kinds.to_vec()
        };
        for s in 0..SLOTS {
            let page = gpa(self.index, s);
            for k in &reclaimed {
                self.shared
                    .check_no_later_write(page, *k, done, "DETACH completed");
                self.shared.poison(page, *k);
            }
        }
        if reclaimed.contains(&Kind::Vfio) && self.container.maps_any(0..=u64::MAX) {
            self.shared.violation(
                Kind::Vfio,
                format_args!("container still maps after a completed DETACH"),
            );
        }
        self.count_detach_violations(before);
        self.shared
            .detaches
            .fetch_add(kinds.len() as u64, Ordering::Relaxed);
    }

    /// Counts the violations found since `before` as found after a DETACH.
    fn count_detach_violations(&self, before: u64) {
        let found = self.shared.violations().saturating_sub(before);
        self.shared
            .detach_violations
            .fetch_add(found, Ordering::Relaxed);
    }

    /// One kick of 1-4 MAPs and UNMAPs of distinct random slots.
    fn map_unmap(&mut self) {
        let n = 1 + self.rng.below(4);
        let mut slots: Vec<u64> = Vec::new();
        while (slots.len() as u64) < n {
            let s = self.rng.below(SLOTS);
            if !slots.contains(&s) {
                slots.push(s);
            }
        }
        let dom = domain(self.index);
        let mut reqs = Vec::new();
        let mut unmapped = Vec::new();
        for &s in &slots {
            let idx = usize_from_u64(s);
            let va = iova(s);
            if self.mapped.get(idx).copied().unwrap_or(false) {
                reqs.push(Request::Unmap(UnmapReq {
                    domain: dom,
                    virt_start: va,
                    virt_end: va + PAGE - 1,
                }));
                unmapped.push(s);
            } else {
                let page = gpa(self.index, s);
                for k in KINDS {
                    self.shared.check_poison(page, k, "its UNMAP");
                }
                reqs.push(Request::Map(MapReq {
                    domain: dom,
                    virt_start: va,
                    virt_end: va + PAGE - 1,
                    phys_start: page,
                    flags: RW,
                }));
            }
            if let Some(m) = self.mapped.get_mut(idx) {
                *m = !*m;
            }
        }
        // UNMAPs last in the kick, so that its flush follows the table
        // update at once (the tightest race with a miss).
        reqs.sort_by_key(|r| matches!(r, Request::Unmap(_)));
        if let Some(&s) = unmapped.first() {
            if self.rng.below(2) == 0 {
                if let Some(h) = self.shared.unmap_hints.get(self.index) {
                    h.store(iova(s) + 1, Ordering::Relaxed);
                }
                // A random head start for the back-end's miss: some land
                // before the UNMAP, some during its flush, some after.
                for _ in 0..self.rng.below(20_000) {
                    std::hint::spin_loop();
                }
            }
        }
        self.kick(&reqs);
        if unmapped.is_empty() {
            return;
        }
        let done = self.shared.ticket();
        for &s in &unmapped {
            let page = gpa(self.index, s);
            for k in KINDS {
                self.shared
                    .check_no_later_write(page, k, done, "UNMAP completed");
                self.shared.poison(page, k);
            }
            let va = iova(s);
            if self.container.maps_any(va..=va + PAGE - 1) {
                self.shared.violation(
                    Kind::Vfio,
                    format_args!("container still maps {va:#x} after its UNMAP completed"),
                );
            }
        }
        self.shared
            .unmaps
            .fetch_add(unmapped.len() as u64, Ordering::Relaxed);
    }
}
