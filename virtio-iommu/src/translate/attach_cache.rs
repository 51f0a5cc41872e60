//! Each thread's cache of the attachments it translates through.
//!
//! WHY: `ArcSwapOption::load` protects what it returns with a debt slot:
//! a sequentially consistent store on the way in and a compare-and-swap on
//! the way out, two locked instructions per DMA access, paid by every
//! device thread on every access although attachments change only at
//! ATTACH and DETACH. A locked instruction also waits for the thread's
//! store buffer to drain, which after a packet copy is the expensive part.
//! A thread that keeps a strong reference to the attachment it last saw
//! needs only to check that it is still current: one plain load of the
//! endpoint's count of attachment changes and a compare. The cache is per
//! thread, so the hit writes nothing another thread reads. It is
//! thread-local rather than kept in the handle because a device's handle
//! is shared by all its threads (the VMM's DMA seam holds one translator
//! per device behind `&self`).
//!
//! Why a cached domain is never used where the guest could notice:
//! - The count is bumped after every swap of the attachment
//!   (`Endpoint::set_domain`) and read (Acquire) before the attachment is
//!   loaded on a miss, so an entry's domain is at least as new as the
//!   count it recorded; while the count still reads the same, no change
//!   was completed since.
//! - Every access reads the count again, after its read section began
//!   (the caller's `ReadSection`). The DETACH or re-attach is a SeqCst
//!   bump made before the kick's barrier and quiescer wait. In the
//!   store-buffer argument of `quiesce.rs` this load is one of the
//!   section's reads, like the table's: either it sees the bump and the
//!   access loads the new attachment, or the quiescer sees the section and
//!   the guest's DETACH does not complete before it ends. A stale domain
//!   is thus only ever used by an access the DETACH waits for, which is
//!   what a `Guard` loaded just before the swap gave too. A thread ordered
//!   after the change in any other way (the same thread, or one told
//!   through a lock or channel) reads the new count, so its very next
//!   access sees the change.
//!
//! The price: an old domain lives until the thread's next access through
//! that endpoint or until its entry is replaced (at most [`WAYS`] domains
//! per thread). Nothing reaches it (every access compares first), and a
//! destroyed domain's table was emptied when its last endpoint left.
//!
//! An access holds its attachment for all its runs as a [`Pinned`]: a
//! pointer to the cached domain, valid because while any `Pinned` of the
//! thread lives its cache replaces and drops nothing (a nested access
//! loads the cell directly instead).
//!
//! When the cache cannot be used (the thread is exiting and its
//! thread-locals are gone, or an attachment of the thread is pinned) the
//! access loads the cell directly, as before ([`Attachment::Loaded`]).

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use crate::domain::Domain;
use crate::endpoint::{Attached, Endpoint};

/// Endpoints one thread keeps cached. A device worker translates for one;
/// a vCPU (the DMA test device, inline request queues) for a few.
const WAYS: usize = 4;

/// One endpoint's entry.
struct Way {
    /// Kept alive so that its address, the key, is not reused.
    ep: Arc<Endpoint>,
    /// The endpoint's change count read before `domain` was loaded.
    seen: u64,
    domain: Option<Arc<Domain>>,
}

/// One thread's entries, the last used first.
struct Ways {
    ways: [Option<Way>; WAYS],
}

impl Drop for Ways {
    fn drop(&mut self) {
        if PINS.get() > 0 {
            // Cannot happen (a pin lives in a stack frame of this thread,
            // and thread-locals are destroyed after those end); if it did,
            // leaking is what keeps the pinned domain valid.
            for w in &mut self.ways {
                std::mem::forget(w.take());
            }
        }
    }
}

thread_local! {
    static CACHE: RefCell<Ways> = const {
        RefCell::new(Ways {
            ways: [const { None }; WAYS],
        })
    };
    /// [`Pinned`] attachments of this thread alive now. WHY apart from
    /// the entries: it needs no destructor, so a pin's drop reaches it
    /// with one plain access (no check that the thread-local still lives).
    static PINS: Cell<usize> = const { Cell::new(0) };
}

#[cfg(test)]
thread_local! {
    /// Accesses of this thread that loaded the attachment instead of
    /// finding it in the cache (tests count them to show that a hit loads
    /// nothing from the shared cell).
    static MISSES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// This thread's cache misses so far (tests).
#[cfg(test)]
pub(crate) fn misses() -> u64 {
    MISSES.with(std::cell::Cell::get)
}

impl Ways {
    /// Pins the current attachment of `ep`, from the cache when it still
    /// holds; `None` if the cache cannot answer (never "not attached").
    #[inline(always)]
    fn pin(&mut self, ep: &Arc<Endpoint>) -> Option<Option<NonNull<Domain>>> {
        if PINS.get() != 0 {
            return None;
        }
        let now = ep.changes();
        let first = match self.ways.first() {
            Some(Some(w)) if Arc::ptr_eq(&w.ep, ep) && w.seen == now => w,
            _ => self.refill(ep, now)?,
        };
        let d = first.domain.as_deref().map(NonNull::from);
        PINS.set(PINS.get().saturating_add(1));
        Some(d)
    }

    /// The miss: `ep`'s entry brought to the front, its domain loaded
    /// again unless it was loaded at change count `now`; an entry made in
    /// place of the least recently used one if `ep` has none.
    #[cold]
    #[inline(never)]
    fn refill(&mut self, ep: &Arc<Endpoint>, now: u64) -> Option<&Way> {
        let i = self
            .ways
            .iter()
            .position(|w| w.as_ref().is_some_and(|w| Arc::ptr_eq(&w.ep, ep)))
            .unwrap_or(WAYS - 1);
        // Most recently used first: the found (or evicted) entry moves to
        // the front, the ones before it move back by one.
        self.ways.get_mut(..=i)?.rotate_right(1);
        let front = self.ways.first_mut()?;
        let fresh = match front {
            Some(w) if Arc::ptr_eq(&w.ep, ep) => w.seen == now,
            _ => false,
        };
        if !fresh {
            #[cfg(test)]
            MISSES.with(|m| m.set(m.get() + 1));
            // `now` was read before this load: the domain is at least as
            // new as the count recorded with it.
            *front = Some(Way {
                ep: Arc::clone(ep),
                seen: now,
                domain: ep.domain(),
            });
        }
        front.as_ref()
    }
}

/// One access's hold on its endpoint's attachment.
pub(crate) enum Attachment {
    /// From this thread's cache.
    Pinned(Pinned),
    /// Loaded from the endpoint's cell (the cache could not be used).
    Loaded(Attached),
}

impl Attachment {
    /// The domain, if attached.
    #[inline]
    pub(crate) fn domain(&self) -> Option<&Domain> {
        match self {
            Attachment::Pinned(p) => p.domain(),
            Attachment::Loaded(g) => g.as_deref(),
        }
    }
}

/// A domain (or none) held by this thread's cache, which keeps it alive
/// and replaces nothing while this lives. Not `Send`: it counts in its
/// thread's cache.
pub(crate) struct Pinned {
    domain: Option<NonNull<Domain>>,
    _not_send: PhantomData<*const ()>,
}

impl Pinned {
    #[inline]
    fn domain(&self) -> Option<&Domain> {
        // SAFETY: the pointer came from an `Arc<Domain>` in an entry of
        // this thread's cache, and while this `Pinned` lives (it cannot
        // leave the thread) the cache neither replaces nor drops an entry
        // (`Ways::pin` refuses, `Ways::drop` leaks), so the `Arc` keeps
        // the domain alive for at least as long as `&self`.
        self.domain.map(|d| unsafe { d.as_ref() })
    }
}

impl Drop for Pinned {
    #[inline]
    fn drop(&mut self) {
        PINS.set(PINS.get().saturating_sub(1));
    }
}

/// The current attachment of `ep` for one access: one load and a compare
/// on a hit (see the module doc).
#[inline]
pub(crate) fn attachment(ep: &Arc<Endpoint>) -> Attachment {
    let pinned = CACHE.try_with(|c| c.try_borrow_mut().ok()?.pin(ep));
    match pinned {
        Ok(Some(domain)) => Attachment::Pinned(Pinned {
            domain,
            _not_send: PhantomData,
        }),
        _ => Attachment::Loaded(ep.attached()),
    }
}
