//! The world of the native DMA-protection stress test
//! (`dma_protection_stress.rs`): one vIOMMU, guest RAM, the three kinds of
//! DMA consumer behind it, and the evidence a late access leaves.
//!
//! WHY content checks: the guarantee is about accesses that *land*. Each
//! guest page a consumer can reach is split into one region per consumer
//! kind; a consumer writes its region full of a ticket drawn from one
//! global counter right before the write. When a guest thread sees an
//! UNMAP (or DETACH) complete it draws a ticket of its own, checks that
//! no region holds a later ticket (a write issued after the completion)
//! and fills the regions with [`POISON`] (the guest reusing the page);
//! before it maps the page again it checks the poison is intact (a write
//! that landed after the reuse). Neither check can fire for a write that
//! landed before the completion, whatever the timing, so a correct vIOMMU
//! must show zero violations however long the run.

pub mod emulated;
pub mod guest;
pub mod rig;
pub mod rng;
pub mod vfio;
pub mod vhost;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};
use vmm::memory::GuestMemoryMmap;
use vmm::width::usize_from_u64;

/// Guest page size.
pub const PAGE: u64 = 4096;
/// Bytes of a page one consumer kind writes.
pub const REGION: u64 = 1024;
/// What a reused page holds; tickets start at 1.
pub const POISON: u64 = 0;
/// Slots (one IOVA page, one guest page) per guest thread.
pub const SLOTS: u64 = 16;
/// IOVA of slot 0 in every domain.
pub const IOVA_BASE: u64 = 0x10_0000;
/// Guest-physical address of guest thread 0's slot 0.
pub const GPA_BASE: u64 = 0x20_0000;
/// Guest RAM of the test.
pub const RAM: u64 = 64 << 20;

/// The three kinds of DMA consumer, each with a region of every page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Emulated device threads translating through `DmaSpace` in sections.
    Emulated = 0,
    /// A vhost-user back-end with its own IOTLB over a real socket.
    VhostUser = 1,
    /// An assigned function behind a (recording) VFIO container.
    Vfio = 2,
}

/// Every kind, in region order.
pub const KINDS: [Kind; 3] = [Kind::Emulated, Kind::VhostUser, Kind::Vfio];

impl Kind {
    /// Offset of this kind's region in a page.
    pub fn offset(self) -> u64 {
        self as u64 * REGION
    }

    /// Its name in the JSON report.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Emulated => "emulated",
            Kind::VhostUser => "vhost_user",
            Kind::Vfio => "vfio",
        }
    }

    /// The endpoint (requester id) of guest thread `guest`'s consumer of
    /// this kind.
    pub fn endpoint(self, guest: usize) -> u32 {
        0x100 + 4 * u32::try_from(guest).unwrap() + self as u32
    }
}

/// IOVA of `slot` (the same in every domain).
pub fn iova(slot: u64) -> u64 {
    IOVA_BASE + slot * PAGE
}

/// Guest-physical page of guest thread `guest`'s `slot`.
pub fn gpa(guest: usize, slot: u64) -> u64 {
    GPA_BASE + (guest as u64 * SLOTS + slot) * PAGE
}

/// The domain of guest thread `guest`.
pub fn domain(guest: usize) -> u32 {
    1 + u32::try_from(guest).unwrap()
}

/// Device-side threads rest this long after every [`PACE_EVERY`]
/// accesses: with more threads than cores, a device thread that never
/// sleeps is often descheduled inside a section, and every UNMAP then
/// waits a scheduler tick for it; resting keeps the guest threads'
/// request rate up (the race windows stay: accesses run back to back).
pub const PACE: std::time::Duration = std::time::Duration::from_micros(50);
/// See [`PACE`].
pub const PACE_EVERY: u64 = 16;

/// Whether the [`pace`] call that follows, with count `n` before it,
/// rests.
pub fn resting(n: u64) -> bool {
    (n + 1).is_multiple_of(PACE_EVERY)
}

/// Rests after every [`PACE_EVERY`]-th call (`n` counts the calls).
pub fn pace(n: &mut u64) {
    *n += 1;
    if n.is_multiple_of(PACE_EVERY) {
        std::thread::sleep(PACE);
    }
}

/// Puts the calling thread at the lowest scheduling priority (nice 19).
///
/// WHY: a thread the scheduler may take the CPU from at any instruction
/// is what a loaded host gives every VMM thread, and nothing in the
/// vIOMMU may rely on a thread not being preempted between two steps. On
/// a quiet two-core machine the miss thread almost never is; at nice 19
/// every wake-up of another thread preempts it, so its translate-then-
/// send gaps take every length.
pub fn lowest_priority() {
    // SAFETY: gettid has no preconditions.
    let tid = libc::id_t::try_from(unsafe { libc::gettid() }).expect("thread ids are positive");
    // SAFETY: setpriority only changes the nice value of this thread
    // (Linux: PRIO_PROCESS with a thread id).
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, 19) };
    assert_eq!(rc, 0, "setpriority: {}", std::io::Error::last_os_error());
}

/// Guest-physical address of host address `uaddr` in `shared`'s RAM.
/// The consumers that get host addresses (a vhost-user back-end, a VFIO
/// container) share the test's address space; they write through the
/// host address they were given by way of this reverse lookup.
pub fn gpa_of(shared: &Shared, uaddr: u64) -> Option<u64> {
    shared.mem.iter().find_map(|r| {
        let base = shared.mem.get_host_address(r.start_addr()).ok()? as u64;
        (uaddr >= base && uaddr - base < r.len()).then(|| r.start_addr().0 + (uaddr - base))
    })
}

/// Counters of one consumer kind.
#[derive(Debug, Default)]
pub struct KindStats {
    /// Writes that reached guest memory.
    pub accesses: AtomicU64,
    /// Accesses refused (unmapped, detached, not cached and refused).
    pub refused: AtomicU64,
    /// Late accesses found by the guest threads.
    pub violations: AtomicU64,
}

/// What every thread shares.
pub struct Shared {
    /// Guest RAM.
    pub mem: GuestMemoryMmap,
    /// The global ticket counter (see the module doc).
    tickets: AtomicU64,
    /// Per consumer kind, in [`KINDS`] order.
    pub kinds: [KindStats; 3],
    /// Requests the guest threads sent, and of those UNMAPs and DETACHes.
    pub requests: AtomicU64,
    /// UNMAP requests completed.
    pub unmaps: AtomicU64,
    /// DETACH requests completed.
    pub detaches: AtomicU64,
    /// Of the violations, those found by the checks after a DETACH (the
    /// rest by those after an UNMAP; both kinds count in [`KindStats`]).
    pub detach_violations: AtomicU64,
    /// Requests answered with another status than OK (a harness bug).
    pub bad_status: AtomicU64,
    /// Per guest thread: the IOVA it is about to unmap, plus one (0: none).
    /// Its vhost-user back-end then misses on exactly that IOVA: a miss
    /// racing the UNMAP of the page it asks for is the interleaving the
    /// IOTLB's send order exists for, and random misses rarely hit it.
    pub unmap_hints: Vec<AtomicU64>,
    /// Set to end the run.
    pub stop: AtomicBool,
}

impl Shared {
    /// A world over `mem` for `guests` guest threads.
    pub fn new(mem: GuestMemoryMmap, guests: usize) -> Self {
        Self {
            mem,
            tickets: AtomicU64::new(1),
            kinds: Default::default(),
            requests: AtomicU64::new(0),
            unmaps: AtomicU64::new(0),
            detaches: AtomicU64::new(0),
            bad_status: AtomicU64::new(0),
            detach_violations: AtomicU64::new(0),
            unmap_hints: (0..guests).map(|_| AtomicU64::new(0)).collect(),
            stop: Default::default(),
        }
    }

    /// A fresh ticket. SeqCst: tickets order completions and writes.
    pub fn ticket(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::SeqCst)
    }

    /// The counters of `kind`.
    pub fn kind(&self, kind: Kind) -> &KindStats {
        &self.kinds[kind as usize]
    }

    /// Violations of every kind so far.
    pub fn violations(&self) -> u64 {
        self.kinds
            .iter()
            .map(|k| k.violations.load(Ordering::Relaxed))
            .sum()
    }

    /// Whether the run is over.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Records a violation of `kind`, with what was found.
    pub fn violation(&self, kind: Kind, what: std::fmt::Arguments<'_>) {
        let before = self.kind(kind).violations.fetch_add(1, Ordering::Relaxed);
        if before < 5 {
            eprintln!("VIOLATION ({}): {what}", kind.name());
        }
    }

    /// The words of `kind`'s region of the page at `page_gpa`.
    pub fn region_words(&self, page_gpa: u64, kind: Kind) -> Vec<u64> {
        let mut buf = vec![0u8; usize_from_u64(REGION)];
        if let Err(e) = self
            .mem
            .read_slice(&mut buf, GuestAddress(page_gpa + kind.offset()))
        {
            panic!("reading guest page {page_gpa:#x}: {e}");
        }
        buf.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect()
    }

    /// Fills `kind`'s region of the page at `page_gpa` with [`POISON`].
    pub fn poison(&self, page_gpa: u64, kind: Kind) {
        let buf = vec![0u8; usize_from_u64(REGION)];
        if let Err(e) = self
            .mem
            .write_slice(&buf, GuestAddress(page_gpa + kind.offset()))
        {
            panic!("poisoning guest page {page_gpa:#x}: {e}");
        }
    }

    /// After a completion whose ticket is `done`: a write issued later
    /// shows a larger ticket. Counts a violation if it does.
    pub fn check_no_later_write(&self, page_gpa: u64, kind: Kind, done: u64, why: &str) {
        if let Some(t) = self
            .region_words(page_gpa, kind)
            .into_iter()
            .find(|&w| w > done)
        {
            self.violation(
                kind,
                format_args!(
                    "page {page_gpa:#x}: write with ticket {t} after {why} (ticket {done})"
                ),
            );
        }
    }

    /// Before the page is handed out again: its poison must be intact.
    pub fn check_poison(&self, page_gpa: u64, kind: Kind, why: &str) {
        if let Some(t) = self
            .region_words(page_gpa, kind)
            .into_iter()
            .find(|&w| w != POISON)
        {
            self.violation(
                kind,
                format_args!("page {page_gpa:#x}: write with ticket {t} landed after {why}"),
            );
        }
    }
}
