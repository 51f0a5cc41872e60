//! The one-page fast paths: they answer like the general path where a
//! guest races or misuses them, and their deferred counts add up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use super::super::ScalableSpace;
use crate::mapping::{Depot, DomainSpace, Fault, Limits, MapError, Perm, QueueContext, UnmapError};

const PAGE: u64 = 4096;
const GIB: u64 = 1 << 30;

/// Two threads meeting at step `k` (counting from 1): spins rather than
/// sleeps, so both leave within a cache-line transfer of each other and
/// their next requests race for real.
fn meet(steps: &AtomicU64, k: u64) {
    steps.fetch_add(1, Ordering::AcqRel);
    let mut spins = 0u32;
    while steps.load(Ordering::Acquire) < 2 * k {
        spins += 1;
        if spins.is_multiple_of(1024) {
            thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

fn setup(limits: &Limits) -> (Arc<Depot>, Arc<ScalableSpace>) {
    let depot = Arc::new(Depot::new());
    let space = Arc::new(ScalableSpace::new(1, limits, &depot));
    (depot, space)
}

/// Puts `w` on the fast path for the 2 MiB region of `iova`: a one-page
/// MAP and UNMAP there leave it holding the leaf and owning credits and a
/// counter shard of the domain.
fn warm(space: &ScalableSpace, w: &mut QueueContext, iova: u64) {
    let at = (iova & !((2 << 20) - 1)) + 511 * PAGE;
    space
        .map(w, at, at + PAGE - 1, 0, Perm::READ)
        .expect("warm map");
    space.unmap(w, at, at + PAGE - 1).expect("warm unmap");
}

/// A MAP of a page already mapped is refused with `Overlap` (the spec's
/// `S_INVAL`), changes nothing, and costs no quota.
#[test]
fn fast_map_of_a_mapped_page_is_an_overlap() {
    let (depot, space) = setup(&Limits {
        max_mappings: 2,
        ..Limits::default()
    });
    let mut w = QueueContext::new(&depot);
    let iova = GIB + 3 * PAGE;
    warm(&space, &mut w, iova);
    space
        .map(&mut w, iova, iova + PAGE - 1, 1 << 32, Perm::RW)
        .expect("map");
    for _ in 0..4 {
        assert_eq!(
            space.map(&mut w, iova, iova + PAGE - 1, 2 << 32, Perm::READ),
            Err(MapError::Overlap)
        );
    }
    let t = space.translate(iova, Perm::WRITE).expect("still mapped");
    assert_eq!(t.gpa, 1 << 32, "the first mapping is untouched");
    // The refused MAPs took no quota: the second mapping of the limit fits.
    let other = iova + PAGE;
    space
        .map(&mut w, other, other + PAGE - 1, 0, Perm::READ)
        .expect("map 2");
    assert_eq!(
        space.map(&mut w, other + PAGE, other + 2 * PAGE - 1, 0, Perm::READ),
        Err(MapError::NoMemory),
        "the limit holds on the fast path"
    );
    assert_eq!(space.stats().mappings, 2);
    w.flush(&[]);
    space.audit().expect("audit");
}

/// A one-page UNMAP inside a two-page mapping would split it: refused,
/// nothing removed, nothing recorded for the consumers.
#[test]
fn fast_unmap_never_splits_a_larger_mapping() {
    let (depot, space) = setup(&Limits::default());
    let mut w = QueueContext::new(&depot);
    let iova = GIB + 8 * PAGE;
    warm(&space, &mut w, iova);
    w.flush(&[]);
    space
        .map(&mut w, iova, iova + 2 * PAGE - 1, 1 << 32, Perm::RW)
        .expect("map");
    for page in [iova, iova + PAGE] {
        assert_eq!(
            space.unmap(&mut w, page, page + PAGE - 1),
            Err(UnmapError::WouldSplit)
        );
    }
    assert!(!w.has_pending(), "a refused UNMAP records nothing");
    assert_eq!(
        space.translate(iova + PAGE, Perm::READ).map(|t| t.gpa),
        Ok((1 << 32) + PAGE)
    );
    space
        .unmap(&mut w, iova, iova + 2 * PAGE - 1)
        .expect("whole unmap");
    assert_eq!(space.translate(iova, Perm::READ), Err(Fault::Unmapped));
    assert_eq!(space.stats().mappings, 0);
    w.flush(&[]);
    space.audit().expect("audit");
}

/// Two queues MAP the same page at the same moment, then both UNMAP it,
/// round after round, both on their fast paths (same held leaf, own
/// counter shards): exactly one MAP of each round succeeds (the other is
/// an overlap), and the mapping is removed exactly once (a lost race
/// counted as a success on either side leaves the domain's count off).
#[test]
fn two_queues_racing_on_one_page_count_each_mapping_once() {
    const ROUNDS: u64 = 50_000;
    let (depot, space) = setup(&Limits::default());
    let steps = AtomicU64::new(0);
    let refused: u64 = thread::scope(|s| {
        let handles: Vec<_> = (0..2u64)
            .map(|k| {
                let (depot, space, steps) = (&depot, &space, &steps);
                s.spawn(move || {
                    let mut w = QueueContext::new(depot);
                    warm(space, &mut w, GIB);
                    let mut refused = 0u64;
                    for r in 0..ROUNDS {
                        let iova = GIB + (r % 64) * PAGE;
                        meet(steps, 2 * r + 1);
                        let gpa = (k + 1) << 32;
                        match space.map(&mut w, iova, iova + PAGE - 1, gpa, Perm::RW) {
                            Ok(()) => {}
                            Err(e) => {
                                assert_eq!(e, MapError::Overlap);
                                refused += 1;
                            }
                        }
                        // Both MAPs are done before either UNMAP.
                        meet(steps, 2 * r + 2);
                        space.unmap(&mut w, iova, iova + PAGE - 1).expect("unmap");
                        if r % 32 == 31 {
                            w.flush(&[]);
                        }
                    }
                    w.flush(&[]);
                    refused
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("racer")).sum()
    });
    assert_eq!(refused, ROUNDS, "one MAP of each round is refused");
    let stats = space.stats();
    assert_eq!(
        (stats.mappings, stats.mapped_bytes),
        (0, 0),
        "{refused} refused"
    );
    space.audit().expect("audit");
}
