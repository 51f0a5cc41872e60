//! The receive side of a queue pair: the guest buffers the device holds,
//! and how one frame from the TAP reaches them.
//!
//! WHY the device holds buffers between frames: a frame is read from the
//! TAP straight into guest buffers (`readv`, the only copy is the
//! kernel's), so the buffers must be in hand before the read and able to
//! take the largest frame the TAP can produce, since the TAP tells a
//! frame's length only by reading it. Taking the buffers for each frame
//! and handing back the ones it did not fill would walk most chains
//! several times; instead they stay here for the next frames.
//! cloud-hypervisor reads into one chain per frame without mergeable
//! buffers; QEMU reads into its own buffer and copies (twice the bytes
//! moved through a TCG-emulated CPU in the nested runner).
//!
//! When the held buffers are too few for the largest frame (a small ring,
//! or one the driver has not refilled yet), the frame is read into a host
//! buffer first and copied if it fits: every frame the old one-copy path
//! could place is still placed.
//!
//! Ring contents are hostile: a malformed chain, a ring index that jumps,
//! or a buffer the IOMMU refuses is a [`RxError`]; the caller breaks the
//! queue.
//!
//! WHY held chains are bounded by count and descriptors, not only bytes: a
//! driver may post chains of up to 1,024 descriptors that hold one byte
//! each, and re-post heads the device still holds. Counting bytes alone let
//! a guest make the device hold tens of thousands of such chains (about
//! 1 GiB of walked descriptors per queue) and count them past `u16`. Held
//! chains never outnumber the queue size (no honest driver can have more
//! outstanding) nor, past one chain, [`MAX_HELD_DESCRIPTORS`]; a frame the
//! held chains cannot take once that bound is reached is dropped, and the
//! recycled chains keep only a small capacity ([`SPARE_CHAINS`]).

use std::collections::VecDeque;
use std::io;
use std::num::Wrapping;
use std::sync::atomic::{fence, Ordering};

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, Permissions};

use super::iov::{append_iovecs, BufferAccessError};
use super::queue::pop_head;
use super::tap::{Tap, VNET_HDR_LEN};
use crate::dma::DmaSpace;
use crate::virtio::chain::{walk_into, Buffer, Chain, ChainError, MAX_CHAIN_DESCRIPTORS};
use crate::width::usize_from_u64;

/// Largest frame the TAP hands over: a 64 KiB GSO frame plus headers.
pub const MAX_FRAME: usize = 65536 + 256;

/// Largest frame without GSO offloads: the virtio-net header, an Ethernet
/// header with a VLAN tag and a jumbo payload, so that raising the TAP's
/// MTU up to 9216 needs no change here.
pub const MAX_PLAIN_FRAME: usize = VNET_HDR_LEN + 18 + 9216;

/// Offset of `num_buffers` in `virtio_net_hdr_v1`.
const NUM_BUFFERS_OFFSET: u64 = 10;

/// Descriptors the held chains may have before the device stops taking
/// more chains (one more chain may add up to [`MAX_CHAIN_DESCRIPTORS`]).
/// Honest drivers post one or two descriptors per receive chain, so a
/// largest frame is held far below this; it is also what one `readv`
/// takes (`UIO_MAXIOV`).
pub const MAX_HELD_DESCRIPTORS: usize = MAX_CHAIN_DESCRIPTORS;

/// Recycled chains kept for their allocations, and the descriptors each
/// may keep room for: past these, memory goes back to the allocator, so
/// what a hostile ring once made the device hold is not kept for good.
pub const SPARE_CHAINS: usize = 64;
/// See [`SPARE_CHAINS`].
pub const SPARE_PIECES: usize = 64;

/// Where frames come from: the TAP, or a scripted source in tests.
pub trait FrameSource {
    /// Reads one frame into `buf`; its length.
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// Reads one frame scattered over `iov`; its length.
    ///
    /// # Safety
    /// Every iovec must be valid for writes of its length.
    unsafe fn read_frame_iov(&self, iov: &[libc::iovec]) -> io::Result<usize>;
}

impl FrameSource for Tap {
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        Tap::read_frame(self, buf)
    }

    unsafe fn read_frame_iov(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        // SAFETY: forwarded from the caller.
        unsafe { Tap::read_iov(self, iov) }
    }
}

/// What became of one attempt to receive a frame.
pub enum RxStep {
    /// A frame was placed and its buffers marked used.
    Delivered,
    /// The frame was dropped; `true` if a buffer was returned used.
    Dropped(bool),
    /// The TAP has no frame now.
    TapEmpty,
    /// The TAP cannot be read (e.g. EBADFD: a detached queue).
    TapError(io::Error),
    /// A frame waits for buffers; the driver's avail index that was looked
    /// at (every buffer before it is held, none after it was seen).
    NoBuffers(Wrapping<u16>),
    /// The receive queue cannot be used any more.
    Broken(RxError),
}

/// Why receiving broke the receive queue.
#[derive(Debug, thiserror::Error)]
pub enum RxError {
    /// The avail ring cannot be read.
    #[error("avail ring: {0}")]
    AvailRing(#[source] virtio_queue::Error),
    /// The driver's chain is malformed.
    #[error("receive chain {head}: {source}")]
    Chain {
        /// Its head index.
        head: u16,
        /// What is wrong with it.
        source: ChainError,
    },
    /// A receive chain the device cannot write into.
    #[error("receive chain {head} has no writable buffer")]
    NoWritableBuffer {
        /// Its head index.
        head: u16,
    },
    /// The used ring cannot be written.
    #[error("used ring: {0}")]
    UsedRing(#[source] virtio_queue::Error),
    /// A receive buffer cannot be written (the vIOMMU refuses it, or it is
    /// not guest RAM).
    #[error("receive {0}")]
    Buffer(#[from] BufferAccessError),
    /// More chains for one frame than `num_buffers` counts (cannot happen
    /// while held chains are bounded by the queue size; checked anyway).
    #[error("a frame over {chains} receive chains")]
    TooManyChains {
        /// How many chains the frame needed.
        chains: usize,
    },
}

/// What the receive side did so far (logged when the worker stops).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RxCounts {
    /// Frames read straight into guest buffers.
    pub in_place: u64,
    /// Frames read into the host buffer and copied.
    pub copied: u64,
    /// Frames dropped (runts, or too big for a buffer without MRG_RXBUF).
    pub dropped: u64,
    /// Times a frame waited for the driver to add buffers.
    pub waits: u64,
    /// Frames dropped because the held chains reached their bound and
    /// still could not take them (also counted in `dropped`).
    pub over_bound: u64,
}

/// A chain taken from the avail ring and not yet returned.
#[derive(Default)]
struct HeldChain {
    chain: Chain,
    /// Its writable bytes.
    capacity: u64,
    /// Its buffers as host iovecs, when the DMA space is untranslated (the
    /// mapping of guest RAM never changes under it); empty otherwise, and
    /// translated per frame so that an UNMAP is honoured.
    iov: Vec<libc::iovec>,
}

/// The receive buffers the device holds, and a host buffer for frames that
/// must be copied.
pub struct RxBuffers {
    held: VecDeque<HeldChain>,
    /// Writable bytes of all held chains.
    held_bytes: u64,
    /// Descriptors (readable and writable) of all held chains.
    held_descs: usize,
    /// Recycled chains, at most [`SPARE_CHAINS`].
    spare: Vec<HeldChain>,
    iov: Vec<libc::iovec>,
    bounce: Vec<u8>,
    /// Length of a frame read into `bounce` and not yet placed.
    pending: Option<usize>,
    /// Largest frame the TAP can hand over with the negotiated offloads.
    max_frame: usize,
    /// Several chains per frame (VIRTIO_NET_F_MRG_RXBUF).
    mergeable: bool,
    counts: RxCounts,
}

impl RxBuffers {
    /// Buffers for a queue whose driver negotiated mergeable buffers or
    /// not, and whose largest frame is `max_frame` bytes (header included).
    pub fn new(mergeable: bool, max_frame: usize) -> Self {
        let max_frame = max_frame.clamp(VNET_HDR_LEN, MAX_FRAME);
        Self {
            held: VecDeque::new(),
            held_bytes: 0,
            held_descs: 0,
            spare: Vec::new(),
            iov: Vec::new(),
            // Any frame the TAP can hand over, whatever its MTU.
            bounce: vec![0u8; MAX_FRAME],
            pending: None,
            max_frame,
            mergeable,
            counts: RxCounts::default(),
        }
    }

    /// What the receive side did so far.
    pub fn counts(&self) -> RxCounts {
        self.counts
    }

    /// Chains taken from the ring and not yet returned.
    pub fn held_chains(&self) -> usize {
        self.held.len()
    }

    /// Descriptors of the held chains.
    pub fn held_descriptors(&self) -> usize {
        self.held_descs
    }

    /// Host memory this receive side holds (allocated capacity of its
    /// chains, iovecs and buffers), for tests and fuzzing of the bounds.
    pub fn host_bytes(&self) -> usize {
        use std::mem::size_of;
        let chain = |h: &HeldChain| {
            (h.chain.readable.capacity() + h.chain.writable.capacity()) * size_of::<Buffer>()
                + h.iov.capacity() * size_of::<libc::iovec>()
        };
        self.held
            .iter()
            .chain(self.spare.iter())
            .map(chain)
            .sum::<usize>()
            + (self.held.capacity() + self.spare.capacity()) * size_of::<HeldChain>()
            + self.iov.capacity() * size_of::<libc::iovec>()
            + self.bounce.capacity()
    }

    /// Whether the held chains reached their bound: no more are taken.
    fn at_bound(&self, q: &Queue) -> bool {
        self.held.len() >= usize::from(q.size()) || self.held_descs >= MAX_HELD_DESCRIPTORS
    }

    /// Gives a chain no longer held back for reuse, within the spare
    /// bounds.
    fn recycle(&mut self, mut h: HeldChain) {
        if self.spare.len() >= SPARE_CHAINS {
            return;
        }
        h.chain.readable.clear();
        h.chain.writable.clear();
        h.iov.clear();
        h.chain.readable.shrink_to(SPARE_PIECES);
        h.chain.writable.shrink_to(SPARE_PIECES);
        h.iov.shrink_to(SPARE_PIECES);
        self.spare.push(h);
    }

    /// Takes the first held chain off the list.
    fn pop_held(&mut self) -> Option<HeldChain> {
        let h = self.held.pop_front()?;
        self.held_bytes = self.held_bytes.saturating_sub(h.capacity);
        self.held_descs = self
            .held_descs
            .saturating_sub(h.chain.readable.len() + h.chain.writable.len());
        Some(h)
    }

    /// Chains one frame may use.
    fn chains_per_frame(&self) -> usize {
        if self.mergeable {
            usize::MAX
        } else {
            1
        }
    }

    /// Bytes the chains one frame may use can take.
    fn capacity(&self) -> u64 {
        if self.mergeable {
            self.held_bytes
        } else {
            self.held.front().map_or(0, |h| h.capacity)
        }
    }

    /// Forgets every held chain (the queue broke, or the device resets:
    /// the driver gets them back only by resetting).
    pub fn clear(&mut self) {
        while let Some(h) = self.pop_held() {
            self.recycle(h);
        }
        self.held.shrink_to(SPARE_CHAINS);
        self.held_bytes = 0;
        self.held_descs = 0;
        self.pending = None;
    }

    /// Takes chains from the avail ring until one frame's chains can take
    /// `want` bytes, the ring has no more, or the held chains reach their
    /// bound.
    fn fill(&mut self, q: &mut Queue, mem: &DmaSpace, want: u64) -> Result<(), RxError> {
        while self.capacity() < want
            && self.held.len() < self.chains_per_frame()
            && !self.at_bound(q)
        {
            let head = match pop_head(q, mem) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => return Err(RxError::AvailRing(e)),
            };
            let mut h = self.spare.pop().unwrap_or_default();
            if let Err(source) = walk_into(mem, q.desc_table(), q.size(), head, &mut h.chain) {
                self.recycle(h);
                return Err(RxError::Chain { head, source });
            }
            h.capacity = h.chain.writable_len();
            if h.capacity == 0 {
                self.recycle(h);
                return Err(RxError::NoWritableBuffer { head });
            }
            h.iov.clear();
            if !mem.is_translated() {
                append_iovecs(
                    mem,
                    &h.chain.writable,
                    u64::MAX,
                    Permissions::Write,
                    &mut h.iov,
                )?;
            }
            self.held_bytes += h.capacity;
            self.held_descs += h.chain.readable.len() + h.chain.writable.len();
            self.held.push_back(h);
        }
        Ok(())
    }

    /// Host iovecs for the first `want` bytes of the held chains; `false`
    /// if they are more than one `readv` takes (the frame is then copied).
    fn build_iov(&mut self, mem: &DmaSpace, want: u64) -> Result<bool, RxError> {
        self.iov.clear();
        let mut covered = 0u64;
        for h in self.held.iter().take(self.chains_per_frame()) {
            if covered >= want {
                break;
            }
            if mem.is_translated() {
                append_iovecs(
                    mem,
                    &h.chain.writable,
                    want - covered,
                    Permissions::Write,
                    &mut self.iov,
                )?;
            } else {
                self.iov.extend_from_slice(&h.iov);
            }
            covered += h.capacity;
        }
        let limit = usize::try_from(libc::UIO_MAXIOV).unwrap_or(1024);
        Ok(self.iov.len() <= limit)
    }

    /// Returns the chains that hold a `len`-byte frame as used, after
    /// writing their count into the frame's header.
    fn complete(&mut self, q: &mut Queue, mem: &DmaSpace, len: usize) -> Result<(), RxError> {
        let mut left = len as u64;
        let mut n = 0usize;
        for h in self.held.iter() {
            if left == 0 {
                break;
            }
            left = left.saturating_sub(h.capacity);
            n += 1;
        }
        let count = u16::try_from(n).map_err(|_| RxError::TooManyChains { chains: n })?;
        if let Some(first) = self.held.front() {
            write_at(mem, &first.chain, NUM_BUFFERS_OFFSET, &count.to_le_bytes())?;
        }
        let mut left = len as u64;
        for _ in 0..n {
            let Some(h) = self.pop_held() else {
                break;
            };
            let used = left.min(h.capacity);
            left -= used;
            let head = h.chain.head;
            self.recycle(h);
            // `used` <= a chain's capacity, which is a sum of u32 lengths
            // walk_into bounds to fit.
            let used = u32::try_from(used).unwrap_or(u32::MAX);
            q.add_used(mem, head, used).map_err(RxError::UsedRing)?;
        }
        Ok(())
    }

    /// Copies the pending frame into the held chains and returns them used.
    fn place_bounced(&mut self, q: &mut Queue, mem: &DmaSpace, len: usize) -> RxStep {
        let chains = self.chains_per_frame();
        let Some(frame) = self.bounce.get(..len) else {
            return RxStep::Dropped(false);
        };
        let mut rest = frame;
        for h in self.held.iter().take(chains) {
            if rest.is_empty() {
                break;
            }
            let take = usize::try_from(h.capacity).map_or(rest.len(), |c| c.min(rest.len()));
            let (piece, after) = rest.split_at(take);
            if let Err(e) = write_at(mem, &h.chain, 0, piece) {
                return RxStep::Broken(e);
            }
            rest = after;
        }
        match self.complete(q, mem, len) {
            Ok(()) => RxStep::Delivered,
            Err(e) => RxStep::Broken(e),
        }
    }

    /// Receives at most one frame from `tap` into the queue.
    pub fn receive_one(&mut self, q: &mut Queue, mem: &DmaSpace, tap: &dyn FrameSource) -> RxStep {
        let step = self.receive_one_inner(q, mem, tap);
        match step {
            RxStep::Broken(_) => self.clear(),
            RxStep::Dropped(_) => self.counts.dropped += 1,
            RxStep::NoBuffers(_) => self.counts.waits += 1,
            _ => {}
        }
        step
    }

    fn receive_one_inner(
        &mut self,
        q: &mut Queue,
        mem: &DmaSpace,
        tap: &dyn FrameSource,
    ) -> RxStep {
        let max = self.max_frame as u64;
        if self.pending.is_none() {
            if let Err(e) = self.fill(q, mem, max) {
                return RxStep::Broken(e);
            }
            if self.capacity() >= max {
                match self.build_iov(mem, max) {
                    Ok(true) => return self.read_in_place(q, mem, tap),
                    // Too many pieces for one `readv`: copied instead.
                    Ok(false) => {}
                    Err(e) => return RxStep::Broken(e),
                }
            }
            match tap.read_frame(&mut self.bounce) {
                Ok(n) => self.pending = Some(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return RxStep::TapEmpty,
                Err(e) => return RxStep::TapError(e),
            }
        }
        let Some(len) = self.pending else {
            return RxStep::TapEmpty;
        };
        if len < VNET_HDR_LEN {
            self.pending = None;
            return RxStep::Dropped(false);
        }
        if let Err(e) = self.fill(q, mem, len as u64) {
            return RxStep::Broken(e);
        }
        if self.capacity() >= len as u64 {
            self.pending = None;
            self.counts.copied += 1;
            return self.place_bounced(q, mem, len);
        }
        if !self.mergeable {
            if let Some(h) = self.pop_held() {
                // Too big for the one buffer the driver gave: drop the
                // frame and hand the buffer back empty.
                self.pending = None;
                let head = h.chain.head;
                self.recycle(h);
                return match q.add_used(mem, head, 0) {
                    Ok(()) => RxStep::Dropped(true),
                    Err(e) => RxStep::Broken(RxError::UsedRing(e)),
                };
            }
        }
        if self.at_bound(q) {
            // The device holds all it may and the frame does not fit:
            // waiting would wait for good (the driver cannot add what the
            // device will not take). The chains stay for smaller frames.
            self.pending = None;
            self.counts.over_bound += 1;
            return RxStep::Dropped(false);
        }
        RxStep::NoBuffers(Wrapping(q.next_avail()))
    }

    /// Reads a frame straight into the held chains (they can take the
    /// largest one) through the iovecs `build_iov` just built.
    fn read_in_place(&mut self, q: &mut Queue, mem: &DmaSpace, tap: &dyn FrameSource) -> RxStep {
        if !mem.bus_master() {
            // Cached iovecs bypass the bus-master check of every access.
            return RxStep::TapEmpty;
        }
        // SAFETY: every iovec was built from a VolatileSlice of the
        // device's DMA space (guest RAM mappings that live as long as
        // `mem`), for writes, within the buffer's bounds.
        match unsafe { tap.read_frame_iov(&self.iov) } {
            Ok(n) if n < VNET_HDR_LEN => RxStep::Dropped(false),
            Ok(n) => match self.complete(q, mem, n) {
                Ok(()) => {
                    self.counts.in_place += 1;
                    RxStep::Delivered
                }
                Err(e) => RxStep::Broken(e),
            },
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => RxStep::TapEmpty,
            // The frame did not fit (a TAP MTU above what `max_frame`
            // allows): the TAP dropped it; the queue goes on. Stopping
            // TAP polling here would wait for a kick a full ring never
            // sends.
            Err(e) if e.raw_os_error() == Some(libc::EFAULT) => RxStep::Dropped(false),
            Err(e) => RxStep::TapError(e),
        }
    }
}

/// Writes `bytes` at offset `off` of the chain's writable buffers taken as
/// one (the header may be split over descriptors).
fn write_at(mem: &DmaSpace, chain: &Chain, off: u64, bytes: &[u8]) -> Result<(), RxError> {
    let mut pos = 0u64;
    let mut rest = bytes;
    for b in &chain.writable {
        let end = pos + u64::from(b.len);
        if rest.is_empty() {
            break;
        }
        let at = off + (bytes.len() - rest.len()) as u64;
        if at < end {
            let inner = at - pos;
            let n = usize_from_u64(end - at).min(rest.len());
            let addr = b.addr.wrapping_add(inner);
            let (piece, after) = rest.split_at(n);
            mem.write_slice(piece, GuestAddress(addr))
                .map_err(|source| BufferAccessError { addr, source })?;
            rest = after;
        }
        pos = end;
    }
    Ok(())
}

/// Why the receive queue's kick could not be armed (the queue stops).
#[derive(Debug, thiserror::Error)]
pub enum ArmKickError {
    /// The rings cannot be read or notifications enabled.
    #[error(transparent)]
    Ring(#[from] virtio_queue::Error),
    /// `avail_event` cannot be written.
    #[error(transparent)]
    Memory(#[from] vm_memory::GuestMemoryError),
    /// The used ring ends past the top of the address space.
    #[error("used ring address overflows")]
    UsedRingOverflow,
}

/// After a receive ran out of buffers: asks the driver to kick on the next
/// buffer it adds, and says whether buffers arrived after `looked_at`, the
/// avail index [`RxStep::NoBuffers`] reported.
///
/// WHY not `Queue::enable_notification`: with EVENT_IDX it sets
/// `avail_event` to `next_avail`, and buffers published before the
/// driver's current index would not make it kick; here `avail_event` is
/// the driver's current index, so its next buffer triggers the kick.
///
/// WHY compare with `looked_at` and not with the index read here: buffers
/// the driver published between the last look and this function were
/// never offered to the pending frame, and the driver did not kick for
/// them (its `avail_event` was older). Reporting "nothing new" then would
/// stop TAP polling while a full ring waits for a kick that never comes:
/// receive stalls for good.
pub fn arm_rx_kick(
    q: &mut Queue,
    mem: &DmaSpace,
    looked_at: Wrapping<u16>,
) -> Result<bool, ArmKickError> {
    let seen = q.avail_idx(mem, Ordering::Acquire)?;
    if q.event_idx_enabled() {
        // used ring: flags, idx, ring[size], then avail_event.
        let at = q
            .used_ring()
            .checked_add(4 + 8 * u64::from(q.size()))
            .ok_or(ArmKickError::UsedRingOverflow)?;
        mem.store(u16::to_le(seen.0), GuestAddress(at), Ordering::Release)?;
    } else {
        q.enable_notification(mem)?;
    }
    fence(Ordering::SeqCst);
    let now = q.avail_idx(mem, Ordering::Acquire)?;
    Ok(now != looked_at)
}

#[cfg(test)]
#[path = "rx_tests.rs"]
mod tests;
