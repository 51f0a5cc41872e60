//! The thread that answers the requests that change the VM (`vm.create`,
//! `vm.boot`, `vm.pause`, hotplug, ...), one at a time in arrival order.
//!
//! WHY off the server loop: `vm.boot` builds the VM and may wait for a
//! vhost-user back-end to connect, `vm.pause` waits (bounded) for the
//! vCPUs, `vm.add-device` opens a host device. On the loop, any of them
//! would keep `vmm.ping` and `vmm.shutdown` from being answered. WHY one
//! thread and not one per request: the VM's transitions were always
//! serialised (one request at a time), and `Controller` and the vCPU pause
//! protocol rely on no two of them racing.
//!
//! The loop learns that an answer is ready from an event fd it polls.

use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Arc;

use log::warn;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::routes::{self, Reply, VmmApi};
use super::wire::Incoming;
use crate::error::Error;

/// A request handed to the worker, and whose connection it came from.
struct Job {
    client: u64,
    req: Incoming,
}

/// An answer for connection `client`.
pub struct Done {
    /// The connection's id (the server's, never reused).
    pub client: u64,
    /// Its reply.
    pub reply: Reply,
}

/// The server loop's end of the worker.
pub struct Worker {
    jobs: Sender<Job>,
    done: Receiver<Done>,
    ready: Arc<EventFd>,
}

impl Worker {
    /// Starts the worker thread (through `super::spawn_thread`, the one
    /// place API threads start) for `vmm`.
    pub fn start(vmm: Arc<dyn VmmApi>) -> Result<Self, Error> {
        let ready = Arc::new(EventFd::new(EFD_NONBLOCK).map_err(|source| Error::Os {
            what: "API worker event fd",
            source,
        })?);
        let (jobs, job_rx) = channel::<Job>();
        let (done_tx, done) = channel();
        let wake = ready.clone();
        super::spawn_thread(super::ApiThread::Worker, move || {
            while let Ok(Job { client, req }) = job_rx.recv() {
                let reply =
                    routes::handle_with_fds(req.method, &req.url, &req.body, req.fds, vmm.as_ref());
                if done_tx.send(Done { client, reply }).is_err() {
                    return;
                }
                if let Err(e) = wake.write(1) {
                    // The loop also drains answers on its periodic wake-up.
                    warn!("API worker: waking the server loop: {e}");
                }
            }
        })?;
        Ok(Self { jobs, done, ready })
    }

    /// Queues `req` of connection `client`; false if the worker is gone.
    pub fn submit(&self, client: u64, req: Incoming) -> bool {
        self.jobs.send(Job { client, req }).is_ok()
    }

    /// The event fd that becomes readable when answers are ready.
    pub fn ready_fd(&self) -> &EventFd {
        &self.ready
    }

    /// The answers ready now.
    pub fn take_done(&self) -> Vec<Done> {
        // Reset the event before draining: an answer sent after the read
        // sets it again.
        let _ = self.ready.read();
        let mut out = Vec::new();
        loop {
            match self.done.try_recv() {
                Ok(d) => out.push(d),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => return out,
            }
        }
    }
}
