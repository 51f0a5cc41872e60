//! An assigned device behind the vIOMMU: its VFIO container mirrors the
//! domain its endpoint is attached to.
//!
//! The host IOMMU translates the device's DMA through the container, so the
//! container must hold exactly the guest's mappings of that domain:
//! - MAP: mapped in the container (IOVA -> host address of the guest
//!   range, with the MAP's permissions) before the MAP completes;
//! - UNMAP: the kick's merged ranges are unmapped from the container before
//!   the UNMAPs complete (the mirror is an `Invalidator`). Ranges with no
//!   live mapping between them are joined into one VFIO call: the mirror
//!   keeps the set of what it mapped, and VFIO unmaps everything inside a
//!   span (it refuses only to cut a mapping in two, which cannot happen
//!   here). A lazy guest frees IOVAs in clusters, so this takes the VFIO
//!   calls well below one per range;
//! - ATTACH to another domain, DETACH, reset: the container is emptied;
//!   an identity (bypass) domain maps all guest RAM 1:1.
//!
//! Mappings the domain already held when the endpoint joined it are not
//! replayed (Linux gives every device a domain of its own before mapping
//! anything); the mirror logs when that could matter.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use log::{debug, warn};
use vfio_bindings::bindings::vfio::{
    vfio_iommu_type1_dma_map, vfio_iommu_type1_dma_unmap, VFIO_DMA_MAP_FLAG_READ,
    VFIO_DMA_MAP_FLAG_WRITE, VFIO_DMA_UNMAP_FLAG_ALL,
};
use vfio_ioctls::VfioContainer;
use virtio_iommu::device::{MapMirror, MirrorError};
use virtio_iommu::mapping::{Invalidator, Perm};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};
use vmm_sys_util::ioctl::{ioctl_with_mut_ref, ioctl_with_ref};

use crate::memory::GuestMemoryMmap;

/// The type1 container's map and unmap ioctl numbers (private: the macro
/// makes public functions).
mod ioctl_nr {
    use vfio_bindings::bindings::vfio::{VFIO_BASE, VFIO_TYPE};
    use vmm_sys_util::ioctl_io_nr;

    ioctl_io_nr!(VFIO_IOMMU_MAP_DMA, VFIO_TYPE as u32, VFIO_BASE + 13);
    ioctl_io_nr!(VFIO_IOMMU_UNMAP_DMA, VFIO_TYPE as u32, VFIO_BASE + 14);
}
use ioctl_nr::{VFIO_IOMMU_MAP_DMA, VFIO_IOMMU_UNMAP_DMA};

/// Why a guest mapping cannot be installed in the container.
#[derive(Debug, thiserror::Error)]
enum VfioMapError {
    /// The mapping's target is not guest RAM.
    #[error("{gpa:#x} is not guest RAM")]
    NotRam {
        /// Guest physical address.
        gpa: u64,
    },
    /// The range runs past the end of its RAM region.
    #[error("guest range {gpa:#x}+{len:#x} leaves its RAM region")]
    LeavesRegion {
        /// Guest physical address.
        gpa: u64,
        /// Length in bytes.
        len: u64,
    },
    /// The region has no host mapping for the address.
    #[error("{0}")]
    HostAddress(#[source] vm_memory::GuestMemoryError),
    /// VFIO_IOMMU_MAP_DMA failed.
    #[error("VFIO map {iova:#x}+{len:#x}: {source}")]
    Map {
        /// I/O virtual address.
        iova: u64,
        /// Length in bytes.
        len: u64,
        /// errno.
        source: std::io::Error,
    },
}

impl From<VfioMapError> for MirrorError {
    fn from(e: VfioMapError) -> Self {
        MirrorError(Box::new(e))
    }
}

/// Counters of one mirror (printed at exit, kept for the API).
#[derive(Debug, Default)]
pub struct MirrorStats {
    /// VFIO map calls.
    pub map_calls: AtomicU64,
    /// VFIO unmap calls.
    pub unmap_calls: AtomicU64,
    /// 4 KiB pages mapped.
    pub pages_mapped: AtomicU64,
    /// Ranges the vIOMMU asked to invalidate (already merged per kick),
    /// counting the whole space dropped when the endpoint leaves its
    /// domain as one: every unmap call answers at least one range.
    pub ranges: AtomicU64,
}

#[derive(Debug, Default)]
struct Following {
    domain: Option<u32>,
    identity: bool,
    /// What is mapped in the container: first IOVA -> last IOVA.
    live: BTreeMap<u64, u64>,
}

impl Following {
    /// Whether a live mapping intersects `first..=last`.
    fn live_in(&self, first: u64, last: u64) -> bool {
        if first > last {
            return false;
        }
        // The mapping starting at or before `last` that starts latest.
        self.live
            .range(..=last)
            .next_back()
            .is_some_and(|(_, &end)| end >= first)
    }

    /// Forgets the mappings inside `first..=last`.
    fn forget(&mut self, first: u64, last: u64) {
        let starts: Vec<u64> = self.live.range(first..=last).map(|(s, _)| *s).collect();
        for s in starts {
            self.live.remove(&s);
        }
    }
}

/// Joins sorted, disjoint `ranges` into the fewest spans that contain no
/// mapping `f` still holds (the ranges' own mappings already forgotten).
fn join_spans(f: &Following, ranges: &[RangeInclusive<u64>]) -> Vec<RangeInclusive<u64>> {
    let mut sorted: Vec<RangeInclusive<u64>> = ranges.to_vec();
    sorted.sort_by_key(|r| *r.start());
    let mut out: Vec<RangeInclusive<u64>> = Vec::with_capacity(sorted.len());
    for r in sorted {
        if let Some(last) = out.last_mut() {
            let gap_first = last.end().saturating_add(1);
            let gap_last = r.start().saturating_sub(1);
            if *r.start() <= last.end().saturating_add(1) || !f.live_in(gap_first, gap_last) {
                *last = *last.start()..=(*last.end()).max(*r.end());
                continue;
            }
        }
        out.push(r);
    }
    out
}

/// The container of one assigned device, following its endpoint.
pub struct VfioMirror {
    name: String,
    endpoint: u32,
    container: Arc<VfioContainer>,
    mem: GuestMemoryMmap,
    following: Mutex<Following>,
    /// Counters.
    pub stats: MirrorStats,
}

impl VfioMirror {
    /// A mirror for `endpoint`; the container starts empty (the endpoint is
    /// unattached, its DMA blocked).
    pub fn new(
        name: String,
        endpoint: u32,
        container: Arc<VfioContainer>,
        mem: GuestMemoryMmap,
    ) -> Self {
        Self {
            name,
            endpoint,
            container,
            mem,
            following: Mutex::new(Following::default()),
            stats: MirrorStats::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Following> {
        self.following
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Maps `iova..iova+len` to the host address of guest range
    /// `gpa..gpa+len` (which must lie in one RAM region).
    fn map(&self, iova: u64, len: u64, gpa: u64, perm: Perm) -> Result<(), MirrorError> {
        let region = self
            .mem
            .find_region(GuestAddress(gpa))
            .ok_or(VfioMapError::NotRam { gpa })?;
        let off = gpa - region.start_addr().0;
        if off.checked_add(len).is_none_or(|end| end > region.len()) {
            return Err(VfioMapError::LeavesRegion { gpa, len }.into());
        }
        let host = self
            .mem
            .get_host_address(GuestAddress(gpa))
            .map_err(VfioMapError::HostAddress)?;
        let mut flags = 0;
        if perm.contains(Perm::READ) {
            flags |= VFIO_DMA_MAP_FLAG_READ;
        }
        if perm.contains(Perm::WRITE) {
            flags |= VFIO_DMA_MAP_FLAG_WRITE;
        }
        let arg = vfio_iommu_type1_dma_map {
            argsz: std::mem::size_of::<vfio_iommu_type1_dma_map>() as u32,
            flags,
            vaddr: host as u64,
            iova,
            size: len,
        };
        // SAFETY: the ioctl reads `arg` only; `vaddr..vaddr+len` is guest
        // RAM, mapped for the VMM's lifetime and only ever accessed through
        // volatile slices, so device DMA into it breaks no Rust invariant.
        let r = unsafe { ioctl_with_ref(&*self.container, VFIO_IOMMU_MAP_DMA(), &arg) };
        self.stats.map_calls.fetch_add(1, Ordering::Relaxed);
        if r < 0 {
            return Err(VfioMapError::Map {
                iova,
                len,
                source: std::io::Error::last_os_error(),
            }
            .into());
        }
        self.stats
            .pages_mapped
            .fetch_add(len.div_ceil(4096), Ordering::Relaxed);
        Ok(())
    }

    /// Unmaps everything mapped in `iova..=last` (0..=u64::MAX: all of it).
    fn unmap(&self, range: &RangeInclusive<u64>) {
        let (start, last) = (*range.start(), *range.end());
        let mut arg = vfio_iommu_type1_dma_unmap {
            argsz: std::mem::size_of::<vfio_iommu_type1_dma_unmap>() as u32,
            ..Default::default()
        };
        if start == 0 && last == u64::MAX {
            arg.flags = VFIO_DMA_UNMAP_FLAG_ALL;
        } else {
            arg.iova = start;
            arg.size = last - start + 1;
        }
        // SAFETY: the ioctl reads and writes `arg` only.
        let r = unsafe { ioctl_with_mut_ref(&*self.container, VFIO_IOMMU_UNMAP_DMA(), &mut arg) };
        self.stats.unmap_calls.fetch_add(1, Ordering::Relaxed);
        if r < 0 {
            warn!(
                "vfio {}: unmap {start:#x}..={last:#x}: {}",
                self.name,
                std::io::Error::last_os_error()
            );
        }
    }

    /// Maps all guest RAM 1:1 (an identity domain).
    fn map_identity(&self) {
        for region in self.mem.iter() {
            let start = region.start_addr().0;
            if let Err(e) = self.map(start, region.len(), start, Perm::READ | Perm::WRITE) {
                warn!("vfio {}: identity map: {e}", self.name);
            }
        }
    }
}

impl VfioMirror {
    /// Logs the counters (at VM exit).
    pub fn log_stats(&self) {
        log::info!(
            "vfio {}: {} VFIO map calls ({} pages), {} unmap calls for {} invalidated ranges",
            self.name,
            self.stats.map_calls.load(Ordering::Relaxed),
            self.stats.pages_mapped.load(Ordering::Relaxed),
            self.stats.unmap_calls.load(Ordering::Relaxed),
            self.stats.ranges.load(Ordering::Relaxed)
        );
    }
}

impl MapMirror for VfioMirror {
    fn endpoint_moved(&self, endpoint: u32, to: Option<u32>, identity: bool) {
        if endpoint != self.endpoint {
            return;
        }
        let mut f = self.lock();
        if f.domain.is_some() {
            self.stats.ranges.fetch_add(1, Ordering::Relaxed);
            self.unmap(&(0..=u64::MAX));
        }
        *f = Following {
            domain: to,
            identity,
            live: BTreeMap::new(),
        };
        if to.is_some() && identity {
            self.map_identity();
        }
        debug!(
            "vfio {}: endpoint {endpoint:#x} now in domain {to:?}{}",
            self.name,
            if identity { " (identity)" } else { "" }
        );
    }

    fn mapped(
        &self,
        domain: u32,
        iova: u64,
        last: u64,
        gpa: u64,
        perm: Perm,
    ) -> Result<(), MirrorError> {
        let mut f = self.lock();
        if f.domain != Some(domain) || f.identity {
            return Ok(());
        }
        // An MMIO mapping (MSI doorbell, another device's BAR) has no host
        // RAM behind it: the device simply cannot reach it.
        if perm.contains(Perm::MMIO) {
            return Ok(());
        }
        self.map(iova, last - iova + 1, gpa, perm)?;
        f.live.insert(iova, last);
        Ok(())
    }
}

impl Invalidator for VfioMirror {
    fn invalidate(&self, domain: u32, ranges: &[RangeInclusive<u64>]) {
        let mut f = self.lock();
        if f.domain != Some(domain) || f.identity {
            return;
        }
        self.stats
            .ranges
            .fetch_add(ranges.len() as u64, Ordering::Relaxed);
        for r in ranges {
            f.forget(*r.start(), *r.end());
        }
        for span in join_spans(&f, ranges) {
            self.unmap(&span);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn following(live: &[(u64, u64)]) -> Following {
        Following {
            domain: Some(1),
            identity: false,
            live: live.iter().copied().collect(),
        }
    }

    #[test]
    fn spans_join_across_gaps_with_no_live_mapping_only() {
        // Live: one page at 0x5000. Freed: 0x1000, 0x3000, 0x7000, 0x8000.
        let f = following(&[(0x5000, 0x5fff)]);
        let freed = [
            0x7000..=0x7fff,
            0x1000..=0x1fff,
            0x3000..=0x3fff,
            0x8000..=0x8fff,
        ];
        assert_eq!(
            join_spans(&f, &freed),
            vec![0x1000..=0x3fff, 0x7000..=0x8fff]
        );
        // Nothing live: one span.
        assert_eq!(join_spans(&following(&[]), &freed), vec![0x1000..=0x8fff]);
        // A live mapping in a gap keeps the spans apart.
        let f = following(&[(0x2000, 0x2fff)]);
        assert_eq!(
            join_spans(&f, &[0x1000..=0x1fff, 0x3000..=0x3fff]),
            vec![0x1000..=0x1fff, 0x3000..=0x3fff]
        );
    }

    #[test]
    fn forget_drops_only_mappings_inside() {
        let mut f = following(&[(0x1000, 0x1fff), (0x2000, 0x3fff), (0x9000, 0x9fff)]);
        f.forget(0x1000, 0x3fff);
        assert_eq!(f.live.len(), 1);
        assert!(f.live_in(0x9000, 0x9000));
        assert!(!f.live_in(0x1000, 0x8fff));
    }
}
