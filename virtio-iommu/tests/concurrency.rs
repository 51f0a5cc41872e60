//! Concurrent MAP/UNMAP/translate on one domain from several threads, each
//! with its own `QueueContext` like the request queues of the device.
//!
//! Checked: no lost mapping (disjoint ranges always map and translate),
//! overlapping requests stay linearizable (two mutually overlapping
//! mappings never coexist, an UNMAP never removes another thread's mapping
//! it only partly covers), no translation outlives a completed UNMAP (a
//! stale-read detector, across node retirement and reuse and across two
//! domains sharing a depot), and no table memory leaks.

use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use virtio_iommu::mapping::{
    new_space, Depot, DomainSpace, Fault, Invalidator, Limits, MapError, Perm, QueueContext,
    SpaceImpl, UnmapError,
};
use virtio_iommu::table::ScalableSpace;

const PAGE: u64 = 4096;
const HUGE: u64 = 2 << 20;

struct Counting(AtomicU64);
impl Invalidator for Counting {
    fn invalidate(&self, _domain: u32, ranges: &[RangeInclusive<u64>]) {
        assert!(!ranges.is_empty());
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// A test-chosen count or index as a `usize`.
fn idx(x: u64) -> usize {
    usize::try_from(x).expect("test indices fit a usize")
}

fn consumers() -> Vec<Arc<dyn Invalidator>> {
    vec![Arc::new(Counting(AtomicU64::new(0)))]
}

fn check_empty(kind: SpaceImpl, space: &dyn DomainSpace) {
    let s = space.stats();
    assert_eq!((s.mappings, s.mapped_bytes), (0, 0), "{kind}");
    if kind == SpaceImpl::Scalable {
        assert_eq!(
            s.table_bytes,
            ScalableSpace::EMPTY_TABLE_BYTES,
            "table memory leaked"
        );
    }
}

/// Disjoint ranges per thread: every MAP and UNMAP succeeds and every
/// mapping translates to what its thread mapped.
fn disjoint(kind: SpaceImpl) {
    let depot = Arc::new(Depot::new());
    let space = new_space(kind, 1, &Limits::default(), &depot);
    let threads = 4u64;
    let start = Arc::new(Barrier::new(idx(threads)));
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let (space, depot, start) = (space.clone(), depot.clone(), start.clone());
            thread::spawn(move || {
                let mut w = QueueContext::new(&depot);
                let cons = consumers();
                // Threads share 2 MiB regions (interleaved pages) and also
                // use private ones (huge entries, multi-page mappings).
                let shared = 8 * HUGE;
                let own = (64 + 16 * t) * HUGE;
                start.wait();
                for round in 0..300u64 {
                    let gpa = (t << 40) | (round << 24);
                    let mut live = Vec::new();
                    for k in 0..16u64 {
                        let iova = shared + (k * threads + t) * PAGE;
                        space
                            .map(&mut w, iova, iova + PAGE - 1, gpa + k * PAGE, Perm::RW)
                            .unwrap();
                        live.push((iova, PAGE, gpa + k * PAGE));
                    }
                    let big = own + (round % 4) * HUGE;
                    space
                        .map(&mut w, big, big + HUGE - 1, gpa + HUGE, Perm::READ)
                        .unwrap();
                    live.push((big, HUGE, gpa + HUGE));
                    let multi = own + 8 * HUGE + (round % 3) * 5 * PAGE;
                    space
                        .map(
                            &mut w,
                            multi,
                            multi + 5 * PAGE - 1,
                            gpa + 8 * HUGE,
                            Perm::WRITE,
                        )
                        .unwrap();
                    live.push((multi, 5 * PAGE, gpa + 8 * HUGE));
                    for &(iova, len, g) in &live {
                        for off in [0, len / 2, len - 1] {
                            let tr = space.translate(iova + off, Perm::NONE).unwrap();
                            assert_eq!(tr.gpa, g + off, "lost mapping at {:#x}", iova + off);
                        }
                    }
                    for (i, &(iova, len, _)) in live.iter().enumerate() {
                        space.unmap(&mut w, iova, iova + len - 1).unwrap();
                        if i % 8 == 7 {
                            w.flush(&cons);
                        }
                    }
                    w.flush(&cons);
                    for &(iova, _, _) in &live {
                        assert_eq!(space.translate(iova, Perm::NONE), Err(Fault::Unmapped));
                    }
                }
                w.flush(&cons);
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    check_empty(kind, &*space);
}

#[test]
fn disjoint_ranges_never_lose_mappings_scalable() {
    disjoint(SpaceImpl::Scalable);
}

#[test]
fn disjoint_ranges_never_lose_mappings_baseline() {
    disjoint(SpaceImpl::Baseline);
}

/// Threads map ranges that pairwise overlap and unmap exactly their own
/// range. Whoever holds its mapping must see it intact and must be able to
/// unmap it; nobody may ever remove someone else's mapping.
fn overlapping(kind: SpaceImpl) {
    let depot = Arc::new(Depot::new());
    let space = new_space(kind, 2, &Limits::default(), &depot);
    // Pairwise overlapping ranges, none containing another (so an UNMAP
    // of one range can never legitimately remove another thread's mapping):
    // pages 0..8, 4..12, 2..10, a 2 MiB entry, and 3-page ranges crossing
    // each edge of that 2 MiB region.
    let ranges: Vec<(u64, u64)> = vec![
        (0, 8 * PAGE - 1),
        (4 * PAGE, 12 * PAGE - 1),
        (2 * PAGE, 10 * PAGE - 1),
        (HUGE, 2 * HUGE - 1),
        (HUGE - 2 * PAGE, HUGE + PAGE - 1),
        (2 * HUGE - PAGE, 2 * HUGE + 2 * PAGE - 1),
    ];
    let n = ranges.len();
    let start = Arc::new(Barrier::new(n));
    let successes = Arc::new(AtomicU64::new(0));
    let hs: Vec<_> = ranges
        .iter()
        .enumerate()
        .map(|(t, &(lo, hi))| {
            let (space, depot, start, successes) = (
                space.clone(),
                depot.clone(),
                start.clone(),
                successes.clone(),
            );
            thread::spawn(move || {
                let mut w = QueueContext::new(&depot);
                let cons = consumers();
                let gpa = (t as u64 + 1) << 32;
                start.wait();
                for i in 0..3000u64 {
                    match space.map(&mut w, lo, hi, gpa, Perm::RW) {
                        Ok(()) => {
                            successes.fetch_add(1, Ordering::Relaxed);
                            // Ours until we remove it: nobody else can map
                            // over it or unmap it without splitting it.
                            for off in [0, (hi - lo) / 2, hi - lo] {
                                let tr = space.translate(lo + off, Perm::RW).unwrap();
                                assert_eq!(tr.gpa, gpa + off, "thread {t} lost its mapping");
                            }
                            if i % 3 == 0 {
                                thread::yield_now();
                            }
                            assert_eq!(space.unmap(&mut w, lo, hi), Ok(()), "thread {t} unmap");
                        }
                        Err(MapError::Overlap) => {
                            // Someone else's mapping overlaps: our UNMAP must
                            // split it or find nothing, never remove it (its
                            // owner checks that it stays intact).
                            match space.unmap(&mut w, lo, hi) {
                                Ok(()) | Err(UnmapError::WouldSplit) => {}
                            }
                        }
                        Err(e) => panic!("thread {t}: {e:?}"),
                    }
                    if i % 4 == 0 {
                        w.flush(&cons);
                    }
                }
                w.flush(&cons);
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert!(successes.load(Ordering::Relaxed) > 0);
    check_empty(kind, &*space);
}

#[test]
fn overlapping_requests_stay_linearizable_scalable() {
    overlapping(SpaceImpl::Scalable);
}

#[test]
fn overlapping_requests_stay_linearizable_baseline() {
    overlapping(SpaceImpl::Baseline);
}

/// gpa encoding of incarnation `k` of page `p` in domain `d`.
fn gpa_of(d: u64, p: u64, k: u64) -> u64 {
    (d << 44) | (k << 20) | (p << 12)
}

/// A mapper maps incarnation k of a page, unmaps it, flushes, and only then
/// publishes "k is gone". A translator that read the published value before
/// translating must never see incarnation <= that value. The pages sit in
/// different 2 MiB regions, so every round empties and retires leaf nodes
/// and reuses them through the magazines, also for a second domain whose
/// mappings sit at the same IOVAs: a translator following a stale link into
/// a reused node would return the other domain's gpa.
fn stale_reads(kind: SpaceImpl) {
    let depot = Arc::new(Depot::new());
    let spaces: Vec<Arc<dyn DomainSpace>> = (0..2)
        .map(|d| new_space(kind, d, &Limits::default(), &depot))
        .collect();
    let pages: Vec<u64> = (0..4u64).map(|p| p * HUGE + (p % 3) * PAGE).collect();
    let done = Arc::new(AtomicBool::new(false));
    // completed[d][p]: last incarnation of page p in domain d whose UNMAP completed.
    let completed: Arc<Vec<Vec<AtomicU64>>> = Arc::new(
        (0..2)
            .map(|_| (0..pages.len()).map(|_| AtomicU64::new(0)).collect())
            .collect(),
    );
    let hits = Arc::new(AtomicU64::new(0));
    let mut hs = Vec::new();
    for d in 0..2u64 {
        let (space, depot, done, completed, pages) = (
            spaces[idx(d)].clone(),
            depot.clone(),
            done.clone(),
            completed.clone(),
            pages.clone(),
        );
        hs.push(thread::spawn(move || {
            let mut w = QueueContext::new(&depot);
            let cons = consumers();
            for k in 1..=3000u64 {
                for (p, &iova) in pages.iter().enumerate() {
                    let g = gpa_of(d, p as u64, k);
                    space
                        .map(&mut w, iova, iova + PAGE - 1, g, Perm::READ)
                        .unwrap();
                }
                w.flush(&cons);
                // Leave the translators a window to see the mappings.
                for _ in 0..2000 {
                    std::hint::spin_loop();
                }
                for &iova in &pages {
                    space.unmap(&mut w, iova, iova + PAGE - 1).unwrap();
                }
                w.flush(&cons);
                for p in 0..pages.len() {
                    completed[idx(d)][p].store(k, Ordering::Release);
                }
            }
            done.store(true, Ordering::Release);
        }));
    }
    for tr in 0..2u64 {
        let (spaces, done, completed, pages, hits) = (
            spaces.clone(),
            done.clone(),
            completed.clone(),
            pages.clone(),
            hits.clone(),
        );
        hs.push(thread::spawn(move || {
            let mut i = 0u64;
            while !done.load(Ordering::Acquire) {
                i += 1;
                let d = idx((i + tr) % 2);
                let p = idx(i % pages.len() as u64);
                let gone = completed[d][p].load(Ordering::Acquire);
                match spaces[d].translate(pages[p] + 0x10, Perm::READ) {
                    Ok(t) => {
                        let k = (t.gpa >> 20) & ((1 << 24) - 1);
                        assert_eq!(t.gpa >> 44, d as u64, "translation from another domain");
                        assert_eq!(
                            (t.gpa >> 12) & 0xff,
                            p as u64,
                            "translation of another page"
                        );
                        assert_eq!(t.gpa & 0xfff, 0x10);
                        assert!(
                            k > gone,
                            "stale: incarnation {k} after UNMAP of {gone} completed"
                        );
                        hits.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(Fault::Unmapped) => {}
                    Err(e) => panic!("{e:?}"),
                }
            }
        }));
    }
    for h in hs {
        h.join().unwrap();
    }
    // The detector must have seen live mappings, or it proved nothing.
    assert!(hits.load(Ordering::Relaxed) > 0);
    let mut w = QueueContext::new(&depot);
    for s in &spaces {
        s.clear(&mut w);
    }
    w.flush(&consumers());
    for s in &spaces {
        check_empty(kind, &**s);
    }
}

#[test]
fn no_translation_outlives_a_completed_unmap_scalable() {
    stale_reads(SpaceImpl::Scalable);
}

#[test]
fn no_translation_outlives_a_completed_unmap_baseline() {
    stale_reads(SpaceImpl::Baseline);
}

/// After concurrent churn, clearing leaves only the roots, and once every
/// worker and table is gone the depot holds every node it ever allocated.
#[test]
fn table_memory_is_reclaimed_and_depot_balanced() {
    let depot = Arc::new(Depot::new());
    let space = new_space(SpaceImpl::Scalable, 3, &Limits::default(), &depot);
    let hs: Vec<_> = (0..3u64)
        .map(|t| {
            let (space, depot) = (space.clone(), depot.clone());
            thread::spawn(move || {
                let mut w = QueueContext::new(&depot);
                let cons = consumers();
                for i in 0..2000u64 {
                    // Spread over many leaves and upper-level nodes.
                    let iova = ((i * 7919 + t * 104_729) % 4096) * HUGE + (t << 39);
                    space
                        .map(&mut w, iova, iova + PAGE - 1, iova, Perm::RW)
                        .unwrap();
                    if i % 3 != 0 {
                        space.unmap(&mut w, iova, iova + PAGE - 1).unwrap();
                    }
                    if i % 32 == 0 {
                        w.flush(&cons);
                    }
                }
                w.flush(&cons);
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert!(space.stats().table_bytes > 100 * ScalableSpace::EMPTY_TABLE_BYTES);
    let mut w = QueueContext::new(&depot);
    space.clear(&mut w);
    w.flush(&consumers());
    check_empty(SpaceImpl::Scalable, &*space);
    drop(w);
    let before_drop = depot.stats();
    // Only the root is outside the depot.
    assert_eq!(before_drop.in_depot + 1, before_drop.allocated);
    drop(space);
    let d = depot.stats();
    assert_eq!(d.in_depot, d.allocated);
}

/// Threads map and unmap random, mutually overlapping ranges (single pages,
/// multi-page ranges crossing leaf and 2 MiB boundaries, 2 MiB entries)
/// in one 8 MiB window while translators check every answer is a whole,
/// consistent mapping. Afterwards the table must be internally consistent:
/// no torn mapping (head/tail/gpa continuity), no claim left behind, live
/// counts equal to the entries present, counters equal to the contents.
#[test]
fn random_overlapping_churn_keeps_the_table_consistent() {
    let depot = Arc::new(Depot::new());
    let space = Arc::new(ScalableSpace::new(4, &Limits::default(), &depot));
    let window = 4 * HUGE;
    let done = Arc::new(AtomicBool::new(false));
    let mut hs = Vec::new();
    for t in 0..3u64 {
        let (space, depot) = (space.clone(), depot.clone());
        hs.push(thread::spawn(move || {
            let mut w = QueueContext::new(&depot);
            let cons = consumers();
            let mut x = 0x2545_f491_4f6c_dd1du64 ^ (t + 1);
            let mut ok = 0u64;
            for seq in 0..4000u64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let (iova, len) = match x % 8 {
                    0 => ((x >> 8) % 4 * HUGE + HUGE, HUGE),
                    1 | 2 => (
                        (x >> 8) % (window / PAGE - 8) * PAGE + HUGE,
                        (1 + (x >> 40) % 7) * PAGE,
                    ),
                    3 => (2 * HUGE - 2 * PAGE, 4 * PAGE),
                    _ => ((x >> 8) % (window / PAGE) * PAGE + HUGE, PAGE),
                };
                if x & (1 << 62) == 0 {
                    // The gpa names the thread and sequence; 2 MiB aligned
                    // so 2 MiB entries are used where possible.
                    let gpa = (t << 44) | (seq << 22);
                    if space
                        .map(&mut w, iova, iova + len - 1, gpa, Perm::RW)
                        .is_ok()
                    {
                        ok += 1;
                    }
                } else {
                    let _ = space.unmap(&mut w, iova, iova + len - 1);
                }
                if seq % 16 == 0 {
                    w.flush(&cons);
                }
            }
            w.flush(&cons);
            assert!(ok > 0);
        }));
    }
    let tr = {
        let (space, done) = (space.clone(), done.clone());
        thread::spawn(move || {
            let mut x = 7u64;
            while !done.load(Ordering::Acquire) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let iova = HUGE + x % window;
                if let Ok(t) = space.translate(iova, Perm::RW) {
                    // Mapped gpas are (thread << 44) | (seq << 22) + offset:
                    // the offset into the mapping is below 8 MiB.
                    assert!(t.gpa >> 44 < 3, "garbage translation {:#x}", t.gpa);
                    assert!(t.len >= 1 && t.len <= window);
                    assert_eq!(t.perm, Perm::RW);
                }
            }
        })
    };
    for h in hs {
        h.join().unwrap();
    }
    done.store(true, Ordering::Release);
    tr.join().unwrap();
    let a = space.audit().unwrap();
    let s = space.stats();
    assert_eq!((a.mappings, a.mapped_bytes), (s.mappings, s.mapped_bytes));
    let mut w = QueueContext::new(&depot);
    space.clear(&mut w);
    w.flush(&consumers());
    space.audit().unwrap();
    check_empty(SpaceImpl::Scalable, &*space);
}
