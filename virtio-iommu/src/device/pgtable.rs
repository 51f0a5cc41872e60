//! ATTACH_TABLE and INVALIDATE: the requests of the project page-table
//! mode (docs/page-table.md; the walk itself is `crate::pgtable`).
//!
//! WHY ATTACH_TABLE under the topology lock: it checks the domain's
//! members (a VFIO member cannot follow a guest table) and must not race an
//! ATTACH adding one. INVALIDATE is the hot request of the mode and takes
//! only the domain's fill lock, like a miss.

use std::sync::Arc;

use super::IommuDevice;
use crate::locks::lock;
use crate::mapping::{QueueContext, UnmapError, IOVA_MAX, PAGE_SIZE};
use crate::pgtable::FORMAT_X86_4L;
use crate::wire::{
    AttachTableReq, InvalidateReq, Status, INVAL_F_ALL, INVAL_F_PASID, INVAL_G_DOMAIN,
    INVAL_G_PASID, INVAL_G_VA, INV_T_ALL, INV_T_IOTLB, INV_T_PASID,
};

/// Smallest and largest `granule` an INVALIDATE may give: 4 KiB (the
/// table's page) to 2^63 (a larger shift cannot be a page size).
const GRANULE_MIN: u8 = 12;
const GRANULE_MAX: u8 = 63;

impl IommuDevice {
    pub(super) fn attach_table(&self, w: &mut QueueContext, req: &AttachTableReq) -> Status {
        // The drafts define no ATTACH_TABLE flag for a page table; set
        // reserved bits are refused rather than ignored so that a later
        // meaning cannot be silently misread.
        if req.flags != 0 || req.reserved != [0u8; 6] || req.reserved2 != [0u8; 48] {
            return Status::Inval;
        }
        if req.format != FORMAT_X86_4L {
            return Status::Unsupp;
        }
        let Some(mem) = self.table_mem.get() else {
            log::warn!("virtio-iommu: ATTACH_TABLE without guest memory configured");
            return Status::Unsupp;
        };
        // Page 0 is refused too: 0 means "no table" in the domain's slot.
        if req.root & (PAGE_SIZE - 1) != 0 || req.root == 0 {
            return Status::Range;
        }
        if !mem.is_ram_page(req.root) {
            return Status::Fault;
        }
        let _t = lock(&self.topology);
        let Some(d) = self.domains.get(req.domain) else {
            return Status::NoEnt;
        };
        let Some(space) = d.space() else {
            // A bypass domain translates nothing.
            return Status::Inval;
        };
        let explicit = d
            .members()
            .into_iter()
            .any(|e| self.endpoints.get(e).is_some_and(|ep| ep.explicit_maps()));
        if explicit {
            return Status::Unsupp;
        }
        // The drafts name the endpoint; this device keeps one table per
        // domain, so the endpoint must already be in it (ATTACH first).
        if !d.members().contains(&req.endpoint) {
            return Status::NoEnt;
        }
        if d.table().root().is_none() && space.stats().mappings > 0 {
            // MAPs made before: the driver must UNMAP them first.
            return Status::Inval;
        }
        let depot = Arc::clone(&self.depot);
        d.table()
            .install(space.as_ref(), w, req.root, Arc::clone(mem), || {
                QueueContext::new(&depot)
            });
        Status::Ok
    }

    pub(super) fn invalidate(&self, w: &mut QueueContext, req: &InvalidateReq) -> Status {
        let span = match invalidate_span(req) {
            Ok(span) => span,
            Err(st) => return st,
        };
        self.domains.with(req.domain, |d| {
            let Some(d) = d else {
                return Status::NoEnt;
            };
            let Some(space) = d.space() else {
                return Status::Inval;
            };
            if d.table().root().is_none() {
                return Status::Inval;
            }
            let Some((first, last)) = span else {
                return Status::Ok;
            };
            // Cached walks are whole 4 KiB pages: round outwards; nothing
            // is cached beyond the table's input range.
            let start = first & !(PAGE_SIZE - 1);
            if start > IOVA_MAX {
                return Status::Ok;
            }
            let last = (last | (PAGE_SIZE - 1)).min(IOVA_MAX);
            match d.table().invalidate(space.as_ref(), w, start, last) {
                Ok(()) => Status::Ok,
                Err(UnmapError::WouldSplit) => Status::Range,
            }
        })
    }
}

/// The IOVA span (first, last inclusive) an INVALIDATE covers (None:
/// nothing of this device's caches), or the
/// status that refuses it. Reserved bytes and undefined bits answer
/// S_INVAL; what the drafts define but this device has no use for (PASIDs)
/// answers S_UNSUPP; a span past 2^64 answers S_RANGE. ARCHID and LEAF are
/// accepted and ignored: the device keeps no tag, and dropping non-leaf
/// walks too is a superset of what LEAF asks.
fn invalidate_span(req: &InvalidateReq) -> Result<Option<(u64, u64)>, Status> {
    if req.reserved1 != [0u8; 2] || req.reserved2 != [0u8; 4] || req.reserved3 != [0u8; 11] {
        return Err(Status::Inval);
    }
    // A request naming no cache at all is as malformed as an unknown bit.
    if req.flags & !INVAL_F_ALL != 0 || req.inv_type & !INV_T_ALL != 0 || req.inv_type == 0 {
        return Err(Status::Inval);
    }
    if req.flags & INVAL_F_PASID != 0 || req.inv_type & INV_T_PASID != 0 {
        return Err(Status::Unsupp);
    }
    // Only the device's own cache holds walks; an ATS-only request
    // (DEV_IOTLB without IOTLB) has nothing to remove here but is legal.
    let iotlb = req.inv_type & INV_T_IOTLB != 0;
    match req.granularity {
        INVAL_G_DOMAIN if iotlb => Ok(Some((0, u64::MAX))),
        INVAL_G_VA if iotlb => {
            if !(GRANULE_MIN..=GRANULE_MAX).contains(&req.granule) || req.nr_pages == 0 {
                return Err(Status::Inval);
            }
            let bytes = u128::from(req.nr_pages) << req.granule;
            let last = u128::from(req.virt_start) + bytes - 1;
            u64::try_from(last)
                .map(|l| Some((req.virt_start, l)))
                .map_err(|_| Status::Range)
        }
        INVAL_G_DOMAIN | INVAL_G_VA => Ok(None),
        INVAL_G_PASID => Err(Status::Unsupp),
        _ => Err(Status::Inval),
    }
}
