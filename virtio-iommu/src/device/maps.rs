//! MAP and UNMAP: the hot path.
//!
//! WHY no device lock here: the registry lookup is a read lock held for one
//! `Arc` clone; the rest runs on the domain's own concurrent table. All
//! validation the spec asks of the device happens before the table is
//! touched, with checked arithmetic on every guest-supplied address.

use std::sync::atomic::Ordering;

use super::IommuDevice;
use crate::domain::Domain;
use crate::mapping::{DomainSpace, MapError, Perm, QueueContext, UnmapError, GPA_MAX};
use crate::wire::{feature, MapReq, Status, UnmapReq, MAP_F_ALL, MAP_F_MMIO};

impl IommuDevice {
    /// True if `[start, end]` intersects a global reserved region (incl. the
    /// MSI window).
    fn overlaps_global_resv(&self, start: u64, end: u64) -> bool {
        self.global_resv
            .iter()
            .any(|r| r.start <= end && start <= r.end)
    }

    pub(super) fn map(&self, w: &mut QueueContext, req: &MapReq) -> Status {
        self.domains
            .with(req.domain, |d| self.map_in(w, req, d.map(|d| &**d)))
    }

    pub(super) fn unmap(&self, w: &mut QueueContext, req: &UnmapReq) -> Status {
        self.domains
            .with(req.domain, |d| self.unmap_in(w, req, d.map(|d| &**d)))
    }

    fn map_in(&self, w: &mut QueueContext, req: &MapReq, domain: Option<&Domain>) -> Status {
        if !self.features.is_acked(feature::MAP_UNMAP) {
            return Status::Unsupp;
        }
        if req.flags & !MAP_F_ALL != 0 {
            return Status::Inval;
        }
        if req.flags & MAP_F_MMIO != 0 && !self.features.is_acked(feature::MMIO) {
            return Status::Inval;
        }
        let Some(domain) = domain else {
            return Status::NoEnt;
        };
        let Some(space) = domain.space() else {
            // MAP on a bypass domain.
            return Status::Inval;
        };
        if domain.table().root().is_some() {
            // Page-table mode: the guest's table is the only source of
            // mappings (docs/page-table.md).
            return Status::Inval;
        }
        if req.virt_end < req.virt_start {
            return Status::Inval;
        }
        // virt_start, phys_start and virt_end + 1 aligned on the granule; the
        // last one written as "all low bits of virt_end set" so that
        // virt_end = u64::MAX needs no overflowing add.
        let low = self.cfg.granule().wrapping_sub(1);
        if req.virt_start & low != 0 || req.phys_start & low != 0 || req.virt_end & low != low {
            return Status::Range;
        }
        if req.virt_start < self.cfg.input_start || req.virt_end > self.cfg.input_end {
            return Status::Range;
        }
        // phys_end = phys_start + (virt_end - virt_start) must exist and be
        // a guest-physical address the table can hold.
        let span = req.virt_end - req.virt_start; // virt_end >= virt_start checked
        match req.phys_start.checked_add(span) {
            Some(end) if end <= GPA_MAX => {}
            _ => return Status::Range,
        }
        if self.overlaps_global_resv(req.virt_start, req.virt_end)
            || domain.overlaps_member_resv(req.virt_start, req.virt_end)
        {
            // A reserved region behaves as if already mapped.
            return Status::Inval;
        }
        let perm = Perm::from_bits_truncate(req.flags);
        match space.map(w, req.virt_start, req.virt_end, req.phys_start, perm) {
            Ok(()) => self.mirror_map(w, req, space.as_ref(), perm),
            Err(MapError::Overlap) => Status::Inval,
            Err(MapError::Unaligned) | Err(MapError::OutOfRange) => Status::Range,
            Err(MapError::NoMemory) => Status::NoMem,
        }
    }

    /// Tells the mirrors of a MAP the table took; if one cannot follow, the
    /// mapping is taken back (its removal reaches every consumer with the
    /// kick) and the guest is told S_NOMEM.
    fn mirror_map(
        &self,
        w: &mut QueueContext,
        req: &MapReq,
        space: &dyn DomainSpace,
        perm: Perm,
    ) -> Status {
        if !self.has_mirrors.load(Ordering::Acquire) {
            return Status::Ok;
        }
        let mirrors = super::read(&self.mirrors);
        for m in mirrors.iter() {
            if let Err(e) = m.mapped(
                req.domain,
                req.virt_start,
                req.virt_end,
                req.phys_start,
                perm,
            ) {
                log::warn!(
                    "virtio-iommu: MAP {:#x}..={:#x} in domain {} refused by a DMA consumer: {e}",
                    req.virt_start,
                    req.virt_end,
                    req.domain
                );
                let _ = space.unmap(w, req.virt_start, req.virt_end);
                return Status::NoMem;
            }
        }
        Status::Ok
    }

    fn unmap_in(&self, w: &mut QueueContext, req: &UnmapReq, domain: Option<&Domain>) -> Status {
        if !self.features.is_acked(feature::MAP_UNMAP) {
            return Status::Unsupp;
        }
        let Some(domain) = domain else {
            return Status::NoEnt;
        };
        let Some(space) = domain.space() else {
            return Status::Inval;
        };
        if domain.table().root().is_some() {
            return Status::Inval;
        }
        if req.virt_end < req.virt_start {
            return Status::Inval;
        }
        match space.unmap(w, req.virt_start, req.virt_end) {
            Ok(()) => Status::Ok,
            Err(UnmapError::WouldSplit) => Status::Range,
        }
    }
}
