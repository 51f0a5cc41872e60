//! The console's one thread: transmitq chains to the back-end's output,
//! host input into receiveq buffers.
//!
//! WHY `poll` and not an epoll set: the input descriptor is watched only
//! while no input waits for a receive buffer (else a readable tty would
//! wake the thread for ever), and a pty without a client (it polls as hung
//! up) is looked at again only after a pause; both change the set at each
//! turn. Guest memory is touched only inside `ThreadDma` sections, and
//! output is written once the section is closed, so a slow terminal never
//! holds up an UNMAP.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use log::warn;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use virtio_iommu::locks::Unpoison;

use crate::dma::{DmaSpace, ThreadDma};
use crate::virtio::chain::{pop_head, walk, ChainError};
use crate::virtio::{ActiveQueue, VirtioInterrupt};

/// Host input held while the guest has no receive buffer.
const INPUT_MAX: usize = 4096;
/// Guest output taken from one transmit chain (the rest is dropped).
const CHAIN_MAX: u64 = 64 * 1024;
/// The pause before a pty without a client is looked at again.
const NO_CLIENT_WAIT: Duration = Duration::from_millis(100);

/// What the worker is given.
pub struct WorkerParts {
    /// The device's DMA space.
    pub mem: DmaSpace,
    /// Interrupt delivery.
    pub interrupt: Arc<dyn VirtioInterrupt>,
    /// receiveq (index 0), if enabled.
    pub rx: Option<ActiveQueue>,
    /// transmitq (index 1), if enabled.
    pub tx: Option<ActiveQueue>,
    /// Written to stop the worker.
    pub stop: EventFd,
    /// Guest output.
    pub output: Arc<Mutex<Box<dyn Write + Send>>>,
    /// Host input.
    pub input: Option<Arc<File>>,
    /// The input is a pty master.
    pub input_is_pty: bool,
}

/// Why a queue stops until the driver resets the device.
#[derive(Debug, thiserror::Error)]
enum RingError {
    #[error("ring: {0}")]
    Ring(#[from] virtio_queue::Error),
    #[error("chain: {0}")]
    Chain(#[from] ChainError),
    #[error("buffer at {0:#x} not accessible")]
    Buffer(u64),
}

/// Runs the worker until its stop eventfd is written.
pub fn run_worker(mut p: WorkerParts) {
    let mut dma = match ThreadDma::new(p.mem.clone()) {
        Ok(d) => d,
        Err(e) => {
            warn!("virtio-console worker could not start: {e}");
            p.interrupt.set_needs_reset();
            return;
        }
    };
    let mut pending: Vec<u8> = Vec::new();
    let mut broken = false;
    let mut retry_input: Option<Instant> = None;
    let mut input = p.input.clone();
    let mut out = Vec::new();
    // The first turn only looks: buffers may be waiting since before
    // the activation.
    let mut first = true;
    loop {
        let now = Instant::now();
        let watch_input = pending.is_empty() && retry_input.is_none_or(|t| now >= t);
        if watch_input {
            retry_input = None;
        }
        let mut fds = vec![pollfd(p.stop.as_raw_fd())];
        for q in [&p.rx, &p.tx].into_iter().flatten() {
            fds.push(pollfd(q.kick.as_raw_fd()));
        }
        let input_slot = match (&input, watch_input) {
            (Some(f), true) => {
                fds.push(pollfd(f.as_raw_fd()));
                Some(fds.len() - 1)
            }
            _ => None,
        };
        let timeout = match (first, retry_input) {
            (true, _) => 0,
            (false, None) => -1,
            (false, Some(t)) => {
                i32::try_from(t.saturating_duration_since(now).as_millis()).unwrap_or(100) + 1
            }
        };
        first = false;
        let nfds = libc::nfds_t::try_from(fds.len()).unwrap_or(0);
        // Parked while asleep: no UNMAP waits for an idle worker.
        // SAFETY: `fds` is a valid array of `nfds` pollfd for the call.
        let r = dma.parked(|| unsafe { libc::poll(fds.as_mut_ptr(), nfds, timeout) });
        if r < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            warn!("virtio-console: poll: {}", io::Error::last_os_error());
            p.interrupt.set_needs_reset();
            return;
        }
        if fds.first().is_some_and(|f| f.revents != 0) {
            return;
        }
        for q in [&p.rx, &p.tx].into_iter().flatten() {
            let _ = q.kick.read();
        }
        if let (Some(slot), Some(f)) = (input_slot, &input) {
            if fds.get(slot).is_some_and(|f| f.revents != 0) {
                let mut buf = [0u8; 256];
                match (&**f).read(&mut buf) {
                    Ok(n) if n > 0 => pending.extend_from_slice(buf.get(..n).unwrap_or_default()),
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                        ) => {}
                    _ if p.input_is_pty => retry_input = Some(Instant::now() + NO_CLIENT_WAIT),
                    // EOF or error on stdin: no more input.
                    _ => input = None,
                }
            }
        }
        pending.truncate(INPUT_MAX);
        if broken || !dma.bus_master() {
            // No DMA without bus mastering: the transport kicks every
            // queue when the bit is set again.
            continue;
        }
        let served = serve_tx(&mut dma, p.tx.as_mut(), &*p.interrupt, &mut out, &p.output)
            .and_then(|()| serve_rx(&mut dma, p.rx.as_mut(), &*p.interrupt, &mut pending));
        if let Err(e) = served {
            broken = true;
            warn!("virtio-console: {e}; stopped until the driver resets the device");
            p.interrupt.set_needs_reset();
        }
    }
}

fn pollfd(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Sends every transmit chain to `output`, one section per chain.
fn serve_tx(
    dma: &mut ThreadDma,
    tx: Option<&mut ActiveQueue>,
    interrupt: &dyn VirtioInterrupt,
    out: &mut Vec<u8>,
    output: &Mutex<Box<dyn Write + Send>>,
) -> Result<(), RingError> {
    let Some(tx) = tx else { return Ok(()) };
    loop {
        out.clear();
        {
            let g = dma.access();
            let q: &mut Queue = &mut tx.queue;
            let Some(head) = pop_head(q, &*g)? else {
                break;
            };
            let chain = walk(&*g, q.desc_table(), q.size(), head)?;
            let mut room = CHAIN_MAX;
            for b in &chain.readable {
                let n = u64::from(b.len).min(room);
                room -= n;
                let at = out.len();
                out.resize(at + usize::try_from(n).unwrap_or(0), 0);
                let dst = out.get_mut(at..).unwrap_or_default();
                g.read_slice(dst, GuestAddress(b.addr))
                    .map_err(|_| RingError::Buffer(b.addr))?;
            }
            q.add_used(&*g, head, 0)?;
            if q.needs_notification(&*g).unwrap_or(true) {
                interrupt.notify_queue(tx.index);
            }
        }
        let mut w = output.lock().unpoisoned();
        // A back-end that fails (a closed stdout) loses the bytes, as a
        // line with nobody on it does.
        let _ = w.write_all(out).and_then(|()| w.flush());
    }
    Ok(())
}

/// Fills receive buffers with `pending` input while both last.
fn serve_rx(
    dma: &mut ThreadDma,
    rx: Option<&mut ActiveQueue>,
    interrupt: &dyn VirtioInterrupt,
    pending: &mut Vec<u8>,
) -> Result<(), RingError> {
    let Some(rx) = rx else { return Ok(()) };
    let g = dma.access();
    let q: &mut Queue = &mut rx.queue;
    let mut used_any = false;
    while !pending.is_empty() {
        let Some(head) = pop_head(q, &*g)? else {
            break;
        };
        let chain = walk(&*g, q.desc_table(), q.size(), head)?;
        let mut written = 0usize;
        for b in &chain.writable {
            let left = pending.get(written..).unwrap_or_default();
            if left.is_empty() {
                break;
            }
            let n = usize::try_from(b.len).unwrap_or(0).min(left.len());
            let src = left.get(..n).unwrap_or_default();
            g.write_slice(src, GuestAddress(b.addr))
                .map_err(|_| RingError::Buffer(b.addr))?;
            written += n;
        }
        pending.drain(..written.min(pending.len()));
        q.add_used(&*g, head, u32::try_from(written).unwrap_or(0))?;
        used_any = true;
    }
    if used_any && q.needs_notification(&*g).unwrap_or(true) {
        interrupt.notify_queue(rx.index);
    }
    Ok(())
}
