//! COM1: a 16550A from vm-superio whose interrupt is an eventfd wired to
//! GSI 4 through a KVM irqfd, so raising it costs no ioctl.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::thread;

use log::{debug, warn};
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use virtio_iommu::locks::Unpoison;

use super::bus::BusDevice;
use crate::sandbox::{self, ThreadKind};

/// Raises the serial interrupt by signalling an irqfd.
pub struct EventFdTrigger(EventFd);

impl EventFdTrigger {
    /// Wraps `fd`.
    pub fn new(fd: EventFd) -> Self {
        Self(fd)
    }
}

impl Trigger for EventFdTrigger {
    type E = io::Error;
    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// The UART plus where its output goes.
pub struct SerialDevice {
    uart: Serial<EventFdTrigger, vm_superio::serial::NoEvents, Box<dyn Write + Send>>,
}

impl SerialDevice {
    /// A UART raising `irq` and writing transmitted bytes to `out`.
    pub fn new(irq: EventFd, out: Box<dyn Write + Send>) -> Self {
        Self {
            uart: Serial::new(EventFdTrigger::new(irq), out),
        }
    }

    /// Queues guest input; returns how many bytes fitted in the FIFO.
    pub fn enqueue_input(&mut self, bytes: &[u8]) -> usize {
        match self.uart.enqueue_raw_bytes(bytes) {
            Ok(n) => n,
            Err(e) => {
                debug!("serial input dropped: {e:?}");
                0
            }
        }
    }

    /// Flushes pending output.
    pub fn flush(&mut self) {
        let _ = self.uart.writer_mut().flush();
    }
}

impl BusDevice for SerialDevice {
    fn read(&mut self, _base: u64, offset: u64, data: &mut [u8]) {
        if let (Some(first), Ok(off)) = (data.first_mut(), u8::try_from(offset)) {
            *first = self.uart.read(off);
        }
    }

    fn write(&mut self, _base: u64, offset: u64, data: &[u8]) {
        if let (Some(&value), Ok(off)) = (data.first(), u8::try_from(offset)) {
            if let Err(e) = self.uart.write(off, value) {
                warn!("serial write failed: {e:?}");
            }
        }
    }
}

/// The thread that feeds stdin to the UART, until EOF or until the VM's
/// teardown stops it ([`StdinReader::stop`]).
pub struct StdinReader {
    stop: EventFd,
    handle: thread::JoinHandle<()>,
}

impl StdinReader {
    /// Ends the thread and joins it. WHY it can be stopped: a VM torn
    /// down in a VMM that goes on (`vm.shutdown`, a reboot in place) must
    /// not leave a reader that would feed the next VM's keystrokes to the
    /// old UART, or two readers sharing stdin.
    pub fn stop(self) {
        if let Err(e) = self.stop.write(1) {
            warn!("serial: cannot stop the stdin reader: {e}");
            return;
        }
        if self.handle.join().is_err() {
            warn!("serial: the stdin reader panicked");
        }
    }
}

/// Feeds stdin to the UART from a background thread until EOF or
/// [`StdinReader::stop`].
pub fn spawn_stdin_reader(serial: Arc<Mutex<SerialDevice>>) -> io::Result<StdinReader> {
    spawn_reader(io::stdin(), "serial-stdin", false, uart_sink(serial))
}

/// Feeds a pty master's input (a client's keystrokes) to the UART. The
/// thread outlives clients: with none, it waits for the next.
pub fn spawn_pty_reader(
    master: std::fs::File,
    serial: Arc<Mutex<SerialDevice>>,
) -> io::Result<StdinReader> {
    spawn_reader(master, "serial-pty", true, uart_sink(serial))
}

/// Input to the UART's receive FIFO: how many bytes fitted.
pub fn uart_sink(serial: Arc<Mutex<SerialDevice>>) -> impl FnMut(&[u8]) -> usize + Send + 'static {
    move |bytes| serial.lock().unpoisoned().enqueue_input(bytes)
}

/// How long a pty reader waits before looking again for a client.
const NO_CLIENT_WAIT_MS: libc::c_int = 100;

/// Reads `input` from a background thread and offers what arrives to
/// `sink` (which returns how much it took) until EOF or
/// [`StdinReader::stop`]. With `pty`, a hung-up or absent client (the
/// master polls as hung up and reads EIO) is waited out instead of being
/// an end.
pub(crate) fn spawn_reader<R, S>(
    mut input: R,
    name: &str,
    pty: bool,
    mut sink: S,
) -> io::Result<StdinReader>
where
    R: Read + AsRawFd + Send + 'static,
    S: FnMut(&[u8]) -> usize + Send + 'static,
{
    let stop = EventFd::new(libc::EFD_NONBLOCK)?;
    let stopped = stop.try_clone()?;
    let handle = sandbox::spawn(ThreadKind::Serial, name, move || {
        let mut buf = [0u8; 64];
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: input.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: stopped.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: `fds` is a valid array of two pollfd for the call.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if r < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            if fds[1].revents != 0 {
                return;
            }
            let n = match input.read(&mut buf) {
                Ok(n) if n > 0 => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if pty && e.kind() == io::ErrorKind::WouldBlock => continue,
                Ok(_) | Err(_) if pty => {
                    if wait_stop(&stopped, NO_CLIENT_WAIT_MS) {
                        return;
                    }
                    continue;
                }
                Ok(_) | Err(_) => return,
            };
            let mut pending = buf.get(..n).unwrap_or_default();
            while !pending.is_empty() {
                let taken = sink(pending);
                pending = pending.get(taken..).unwrap_or_default();
                if !pending.is_empty() {
                    // FIFO full: let the guest drain it (or stop).
                    if wait_stop(&stopped, 5) {
                        return;
                    }
                }
            }
        }
    })?;
    Ok(StdinReader { stop, handle })
}

/// Waits up to `ms` for `stop`; true when it was signalled.
fn wait_stop(stop: &EventFd, ms: libc::c_int) -> bool {
    let mut fd = libc::pollfd {
        fd: stop.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `fd` is one valid pollfd for the call.
    let r = unsafe { libc::poll(&mut fd, 1, ms) };
    r > 0 && fd.revents != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    #[derive(Clone, Default)]
    struct SharedBuf(Arc<Mutex<Vec<u8>>>);

    impl Write for SharedBuf {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn output_and_input_through_registers() {
        let out = SharedBuf::default();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let irq_probe = irq.try_clone().unwrap();
        let mut dev = SerialDevice::new(irq, Box::new(out.clone()));
        dev.write(0x3f8, 0, b"h");
        dev.write(0x3f8, 0, b"i");
        assert_eq!(out.0.lock().unwrap().as_slice(), b"hi");
        // Enable the received-data interrupt, then receive a byte.
        dev.write(0x3f8, 1, &[0x1]);
        assert_eq!(dev.enqueue_input(b"x"), 1);
        assert!(irq_probe.read().unwrap() >= 1);
        let mut lsr = [0u8];
        dev.read(0x3f8, 5, &mut lsr);
        assert_ne!(lsr[0] & 1, 0, "data ready");
        let mut rx = [0u8];
        dev.read(0x3f8, 0, &mut rx);
        assert_eq!(rx[0], b'x');
    }

    #[test]
    fn the_reader_feeds_input_and_stops_while_its_input_is_silent() {
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let dev = Arc::new(Mutex::new(SerialDevice::new(
            irq,
            Box::new(SharedBuf::default()),
        )));
        let (rd, mut wr) = UnixStream::pair().unwrap();
        let reader = spawn_reader(rd, "t", false, uart_sink(dev.clone())).unwrap();
        wr.write_all(b"k").unwrap();
        let t0 = std::time::Instant::now();
        loop {
            let mut lsr = [0u8];
            dev.lock().unwrap().read(0x3f8, 5, &mut lsr);
            if lsr[0] & 1 != 0 {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "input not fed");
            thread::sleep(Duration::from_millis(1));
        }
        // Nothing more arrives and the writer stays open: only the stop
        // can end the thread, which then lets go of the UART.
        assert_eq!(Arc::strong_count(&dev), 2);
        reader.stop();
        assert_eq!(Arc::strong_count(&dev), 1, "the thread ended");
        drop(wr);
    }

    #[test]
    fn a_pty_client_sees_the_guest_output_and_types_to_it() {
        use std::os::unix::fs::OpenOptionsExt;
        let pty = super::super::pty::open().unwrap();
        let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let dev = Arc::new(Mutex::new(SerialDevice::new(
            irq,
            Box::new(pty.writer().unwrap()),
        )));
        // Output before any client: dropped or buffered, never blocking.
        dev.lock().unwrap().write(0x3f8, 0, b"-");
        let reader = spawn_pty_reader(pty.reader().unwrap(), dev.clone()).unwrap();
        // The reader waits out the time without a client.
        thread::sleep(Duration::from_millis(150));
        let mut slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(pty.path())
            .unwrap();
        for &b in b"OK\n" {
            dev.lock().unwrap().write(0x3f8, 0, &[b]);
        }
        let mut seen = Vec::new();
        while !seen.ends_with(b"OK\n") {
            let mut b = [0u8; 16];
            let n = slave.read(&mut b).unwrap();
            seen.extend_from_slice(&b[..n]);
        }
        slave.write_all(b"q").unwrap();
        let t0 = std::time::Instant::now();
        loop {
            let mut lsr = [0u8];
            dev.lock().unwrap().read(0x3f8, 5, &mut lsr);
            if lsr[0] & 1 != 0 {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "input not fed");
            thread::sleep(Duration::from_millis(1));
        }
        let mut rx = [0u8];
        dev.lock().unwrap().read(0x3f8, 0, &mut rx);
        assert_eq!(rx[0], b'q');
        // The client goes; the reader keeps waiting until stopped.
        drop(slave);
        thread::sleep(Duration::from_millis(150));
        assert_eq!(Arc::strong_count(&dev), 2);
        reader.stop();
        assert_eq!(Arc::strong_count(&dev), 1, "the thread ended");
    }
}
