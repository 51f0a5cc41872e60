//! Where the console's bytes go and come from: stdout/stdin, a pty, a
//! UNIX socket, a file (output only), or nowhere.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use log::info;

use crate::config::ConsoleConfig;
use crate::devices::pty;
use crate::devices::socket_console::{stream_sink, SocketConsole};

/// An opened back-end. WHY shared handles: it outlives activations (the
/// driver may reset and restart the device; the pty a client holds stays
/// the same).
pub struct Backend {
    /// Guest output.
    pub output: Arc<Mutex<Box<dyn Write + Send>>>,
    /// Host input, if any (non-blocking for a pty).
    pub input: Option<Arc<File>>,
    /// The input is a pty master: a hang-up means "no client yet", not
    /// the end.
    pub input_is_pty: bool,
    /// The slave path of a pty back-end.
    pub pty_path: Option<PathBuf>,
    /// A socket back-end: dropped with the device, which stops its thread
    /// and removes its file.
    pub socket: Option<SocketConsole>,
}

/// Opens the back-end of `config`; `None` for `Off` (no device at all).
pub fn open_backend(config: &ConsoleConfig) -> io::Result<Option<Backend>> {
    let plain = |output: Box<dyn Write + Send>, input: Option<File>| Backend {
        output: Arc::new(Mutex::new(output)),
        input: input.map(Arc::new),
        input_is_pty: false,
        pty_path: None,
        socket: None,
    };
    Ok(Some(match config {
        ConsoleConfig::Off => return Ok(None),
        ConsoleConfig::Null => plain(Box::new(io::sink()), None),
        ConsoleConfig::Tty => {
            let stdin = File::from(io::stdin().as_fd().try_clone_to_owned()?);
            plain(Box::new(io::stdout()), Some(stdin))
        }
        ConsoleConfig::File(path) => plain(
            Box::new(OpenOptions::new().create(true).append(true).open(path)?),
            None,
        ),
        ConsoleConfig::Pty(_) => {
            let p = pty::open()?;
            info!("virtio-console: pty {}", p.path().display());
            Backend {
                output: Arc::new(Mutex::new(Box::new(p.writer()?))),
                input: Some(Arc::new(p.reader()?)),
                input_is_pty: true,
                pty_path: Some(p.path().to_path_buf()),
                socket: None,
            }
        }
        ConsoleConfig::Socket(path) => socket_backend(path)?,
    }))
}

/// A socket back-end. WHY a socket pair between its thread and the
/// worker: the worker polls one input descriptor whatever the back-end,
/// and the socket's clients come and go; the pair stays. Its thread's end
/// is non-blocking, so input the guest does not take waits in the
/// thread (bounded by the pair's buffer) rather than blocking it.
fn socket_backend(path: &std::path::Path) -> io::Result<Backend> {
    let mut socket = SocketConsole::bind(path, "console").map_err(io::Error::other)?;
    let (to_worker, worker_end) = UnixStream::pair()?;
    to_worker.set_nonblocking(true)?;
    socket
        .start("console-socket", stream_sink(to_worker))
        .map_err(io::Error::other)?;
    Ok(Backend {
        output: Arc::new(Mutex::new(Box::new(socket.writer()))),
        input: Some(Arc::new(File::from(OwnedFd::from(worker_end)))),
        input_is_pty: false,
        pty_path: None,
        socket: Some(socket),
    })
}
