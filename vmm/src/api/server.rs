//! The API's event loop: one thread, every connection non-blocking, no
//! client able to stop the others from being answered.
//!
//! WHY each rule:
//! - every socket is non-blocking and the loop waits only in `poll`, so a
//!   client that sends `Content-Length: 2000` and then nothing holds its own
//!   connection, not the loop;
//! - a request must arrive whole within [`Limits::request_timeout`] of its
//!   first byte, a reply must be taken within [`Limits::write_timeout`],
//!   and an idle keep-alive connection is closed after
//!   [`Limits::idle_timeout`], so slow clients give their slot back;
//! - at most [`Limits::max_connections`] connections: a newcomer past it
//!   replaces the longest-idle connection, or gets a 503 when all of them
//!   are mid-request (which the request time-out bounds);
//! - requests that change the VM go to the worker thread
//!   (`super::worker`), so `vmm.ping`, `vm.info` and `vmm.shutdown` are
//!   answered while a `vm.boot` waits for a vhost-user back-end;
//! - a connection is answered in order: while one of its requests is with
//!   the worker, or a reply is unsent, nothing more is read from it, so a
//!   client cannot make the server buffer without bound.
//!
//! `vmm.shutdown`, `vm.shutdown` and `vm.reboot` act once their 204 has been
//! written (or the connection is gone): the process may end right after.

use std::io::{ErrorKind, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dbs_uhttp::{ConnectionError, HttpConnection};
use log::{debug, info, warn};

use super::fd_stream::{FdBudget, FdStream, MAX_REQUEST_FDS};
use super::routes::{self, After, Reply, VmmApi};
use super::wire::{self, Incoming};
use super::worker::Worker;

/// Largest request body read; a larger one is refused with 413.
pub const MAX_BODY: usize = 64 << 10;

/// How long clients may take; see the module documentation.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Open connections at most.
    pub max_connections: usize,
    /// From a request's first byte to its last.
    pub request_timeout: Duration,
    /// Without progress on an unsent reply.
    pub write_timeout: Duration,
    /// A keep-alive connection with nothing to do.
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 16,
            request_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// One client connection.
struct Client {
    /// Never reused, unlike the fd: a late worker answer cannot reach a
    /// newer connection.
    id: u64,
    http: HttpConnection<FdStream>,
    /// The descriptors the request being read brought (`SCM_RIGHTS`).
    fds: Arc<FdBudget>,
    /// A second handle on the same socket for the replies.
    out: UnixStream,
    unsent: Vec<u8>,
    /// A request of this connection is with the worker.
    waiting: bool,
    /// What to do once the current reply is written.
    after: Option<After>,
    /// The parser refused the stream: this reply, then close.
    broken: Option<Reply>,
    close_when_sent: bool,
    /// When the incomplete request being read began.
    started: Option<Instant>,
    deadline: Instant,
    closed: bool,
}

impl Client {
    fn idle(&self) -> bool {
        !self.waiting
            && self.unsent.is_empty()
            && !self.http.pending_write()
            && self.started.is_none()
            && self.after.is_none()
    }

    fn wants_write(&self) -> bool {
        !self.unsent.is_empty() || self.http.pending_write()
    }

    fn wants_read(&self) -> bool {
        !self.waiting && self.unsent.is_empty() && self.broken.is_none() && !self.close_when_sent
    }
}

/// The loop's state.
pub struct Server {
    listener: UnixListener,
    vmm: Arc<dyn VmmApi>,
    worker: Worker,
    limits: Limits,
    clients: Vec<Client>,
    next_id: u64,
}

impl Server {
    /// A server on `listener` (made non-blocking) for `vmm`; starts the
    /// worker thread.
    pub fn new(
        listener: UnixListener,
        vmm: Arc<dyn VmmApi>,
        limits: Limits,
    ) -> Result<Self, crate::error::Error> {
        listener
            .set_nonblocking(true)
            .map_err(|source| crate::error::Error::Os {
                what: "making the API socket non-blocking",
                source,
            })?;
        let worker = Worker::start(vmm.clone())?;
        Ok(Self {
            listener,
            vmm,
            worker,
            limits,
            clients: Vec::new(),
            next_id: 0,
        })
    }

    /// Serves until the listening socket fails.
    pub fn run(mut self) {
        loop {
            if let Err(e) = self.turn() {
                warn!("API server stops: {e}");
                return;
            }
        }
    }

    /// One wait and what it found.
    pub(super) fn turn(&mut self) -> std::io::Result<()> {
        let mut fds = Vec::with_capacity(self.clients.len() + 2);
        let pollfd = |fd, events| libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        fds.push(pollfd(self.listener.as_raw_fd(), libc::POLLIN));
        fds.push(pollfd(self.worker.ready_fd().as_raw_fd(), libc::POLLIN));
        for c in &self.clients {
            let mut ev = 0;
            if c.wants_read() {
                ev |= libc::POLLIN;
            }
            if c.wants_write() {
                ev |= libc::POLLOUT;
            }
            fds.push(pollfd(c.http.as_raw_fd(), ev));
        }
        let timeout = self.poll_timeout();
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structures
        // that poll may write `revents` into; it lives across the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return if e.kind() == ErrorKind::Interrupted {
                Ok(())
            } else {
                Err(e)
            };
        }
        let now = Instant::now();
        if fds.get(1).is_some_and(|p| p.revents != 0) {
            self.collect_answers(now);
        }
        for (i, p) in fds.iter().enumerate().skip(2) {
            let i = i - 2;
            if p.revents & libc::POLLOUT != 0 {
                self.write(i, now);
            }
            if p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                self.read(i, now);
            }
            // The peer is gone for good (a half-close is not a hang-up):
            // nothing can reach it, and polling it again would spin.
            if p.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                self.close(i);
            }
        }
        if fds.first().is_some_and(|p| p.revents != 0) {
            self.accept(now)?;
        }
        self.expire(now);
        self.clients.retain(|c| !c.closed);
        Ok(())
    }

    /// Open connections that are not idle (mid-request, waiting for the
    /// worker, or with an unsent reply).
    #[cfg(test)]
    pub(super) fn busy_connections(&self) -> usize {
        self.clients
            .iter()
            .filter(|c| !c.closed && !c.idle())
            .count()
    }

    /// Milliseconds until the nearest deadline, at most one second.
    fn poll_timeout(&self) -> i32 {
        let now = Instant::now();
        let nearest = self
            .clients
            .iter()
            .filter(|c| !c.waiting)
            .map(|c| c.deadline.saturating_duration_since(now))
            .min()
            .unwrap_or(Duration::from_secs(1))
            .min(Duration::from_secs(1));
        // Round up: waking a little early would spin.
        i32::try_from(nearest.as_millis()).unwrap_or(1000) + 1
    }

    fn accept(&mut self, now: Instant) -> std::io::Result<()> {
        loop {
            let stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                // Out of descriptors or memory: the clients already
                // connected are still served; try again on the next wake.
                Err(e) if e.raw_os_error().is_some_and(is_transient_accept) => {
                    warn!("API: accepting a connection: {e}");
                    return Ok(());
                }
                Err(e) => return Err(e),
            };
            self.admit(stream, now);
        }
    }

    fn admit(&mut self, mut stream: UnixStream, now: Instant) {
        let open = self.clients.iter().filter(|c| !c.closed).count();
        if open >= self.limits.max_connections {
            let idlest = self
                .clients
                .iter_mut()
                .filter(|c| !c.closed && c.idle())
                .min_by_key(|c| c.deadline);
            match idlest {
                Some(c) => {
                    debug!("API: connection {} closed for a newcomer", c.id);
                    c.closed = true;
                }
                None => {
                    let reply = Reply::error(503, "too many API connections");
                    // A fresh socket's buffer takes these few bytes.
                    let _ = stream
                        .set_nonblocking(true)
                        .and_then(|()| stream.write(&wire::encode(&reply)));
                    return;
                }
            }
        }
        let out = match stream
            .set_nonblocking(true)
            .and_then(|()| stream.try_clone())
        {
            Ok(out) => out,
            Err(e) => {
                warn!("API: setting up a connection: {e}");
                return;
            }
        };
        let (stream, fds) = FdStream::new(stream);
        let mut http = HttpConnection::new(stream);
        http.set_payload_max_size(MAX_BODY);
        self.next_id += 1;
        self.clients.push(Client {
            id: self.next_id,
            http,
            fds,
            out,
            unsent: Vec::new(),
            waiting: false,
            after: None,
            broken: None,
            close_when_sent: false,
            started: None,
            deadline: now + self.limits.idle_timeout,
            closed: false,
        });
    }

    fn read(&mut self, i: usize, now: Instant) {
        let Some(c) = self.clients.get_mut(i) else {
            return;
        };
        if c.closed || !c.wants_read() {
            // A hang-up while the worker has the request: noticed when the
            // reply is written.
            return;
        }
        match c.http.try_read() {
            Ok(()) => {
                if c.started.is_none() {
                    c.started = Some(now);
                    c.deadline = now + self.limits.request_timeout;
                }
            }
            Err(ConnectionError::ConnectionClosed) => {
                self.close(i);
                return;
            }
            Err(ConnectionError::StreamReadError(e))
                if e.errno() == libc::EAGAIN || e.errno() == libc::EINTR =>
            {
                return;
            }
            Err(ConnectionError::ParseError(e)) => {
                debug!("API: connection {}: {e}", c.id);
                c.broken = Some(wire::refused(&e));
            }
            Err(e) => {
                debug!("API: connection {}: {e:?}", c.id);
                self.close(i);
                return;
            }
        }
        self.dispatch(i, now);
    }

    /// Answers the connection's parsed requests in order, until one goes
    /// to the worker.
    fn dispatch(&mut self, i: usize, now: Instant) {
        loop {
            let Some(c) = self.clients.get_mut(i) else {
                return;
            };
            if c.waiting || c.after.is_some() || c.close_when_sent || c.closed {
                return;
            }
            let Some(req) = c.http.pop_parsed_request() else {
                if let Some(reply) = c.broken.take() {
                    c.close_when_sent = true;
                    self.queue(i, reply, now);
                }
                return;
            };
            c.started = None;
            let id = c.id;
            if c.fds.take_overflow() {
                // Its descriptors close with it; the connection serves on
                // (the bytes are framed).
                drop(req);
                let reply = Reply::error(
                    400,
                    format!(
                        "more than {MAX_REQUEST_FDS} file descriptors sent with one request; \
                         all of them were closed"
                    ),
                );
                self.queue(i, reply, now);
                continue;
            }
            let incoming = match Incoming::from_request(req) {
                Ok(r) => r,
                Err(reply) => {
                    c.close_when_sent = true;
                    self.queue(i, reply, now);
                    return;
                }
            };
            if routes::answers_at_once(&incoming.url) {
                let reply = routes::handle_with_fds(
                    incoming.method,
                    &incoming.url,
                    &incoming.body,
                    incoming.fds,
                    self.vmm.as_ref(),
                );
                debug!("API {} {}: {}", incoming.method, incoming.url, reply.status);
                self.queue(i, reply, now);
            } else {
                debug!("API {} {}: to the worker", incoming.method, incoming.url);
                if self.worker.submit(id, incoming) {
                    c.waiting = true;
                } else {
                    let reply = Reply::error(500, "the API worker thread is gone");
                    self.queue(i, reply, now);
                }
            }
        }
    }

    fn collect_answers(&mut self, now: Instant) {
        for done in self.worker.take_done() {
            let Some(i) = self.clients.iter().position(|c| c.id == done.client) else {
                // The client went away; an action still happens.
                Self::act(self.vmm.as_ref(), done.reply.after);
                continue;
            };
            if let Some(c) = self.clients.get_mut(i) {
                c.waiting = false;
            }
            self.queue(i, done.reply, now);
            self.dispatch(i, now);
        }
    }

    /// Queues `reply` on connection `i` and tries to send it at once.
    fn queue(&mut self, i: usize, reply: Reply, now: Instant) {
        let Some(c) = self.clients.get_mut(i) else {
            Self::act(self.vmm.as_ref(), reply.after);
            return;
        };
        if reply.after != After::Nothing {
            c.after = Some(reply.after);
        }
        c.unsent.extend_from_slice(&wire::encode(&reply));
        c.deadline = now + self.limits.write_timeout;
        self.write(i, now);
    }

    fn write(&mut self, i: usize, now: Instant) {
        let Some(c) = self.clients.get_mut(i) else {
            return;
        };
        if c.closed {
            return;
        }
        // The parser's own queue first: a `100 Continue` precedes the reply.
        while c.http.pending_write() {
            match c.http.try_write() {
                Ok(()) => {}
                Err(ConnectionError::InvalidWrite) => break,
                Err(_) => {
                    self.close(i);
                    return;
                }
            }
        }
        while !c.unsent.is_empty() {
            match c.out.write(&c.unsent) {
                Ok(0) => {
                    self.close(i);
                    return;
                }
                Ok(n) => {
                    c.unsent.drain(..n.min(c.unsent.len()));
                    c.deadline = now + self.limits.write_timeout;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.close(i);
                    return;
                }
            }
        }
        c.deadline = now + self.limits.idle_timeout;
        if let Some(after) = c.after.take() {
            Self::act(self.vmm.as_ref(), after);
        }
        if c.close_when_sent {
            self.close(i);
        } else {
            // Requests that arrived meanwhile.
            self.dispatch(i, now);
        }
    }

    fn expire(&mut self, now: Instant) {
        for i in 0..self.clients.len() {
            let due = self
                .clients
                .get(i)
                .is_some_and(|c| !c.closed && !c.waiting && now >= c.deadline);
            if due {
                if let Some(c) = self.clients.get(i) {
                    debug!("API: connection {} timed out", c.id);
                }
                self.close(i);
            }
        }
    }

    /// Marks connection `i` closed (dropped at the end of the turn); an
    /// action its reply asked for still happens.
    fn close(&mut self, i: usize) {
        if let Some(c) = self.clients.get_mut(i) {
            c.closed = true;
            c.unsent.clear();
            if let Some(after) = c.after.take() {
                Self::act(self.vmm.as_ref(), after);
            }
        }
    }

    fn act(vmm: &dyn VmmApi, after: After) {
        match after {
            After::Nothing => {}
            After::Shutdown => {
                info!("API: shutting down");
                vmm.shutdown();
            }
            After::ShutdownVm => {
                info!("API: shutting the VM down");
                if let super::routes::VmSlot::Running(vm) = vmm.slot() {
                    vm.shutdown();
                }
            }
            After::Reboot => {
                info!("API: rebooting");
                vmm.reboot();
            }
        }
    }
}

/// accept(2) errors after which the listener still works.
fn is_transient_accept(errno: i32) -> bool {
    matches!(
        errno,
        libc::EMFILE
            | libc::ENFILE
            | libc::ENOBUFS
            | libc::ENOMEM
            | libc::ECONNABORTED
            | libc::EPROTO
            | libc::EPERM
    )
}
