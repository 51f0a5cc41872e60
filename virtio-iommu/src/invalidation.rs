//! The invalidation batch of one kick (Peleg et al.'s deferred invalidation,
//! applied per request queue).
//!
//! WHY: invalidating a DMA consumer is expensive (a VFIO_IOMMU_UNMAP_DMA
//! ioctl and a host IOTLB flush, a vhost-user IOTLB message, a cache epoch
//! step). Today's VMMs pay it once per UNMAP request. The scalable path
//! records the ranges removed while a kick is handled and invalidates each
//! consumer once per domain at the end of the kick, with overlapping and
//! adjacent ranges merged. The guest cannot tell: requests complete only
//! after the flush.

use std::ops::RangeInclusive;
use std::sync::Arc;

/// A DMA consumer outside the table (VFIO container, vhost-user back-end,
/// translation caches). Receives ONE call per flush and domain with the
/// merged ranges of that domain.
pub trait Invalidator: Send + Sync {
    /// Every translation of `domain` inside `ranges` cached by the consumer
    /// must be gone when this returns.
    fn invalidate(&self, domain: u32, ranges: &[RangeInclusive<u64>]);

    /// `endpoint` left `domain` (None: it was unattached, its DMA passing
    /// through with the `bypass` field set) during the kick: DETACH, ATTACH
    /// elsewhere, reset. Nothing was unmapped if the domain lives on or
    /// was a bypass domain, yet a consumer whose users may still hold a
    /// translation of that endpoint must have waited for them when this
    /// returns. Default: nothing (consumers caching per endpoint follow
    /// it through `EndpointListener` or `MapMirror` instead).
    fn endpoint_left(&self, _endpoint: u32, _domain: Option<u32>) {}
}

/// Ranges removed during one kick.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// `(domain, first, last)` to merge at flush.
    merged: Vec<(u32, u64, u64)>,
    /// `(domain, first, last)` delivered one call each (the baseline's
    /// per-request invalidation).
    single: Vec<(u32, u64, u64)>,
    /// `(endpoint, domain)` departures, one `endpoint_left` call each.
    left: Vec<(u32, Option<u32>)>,
    /// Reused buffer for the ranges of one domain.
    scratch: Vec<RangeInclusive<u64>>,
    /// Invalidator calls made so far.
    calls: u64,
}

/// Sorts `v` by (domain, first) and merges overlapping or adjacent ranges of
/// the same domain in place.
pub(crate) fn merge_ranges(v: &mut Vec<(u32, u64, u64)>) {
    v.sort_unstable_by_key(|&(d, first, _)| (d, first));
    let mut out = 0usize;
    for i in 0..v.len() {
        let (d, first, last) = v[i];
        if out > 0 {
            let prev = &mut v[out - 1];
            // Adjacent: prev.2 + 1 == first (no overflow when prev.2 == u64::MAX:
            // then every later range overlaps).
            if prev.0 == d && (prev.2 == u64::MAX || first <= prev.2 + 1) {
                prev.2 = prev.2.max(last);
                continue;
            }
        }
        v[out] = (d, first, last);
        out += 1;
    }
    v.truncate(out);
}

impl Batch {
    pub(crate) fn new() -> Batch {
        Batch::default()
    }

    /// Records a removed range, to be merged with the kick's others.
    ///
    /// A range that continues the one recorded just before (a ring of DMA
    /// buffers unmapped in order) extends it in place: the same merge
    /// `merge_ranges` would make at the flush, without a slot per UNMAP to
    /// store and sort.
    /// Always inlined (the push is not): it is most of a one-page UNMAP's
    /// work besides the compare-and-swap.
    #[inline(always)]
    pub(crate) fn record(&mut self, domain: u32, first: u64, last: u64) {
        if let Some(prev) = self.merged.last_mut() {
            if prev.0 == domain && prev.2.checked_add(1) == Some(first) {
                prev.2 = last;
                return;
            }
        }
        self.push_merged(domain, first, last);
    }

    #[inline(never)]
    fn push_merged(&mut self, domain: u32, first: u64, last: u64) {
        self.merged.push((domain, first, last));
    }

    /// Records a removed range that gets its own invalidation call.
    pub(crate) fn record_single(&mut self, domain: u32, first: u64, last: u64) {
        self.single.push((domain, first, last));
    }

    /// Records that `endpoint` left `domain` (see
    /// [`Invalidator::endpoint_left`]).
    pub(crate) fn record_left(&mut self, endpoint: u32, domain: Option<u32>) {
        self.left.push((endpoint, domain));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.merged.is_empty() && self.single.is_empty() && self.left.is_empty()
    }

    pub(crate) fn calls(&self) -> u64 {
        self.calls
    }

    /// Delivers the batch; returns true if anything was invalidated.
    pub(crate) fn flush(&mut self, consumers: &[Arc<dyn Invalidator>]) -> bool {
        if self.is_empty() {
            return false;
        }
        for &(d, first, last) in &self.single {
            for c in consumers {
                c.invalidate(d, &[first..=last]);
                self.calls += 1;
            }
        }
        self.single.clear();
        for &(endpoint, d) in &self.left {
            for c in consumers {
                c.endpoint_left(endpoint, d);
                self.calls += 1;
            }
        }
        self.left.clear();
        merge_ranges(&mut self.merged);
        let mut i = 0;
        while i < self.merged.len() {
            let d = self.merged[i].0;
            self.scratch.clear();
            while i < self.merged.len() && self.merged[i].0 == d {
                self.scratch.push(self.merged[i].1..=self.merged[i].2);
                i += 1;
            }
            for c in consumers {
                c.invalidate(d, &self.scratch);
                self.calls += 1;
            }
        }
        self.merged.clear();
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Log(Mutex<Vec<(u32, Vec<RangeInclusive<u64>>)>>);
    impl Invalidator for Log {
        fn invalidate(&self, domain: u32, ranges: &[RangeInclusive<u64>]) {
            self.0.lock().unwrap().push((domain, ranges.to_vec()));
        }
    }

    #[test]
    fn merges_adjacent_and_overlapping_per_domain() {
        let mut v = vec![
            (2, 0x3000, 0x3fff),
            (1, 0x1000, 0x1fff),
            (1, 0x0, 0xfff),
            (1, 0x5000, 0x5fff),
            (1, 0x1800, 0x2fff),
            (2, 0x2000, 0x2fff),
            (1, u64::MAX - 10, u64::MAX),
            (1, u64::MAX - 20, u64::MAX - 11),
        ];
        merge_ranges(&mut v);
        assert_eq!(
            v,
            vec![
                (1, 0, 0x2fff),
                (1, 0x5000, 0x5fff),
                (1, u64::MAX - 20, u64::MAX),
                (2, 0x2000, 0x3fff)
            ]
        );
    }

    #[test]
    fn one_call_per_consumer_and_domain() {
        let log = Arc::new(Log::default());
        let consumers: Vec<Arc<dyn Invalidator>> = vec![log.clone(), log.clone()];
        let mut b = Batch::new();
        for i in 0..32u64 {
            b.record(7, i * 0x1000, i * 0x1000 + 0xfff);
        }
        b.record(9, 0, 0xfff);
        assert!(b.flush(&consumers));
        let got = log.0.lock().unwrap().clone();
        assert_eq!(got.len(), 4);
        assert_eq!(got[0], (7, vec![0..=0x1f_fff]));
        assert_eq!(got[2], (9, vec![0..=0xfff]));
        assert!(!b.flush(&consumers));
        assert_eq!(b.calls(), 4);
    }

    #[test]
    fn single_records_are_not_merged() {
        let log = Arc::new(Log::default());
        let consumers: Vec<Arc<dyn Invalidator>> = vec![log.clone()];
        let mut b = Batch::new();
        b.record_single(1, 0, 0xfff);
        b.record_single(1, 0x1000, 0x1fff);
        b.flush(&consumers);
        assert_eq!(log.0.lock().unwrap().len(), 2);
    }
}
