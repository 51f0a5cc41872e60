//! Mirroring consumers: DMA consumers that keep a translation table of
//! their own which must hold exactly the guest's mappings (a VFIO container
//! whose host IOMMU the assigned device translates through).
//!
//! WHY a hook of its own: an `Invalidator` hears only what is removed, and
//! an `EndpointListener` only which domain an endpoint is in. A mirror
//! must also install every MAP of its endpoint's domain before the guest
//! sees the MAP complete (the guest starts DMA right after), and must know
//! whether the new domain is an identity (bypass) domain. Removals still
//! reach it as an `Invalidator`, merged per kick, before the UNMAPs
//! complete.

use crate::mapping::Perm;

/// Why a mirror could not install a mapping (the MAP is then refused): the
/// mirror's own error, which this crate only reports.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct MirrorError(#[source] pub Box<dyn std::error::Error + Send + Sync>);

/// Follows one endpoint's domain into a table of its own.
pub trait MapMirror: Send + Sync {
    /// `endpoint` is now in domain `to` (None: unattached); `identity` when
    /// that domain passes DMA through untranslated (a bypass domain).
    /// Called before the request that caused it completes, with the
    /// device's topology lock held (the mirror must not call the device).
    fn endpoint_moved(&self, endpoint: u32, to: Option<u32>, identity: bool);

    /// `domain` now maps `iova..=last` to `gpa..` with `perm`. Called
    /// before the MAP completes; an error makes the device undo the
    /// mapping and answer S_NOMEM.
    fn mapped(
        &self,
        domain: u32,
        iova: u64,
        last: u64,
        gpa: u64,
        perm: Perm,
    ) -> Result<(), MirrorError>;
}
