//! Where the console's bytes go and come from: stdout/stdin, a pty, a
//! file (output only), or nowhere.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use log::info;

use crate::config::ConsoleConfig;
use crate::devices::pty;

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
}

/// Opens the back-end of `config`; `None` for `Off` (no device at all).
pub fn open_backend(config: &ConsoleConfig) -> io::Result<Option<Backend>> {
    let plain = |output: Box<dyn Write + Send>, input: Option<File>| Backend {
        output: Arc::new(Mutex::new(output)),
        input: input.map(Arc::new),
        input_is_pty: false,
        pty_path: None,
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
            }
        }
    }))
}
