//! The per-endpoint DMA handle given to DMA consumers (emulated devices, the
//! DMA test device, the VMM's per-device DMA seam).
//!
//! WHY a handle per endpoint: every DMA access of a device goes through here,
//! so the lookup "endpoint -> domain" is done once when the handle is made
//! (an `Arc<Endpoint>`), and each access only checks the endpoint's current
//! attachment against the calling thread's cache of it (one plain load of
//! a change count and a compare, `translate/attach_cache.rs`) and then reads the
//! domain's lock-free table. No lock, no locked instruction and no write
//! to memory another thread reads on a hit.
//!
//! Semantics (spec, "Device operations"):
//! - endpoint not attached: identity if the `bypass` config field is 1,
//!   otherwise a fault with reason DOMAIN;
//! - attached to a bypass domain: identity;
//! - attached to a translated domain: the domain table, page-run by page-run;
//!   an unmapped address or missing permission is a fault with reason
//!   MAPPING.
//!
//! Every fault is queued for the event queue (bounded, drops counted) and
//! logged (rate-limited) by [`FaultQueue`].
//!
//! The attachment is sampled once per [`translate`](EndpointDma::translate)
//! call, so one access is translated consistently against one domain even if
//! the guest re-attaches the endpoint concurrently.

mod attach_cache;

/// This thread's attachment-cache misses so far (tests).
#[cfg(test)]
pub(crate) use attach_cache::misses as attach_cache_misses;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use thiserror::Error;

use crate::domain::Domain;
use crate::endpoint::Endpoint;
use crate::events::FaultQueue;
use crate::mapping::{Fault, Perm, Translation};
use crate::wire::{
    FaultEvent, FAULT_F_ADDRESS, FAULT_F_READ, FAULT_F_WRITE, FAULT_R_DOMAIN, FAULT_R_MAPPING,
    FAULT_R_UNKNOWN,
};

/// One physically contiguous piece of a translated access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaRun {
    /// Guest-physical address of the piece.
    pub gpa: u64,
    /// Its length in bytes.
    pub len: u64,
}

/// Why an access was refused. A fault event has been queued for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum DmaFault {
    /// The endpoint is not attached to a domain and bypass is off.
    #[error("endpoint {endpoint:#x} not attached to a domain (address {iova:#x})")]
    NotAttached {
        /// The endpoint whose access was refused.
        endpoint: u32,
        /// The refused I/O virtual address.
        iova: u64,
    },
    /// No mapping covers `iova`.
    #[error("endpoint {endpoint:#x}: address {iova:#x} not mapped")]
    Unmapped {
        /// The endpoint whose access was refused.
        endpoint: u32,
        /// The refused I/O virtual address.
        iova: u64,
    },
    /// The mapping covering `iova` lacks the requested permission.
    #[error("endpoint {endpoint:#x}: access to {iova:#x} not permitted")]
    Permission {
        /// The endpoint whose access was refused.
        endpoint: u32,
        /// The refused I/O virtual address.
        iova: u64,
    },
    /// `iova + len` wraps around the address space.
    #[error("endpoint {endpoint:#x}: access at {iova:#x} wraps the address space")]
    Overflow {
        /// The endpoint whose access was refused.
        endpoint: u32,
        /// The refused I/O virtual address.
        iova: u64,
    },
}

/// How the current access is translated (sampled once per access).
enum Mode {
    Identity,
    Blocked,
    Table(attach_cache::Attachment),
}

/// Translation handle of one endpoint. Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct EndpointDma {
    ep: Arc<Endpoint>,
    bypass: Arc<AtomicBool>,
    faults: Arc<FaultQueue>,
}

impl EndpointDma {
    pub(crate) fn new(ep: Arc<Endpoint>, bypass: Arc<AtomicBool>, faults: Arc<FaultQueue>) -> Self {
        Self { ep, bypass, faults }
    }

    /// The endpoint this handle translates for.
    pub fn endpoint_id(&self) -> u32 {
        self.ep.id()
    }

    #[inline]
    fn mode(&self) -> Mode {
        let attached = attach_cache::attachment(&self.ep);
        match attached.domain().map(Domain::is_bypass) {
            Some(true) => Mode::Identity,
            Some(false) => Mode::Table(attached),
            None if self.bypass.load(Ordering::Acquire) => Mode::Identity,
            None => Mode::Blocked,
        }
    }

    /// Translates the access `[iova, iova + len)` with `access` (READ and/or
    /// WRITE) into guest-physical runs. The iterator yields `Ok` runs in
    /// order; on a fault it yields one `Err` (after queuing the fault event)
    /// and ends. A zero-length access yields nothing.
    pub fn translate(&self, iova: u64, len: u64, access: Perm) -> DmaRuns<'_> {
        DmaRuns {
            dma: self,
            mode: self.mode(),
            iova,
            remaining: len,
            access,
            done: len == 0,
        }
    }

    /// Calls `f` for every run of the access; stops at the first fault.
    pub fn for_each_run(
        &self,
        iova: u64,
        len: u64,
        access: Perm,
        mut f: impl FnMut(DmaRun),
    ) -> Result<(), DmaFault> {
        for run in self.translate(iova, len, access) {
            f(run?);
        }
        Ok(())
    }

    /// Looks up `iova` for a consumer that caches translations itself (a
    /// vhost-user back-end's IOTLB miss): the guest-physical address, how
    /// far the mapping reaches from `iova` and its permissions. In an
    /// identity (bypass) domain the reach is everything up to the end of
    /// the address space, read-write. A refused lookup is reported to the
    /// guest as a fault, as the consumer's access would have been.
    pub fn lookup(&self, iova: u64, access: Perm) -> Result<Translation, DmaFault> {
        match self.mode() {
            Mode::Identity => Ok(Translation {
                gpa: iova,
                len: (u64::MAX - iova).saturating_add(1),
                perm: Perm::READ | Perm::WRITE,
            }),
            Mode::Blocked => Err(self.report(FAULT_R_DOMAIN, access, iova, |endpoint, iova| {
                DmaFault::NotAttached { endpoint, iova }
            })),
            Mode::Table(d) => match d.domain().and_then(|d| d.translate(iova, access)) {
                Some(Ok(t)) if t.len > 0 => Ok(t),
                Some(Err(Fault::Permission)) => Err(self.report(
                    FAULT_R_MAPPING,
                    access,
                    iova,
                    |endpoint, iova| DmaFault::Permission { endpoint, iova },
                )),
                _ => Err(
                    self.report(FAULT_R_MAPPING, access, iova, |endpoint, iova| {
                        DmaFault::Unmapped { endpoint, iova }
                    }),
                ),
            },
        }
    }

    /// Translates an access that must be physically contiguous (e.g. one
    /// descriptor or ring structure); returns its guest-physical address.
    /// A non-contiguous but valid access yields the first run's address if
    /// the whole access fits in it, otherwise `Unmapped` at the first address
    /// past the first run (reported as a fault like any other).
    pub fn translate_contiguous(&self, iova: u64, len: u64, access: Perm) -> Result<u64, DmaFault> {
        if len == 0 {
            // Nothing is accessed.
            return Ok(iova);
        }
        let mut it = self.translate(iova, len, access);
        let first = match it.next() {
            Some(r) => r?,
            None => return Ok(iova),
        };
        if first.len >= len {
            return Ok(first.gpa);
        }
        // Are the following runs physically adjacent?
        let mut expect = first.gpa.checked_add(first.len);
        for run in it {
            let run = run?;
            if expect != Some(run.gpa) {
                let at = iova.saturating_add(first.len);
                return Err(self.report(FAULT_R_MAPPING, access, at, |endpoint, iova| {
                    DmaFault::Unmapped { endpoint, iova }
                }));
            }
            expect = run.gpa.checked_add(run.len);
        }
        Ok(first.gpa)
    }

    fn report(
        &self,
        reason: u8,
        access: Perm,
        iova: u64,
        make: impl FnOnce(u32, u64) -> DmaFault,
    ) -> DmaFault {
        let mut flags = FAULT_F_ADDRESS;
        if access.contains(Perm::READ) {
            flags |= FAULT_F_READ;
        }
        if access.contains(Perm::WRITE) {
            flags |= FAULT_F_WRITE;
        }
        self.faults.report(FaultEvent {
            reason,
            flags,
            endpoint: self.ep.id(),
            address: iova,
        });
        make(self.ep.id(), iova)
    }
}

/// Iterator over the runs of one access; see [`EndpointDma::translate`].
/// Not `Send`: it holds its attachment in its thread's cache.
pub struct DmaRuns<'a> {
    dma: &'a EndpointDma,
    mode: Mode,
    iova: u64,
    remaining: u64,
    access: Perm,
    done: bool,
}

impl DmaRuns<'_> {
    fn fail(
        &mut self,
        reason: u8,
        make: fn(u32, u64) -> DmaFault,
    ) -> Option<Result<DmaRun, DmaFault>> {
        self.done = true;
        Some(Err(self.dma.report(reason, self.access, self.iova, make)))
    }
}

impl Iterator for DmaRuns<'_> {
    type Item = Result<DmaRun, DmaFault>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        // The last byte of the access must exist (remaining > 0 while not
        // done; checked anyway).
        let last_off = self.remaining.saturating_sub(1);
        if self.iova.checked_add(last_off).is_none() {
            return self.fail(FAULT_R_UNKNOWN, |endpoint, iova| DmaFault::Overflow {
                endpoint,
                iova,
            });
        }
        match &self.mode {
            Mode::Identity => {
                self.done = true;
                Some(Ok(DmaRun {
                    gpa: self.iova,
                    len: self.remaining,
                }))
            }
            Mode::Blocked => self.fail(FAULT_R_DOMAIN, |endpoint, iova| DmaFault::NotAttached {
                endpoint,
                iova,
            }),
            Mode::Table(d) => {
                let Some(result) = d.domain().and_then(|d| d.translate(self.iova, self.access))
                else {
                    // Bypass domains (and no domain) are not Mode::Table;
                    // unreachable in practice, but fail closed.
                    return self.fail(FAULT_R_UNKNOWN, |endpoint, iova| DmaFault::Unmapped {
                        endpoint,
                        iova,
                    });
                };
                match result {
                    Ok(t) if t.len > 0 => {
                        let len = t.len.min(self.remaining);
                        self.remaining = self.remaining.saturating_sub(len);
                        if self.remaining == 0 {
                            self.done = true;
                        } else {
                            // remaining > 0 and the last byte exists, so
                            // iova + len does not overflow.
                            self.iova = self.iova.wrapping_add(len);
                        }
                        Some(Ok(DmaRun { gpa: t.gpa, len }))
                    }
                    Ok(_) | Err(Fault::Unmapped) => self.fail(FAULT_R_MAPPING, |endpoint, iova| {
                        DmaFault::Unmapped { endpoint, iova }
                    }),
                    Err(Fault::Permission) => self.fail(FAULT_R_MAPPING, |endpoint, iova| {
                        DmaFault::Permission { endpoint, iova }
                    }),
                }
            }
        }
    }
}
