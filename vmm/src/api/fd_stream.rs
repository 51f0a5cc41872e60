//! A client connection's socket as the HTTP parser reads it, with a bound
//! on the descriptors (`SCM_RIGHTS`) one request may bring.
//!
//! WHY: `dbs-uhttp` takes every descriptor each `recvmsg` returns (up to
//! 253 a message) and keeps them until the request they came with is
//! complete, so a client sending descriptors with every byte of a slow
//! request would make the VMM hold thousands of them. Here each request
//! may bring at most [`MAX_REQUEST_FDS`] (`vm.add-net` needs one per queue
//! pair, 16 pairs at most); past that, the surplus is closed as soon as it
//! arrives and the request is answered 400 ([`FdBudget::take_overflow`]).
//! The descriptors within the bound travel with their request
//! (`wire::Incoming::fds`) and are closed when it is answered, unless an
//! endpoint keeps them.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use dbs_uhttp::ScmSocket;

/// Descriptors one request may carry.
pub const MAX_REQUEST_FDS: usize = 16;

/// The count of descriptors received for the request being read.
#[derive(Debug, Default)]
pub struct FdBudget {
    received: AtomicUsize,
    overflow: AtomicBool,
}

impl FdBudget {
    /// Whether the request just completed brought more than
    /// [`MAX_REQUEST_FDS`]; starts counting afresh for the next one.
    pub fn take_overflow(&self) -> bool {
        self.received.store(0, Ordering::Relaxed);
        self.overflow.swap(false, Ordering::Relaxed)
    }
}

/// The socket, and the budget of the request being read on it.
pub struct FdStream {
    stream: UnixStream,
    budget: Arc<FdBudget>,
}

impl FdStream {
    /// `stream` with a fresh budget (shared with the caller).
    pub fn new(stream: UnixStream) -> (Self, Arc<FdBudget>) {
        let budget = Arc::new(FdBudget::default());
        (
            Self {
                stream,
                budget: budget.clone(),
            },
            budget,
        )
    }
}

impl Read for FdStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.read(buf)
    }
}

impl Write for FdStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

impl AsRawFd for FdStream {
    fn as_raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }
}

impl ScmSocket for FdStream {
    fn socket_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// The socket's `recvmsg`, then the budget: descriptors past it are
    /// closed here and never reach the parser.
    ///
    /// # Safety
    ///
    /// As the trait's: `iovecs` must point to memory that may be written.
    unsafe fn recv_with_fds(
        &self,
        iovecs: &mut [libc::iovec],
        fds: &mut [RawFd],
    ) -> Result<(usize, usize), dbs_uhttp::SysError> {
        // SAFETY: the caller's guarantee on `iovecs` is passed on.
        let (bytes, got) = unsafe { self.stream.recv_with_fds(iovecs, fds)? };
        let got = got.min(fds.len());
        let before = self.budget.received.fetch_add(got, Ordering::Relaxed);
        let keep = MAX_REQUEST_FDS.saturating_sub(before).min(got);
        if keep < got {
            self.budget.overflow.store(true, Ordering::Relaxed);
            for fd in fds.iter().take(got).skip(keep) {
                // SAFETY: recvmsg just installed this descriptor in our
                // table and nothing else refers to it: closing it once is
                // ours to do.
                drop(unsafe { OwnedFd::from_raw_fd(*fd) });
            }
        }
        Ok((bytes, keep))
    }
}
