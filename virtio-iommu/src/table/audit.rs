//! A consistency check of a quiescent table, for tests and debugging.
//!
//! WHY: the concurrent protocol keeps several redundant facts (node live
//! counts, head/tail markers, counters); checking that they agree after a
//! concurrent run catches a lost update that no single translation shows.

use std::sync::atomic::Ordering::Acquire;

use super::entry::{self, HEAD, TAIL};
use super::{live, quota, span, Table, ROOT_LEVEL};
use crate::node::Node;

/// What an audit counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Audit {
    /// Mappings found (head entries).
    pub mappings: u64,
    /// Bytes they cover.
    pub mapped_bytes: u64,
    /// Non-root nodes reachable from the root.
    pub nodes: u64,
    /// 2 MiB entries.
    pub huge_entries: u64,
    /// 1 GiB entries.
    pub gib_entries: u64,
}

/// The first disagreement an audit found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuditError {
    /// The last mapping never ends.
    #[error("mapping without a tail at the end of the space")]
    OpenAtEnd,
    /// The quota counters disagree with the mappings in the table.
    #[error(
        "counters say {counted_mappings} mappings / {counted_bytes:#x} bytes, \
         table holds {mappings} / {mapped_bytes:#x}"
    )]
    Counters {
        /// Mappings the counters hold.
        counted_mappings: u64,
        /// Bytes the counters hold.
        counted_bytes: u64,
        /// Mappings found.
        mappings: u64,
        /// Bytes found.
        mapped_bytes: u64,
    },
    /// The node counter disagrees with the reachable nodes.
    #[error("node counter {counted}, reachable {reachable}")]
    Nodes {
        /// The table's node counter.
        counted: u64,
        /// Nodes reachable from the root.
        reachable: u64,
    },
    /// An entry still claimed by an operation.
    #[error("claim left behind at {iova:#x} (level {level}): {entry:#x}")]
    Claim {
        /// Where.
        iova: u64,
        /// Level of its node.
        level: u32,
        /// The entry.
        entry: u64,
    },
    /// A directory entry in a leaf node.
    #[error("directory entry in a leaf node at {iova:#x}")]
    DirInLeaf {
        /// Where.
        iova: u64,
    },
    /// A directory entry naming another generation of its node (in its
    /// `gen` or its `live` word).
    #[error("generation mismatch at {iova:#x}")]
    Generation {
        /// Where.
        iova: u64,
    },
    /// A node tagged for another table or position.
    #[error("node at {iova:#x} tagged for another position")]
    NodeTag {
        /// Where.
        iova: u64,
    },
    /// An unmapped entry between a mapping's head and tail.
    #[error("hole inside a mapping at {iova:#x}")]
    Hole {
        /// Where.
        iova: u64,
    },
    /// A non-empty entry without its occupancy mark (a sweep would miss it).
    #[error("entry at level {level} ({iova:#x}) not marked occupied")]
    Unmarked {
        /// Where.
        iova: u64,
        /// Level of its node.
        level: u32,
    },
    /// A leaf entry above level 2.
    #[error("leaf at level {level} ({iova:#x})")]
    LeafLevel {
        /// Level of its node.
        level: u32,
        /// Where.
        iova: u64,
    },
    /// A head entry before the previous mapping's tail.
    #[error("head inside a mapping at {iova:#x}")]
    HeadInMapping {
        /// Where.
        iova: u64,
    },
    /// A body entry that does not continue the open mapping.
    #[error("entry at {iova:#x} continues no mapping")]
    Orphan {
        /// Where.
        iova: u64,
    },
    /// A node's live count disagrees with its non-zero entries.
    #[error("node at {base:#x} level {level}: live {live}, {nonzero} entries")]
    LiveCount {
        /// The node's first IOVA.
        base: u64,
        /// Its level.
        level: u32,
        /// Its live count.
        live: u64,
        /// Its non-zero entries.
        nonzero: u64,
    },
}

struct Open {
    next_iova: u64,
    next_gpa: u64,
    perm: u32,
}

/// Walks the whole table. Must only run while no operation is in progress.
pub(crate) fn audit(t: &Table) -> Result<Audit, AuditError> {
    let mut a = Audit::default();
    let mut open: Option<Open> = None;
    walk(t, t.root(), ROOT_LEVEL, 0, &mut a, &mut open)?;
    if open.is_some() {
        return Err(AuditError::OpenAtEnd);
    }
    let (m, b) = quota::totals(t);
    if (m, b) != (a.mappings, a.mapped_bytes) {
        return Err(AuditError::Counters {
            counted_mappings: m,
            counted_bytes: b,
            mappings: a.mappings,
            mapped_bytes: a.mapped_bytes,
        });
    }
    let nodes = t.nodes.load(Acquire);
    if nodes != a.nodes {
        return Err(AuditError::Nodes {
            counted: nodes,
            reachable: a.nodes,
        });
    }
    Ok(a)
}

fn walk(
    t: &Table,
    n: &Node,
    level: u32,
    base: u64,
    a: &mut Audit,
    open: &mut Option<Open>,
) -> Result<(), AuditError> {
    let sz = span(level);
    let mut nonzero = 0u64;
    for (i, slot) in n.entries.iter().enumerate() {
        let iova = base + i as u64 * sz;
        let e = slot.load(Acquire);
        if e != 0 {
            nonzero += 1;
            let marked = n
                .occupied
                .get(i / 64)
                .is_some_and(|w| w.load(Acquire) & (1u64 << (i % 64)) != 0);
            if !marked {
                return Err(AuditError::Unmarked { iova, level });
            }
        }
        if entry::is_transient(e) {
            return Err(AuditError::Claim {
                iova,
                level,
                entry: e,
            });
        }
        if entry::is_dir(e) {
            if level == 0 {
                return Err(AuditError::DirInLeaf { iova });
            }
            a.nodes += 1;
            let child = t.node(entry::addr(e));
            // The link, the node and its `live` word name one incarnation
            // (`live.rs`): otherwise every pin through the link would fail.
            if entry::short_gen(child.gen.load(Acquire)) != entry::gen(e)
                || live::gen(child.live.load(Acquire)) != entry::gen(e)
            {
                return Err(AuditError::Generation { iova });
            }
            if child.owner.load(Acquire) != t.id()
                || child.base.load(Acquire) != crate::node::tag(iova, level - 1)
            {
                return Err(AuditError::NodeTag { iova });
            }
            walk(t, child, level - 1, iova, a, open)?;
            continue;
        }
        if !entry::is_valid(e) {
            if open.is_some() {
                return Err(AuditError::Hole { iova });
            }
            continue;
        }
        if level > super::MAX_LEAF_LEVEL {
            return Err(AuditError::LeafLevel { level, iova });
        }
        if level == 1 {
            a.huge_entries += 1;
        }
        if level == 2 {
            a.gib_entries += 1;
        }
        let perm = entry::perm(e).bits();
        if e & HEAD != 0 {
            if open.is_some() {
                return Err(AuditError::HeadInMapping { iova });
            }
            a.mappings += 1;
        } else {
            match open {
                Some(o) if o.next_iova == iova && o.next_gpa == entry::gpa(e) && o.perm == perm => {
                }
                _ => return Err(AuditError::Orphan { iova }),
            }
        }
        a.mapped_bytes += sz;
        *open = if e & TAIL != 0 {
            None
        } else {
            Some(Open {
                next_iova: iova + sz,
                next_gpa: entry::gpa(e) + sz,
                perm,
            })
        };
    }
    if level < ROOT_LEVEL {
        let live = live::count(n.live.load(Acquire));
        if live != nonzero {
            return Err(AuditError::LiveCount {
                base,
                level,
                live,
                nonzero,
            });
        }
    }
    Ok(())
}
