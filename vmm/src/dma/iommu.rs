//! The vIOMMU side of the DMA seam: a [`DmaTranslate`] over one endpoint's
//! [`EndpointDma`] handle from the `virtio-iommu` device model.
//!
//! WHY this thin adapter: the seam (`DmaSpace`) asks for one contiguous run
//! at a time; the library already translates page-run by page-run without a
//! device-wide lock and queues a fault event for every refused access. The
//! adapter adds the one thing the library cannot know: which thread must
//! wake up to deliver that event (the virtio-iommu event-queue thread),
//! signalled through an eventfd after each fault.

use std::sync::Arc;

use virtio_iommu::mapping::Perm;
use virtio_iommu::translate::{DmaFault as EndpointFault, EndpointDma};
use vmm_sys_util::eventfd::EventFd;

use super::{DmaAccess, DmaFault, DmaTranslate};

/// Translates a device's accesses through its vIOMMU endpoint.
pub struct IommuTranslate {
    dma: EndpointDma,
    /// Written once per fault so the event queue is drained promptly.
    fault_notify: Option<Arc<EventFd>>,
}

impl IommuTranslate {
    /// A translator for `dma`; `fault_notify` (if any) is signalled after
    /// every refused access.
    pub fn new(dma: EndpointDma, fault_notify: Option<Arc<EventFd>>) -> Self {
        Self { dma, fault_notify }
    }

    /// The endpoint id (the device's PCI requester id).
    pub fn endpoint_id(&self) -> u32 {
        self.dma.endpoint_id()
    }
}

fn perm(access: DmaAccess) -> Perm {
    match access {
        DmaAccess::Read => Perm::READ,
        DmaAccess::Write => Perm::WRITE,
        DmaAccess::ReadWrite => Perm::RW,
    }
}

impl DmaTranslate for IommuTranslate {
    fn translate_run(
        &self,
        iova: u64,
        len: u64,
        access: DmaAccess,
    ) -> Result<(u64, u64), DmaFault> {
        // Only the first run is needed: the seam asks again for the rest,
        // so a fault further on is reported when (and if) it is reached.
        let first = self.dma.translate(iova, len, perm(access)).next();
        match first {
            Some(Ok(run)) if run.len > 0 => Ok((run.gpa, run.len.min(len))),
            // len == 0 is never asked; an empty run would stall the caller.
            None | Some(Ok(_)) => Err(DmaFault::Unmapped { iova }),
            Some(Err(fault)) => {
                if let Some(evt) = &self.fault_notify {
                    if let Err(e) = evt.write(1) {
                        log::debug!("vIOMMU fault notification: {e}");
                    }
                }
                Err(match fault {
                    EndpointFault::Permission { iova, .. } => DmaFault::Permission { iova },
                    EndpointFault::NotAttached { iova, .. }
                    | EndpointFault::Unmapped { iova, .. }
                    | EndpointFault::Overflow { iova, .. } => DmaFault::Unmapped { iova },
                })
            }
        }
    }
}
