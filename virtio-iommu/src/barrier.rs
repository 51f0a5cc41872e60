//! The two halves of the quiescer's store-buffer barrier, asymmetric when
//! the kernel allows it.
//!
//! WHY: the quiescence protocol (`quiesce.rs`) is a store-buffer pattern.
//! A device thread publishes its slot and then reads the table; the
//! invalidating thread has written the table and then reads the slots. One
//! full barrier on each side makes at least one of them see the other. A
//! device thread enters a section for every DMA access, an invalidation
//! happens once per kick, so the cost belongs on the invalidating side.
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` runs a full barrier on
//! every CPU that is running a thread of this process at the time of the
//! call (and a CPU that is not has gone through a context switch, itself a
//! full barrier, since it last ran one). So the device thread only needs
//! to keep the compiler from moving its table reads above its slot store:
//! wherever the kernel's barrier falls in its instruction stream, either
//! the slot store is before it (and drained, so the invalidator's slot
//! reads see it) or the table reads are after it (and so after the
//! invalidator's table writes, which precede its `membarrier` call). This
//! is the asymmetric fence of Linux's and liburcu's memb flavour.
//!
//! What it costs, and who pays: the kernel runs the barrier by sending an
//! IPI to every CPU that is running a thread of this process, vCPU threads
//! in guest mode included, and each of those takes an exit to handle it
//! (about 130-770 ns for the call itself in this nested VM, more with many
//! busy vCPUs). That is paid per sync, i.e. per kick that completes UNMAPs,
//! not per DMA access: a good trade with batched invalidation, a worse one
//! with strict invalidation of one page per kick on a host with many
//! vCPUs, where the symmetric fence is cheaper overall. `make bench-host`
//! shows both sides of the trade (consumers `quiesce-fence` and `quiesce-mb`):
//! on this 2-core nested machine one translation inside a section costs
//! about 10% more than none with membarrier, but a MAP+UNMAP pair with
//! two threads kicking costs about 18x more than with the fence, since
//! every sync then interrupts the other CPU. Neither is the default.
//!
//! A third pair avoids both costs: the sticky kind (`BarrierKind::Sticky`,
//! the default, see `quiesce.rs`). A device thread keeps the epoch it last
//! announced between sections and pays the full fence only when the epoch
//! moved since (once per sync, not per DMA access); the invalidator pays
//! a full fence of its own and no IPI, except as a safety net for a
//! thread that neither enters again nor parks ([`expedite`]). It needs
//! membarrier for that net: where the kernel has none, a sticky slot that
//! is never parked could hold an UNMAP for as long as its thread sleeps,
//! so the process falls back to the fence ([`usable`]), whose readers go
//! idle at every exit and never hold a sync.
//!
//! The choice is made once per process ([`choose`]), from the VMM's
//! `--quiescer-barrier` ([`prefer`]; sticky unless asked), and a
//! quiescer may be given a kind of its own ([`usable`], for benchmarks
//! and tests). The command must be
//! registered (`MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED`) before it is
//! used, by a thread whose seccomp filter allows that, so the VMM calls
//! [`choose`] before it starts any filtered thread. A kernel or sandbox
//! without it (ENOSYS, EPERM, EINVAL) gets a full fence on both sides, the
//! symmetric protocol. Which one is in use is logged once.
//!
//! Under `--cfg loom` there are no system calls: both halves are SeqCst
//! fences. That is what membarrier amounts to for the protocol: at some
//! point of the device thread's program, between two of its instructions,
//! the kernel's barrier runs, and the invalidator's call returns only after
//! it. Modelling that point as a SeqCst fence placed where the reader's
//! compiler fence is (the only place the reader's order matters: between
//! its slot store and its table reads) is the strongest position for the
//! reader and the weakest the real barrier can take: a real barrier
//! elsewhere orders the reader's store before, or its loads after, the
//! invalidator's call all the more. So the loom models check the protocol
//! the asymmetric barrier gives, with loom's fence standing in for it.

#[cfg(loom)]
use loom::sync::atomic::{fence, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{compiler_fence, fence, AtomicU8, Ordering};

/// Which barrier pair the process uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarrierKind {
    /// Readers: a compiler fence; invalidators: `membarrier`.
    Membarrier,
    /// Readers and invalidators: a full fence each (no usable membarrier).
    Fence,
    /// Readers: a full fence only when the epoch moved since their last
    /// section; invalidators: a full fence, and `membarrier` only for a
    /// reader that has not moved on after a bounded wait (`quiesce.rs`).
    Sticky,
}

/// `membarrier` commands (`include/uapi/linux/membarrier.h`).
#[cfg(not(loom))]
const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
#[cfg(not(loom))]
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
#[cfg(not(loom))]
const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

/// One `membarrier` call; the raw return value or the OS error.
#[cfg(not(loom))]
fn membarrier(cmd: libc::c_int) -> std::io::Result<libc::c_long> {
    // SAFETY: membarrier takes two integers and a CPU id (unused without
    // MEMBARRIER_CMD_FLAG_CPU) and touches no memory of ours.
    let r = unsafe {
        libc::syscall(
            libc::SYS_membarrier,
            cmd,
            0 as libc::c_uint,
            0 as libc::c_int,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The kind the process asked for ([`prefer`]), as [`kind_code`] spells it.
#[cfg(not(loom))]
static PREFERRED: AtomicU8 = AtomicU8::new(kind_code(BarrierKind::Sticky));

#[cfg(not(loom))]
const fn kind_code(kind: BarrierKind) -> u8 {
    match kind {
        BarrierKind::Membarrier => 0,
        BarrierKind::Fence => 1,
        BarrierKind::Sticky => 2,
    }
}

/// Sets the process's preference before its first [`choose`]: the VMM's
/// `--quiescer-barrier`. The default is sticky: no fence per DMA access
/// and no IPI per sync while device threads park before they block.
/// The fence keeps a fence per access; `membarrier` takes it off every
/// access but interrupts every CPU running a VMM thread at every sync.
#[cfg(not(loom))]
pub fn prefer(kind: BarrierKind) {
    PREFERRED.store(kind_code(kind), Ordering::Relaxed);
}

/// Registers the expedited private command (once per process) and says
/// whether it can be used; a thread whose seccomp filter allows the
/// registration must make the first call (the VMM's main thread, before
/// any filter).
#[cfg(not(loom))]
pub fn membarrier_registered() -> bool {
    use std::sync::OnceLock;
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    *REGISTERED.get_or_init(|| {
        let registered = membarrier(MEMBARRIER_CMD_QUERY).and_then(|mask| {
            if mask & libc::c_long::from(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0 {
                return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
            }
            membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED)
        });
        match registered {
            Ok(_) => true,
            Err(e) => {
                log::info!("vIOMMU quiescer: membarrier unavailable ({e})");
                false
            }
        }
    })
}

/// Decides the process's barrier (once; later calls return the same): the
/// asymmetric one if it was preferred and the kernel registers the
/// expedited private command, the symmetric fence otherwise.
#[cfg(not(loom))]
pub fn choose() -> BarrierKind {
    use std::sync::OnceLock;
    static CHOSEN: OnceLock<BarrierKind> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let preferred = match PREFERRED.load(Ordering::Relaxed) {
            0 => BarrierKind::Membarrier,
            1 => BarrierKind::Fence,
            _ => BarrierKind::Sticky,
        };
        let kind = usable(preferred);
        match kind {
            BarrierKind::Membarrier => {
                log::info!("vIOMMU quiescer: asymmetric barrier (membarrier, private expedited)")
            }
            BarrierKind::Fence => log::info!("vIOMMU quiescer: a full fence on each side"),
            BarrierKind::Sticky => log::info!(
                "vIOMMU quiescer: sticky epochs (a fence per epoch change, membarrier as safety net)"
            ),
        }
        kind
    })
}

/// `kind` if this process can use it, else the fence (an unregistered
/// membarrier would fail at the first sync; sticky without its membarrier
/// safety net would let one unparked thread hold every UNMAP, see the
/// module doc).
#[cfg(not(loom))]
pub fn usable(kind: BarrierKind) -> BarrierKind {
    match kind {
        BarrierKind::Membarrier | BarrierKind::Sticky if membarrier_registered() => kind,
        _ => BarrierKind::Fence,
    }
}

/// Under loom: no system call; see the module doc.
#[cfg(loom)]
pub fn choose() -> BarrierKind {
    BarrierKind::Membarrier
}

/// Under loom both kinds are the same pair of fences.
#[cfg(loom)]
pub fn usable(kind: BarrierKind) -> BarrierKind {
    kind
}

impl BarrierKind {
    /// The device thread's half, between its slot store and its table
    /// reads.
    #[inline(always)]
    pub(crate) fn light(self) {
        #[cfg(not(loom))]
        match self {
            // The kernel's barrier stands in for the hardware one; only
            // the compiler must keep the order of the program.
            BarrierKind::Membarrier => compiler_fence(Ordering::SeqCst),
            // Sticky readers call it only when they announce a new epoch.
            BarrierKind::Fence | BarrierKind::Sticky => fence(Ordering::SeqCst),
        }
        #[cfg(loom)]
        {
            let _ = self;
            fence(Ordering::SeqCst);
        }
    }

    /// The invalidating thread's half, between its table writes (and its
    /// epoch advance) and its slot reads.
    pub(crate) fn heavy(self) {
        #[cfg(not(loom))]
        match self {
            BarrierKind::Membarrier => {
                // Only an unregistered process or an invalid command fails,
                // and both were ruled out when the kind was chosen. If the
                // call fails anyway, device threads are running without
                // their barrier and no UNMAP can be proven complete:
                // nothing is safe but to stop.
                expedite();
            }
            BarrierKind::Fence | BarrierKind::Sticky => fence(Ordering::SeqCst),
        }
        #[cfg(loom)]
        {
            let _ = self;
            fence(Ordering::SeqCst);
        }
    }
}

/// A full barrier on every CPU running a thread of this process
/// (`membarrier`, private expedited): the invalidator's half of the
/// asymmetric pair, and the sticky kind's safety net. Call it only where
/// the kind was found usable (registered).
#[cfg(not(loom))]
pub(crate) fn expedite() {
    // Only an unregistered process or an invalid command fails, and both
    // were ruled out when the kind was chosen. If the call fails anyway,
    // device threads are running without their barrier and no UNMAP can be
    // proven complete: nothing is safe but to stop.
    if let Err(e) = membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) {
        log::error!("vIOMMU quiescer: membarrier failed ({e}); cannot complete UNMAP");
        eprintln!(
            "dmavisor: error: membarrier failed ({e}): DMA quiescence cannot be proven, exiting"
        );
        std::process::exit(1);
    }
    // The syscall is a compiler barrier only as far as the compiler knows
    // it touches memory; make it explicit.
    compiler_fence(Ordering::SeqCst);
}

/// Under loom: the kernel's barrier as a SeqCst fence (module doc).
#[cfg(loom)]
pub(crate) fn expedite() {
    fence(Ordering::SeqCst);
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// The choice is stable, and when membarrier is chosen the command
    /// really works in this process (a failure would exit the test binary).
    #[test]
    fn the_choice_is_made_once_and_its_heavy_half_runs() {
        let k = choose();
        assert_eq!(k, choose());
        if k == BarrierKind::Membarrier {
            assert!(membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED).is_ok());
        }
        k.heavy();
        k.light();
    }

    /// A quiescer asking for membarrier gets it only where the process
    /// could register it; the fence is always usable; both halves run.
    #[test]
    fn a_kind_is_used_only_where_it_works() {
        assert_eq!(usable(BarrierKind::Fence), BarrierKind::Fence);
        let mb = usable(BarrierKind::Membarrier);
        assert_eq!(mb == BarrierKind::Membarrier, membarrier_registered());
        mb.heavy();
        mb.light();
        // Sticky needs membarrier for its safety net: the fence otherwise.
        let sticky = usable(BarrierKind::Sticky);
        assert_eq!(sticky == BarrierKind::Sticky, membarrier_registered());
        sticky.heavy();
        sticky.light();
    }
}
