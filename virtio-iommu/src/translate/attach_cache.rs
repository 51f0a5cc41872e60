//! Each thread's cache of the attachments it translates through.
//!
//! WHY: `ArcSwapOption::load` protects what it returns with a debt slot:
//! a sequentially consistent store on the way in and a compare-and-swap on
//! the way out, two locked instructions per DMA access, paid by every
//! device thread on every access although attachments change only at
//! ATTACH and DETACH. A thread that keeps a strong reference to the
//! attachment it last saw needs only to check that it is still current:
//! one plain load of the endpoint's cell and a compare (`arc_swap::Cache`).
//! The cache is per thread, so the hit writes nothing another thread reads.
//! It is thread-local rather than kept in the handle because a device's
//! handle is shared by all its threads (the VMM's DMA seam holds one
//! translator per device behind `&self`).
//!
//! Why a cached domain is never used where the guest could notice:
//! - Equal pointers mean the same domain: the cache holds a strong
//!   reference to its domain, so that allocation cannot be freed and
//!   handed to another domain while cached (no ABA).
//! - Every access compares again, after its read section began (the
//!   caller's `ReadSection`). The DETACH or re-attach that replaced the
//!   domain is a SeqCst swap made before the kick's barrier and quiescer
//!   wait. In the store-buffer argument of `quiesce.rs` this load is one
//!   of the section's reads, like the table's: either it sees the swap and
//!   the access uses the new attachment, or the quiescer sees the section
//!   and the guest's DETACH does not complete before it ends. A stale
//!   domain is thus only ever used by an access that began before the
//!   swap, which is what a `Guard` loaded just before the swap gives too.
//!   A thread ordered after the swap in any other way (the same thread, or
//!   one told through a lock or channel) reads the new pointer by
//!   coherence, so its very next access sees the change.
//! - The load may be relaxed: a domain the cache already holds was
//!   synchronized when it was loaded (`load_full`), and a changed pointer
//!   is loaded again the same way.
//!
//! The price: an old domain lives until the thread's next access through
//! that endpoint or until its entry is evicted (at most [`WAYS`] domains
//! per thread). Nothing reaches it (every access compares first), and a
//! destroyed domain's table was emptied when its last endpoint left.
//!
//! When the cache cannot be used (the thread is exiting and its
//! thread-locals are gone, or an access is made from inside another's
//! closure) the access loads the cell directly, as before.

use std::cell::RefCell;
use std::sync::Arc;

use arc_swap::Cache;

use crate::domain::Domain;
use crate::endpoint::{AttachCell, Endpoint};

/// Endpoints one thread keeps cached. A device worker translates for one;
/// a vCPU (the DMA test device, inline request queues) for a few.
const WAYS: usize = 4;

/// One endpoint's entry.
struct Way {
    cache: Cache<AttachCell, Option<Arc<Domain>>>,
    /// The domain the last access through this entry used (tests: a
    /// change is a miss).
    #[cfg(test)]
    seen: *const Domain,
}

/// One thread's entries and the next one to replace.
struct Ways {
    ways: [Option<Way>; WAYS],
    next: usize,
}

thread_local! {
    static CACHE: RefCell<Ways> = const {
        RefCell::new(Ways {
            ways: [const { None }; WAYS],
            next: 0,
        })
    };
}

#[cfg(test)]
thread_local! {
    /// Accesses of this thread that did not find their endpoint's current
    /// attachment in the cache (tests count them to show that a hit loads
    /// nothing from the shared cell but its pointer).
    static MISSES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// This thread's cache misses so far (tests).
#[cfg(test)]
pub(crate) fn misses() -> u64 {
    MISSES.with(std::cell::Cell::get)
}

impl Ways {
    /// The current attachment of `ep`, from the cache when it still holds;
    /// `None` if the cache cannot answer (never "not attached").
    #[inline]
    fn load(&mut self, ep: &Arc<Endpoint>) -> Option<Option<&Domain>> {
        let found = self
            .ways
            .iter()
            .position(|w| w.as_ref().is_some_and(|w| ep.owns_cell(w.cache.arc_swap())));
        let i = match found {
            Some(i) => i,
            None => {
                let i = self.next % WAYS;
                self.next = self.next.wrapping_add(1);
                let slot = self.ways.get_mut(i)?;
                *slot = Some(Way {
                    cache: Cache::new(ep.cell()),
                    #[cfg(test)]
                    seen: std::ptr::null(),
                });
                i
            }
        };
        let way = self.ways.get_mut(i)?.as_mut()?;
        let d = way.cache.load().as_deref();
        #[cfg(test)]
        {
            let p = d.map_or(std::ptr::null(), |d| d as *const Domain);
            if p != way.seen || found.is_none() {
                way.seen = p;
                MISSES.with(|m| m.set(m.get() + 1));
            }
        }
        Some(d)
    }
}

/// Runs `f` with the current attachment of `ep` (one pointer compare on a
/// hit, see the module doc).
#[inline]
pub(crate) fn with_attached<R>(ep: &Arc<Endpoint>, mut f: impl FnMut(Option<&Domain>) -> R) -> R {
    let cached = CACHE.try_with(|c| {
        let mut c = c.try_borrow_mut().ok()?;
        Some(f(c.load(ep)?))
    });
    match cached {
        Ok(Some(r)) => r,
        _ => f(ep.attached().as_deref()),
    }
}
