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
//! - ATTACH to another domain, DETACH, reset: the container is emptied
//!   (one `VFIO_DMA_UNMAP_FLAG_ALL` call where the host kernel has
//!   `VFIO_UNMAP_ALL`, else by the recorded mappings); an identity
//!   (bypass) domain maps all guest RAM 1:1.
//!
//! A failed unmap must never let the UNMAP (or DETACH) complete with the
//! mapping still reachable: the mirror then stops the function before it
//! returns (bus mastering cleared and kept clear, the container emptied,
//! the mirror failed for good: nothing is mapped in the container again),
//! and if even that fails the VMM exits. The host side is behind
//! [`HostFunction`], so tests drive this path with a container that fails.
//!
//! Mappings the domain already held when the endpoint joined it are not
//! replayed (Linux gives every device a domain of its own before mapping
//! anything); the mirror logs when that could matter.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use log::{debug, error, warn};
use virtio_iommu::device::{MapMirror, MirrorError};
use virtio_iommu::mapping::{Invalidator, Perm};
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use virtio_iommu::locks::Unpoison;

use super::host::HostFunction;
use crate::memory::GuestMemoryMmap;

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

/// What ends the VMM when a failed unmap cannot be contained: writes
/// `line` and exits with status 1, before the guest's request completes.
fn exit_vmm(line: &str) {
    error!("{line}");
    eprintln!("dmavisor: error: {line}; ending the VMM");
    std::process::exit(1);
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
    /// What is mapped in the container: first IOVA -> last IOVA (identity
    /// mappings included), so it can be emptied without `VFIO_UNMAP_ALL`.
    live: BTreeMap<u64, u64>,
    /// The function was stopped after a failed unmap: nothing is mapped
    /// again.
    failed: bool,
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

    /// Forgets the mappings inside `first..=last` and returns them.
    fn forget(&mut self, first: u64, last: u64) -> Vec<(u64, u64)> {
        let starts: Vec<u64> = self.live.range(first..=last).map(|(s, _)| *s).collect();
        starts
            .into_iter()
            .filter_map(|s| self.live.remove(&s).map(|e| (s, e)))
            .collect()
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
    host: Arc<dyn HostFunction>,
    /// `host.can_unmap_all()`, asked once.
    unmap_all: bool,
    mem: GuestMemoryMmap,
    following: Mutex<Following>,
    /// Ends the VMM when a stop fails ([`exit_vmm`]; tests record it).
    fatal: Box<dyn Fn(&str) + Send + Sync>,
    /// Counters.
    pub stats: MirrorStats,
}

impl VfioMirror {
    /// A mirror for `endpoint`; the container starts empty (the endpoint is
    /// unattached, its DMA blocked).
    pub fn new(
        name: String,
        endpoint: u32,
        host: Arc<dyn HostFunction>,
        mem: GuestMemoryMmap,
    ) -> Self {
        let unmap_all = host.can_unmap_all();
        if !unmap_all {
            log::info!(
                "vfio {name}: the host kernel has no VFIO_UNMAP_ALL; domain changes unmap \
                 the recorded mappings"
            );
        }
        Self {
            name,
            endpoint,
            host,
            unmap_all,
            mem,
            following: Mutex::new(Following::default()),
            fatal: Box::new(exit_vmm),
            stats: MirrorStats::default(),
        }
    }

    /// The same mirror with `fatal` called instead of ending the VMM.
    #[cfg(test)]
    pub(crate) fn with_fatal(mut self, fatal: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.fatal = Box::new(fatal);
        self
    }

    /// Whether the function was stopped after a failed unmap.
    pub fn failed(&self) -> bool {
        self.lock().failed
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Following> {
        self.following.lock().unpoisoned()
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
        // SAFETY: `host..host+len` is guest RAM (checked above to lie in
        // one region), mapped for the VMM's lifetime and only ever
        // accessed through volatile slices, so device DMA into it breaks
        // no Rust invariant.
        let r = unsafe { self.host.map_dma(iova, len, host as u64, perm) };
        self.stats.map_calls.fetch_add(1, Ordering::Relaxed);
        r.map_err(|source| VfioMapError::Map { iova, len, source })?;
        self.stats
            .pages_mapped
            .fetch_add(len.div_ceil(4096), Ordering::Relaxed);
        Ok(())
    }

    /// Unmaps everything mapped in `range`.
    fn unmap(&self, range: &RangeInclusive<u64>) -> std::io::Result<()> {
        let (start, last) = (*range.start(), *range.end());
        self.stats.unmap_calls.fetch_add(1, Ordering::Relaxed);
        match (last - start).checked_add(1) {
            Some(len) => self.host.unmap_dma(start, len),
            // The whole 64-bit space: two halves.
            None => {
                self.host.unmap_dma(0, 1 << 63)?;
                self.stats.unmap_calls.fetch_add(1, Ordering::Relaxed);
                self.host.unmap_dma(1 << 63, 1 << 63)
            }
        }
    }

    /// Empties the container: one call with `VFIO_UNMAP_ALL`, else one
    /// call over the span of the recorded mappings (VFIO unmaps every
    /// mapping inside a span; a recorded span cuts none in two).
    fn empty(&self, f: &mut Following) -> std::io::Result<()> {
        if self.unmap_all {
            self.stats.unmap_calls.fetch_add(1, Ordering::Relaxed);
            self.host.unmap_all()?;
        } else if let (Some((&first, _)), Some(last)) =
            (f.live.first_key_value(), f.live.values().copied().max())
        {
            self.unmap(&(first..=last))?;
        }
        f.live.clear();
        Ok(())
    }

    /// Empties the container one recorded mapping at a time (no call can
    /// cut a mapping in two): the stop's fallback when one call over
    /// everything failed. Fails if any mapping stays.
    fn empty_by_mapping(&self, f: &mut Following) -> std::io::Result<()> {
        let live: Vec<(u64, u64)> = f.live.iter().map(|(s, e)| (*s, *e)).collect();
        for (first, last) in live {
            self.unmap(&(first..=last))?;
            f.live.remove(&first);
        }
        Ok(())
    }

    /// A VFIO unmap failed, so the device may still reach pages the guest
    /// is about to see unmapped: stop the function before returning (and
    /// so before the request completes). Bus mastering goes off and stays
    /// off, the container is emptied, the mirror fails for good. If either
    /// step fails, nothing short of ending the VMM keeps the guest's
    /// memory safe.
    fn stop(&self, f: &mut Following, why: &str) {
        f.failed = true;
        error!(
            "vfio {}: {why}; stopping the function (bus mastering off, container emptied)",
            self.name
        );
        let master = self.host.stop_bus_master();
        let emptied = self.empty(f).or_else(|e| {
            warn!(
                "vfio {}: emptying the container: {e}; unmapping mapping by mapping",
                self.name
            );
            self.empty_by_mapping(f)
        });
        if let Err(e) = &master {
            (self.fatal)(&format!(
                "vfio {}: {why}, and bus mastering could not be cleared: {e}",
                self.name
            ));
        }
        if let Err(e) = &emptied {
            (self.fatal)(&format!(
                "vfio {}: {why}, and the container could not be emptied: {e}",
                self.name
            ));
        }
    }

    /// Maps all guest RAM 1:1 (an identity domain).
    fn map_identity(&self, f: &mut Following) {
        for region in self.mem.iter() {
            let start = region.start_addr().0;
            // A region the container could not map is one the device
            // cannot reach: logged, never a hole in the protection.
            match self.map(start, region.len(), start, Perm::READ | Perm::WRITE) {
                Ok(()) => {
                    f.live.insert(start, start + (region.len() - 1));
                }
                Err(e) => warn!("vfio {}: identity map: {e}", self.name),
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
        if f.failed {
            // Stopped and empty for good.
            f.domain = to;
            return;
        }
        if f.domain.is_some() || !f.live.is_empty() {
            self.stats.ranges.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = self.empty(&mut f) {
                self.stop(&mut f, &format!("emptying the container: {e}"));
                f.domain = to;
                return;
            }
        }
        *f = Following {
            domain: to,
            identity,
            live: BTreeMap::new(),
            failed: false,
        };
        if to.is_some() && identity {
            self.map_identity(&mut f);
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
        // A stopped function gets nothing mapped again; the MAP itself
        // stands (the domain may serve other endpoints too).
        if f.failed || f.domain != Some(domain) || f.identity {
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
        if f.failed || f.domain != Some(domain) || f.identity {
            return;
        }
        self.stats
            .ranges
            .fetch_add(ranges.len() as u64, Ordering::Relaxed);
        // Set aside so the spans can join across them; put back if an
        // unmap fails, so the stop empties them too.
        let mut removed = Vec::new();
        for r in ranges {
            removed.extend(f.forget(*r.start(), *r.end()));
        }
        for span in join_spans(&f, ranges) {
            if let Err(e) = self.unmap(&span) {
                f.live.extend(removed);
                self.stop(&mut f, &format!("unmap {span:#x?}: {e}"));
                return;
            }
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
            failed: false,
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
        assert_eq!(
            f.forget(0x1000, 0x3fff),
            vec![(0x1000, 0x1fff), (0x2000, 0x3fff)]
        );
        assert_eq!(f.live.len(), 1);
        assert!(f.live_in(0x9000, 0x9000));
        assert!(!f.live_in(0x1000, 0x8fff));
    }
}
