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
//! vCPUs, where the symmetric fence may be cheaper overall. No switch
//! exists yet to choose it by hand.
//!
//! The choice is made once per process ([`choose`]): the command must be
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
use std::sync::atomic::{compiler_fence, fence, Ordering};

/// Which barrier pair the process uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BarrierKind {
    /// Readers: a compiler fence; invalidators: `membarrier`.
    Membarrier,
    /// Readers and invalidators: a full fence each (no usable membarrier).
    Fence,
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

/// Decides the process's barrier (once; later calls return the same): the
/// asymmetric one if the kernel supports and registers the expedited
/// private command, the symmetric fence otherwise.
#[cfg(not(loom))]
pub fn choose() -> BarrierKind {
    use std::sync::OnceLock;
    static CHOSEN: OnceLock<BarrierKind> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let registered = membarrier(MEMBARRIER_CMD_QUERY).and_then(|mask| {
            if mask & libc::c_long::from(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0 {
                return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
            }
            membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED)
        });
        match registered {
            Ok(_) => {
                log::info!("vIOMMU quiescer: asymmetric barrier (membarrier, private expedited)");
                BarrierKind::Membarrier
            }
            Err(e) => {
                log::info!(
                    "vIOMMU quiescer: membarrier unavailable ({e}); a full fence on each side"
                );
                BarrierKind::Fence
            }
        }
    })
}

/// Under loom: no system call; see the module doc.
#[cfg(loom)]
pub fn choose() -> BarrierKind {
    BarrierKind::Membarrier
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
            BarrierKind::Fence => fence(Ordering::SeqCst),
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
                if let Err(e) = membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) {
                    log::error!("vIOMMU quiescer: membarrier failed ({e}); cannot complete UNMAP");
                    eprintln!(
                        "dmavisor: error: membarrier failed ({e}): DMA quiescence cannot be \
                         proven, exiting"
                    );
                    std::process::exit(1);
                }
                // The syscall is a compiler barrier only as far as the
                // compiler knows it touches memory; make it explicit.
                compiler_fence(Ordering::SeqCst);
            }
            BarrierKind::Fence => fence(Ordering::SeqCst),
        }
        #[cfg(loom)]
        {
            let _ = self;
            fence(Ordering::SeqCst);
        }
    }
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
}
