//! The incarnation in `live`: a pin through a stale link never counts in a
//! later incarnation of the node, so a retirer is never turned away by it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use super::super::ops::node_tag;
use super::super::{entry, index, ScalableSpace, ROOT_LEVEL};
use super::{count, empty, gen};
use crate::mapping::{Depot, DomainSpace, Limits, Perm, QueueContext};

const PAGE: u64 = 4096;
const HUGE: u64 = 2 << 20;
const EMPTY: u64 = ScalableSpace::EMPTY_TABLE_BYTES;

/// The directory entry linking the leaf node that covers `iova`.
fn leaf_link(space: &ScalableSpace, iova: u64) -> u64 {
    let t = &space.table;
    let mut n = t.root();
    let mut e = 0;
    for lvl in (1..=ROOT_LEVEL).rev() {
        e = n.entries[index(iova, lvl)].load(SeqCst);
        assert!(entry::is_dir(e), "no node below level {lvl} at {iova:#x}");
        n = t.node(entry::addr(e));
    }
    e
}

#[test]
fn the_word_splits_into_count_and_incarnation() {
    let w = empty(0x1_0007) + 5;
    assert_eq!((count(w), gen(w)), (5, 7));
    assert_eq!(count(empty(u64::MAX)), 0);
    assert_eq!(gen(empty(u64::MAX).wrapping_add(1 << 32)), 0xffff);
}

/// The interleaving behind the leak `disjoint_ranges_never_lose_mappings`
/// hit about once in 100 runs: a worker read the link to a leaf, was
/// preempted, and meanwhile the leaf was unlinked, recycled and linked
/// again elsewhere, where it emptied; the stale pin landed on it just as
/// its retirer read `live`, so the retirer left it linked, and the stale
/// pinner took its pin back without queueing it. Here one thread keeps
/// pinning through the stale link while the other empties the recycled
/// node and flushes, over and over: every flush must retire it. With an
/// unconditional increment (before this fix) it failed 10 runs in 10,
/// after 100 to 4500 rounds.
#[test]
fn a_stale_pin_never_keeps_a_recycled_node_linked() {
    let depot = Arc::new(Depot::new());
    let space = Arc::new(ScalableSpace::new(1, &Limits::default(), &depot));
    let mut w = QueueContext::new(&depot);
    let (a, b, c) = (HUGE, 2 * HUGE, 3 * HUGE);
    // A mapping at `c` keeps the directory path linked: root + 3 nodes.
    space
        .map(&mut w, c, c + PAGE - 1, 1 << 32, Perm::RW)
        .expect("map c");
    space
        .map(&mut w, a, a + PAGE - 1, 1 << 33, Perm::RW)
        .expect("map a");
    let stale = leaf_link(&space, a);
    space.unmap(&mut w, a, a + PAGE - 1).expect("unmap a");
    w.flush(&[]);
    let base = space.stats().table_bytes;
    assert_eq!(base, 4 * EMPTY);
    let stop = Arc::new(AtomicBool::new(false));
    let wrong = Arc::new(AtomicU64::new(0));
    let pinner = {
        let (space, stop, wrong) = (Arc::clone(&space), Arc::clone(&stop), Arc::clone(&wrong));
        std::thread::spawn(move || {
            let t = &space.table;
            let n = t.node(entry::addr(stale));
            let tag = node_tag(a, 0);
            while !stop.load(SeqCst) {
                if t.pin(n, stale, tag) {
                    // The stale incarnation is gone: a pin must never hold.
                    wrong.fetch_add(1, SeqCst);
                    return;
                }
            }
        })
    };
    let mut kept = 0;
    for round in 0..10_000u64 {
        space
            .map(&mut w, b, b + PAGE - 1, (round + 4) << 32, Perm::RW)
            .expect("map b");
        if round == 0 {
            // The node freed at `a` is the one the magazine hands out next:
            // the stale link's node is the one under test.
            assert_eq!(entry::addr(leaf_link(&space, b)), entry::addr(stale));
        }
        space.unmap(&mut w, b, b + PAGE - 1).expect("unmap b");
        w.flush(&[]);
        // A flush without candidates: the next one does not count as a
        // second kick in a row (`retire.rs`, `Hot`), so it retires at once.
        w.flush(&[]);
        if space.stats().table_bytes != base {
            kept = round + 1;
            break;
        }
    }
    stop.store(true, SeqCst);
    pinner.join().expect("pinner");
    assert_eq!(wrong.load(SeqCst), 0, "a stale pin succeeded");
    assert_eq!(
        kept, 0,
        "empty leaf left linked after a flush (round {kept})"
    );
    space.audit().expect("audit");
}
