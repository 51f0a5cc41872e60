//! Both domain-space implementations agree with a plain reference model of
//! the spec's MAP/UNMAP semantics on random request sequences: overlaps,
//! partial unmaps (WouldSplit), 2 MiB entries, the edges of the IOVA space
//! and unaligned input.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use virtio_iommu::mapping::{
    new_space, Depot, DomainSpace, Fault, Invalidator, Limits, MapError, Perm, QueueContext,
    SpaceImpl, UnmapError, GPA_MAX, IOVA_MAX,
};
use virtio_iommu::table::ScalableSpace;

const PAGE: u64 = 4096;
const HUGE: u64 = 2 << 20;

#[derive(Clone, Copy, Debug)]
struct Rec {
    last: u64,
    gpa: u64,
    perm: Perm,
}

/// The reference: mapping records in an ordered map, checked the slow way.
#[derive(Default, Debug)]
struct Model(BTreeMap<u64, Rec>);

impl Model {
    fn map(&mut self, iova: u64, last: u64, gpa: u64, perm: Perm) -> Result<(), MapError> {
        if last < iova {
            return Err(MapError::OutOfRange);
        }
        if !iova.is_multiple_of(PAGE) || !gpa.is_multiple_of(PAGE) || (last % PAGE) != PAGE - 1 {
            return Err(MapError::Unaligned);
        }
        if last > IOVA_MAX || gpa.checked_add(last - iova).is_none_or(|e| e > GPA_MAX) {
            return Err(MapError::OutOfRange);
        }
        if self.0.iter().any(|(&s, r)| s <= last && r.last >= iova) {
            return Err(MapError::Overlap);
        }
        self.0.insert(iova, Rec { last, gpa, perm });
        Ok(())
    }

    fn unmap(&mut self, iova: u64, last: u64) -> Result<Vec<(u64, u64)>, UnmapError> {
        if last < iova {
            return Ok(vec![]);
        }
        let hit: Vec<(u64, Rec)> = self
            .0
            .iter()
            .filter(|(&s, r)| s <= last && r.last >= iova)
            .map(|(&s, r)| (s, *r))
            .collect();
        if hit.iter().any(|(s, r)| *s < iova || r.last > last) {
            return Err(UnmapError::WouldSplit);
        }
        for (s, _) in &hit {
            self.0.remove(s);
        }
        Ok(hit.into_iter().map(|(s, r)| (s, r.last)).collect())
    }

    fn translate(&self, iova: u64, access: Perm) -> Result<(u64, u64, Perm), Fault> {
        match self.0.range(..=iova).next_back() {
            Some((&s, r)) if r.last >= iova => {
                if !r.perm.contains(access.intersection(Perm::RW)) {
                    return Err(Fault::Permission);
                }
                Ok((r.gpa + (iova - s), r.last - iova + 1, r.perm))
            }
            _ => Err(Fault::Unmapped),
        }
    }

    fn stats(&self) -> (u64, u64) {
        let bytes = self.0.iter().map(|(&s, r)| r.last - s + 1).sum();
        (self.0.len() as u64, bytes)
    }
}

/// Records every invalidation.
#[derive(Default)]
struct Log(Mutex<Vec<(u32, RangeInclusive<u64>)>>);
impl Invalidator for Log {
    fn invalidate(&self, domain: u32, ranges: &[RangeInclusive<u64>]) {
        let mut g = self.0.lock().unwrap();
        for r in ranges {
            g.push((domain, r.clone()));
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Map {
        iova: u64,
        last: u64,
        gpa: u64,
        perm: u32,
    },
    Unmap {
        iova: u64,
        last: u64,
    },
    Translate {
        iova: u64,
        access: u32,
    },
    Flush,
    Clear,
}

fn addr() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => (0u64..1536).prop_map(|p| p * PAGE),
        2 => (0u64..1536).prop_map(|p| IOVA_MAX + 1 - 1536 * PAGE + p * PAGE),
        1 => Just(0u64),
        1 => Just(IOVA_MAX + 1 - PAGE),
        1 => (0u64..8).prop_map(|h| h * HUGE),
        1 => any::<u64>(),
    ]
}

fn pages() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => Just(1u64),
        4 => 1u64..20,
        2 => Just(512u64),
        1 => Just(1024u64),
        1 => Just(513u64),
        1 => 1u64..3000,
    ]
}

fn gpa() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => (0u64..4096).prop_map(|p| p * PAGE),
        2 => (0u64..8).prop_map(|h| h * HUGE),
        1 => Just(GPA_MAX + 1 - PAGE),
        1 => Just(GPA_MAX + 1 - HUGE),
    ]
}

/// 0: as generated; 1: iova off by one; 2: last off by one; 3: gpa off by one.
fn skew() -> impl Strategy<Value = u8> {
    prop_oneof![12 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (addr(), pages(), gpa(), 0u32..8, skew()).prop_map(|(iova, n, gpa, perm, sk)| {
            let last = iova.wrapping_add(n * PAGE).wrapping_sub(1);
            match sk {
                1 => Op::Map { iova: iova.wrapping_add(1), last, gpa, perm },
                2 => Op::Map { iova, last: last.wrapping_sub(1), gpa, perm },
                3 => Op::Map { iova, last, gpa: gpa.wrapping_add(1), perm },
                _ => Op::Map { iova, last, gpa, perm },
            }
        }),
        4 => (addr(), pages(), skew()).prop_map(|(iova, n, sk)| {
            let last = iova.saturating_add(n * PAGE - 1);
            match sk {
                1 => Op::Unmap { iova: iova.wrapping_add(1), last },
                2 => Op::Unmap { iova, last: last.wrapping_sub(1) },
                _ => Op::Unmap { iova, last },
            }
        }),
        1 => Just(Op::Unmap { iova: 0, last: u64::MAX }),
        6 => (addr(), 0u64..2 * PAGE, 0u32..4)
            .prop_map(|(a, off, access)| Op::Translate { iova: a.wrapping_add(off), access }),
        1 => Just(Op::Flush),
        1 => Just(Op::Clear),
    ]
}

fn check_translate(space: &dyn DomainSpace, model: &Model, iova: u64, access: Perm) {
    let want = model.translate(iova, access);
    let got = space.translate(iova, access);
    match (want, got) {
        (Ok((gpa, len, perm)), Ok(t)) => {
            assert_eq!(t.gpa, gpa, "gpa of {iova:#x}");
            assert_eq!(t.perm, perm, "perm of {iova:#x}");
            // Never past the mapping; at least to the end of the 4 KiB page.
            assert!(t.len <= len, "len {:#x} > {len:#x} at {iova:#x}", t.len);
            let page_rest = PAGE - (iova % PAGE);
            assert!(t.len >= page_rest.min(len), "len {:#x} too short", t.len);
        }
        (Err(a), Err(b)) => assert_eq!(a, b, "fault at {iova:#x}"),
        (a, b) => panic!("translate {iova:#x}: model {a:?}, space {b:?}"),
    }
}

fn run(kind: SpaceImpl, ops: &[Op]) {
    let depot = Arc::new(Depot::new());
    // Keep the concrete type of the scalable space to audit it.
    let scalable = (kind == SpaceImpl::Scalable)
        .then(|| Arc::new(ScalableSpace::new(5, &Limits::default(), &depot)));
    let space: Arc<dyn DomainSpace> = match &scalable {
        Some(s) => s.clone(),
        None => new_space(kind, 5, &Limits::default(), &depot),
    };
    let mut w = QueueContext::new(&depot);
    let log = Arc::new(Log::default());
    let consumers: Vec<Arc<dyn Invalidator>> = vec![log.clone()];
    let mut model = Model::default();
    // Ranges the model removed since the last flush.
    let mut removed: Vec<(u64, u64)> = Vec::new();
    for op in ops {
        match *op {
            Op::Map {
                iova,
                last,
                gpa,
                perm,
            } => {
                let perm = Perm::from_bits_truncate(perm);
                let want = model.map(iova, last, gpa, perm);
                let got = space.map(&mut w, iova, last, gpa, perm);
                assert_eq!(got, want, "{kind} {op:?}");
            }
            Op::Unmap { iova, last } => {
                let want = model.unmap(iova, last);
                let got = space.unmap(&mut w, iova, last);
                assert_eq!(
                    got,
                    want.as_ref().map(|_| ()).map_err(|e| *e),
                    "{kind} {op:?}"
                );
                if let Ok(r) = want {
                    removed.extend(r);
                }
            }
            Op::Translate { iova, access } => {
                check_translate(&*space, &model, iova, Perm::from_bits_truncate(access));
            }
            Op::Flush => {
                w.flush(&consumers);
                check_invalidated(&log, &mut removed);
            }
            Op::Clear => {
                space.clear(&mut w);
                removed.extend(model.0.iter().map(|(&s, r)| (s, r.last)));
                model.0.clear();
            }
        }
        let s = space.stats();
        assert_eq!(
            (s.mappings, s.mapped_bytes),
            model.stats(),
            "{kind} stats after {op:?}"
        );
    }
    // Every mapping still translates; then everything goes away.
    for (&s, r) in &model.0 {
        check_translate(&*space, &model, s, Perm::NONE);
        check_translate(&*space, &model, r.last, Perm::NONE);
    }
    space.clear(&mut w);
    removed.extend(model.0.iter().map(|(&s, r)| (s, r.last)));
    model.0.clear();
    w.flush(&consumers);
    check_invalidated(&log, &mut removed);
    let s = space.stats();
    assert_eq!((s.mappings, s.mapped_bytes), (0, 0));
    if kind == SpaceImpl::Scalable {
        assert_eq!(
            s.table_bytes,
            ScalableSpace::EMPTY_TABLE_BYTES,
            "table memory leaked"
        );
    } else {
        assert_eq!(s.table_bytes, 0);
    }
    drop(w);
    drop(space);
    drop(scalable);
    let d = depot.stats();
    assert_eq!(d.in_depot, d.allocated, "depot counts unbalanced");
}

/// Every range removed since the last flush was covered by an invalidation.
fn check_invalidated(log: &Log, removed: &mut Vec<(u64, u64)>) {
    let got = std::mem::take(&mut *log.0.lock().unwrap());
    for &(s, l) in removed.iter() {
        assert!(
            got.iter()
                .any(|(d, r)| *d == 5 && *r.start() <= s && *r.end() >= l),
            "removed {s:#x}..={l:#x} not invalidated; got {got:x?}"
        );
    }
    removed.clear();
}

proptest! {
    // 300 cases by default; PROPTEST_CASES=N for a longer run.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(300),
        ..ProptestConfig::default()
    })]

    #[test]
    fn scalable_agrees_with_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(SpaceImpl::Scalable, &ops);
    }

    #[test]
    fn baseline_agrees_with_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(SpaceImpl::Baseline, &ops);
    }
}

#[test]
fn one_gib_map_uses_one_1gib_entry() {
    let depot = Arc::new(Depot::new());
    let space = ScalableSpace::new(1, &Limits::default(), &depot);
    let mut w = QueueContext::new(&depot);
    space
        .map(&mut w, 1 << 30, (2 << 30) - 1, 4 << 30, Perm::RW)
        .unwrap();
    // Root + one level-2 node holding one 1 GiB entry.
    let s = space.stats();
    assert_eq!(s.table_bytes, 2 * ScalableSpace::EMPTY_TABLE_BYTES);
    assert_eq!(s.mapped_bytes, 1 << 30);
    let a = space.audit().unwrap();
    assert_eq!((a.gib_entries, a.huge_entries, a.mappings), (1, 0, 1));
    let t = space.translate((1 << 30) + HUGE + 5, Perm::WRITE).unwrap();
    assert_eq!(t.gpa, (4 << 30) + HUGE + 5);
    assert_eq!(t.len, (1 << 30) - HUGE - 5);
    assert_eq!(
        space.unmap(&mut w, (1 << 30) + HUGE, (1 << 30) + 2 * HUGE - 1),
        Err(UnmapError::WouldSplit)
    );
    assert!(space.translate(1 << 30, Perm::READ).is_ok());
    space.unmap(&mut w, 1 << 30, (2 << 30) - 1).unwrap();
    assert_eq!(
        space.translate((1 << 30) + 8, Perm::READ),
        Err(Fault::Unmapped)
    );
    w.flush(&[]);
    assert_eq!(space.stats().table_bytes, ScalableSpace::EMPTY_TABLE_BYTES);
    assert_eq!(space.stats().mapped_bytes, 0);
}

#[test]
fn one_gib_map_of_2mib_aligned_gpa_uses_2mib_entries() {
    let depot = Arc::new(Depot::new());
    let space = new_space(SpaceImpl::Scalable, 1, &Limits::default(), &depot);
    let mut w = QueueContext::new(&depot);
    let gpa = (4 << 30) + HUGE;
    space
        .map(&mut w, 1 << 30, (2 << 30) - 1, gpa, Perm::RW)
        .unwrap();
    // Root + one level-2 node + one level-1 node of 512 2 MiB entries.
    let s = space.stats();
    assert_eq!(s.table_bytes, 3 * ScalableSpace::EMPTY_TABLE_BYTES);
    assert_eq!(s.mapped_bytes, 1 << 30);
    let t = space.translate((1 << 30) + HUGE + 5, Perm::WRITE).unwrap();
    assert_eq!(t.gpa, gpa + HUGE + 5);
    assert!(t.len >= HUGE - 5);
    assert_eq!(
        space.unmap(&mut w, 1 << 30, (1 << 30) + HUGE - 1),
        Err(UnmapError::WouldSplit)
    );
    space.unmap(&mut w, 0, u64::MAX).unwrap();
    w.flush(&[]);
    assert_eq!(space.stats().table_bytes, ScalableSpace::EMPTY_TABLE_BYTES);
}

#[test]
fn unaligned_gpa_falls_back_to_4k_entries() {
    let depot = Arc::new(Depot::new());
    let space = new_space(SpaceImpl::Scalable, 1, &Limits::default(), &depot);
    let mut w = QueueContext::new(&depot);
    space.map(&mut w, 0, HUGE - 1, PAGE, Perm::READ).unwrap();
    // Root, level 2, level 1 and one leaf node.
    assert_eq!(
        space.stats().table_bytes,
        4 * ScalableSpace::EMPTY_TABLE_BYTES
    );
    assert_eq!(
        space.translate(HUGE - 1, Perm::READ).unwrap().gpa,
        PAGE + HUGE - 1
    );
    assert_eq!(space.translate(0, Perm::WRITE), Err(Fault::Permission));
}

#[test]
fn limits_answer_no_memory() {
    for kind in [SpaceImpl::Scalable, SpaceImpl::Baseline] {
        let depot = Arc::new(Depot::new());
        let limits = Limits {
            max_mappings: 5,
            max_table_bytes: 1 << 20,
        };
        let space = new_space(kind, 1, &limits, &depot);
        let mut w = QueueContext::new(&depot);
        for i in 0..5 {
            space
                .map(&mut w, i * PAGE, i * PAGE + PAGE - 1, 0, Perm::READ)
                .unwrap();
        }
        assert_eq!(
            space.map(&mut w, 9 * PAGE, 10 * PAGE - 1, 0, Perm::READ),
            Err(MapError::NoMemory)
        );
        space.unmap(&mut w, 0, PAGE - 1).unwrap();
        space
            .map(&mut w, 9 * PAGE, 10 * PAGE - 1, 0, Perm::READ)
            .unwrap();
        assert_eq!(space.stats().mappings, 5);
    }
    // Table memory: 4 nodes allowed (root + 3) => mappings spread over
    // many 2 MiB regions soon fail, and the failed MAP changed nothing.
    let depot = Arc::new(Depot::new());
    let limits = Limits {
        max_mappings: 1000,
        max_table_bytes: 4 * ScalableSpace::EMPTY_TABLE_BYTES,
    };
    let space = new_space(SpaceImpl::Scalable, 1, &limits, &depot);
    let mut w = QueueContext::new(&depot);
    space.map(&mut w, 0, PAGE - 1, 0, Perm::READ).unwrap();
    assert_eq!(
        space.map(&mut w, HUGE, HUGE + PAGE - 1, 0, Perm::READ),
        Err(MapError::NoMemory)
    );
    assert_eq!(
        space.map(&mut w, HUGE - PAGE, HUGE + PAGE - 1, 0, Perm::READ),
        Err(MapError::NoMemory)
    );
    assert_eq!(
        space.translate(HUGE - PAGE, Perm::READ),
        Err(Fault::Unmapped)
    );
    assert_eq!(space.stats().mappings, 1);
}

#[test]
fn mapping_limit_is_exact_across_workers_after_their_flushes() {
    let depot = Arc::new(Depot::new());
    let limits = Limits {
        max_mappings: 1000,
        max_table_bytes: 1 << 24,
    };
    let space = new_space(SpaceImpl::Scalable, 1, &limits, &depot);
    let mut a = QueueContext::new(&depot);
    let mut b = QueueContext::new(&depot);
    // Worker a maps 400 (reserving quota in chunks), then ends its kick.
    for i in 0..400u64 {
        space
            .map(&mut a, i * PAGE, i * PAGE + PAGE - 1, 0, Perm::READ)
            .unwrap();
    }
    a.flush(&[]);
    // Worker b may use every remaining mapping, in kicks of 32.
    for i in 400..1000u64 {
        space
            .map(&mut b, i * PAGE, i * PAGE + PAGE - 1, 0, Perm::READ)
            .unwrap();
        if i % 32 == 0 {
            b.flush(&[]);
        }
    }
    assert_eq!(
        space.map(&mut b, 2000 * PAGE, 2001 * PAGE - 1, 0, Perm::READ),
        Err(MapError::NoMemory)
    );
    assert_eq!(
        space.map(&mut a, 2000 * PAGE, 2001 * PAGE - 1, 0, Perm::READ),
        Err(MapError::NoMemory)
    );
    // Worker a frees one; after its flush worker b can use it.
    space.unmap(&mut a, 0, PAGE - 1).unwrap();
    a.flush(&[]);
    space
        .map(&mut b, 2000 * PAGE, 2001 * PAGE - 1, 0, Perm::READ)
        .unwrap();
    assert_eq!(space.stats().mappings, 1000);
}
