//! The domain registry (the domains themselves are in `crate::domain`).
//!
//! WHY this shape: MAP/UNMAP (the hot path, possibly from several request
//! queues at once) only needs "domain id -> its table". The registry is a
//! `RwLock<HashMap>` behind per-thread lookup caches (see `lookup.rs`): a
//! request reads one generation counter and then works on the domain's own
//! concurrent table with no device-wide lock held and no shared cache line
//! written. Creating and destroying domains (ATTACH/DETACH,
//! rare) take the write lock briefly, serialized by the device's topology
//! mutex so membership bookkeeping never races.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use super::lookup::{next_uid, with_cached};
use crate::domain::Domain;
use crate::locks::{read, write};

/// Live domains by id.
pub struct DomainRegistry {
    /// Process-unique id keying the per-thread lookup caches.
    uid: u64,
    /// Bumped (inside the write lock) by every insert/remove, invalidating
    /// every thread's cached lookups.
    gen: AtomicU64,
    map: RwLock<HashMap<u32, Arc<Domain>>>,
}

impl Default for DomainRegistry {
    fn default() -> Self {
        Self {
            uid: next_uid(),
            gen: AtomicU64::new(0),
            map: RwLock::new(HashMap::new()),
        }
    }
}

impl DomainRegistry {
    /// Locked lookup (topology paths and cache misses).
    pub fn get(&self, id: u32) -> Option<Arc<Domain>> {
        read(&self.map).get(&id).cloned()
    }

    /// Hot-path lookup: runs `f` with the domain, through the calling
    /// thread's cache (no shared cache line written while the registry is
    /// unchanged).
    pub fn with<R>(&self, id: u32, f: impl FnMut(Option<&Arc<Domain>>) -> R) -> R {
        let gen = self.gen.load(Ordering::Acquire);
        with_cached(self.uid, gen, id, || self.get(id), f)
    }

    pub fn len(&self) -> usize {
        read(&self.map).len()
    }

    pub fn insert(&self, d: Arc<Domain>) {
        let mut m = write(&self.map);
        m.insert(d.id(), d);
        self.gen.fetch_add(1, Ordering::Release);
    }

    pub fn remove(&self, id: u32) -> Option<Arc<Domain>> {
        let mut m = write(&self.map);
        let d = m.remove(&id);
        self.gen.fetch_add(1, Ordering::Release);
        d
    }

    /// Removes every domain (device reset).
    pub fn drain(&self) -> Vec<Arc<Domain>> {
        let mut m = write(&self.map);
        let all = m.drain().map(|(_, d)| d).collect();
        self.gen.fetch_add(1, Ordering::Release);
        all
    }
}
