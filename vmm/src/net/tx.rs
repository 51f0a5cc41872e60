//! The transmit side of a queue pair: each chain the driver offers is one
//! frame (virtio-net header included), gathered from guest memory and
//! written to the TAP with one `writev`, then returned used.
//!
//! WHY apart from the worker, behind a [`FrameSink`]: everything here is
//! guest input (ring indices, chains, buffers the vIOMMU may refuse), so
//! it is tested and fuzzed without a TAP or a thread. A malformed ring or
//! chain, or a buffer the device may not read, breaks the queue; a frame
//! the TAP refuses (too short, too many pieces, a write error) is dropped
//! and counted, and its chain still returned.

use std::io;

use log::debug;
use virtio_queue::QueueT;
use vm_memory::Permissions;

use super::iov::append_iovecs;
use super::queue::{break_queue, pop_head, signal_used, WorkerQueue};
use super::tap::{Tap, VNET_HDR_LEN};
use crate::dma::{DmaSpace, ThreadDma};
use crate::virtio::chain::{walk_into, Chain, MAX_CHAIN_DESCRIPTORS};
use crate::virtio::VirtioInterrupt;

/// Where transmitted frames go: the TAP, or a recorder in tests.
pub trait FrameSink {
    /// Writes one frame gathered from `iov`, every iovec of which is valid
    /// for reads of its length (guest memory the device may read); its
    /// length.
    fn write_frame_iov(&self, iov: &[libc::iovec]) -> io::Result<usize>;
}

impl FrameSink for Tap {
    fn write_frame_iov(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        self.write_iov(iov)
    }
}

/// What the transmit side keeps between kicks: the walked chain and its
/// iovecs (for their capacity), and counters.
#[derive(Default)]
pub struct TxState {
    chain: Chain,
    iov: Vec<libc::iovec>,
    sent: u64,
    dropped: u64,
}

impl TxState {
    /// Frames handed to the sink.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Frames dropped (too short, too many pieces, refused by the sink).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Gathers the chain's readable buffers into iovecs and writes the
    /// frame. `false` if the chain's memory is refused.
    fn send_chain(&mut self, mem: &DmaSpace, sink: &dyn FrameSink) -> bool {
        self.iov.clear();
        let readable = &self.chain.readable;
        if append_iovecs(mem, readable, u64::MAX, Permissions::Read, &mut self.iov).is_err() {
            return false;
        }
        let total: usize = self.iov.iter().map(|v| v.iov_len).sum();
        if total < VNET_HDR_LEN || self.iov.len() > MAX_CHAIN_DESCRIPTORS {
            self.dropped += 1;
            return true;
        }
        match sink.write_frame_iov(&self.iov) {
            Ok(_) => self.sent += 1,
            Err(e) => {
                self.dropped += 1;
                debug!("virtio-net: TAP write: {e}");
            }
        }
        true
    }
}

/// Sends every chain waiting on the transmit queue `q`, one chain per
/// section of the thread's `dma` handle (translate, send, mark used), then
/// re-enables notifications (looping if chains arrived meanwhile) and
/// interrupts the driver if it asked to be. Ring-index accesses between
/// chains run in sections of their own: the handle lends guest memory
/// only inside one.
pub fn process_tx(
    q: &mut WorkerQueue,
    dma: &mut ThreadDma,
    interrupt: &dyn VirtioInterrupt,
    st: &mut TxState,
    sink: &dyn FrameSink,
) {
    if q.broken {
        return;
    }
    let mut used_any = false;
    loop {
        let disabled = q.queue.disable_notification(&*dma.access());
        if let Err(e) = disabled {
            break_queue(q, interrupt, &format!("ring: {e}"));
            return;
        }
        loop {
            let mem = dma.access();
            let head = match pop_head(&mut q.queue, &mem) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(e) => {
                    break_queue(q, interrupt, &format!("avail ring: {e}"));
                    return;
                }
            };
            let (table, size) = (q.queue.desc_table(), q.queue.size());
            if let Err(e) = walk_into(&*mem, table, size, head, &mut st.chain) {
                break_queue(q, interrupt, &format!("transmit chain {head}: {e}"));
                return;
            }
            if !st.send_chain(&mem, sink) {
                let why = format!("transmit chain {head}: buffer not accessible");
                break_queue(q, interrupt, &why);
                return;
            }
            if let Err(e) = q.queue.add_used(&*mem, head, 0) {
                break_queue(q, interrupt, &format!("used ring: {e}"));
                return;
            }
            used_any = true;
        }
        let enabled = q.queue.enable_notification(&*dma.access());
        match enabled {
            Ok(true) => continue,
            Ok(false) => break,
            Err(e) => {
                break_queue(q, interrupt, &format!("ring: {e}"));
                return;
            }
        }
    }
    if used_any {
        signal_used(q, &dma.access(), interrupt);
    }
}

#[cfg(test)]
#[path = "tx_tests.rs"]
mod tests;
