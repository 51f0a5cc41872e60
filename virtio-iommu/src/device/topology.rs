//! ATTACH, DETACH and reset: changes of which endpoint is in which domain.
//!
//! WHY serialized: these are rare and must update three things consistently
//! (registry, domain membership, endpoint slot), so they run under the
//! device's topology mutex. They never block MAP/UNMAP for longer than a
//! registry insert/remove.
//!
//! A domain lives while it has members: when its last endpoint leaves, it is
//! removed from the registry and its mappings are cleared through the
//! caller's `QueueContext`, so consumers are invalidated in the same flush as the
//! kick's UNMAPs.
//!
//! Every departure (DETACH, ATTACH elsewhere, reset), also from a domain
//! that lives on or from a bypass domain where nothing is unmapped, is
//! recorded in the same batch: the flush that ends the kick tells every
//! consumer (`Invalidator::endpoint_left`), so the request completes only
//! after a device thread that translated through the old domain has left
//! its section. Without it a DMA in flight could land after the guest saw
//! its DETACH complete.

use std::sync::Arc;

use super::IommuDevice;
use crate::domain::{Domain, DomainKind};
use crate::locks::lock;
use crate::mapping::{new_space, Limits, QueueContext};
use crate::wire::{feature, AttachReq, DetachReq, Status, ATTACH_F_ALL, ATTACH_F_BYPASS};

impl IommuDevice {
    pub(super) fn attach(&self, w: &mut QueueContext, req: &AttachReq) -> Status {
        if req.reserved != [0u8; 4] {
            return Status::Inval;
        }
        // ATTACH_F_BYPASS is a recognized flag only with BYPASS_CONFIG.
        let known = if self.features.is_acked(feature::BYPASS_CONFIG) {
            ATTACH_F_ALL
        } else {
            0
        };
        if req.flags & !known != 0 {
            return Status::Inval;
        }
        let want_bypass = req.flags & ATTACH_F_BYPASS != 0;
        let Some(ep) = self.endpoints.get(req.endpoint) else {
            return Status::NoEnt;
        };
        if req.domain < self.cfg.domain_start || req.domain > self.cfg.domain_end {
            return Status::Range;
        }

        let _t = lock(&self.topology);
        let old = ep.domain();
        let target = match self.domains.get(req.domain) {
            Some(d) => {
                if d.is_bypass() != want_bypass {
                    return Status::Inval;
                }
                if ep.explicit_maps() && d.table().root().is_some() {
                    // A VFIO function cannot follow a guest page table.
                    return Status::Unsupp;
                }
                if old.as_ref().is_some_and(|o| Arc::ptr_eq(o, &d)) {
                    return Status::Ok;
                }
                d
            }
            None => {
                // Leaving a single-member domain frees its slot first.
                let freed = old.as_ref().is_some_and(|o| o.member_count() <= 1);
                let live = self.domains.len().saturating_sub(usize::from(freed));
                if live >= self.cfg.limits.max_domains as usize {
                    return Status::NoMem;
                }
                let kind = if want_bypass {
                    DomainKind::Bypass
                } else {
                    let limits = Limits {
                        max_mappings: self.cfg.limits.max_mappings_per_domain,
                        max_table_bytes: self.cfg.limits.max_table_bytes_per_domain,
                    };
                    DomainKind::Mapped(new_space(
                        self.cfg.space_impl,
                        req.domain,
                        &limits,
                        &self.depot,
                    ))
                };
                let d = Arc::new(Domain::new(req.domain, kind));
                self.domains.insert(Arc::clone(&d));
                d
            }
        };
        // As if the driver had sent DETACH from the old domain first. The
        // endpoint is repointed before the old domain may be torn down, so
        // its DMA never observes a half-cleared table.
        target.add_member(req.endpoint, ep.resv());
        ep.set_domain(Some(Arc::clone(&target)));
        self.notify_moved(
            req.endpoint,
            old.as_ref().map(|o| o.id()),
            Some(target.id()),
            target.is_bypass(),
        );
        match old {
            Some(o) => self.leave(w, &o, req.endpoint),
            // Its DMA passed through untranslated until now.
            None if self.bypass() => w.batch_mut().record_left(req.endpoint, None),
            None => {}
        }
        Status::Ok
    }

    pub(super) fn detach(&self, w: &mut QueueContext, req: &DetachReq) -> Status {
        let Some(ep) = self.endpoints.get(req.endpoint) else {
            return Status::NoEnt;
        };
        let _t = lock(&self.topology);
        let Some(cur) = ep.domain() else {
            return Status::Inval;
        };
        if cur.id() != req.domain {
            return Status::Inval;
        }
        ep.set_domain(None);
        self.notify_moved(req.endpoint, Some(cur.id()), None, false);
        self.leave(w, &cur, req.endpoint);
        Status::Ok
    }

    /// Host-side removal of an endpoint whose function was unplugged: it
    /// leaves its domain as a DETACH would (the domain's consumers are
    /// invalidated before this returns if it was the last member), and
    /// requests naming its id answer NOENT from now on. The guest detaches
    /// a function before ejecting it; this covers a guest that did not.
    pub fn remove_endpoint(&self, endpoint_id: u32) -> Result<(), super::DeviceError> {
        let mut w = self.new_worker();
        {
            let _t = lock(&self.topology);
            let ep = self
                .endpoints
                .remove(endpoint_id)
                .ok_or(super::DeviceError::UnknownEndpoint(endpoint_id))?;
            if let Some(cur) = ep.set_domain(None) {
                self.notify_moved(endpoint_id, Some(cur.id()), None, false);
                self.leave(&mut w, &cur, endpoint_id);
            }
        }
        self.complete_kick(&mut w);
        Ok(())
    }

    /// Removes `endpoint` from `d`; destroys `d` if it was the last member.
    /// Caller holds the topology lock and has already repointed the endpoint.
    /// The departure goes into `w`'s batch, so the kick's flush waits for
    /// DMA in flight through `d` whether or not `d` is torn down.
    fn leave(&self, w: &mut QueueContext, d: &Arc<Domain>, endpoint: u32) {
        w.batch_mut().record_left(endpoint, Some(d.id()));
        let remaining = d.remove_member(endpoint, |e| {
            self.endpoints
                .get(e)
                .map(|ep| ep.resv().to_vec())
                .unwrap_or_default()
        });
        if remaining == 0 {
            d.table().disable();
            // Only remove the registry entry if it is still this domain.
            if let Some(cur) = self.domains.get(d.id()) {
                if Arc::ptr_eq(&cur, d) {
                    self.domains.remove(d.id());
                }
            }
            if let Some(space) = d.space() {
                space.clear(w);
                // Deliver the teardown's invalidations now, before a later
                // request of this kick can recreate a domain with the same
                // id: a stale invalidation must never hit the new domain's
                // mappings. Flushing early is always safe (the transport
                // publishes after the kick's final flush), and domain
                // teardown is rare.
                self.complete_kick(w);
            }
        }
    }

    /// Detaches everything and destroys every domain. Caller holds the
    /// topology lock and flushes `w`.
    pub(super) fn reset_locked(&self, w: &mut QueueContext) {
        for ep in self.endpoints.all() {
            if let Some(old) = ep.set_domain(None) {
                self.notify_moved(ep.id(), Some(old.id()), None, false);
                w.batch_mut().record_left(ep.id(), Some(old.id()));
            }
        }
        for d in self.domains.drain() {
            if let Some(space) = d.space() {
                space.clear(w);
            }
        }
    }
}
