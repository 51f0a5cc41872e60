//! The leaf node a worker maps and unmaps one-page entries in, held across
//! its operations instead of pinned and unpinned by each.
//!
//! WHY: a guest's ring of DMA buffers maps and unmaps pages of one 2 MiB
//! region over and over. Pinning the leaf node for every MAP and UNMAP (an
//! atomic increment of its shared `live` count, a re-read of the parent
//! link and of the node's owner and position, then an atomic decrement)
//! cost more than the compare-and-swap on the entry itself. So a worker
//! pins its current leaf once, with a weight of [`BIAS`] instead of 1, and
//! keeps the entries it fills and empties there in a private `delta`,
//! added to `live` when it lets go of the node: at the next leaf, at the
//! end of the kick (`before_invalidate`, before the node retirement that
//! reads `live`), and when the worker goes away.
//!
//! Why that is sound: a node is unlinked only when `live` is zero
//! (`retire.rs`). While held, `live` is at least `BIAS` minus the entries
//! this worker filled there that others emptied since (each such UNMAP
//! subtracted 1 at once while our +1 waits in `delta`), and `delta` is
//! added to `live` as soon as it exceeds [`MAX_DELTA`] either way, so
//! `live` stays above `BIAS - MAX_DELTA > 0`: the held node cannot be
//! unlinked, exactly as with an ordinary pin. When the hold ends, `live`
//! is again the exact count of entries and pins, and a zero means the node
//! goes to the retirement candidates as before. Nothing about UNMAP's
//! invalidation changes: entries are still emptied by one compare-and-swap
//! and recorded in the kick's batch.

use std::sync::atomic::Ordering::AcqRel;
use std::sync::Arc;

use super::live;
use super::ops::{push_candidate, Found};
use super::{Ctx, Table};
use crate::node::Node;
use crate::space::MapError;

/// The weight of a hold in a node's `live` count: far above what entries
/// (512) and pins (one per worker and range operation) can add or take.
pub(crate) const BIAS: u64 = 1 << 32;

/// Largest private delta kept before it is added to `live` (bounds how far
/// others' UNMAPs of our entries can lower `live` below `BIAS`).
const MAX_DELTA: i64 = 256;

/// A worker's hold on one leaf node (level 0).
#[derive(Debug)]
pub(crate) struct HeldLeaf {
    /// The table the node is linked in; kept alive by the hold so the node
    /// cannot be recycled by a dropped table while we still count in it.
    table: Arc<Table>,
    /// `iova >> 21` of the 2 MiB the node covers.
    region: u64,
    /// Address of the node.
    node: u64,
    /// Entries this worker filled minus entries it emptied in the node
    /// since the hold began, not yet added to `live`.
    delta: i64,
}

impl HeldLeaf {
    /// True if this is the hold on the leaf covering `iova` in `t`: the
    /// one check the one-page fast paths (`page.rs`) make before using it.
    #[inline(always)]
    pub(crate) fn covers(&self, t: &Table, iova: u64) -> bool {
        self.region == iova >> 21 && std::ptr::eq(Arc::as_ptr(&self.table), t)
    }

    /// The held node (linked in `t` for as long as the hold lasts).
    #[inline(always)]
    pub(crate) fn node<'a>(&self, t: &'a Table) -> &'a Node {
        t.node(self.node)
    }

    /// True if the private delta can take one more entry filled (`up`) or
    /// emptied without reaching its bound: the one-page fast paths
    /// (`page.rs`) leave the settling to the general path, so they make no
    /// call and need no saved registers.
    #[inline(always)]
    pub(crate) fn has_room(&self, up: bool) -> bool {
        if up {
            self.delta < MAX_DELTA
        } else {
            self.delta > -MAX_DELTA
        }
    }

    /// [`HeldLeaf::filled`] when [`HeldLeaf::has_room`] said so.
    #[inline(always)]
    pub(crate) fn filled_within_room(&mut self) {
        self.delta += 1;
    }

    /// [`HeldLeaf::emptied`] when [`HeldLeaf::has_room`] said so.
    #[inline(always)]
    pub(crate) fn emptied_within_room(&mut self) {
        self.delta -= 1;
    }

    /// The worker filled one entry of the node.
    #[inline(always)]
    pub(crate) fn filled(&mut self) {
        self.delta += 1;
        if self.delta > MAX_DELTA {
            self.settle();
        }
    }

    /// The worker emptied one entry of the node.
    #[inline(always)]
    pub(crate) fn emptied(&mut self) {
        self.delta -= 1;
        if self.delta < -MAX_DELTA {
            self.settle();
        }
    }

    /// Adds the private delta to `live` (still held: cannot reach zero).
    /// Cold: once per [`MAX_DELTA`] one-page operations at most.
    #[cold]
    #[inline(never)]
    fn settle(&mut self) {
        let d = std::mem::take(&mut self.delta);
        self.table
            .node(self.node)
            .live
            .fetch_add(d.cast_unsigned(), AcqRel);
    }
}

/// The leaf node covering `iova` in `t`, held. A different hold is let go
/// first. `install`: create missing directory nodes (MAP); otherwise
/// `Absent` or `Leaf` like [`Table::find`], and no hold is taken.
#[inline]
pub(crate) fn leaf<'a>(
    t: &'a Arc<Table>,
    w: &mut Ctx,
    iova: u64,
    install: bool,
) -> Result<Found<'a>, MapError> {
    if let Some(h) = &w.state.table.held {
        if h.covers(t, iova) {
            return Ok(Found::Node(h.node(t)));
        }
    }
    take_hold(t, w, iova, install)
}

/// Slow path of [`leaf`]: walk, pin, and turn the pin into a hold.
#[inline(never)]
fn take_hold<'a>(
    t: &'a Arc<Table>,
    w: &mut Ctx,
    iova: u64,
    install: bool,
) -> Result<Found<'a>, MapError> {
    release(w);
    // The walk pins with the hold's whole weight: one locked add, not two.
    let found = t.find(w, iova, 0, install, BIAS)?;
    if let Found::Node(n) = found {
        w.state.table.held = Some(HeldLeaf {
            table: Arc::clone(t),
            region: iova >> 21,
            node: n as *const Node as u64,
            delta: 0,
        });
    }
    Ok(found)
}

/// The worker filled one entry of its held leaf.
#[inline]
pub(crate) fn filled(w: &mut Ctx) {
    if let Some(h) = w.state.table.held.as_mut() {
        h.filled();
    }
}

/// The worker emptied one entry of its held leaf.
#[inline]
pub(crate) fn emptied(w: &mut Ctx) {
    if let Some(h) = w.state.table.held.as_mut() {
        h.emptied();
    }
}

/// Lets go of the held leaf: `live` gets the delta and loses the hold's
/// weight; if that empties it, the node becomes a retirement candidate.
pub(crate) fn release(w: &mut Ctx) {
    if let Some(h) = w.state.table.held.take() {
        // Two's complement: adding the wrapped delta subtracts when negative.
        let add = h.delta.cast_unsigned().wrapping_sub(BIAS);
        let n = h.table.node(h.node);
        if live::count(n.live.fetch_add(add, AcqRel).wrapping_add(add)) == 0 {
            push_candidate(&h.table, w, h.region << 21, 0);
        }
    }
}

#[cfg(test)]
mod tests;
