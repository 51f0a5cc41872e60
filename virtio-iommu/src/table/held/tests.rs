//! The held leaf and the kept directory nodes: what they keep linked, for
//! how long, and that the counts they defer come out exact.

use std::sync::Arc;

use super::super::ScalableSpace;
use crate::mapping::{Depot, DomainSpace, Fault, Limits, Perm, QueueContext};

const PAGE: u64 = 4096;
const GIB: u64 = 1 << 30;
const EMPTY: u64 = ScalableSpace::EMPTY_TABLE_BYTES;

fn setup() -> (Arc<Depot>, ScalableSpace) {
    let depot = Arc::new(Depot::new());
    let space = ScalableSpace::new(1, &Limits::default(), &depot);
    (depot, space)
}

/// Worker `a` maps a page (its leaf held), worker `b` unmaps it and
/// flushes: `a`'s hold keeps the leaf linked (root + 3 nodes); once `a`
/// flushes too, `live` is exact again (audit) and the path is retired.
#[test]
fn held_leaf_stays_linked_until_its_holder_flushes() {
    let (depot, space) = setup();
    let mut a = QueueContext::new(&depot);
    let mut b = QueueContext::new(&depot);
    let iova = GIB + 5 * PAGE;
    space
        .map(&mut a, iova, iova + PAGE - 1, 1 << 32, Perm::RW)
        .expect("map");
    space.unmap(&mut b, iova, iova + PAGE - 1).expect("unmap");
    assert_eq!(space.translate(iova, Perm::READ), Err(Fault::Unmapped));
    b.flush(&[]);
    assert_eq!(
        space.stats().table_bytes,
        4 * EMPTY,
        "leaf retired while held"
    );
    assert_eq!(space.stats().mappings, 0);
    a.flush(&[]);
    space.audit().expect("audit");
    assert_eq!(space.stats().table_bytes, EMPTY);
}

/// Many pairs in one kick on one held leaf, some of its entries emptied
/// by another worker: the deferred deltas (past MAX_DELTA too) add up.
#[test]
fn held_leaf_counts_add_up_after_long_kicks() {
    let (depot, space) = setup();
    let mut a = QueueContext::new(&depot);
    let mut b = QueueContext::new(&depot);
    for i in 0..2000u64 {
        let iova = GIB + (i % 300) * PAGE;
        space
            .map(&mut a, iova, iova + PAGE - 1, 1 << 32, Perm::READ)
            .expect("map");
        let who = if i % 3 == 0 { &mut b } else { &mut a };
        space.unmap(who, iova, iova + PAGE - 1).expect("unmap");
    }
    let keep = GIB + 7 * PAGE;
    space
        .map(&mut a, keep, keep + PAGE - 1, 1 << 32, Perm::READ)
        .expect("map");
    a.flush(&[]);
    b.flush(&[]);
    let audit = space.audit().expect("audit");
    assert_eq!(audit.mappings, 1);
    space.unmap(&mut b, keep, keep + PAGE - 1).expect("unmap");
    b.flush(&[]);
    space.audit().expect("audit");
    assert_eq!(space.stats().table_bytes, EMPTY);
}

/// A 1 GiB block mapped and unmapped in every kick: the first kick
/// retires its level-2 node, the second keeps it linked (empty), a kick
/// that does not empty it again retires it; `clear` retires at once.
#[test]
fn node_emptied_in_two_kicks_running_stays_linked_one_more() {
    let (depot, space) = setup();
    let mut w = QueueContext::new(&depot);
    let pair = |w: &mut QueueContext| {
        space
            .map(w, GIB, 2 * GIB - 1, 4 * GIB, Perm::RW)
            .expect("map");
        space.unmap(w, GIB, 2 * GIB - 1).expect("unmap");
        w.flush(&[]);
    };
    pair(&mut w);
    assert_eq!(space.stats().table_bytes, EMPTY);
    pair(&mut w);
    assert_eq!(space.stats().table_bytes, 2 * EMPTY, "hot node retired");
    assert_eq!(space.translate(GIB, Perm::READ), Err(Fault::Unmapped));
    pair(&mut w);
    assert_eq!(space.stats().table_bytes, 2 * EMPTY);
    space.audit().expect("audit");
    w.flush(&[]);
    assert_eq!(space.stats().table_bytes, EMPTY, "idle node kept");
    pair(&mut w);
    pair(&mut w);
    assert_eq!(space.stats().table_bytes, 2 * EMPTY);
    space.clear(&mut w);
    w.flush(&[]);
    assert_eq!(space.stats().table_bytes, EMPTY, "clear kept a node");
}
