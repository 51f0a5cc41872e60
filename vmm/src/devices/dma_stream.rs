//! The streaming mode of the DMA test device: one thread that repeats a
//! transfer between a copy of the device buffer and guest memory until it
//! is told to stop or a pass fails.
//!
//! WHY a thread of its own: a single transfer runs inside the vCPU's MMIO
//! write, so the guest can never act while it is in flight. A real NIC or
//! disk keeps writing while the driver works; the race test needs exactly
//! that (unmap a buffer while DMA into it is in flight), so the stream
//! runs beside the vCPUs, with its own quiescence slot.
//!
//! Each pass translates and copies inside one read section of the vIOMMU's
//! quiescer, so an UNMAP that completes can have no pass in flight that
//! still uses the old translation. Between jobs the thread blocks on its
//! channel outside any section, so an idle stream never delays an UNMAP.
//!
//! What a guest can take: one thread per device, busy while a stream runs
//! (as a real device streaming DMA keeps its engine busy), with one copy
//! of at most the device buffer (4 KiB).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

use virtio_iommu::locks::Unpoison;

use super::dma_copy::{copy_guest, DmaError};
use crate::dma::{DmaSpace, ThreadDma};
use crate::sandbox::{self, ThreadKind};

/// One stream: what to copy where, pass after pass.
pub struct StreamJob {
    /// Guest side (an I/O virtual address).
    pub iova: u64,
    /// The device-side bytes: written to the guest on every pass (`to_ram`)
    /// or overwritten by every pass's read.
    pub data: Vec<u8>,
    /// Device -> guest memory.
    pub to_ram: bool,
}

/// How a stream ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamOutcome {
    /// `None` when stopped by the guest, else why the last pass failed.
    pub error: DmaError,
    /// Bytes moved by its passes.
    pub bytes: u64,
    /// The stream's guest address (for the fault register).
    pub iova: u64,
}

/// State shared by the device (vCPU side) and the stream thread.
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    passes: AtomicU64,
    /// How the current stream ended; `None` from its start until then.
    outcome: Mutex<Option<StreamOutcome>>,
}

impl Shared {
    fn outcome(&self) -> std::sync::MutexGuard<'_, Option<StreamOutcome>> {
        self.outcome.lock().unpoisoned()
    }

    fn finish(&self, error: DmaError, bytes: u64, iova: u64) {
        *self.outcome() = Some(StreamOutcome { error, bytes, iova });
    }
}

/// The stream thread of one DMA test device.
pub struct DmaStreamer {
    jobs: Option<Sender<StreamJob>>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl DmaStreamer {
    /// Starts the (idle) thread; its DMA goes through `dma`. Fails past
    /// the vIOMMU's reader limit: a stream no UNMAP waits for must not run.
    pub fn spawn(dma: DmaSpace) -> std::io::Result<Self> {
        let (tx, rx) = channel();
        let shared = Arc::new(Shared::default());
        let mut dma = ThreadDma::new(dma).map_err(std::io::Error::other)?;
        let s = shared.clone();
        let thread = sandbox::spawn(ThreadKind::DmaStream, "dma-test-stream", move || {
            stream_thread(&mut dma, &rx, &s)
        })?;
        Ok(Self {
            jobs: Some(tx),
            shared,
            thread: Some(thread),
        })
    }

    /// Starts `job`. The caller starts one job at a time (it waits for
    /// [`outcome`](Self::outcome) before the next).
    pub fn start(&self, job: StreamJob) {
        self.shared.stop.store(false, Ordering::SeqCst);
        self.shared.passes.store(0, Ordering::SeqCst);
        *self.shared.outcome() = None;
        let sent = self.jobs.as_ref().map(|tx| tx.send(job));
        if !matches!(sent, Some(Ok(()))) {
            // The thread is gone (it only ends when the device drops it).
            self.shared.finish(DmaError::NotRam, 0, 0);
        }
    }

    /// Asks the running stream to stop after its current pass.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::SeqCst);
    }

    /// Passes completed by the current or the last stream.
    pub fn passes(&self) -> u64 {
        self.shared.passes.load(Ordering::SeqCst)
    }

    /// How the last stream ended; `None` while it runs.
    pub fn outcome(&self) -> Option<StreamOutcome> {
        *self.shared.outcome()
    }
}

impl Drop for DmaStreamer {
    fn drop(&mut self) {
        self.stop();
        // Closing the channel ends the thread once its job has stopped.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                log::warn!("dma-test: the stream thread panicked");
            }
        }
    }
}

fn stream_thread(dma: &mut ThreadDma, jobs: &Receiver<StreamJob>, shared: &Shared) {
    // Parked while waiting for a job: no UNMAP waits for an idle stream.
    while let Ok(mut job) = dma.parked(|| jobs.recv()) {
        let len = job.data.len() as u64;
        let mut bytes = 0u64;
        let mut error = DmaError::None;
        while !shared.stop.load(Ordering::SeqCst) {
            // One pass per section.
            let result = copy_guest(&dma.access(), &mut job.data, job.iova, job.to_ram);
            if result != DmaError::None {
                // Bus mastering cleared under a pass: the device asked for
                // the stop first, so this is that stop, not a fault.
                let stopping =
                    result == DmaError::BusMasterOff && shared.stop.load(Ordering::SeqCst);
                if !stopping {
                    error = result;
                }
                break;
            }
            bytes = bytes.saturating_add(len);
            shared.passes.fetch_add(1, Ordering::SeqCst);
            // Leave the CPU to the vCPUs between passes (the stream is a
            // test device, not a benchmark), parked: a vCPU that runs
            // meanwhile and completes an UNMAP must not wait for us.
            dma.parked(thread::yield_now);
        }
        shared.finish(error, bytes, job.iova);
    }
}
