//! Table nodes: 512 atomic entries plus the two counters the lock-free
//! reclamation protocol needs.
//!
//! WHY type-stable memory: a translator walks the table without any lock, so
//! it may still read a node after an UNMAP unlinked it. Nodes are therefore
//! never handed back to the system allocator while any table or worker of
//! their [`crate::mapping::Depot`] exists; they only move between tables,
//! magazines and the depot. A reader that raced with an unlink detects it
//! through the node's generation (see `entry.rs`) and retries.

use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::SeqCst;

/// Entries per node (9 IOVA bits per level).
pub const ENTRIES: usize = 512;

/// One node of a domain's radix table.
#[repr(C, align(64))]
pub struct Node {
    /// The entries; their encoding is in `entry.rs`.
    pub entries: [AtomicU64; ENTRIES],
    /// Non-zero entries plus the pins of operations working inside the node
    /// (low 48 bits), and the incarnation a pin must name (high 16, the low
    /// bits of `gen`; `table/live.rs`). A node is unlinked only when the
    /// count is zero (`table/retire.rs`).
    pub live: AtomicU64,
    /// Incremented every time the node is unlinked; its low 16 bits are also
    /// stored in the parent entry that links it, so a reader can tell the
    /// incarnation it followed from a later one.
    pub gen: AtomicU64,
    /// Address of the table the node was last linked in.
    pub owner: AtomicU64,
    /// One bit per entry, set for every non-empty entry once the operation
    /// that filled it has returned (a superset: a bit may outlive its entry
    /// until a sweep clears it). WHY: a sweep (`table::sweep`, INVALIDATE)
    /// visits only marked entries, so its cost follows the live entries of
    /// a sparse span, not the span.
    pub occupied: [AtomicU64; ENTRIES / 64],
    /// [`tag`] of the position it was last linked at. With `owner`, lets a
    /// writer that pinned the node confirm it is the node it walked to even
    /// if the 16-bit generation wrapped while the writer was preempted.
    pub base: AtomicU64,
}

impl Node {
    /// Marks entry `i` occupied. Called after the compare-and-swap (SeqCst)
    /// that filled it: with [`Node::unmark`]'s re-read this is a
    /// store-buffer pair, so a sweep clearing the bit meanwhile either sees
    /// the entry and marks it again or is seen here. One load when the bit
    /// is set already (the common case: bits outlive unmaps).
    #[inline]
    pub fn mark(&self, i: usize) {
        let (w, b) = (i / 64, 1u64 << (i % 64));
        if let Some(word) = self.occupied.get(w) {
            if word.load(SeqCst) & b == 0 {
                word.fetch_or(b, SeqCst);
            }
        }
    }

    /// Clears the mark of entry `i` found or made empty by a sweep; marks
    /// it again if the entry is no longer empty (see [`Node::mark`]).
    pub fn unmark(&self, i: usize) {
        let (w, b) = (i / 64, 1u64 << (i % 64));
        if let (Some(word), Some(e)) = (self.occupied.get(w), self.entries.get(i)) {
            word.fetch_and(!b, SeqCst);
            if e.load(SeqCst) != 0 {
                word.fetch_or(b, SeqCst);
            }
        }
    }
}

/// Position tag of the node of `level` whose range starts at `base`.
#[inline]
pub fn tag(base: u64, level: u32) -> u64 {
    base | u64::from(level)
}

/// Bytes one node costs (reported in `table_bytes`).
pub const NODE_BYTES: u64 = std::mem::size_of::<Node>() as u64;

/// An owned pointer to a node that is not linked in any table (in a
/// magazine, the depot, or a worker's deferred list) or the root of a table.
#[derive(Debug)]
pub struct NodePtr(NonNull<Node>);

// SAFETY: a `NodePtr` is a unique owner of a heap node made of atomics; the
// node may be moved to and used from any thread.
unsafe impl Send for NodePtr {}

impl NodePtr {
    /// Allocates a zeroed node from the system allocator.
    pub fn alloc() -> NodePtr {
        let node = Box::new(Node {
            entries: std::array::from_fn(|_| AtomicU64::new(0)),
            live: AtomicU64::new(0),
            gen: AtomicU64::new(0),
            owner: AtomicU64::new(0),
            occupied: std::array::from_fn(|_| AtomicU64::new(0)),
            base: AtomicU64::new(0),
        });
        NodePtr(NonNull::from(Box::leak(node)))
    }

    /// Address of the node (what a directory entry stores).
    pub fn addr(&self) -> u64 {
        self.0.as_ptr() as u64
    }

    /// Shared view of the node.
    pub fn node(&self) -> &Node {
        // SAFETY: the pointer came from `Box::leak` and the node is only
        // released by `free_to_system`, which consumes `self`.
        unsafe { self.0.as_ref() }
    }

    /// Takes ownership back of a node that was linked at `addr` and has just
    /// been unlinked by the caller.
    ///
    /// # Safety
    /// `addr` must be the address of a node created by [`NodePtr::alloc`]
    /// that no other `NodePtr` owns (it was linked in a table and the caller
    /// unlinked it, or it is the root of a table being dropped).
    pub unsafe fn from_addr(addr: u64) -> NodePtr {
        // SAFETY: per the contract, addr is a live, leaked Box<Node>.
        NodePtr(unsafe { NonNull::new_unchecked(addr as *mut Node) })
    }

    /// Gives up ownership: the node is now linked in a table, which owns it.
    pub fn into_addr(self) -> u64 {
        // No Drop impl: consuming `self` just ends this owner.
        self.addr()
    }

    /// Returns the memory to the system allocator. Only the depot's `Drop`
    /// calls this, when no table that could still be read exists.
    pub fn free_to_system(self) {
        let p = self.0.as_ptr();
        // SAFETY: p came from Box::leak in `alloc` and is owned uniquely here.
        drop(unsafe { Box::from_raw(p) });
    }
}

/// Reads the node at an address taken from a directory entry.
///
/// # Safety
/// `addr` must come from a directory entry of a table whose depot is alive:
/// such nodes are never freed to the system while the depot lives (see the
/// module doc), so the reference is valid even if the node was unlinked.
#[inline]
pub unsafe fn node_at<'a>(addr: u64) -> &'a Node {
    // SAFETY: per the contract.
    unsafe { &*(addr as *const Node) }
}
