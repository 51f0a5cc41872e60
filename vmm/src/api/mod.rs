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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::thread;

use log::{debug, info, warn};
use tiny_http::{Header, Response, Server};

use crate::error::Error;
use crate::options::parse_options;
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

/// Where the API listens (`--api-socket path=..` or `fd=..`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiSocket {
    /// A socket file created (and, if a stale socket is there, replaced).
    Path(PathBuf),
    /// A listening Unix socket inherited from the parent process.
    Fd(RawFd),
}

impl ApiSocket {
    /// Parses `--api-socket`: `path=PATH`, `fd=N`, or a bare path, as
    /// cloud-hypervisor accepts.
    pub fn parse(value: &str) -> Result<Self, Error> {
        let bad = |reason: String| Error::InvalidOption {
            option: "api-socket",
            value: value.to_string(),
            reason,
        };
        if !value.contains('=') {
            if value.is_empty() {
                return Err(bad("a path or fd=N is required".into()));
            }
            return Ok(Self::Path(value.into()));
        }
        let opts = parse_options("api-socket", value, &["path", "fd"])?;
        match (opts.get("path"), opts.get("fd")) {
            (Some(p), None) if !p.is_empty() => Ok(Self::Path(p.into())),
            (None, Some(fd)) => fd
                .parse::<RawFd>()
                .ok()
                .filter(|fd| *fd >= 0)
                .map(Self::Fd)
                .ok_or_else(|| bad(format!("fd={fd}: not a file descriptor number"))),
            _ => Err(bad("give exactly one of path= and fd=".into())),
        }
    }

    fn listen(&self) -> Result<UnixListener, Error> {
        let os = |what: &'static str| move |source| Error::Os { what, source };
        match self {
            Self::Path(p) => {
                // A socket left by an earlier run is replaced; any other
                // file is not ours to remove.
                if std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket()) {
                    std::fs::remove_file(p).map_err(os("removing a stale API socket"))?;
                }
                UnixListener::bind(p).map_err(os("binding the API socket"))
            }
            Self::Fd(fd) => {
                // SAFETY: F_GETFD only reads the descriptor's flags; an
                // invalid number fails with EBADF.
                if unsafe { libc::fcntl(*fd, libc::F_GETFD) } < 0 {
                    return Err(Error::Os {
                        what: "the --api-socket fd",
                        source: std::io::Error::last_os_error(),
                    });
                }
                // SAFETY: the descriptor is open (checked above) and was
                // handed to this process for the API alone (the command
                // line names it); nothing else in the VMM uses or closes
                // it, so ownership can be taken here.
                let owned = unsafe { OwnedFd::from_raw_fd(*fd) };
                let listener = UnixListener::from(owned);
                // Not a listening Unix socket: accept would fail forever.
                listener
                    .local_addr()
                    .map_err(os("the --api-socket fd is not a Unix socket"))?;
                Ok(listener)
            }
        }
    }
}

/// Starts serving the API on `socket` for `vmm`.
pub fn spawn(socket: &ApiSocket, vmm: Arc<dyn VmmApi>) -> Result<(), Error> {
    let listener = socket.listen()?;
    LISTENER_FD.store(listener.as_raw_fd(), Ordering::SeqCst);
    let server = Server::from_listener(listener, None)
        .map_err(|e| Error::Device(format!("API socket: {e}")))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cloud_hypervisor_spellings() {
        assert_eq!(
            ApiSocket::parse("path=/run/a.sock").unwrap(),
            ApiSocket::Path("/run/a.sock".into())
        );
        assert_eq!(
            ApiSocket::parse("/run/a.sock").unwrap(),
            ApiSocket::Path("/run/a.sock".into())
        );
        assert_eq!(ApiSocket::parse("fd=3").unwrap(), ApiSocket::Fd(3));
        for bad in ["", "fd=-1", "fd=x", "path=", "path=/a,fd=3", "sock=/a"] {
            assert!(ApiSocket::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_closed_fd_is_refused() {
        // A descriptor number far above anything this test process opens.
        let err = ApiSocket::Fd(1_000_000).listen().unwrap_err().to_string();
        assert!(err.contains("api-socket"), "{err}");
    }
}
