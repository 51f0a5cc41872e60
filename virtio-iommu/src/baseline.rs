//! Today's design, kept for comparison: one lock around an ordered map of
//! mapping records per domain, a lock and a tree walk for every device
//! access, and one invalidation call per consumer for every UNMAP request.
//!
//! WHY keep it: the benchmark and the integration tests run both designs
//! through the same [`DomainSpace`] contract, so the gain of the scalable
//! path is measured, not assumed. It is written honestly (no artificial
//! slowness): a `RwLock` so concurrent translations share the lock.

use std::collections::BTreeMap;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::locks::Unpoison;
use crate::space::{
    check_map_args, DomainSpace, Fault, Limits, MapError, Perm, QueueContext, SpaceStats,
    Translation, UnmapError, IOVA_MAX,
};

/// Approximate heap cost of one BTreeMap record (key, value and node share).
const RECORD_BYTES: u64 = 64;

#[derive(Clone, Copy, Debug)]
struct Record {
    last: u64,
    gpa: u64,
    perm: Perm,
}

#[derive(Debug, Default)]
struct Inner {
    map: BTreeMap<u64, Record>,
    mapped_bytes: u64,
}

/// One domain of the baseline design.
#[derive(Debug)]
pub struct BaselineSpace {
    domain: u32,
    limits: Limits,
    inner: RwLock<Inner>,
}

impl BaselineSpace {
    /// An empty domain.
    pub fn new(domain: u32, limits: &Limits) -> BaselineSpace {
        BaselineSpace {
            domain,
            limits: *limits,
            inner: RwLock::new(Inner::default()),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        // Every update below is applied fully or not at all before any
        // panic point, so a poisoned lock still guards a consistent map.
        self.inner.read().unpoisoned()
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unpoisoned()
    }
}

impl DomainSpace for BaselineSpace {
    fn map(
        &self,
        _w: &mut QueueContext,
        iova: u64,
        last: u64,
        gpa: u64,
        perm: Perm,
    ) -> Result<(), MapError> {
        check_map_args(iova, last, gpa)?;
        let mut g = self.write();
        if let Some((_, r)) = g.map.range(..=last).next_back() {
            if r.last >= iova {
                return Err(MapError::Overlap);
            }
        }
        let n = g.map.len() as u64;
        if n >= self.limits.max_mappings || (n + 1) * RECORD_BYTES > self.limits.max_table_bytes {
            return Err(MapError::NoMemory);
        }
        g.map.insert(iova, Record { last, gpa, perm });
        g.mapped_bytes += last - iova + 1;
        Ok(())
    }

    fn unmap(&self, w: &mut QueueContext, iova: u64, last: u64) -> Result<(), UnmapError> {
        if last < iova || iova > IOVA_MAX {
            return Ok(());
        }
        let last = last.min(IOVA_MAX);
        let mut g = self.write();
        // A record starting before `iova` that reaches into the range, or one
        // inside the range that ends after `last`, would be split.
        if let Some((_, r)) = g.map.range(..iova).next_back() {
            if r.last >= iova {
                return Err(UnmapError::WouldSplit);
            }
        }
        if let Some((_, r)) = g.map.range(iova..=last).next_back() {
            if r.last > last {
                return Err(UnmapError::WouldSplit);
            }
        }
        let mut removed: Option<(u64, u64)> = None;
        while let Some((&start, &r)) = g.map.range(iova..=last).next() {
            g.map.remove(&start);
            g.mapped_bytes -= r.last - start + 1;
            removed = Some(match removed {
                None => (start, r.last),
                Some((f, _)) => (f, r.last),
            });
        }
        drop(g);
        if let Some((first, end)) = removed {
            // One consumer call per UNMAP request, never merged with others.
            w.batch_mut().record_single(self.domain, first, end);
        }
        Ok(())
    }

    fn clear(&self, w: &mut QueueContext) {
        let mut g = self.write();
        let first = g.map.keys().next().copied();
        let end = g.map.values().next_back().map(|r| r.last);
        g.map.clear();
        g.mapped_bytes = 0;
        drop(g);
        if let (Some(first), Some(end)) = (first, end) {
            w.batch_mut().record_single(self.domain, first, end);
        }
    }

    fn translate(&self, iova: u64, access: Perm) -> Result<Translation, Fault> {
        let g = self.read();
        match g.map.range(..=iova).next_back() {
            Some((&start, r)) if r.last >= iova => {
                let want = access.intersection(Perm::RW);
                if !r.perm.contains(want) {
                    return Err(Fault::Permission);
                }
                Ok(Translation {
                    gpa: r.gpa + (iova - start),
                    len: r.last - iova + 1,
                    perm: r.perm,
                })
            }
            _ => Err(Fault::Unmapped),
        }
    }

    fn stats(&self) -> SpaceStats {
        let g = self.read();
        SpaceStats {
            mappings: g.map.len() as u64,
            mapped_bytes: g.mapped_bytes,
            table_bytes: g.map.len() as u64 * RECORD_BYTES,
        }
    }
}
