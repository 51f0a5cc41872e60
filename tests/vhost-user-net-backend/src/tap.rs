//! A TAP interface opened through `/dev/net/tun` and configured with plain
//! ioctls, so the back-end needs no `ip` binary and no netlink crate.
//!
//! The TAP is opened with `IFF_TAP | IFF_NO_PI` and without `IFF_VNET_HDR`:
//! one `read` returns exactly one Ethernet frame and one `write` sends one,
//! with nothing in front of it (see `vnet_hdr` for why the back-end, not the
//! kernel, handles the virtio-net header). The fd is non-blocking because it
//! lives in the back-end's epoll loop, which must never sleep in a `read`.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use libc::{c_char, c_short, c_ulong};
use thiserror::Error;

// libc spells the IFF_* interface flags and the AF_* families as c_int,
// while `ifreq.ifr_flags` is a short and `sa_family_t` a u16; every value
// used here is below 0x8000, so the narrowing keeps it whole.
#[allow(clippy::cast_possible_truncation)]
const TAP_FLAGS: c_short = (libc::IFF_TAP | libc::IFF_NO_PI) as c_short;
#[allow(clippy::cast_possible_truncation)]
const IFF_UP: c_short = libc::IFF_UP as c_short;
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
const AF_INET: libc::sa_family_t = libc::AF_INET as libc::sa_family_t;

/// Errors while creating or configuring the TAP interface.
#[derive(Debug, Error)]
pub enum TapError {
    /// The name cannot be an interface name (empty, too long, or containing
    /// a byte the kernel would reject or misread).
    #[error("invalid interface name {0:?}: 1-15 bytes, no '/', NUL or whitespace")]
    InvalidName(String),
    #[error("cannot open /dev/net/tun: {0}")]
    OpenTun(#[source] io::Error),
    #[error("TUNSETIFF for {name}: {err}")]
    SetIff {
        name: String,
        #[source]
        err: io::Error,
    },
    #[error("cannot create the AF_INET socket for interface ioctls: {0}")]
    Socket(#[source] io::Error),
    #[error("{op} on {name}: {err}")]
    Ioctl {
        op: &'static str,
        name: String,
        #[source]
        err: io::Error,
    },
    #[error("cannot duplicate the descriptor of {name}: {err}")]
    Dup {
        name: String,
        #[source]
        err: io::Error,
    },
}

/// An open TAP interface. Dropping it closes the fd, which removes the
/// (non-persistent) interface again.
#[derive(Debug)]
pub struct Tap {
    file: File,
    name: String,
}

impl Tap {
    /// Creates the TAP interface `name` (or attaches to an existing,
    /// unowned one of that name) in non-blocking mode.
    pub fn open(name: &str) -> Result<Self, TapError> {
        let mut ifr = ifreq_for(name)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(TapError::OpenTun)?;
        // Writing a `Copy` union field is safe; only reading needs `unsafe`.
        ifr.ifr_ifru.ifru_flags = TAP_FLAGS;
        // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, and `ifr` is
        // a valid, exclusively borrowed one for the duration of the call.
        let ret = unsafe { libc::ioctl(file.as_raw_fd(), libc::TUNSETIFF as _, &mut ifr) };
        if ret < 0 {
            return Err(TapError::SetIff {
                name: name.to_owned(),
                err: io::Error::last_os_error(),
            });
        }
        Ok(Tap {
            file,
            // The kernel may rewrite the name (e.g. for "tap%d"); report what
            // it actually created.
            name: name_from_ifreq(&ifr),
        })
    }

    /// The interface name the kernel assigned.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Another descriptor of the same queue: a session gets one to use
    /// and close, while the first keeps the interface (and its address)
    /// alive for the next session.
    pub fn try_clone(&self) -> Result<Self, TapError> {
        let file = self.file.try_clone().map_err(|err| TapError::Dup {
            name: self.name.clone(),
            err,
        })?;
        Ok(Tap {
            file,
            name: self.name.clone(),
        })
    }

    /// Assigns an IPv4 address and netmask, so the host side of the test
    /// link is reachable without an external `ip` command.
    pub fn set_ipv4(&self, addr: Ipv4Addr, mask: Ipv4Addr) -> Result<(), TapError> {
        let sock = inet_socket()?;
        let mut ifr = ifreq_for(&self.name)?;
        ifr.ifr_ifru.ifru_addr = sockaddr_from_ipv4(addr);
        self.ioctl(&sock, libc::SIOCSIFADDR, "SIOCSIFADDR", &mut ifr)?;
        let mut ifr = ifreq_for(&self.name)?;
        ifr.ifr_ifru.ifru_netmask = sockaddr_from_ipv4(mask);
        self.ioctl(&sock, libc::SIOCSIFNETMASK, "SIOCSIFNETMASK", &mut ifr)
    }

    /// Sets `IFF_UP`, keeping whatever other flags the interface has.
    pub fn bring_up(&self) -> Result<(), TapError> {
        let sock = inet_socket()?;
        let mut ifr = ifreq_for(&self.name)?;
        self.ioctl(&sock, libc::SIOCGIFFLAGS, "SIOCGIFFLAGS", &mut ifr)?;
        // SAFETY: SIOCGIFFLAGS succeeded, so the kernel filled `ifru_flags`.
        let flags = unsafe { ifr.ifr_ifru.ifru_flags };
        ifr.ifr_ifru.ifru_flags = flags | IFF_UP;
        self.ioctl(&sock, libc::SIOCSIFFLAGS, "SIOCSIFFLAGS", &mut ifr)
    }

    /// Reads one frame; `WouldBlock` means the TAP has nothing queued.
    pub fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&self.file).read(buf)
    }

    /// Writes one frame; `WouldBlock` means the TAP's queue is full.
    pub fn write_frame(&self, frame: &[u8]) -> io::Result<usize> {
        (&self.file).write(frame)
    }

    fn ioctl(
        &self,
        sock: &OwnedFd,
        request: c_ulong,
        op: &'static str,
        ifr: &mut libc::ifreq,
    ) -> Result<(), TapError> {
        // SAFETY: every request used here reads and/or writes one
        // `struct ifreq`, and `ifr` is a valid, exclusively borrowed one.
        let ret = unsafe { libc::ioctl(sock.as_raw_fd(), request as _, ifr as *mut libc::ifreq) };
        if ret < 0 {
            return Err(TapError::Ioctl {
                op,
                name: self.name.clone(),
                err: io::Error::last_os_error(),
            });
        }
        Ok(())
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

/// A zeroed `ifreq` carrying `name`, after checking that the kernel would
/// accept the name (it must fit with its NUL in `IFNAMSIZ` bytes).
fn ifreq_for(name: &str) -> Result<libc::ifreq, TapError> {
    let bytes = name.as_bytes();
    let valid = !bytes.is_empty()
        && bytes.len() < libc::IFNAMSIZ
        && !bytes
            .iter()
            .any(|&b| b == b'/' || b == 0 || b.is_ascii_whitespace());
    if !valid {
        return Err(TapError::InvalidName(name.to_owned()));
    }
    // SAFETY: `ifreq` is plain data (arrays, integers and a union of such),
    // for which all-zero bytes are a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, &src) in ifr.ifr_name.iter_mut().zip(bytes) {
        *dst = c_char::from_ne_bytes([src]);
    }
    Ok(ifr)
}

/// The NUL-terminated name in an `ifreq` (lossy, since the kernel only
/// hands back what we or it wrote: ASCII in practice).
fn name_from_ifreq(ifr: &libc::ifreq) -> String {
    let bytes: Vec<u8> = ifr
        .ifr_name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c.to_ne_bytes()[0])
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A `struct sockaddr` holding an AF_INET address, built field by field
/// (port 0, then the address in network order) rather than by casting a
/// `sockaddr_in`, so no layout assumption needs `unsafe`.
fn sockaddr_from_ipv4(addr: Ipv4Addr) -> libc::sockaddr {
    let mut sa_data = [0 as c_char; 14];
    for (dst, src) in sa_data[2..6].iter_mut().zip(addr.octets()) {
        *dst = c_char::from_ne_bytes([src]);
    }
    libc::sockaddr {
        sa_family: AF_INET,
        sa_data,
    }
}

/// A datagram socket: the interface ioctls need some AF_INET socket to be
/// issued on, and the TAP fd itself does not accept them.
fn inet_socket() -> Result<OwnedFd, TapError> {
    // SAFETY: plain syscall with constant arguments.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(TapError::Socket(io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by socket() and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_are_validated() {
        assert!(ifreq_for("vutn0").is_ok());
        assert!(ifreq_for("a23456789012345").is_ok());
        for bad in ["", "a234567890123456", "a/b", "a b", "a\0b"] {
            assert!(ifreq_for(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn ifreq_name_round_trips() {
        let ifr = ifreq_for("vutn0").unwrap();
        assert_eq!(name_from_ifreq(&ifr), "vutn0");
    }

    #[test]
    fn sockaddr_holds_address_in_network_order() {
        let sa = sockaddr_from_ipv4(Ipv4Addr::new(10, 77, 0, 1));
        assert_eq!(sa.sa_family, AF_INET);
        let data: Vec<u8> = sa.sa_data.iter().map(|&c| c.to_ne_bytes()[0]).collect();
        assert_eq!(&data[..6], &[0, 0, 10, 77, 0, 1]);
        assert!(data[6..].iter().all(|&b| b == 0));
    }
}
