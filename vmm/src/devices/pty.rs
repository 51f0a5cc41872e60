//! A pseudo-terminal pair for a guest console (`Pty` mode): the VMM keeps
//! the master, a client (`virsh console`, `screen`) opens the slave whose
//! path `vm.info` reports.
//!
//! WHY the ioctls rather than `posix_openpt`/`grantpt`/`unlockpt`/
//! `ptsname`: on Linux those wrappers come down to opening `/dev/ptmx`
//! and the `TIOCSPTLCK` and `TIOCGPTN` ioctls (devpts gives the slave to
//! the opener's user, so `grantpt` has nothing to do); calling them
//! directly keeps the system calls the seccomp lists must allow exact.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The master of a pseudo-terminal and the path of its slave.
#[derive(Debug)]
pub struct Pty {
    master: File,
    path: PathBuf,
}

/// Opens a new pseudo-terminal: master non-blocking, line discipline raw
/// so the guest's bytes reach the client unchanged (no CR/LF rewriting,
/// no echo back into the guest).
pub fn open() -> io::Result<Pty> {
    let master = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/ptmx")?;
    let fd = master.as_raw_fd();
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one c_int from a valid pointer.
    if unsafe { libc::ioctl(fd, libc::TIOCSPTLCK, &unlock) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut number: libc::c_uint = 0;
    // SAFETY: TIOCGPTN writes one c_uint to a valid pointer.
    if unsafe { libc::ioctl(fd, libc::TIOCGPTN, &mut number) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: termios is plain data; tcgetattr fills it before use.
    let mut tio: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open and `tio` a valid termios.
    if unsafe { libc::tcgetattr(fd, &mut tio) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `tio` is a valid termios.
    unsafe { libc::cfmakeraw(&mut tio) };
    // SAFETY: `fd` is open and `tio` a valid termios. On Linux the
    // settings of the pair are the slave's, whichever end sets them.
    if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &tio) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Pty {
        master,
        path: PathBuf::from(format!("/dev/pts/{number}")),
    })
}

impl Pty {
    /// The slave's path (`/dev/pts/N`).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the guest's output goes.
    pub fn writer(&self) -> io::Result<PtyWriter> {
        Ok(PtyWriter(self.master.try_clone()?))
    }

    /// The master again, for the thread reading the client's input.
    pub fn reader(&self) -> io::Result<File> {
        self.master.try_clone()
    }
}

/// Guest output to the master. WHY it never fails nor blocks: it runs on
/// the vCPU (the UART's transmit register) or a console worker; with no
/// client, or a client that does not read, the pty's buffer fills and the
/// bytes are dropped as a disconnected serial line drops them.
pub struct PtyWriter(File);

impl Write for PtyWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.0.write(buf) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Err(e),
            // EAGAIN (full) or EIO (no slave ever opened, or hung up).
            Err(_) => Ok(buf.len()),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn bytes_pass_unchanged_both_ways() {
        let pty = open().unwrap();
        assert!(pty.path().starts_with("/dev/pts"));
        let mut slave = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(pty.path())
            .unwrap();
        let mut w = pty.writer().unwrap();
        // Raw: "\n" is not turned into "\r\n".
        w.write_all(b"a\nb").unwrap();
        let mut got = [0u8; 3];
        slave.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"a\nb");
        slave.write_all(b"x\r").unwrap();
        let mut master = pty.reader().unwrap();
        let mut back = Vec::new();
        let t0 = std::time::Instant::now();
        while back.len() < 2 {
            let mut b = [0u8; 8];
            match master.read(&mut b) {
                Ok(n) => back.extend_from_slice(&b[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(t0.elapsed().as_secs() < 5, "no input");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(back, b"x\r", "no echo, no CR translation");
    }

    #[test]
    fn output_without_a_client_never_blocks() {
        let pty = open().unwrap();
        let mut w = pty.writer().unwrap();
        let t0 = std::time::Instant::now();
        // Far more than a pty buffers.
        for _ in 0..1024 {
            w.write_all(&[b'z'; 1024]).unwrap();
        }
        assert!(t0.elapsed().as_secs() < 5);
    }
}
