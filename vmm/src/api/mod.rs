//! `--api-socket`: cloud-hypervisor's REST API (a subset) over HTTP/1.1 on
//! a Unix socket, so that the stacks that drive cloud-hypervisor
//! (`ch-remote`, `curl --unix-socket`, Kata Containers, libvirt) can drive
//! dmavisor.
//!
//! The parts, each in its file:
//! - [`routes`]: request to reply, no sockets; [`controller`] the VMM's
//!   one VM slot, [`vm_config`] and [`vm_state`] the bodies and the VM;
//! - [`wire`]: HTTP parsing by `dbs-uhttp` (with `SCM_RIGHTS` descriptors,
//!   at most [`fd_stream::MAX_REQUEST_FDS`] a request) and replies framed
//!   as cloud-hypervisor's clients read them;
//! - [`server`]: one thread polls every connection, non-blocking, with
//!   time-outs and a connection cap, and answers what only reads state;
//! - [`worker`]: one thread answers the requests that change the VM, in
//!   order, so a long `vm.boot` never holds up `vmm.ping` or
//!   `vmm.shutdown`.
//!
//! A VMM started with only `--api-socket` serves the API alone until
//! `vm.create` and `vm.boot` (`vm_config`).

pub mod ch_fields;
pub mod cold_plug;
pub mod controller;
pub mod error;
pub mod fd_stream;
pub mod routes;
pub mod running_config;
pub mod server;
pub mod vm_config;
pub mod vm_state;
pub mod wire;
pub mod worker;

#[cfg(test)]
mod fd_tests;
#[cfg(test)]
mod server_tests;
#[cfg(test)]
mod test_fakes;
#[cfg(test)]
mod test_http;

use std::sync::Arc;
use std::thread;

use log::info;

pub use crate::api_socket::ApiSocket;
use crate::error::Error;
use crate::sandbox::{self, ThreadKind};
pub use routes::{VmApi, VmmApi};
use server::{Limits, Server};

/// The kinds of thread the API runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiThread {
    /// The socket's event loop ([`server`]): sockets and poll only.
    Server,
    /// The lifecycle requests ([`worker`]): builds and changes the VM.
    Worker,
}

impl ApiThread {
    /// The thread's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Server => "api",
            Self::Worker => "api-worker",
        }
    }
}

/// The one place API threads start. WHY one place: a per-thread-kind
/// sandbox (seccomp filter) is applied at the start of `body`, here,
/// before the thread touches a client's bytes.
pub(crate) fn spawn_thread(
    kind: ApiThread,
    body: impl FnOnce() + Send + 'static,
) -> Result<thread::JoinHandle<()>, Error> {
    let sandboxed = match kind {
        ApiThread::Server => ThreadKind::ApiServer,
        ApiThread::Worker => ThreadKind::Api,
    };
    sandbox::spawn(sandboxed, kind.name(), body).map_err(|source| Error::Os {
        what: "API thread",
        source,
    })
}

/// Starts serving the API on `socket` for `vmm`.
pub fn spawn(socket: &ApiSocket, vmm: Arc<dyn VmmApi>) -> Result<(), Error> {
    let listener = socket.listen()?;
    let server = Server::new(listener, vmm, Limits::default())?;
    info!("API listening on {socket:?}");
    spawn_thread(ApiThread::Server, move || server.run())?;
    Ok(())
}
