//! A TAP interface opened through /dev/net/tun, configured with ioctls.
//!
//! WHY ioctls and not `ip`: the VMM must not depend on (or be confused by)
//! whatever tools the host has, and errors must name the exact step.
//!
//! The interface carries a 12-byte virtio-net header in front of every
//! frame (IFF_VNET_HDR + TUNSETVNETHDRSZ), the same `virtio_net_hdr_v1`
//! the guest uses, so frames move between the ring and the TAP without
//! rewriting; TUNSETOFFLOAD tells the kernel which offloads (checksum,
//! TSO) the guest accepts on receive.

use std::fs::{File, OpenOptions};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use thiserror::Error;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
const TUNSETQUEUE: libc::c_ulong = 0x4004_54d9;
const IFF_ATTACH_QUEUE: u16 = 0x0200;
const IFF_DETACH_QUEUE: u16 = 0x0400;
const IFF_TAP: u16 = 0x0002;
const IFF_NO_PI: u16 = 0x1000;
const IFF_VNET_HDR: u16 = 0x4000;
const IFF_MULTI_QUEUE: u16 = 0x0100;
const IFNAMSIZ: usize = 16;
const IFREQ_SIZE: usize = 40;

/// TUNSETOFFLOAD: the reader accepts partial checksums.
pub const TUN_F_CSUM: u32 = 0x01;
/// TUNSETOFFLOAD: the reader accepts TCPv4 segmentation offload frames.
pub const TUN_F_TSO4: u32 = 0x02;
/// TUNSETOFFLOAD: the reader accepts TCPv6 segmentation offload frames.
pub const TUN_F_TSO6: u32 = 0x04;
/// TUNSETOFFLOAD: TSO frames may have ECN set.
pub const TUN_F_TSO_ECN: u32 = 0x08;

/// Size of the virtio-net header on the TAP (virtio 1.x header).
pub const VNET_HDR_LEN: usize = 12;

/// Errors while setting up a TAP interface.
#[derive(Debug, Error)]
pub enum TapError {
    /// The interface name is too long or contains a NUL.
    #[error("invalid TAP name '{0}' (at most 15 bytes)")]
    Name(String),
    /// Opening /dev/net/tun failed.
    #[error("open /dev/net/tun: {0}")]
    Open(io::Error),
    /// An ioctl failed.
    #[error("TAP '{name}': {what}: {source}")]
    Ioctl {
        /// Interface name.
        name: String,
        /// The step.
        what: &'static str,
        /// errno.
        source: io::Error,
    },
}

/// An ifreq buffer: name in the first 16 bytes, the union after it.
struct IfReq([u8; IFREQ_SIZE]);

impl IfReq {
    fn new(name: &str) -> Self {
        let mut b = [0u8; IFREQ_SIZE];
        let n = name.len().min(IFNAMSIZ - 1);
        b[..n].copy_from_slice(&name.as_bytes()[..n]);
        Self(b)
    }

    fn set_short(&mut self, v: u16) {
        self.0[IFNAMSIZ..IFNAMSIZ + 2].copy_from_slice(&v.to_ne_bytes());
    }

    fn short(&self) -> u16 {
        u16::from_ne_bytes([self.0[IFNAMSIZ], self.0[IFNAMSIZ + 1]])
    }

    fn set_inet(&mut self, addr: Ipv4Addr) {
        // struct sockaddr_in: family, port, address, zero padding.
        let sa = &mut self.0[IFNAMSIZ..IFNAMSIZ + 16];
        sa.fill(0);
        sa[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        sa[4..8].copy_from_slice(&addr.octets());
    }

    fn name(&self) -> String {
        let end = self.0[..IFNAMSIZ]
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(IFNAMSIZ);
        String::from_utf8_lossy(&self.0[..end]).into_owned()
    }
}

fn ioctl_ptr(fd: RawFd, req: libc::c_ulong, arg: *mut libc::c_void) -> io::Result<()> {
    // SAFETY: callers pass a request whose argument is the pointed-to
    // buffer (an ifreq of IFREQ_SIZE bytes or an int), valid for the call.
    let r = unsafe { libc::ioctl(fd, req as _, arg) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn ioctl_val(fd: RawFd, req: libc::c_ulong, arg: libc::c_ulong) -> io::Result<()> {
    // SAFETY: the request takes its argument by value.
    let r = unsafe { libc::ioctl(fd, req as _, arg) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// One queue of a TAP interface (a file descriptor on it).
pub struct Tap {
    file: File,
    name: String,
}

impl Tap {
    /// Opens (creating if missing) TAP `name` (empty: the kernel picks
    /// one). `multi_queue` is needed to open several queues of one device.
    pub fn open(name: &str, multi_queue: bool) -> Result<Self, TapError> {
        if name.len() >= IFNAMSIZ || name.contains('\0') {
            return Err(TapError::Name(name.into()));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(TapError::Open)?;
        let mut req = IfReq::new(name);
        let mut flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
        if multi_queue {
            flags |= IFF_MULTI_QUEUE;
        }
        req.set_short(flags);
        let err = |what| {
            move |source| TapError::Ioctl {
                name: name.to_string(),
                what,
                source,
            }
        };
        ioctl_ptr(file.as_raw_fd(), TUNSETIFF, req.0.as_mut_ptr().cast())
            .map_err(err("TUNSETIFF"))?;
        let tap = Self {
            file,
            name: req.name(),
        };
        let hdr: libc::c_int = VNET_HDR_LEN as libc::c_int;
        ioctl_ptr(
            tap.file.as_raw_fd(),
            TUNSETVNETHDRSZ,
            (&hdr as *const libc::c_int).cast_mut().cast(),
        )
        .map_err(err("TUNSETVNETHDRSZ"))?;
        Ok(tap)
    }

    /// The interface name the kernel assigned.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Which offloads frames read from the TAP may use (TUN_F_*).
    pub fn set_offload(&self, flags: u32) -> Result<(), TapError> {
        ioctl_val(
            self.file.as_raw_fd(),
            TUNSETOFFLOAD,
            libc::c_ulong::from(flags),
        )
        .map_err(|source| TapError::Ioctl {
            name: self.name.clone(),
            what: "TUNSETOFFLOAD",
            source,
        })
    }

    /// Attaches or detaches this queue of a multi-queue TAP: the kernel
    /// only steers frames to attached queues, so queues of pairs the driver
    /// does not use must be detached or their flows would stall.
    pub fn set_queue_enabled(&self, enabled: bool) -> Result<(), TapError> {
        let mut req = IfReq::new("");
        req.set_short(if enabled {
            IFF_ATTACH_QUEUE
        } else {
            IFF_DETACH_QUEUE
        });
        match ioctl_ptr(
            self.file.as_raw_fd(),
            TUNSETQUEUE,
            req.0.as_mut_ptr().cast(),
        ) {
            Ok(()) => Ok(()),
            // Already in the requested state.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(()),
            Err(source) => Err(TapError::Ioctl {
                name: self.name.clone(),
                what: "TUNSETQUEUE",
                source,
            }),
        }
    }

    /// Gives the host side of the interface `ip`/`mask` and brings it up.
    pub fn configure_host(
        &self,
        ip: Option<Ipv4Addr>,
        mask: Option<Ipv4Addr>,
    ) -> Result<(), TapError> {
        let err = |what| {
            let name = self.name.clone();
            move |source| TapError::Ioctl { name, what, source }
        };
        // SAFETY: plain socket creation; the fd is owned right away.
        let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(err("socket")(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh, valid fd nobody else owns.
        let sock = unsafe { OwnedFd::from_raw_fd(raw) };
        let fd = sock.as_raw_fd();
        if let Some(ip) = ip {
            let mut req = IfReq::new(&self.name);
            req.set_inet(ip);
            ioctl_ptr(fd, libc::SIOCSIFADDR, req.0.as_mut_ptr().cast())
                .map_err(err("SIOCSIFADDR"))?;
        }
        if let Some(mask) = mask {
            let mut req = IfReq::new(&self.name);
            req.set_inet(mask);
            ioctl_ptr(fd, libc::SIOCSIFNETMASK, req.0.as_mut_ptr().cast())
                .map_err(err("SIOCSIFNETMASK"))?;
        }
        let mut req = IfReq::new(&self.name);
        ioctl_ptr(fd, libc::SIOCGIFFLAGS, req.0.as_mut_ptr().cast())
            .map_err(err("SIOCGIFFLAGS"))?;
        let flags = req.short() | (libc::IFF_UP | libc::IFF_RUNNING) as u16;
        req.set_short(flags);
        ioctl_ptr(fd, libc::SIOCSIFFLAGS, req.0.as_mut_ptr().cast())
            .map_err(err("SIOCSIFFLAGS"))?;
        Ok(())
    }

    /// Reads one frame (with its virtio-net header) into `buf`.
    pub fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::read(self.file.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Writes one frame gathered from `iov`.
    pub fn write_iov(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        // SAFETY: every iovec points into live guest memory mappings (built
        // from VolatileSlices of the device's DmaSpace) or host buffers.
        let n = unsafe { libc::writev(self.file.as_raw_fd(), iov.as_ptr(), iov.len() as i32) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }
}

impl AsRawFd for Tap {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifreq_layout() {
        let mut r = IfReq::new("tap-test0");
        assert_eq!(r.name(), "tap-test0");
        r.set_inet(Ipv4Addr::new(192, 168, 249, 1));
        assert_eq!(&r.0[20..24], &[192, 168, 249, 1]);
        r.set_short(0x1234);
        assert_eq!(r.short(), 0x1234);
        assert!(matches!(
            Tap::open("a-very-long-tap-name", false),
            Err(TapError::Name(_))
        ));
    }
}
