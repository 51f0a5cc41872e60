//! Emulated device threads: they reach guest memory only through a
//! `ThreadDma` handle per endpoint, translating and then copying inside
//! one access guard (which opens the quiescence section), as virtio-net,
//! virtio-blk and the DMA test device do.

use std::sync::atomic::Ordering;

use vm_memory::{GuestAddress, GuestMemory, Permissions};
use vmm::dma::ThreadDma;
use vmm::width::usize_from_u64;

use super::rng::Rng;
use super::{iova, Kind, Shared, REGION, SLOTS};

/// One device thread serving every guest thread's emulated endpoint
/// (`spaces[guest]`, this thread's handle on it) until the run stops.
pub fn run(shared: &Shared, mut spaces: Vec<ThreadDma>, mut rng: Rng) {
    let stats = shared.kind(Kind::Emulated);
    let mut buf = vec![0u8; usize_from_u64(REGION)];
    let guests = spaces.len() as u64;
    let mut n = 0u64;
    while !shared.stopped() {
        if super::resting(n) && (n / super::PACE_EVERY).is_multiple_of(2) {
            // Every other rest parks first, as the VMM's workers do at
            // their waits; the others rest unparked, so that a sticky
            // sync meets both a parked thread and one only the
            // quiescer's safety net lets go (`quiesce_fallbacks`).
            for dma in &mut spaces {
                dma.park();
            }
        }
        super::pace(&mut n);
        let Some(dma) = spaces.get_mut(usize_from_u64(rng.below(guests))) else {
            continue;
        };
        let addr = iova(rng.below(SLOTS)) + Kind::Emulated.offset();
        // The time a real device spends between translating and copying
        // (building an iovec, entering a syscall): a window for a
        // completion that did not wait for this section.
        let window = rng.below(1000);
        let space = dma.access();
        let slices = space
            .get_slices(
                GuestAddress(addr),
                usize_from_u64(REGION),
                Permissions::Write,
            )
            .and_then(|it| it.collect::<Result<Vec<_>, _>>());
        match slices {
            Ok(slices) => {
                for _ in 0..window {
                    std::hint::spin_loop();
                }
                let ticket = shared.ticket();
                for w in buf.chunks_exact_mut(8) {
                    w.copy_from_slice(&ticket.to_le_bytes());
                }
                let mut pos = 0usize;
                for s in &slices {
                    let len = s.len();
                    if let Some(chunk) = buf.get(pos..pos + len) {
                        s.copy_from(chunk);
                    }
                    pos += len;
                }
                stats.accesses.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                stats.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
        drop(space);
    }
}
