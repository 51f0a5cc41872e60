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
use crate::wire::{AttachTableReq, InvalidateReq, Status};

impl IommuDevice {
    pub(super) fn attach_table(&self, w: &mut QueueContext, req: &AttachTableReq) -> Status {
        if req.reserved != [0u8; 2] {
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
            if req.virt_end < req.virt_start {
                return Status::Inval;
            }
            // Cached walks are whole 4 KiB pages: round outwards; nothing
            // is cached beyond the table's input range.
            let start = req.virt_start & !(PAGE_SIZE - 1);
            if start > IOVA_MAX {
                return Status::Ok;
            }
            let last = (req.virt_end | (PAGE_SIZE - 1)).min(IOVA_MAX);
            match d.table().invalidate(space.as_ref(), w, start, last) {
                Ok(()) => Status::Ok,
                Err(UnmapError::WouldSplit) => Status::Range,
            }
        })
    }
}
