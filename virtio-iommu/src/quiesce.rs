//! Quiescence of emulated device threads: the DMA consumer an UNMAP must
//! wait for when the consumer keeps no translation cache but uses what it
//! translated a moment later.
//!
//! WHY: an emulated device translates an IOVA and then copies (virtio-net
//! builds host iovecs and calls `readv`/`writev`; the DMA test device
//! translates and then copies). If the guest's UNMAP completes in between,
//! the copy lands in a page the guest may already have reused. The spec
//! promises more: once an UNMAP has completed, no DMA through that mapping
//! can land.
//!
//! How (an epoch scheme in the shape of RCU): each device thread owns a
//! [`ReaderSlot`] and wraps every translate-and-use in a [`ReadSection`]
//! (one store on entry, one on exit; no lock, never blocks). The
//! [`Quiescer`] is registered with the device as an [`Invalidator`]: at the
//! end of a kick that unmapped something it advances the epoch and waits
//! until every slot is either outside a section or inside one that began
//! after the advance. That is one wait per kick, never one per UNMAP, and a
//! parked or idle device thread (outside any section) costs nothing.
//!
//! Ordering: a reader publishes its slot and then reads the table; the
//! invalidator has already written the table and then (after advancing the
//! epoch) reads the slots. In this store-buffer pattern at least one side
//! must see the other: either the reader's translation misses the removed
//! mapping, or the invalidator sees the reader and waits for it. That takes
//! a barrier between each side's store and its loads. The reader enters a
//! section per DMA access and the invalidator syncs once per kick, so the
//! barrier is asymmetric where the kernel allows it (`barrier.rs`): the
//! invalidator calls `membarrier`, which runs a full barrier on every CPU
//! running one of our threads, and the reader only keeps the compiler from
//! reordering (no instruction). Without membarrier each side pays one full
//! fence, as before. The slot store is a Release and the invalidator's slot
//! loads are Acquires, so whatever slot value the invalidator reads (idle,
//! an older or a newer section) orders the thread's earlier sections before
//! the guest's reuse of the page. `loom_tests` model-check this (`make
//! loom`, the kernel's barrier modelled as a SeqCst fence, see
//! `barrier.rs`); without the reader's barrier, or with the relaxed slot
//! store and weak slot references of an earlier version, they fail.
//!
//! Sticky epochs (`BarrierKind::Sticky`, the default; the quiescent-state
//! idea of QSBR): either symmetric fence per section costs a translation
//! twice its price, and membarrier per sync interrupts every CPU. So a
//! sticky slot does not go idle at the end of a section: it keeps the
//! epoch its thread last announced, and the next section announces (a
//! Release store and a full fence) only if the global epoch moved since.
//! Between two syncs a thread's sections cost a load, a compare and two
//! plain stores. A sync waits until each slot is idle or announces its
//! epoch, i.e. until each thread has entered a section again (whose table
//! reads then follow the fence, so see the sync's table writes) or parked
//! ([`ReaderSlot::park`]: idle, with a Release that orders its sections
//! before). A section's end parks the slot when the epoch moved since the
//! slot announced, so a sync that catches a thread inside a section waits
//! for that section's end, not the next one's start; a thread that was
//! between sections when the sync began is waited for until its next
//! section. A thread must therefore park before it blocks (the device
//! workers do it at their poll, `ThreadDma::parked` in the VMM), else a
//! sync waits for its wake-up. The safety net for a thread that forgot:
//! after [`STICKY_GRACE`] the sync runs membarrier (every CPU running one
//! of our threads executes a full barrier) and then takes a slot whose
//! per-section busy flag reads clear as done: that thread's next access
//! begins after the barrier, so after the sync's table writes (the
//! asymmetric argument of `barrier.rs`, with the busy flag as the slot),
//! and the flag's Release/Acquire orders its last access before. Each
//! slot that needed the net is logged once: it names a missing park.

use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

// The epoch and the slots are the whole protocol; under `--cfg loom` they
// are loom's model-checked atomics (`make loom`), and the barrier pair is
// loom's fence (`barrier.rs`); nothing else changes.
#[cfg(loom)]
use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::barrier::{self, BarrierKind};
use crate::invalidation::Invalidator;
use crate::locks::Unpoison;
#[cfg(loom)]
use loom::sync::atomic::fence;
#[cfg(not(loom))]
use std::sync::atomic::compiler_fence;
#[cfg(not(loom))]
use std::sync::OnceLock;

/// Most live slots one quiescer tracks (device threads are few; a bound
/// keeps a registration bug from growing the list without end). A slot
/// whose owner dropped it (a device worker that ended at a reset) is
/// retired and no longer counts, so a guest that resets its devices again
/// and again cannot use the slots up. Past the bound `register` fails, and
/// the caller must then not run the device at all: a device thread
/// without a slot is one no UNMAP waits for.
pub const MAX_READERS: usize = 256;

/// A slot value meaning "outside any section".
const IDLE: u64 = 0;

/// How long a sticky sync waits for a slot to announce the new epoch or
/// park before it runs membarrier (see the module doc). WHY this long: a
/// device thread that is serving requests enters its next section within
/// microseconds, so a longer wait only delays the UNMAP of a thread that
/// was preempted between sections or forgot to park (in the nested test
/// runner, whose two CPUs take turns, a virtio-net transfer took 204 us
/// per invalidation batch with 50 us and a yielding wait, 71 us with 20 us
/// and a spinning one, the fence 37 us); a shorter one would run
/// membarrier (an IPI to every CPU running a VMM thread) for threads that
/// are merely busy.
pub const STICKY_GRACE: Duration = Duration::from_micros(20);

/// The shared side: the epoch and the slots of every reader.
#[derive(Debug)]
pub struct Quiescer {
    /// Starts at 1 so that [`IDLE`] never equals an epoch.
    epoch: EpochWord,
    /// The process's barrier pair, read by every section next to `epoch`.
    barrier: BarrierKind,
    /// The registry of slots, changed by `register` only. Retired slots
    /// stay until the next `register` prunes them: reading a retired slot
    /// costs one load and finds it idle.
    readers: Mutex<Vec<Arc<SlotState>>>,
    /// What `synchronize` walks: the registry as `register` last left it.
    /// WHY a copy: a sync reads it without taking the lock or copying the
    /// list, once per kick. A registration happens before the slot's first
    /// section, so a sync whose load (after its barrier) misses it would
    /// also miss that section's slot store, and the barrier pair then puts
    /// the section's table reads after the sync's table writes: the same
    /// argument as for any slot, and as when the sync copied the list
    /// under the lock.
    snapshot: ArcSwap<Vec<Arc<SlotState>>>,
    /// Waits done so far, and how many of them found a reader to wait for.
    waits: AtomicU64,
    waited_for_reader: AtomicU64,
    /// Syncs that needed the sticky safety net (membarrier).
    fallbacks: AtomicU64,
    /// Under loom: whether the model includes the sticky safety net (its
    /// membarrier stands for a fence in the reader after its busy store).
    #[cfg(loom)]
    model_fallback: bool,
}

/// The epoch on a cache line of its own. WHY: every section loads it,
/// and the counters next to it change at every sync; sharing their line
/// would cost the readers a miss for each counter update too.
#[derive(Debug)]
#[repr(align(64))]
struct EpochWord(AtomicU64);

impl std::ops::Deref for EpochWord {
    type Target = AtomicU64;

    fn deref(&self) -> &AtomicU64 {
        &self.0
    }
}

/// One device thread's handle, owned by that thread; dropping it retires
/// the slot.
#[derive(Debug)]
pub struct ReaderSlot {
    state: Arc<SlotState>,
    quiescer: Arc<Quiescer>,
    /// The quiescer's kind is sticky (a copy: every section and its end
    /// test it, and one load less is a measurable part of a translation).
    sticky: bool,
}

/// What the quiescer reads of a slot, on a cache line of its own: the
/// owning thread writes the epoch word twice per section, and nothing else
/// that thread or the invalidator touches (the `Arc` counts, other slots)
/// should share the line.
///
/// WHY the quiescer keeps the state alive instead of a weak reference: a
/// sync that skipped a slot whose owner had just dropped it would have no
/// ordering with that owner's last section (a failed `Weak::upgrade` is a
/// relaxed load), so a copy made in it could still be ordered after the
/// guest's reuse of the page. Reading the word of a dead slot finds the
/// Release store that ended its last section. Loom found this
/// (`loom_tests`).
#[derive(Debug)]
#[repr(align(64))]
struct SlotState {
    /// [`IDLE`], or the epoch the owner announced last (sticky), or that
    /// of its open section (fence, membarrier). Only the owner writes it,
    /// so it also is the owner's memory of what it announced.
    active: AtomicU64,
    /// Sticky only: set while an access is open (the safety net's flag).
    busy: AtomicBool,
    /// Set (Release) when the owner dropped its handle; `register` prunes
    /// the slot after an Acquire load of it.
    retired: AtomicBool,
    /// The thread that announced first, for the safety net's warning.
    #[cfg(not(loom))]
    owner: OnceLock<String>,
    /// Whether the safety net's warning was logged for this slot.
    #[cfg(not(loom))]
    warned: AtomicBool,
}

/// A translate-and-use section; ends when dropped. Never call
/// [`Quiescer::synchronize`] (or complete a kick) inside one: it would wait
/// for itself.
#[must_use = "the section ends when the guard is dropped"]
pub struct ReadSection<'a> {
    slot: &'a ReaderSlot,
    /// Sticky: the epoch the slot holds for this section (what `enter`
    /// found and announced if needed). WHY a copy: the section's end
    /// compares it with the global epoch without reloading the slot.
    epoch: u64,
}

/// Registering another reader would exceed [`MAX_READERS`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("too many DMA reader threads (at most {MAX_READERS})")]
pub struct TooManyReaders;

/// Counters of a [`Quiescer`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuiesceStats {
    /// Invalidations (one per kick that unmapped something, per domain).
    pub waits: u64,
    /// Of those, the ones that found a reader inside an older section
    /// (or, sticky, one that had not announced the new epoch yet).
    pub waited_for_reader: u64,
    /// Of those, the ones that ran the sticky safety net (membarrier): a
    /// device thread neither entered again nor parked within
    /// [`STICKY_GRACE`].
    pub fallbacks: u64,
}

impl Quiescer {
    /// A quiescer with no readers, with the process's barrier.
    pub fn new() -> Arc<Quiescer> {
        Self::with_barrier(barrier::choose())
    }

    /// A quiescer with no readers and the barrier `kind` where this
    /// process can use it (the fence otherwise).
    pub fn with_barrier(kind: BarrierKind) -> Arc<Quiescer> {
        Arc::new(Quiescer {
            epoch: EpochWord(AtomicU64::new(1)),
            barrier: barrier::usable(kind),
            readers: Mutex::new(Vec::new()),
            snapshot: ArcSwap::from_pointee(Vec::new()),
            waits: AtomicU64::new(0),
            waited_for_reader: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            #[cfg(loom)]
            model_fallback: false,
        })
    }

    /// Under loom: a sticky quiescer, with or without its safety net
    /// (without it, the reader's busy flag gets no modelled barrier, and
    /// a sync must wait for the reader to announce or park).
    #[cfg(loom)]
    fn sticky_model(fallback: bool) -> Arc<Quiescer> {
        let mut q = Self::with_barrier(BarrierKind::Sticky);
        if let Some(q) = Arc::get_mut(&mut q) {
            q.model_fallback = fallback;
        }
        q
    }

    /// The barrier pair in use (the asked-for kind where it is usable).
    pub fn kind(&self) -> BarrierKind {
        self.barrier
    }

    /// A slot for one more device thread.
    pub fn register(self: &Arc<Self>) -> Result<Arc<ReaderSlot>, TooManyReaders> {
        let mut readers = self.readers.lock().unpoisoned();
        readers.retain(|r| !r.retired.load(Ordering::Acquire));
        if readers.len() >= MAX_READERS {
            return Err(TooManyReaders);
        }
        let state = Arc::new(SlotState {
            active: AtomicU64::new(IDLE),
            busy: AtomicBool::new(false),
            retired: AtomicBool::new(false),
            #[cfg(not(loom))]
            owner: OnceLock::new(),
            #[cfg(not(loom))]
            warned: AtomicBool::new(false),
        });
        readers.push(Arc::clone(&state));
        // Published before the slot is handed out, so before its first
        // section.
        self.snapshot.store(Arc::new(readers.clone()));
        Ok(Arc::new(ReaderSlot {
            state,
            quiescer: Arc::clone(self),
            sticky: self.barrier == BarrierKind::Sticky,
        }))
    }

    /// Counters so far.
    pub fn stats(&self) -> QuiesceStats {
        QuiesceStats {
            waits: self.waits.load(Ordering::Relaxed),
            waited_for_reader: self.waited_for_reader.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
        }
    }

    /// Returns once every section that may have begun before this call has
    /// ended. Call it after the table update it must cover. A thread that
    /// owns a slot parks it first (sticky: it would wait for itself, until
    /// the safety net), and never calls this inside a section.
    pub fn synchronize(&self) {
        let target = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        // Pairs with the barrier in `enter`: the caller's table writes are
        // ordered before the slot reads below (store-buffer pattern).
        // Test mutation: no barrier, so a section whose slot store is still
        // in its CPU's store buffer goes unseen.
        if !crate::mutation::active(crate::mutation::Mutation::NoMembarrier) {
            self.barrier.heavy();
        }
        // A snapshot, so that no lock is held while waiting (a device
        // thread being set up registers its slot meanwhile).
        let readers = self.snapshot.load();
        self.waits.fetch_add(1, Ordering::Relaxed);
        let mut waited = false;
        // Whether this sync ran the sticky safety net; one membarrier
        // covers every slot after it.
        let mut expedited = false;
        for slot in readers.iter() {
            // Read the clock only for a slot that makes us wait: most are
            // idle, and a clock read costs more than the slot's load.
            let mut start: Option<Instant> = None;
            loop {
                // Acquire: pairs with the Release at the end of a section
                // (or with a sticky announcement or park), so what the
                // thread's earlier sections did happens before we complete.
                let a = slot.active.load(Ordering::Acquire);
                if a == IDLE || a >= target {
                    break;
                }
                // After the membarrier: a thread outside an access will
                // read the table after the barrier; Acquire pairs with the
                // Release that ended its last access.
                if expedited && !slot.busy.load(Ordering::Acquire) {
                    self.note_unparked(slot);
                    break;
                }
                waited = true;
                let spent = start.get_or_insert_with(Instant::now).elapsed();
                if !expedited && self.barrier == BarrierKind::Sticky {
                    if self.fallback_due(spent) {
                        barrier::expedite();
                        self.fallbacks.fetch_add(1, Ordering::Relaxed);
                        expedited = true;
                    } else {
                        // Spins, never yields, until the net: a yield
                        // hands the CPU to whichever thread is runnable
                        // for up to a time slice, and a preempted reader,
                        // which the net would let go at once, then holds
                        // the UNMAP that long.
                        backoff(Duration::ZERO);
                    }
                    continue;
                }
                backoff(spent);
            }
        }
        if waited {
            self.waited_for_reader.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Whether a sticky sync has waited long enough for a slot to run the
    /// safety net. Under loom at once, when the model has the net.
    #[cfg(not(loom))]
    fn fallback_due(&self, spent: Duration) -> bool {
        self.barrier == BarrierKind::Sticky && spent >= STICKY_GRACE
    }

    #[cfg(loom)]
    fn fallback_due(&self, _spent: Duration) -> bool {
        self.barrier == BarrierKind::Sticky && self.model_fallback
    }

    /// A slot the safety net let go: its thread forgot to park somewhere
    /// it blocks (each such slot is logged once).
    #[cfg(not(loom))]
    fn note_unparked(&self, slot: &SlotState) {
        if !slot.warned.swap(true, Ordering::Relaxed) {
            let owner = slot.owner.get().map_or("(unknown)", String::as_str);
            log::warn!(
                "vIOMMU quiescer: thread {owner} neither entered a DMA section again nor parked \
                 within {STICKY_GRACE:?}; an UNMAP needed membarrier (preempted, or a blocking \
                 wait without a park?)"
            );
        }
    }

    #[cfg(loom)]
    fn note_unparked(&self, _slot: &SlotState) {}
}

/// One step of waiting for a reader inside an older section. Sections are
/// short (a copy, a non-blocking syscall): spin briefly, then yield, then
/// sleep so a descheduled device thread gets the CPU back.
#[cfg(not(loom))]
fn backoff(spent: Duration) {
    if spent < Duration::from_micros(20) {
        std::hint::spin_loop();
    } else if spent < Duration::from_millis(1) {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Under loom a wait must hand the (modelled) CPU to the reader.
#[cfg(loom)]
fn backoff(_spent: Duration) {
    loom::thread::yield_now();
}

impl Invalidator for Quiescer {
    fn invalidate(&self, _domain: u32, _ranges: &[RangeInclusive<u64>]) {
        self.synchronize();
    }

    /// A device thread may have translated through the domain the
    /// endpoint left (DETACH, ATTACH elsewhere, also from a domain that
    /// lives on or a bypass domain): the departure completes only after
    /// such a section ended, as an UNMAP does.
    fn endpoint_left(&self, _endpoint: u32, _domain: Option<u32>) {
        self.synchronize();
    }
}

impl ReaderSlot {
    /// Enters a section: translations taken inside it may be used until
    /// the guard is dropped. Sections do not nest.
    #[inline]
    pub fn enter(&self) -> ReadSection<'_> {
        // Test mutation: a section that publishes nothing, so no sync ever
        // waits for it (the stress tests must then see DMA land late).
        if crate::mutation::active(crate::mutation::Mutation::NoSections) {
            return ReadSection {
                slot: self,
                epoch: IDLE,
            };
        }
        let q = &*self.quiescer;
        // Acquire: a section that sees an epoch advanced by `synchronize`
        // also sees the table writes made before that advance.
        let e = q.epoch.load(Ordering::Acquire);
        if self.sticky {
            // Relaxed: only this thread writes the word. Equal: announced
            // already in this epoch, and the fence that followed orders
            // this section's table reads too.
            if self.state.active.load(Ordering::Relaxed) != e {
                self.announce(e);
            }
            // The safety net's flag; the compiler must keep it before the
            // table reads (the kernel's barrier does the rest).
            self.state.busy.store(true, Ordering::Relaxed);
            self.busy_half();
            return ReadSection {
                slot: self,
                epoch: e,
            };
        }
        // Release (a plain store on x86): a sync that reads this word and
        // finds a section newer than itself (so does not wait) must still
        // see everything the thread's earlier sections did. A relaxed
        // store here let a previous section's copy be ordered after the
        // guest's reuse of the page (found by loom).
        self.state.active.store(e, Ordering::Release);
        // Orders the slot store before the table reads that follow; pairs
        // with the barrier in `synchronize`. With membarrier no instruction
        // at all, otherwise one full fence per section.
        q.barrier.light();
        ReadSection {
            slot: self,
            epoch: e,
        }
    }

    /// Sticky: announces epoch `e`. Release (a plain store on x86): a sync
    /// that reads `e` and so does not wait must see what the thread's
    /// earlier sections did. The full fence orders the store before this
    /// and every later section's table reads (the store-buffer pattern).
    #[inline]
    fn announce(&self, e: u64) {
        self.state.active.store(e, Ordering::Release);
        self.quiescer.barrier.light();
        #[cfg(not(loom))]
        if self.state.owner.get().is_none() {
            let name = std::thread::current()
                .name()
                .unwrap_or("(unnamed)")
                .to_owned();
            let _ = self.state.owner.set(name);
        }
    }

    /// Between the busy store and the table reads: the compiler's order
    /// only; under loom the membarrier's fence where the model has it.
    #[inline(always)]
    fn busy_half(&self) {
        #[cfg(not(loom))]
        compiler_fence(Ordering::SeqCst);
        #[cfg(loom)]
        if self.quiescer.model_fallback {
            fence(Ordering::SeqCst);
        }
    }

    /// Marks the thread quiescent until its next section: no sync waits
    /// for it meanwhile. Sticky slots keep their epoch between sections,
    /// so a thread calls this before it blocks (poll, channel receive,
    /// sleep) and before it syncs itself; never inside a section. The
    /// Release orders its sections before a sync that reads the idle
    /// word. Costs one store; with the other kinds the slot is idle
    /// already.
    #[inline]
    pub fn park(&self) {
        self.state.active.store(IDLE, Ordering::Release);
    }
}

impl Drop for ReadSection<'_> {
    /// Sticky: the access ends, and the slot parks if a sync began since
    /// it announced. WHY: a sync that catches the thread inside a section
    /// otherwise waits for its NEXT section (or park), not for the end of
    /// this one; in the nested runner that doubled the cost of a virtio-net
    /// invalidation batch against the fence protocol. With the park a sync
    /// waits for the sections open at its start, as the fence protocol
    /// does, plus threads between sections until they enter again.
    ///
    /// WHY the epoch load is Relaxed: its value only chooses between two
    /// states that are both safe here. Not parking is the sticky slot as it
    /// was; parking is [`ReaderSlot::park`], a Release store of IDLE, safe
    /// anywhere outside a section, and program order puts it after this
    /// section's accesses (the loom models run it at every interleaving).
    /// A stale value only delays the release to the next section's enter.
    /// It costs no fence either: a parked slot announces at its next
    /// section, which it had to do anyway once the epoch moved. The cost is
    /// a load of a line that is shared until a sync writes it, and a
    /// compare with the epoch the guard kept: about 0.2 ns a translation
    /// (host-map-bench translate_under_churn, one thread, 5.4 to 5.6 ns
    /// against 4.7 ns with no quiescer), under the 0.3 ns it may cost.
    #[inline]
    fn drop(&mut self) {
        let slot = self.slot;
        if slot.sticky {
            slot.state.busy.store(false, Ordering::Release);
            // The slot's word equals `self.epoch` (the enter announced it
            // if it differed), so this tests whether the epoch moved since.
            if slot.quiescer.epoch.load(Ordering::Relaxed) != self.epoch {
                slot.park();
            }
        } else {
            slot.state.active.store(IDLE, Ordering::Release);
        }
    }
}

impl Drop for ReaderSlot {
    fn drop(&mut self) {
        // Sections borrow the handle, so none is open here. A sticky slot
        // still holds its epoch: parked, syncs stop waiting for it. The
        // Release orders the last section before the pruning in `register`.
        self.park();
        self.state.retired.store(true, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::mpsc;

    #[test]
    fn idle_readers_cost_no_wait() {
        let q = Quiescer::new();
        let _slots: Vec<_> = (0..4).map(|_| q.register().unwrap()).collect();
        q.synchronize();
        assert_eq!(
            q.stats(),
            QuiesceStats {
                waits: 1,
                waited_for_reader: 0,
                fallbacks: 0,
            }
        );
    }

    #[test]
    fn a_section_begun_after_the_sync_started_is_not_waited_for() {
        let q = Quiescer::new();
        let slot = q.register().unwrap();
        // A section in the current epoch, then the epoch moves on (as a
        // sync's first step does) and the reader enters again: only the
        // first section is older than the second sync.
        let first = slot.enter();
        drop(first);
        // This thread syncs: it parks its own slot first.
        slot.park();
        q.synchronize();
        let _again = slot.enter();
        assert!(slot.state.active.load(Ordering::SeqCst) >= q.epoch.load(Ordering::SeqCst));
        assert_eq!(q.stats().waited_for_reader, 0);
    }

    #[test]
    fn sync_waits_for_an_older_section_to_end() {
        let q = Quiescer::new();
        let slot = q.register().unwrap();
        let ended = Arc::new(AtomicBool::new(false));
        let section = slot.enter();
        let (q2, ended2) = (Arc::clone(&q), Arc::clone(&ended));
        let waiter = std::thread::spawn(move || {
            q2.synchronize();
            // Must only get here after the section ended.
            ended2.load(Ordering::SeqCst)
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "sync returned inside a section");
        ended.store(true, Ordering::SeqCst);
        drop(section);
        assert!(waiter.join().unwrap());
        assert_eq!(q.stats().waited_for_reader, 1);
    }

    #[test]
    fn readers_are_bounded() {
        let q = Quiescer::new();
        let mut slots: Vec<_> = (0..MAX_READERS).map(|_| q.register().unwrap()).collect();
        assert_eq!(q.register().unwrap_err(), TooManyReaders);
        // A slot given back (its device worker ended) frees its place.
        slots.pop();
        let again = q.register().unwrap();
        assert_eq!(q.register().unwrap_err(), TooManyReaders);
        drop((slots, again));
        q.synchronize();
    }

    /// A sticky quiescer where the process has membarrier; the fence (and
    /// `None`) where it has not, which the tests below then check instead.
    fn sticky() -> (Arc<Quiescer>, bool) {
        let q = Quiescer::with_barrier(BarrierKind::Sticky);
        let sticky = q.kind() == BarrierKind::Sticky;
        assert_eq!(sticky, barrier::membarrier_registered());
        (q, sticky)
    }

    /// A sticky slot keeps its epoch after a section and announces again
    /// only once the epoch moved; park makes it idle. Without membarrier
    /// the slot is the fence's: idle after each section.
    #[test]
    fn a_sticky_slot_keeps_its_epoch_until_it_parks() {
        let (q, sticky) = sticky();
        let slot = q.register().unwrap();
        drop(slot.enter());
        let kept = slot.state.active.load(Ordering::SeqCst);
        if !sticky {
            assert_eq!(kept, IDLE);
            return;
        }
        assert_eq!(kept, q.epoch.load(Ordering::SeqCst));
        assert!(!slot.state.busy.load(Ordering::SeqCst));
        let section = slot.enter();
        assert!(slot.state.busy.load(Ordering::SeqCst));
        drop(section);
        slot.park();
        assert_eq!(slot.state.active.load(Ordering::SeqCst), IDLE);
        q.synchronize();
        drop(slot.enter());
        assert_eq!(slot.state.active.load(Ordering::SeqCst), kept + 1);
        assert_eq!(q.stats().waited_for_reader, 0);
        assert_eq!(q.stats().fallbacks, 0);
    }

    /// A sticky reader that neither enters again nor parks (a worker
    /// blocked where nobody parked it) holds a sync only until the safety
    /// net; once parked it costs nothing. Dropping a slot parks it.
    #[test]
    fn an_unparked_sticky_reader_is_let_go_by_the_safety_net() {
        let (q, sticky) = sticky();
        let slot = q.register().unwrap();
        let (tx, rx) = mpsc::channel::<bool>();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let reader = std::thread::Builder::new()
            .name("forgot-to-park".into())
            .spawn(move || {
                drop(slot.enter());
                done_tx.send(()).unwrap();
                // Blocks without parking; then parks when told.
                while let Ok(park) = rx.recv() {
                    if park {
                        slot.park();
                    }
                    done_tx.send(()).unwrap();
                }
            })
            .unwrap();
        done_rx.recv().unwrap();
        let t = Instant::now();
        q.synchronize();
        let took = t.elapsed();
        let expect_fallbacks = u64::from(sticky);
        assert_eq!(q.stats().fallbacks, expect_fallbacks);
        assert_eq!(q.stats().waited_for_reader, expect_fallbacks);
        if sticky {
            assert!(took >= STICKY_GRACE, "let go after {took:?}");
        }
        tx.send(true).unwrap();
        done_rx.recv().unwrap();
        q.synchronize();
        assert_eq!(q.stats().fallbacks, expect_fallbacks);
        assert_eq!(q.stats().waited_for_reader, expect_fallbacks);
        drop(tx);
        reader.join().unwrap();
    }

    /// A sticky section during which a sync began (its first step, the
    /// epoch's advance, done here by hand so that nothing waits yet) parks
    /// the slot at its end: the sync then does not wait for the thread's
    /// next section, although the thread neither enters again nor parks,
    /// and needs no safety net. Without membarrier the slot is the fence's,
    /// idle after any section, and the same holds.
    #[test]
    fn a_sticky_section_end_parks_once_the_epoch_moved() {
        let (q, sticky) = sticky();
        let slot = q.register().unwrap();
        let section = slot.enter();
        q.epoch.fetch_add(1, Ordering::SeqCst);
        drop(section);
        assert_eq!(slot.state.active.load(Ordering::SeqCst), IDLE);
        assert!(!slot.state.busy.load(Ordering::SeqCst));
        q.synchronize();
        assert_eq!(q.stats().waited_for_reader, 0);
        assert_eq!(q.stats().fallbacks, 0);
        // The next section announces the current epoch again.
        drop(slot.enter());
        let now = q.epoch.load(Ordering::SeqCst);
        let word = slot.state.active.load(Ordering::SeqCst);
        assert_eq!(word, if sticky { now } else { IDLE });
    }

    /// The safety net never lets go of a reader inside an access: after
    /// its membarrier the sync still waits for the access to end.
    #[test]
    fn the_safety_net_waits_for_an_open_access() {
        let (q, sticky) = sticky();
        let slot = q.register().unwrap();
        let section = slot.enter();
        let ended = Arc::new(AtomicBool::new(false));
        let (q2, ended2) = (Arc::clone(&q), Arc::clone(&ended));
        let waiter = std::thread::spawn(move || {
            q2.synchronize();
            ended2.load(Ordering::SeqCst)
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiter.is_finished(), "sync returned inside an access");
        assert_eq!(q.stats().fallbacks, u64::from(sticky));
        ended.store(true, Ordering::SeqCst);
        drop(section);
        assert!(waiter.join().unwrap());
    }

    /// The protocol end to end: a writer "unmaps" (clears a shared value
    /// that stands for a mapping), synchronizes, then "reuses the page"
    /// (checks that no reader still writes through the old mapping).
    /// Readers copy through the mapping only inside sections, after
    /// checking it is still there. Any write after the sync returned is a
    /// DMA that landed after UNMAP completed.
    #[test]
    fn no_use_after_sync_under_concurrency() {
        const ROUNDS: u64 = 2000;
        let q = Quiescer::new();
        let mapped = Arc::new(AtomicU64::new(0));
        let page = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let slot = q.register().unwrap();
                let (mapped, page, stop) = (mapped.clone(), page.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let _s = slot.enter();
                        // "translate"
                        let m = mapped.load(Ordering::SeqCst);
                        if m != 0 {
                            // "use": DMA into the page of mapping m.
                            std::hint::spin_loop();
                            page.store(m, Ordering::SeqCst);
                        }
                    }
                })
            })
            .collect();
        for round in 1..=ROUNDS {
            mapped.store(round, Ordering::SeqCst); // MAP
            std::thread::yield_now();
            mapped.store(0, Ordering::SeqCst); // UNMAP
            q.synchronize(); // complete the UNMAP
            page.store(u64::MAX, Ordering::SeqCst); // guest reuses the page
            for _ in 0..50 {
                std::hint::spin_loop();
            }
            assert_eq!(
                page.load(Ordering::SeqCst),
                u64::MAX,
                "a DMA through mapping {round} landed after its UNMAP completed"
            );
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            r.join().unwrap();
        }
    }
}

/// Model checking of the protocol with loom: `make loom` (or
/// `RUSTFLAGS="--cfg loom" cargo test -p virtio-iommu --lib quiesce`).
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicBool;

    /// What the device thread does with its slot after its sections.
    #[derive(Clone, Copy)]
    enum Then {
        /// Drops it (a worker that ended; the drop parks and retires it).
        Drop,
        /// Parks it, as a worker does before it blocks, and keeps it.
        Park,
        /// Keeps it as it is: only the sync's safety net can let go.
        Keep,
    }

    /// One device thread runs `sections` translate-and-use sections (the
    /// n-th writes n into the page if the mapping is still there), then
    /// does `then` with its slot, while the main thread unmaps,
    /// synchronizes and reuses the page (writes 99), on the quiescer
    /// `make` builds. The "table" and the "page" are relaxed on purpose:
    /// the quiescer's own fences and slot orderings must carry the
    /// ordering.
    fn race(make: impl Fn() -> Arc<Quiescer> + Send + Sync + 'static, sections: u64, then: Then) {
        loom::model(move || {
            let q = make();
            let slot = q.register().unwrap();
            let mapped = Arc::new(AtomicBool::new(true));
            let page = Arc::new(AtomicU64::new(0));
            let device = {
                let (mapped, page) = (Arc::clone(&mapped), Arc::clone(&page));
                loom::thread::spawn(move || {
                    for n in 1..=sections {
                        let _section = slot.enter();
                        if mapped.load(Ordering::Relaxed) {
                            page.store(n, Ordering::Relaxed);
                        }
                    }
                    match then {
                        Then::Drop => None,
                        Then::Park => {
                            slot.park();
                            Some(slot)
                        }
                        Then::Keep => Some(slot),
                    }
                })
            };
            mapped.store(false, Ordering::Relaxed); // UNMAP
            q.synchronize(); // its completion
            page.store(99, Ordering::Relaxed); // the guest reuses the page
            let _slot = device.join().unwrap();
            assert_eq!(page.load(Ordering::Relaxed), 99, "DMA landed after sync");
        });
    }

    /// [`race`] with the process's barrier, the slot dropped at the end.
    fn model(sections: u64) {
        race(Quiescer::new, sections, Then::Drop);
    }

    /// Every interleaving of one section with an UNMAP, its completion and
    /// the reuse of the page: the device's write never lands after
    /// `synchronize` returned, also when the thread drops its slot first.
    #[test]
    fn no_interleaving_lets_a_dma_land_after_sync() {
        model(1);
    }

    /// Two sections back to back racing one sync: the second may start
    /// before or after the epoch moved (and then is not waited for), and
    /// neither may write after the sync returned.
    #[test]
    fn back_to_back_sections_are_covered() {
        model(2);
    }

    /// [`race`] with the sticky protocol: the epoch may move between any
    /// two sections, so a later one may skip its announcement or make it;
    /// the thread then parks if `park` (as a worker does before it
    /// blocks) and keeps its slot otherwise (a dropped one parks: the net
    /// alone must let the sync go). `fallback` models the safety net: the
    /// sync runs its membarrier (a SeqCst fence) as soon as a slot is
    /// behind, and the reader's busy store is followed by the kernel's
    /// barrier (a fence, as `barrier.rs` models membarrier); without it a
    /// sync can only wait for an announcement or a park.
    fn sticky_model(sections: u64, park: bool, fallback: bool) {
        let then = if park { Then::Park } else { Then::Keep };
        race(move || Quiescer::sticky_model(fallback), sections, then);
    }

    /// A sticky reader enters twice across an epoch change and then parks:
    /// a section that skipped its announcement (same epoch) is covered by
    /// the announcement before it, a section after the change announces.
    #[test]
    fn sticky_sections_across_an_epoch_change_are_covered() {
        sticky_model(2, true, false);
    }

    /// A sticky reader that never parks: the safety net lets the sync go
    /// only once the reader's access is over or begins after the barrier.
    #[test]
    fn the_sticky_safety_net_covers_an_unparked_reader() {
        sticky_model(1, false, true);
    }

    /// Both at once: two sections, a park, and a sync that may use the
    /// net while the reader is between sections.
    #[test]
    fn sticky_park_and_safety_net_together() {
        sticky_model(2, true, true);
    }
}
