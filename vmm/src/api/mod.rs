//! `--api-socket`: cloud-hypervisor's REST API (a subset) over HTTP/1.1 on
//! a Unix socket, so that the stacks that drive cloud-hypervisor
//! (`ch-remote`, `curl --unix-socket`, Kata Containers, libvirt) can drive
//! dmavisor.
//!
//! One thread serves the socket with `tiny_http`, one request at a time;
//! answers come from [`routes`], which reads configuration snapshots and
//! atomic counters; only `vm.pause` waits for the vCPUs, for a bounded
//! time (`vm_state::PAUSE_TIMEOUT`), and `vm.boot` builds the VM on this
//! thread (`controller`). A VMM started with only `--api-socket` serves
//! the API alone until `vm.create` and `vm.boot` (`vm_config`).

pub mod controller;
pub mod error;
pub mod routes;
pub mod vm_config;
pub mod vm_state;

use std::io::Read;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::thread;

use log::{debug, info, warn};
use tiny_http::{Header, Response, Server};

pub use crate::api_socket::ApiSocket;
use crate::error::Error;
pub use routes::{VmApi, VmmApi};

/// Largest request body read; a larger one is refused with 413.
const MAX_BODY: usize = 64 << 10;

/// The listening socket's descriptor once the API serves (-1 before): a
/// reboot hands it to the next process image (`crate::reboot`), so the
/// socket keeps its path, its backlog and its clients.
static LISTENER_FD: AtomicI32 = AtomicI32::new(-1);

/// The API's listening socket, if it serves.
pub fn listener_fd() -> Option<RawFd> {
    Some(LISTENER_FD.load(Ordering::SeqCst)).filter(|fd| *fd >= 0)
}

/// Starts serving the API on `socket` for `vmm`.
pub fn spawn(socket: &ApiSocket, vmm: Arc<dyn VmmApi>) -> Result<(), Error> {
    let listener = socket.listen()?;
    LISTENER_FD.store(listener.as_raw_fd(), Ordering::SeqCst);
    let server = Server::from_listener(listener, None).map_err(Error::ApiServer)?;
    info!("API listening on {socket:?}");
    thread::Builder::new()
        .name("api".into())
        .spawn(move || serve(&server, vmm.as_ref()))
        .map_err(|source| Error::Os {
            what: "API thread",
            source,
        })?;
    Ok(())
}

fn serve(server: &Server, vm: &dyn VmmApi) {
    for mut req in server.incoming_requests() {
        let method = req.method().as_str().to_string();
        let url = req.url().to_string();
        let mut body = Vec::new();
        let read = req
            .as_reader()
            .take(MAX_BODY as u64 + 1)
            .read_to_end(&mut body);
        let reply = match read {
            Err(e) => routes::Reply::error(400, format!("reading the body: {e}")),
            Ok(n) if n > MAX_BODY => {
                routes::Reply::error(413, format!("body larger than {MAX_BODY} bytes"))
            }
            Ok(_) => routes::handle(&method, &url, &body, vm),
        };
        debug!("API {method} {url}: {}", reply.status);
        let sent = match reply.body {
            Some(b) => {
                let mut resp = Response::from_string(b).with_status_code(reply.status);
                if let Ok(h) = Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]) {
                    resp = resp.with_header(h);
                }
                req.respond(resp)
            }
            None => req.respond(Response::empty(reply.status)),
        };
        if let Err(e) = sent {
            warn!("API {method} {url}: sending the reply: {e}");
        }
        match reply.after {
            routes::After::Nothing => {}
            routes::After::Shutdown => {
                info!("API {method} {url}: shutting down");
                vm.shutdown();
            }
            routes::After::Reboot => {
                info!("API {method} {url}: rebooting");
                vm.reboot();
            }
        }
    }
}
