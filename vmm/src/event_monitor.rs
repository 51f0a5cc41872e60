//! `--event-monitor path=FILE|fd=N`: cloud-hypervisor's stream of JSON
//! lifecycle events, for management stacks (libvirt's ch driver reads it
//! from a FIFO and stops its domain on `vmm`/`shutdown`).
//!
//! Each event is one JSON object, `{"timestamp": {"secs", "nanos"},
//! "source", "event", "properties"}` (time since the VMM started;
//! `properties` an object of strings or `null`), followed by a blank line.
//! Readers split the stream on balanced braces, so objects are written
//! whole.
//!
//! WHY events are written by the thread that emits them, under a lock,
//! to a non-blocking descriptor: every thread kind may already `write`
//! (the seccomp runtime set), so no thread and no new allow-list entry is
//! needed; a reader that stops reading costs the VMM dropped events
//! (logged), never a stalled vCPU or API worker. An event is far smaller
//! than `PIPE_BUF`, so a write to a FIFO is all or nothing.
//!
//! WHY a FIFO is opened read-write: libvirt starts the VMM and only then
//! opens the FIFO for reading. A write-only open blocks until a reader
//! comes (cloud-hypervisor's way: a VMM started without its reader never
//! serves its API) and a non-blocking one fails with ENXIO. Holding both
//! ends never blocks, keeps the events emitted before the reader arrived in
//! the pipe, and lets the reader's own blocking open return at once.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use log::{debug, info, warn};
use serde::Serialize;

use virtio_iommu::locks::Unpoison;

use crate::error::{Error, OptionReason};
use crate::options::parse_options;

/// Where events go (`--event-monitor`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventMonitorTarget {
    /// A file (created or truncated) or a FIFO (opened without waiting
    /// for its reader).
    Path(PathBuf),
    /// A descriptor inherited from the parent (a pipe, usually).
    Fd(RawFd),
}

impl EventMonitorTarget {
    /// Parses `--event-monitor path=FILE` or `fd=N`.
    pub fn parse(value: &str) -> Result<Self, Error> {
        let bad = |reason: OptionReason| Error::InvalidOption {
            option: "event-monitor",
            value: value.to_string(),
            reason,
        };
        let opts = parse_options("event-monitor", value, &["path", "fd"])?;
        match (opts.get("path"), opts.get("fd")) {
            (Some(p), None) if !p.is_empty() => Ok(Self::Path(p.into())),
            (None, Some(fd)) => fd
                .parse::<RawFd>()
                .ok()
                .filter(|fd| *fd >= 0)
                .map(Self::Fd)
                .ok_or_else(|| bad(format!("fd={fd}: not a file descriptor number").into())),
            _ => Err(bad("give exactly one of path= and fd=".into())),
        }
    }

    /// Opens the target for writing, without waiting for a FIFO's reader.
    pub fn open(&self) -> io::Result<File> {
        let file = match self {
            Self::Path(p) => {
                let is_fifo = std::fs::metadata(p)
                    .map(|m| m.file_type().is_fifo())
                    .unwrap_or(false);
                let mut o = OpenOptions::new();
                o.custom_flags(libc::O_CLOEXEC);
                if is_fifo {
                    o.read(true).write(true).custom_flags(libc::O_NONBLOCK);
                } else {
                    o.write(true).create(true).truncate(true);
                }
                o.open(p)?
            }
            Self::Fd(fd) => {
                // SAFETY: F_GETFD only reads the descriptor's flags; a
                // number that is not an open descriptor fails with EBADF.
                if unsafe { libc::fcntl(*fd, libc::F_GETFD) } < 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: the descriptor is open (checked above) and was
                // handed to this process for the event stream alone: the
                // monitor becomes its only owner.
                unsafe { File::from_raw_fd(*fd) }
            }
        };
        set_nonblocking(&file)?;
        Ok(file)
    }
}

fn set_nonblocking(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: F_GETFL/F_SETFL on a descriptor `file` owns; only the
    // status flags change.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

struct Monitor {
    start: Instant,
    out: Mutex<Box<dyn Write + Send>>,
}

static MONITOR: OnceLock<Monitor> = OnceLock::new();

#[derive(Serialize)]
struct Event<'a> {
    timestamp: Duration,
    source: &'a str,
    event: &'a str,
    properties: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Installs the process's event stream; later calls are refused (there is
/// one stream per VMM, installed by `main` before any thread starts).
pub fn install(out: Box<dyn Write + Send>) -> Result<(), Box<dyn Write + Send>> {
    MONITOR
        .set(Monitor {
            start: Instant::now(),
            out: Mutex::new(out),
        })
        .map_err(|m| m.out.into_inner().unpoisoned())
}

/// The text of one event, as written to the stream.
fn render(
    elapsed: Duration,
    source: &str,
    event: &str,
    properties: &[(&str, &str)],
) -> Option<String> {
    let properties = (!properties.is_empty()).then(|| {
        properties
            .iter()
            .map(|(k, v)| ((*k).to_string(), serde_json::Value::from(*v)))
            .collect()
    });
    let e = Event {
        timestamp: elapsed,
        source,
        event,
        properties,
    };
    serde_json::to_string_pretty(&e)
        .ok()
        .map(|text| text + "\n\n")
}

/// Reports a lifecycle event (`source` "vmm" or "vm", `event` e.g.
/// "booted", `properties` e.g. `[("id", "nic0")]`) on the stream, if
/// `--event-monitor` asked for one. Never blocks and never fails: a full
/// or closed stream loses the event.
pub fn emit(source: &str, event: &str, properties: &[(&str, &str)]) {
    info!("event: {source} {event} {properties:?}");
    let Some(m) = MONITOR.get() else {
        return;
    };
    let Some(text) = render(m.start.elapsed(), source, event, properties) else {
        return;
    };
    let mut out = m.out.lock().unpoisoned();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            warn!("event monitor: the reader is not reading; {source} {event} dropped")
        }
        Err(e) => debug!("event monitor: {source} {event} not written: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_as_cloud_hypervisor_spells_them() {
        assert_eq!(
            EventMonitorTarget::parse("path=/run/ev").unwrap(),
            EventMonitorTarget::Path("/run/ev".into())
        );
        assert_eq!(
            EventMonitorTarget::parse("fd=7").unwrap(),
            EventMonitorTarget::Fd(7)
        );
        for bad in ["", "fd=-1", "fd=x", "path=", "path=/a,fd=3", "file=/a"] {
            assert!(EventMonitorTarget::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_event_is_cloud_hypervisors_json_object() {
        let text = render(
            Duration::new(3, 25),
            "vm",
            "device-removed",
            &[("id", "nic0")],
        )
        .unwrap();
        assert!(text.ends_with("}\n\n"), "{text:?}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "timestamp": {"secs": 3, "nanos": 25},
                "source": "vm",
                "event": "device-removed",
                "properties": {"id": "nic0"},
            })
        );
        let v: serde_json::Value =
            serde_json::from_str(&render(Duration::ZERO, "vmm", "starting", &[]).unwrap()).unwrap();
        assert_eq!(v["properties"], serde_json::Value::Null);
    }

    #[test]
    fn a_fifo_opens_before_its_reader_and_keeps_the_events() {
        let dir = std::env::temp_dir().join(format!("dmavisor-evfifo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("events");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // No reader: this must return, not block.
        let mut w = EventMonitorTarget::Path(fifo.clone()).open().unwrap();
        w.write_all(b"{\"a\":1}").unwrap();
        // The reader's blocking open returns at once, and sees what came
        // before it.
        let mut r = File::open(&fifo).unwrap();
        let mut buf = [0u8; 16];
        let n = std::io::Read::read(&mut r, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"{\"a\":1}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_regular_file_is_truncated() {
        let path = std::env::temp_dir().join(format!("dmavisor-evfile-{}", std::process::id()));
        std::fs::write(&path, b"old contents").unwrap();
        let mut w = EventMonitorTarget::Path(path.clone()).open().unwrap();
        w.write_all(b"{}").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"{}");
        let _ = std::fs::remove_file(&path);
        assert!(EventMonitorTarget::Fd(9999).open().is_err());
    }
}
