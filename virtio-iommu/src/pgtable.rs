//! Page-table mode (project proposal, `docs/page-table.md`): the guest
//! writes its mappings into an I/O page table in its own memory and the
//! device walks that table on a translation miss, caching every walk in the
//! domain's existing lock-free table. A MAP then costs the guest no request;
//! only INVALIDATE (the removal of cached walks) does.
//!
//! The format (`FORMAT_X86_4L`): 4 levels of 512 little-endian 64-bit
//! entries, each table one 4 KiB page, 48-bit IOVA, 4 KiB pages only.
//! IOVA bits 47:39 index the root (level 3), 38:30 level 2, 29:21 level 1,
//! 20:12 level 0 (the leaves). An entry:
//!
//! | bits  | directory entry (levels 3..1) | leaf entry (level 0) |
//! |-------|-------------------------------|----------------------|
//! | 0     | P: present                    | P: present           |
//! | 1     | reserved (0)                  | R: device may read   |
//! | 2     | reserved (0)                  | W: device may write  |
//! | 11:3  | reserved (0)                  | reserved (0)         |
//! | 51:12 | GPA of the next table         | GPA of the page      |
//! | 63:52 | reserved (0)                  | reserved (0)         |
//!
//! An entry without P ends the walk (unmapped, nothing cached); an entry
//! with a reserved bit set, or a table or page outside guest RAM, ends it
//! with a fault (nothing cached either). The walk reads exactly one entry
//! per level, so a table that points back at itself or at an upper level
//! is harmless: the depth is fixed at four reads.
//!
//! WHY cache in the domain table rather than a cache of its own: the
//! table is what every consumer already translates through without locks,
//! what UNMAP already removes from with one batched invalidation per kick,
//! and what the domain's limits (mappings, table memory) already bound. A
//! walk inserts one 4 KiB mapping per present leaf; INVALIDATE removes the
//! range exactly as UNMAP does, so it reaches every consumer the same way.
//!
//! Ordering. A fill (walk + insert) and an INVALIDATE of the same domain
//! are serialised by the domain's fill lock: a fill that read a leaf before
//! the guest cleared it has inserted it before the INVALIDATE takes the
//! lock, which then removes it; a fill after the INVALIDATE reads the
//! cleared leaf (the guest wrote it before making the request available).
//! Hits never take the lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use thiserror::Error;
use vm_memory::{Bytes, GuestAddress, GuestMemory, Permissions};

use crate::locks::lock;
use crate::space::{DomainSpace, Fault, MapError, Perm, QueueContext, Translation, UnmapError};
use crate::space::{IOVA_MAX, PAGE_LEN, PAGE_SIZE};
use crate::wire::PageTableFmt;

/// The one table format this device walks (PAGE_TABLE_FMT `format`). The
/// drafts number the Arm and virt formats from 1 up and have no private
/// range, so the project takes a code far above them (docs/wire-formats.md).
pub const FORMAT_X86_4L: u16 = 0xff01;
/// Levels of [`FORMAT_X86_4L`].
pub const LEVELS: u32 = 4;
/// Entry bit: present.
pub const PTE_P: u64 = 1 << 0;
/// Leaf bit: the device may read the page.
pub const PTE_R: u64 = 1 << 1;
/// Leaf bit: the device may write the page.
pub const PTE_W: u64 = 1 << 2;
/// Address bits 51:12 of an entry.
pub const PTE_ADDR: u64 = 0x000f_ffff_ffff_f000;
/// Every bit a directory entry may have set.
pub const PTE_DIR_VALID: u64 = PTE_P | PTE_ADDR;
/// Every bit a leaf entry may have set.
pub const PTE_LEAF_VALID: u64 = PTE_P | PTE_R | PTE_W | PTE_ADDR;
/// Leaves a miss caches at most: the one asked for and the present ones
/// that follow it in the same leaf table (a multi-page buffer then costs
/// one walk, not one per page).
pub const FILL_AHEAD: usize = 16;

/// The PROBE property this device reports with the feature negotiated.
pub const PROBE_FORMAT: PageTableFmt = PageTableFmt {
    format: FORMAT_X86_4L,
};

/// Guest memory as the walker reads it.
pub trait TableMemory: Send + Sync {
    /// The little-endian entry at `gpa` (8-byte aligned), read with one
    /// atomic load; `None` if it is not guest RAM or not aligned.
    fn read_entry(&self, gpa: u64) -> Option<u64>;
    /// True if the 4 KiB page at `gpa` (aligned) is guest RAM.
    fn is_ram_page(&self, gpa: u64) -> bool;
}

impl<M: GuestMemory + Send + Sync> TableMemory for M {
    fn read_entry(&self, gpa: u64) -> Option<u64> {
        if gpa & 7 != 0 {
            return None;
        }
        self.load::<u64>(GuestAddress(gpa), Ordering::Acquire)
            .ok()
            .map(u64::from_le)
    }

    fn is_ram_page(&self, gpa: u64) -> bool {
        let Some(last) = gpa.checked_add(PAGE_SIZE - 1) else {
            return false;
        };
        gpa & (PAGE_SIZE - 1) == 0
            && last > gpa
            && self.check_range(GuestAddress(gpa), PAGE_LEN, Permissions::Read)
    }
}

/// Why a walk found no translation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum WalkError {
    /// The IOVA is beyond the format's 48 bits.
    #[error("IOVA {0:#x} beyond the table's input range")]
    OutOfRange(u64),
    /// An entry on the way has no P bit: not mapped.
    #[error("entry at level {level} not present")]
    NotPresent {
        /// Level of the entry (3: root, 0: leaf).
        level: u32,
    },
    /// An entry has a reserved bit set.
    #[error("entry {entry:#x} at level {level} has reserved bits set")]
    Reserved {
        /// Level of the entry (3: root, 0: leaf).
        level: u32,
        /// The entry as read.
        entry: u64,
    },
    /// A table (or, at level 0, the page) is not guest RAM.
    #[error("level {level} points outside guest RAM ({gpa:#x})")]
    NotRam {
        /// Level of the entry that points there (3: root, 0: leaf).
        level: u32,
        /// The guest-physical address it points at.
        gpa: u64,
    },
}

/// A present leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leaf {
    /// Guest-physical address of the 4 KiB page.
    pub gpa: u64,
    /// What the leaf allows (its R and W bits).
    pub perm: Perm,
}

/// Slot of `iova` in a table of `level`.
fn index(iova: u64, level: u32) -> u64 {
    (iova >> (12 + 9 * level)) & 511
}

/// Checks a leaf entry; `Ok(None)` if it is not present.
fn leaf_of(mem: &dyn TableMemory, e: u64) -> Result<Option<Leaf>, WalkError> {
    if e & PTE_P == 0 {
        return Ok(None);
    }
    if e & !PTE_LEAF_VALID != 0 {
        return Err(WalkError::Reserved { level: 0, entry: e });
    }
    let gpa = e & PTE_ADDR;
    if !mem.is_ram_page(gpa) {
        return Err(WalkError::NotRam { level: 0, gpa });
    }
    let mut perm = Perm::NONE;
    if e & PTE_R != 0 {
        perm = perm | Perm::READ;
    }
    if e & PTE_W != 0 {
        perm = perm | Perm::WRITE;
    }
    Ok(Some(Leaf { gpa, perm }))
}

/// Walks down to the leaf table of `iova`: its guest-physical address.
fn leaf_table(mem: &dyn TableMemory, root: u64, iova: u64) -> Result<u64, WalkError> {
    if iova > IOVA_MAX {
        return Err(WalkError::OutOfRange(iova));
    }
    if !mem.is_ram_page(root) {
        return Err(WalkError::NotRam {
            level: LEVELS,
            gpa: root,
        });
    }
    let mut table = root;
    for level in (1..LEVELS).rev() {
        // table is a page-aligned RAM address and index * 8 < 4096.
        let at = table | (index(iova, level) * 8);
        let e = mem
            .read_entry(at)
            .ok_or(WalkError::NotRam { level, gpa: table })?;
        if e & PTE_P == 0 {
            return Err(WalkError::NotPresent { level });
        }
        if e & !PTE_DIR_VALID != 0 {
            return Err(WalkError::Reserved { level, entry: e });
        }
        table = e & PTE_ADDR;
        if !mem.is_ram_page(table) {
            return Err(WalkError::NotRam {
                level: level - 1,
                gpa: table,
            });
        }
    }
    Ok(table)
}

/// Walks the table at `root` for `iova`: exactly one read per level.
pub fn walk(mem: &dyn TableMemory, root: u64, iova: u64) -> Result<Leaf, WalkError> {
    let table = leaf_table(mem, root, iova)?;
    let at = table | (index(iova, 0) * 8);
    let e = mem.read_entry(at).ok_or(WalkError::NotRam {
        level: 0,
        gpa: table,
    })?;
    leaf_of(mem, e)?.ok_or(WalkError::NotPresent { level: 0 })
}

/// Counters of one domain's table mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Misses that walked the guest table.
    pub walks: u64,
    /// Leaves inserted into the domain table by those walks.
    pub filled: u64,
    /// Walks that ended without a translation (not present, reserved
    /// bits, outside RAM).
    pub walk_faults: u64,
    /// Leaves not cached because a domain limit was reached (the access
    /// was still translated).
    pub uncached: u64,
    /// INVALIDATE requests applied.
    pub invalidations: u64,
}

/// What the fill lock protects.
struct Filler {
    mem: Arc<dyn TableMemory>,
    /// Draws the table nodes of cached walks (never flushes: fills only add).
    worker: QueueContext,
    stats: TableStats,
}

/// The table-mode state of one domain: none until ATTACH_TABLE.
#[derive(Default)]
pub struct TableSlot {
    /// Root GPA of the guest table; 0 while the domain is in MAP mode
    /// (a root is page-aligned RAM, and page 0 is refused as a root).
    root: AtomicU64,
    fill: Mutex<Option<Filler>>,
}

impl TableSlot {
    /// The guest table's root, if the domain is in table mode.
    pub fn root(&self) -> Option<u64> {
        match self.root.load(Ordering::Acquire) {
            0 => None,
            r => Some(r),
        }
    }

    /// ATTACH_TABLE: walks go to `root` from now on; every cached walk of
    /// the previous table (if any) is removed through `w` (its kick
    /// invalidates the consumers). `root` is non-zero, checked by the caller.
    pub fn install(
        &self,
        space: &dyn DomainSpace,
        w: &mut QueueContext,
        root: u64,
        mem: Arc<dyn TableMemory>,
        fill_worker: impl FnOnce() -> QueueContext,
    ) {
        let mut f = lock(&self.fill);
        if self.root().is_some() {
            space.clear(w);
        }
        match f.as_mut() {
            Some(filler) => filler.mem = mem,
            None => {
                *f = Some(Filler {
                    mem,
                    worker: fill_worker(),
                    stats: TableStats::default(),
                })
            }
        }
        self.root.store(root, Ordering::Release);
    }

    /// The domain is going away: no more walks.
    pub fn disable(&self) {
        let _f = lock(&self.fill);
        self.root.store(0, Ordering::Release);
    }

    /// INVALIDATE: removes the cached walks in `start..=last` through `w`
    /// (recorded in its batch like an UNMAP's ranges).
    pub fn invalidate(
        &self,
        space: &dyn DomainSpace,
        w: &mut QueueContext,
        start: u64,
        last: u64,
    ) -> Result<(), UnmapError> {
        let mut f = lock(&self.fill);
        // The fill lock keeps every fill (the only MAPs of a table-mode
        // domain) out of the range: what `invalidate` asks of its caller.
        let r = space.invalidate(w, start, last);
        if let Some(filler) = f.as_mut() {
            filler.stats.invalidations = filler.stats.invalidations.wrapping_add(1);
        }
        r
    }

    /// Walks, fills and invalidations of this domain's table so far.
    pub fn stats(&self) -> TableStats {
        lock(&self.fill)
            .as_ref()
            .map(|f| f.stats)
            .unwrap_or_default()
    }

    /// A translation miss in `space`: walks the guest table and caches
    /// what it found. `Err(Fault::Unmapped)` without a table.
    pub fn fill(
        &self,
        space: &dyn DomainSpace,
        iova: u64,
        access: Perm,
    ) -> Result<Translation, Fault> {
        if self.root().is_none() {
            return Err(Fault::Unmapped);
        }
        let mut guard = lock(&self.fill);
        let Some(root) = self.root() else {
            return Err(Fault::Unmapped);
        };
        let Some(f) = guard.as_mut() else {
            return Err(Fault::Unmapped);
        };
        // Another thread may have filled it while this one waited.
        match space.translate(iova, access) {
            Err(Fault::Unmapped) => {}
            done => return done,
        }
        f.stats.walks = f.stats.walks.wrapping_add(1);
        let mem = Arc::clone(&f.mem);
        let page = iova & !(PAGE_SIZE - 1);
        let table = match leaf_table(&*mem, root, iova) {
            Ok(t) => t,
            Err(e) => return Err(f.walk_fault(iova, e)),
        };
        let first = index(iova, 0);
        let mut out = Err(Fault::Unmapped);
        for i in first..(first + FILL_AHEAD as u64).min(512) {
            let leaf = match mem.read_entry(table | (i * 8)).map(|e| leaf_of(&*mem, e)) {
                Some(Ok(Some(l))) => l,
                Some(Err(e)) if i == first => return Err(f.walk_fault(iova, e)),
                None if i == first => {
                    let e = WalkError::NotRam {
                        level: 0,
                        gpa: table,
                    };
                    return Err(f.walk_fault(iova, e));
                }
                _ if i == first => {
                    let e = WalkError::NotPresent { level: 0 };
                    return Err(f.walk_fault(iova, e));
                }
                // The fill-ahead stops at the first entry it cannot use.
                _ => break,
            };
            if leaf.perm.is_empty() {
                if i == first {
                    return Err(Fault::Permission);
                }
                break;
            }
            let va = page.wrapping_add((i - first) * PAGE_SIZE);
            match space.map(&mut f.worker, va, va | (PAGE_SIZE - 1), leaf.gpa, leaf.perm) {
                Ok(()) => f.stats.filled = f.stats.filled.wrapping_add(1),
                // Filled before (a fill-ahead page): keep what is cached.
                Err(MapError::Overlap) => {}
                Err(e) => {
                    f.stats.uncached = f.stats.uncached.wrapping_add(1);
                    log::debug!("virtio-iommu: walk of {va:#x} not cached: {e}");
                    if i != first {
                        break;
                    }
                }
            }
            if i == first {
                let off = iova & (PAGE_SIZE - 1);
                out = if leaf.perm.contains(access) {
                    Ok(Translation {
                        gpa: leaf.gpa | off,
                        len: PAGE_SIZE - off,
                        perm: leaf.perm,
                    })
                } else {
                    Err(Fault::Permission)
                };
            }
        }
        out
    }
}

impl Filler {
    fn walk_fault(&mut self, iova: u64, e: WalkError) -> Fault {
        self.stats.walk_faults = self.stats.walk_faults.wrapping_add(1);
        if !matches!(e, WalkError::NotPresent { .. }) {
            log::debug!("virtio-iommu: table walk of {iova:#x}: {e}");
        }
        Fault::Unmapped
    }
}
