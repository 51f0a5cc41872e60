//! A consistency check of a quiescent table, for tests and debugging.
//!
//! WHY: the concurrent protocol keeps several redundant facts (node live
//! counts, head/tail markers, counters); checking that they agree after a
//! concurrent run catches a lost update that no single translation shows.

use std::sync::atomic::Ordering::Acquire;

use super::entry::{self, HEAD, TAIL};
use super::{quota, span, Table, ROOT_LEVEL};
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
}

struct Open {
    next_iova: u64,
    next_gpa: u64,
    perm: u32,
}

/// Walks the whole table. Must only run while no operation is in progress.
pub(crate) fn audit(t: &Table) -> Result<Audit, String> {
    let mut a = Audit::default();
    let mut open: Option<Open> = None;
    walk(t, t.root(), ROOT_LEVEL, 0, &mut a, &mut open)?;
    if open.is_some() {
        return Err("mapping without a tail at the end of the space".into());
    }
    let (m, b) = quota::totals(t);
    if (m, b) != (a.mappings, a.mapped_bytes) {
        return Err(format!(
            "counters say {m} mappings / {b:#x} bytes, table holds {} / {:#x}",
            a.mappings, a.mapped_bytes
        ));
    }
    let nodes = t.nodes.load(Acquire);
    if nodes != a.nodes {
        return Err(format!("node counter {nodes}, reachable {}", a.nodes));
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
) -> Result<(), String> {
    let sz = span(level);
    let mut nonzero = 0u64;
    for (i, slot) in n.entries.iter().enumerate() {
        let iova = base + i as u64 * sz;
        let e = slot.load(Acquire);
        if e != 0 {
            nonzero += 1;
        }
        if entry::is_transient(e) {
            return Err(format!(
                "claim left behind at {iova:#x} (level {level}): {e:#x}"
            ));
        }
        if entry::is_dir(e) {
            if level == 0 {
                return Err(format!("directory entry in a leaf node at {iova:#x}"));
            }
            a.nodes += 1;
            let child = t.node(entry::addr(e));
            if child.gen.load(Acquire) as u16 != entry::gen(e) {
                return Err(format!("generation mismatch at {iova:#x}"));
            }
            if child.owner.load(Acquire) != t.id()
                || child.base.load(Acquire) != crate::node::tag(iova, level - 1)
            {
                return Err(format!("node at {iova:#x} tagged for another position"));
            }
            walk(t, child, level - 1, iova, a, open)?;
            continue;
        }
        if !entry::is_valid(e) {
            if open.is_some() {
                return Err(format!("hole inside a mapping at {iova:#x}"));
            }
            continue;
        }
        if level > 1 {
            return Err(format!("leaf at level {level} ({iova:#x})"));
        }
        if level == 1 {
            a.huge_entries += 1;
        }
        let perm = entry::perm(e).bits();
        if e & HEAD != 0 {
            if open.is_some() {
                return Err(format!("head inside a mapping at {iova:#x}"));
            }
            a.mappings += 1;
        } else {
            match open {
                Some(o) if o.next_iova == iova && o.next_gpa == entry::gpa(e) && o.perm == perm => {
                }
                _ => return Err(format!("entry at {iova:#x} continues no mapping")),
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
        let live = n.live.load(Acquire);
        if live != nonzero {
            return Err(format!(
                "node at {base:#x} level {level}: live {live}, {nonzero} entries"
            ));
        }
    }
    Ok(())
}
