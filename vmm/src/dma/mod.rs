//! The DMA translation seam: every access an emulated device makes to guest
//! memory (descriptor tables, rings, packet buffers) goes through one
//! per-device [`DmaSpace`].
//!
//! WHY one seam: a virtual IOMMU is only a protection if *no* device path
//! can reach guest RAM around it. Devices therefore never hold the raw
//! [`GuestMemoryMmap`]; they get a `DmaSpace`, which implements vm-memory's
//! [`GuestMemory`] trait (the I/O-virtual memory trait that virtio-queue
//! 0.18 is generic over), so the queue code, the descriptor walker and the
//! device's own buffer accesses all translate the same way.
//!
//! WHY not vm-memory's `IommuMemory` + `Iommu`: that design caches
//! translations in an `Iotlb` behind the IOMMU object, which then needs an
//! invalidation protocol with every consumer. Here each access asks the
//! translator directly ([`DmaTranslate::translate_run`]); a vIOMMU whose
//! table is lock-free (see the `virtio-iommu` crate's `EndpointDma`) then
//! costs one table walk per access, and an UNMAP is effective for the next
//! access without any consumer-side cache to flush.
//!
//! Without a vIOMMU ([`DmaSpace::identity`]) the seam is the identity over
//! guest RAM and costs one region lookup, like the plain memory object.

mod guard;
pub mod iommu;
#[cfg(test)]
mod iommu_tests;
#[cfg(test)]
mod quiesce_tests;
mod space;
#[cfg(test)]
pub(crate) mod test_iommu;

pub use guard::{DmaGuard, ThreadDma};
pub use space::{DmaSliceIter, DmaSpace};

use thiserror::Error;

/// Direction of a device access, as seen by the IOMMU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaAccess {
    /// The device reads guest memory.
    Read,
    /// The device writes guest memory.
    Write,
    /// Both (e.g. an atomic update of a ring index).
    ReadWrite,
}

impl From<vm_memory::Permissions> for DmaAccess {
    fn from(p: vm_memory::Permissions) -> Self {
        match p {
            vm_memory::Permissions::Write => DmaAccess::Write,
            vm_memory::Permissions::ReadWrite => DmaAccess::ReadWrite,
            // `No` asks nothing; treat it as the weakest real access.
            vm_memory::Permissions::Read | vm_memory::Permissions::No => DmaAccess::Read,
        }
    }
}

/// Why a translation was refused.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum DmaFault {
    /// Nothing is mapped at `iova` (or the endpoint is not attached).
    #[error("DMA to I/O virtual address {iova:#x} is not mapped")]
    Unmapped {
        /// First faulting address.
        iova: u64,
    },
    /// A mapping exists but does not allow the access.
    #[error("DMA access to {iova:#x} is not permitted")]
    Permission {
        /// First faulting address.
        iova: u64,
    },
}

/// An IOVA -> guest-physical translator that a vIOMMU plugs into the seam.
///
/// Implementations must be cheap to call concurrently from device threads
/// (no device-wide lock on this path) and must never panic on any address.
pub trait DmaTranslate: Send + Sync {
    /// Translates the start of `[iova, iova + len)` for `access`.
    ///
    /// Returns `(gpa, run)` where `1 <= run <= len` bytes starting at `iova`
    /// are physically contiguous at `gpa`. The caller asks again for the
    /// rest. `len` is never 0. A refused access is a [`DmaFault`] (the
    /// implementation is expected to report it to the guest, e.g. as a
    /// virtio-iommu fault event).
    fn translate_run(&self, iova: u64, len: u64, access: DmaAccess)
        -> Result<(u64, u64), DmaFault>;
}

/// The identity translator: what a device behind an IOMMU in bypass mode
/// sees. Useful for tests and for `iommu=on` without a vIOMMU device.
#[derive(Clone, Copy, Debug, Default)]
pub struct IdentityTranslate;

impl DmaTranslate for IdentityTranslate {
    fn translate_run(
        &self,
        iova: u64,
        len: u64,
        _access: DmaAccess,
    ) -> Result<(u64, u64), DmaFault> {
        Ok((iova, len))
    }
}
