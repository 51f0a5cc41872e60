//! The leaf hints answer as the walk does, also when a hint names a node
//! that has since been unlinked and linked again elsewhere.

use std::cell::RefCell;
use std::sync::atomic::Ordering::{Acquire, Release};
use std::sync::Arc;

use super::super::entry::PENDING;
use super::super::{ScalableSpace, ROOT_LEVEL};
use super::*;
use crate::mapping::{Depot, DomainSpace, Limits, QueueContext};

const REGION: u64 = 2 << 20;

thread_local! {
    /// Run once by the next hinted read of this thread, between its entry
    /// read and the validation: what another thread could do there.
    static BETWEEN: RefCell<Option<Box<dyn FnOnce()>>> = const { RefCell::new(None) };
}

/// Called by `entry_of` after it read the entry (tests only).
pub(super) fn between_reads() {
    let f = BETWEEN.with(|b| b.borrow_mut().take());
    if let Some(f) = f {
        f();
    }
}

/// The level-0 node linked for `iova`'s region now, if any.
fn leaf_node(space: &ScalableSpace, iova: u64) -> Option<u64> {
    let t = &space.table;
    let mut n = t.root();
    for lvl in (1..=ROOT_LEVEL).rev() {
        let e = n.entries[index(iova, lvl)].load(Acquire);
        if !entry::is_dir(e) {
            return None;
        }
        n = t.node(entry::addr(e));
    }
    Some(n as *const Node as u64)
}

fn hint(space: &ScalableSpace, iova: u64) -> u64 {
    space.hints.slot(iova).load(Acquire)
}

fn setup() -> (Arc<Depot>, ScalableSpace, QueueContext) {
    let depot = Arc::new(Depot::new());
    let space = ScalableSpace::new(1, &Limits::default(), &depot);
    let w = QueueContext::new(&depot);
    (depot, space, w)
}

/// Maps one page at `base` to 4 GiB, translates it once so that the walk
/// leaves its hint, and returns the leaf node the hint names.
fn hinted_page(space: &ScalableSpace, w: &mut QueueContext, base: u64) -> u64 {
    space
        .map(w, base, base + PAGE - 1, 1 << 32, Perm::RW)
        .unwrap();
    w.flush(&[]);
    space.translate(base, Perm::READ).unwrap();
    let node = leaf_node(space, base).unwrap();
    assert_eq!(hint(space, base), node);
    node
}

/// Regions 0 and 64 share a hint slot. A translation in region 0 leaves a
/// hint to its leaf node; the node is emptied (and may retire), and region 64
/// gets a leaf node with a mapping at the same slot of the node. A hint
/// naming that node (as it does when a retired node is recycled there,
/// which the allocator's order decides, so it is set here directly) leads
/// to a valid entry: only the position check keeps region 0's translation
/// from answering with region 64's page.
#[test]
fn a_hint_to_a_node_now_linked_elsewhere_is_not_followed() {
    let (_depot, space, mut w) = setup();
    let a = 5 * PAGE + 0x10;
    let b = 64 * REGION + 5 * PAGE + 0x10;
    assert!(std::ptr::eq(space.hints.slot(a), space.hints.slot(b)));
    // Keeps the directory nodes above both regions linked, so that only
    // the leaf node retires.
    let keep = REGION;
    space
        .map(&mut w, keep, keep + PAGE - 1, 1 << 34, Perm::RW)
        .unwrap();
    space
        .map(&mut w, a & !(PAGE - 1), a | (PAGE - 1), 1 << 32, Perm::RW)
        .unwrap();
    w.flush(&[]);
    assert_eq!(
        space.translate(a, Perm::READ).unwrap().gpa,
        (1 << 32) + 0x10
    );
    let node_a = leaf_node(&space, a).unwrap();
    assert_eq!(hint(&space, a), node_a, "the walk left no hint");
    // Through the hint now.
    assert_eq!(
        space.translate(a, Perm::READ).unwrap().gpa,
        (1 << 32) + 0x10
    );

    // A hint to an emptied node (retired at the flush, or kept linked
    // while empty): its entry is empty, the walk answers.
    space
        .unmap(&mut w, a & !(PAGE - 1), a | (PAGE - 1))
        .unwrap();
    w.flush(&[]);
    assert_eq!(hint(&space, a), node_a);
    assert_eq!(space.translate(a, Perm::READ), Err(Fault::Unmapped));

    // A hint to a node linked at another position, with a valid entry.
    space
        .map(&mut w, b & !(PAGE - 1), b | (PAGE - 1), 1 << 33, Perm::RW)
        .unwrap();
    w.flush(&[]);
    let node_b = leaf_node(&space, b).unwrap();
    space.hints.slot(a).store(node_b, Release);
    assert_eq!(space.translate(a, Perm::READ), Err(Fault::Unmapped));
    assert_eq!(
        space.translate(b, Perm::READ).unwrap().gpa,
        (1 << 33) + 0x10
    );
    // The same node in another table at the same position is refused too.
    let (_depot2, other, mut w2) = setup();
    other
        .map(&mut w2, a & !(PAGE - 1), a | (PAGE - 1), 1 << 35, Perm::RW)
        .unwrap();
    w2.flush(&[]);
    space
        .hints
        .slot(a)
        .store(leaf_node(&other, a).unwrap(), Release);
    assert_eq!(space.translate(a, Perm::READ), Err(Fault::Unmapped));
    space.audit().unwrap();
}

/// Regions that share a slot take turns in it; every answer is the walk's.
#[test]
fn regions_sharing_a_slot_are_answered_correctly() {
    let (_depot, space, mut w) = setup();
    let regions = [0u64, 64, 128, 192];
    for (k, r) in regions.iter().enumerate() {
        let iova = r * REGION + (k as u64) * PAGE;
        let perm = if k % 2 == 0 { Perm::RW } else { Perm::READ };
        space
            .map(&mut w, iova, iova + PAGE - 1, (k as u64 + 1) << 32, perm)
            .unwrap();
    }
    w.flush(&[]);
    for round in 0..3 {
        for (k, r) in regions.iter().enumerate() {
            let iova = r * REGION + (k as u64) * PAGE + 8 * round;
            let t = space.translate(iova, Perm::READ).unwrap();
            assert_eq!(
                (t.gpa, t.len),
                (((k as u64 + 1) << 32) + 8 * round, PAGE - 8 * round)
            );
            let write = space.translate(iova, Perm::WRITE);
            if k % 2 == 0 {
                assert!(write.is_ok());
            } else {
                assert_eq!(write, Err(Fault::Permission));
            }
            // A page of the same node with nothing mapped: the walk's fault.
            assert_eq!(
                space.translate(iova + 100 * PAGE, Perm::READ),
                Err(Fault::Unmapped)
            );
        }
    }
}

/// A multi-page mapping answers with its whole remaining run through the
/// hint, as through the walk.
#[test]
fn a_multi_page_mapping_is_folded_through_the_hint() {
    let (_depot, space, mut w) = setup();
    let base = 3 * REGION;
    space
        .map(&mut w, base, base + 16 * PAGE - 1, 1 << 32, Perm::RW)
        .unwrap();
    w.flush(&[]);
    for _ in 0..2 {
        let t = space.translate(base + 0x20, Perm::READ).unwrap();
        assert_eq!((t.gpa, t.len), ((1 << 32) + 0x20, 16 * PAGE - 0x20));
        let t = space.translate(base + 15 * PAGE, Perm::READ).unwrap();
        assert_eq!((t.gpa, t.len), ((1 << 32) + 15 * PAGE, PAGE));
        assert_eq!(hint(&space, base), leaf_node(&space, base).unwrap());
    }
}

/// A MAP in progress claims its entry with `PENDING` and the mapping's
/// `HEAD`/`TAIL` bits but not `VALID`: invisible until the MAP completes.
/// The hint must not answer from it (the walk says unmapped).
#[test]
fn a_pending_map_claim_is_not_answered_through_the_hint() {
    let (_depot, space, mut w) = setup();
    let base = 5 * REGION;
    let node = hinted_page(&space, &mut w, base);
    let claimed = base + 7 * PAGE;
    let n = space.table.node(node);
    let slot = &n.entries[index(claimed, 0)];
    slot.store(
        entry::leaf(1 << 33, Perm::RW, true, true) | PENDING,
        Release,
    );
    assert_eq!(space.translate(claimed, Perm::READ), Err(Fault::Unmapped));
    slot.store(0, Release);
}

/// The node's generation, read again after the entry, is what tells an
/// entry of an earlier incarnation from the current one when the node is
/// back in this table at the same position by the time owner and position
/// are read. Here the entry is read while the node (as the test poses it)
/// belongs to another table, then, before the validation, the node
/// "moves" here with that slot empty: the answer must be the walk's.
/// (The walk's 16-bit check is not enough for the hint: a hint is kept
/// for as long as its slot is not overwritten.)
#[test]
fn an_entry_read_before_the_node_moved_is_not_answered() {
    let (_depot, space, mut w) = setup();
    let base = 6 * REGION;
    let node = hinted_page(&space, &mut w, base);
    let n: &'static Node = {
        let n = space.table.node(node);
        // SAFETY: the node lives as long as the depot, which outlives
        // every use below (the closure runs inside `translate`).
        unsafe { crate::node::node_at(n as *const Node as u64) }
    };
    let id = space.table.id();
    n.owner.store(id + 64, Release);
    BETWEEN.with(|b| {
        *b.borrow_mut() = Some(Box::new(move || {
            n.entries[index(base, 0)].store(0, Release);
            // A whole number of 16-bit wraps: the walk (which compares
            // the directory entry's 16 bits) still follows the link.
            n.gen.fetch_add(1 << 16, Release);
            n.owner.store(id, Release);
        }))
    });
    assert_eq!(space.translate(base, Perm::READ), Err(Fault::Unmapped));
}
