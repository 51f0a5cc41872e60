//! `Socket` mode of the serial port and the virtio-console: the VMM
//! listens on a UNIX stream socket at a path the user names (libvirt's ch
//! driver asks for it for `<serial type='unix'>`); a client that connects
//! sees the guest's output and types its input.
//!
//! One client at a time: a newcomer replaces the client before it (whose
//! connection is closed), so a console left open by a crashed client
//! never locks the next one out; a client that leaves lets the next
//! connect. The socket file is created when the VM is built (an existing
//! path is an error, never replaced: it may be another VM's) and removed
//! when the VM is torn down.
//!
//! WHY output written while nobody is connected is kept (the newest
//! [`BACKLOG_BYTES`], in a ring: `backlog.rs`) and replayed to the next
//! client before anything new: libvirt's ch driver connects only after
//! `vm.boot` returns, and the guest's first lines (boot messages, a login
//! banner) would otherwise never reach `virsh console`. The ring keeps
//! collecting after a client leaves, too, so one that reconnects sees
//! what it missed (a panic while nobody watched is what matters most);
//! only bytes no client was sent are kept, so none is replayed twice.
//! (cloud-hypervisor also keeps output between clients.)
//!
//! WHY nothing ever waits for a client: the guest writes on a vCPU (the
//! UART's transmit register) or the console worker. The replay is written
//! by the socket thread, non-blocking; what the client's socket does not
//! take stays in the ring (new output queues behind it) and goes when the
//! socket has room. A connected client that does not keep up loses what
//! its socket buffer does not hold, as on a serial line; the ring is for
//! the time nobody is there, and its memory is fixed.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use log::{info, warn};
use vmm_sys_util::eventfd::EventFd;

use virtio_iommu::locks::Unpoison;

use crate::sandbox::{self, ThreadKind};

use backlog::Backlog;

/// How much output the back-end keeps while no client is connected.
/// WHY 64 KiB: more than a guest kernel prints up to its login prompt at
/// the usual log level, so a client connecting right after boot misses
/// nothing; small enough to cost nothing per VM.
pub const BACKLOG_BYTES: usize = 64 << 10;

/// How long the thread waits for the guest to take input it could not
/// take at once (a full UART FIFO or console queue) before offering again.
const INPUT_RETRY: Duration = Duration::from_millis(5);

/// Why a socket back-end cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Something is at the path already.
    #[error("{what} socket {}: the path exists{}; remove it or name another", path.display(), if *socket { " (a socket: another VM's, or left by one)" } else { "" })]
    Exists {
        /// `serial` or `console`.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// It is a socket.
        socket: bool,
    },
    /// bind/listen failed.
    #[error("{what} socket {}: cannot listen on it: {source}", path.display())]
    Bind {
        /// `serial` or `console`.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The thread or its descriptors could not be made.
    #[error("{what}: {source}")]
    Os {
        /// What failed.
        what: &'static str,
        /// Why.
        source: io::Error,
    },
}

/// What the writer and the thread share: the connected client and the
/// output it has not been sent yet. WHY one lock over both: a replay and
/// new output must not interleave.
struct Shared {
    /// The connected client's writing handle. WHY a `File` and not a
    /// `UnixStream`: std's stream reads with `recvfrom`, which the serial
    /// threads' filter does not allow; `read` and `write` are every
    /// thread's. (A write to a client that left raises SIGPIPE, which
    /// Rust's runtime ignores: the write fails with EPIPE.)
    client: Option<File>,
    /// Output waiting for a client (or for room in the client's socket).
    backlog: Backlog,
}

impl Shared {
    /// Guest output: to the client, after anything still waiting for it;
    /// kept when nobody is there.
    fn send(&mut self, buf: &[u8]) {
        let Some(stream) = self.client.as_mut() else {
            self.backlog.push(buf);
            return;
        };
        if !self.backlog.is_empty() {
            // A replay is under way (the thread finishes it): queue behind.
            self.backlog.push(buf);
            // An error is a client gone: the thread sees it hang up.
            let _ = self.backlog.drain_into(stream);
            return;
        }
        let mut rest = buf;
        while !rest.is_empty() {
            match stream.write(rest) {
                Ok(0) => break,
                Ok(n) => rest = rest.get(n..).unwrap_or_default(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // The client does not keep up: the rest is lost.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // EPIPE: it left and the thread has not seen it yet; keep
                // the rest for the next (the thread forgets this one).
                Err(_) => {
                    self.backlog.push(rest);
                    break;
                }
            }
        }
    }
}

/// The state the writer and the thread hold together.
type Client = Arc<Mutex<Shared>>;

/// A listening socket back-end. Dropping it stops its thread and removes
/// the socket file.
pub struct SocketConsole {
    path: PathBuf,
    what: &'static str,
    listener: Option<UnixListener>,
    client: Client,
    thread: Option<(EventFd, JoinHandle<()>)>,
}

impl SocketConsole {
    /// Creates the socket at `path` and listens on it; `what` (`serial`,
    /// `console`) names it in errors and logs.
    pub fn bind(path: &Path, what: &'static str) -> Result<Self, SocketError> {
        Self::bind_keeping(path, what, BACKLOG_BYTES)
    }

    /// [`SocketConsole::bind`] keeping at most `backlog` bytes of output.
    fn bind_keeping(path: &Path, what: &'static str, backlog: usize) -> Result<Self, SocketError> {
        if let Ok(meta) = fs::symlink_metadata(path) {
            return Err(SocketError::Exists {
                what,
                path: path.to_path_buf(),
                socket: meta.file_type().is_socket(),
            });
        }
        let bind_err = |source| SocketError::Bind {
            what,
            path: path.to_path_buf(),
            source,
        };
        let listener = UnixListener::bind(path).map_err(bind_err)?;
        // A client gone between the wake-up and the accept must not block
        // the thread.
        if let Err(e) = set_nonblocking(listener.as_raw_fd()) {
            let _ = fs::remove_file(path);
            return Err(bind_err(e));
        }
        info!("{what} socket: listening on {}", path.display());
        Ok(Self {
            path: path.to_path_buf(),
            what,
            listener: Some(listener),
            client: Arc::new(Mutex::new(Shared {
                client: None,
                backlog: Backlog::new(backlog),
            })),
            thread: None,
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the guest's output goes: to the client, or kept for the next
    /// one.
    pub fn writer(&self) -> SocketWriter {
        SocketWriter(self.client.clone())
    }

    /// Starts the thread that accepts clients and offers what they send to
    /// `sink` (which returns how much it took). WHY apart from
    /// [`SocketConsole::bind`]: the serial port's sink is the UART, which
    /// needs the writer before it exists.
    pub fn start<S>(&mut self, name: &str, sink: S) -> Result<(), SocketError>
    where
        S: FnMut(&[u8]) -> usize + Send + 'static,
    {
        let os = |what| move |source| SocketError::Os { what, source };
        let Some(listener) = self.listener.take() else {
            return Ok(());
        };
        let stop = EventFd::new(libc::EFD_NONBLOCK).map_err(os("eventfd"))?;
        let stopped = stop.try_clone().map_err(os("eventfd"))?;
        let client = self.client.clone();
        let what = self.what;
        let handle = sandbox::spawn(ThreadKind::Serial, name, move || {
            serve(what, &listener, &client, &stopped, sink);
        })
        .map_err(os("console socket thread"))?;
        self.thread = Some((stop, handle));
        Ok(())
    }
}

impl Drop for SocketConsole {
    fn drop(&mut self) {
        if let Some((stop, handle)) = self.thread.take() {
            if let Err(e) = stop.write(1) {
                warn!("{} socket: cannot stop its thread: {e}", self.what);
            } else if handle.join().is_err() {
                warn!("{} socket: its thread panicked", self.what);
            }
        }
        self.client.lock().unpoisoned().client.take();
        let (what, path) = (self.what, self.path.display());
        match fs::remove_file(&self.path) {
            Ok(()) => info!("{what} socket: {path} removed"),
            Err(e) => warn!("{what} socket: cannot remove {path}: {e}"),
        }
    }
}

/// Guest output to the connected client. WHY it never fails nor blocks:
/// see the module documentation; the client's descriptor is non-blocking,
/// and output with nobody there goes to the bounded ring.
pub struct SocketWriter(Client);

impl Write for SocketWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unpoisoned().send(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn pollfd(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Sends the client what waits for it, as much as its socket takes now;
/// true while some is left (the thread then waits for room).
fn replay(shared: &mut Shared) -> bool {
    let Shared { client, backlog } = shared;
    if let Some(stream) = client.as_mut() {
        // An error is a client gone: its hang-up comes next.
        let _ = backlog.drain_into(stream);
    }
    client.is_some() && !backlog.is_empty()
}

/// Waits for `fds`; false when the wait failed for good.
fn wait(fds: &mut [libc::pollfd], timeout_ms: i32) -> bool {
    let n = libc::nfds_t::try_from(fds.len()).unwrap_or(0);
    // SAFETY: `fds` is a valid array of `n` pollfd for the call.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), n, timeout_ms) };
    r >= 0 || io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
}

/// Makes `fd` non-blocking. WHY fcntl and not `set_nonblocking`: std's
/// uses the FIONBIO ioctl, which the serial threads' filter refuses.
fn set_nonblocking(fd: i32) -> io::Result<()> {
    // SAFETY: F_GETFL on an open descriptor reads its flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: F_SETFL on an open descriptor sets its flags.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The thread's loop: accepts clients, feeds their input to `sink`,
/// forgets those that leave; returns when `stop` is written.
fn serve<S: FnMut(&[u8]) -> usize>(
    what: &str,
    listener: &UnixListener,
    client: &Client,
    stop: &EventFd,
    mut sink: S,
) {
    // The thread's own handle on the client, for reading.
    let mut reader: Option<File> = None;
    let mut buf = [0u8; 256];
    // Output is waiting for room in the client's socket.
    let mut replaying = false;
    loop {
        let mut fds = vec![pollfd(stop.as_raw_fd()), pollfd(listener.as_raw_fd())];
        if let Some(r) = &reader {
            let mut fd = pollfd(r.as_raw_fd());
            if replaying {
                fd.events |= libc::POLLOUT;
            }
            fds.push(fd);
        }
        if !wait(&mut fds, -1) {
            warn!("{what} socket: poll: {}", io::Error::last_os_error());
            return;
        }
        if fds.first().is_some_and(|f| f.revents != 0) {
            return;
        }
        if fds.get(1).is_some_and(|f| f.revents != 0) {
            match accept(listener) {
                Ok((r, w)) => {
                    // The newcomer replaces the client before it, whose
                    // descriptors close here, and is sent what was kept
                    // before anything new (the writer waits on the lock).
                    let mut shared = client.lock().unpoisoned();
                    shared.client = Some(w);
                    reader = Some(r);
                    let (kept, dropped) = (shared.backlog.len(), shared.backlog.dropped());
                    replaying = replay(&mut shared);
                    drop(shared);
                    if kept == 0 {
                        info!("{what} socket: a client connected");
                    } else {
                        info!(
                            "{what} socket: a client connected; replaying {kept} bytes \
                             written while nobody was ({dropped} older dropped so far)"
                        );
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => warn!("{what} socket: accept: {e}"),
            }
            continue;
        }
        let revents = fds.get(2).map_or(0, |f| f.revents);
        if revents & libc::POLLOUT != 0 {
            replaying = replay(&mut client.lock().unpoisoned());
        }
        let readable = revents & !libc::POLLOUT != 0;
        let Some(r) = reader.as_mut().filter(|_| readable) else {
            continue;
        };
        let n = match r.read(&mut buf) {
            Ok(n) if n > 0 => n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                ) =>
            {
                continue
            }
            // EOF or a reset: the client left; the next may connect.
            // What it was not sent stays for the next.
            _ => {
                reader = None;
                replaying = false;
                client.lock().unpoisoned().client.take();
                info!("{what} socket: the client left");
                continue;
            }
        };
        let mut pending = buf.get(..n).unwrap_or_default();
        while !pending.is_empty() {
            let taken = sink(pending);
            pending = pending.get(taken..).unwrap_or_default();
            if !pending.is_empty() {
                let mut s = [pollfd(stop.as_raw_fd())];
                let ms = i32::try_from(INPUT_RETRY.as_millis()).unwrap_or(5);
                if !wait(&mut s, ms) || s.first().is_some_and(|f| f.revents != 0) {
                    return;
                }
            }
        }
    }
}

/// Accepts one client: its reading handle and its non-blocking writing
/// handle (the same socket).
fn accept(listener: &UnixListener) -> io::Result<(File, File)> {
    let (stream, _) = listener.accept()?;
    set_nonblocking(stream.as_raw_fd())?;
    let reader = File::from(OwnedFd::from(stream));
    let writer = reader.try_clone()?;
    Ok((reader, writer))
}

/// A sink that offers input to a non-blocking stream (the virtio-console
/// worker reads the other end): how much it took.
pub fn stream_sink(to: UnixStream) -> impl FnMut(&[u8]) -> usize + Send + 'static {
    let mut to = File::from(OwnedFd::from(to));
    move |bytes| to.write(bytes).unwrap_or(0)
}

mod backlog;
#[cfg(test)]
mod tests;
