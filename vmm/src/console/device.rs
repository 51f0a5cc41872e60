//! The virtio-console device model: no feature bits, a zeroed
//! configuration space (its fields are valid only with SIZE or
//! MULTIPORT), two queues served by one worker.

use std::thread::JoinHandle;

use log::warn;
use vmm_sys_util::eventfd::EventFd;

use super::backend::Backend;
use super::worker::{run_worker, WorkerParts};
use crate::sandbox::{self, ThreadKind};
use crate::virtio::{read_config_window, ActivateContext, ActivateError, VirtioDevice};

/// virtio device id of a console (virtio 1.2, 5).
pub const VIRTIO_ID_CONSOLE: u32 = 3;
/// Entries per queue.
const QUEUE_SIZE: u16 = 64;
/// `struct virtio_console_config`: cols, rows, max_nr_ports, emerg_wr.
const CONFIG_LEN: usize = 12;

/// A one-port virtio-console.
pub struct Console {
    backend: Backend,
    worker: Option<(EventFd, JoinHandle<()>)>,
}

impl Console {
    /// A console on `backend`.
    pub fn new(backend: Backend) -> Self {
        Self {
            backend,
            worker: None,
        }
    }
}

impl VirtioDevice for Console {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_CONSOLE
    }

    fn pci_class(&self) -> (u8, u8) {
        // Simple communication controller, other.
        (0x07, 0x80)
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE; 2]
    }

    fn features(&self) -> u64 {
        0
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_window(&[0u8; CONFIG_LEN], offset, data);
    }

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        self.reset();
        let stop = EventFd::new(libc::EFD_NONBLOCK)?;
        let mut rx = None;
        let mut tx = None;
        for q in ctx.queues {
            match q.index {
                0 => rx = Some(q),
                1 => tx = Some(q),
                _ => {}
            }
        }
        let parts = WorkerParts {
            mem: ctx.mem,
            interrupt: ctx.interrupt,
            rx,
            tx,
            stop: stop.try_clone()?,
            output: self.backend.output.clone(),
            input: self.backend.input.clone(),
            input_is_pty: self.backend.input_is_pty,
        };
        let handle = sandbox::spawn(ThreadKind::Serial, "console", move || run_worker(parts))?;
        self.worker = Some((stop, handle));
        Ok(())
    }

    fn reset(&mut self) {
        if let Some((stop, handle)) = self.worker.take() {
            if let Err(e) = stop.write(1) {
                warn!("virtio-console: cannot stop the worker: {e}");
                return;
            }
            if handle.join().is_err() {
                warn!("virtio-console: the worker panicked");
            }
        }
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        self.reset();
    }
}
