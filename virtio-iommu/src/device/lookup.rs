//! Per-thread cache of domain lookups for the MAP/UNMAP hot path.
//!
//! WHY: even an uncontended `RwLock::read` plus an `Arc` clone writes two
//! cache lines shared by every request queue (the lock word and the domain's
//! reference count). With several queues mapping into the same domain those
//! lines bounce between cores on every request, which is exactly the
//! serialisation the multi-queue design removes in the tables. Instead each
//! queue thread keeps its own `id -> Arc<Domain>` map, valid for one
//! *generation* of the registry; the registry bumps its generation on every
//! insert/remove, so the hot path only reads one shared atomic that changes
//! on ATTACH/DETACH, never on MAP/UNMAP.
//!
//! Bounded: a cache only holds domains that were live in its generation (at
//! most the device's domain limit); negative lookups are not cached. A cache
//! keeps its domains alive until the thread's next lookup in a newer
//! generation or of another device; those domains have been cleared already.

use std::cell::RefCell;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::domain::Domain;

static NEXT_UID: AtomicU64 = AtomicU64::new(1);

/// A process-unique id for a registry, so a thread serving two devices never
/// mixes their caches (addresses can be reused, these ids are not).
pub(super) fn next_uid() -> u64 {
    NEXT_UID.fetch_add(1, Ordering::Relaxed)
}

#[derive(Default)]
struct Cache {
    uid: u64,
    gen: u64,
    map: HashMap<u32, Arc<Domain>>,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache::default());
}

/// Runs `f` with domain `id` of registry `uid` at generation `gen`, using
/// the calling thread's cache and `slow` (the locked lookup) on a miss.
/// Re-entrant calls and calls during thread teardown take the slow path.
/// `f` runs exactly once.
pub(super) fn with_cached<R>(
    uid: u64,
    gen: u64,
    id: u32,
    slow: impl Fn() -> Option<Arc<Domain>>,
    mut f: impl FnMut(Option<&Arc<Domain>>) -> R,
) -> R {
    let mut out = None;
    // An Err (thread teardown) leaves `out` empty: slow path below.
    let _ = CACHE.try_with(|c| {
        let Ok(mut c) = c.try_borrow_mut() else {
            return;
        };
        if c.uid != uid || c.gen != gen {
            c.map.clear();
            c.uid = uid;
            c.gen = gen;
        }
        if let Entry::Vacant(v) = c.map.entry(id) {
            if let Some(d) = slow() {
                v.insert(d);
            }
        }
        out = Some(f(c.map.get(&id)));
    });
    match out {
        Some(r) => r,
        None => f(slow().as_ref()),
    }
}
