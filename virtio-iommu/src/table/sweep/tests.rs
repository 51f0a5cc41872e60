//! The sweep's cost and its fall-backs (issue 30: INVALIDATE's cost
//! follows the live entries it removes, not its span).

use std::sync::Arc;

use super::super::{ctx, ScalableSpace};
use crate::mapping::{Depot, DomainSpace, Fault, Limits, Perm, QueueContext, UnmapError};

const PAGE: u64 = 4096;
const REGION: u64 = 2 << 20;
const BASE: u64 = 1 << 30;

/// Maps `live` one-page mappings, one per 2 MiB region (one leaf node
/// each: the sparsest spread), and returns their addresses.
fn map_sparse(space: &ScalableSpace, w: &mut QueueContext, live: u64) -> Vec<u64> {
    let pages: Vec<u64> = (0..live).map(|k| BASE + k * REGION + 7 * PAGE).collect();
    for (k, &iova) in pages.iter().enumerate() {
        let gpa = (1u64 << 32) + k as u64 * PAGE;
        space
            .map(w, iova, iova + PAGE - 1, gpa, Perm::RW)
            .expect("map");
    }
    w.flush(&[]);
    pages
}

/// Slots visited by one INVALIDATE of the span of `live` sparse pages.
fn invalidate_cost(space: &ScalableSpace, w: &mut QueueContext, live: u64) -> u64 {
    let pages = map_sparse(space, w, live);
    ctx(w).state.table.visited_slots = 0;
    space
        .invalidate(w, BASE, BASE + live * REGION - 1)
        .expect("invalidate");
    let visited = ctx(w).state.table.visited_slots;
    for &iova in &pages {
        assert_eq!(space.translate(iova, Perm::READ), Err(Fault::Unmapped));
    }
    w.flush(&[]);
    assert_eq!(space.stats().mappings, 0);
    space.audit().expect("audit");
    visited
}

#[test]
fn invalidate_cost_follows_live_entries() {
    let depot = Arc::new(Depot::new());
    let space = ScalableSpace::new(1, &Limits::default(), &depot);
    let mut w = QueueContext::new(&depot);
    // Each live entry costs its own slot and its leaf node's link; the 511
    // empty slots around it in its leaf node cost nothing. A few stale
    // marks of nodes retired by earlier rounds may add a visit each.
    for live in [16u64, 256, 1024] {
        let visited = invalidate_cost(&space, &mut w, live);
        assert!(
            visited <= 2 * live + 8,
            "{live} live entries: {visited} slots visited"
        );
        assert!(
            visited >= 2 * live,
            "{live} live entries: {visited} visited"
        );
    }
    // What INVALIDATE cost before (and UNMAP still costs): the range walk
    // claims and finishes every slot of every leaf node of the span.
    map_sparse(&space, &mut w, 16);
    ctx(&mut w).state.table.visited_slots = 0;
    space
        .unmap(&mut w, BASE, BASE + 16 * REGION - 1)
        .expect("unmap");
    assert!(ctx(&mut w).state.table.visited_slots >= 2 * 16 * 512);
    w.flush(&[]);
}

#[test]
fn invalidate_falls_back_for_larger_mappings() {
    let depot = Arc::new(Depot::new());
    let space = ScalableSpace::new(1, &Limits::default(), &depot);
    let mut w = QueueContext::new(&depot);
    let gpa = 1u64 << 32;
    // Singles, a 4-page mapping and a 2 MiB mapping in one span: the sweep
    // gives up at the first larger mapping and the range walk removes all.
    space
        .map(&mut w, BASE, BASE + PAGE - 1, gpa, Perm::RW)
        .unwrap();
    let four = BASE + 16 * PAGE;
    space
        .map(&mut w, four, four + 4 * PAGE - 1, gpa, Perm::RW)
        .unwrap();
    let huge = BASE + REGION;
    space
        .map(&mut w, huge, huge + REGION - 1, gpa, Perm::RW)
        .unwrap();
    let single = BASE + 3 * REGION;
    space
        .map(&mut w, single, single + PAGE - 1, gpa, Perm::RW)
        .unwrap();
    w.flush(&[]);
    space
        .invalidate(&mut w, BASE, BASE + 4 * REGION - 1)
        .unwrap();
    for iova in [BASE, four + PAGE, huge + 5 * PAGE, single] {
        assert_eq!(space.translate(iova, Perm::READ), Err(Fault::Unmapped));
    }
    w.flush(&[]);
    assert_eq!(space.stats().mappings, 0);
    space.audit().expect("audit");

    // A span that would split a mapping removes nothing, like an UNMAP.
    space
        .map(&mut w, BASE, BASE + PAGE - 1, gpa, Perm::RW)
        .unwrap();
    space
        .map(&mut w, four, four + 2 * PAGE - 1, gpa, Perm::RW)
        .unwrap();
    assert_eq!(
        space.invalidate(&mut w, BASE, four + PAGE - 1),
        Err(UnmapError::WouldSplit)
    );
    assert!(space.translate(BASE, Perm::READ).is_ok());
    assert!(space.translate(four + PAGE, Perm::READ).is_ok());
    w.flush(&[]);
    assert_eq!(space.stats().mappings, 2);
    space.audit().expect("audit");
}

/// Records what the flush sends to a consumer.
#[derive(Default)]
struct Log(std::sync::Mutex<Vec<std::ops::RangeInclusive<u64>>>);

impl crate::mapping::Invalidator for Log {
    fn invalidate(&self, _domain: u32, ranges: &[std::ops::RangeInclusive<u64>]) {
        if let Ok(mut v) = self.0.lock() {
            v.extend_from_slice(ranges);
        }
    }
}

#[test]
fn invalidate_inside_a_leaf_removes_exactly_its_span() {
    // The leaf loop checks the span's ends once per node, not per entry:
    // the entries just outside both ends must stay, and the consumers must
    // be told exactly the span (more than the 64 recorded removals, so the
    // covering range is computed from the tally too).
    let depot = Arc::new(Depot::new());
    let space = ScalableSpace::new(1, &Limits::default(), &depot);
    let mut w = QueueContext::new(&depot);
    let gpa = 1u64 << 32;
    for k in 0..100 {
        let iova = BASE + k * PAGE;
        space
            .map(&mut w, iova, iova + PAGE - 1, gpa, Perm::RW)
            .expect("map");
    }
    w.flush(&[]);
    let (lo, hi) = (BASE + 3 * PAGE, BASE + 90 * PAGE - 1);
    space.invalidate(&mut w, lo, hi).expect("invalidate");
    for k in 0..100 {
        let gone = space.translate(BASE + k * PAGE, Perm::READ) == Err(Fault::Unmapped);
        assert_eq!(gone, (3..90).contains(&k), "page {k}");
    }
    let log = Arc::new(Log::default());
    let consumers: Vec<Arc<dyn crate::mapping::Invalidator>> = vec![log.clone()];
    w.flush(&consumers);
    let sent = log.0.lock().expect("log").clone();
    assert_eq!(sent, vec![lo..=hi]);
    assert_eq!(space.stats().mappings, 13);
    space.audit().expect("audit");

    // Again over the same span: only stale marks, nothing removed.
    space.invalidate(&mut w, lo, hi).expect("invalidate");
    w.flush(&[]);
    assert_eq!(space.stats().mappings, 13);
    assert!(space.translate(BASE + 2 * PAGE, Perm::READ).is_ok());
    assert!(space.translate(BASE + 90 * PAGE, Perm::READ).is_ok());
    space.audit().expect("audit");
}
