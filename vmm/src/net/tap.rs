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
use vmm_sys_util::ioctl::{ioctl_with_mut_ref, ioctl_with_ref, ioctl_with_val};

use self::ioctls::{TUNGETIFF, TUNSETIFF, TUNSETOFFLOAD, TUNSETQUEUE, TUNSETVNETHDRSZ};
use crate::width::{const_i32, const_u16};

/// The TUN ioctl numbers, from `<linux/if_tun.h>`'s `_IOW('T', nr, type)`.
#[allow(non_snake_case)]
mod ioctls {
    use std::os::raw::{c_int, c_uint};

    /// The ioctl type of TUN/TAP devices.
    const TUNTAP: c_uint = b'T' as c_uint;

    vmm_sys_util::ioctl_iow_nr!(TUNSETIFF, TUNTAP, 202, c_int);
    vmm_sys_util::ioctl_iow_nr!(TUNSETOFFLOAD, TUNTAP, 208, c_uint);
    vmm_sys_util::ioctl_iow_nr!(TUNSETVNETHDRSZ, TUNTAP, 216, c_int);
    vmm_sys_util::ioctl_iow_nr!(TUNSETQUEUE, TUNTAP, 217, c_int);
    vmm_sys_util::ioctl_ior_nr!(TUNGETIFF, TUNTAP, 210, c_uint);
}

const IFF_ATTACH_QUEUE: u16 = 0x0200;
const IFF_DETACH_QUEUE: u16 = 0x0400;
const IFF_TAP: u16 = 0x0002;
const IFF_NO_PI: u16 = 0x1000;
const IFF_VNET_HDR: u16 = 0x4000;
const IFF_MULTI_QUEUE: u16 = 0x0100;
const IFNAMSIZ: usize = 16;
/// `sizeof(struct ifreq)`: the kernel copies this much whatever the request.
const IFREQ_SIZE: usize = 40;
/// libc's `int` constants in the narrower fields the kernel reads them
/// from (checked by the compiler).
const AF_INET_FAMILY: libc::sa_family_t = const_u16(libc::AF_INET as i128);
const IFF_UP_RUNNING: u16 = const_u16((libc::IFF_UP | libc::IFF_RUNNING) as i128);

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
/// [`VNET_HDR_LEN`] as the `int` TUNSETVNETHDRSZ takes.
const VNET_HDR_LEN_INT: libc::c_int = const_i32(VNET_HDR_LEN as i128);

/// Errors while setting up a TAP interface.
#[derive(Debug, Error)]
pub enum TapError {
    /// The interface name is too long or contains a NUL.
    #[error("invalid TAP name '{0}' (at most 15 bytes)")]
    Name(String),
    /// Opening /dev/net/tun failed.
    #[error("open /dev/net/tun: {0}")]
    Open(io::Error),
    /// A descriptor handed over (`vm.add-net` with `SCM_RIGHTS`) is not
    /// a TAP queue this device can drive.
    #[error("the passed file descriptor {0}")]
    NotUsable(&'static str),
    /// A kept queue (`super::passed_taps`) could not be duplicated.
    #[error("TAP '{name}': duplicating a passed queue: {source}")]
    Dup {
        /// Interface name.
        name: String,
        /// errno.
        source: io::Error,
    },
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

/// The members of `struct ifreq`'s union these ioctls use, padded to the
/// union's full size.
#[repr(C)]
#[derive(Clone, Copy)]
union IfReqData {
    /// `ifr_flags`: TUNSETIFF, TUNSETQUEUE, SIOC[GS]IFFLAGS.
    flags: libc::c_short,
    /// `ifr_addr` / `ifr_netmask`: SIOCSIFADDR, SIOCSIFNETMASK.
    addr: libc::sockaddr_in,
    /// The whole union (its largest member, `struct ifmap`, is 24 bytes
    /// on 64-bit targets).
    raw: [u8; IFREQ_SIZE - IFNAMSIZ],
}

/// `struct ifreq`: the interface name, then the request's member.
#[repr(C)]
#[derive(Clone, Copy)]
struct IfReq {
    /// `ifr_name`, NUL-terminated.
    name: [u8; IFNAMSIZ],
    /// `ifr_ifru`.
    data: IfReqData,
}

const _: () = assert!(std::mem::size_of::<IfReq>() == IFREQ_SIZE);

impl IfReq {
    /// A zeroed request for interface `name` (cut to IFNAMSIZ - 1 bytes).
    fn new(name: &str) -> Self {
        let mut req = Self {
            name: [0; IFNAMSIZ],
            data: IfReqData {
                raw: [0; IFREQ_SIZE - IFNAMSIZ],
            },
        };
        let n = name.len().min(IFNAMSIZ - 1);
        req.name[..n].copy_from_slice(&name.as_bytes()[..n]);
        req
    }

    fn set_flags(&mut self, flags: u16) {
        // The same 16 bits, as the C field's signed type.
        self.data.flags = libc::c_short::from_ne_bytes(flags.to_ne_bytes());
    }

    fn flags(&self) -> u16 {
        // SAFETY: the union was zeroed whole in `new`, so its first two
        // bytes are initialized whichever member was written since, and
        // every bit pattern is a valid c_short.
        unsafe { u16::from_ne_bytes(self.data.flags.to_ne_bytes()) }
    }

    fn set_inet(&mut self, addr: Ipv4Addr) {
        self.data.addr = libc::sockaddr_in {
            sin_family: AF_INET_FAMILY,
            sin_port: 0,
            sin_addr: libc::in_addr {
                // Network byte order: the octets as they lie in memory.
                s_addr: u32::from_ne_bytes(addr.octets()),
            },
            sin_zero: [0; 8],
        };
    }

    fn name(&self) -> String {
        let end = self.name.iter().position(|b| *b == 0).unwrap_or(IFNAMSIZ);
        String::from_utf8_lossy(&self.name[..end]).into_owned()
    }
}

/// An ioctl's return value as a result.
fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// An ioctl whose argument is a `struct ifreq` (read, and for the GET
/// requests written, by the kernel).
fn ioctl_ifreq(fd: &impl AsRawFd, req: libc::c_ulong, ifreq: &mut IfReq) -> io::Result<()> {
    // SAFETY: every request passed here takes a `struct ifreq *`; `ifreq`
    // is a live, exclusively borrowed, IFREQ_SIZE-byte `struct ifreq` for
    // the duration of the call.
    check(unsafe { ioctl_with_mut_ref(fd, req, ifreq) })
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
        req.set_flags(flags);
        let err = |what| {
            move |source| TapError::Ioctl {
                name: name.to_string(),
                what,
                source,
            }
        };
        ioctl_ifreq(&file, TUNSETIFF(), &mut req).map_err(err("TUNSETIFF"))?;
        let tap = Self {
            file,
            name: req.name(),
        };
        let hdr: libc::c_int = VNET_HDR_LEN_INT;
        // SAFETY: TUNSETVNETHDRSZ reads an `int` through its argument,
        // which `hdr` is, alive for the call.
        check(unsafe { ioctl_with_ref(&tap.file, TUNSETVNETHDRSZ(), &hdr) })
            .map_err(err("TUNSETVNETHDRSZ"))?;
        Ok(tap)
    }

    /// A queue of a TAP interface someone else opened and attached (the
    /// tap fds `ch-remote add-net fd=[..]` and libvirt pass with
    /// `SCM_RIGHTS`). WHY the checks: the workers read and write frames
    /// behind a virtio-net header, so the queue must be a TAP (not TUN)
    /// without packet information and with IFF_VNET_HDR; a descriptor that
    /// is anything else (a pipe, a file) fails TUNGETIFF and is refused.
    /// The queue is made non-blocking, as the workers expect.
    pub fn from_file(file: File) -> Result<Self, TapError> {
        let mut req = IfReq::new("");
        ioctl_ifreq(&file, TUNGETIFF(), &mut req)
            .map_err(|_| TapError::NotUsable("is not a TAP queue (TUNGETIFF failed)"))?;
        let flags = req.flags();
        if flags & IFF_TAP == 0 {
            return Err(TapError::NotUsable("is a TUN, not a TAP, queue"));
        }
        if flags & IFF_NO_PI == 0 {
            return Err(TapError::NotUsable(
                "carries packet information (no IFF_NO_PI)",
            ));
        }
        if flags & IFF_VNET_HDR == 0 {
            return Err(TapError::NotUsable(
                "has no virtio-net header (no IFF_VNET_HDR)",
            ));
        }
        let name = req.name();
        let err = |what| {
            let name = name.clone();
            move |source| TapError::Ioctl { name, what, source }
        };
        // SAFETY: F_GETFL/F_SETFL on a descriptor `file` owns; no memory
        // is passed.
        let fl = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
        check(fl).map_err(err("F_GETFL"))?;
        // SAFETY: as above.
        check(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) })
            .map_err(err("F_SETFL O_NONBLOCK"))?;
        let hdr: libc::c_int = VNET_HDR_LEN_INT;
        // SAFETY: TUNSETVNETHDRSZ reads an `int` through its argument,
        // which `hdr` is, alive for the call.
        check(unsafe { ioctl_with_ref(&file, TUNSETVNETHDRSZ(), &hdr) })
            .map_err(err("TUNSETVNETHDRSZ"))?;
        Ok(Self { file, name })
    }

    /// Whether the interface has several queues (IFF_MULTI_QUEUE).
    pub fn is_multi_queue(&self) -> bool {
        let mut req = IfReq::new("");
        ioctl_ifreq(&self.file, TUNGETIFF(), &mut req).is_ok() && req.flags() & IFF_MULTI_QUEUE != 0
    }

    /// The interface name the kernel assigned.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The queue's descriptor, to keep for later devices
    /// (`super::passed_taps`).
    pub fn into_file(self) -> File {
        self.file
    }

    /// Which offloads frames read from the TAP may use (TUN_F_*).
    pub fn set_offload(&self, flags: u32) -> Result<(), TapError> {
        // SAFETY: TUNSETOFFLOAD takes its flags by value; no memory is
        // passed.
        check(unsafe { ioctl_with_val(&self.file, TUNSETOFFLOAD(), libc::c_ulong::from(flags)) })
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
        req.set_flags(if enabled {
            IFF_ATTACH_QUEUE
        } else {
            IFF_DETACH_QUEUE
        });
        match ioctl_ifreq(&self.file, TUNSETQUEUE(), &mut req) {
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
        if let Some(ip) = ip {
            let mut req = IfReq::new(&self.name);
            req.set_inet(ip);
            ioctl_ifreq(&sock, libc::SIOCSIFADDR, &mut req).map_err(err("SIOCSIFADDR"))?;
        }
        if let Some(mask) = mask {
            let mut req = IfReq::new(&self.name);
            req.set_inet(mask);
            ioctl_ifreq(&sock, libc::SIOCSIFNETMASK, &mut req).map_err(err("SIOCSIFNETMASK"))?;
        }
        let mut req = IfReq::new(&self.name);
        ioctl_ifreq(&sock, libc::SIOCGIFFLAGS, &mut req).map_err(err("SIOCGIFFLAGS"))?;
        let flags = req.flags() | IFF_UP_RUNNING;
        req.set_flags(flags);
        ioctl_ifreq(&sock, libc::SIOCSIFFLAGS, &mut req).map_err(err("SIOCSIFFLAGS"))?;
        Ok(())
    }

    /// Reads one frame (with its virtio-net header) into `buf`.
    pub fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe { libc::read(self.file.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        // Negative: the call failed and errno says why.
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    }

    /// Reads one frame scattered over `iov`: the kernel copies it straight
    /// into the buffers (guest memory on the receive path).
    ///
    /// # Safety
    /// Every iovec must be valid for writes of its length.
    pub unsafe fn read_iov(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        let count = libc::c_int::try_from(iov.len())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: the caller guarantees the iovecs are writable.
        let n = unsafe { libc::readv(self.file.as_raw_fd(), iov.as_ptr(), count) };
        // Negative: the call failed and errno says why.
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
    }

    /// Writes one frame gathered from `iov`.
    pub fn write_iov(&self, iov: &[libc::iovec]) -> io::Result<usize> {
        let count = libc::c_int::try_from(iov.len())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: every iovec points into live guest memory mappings (built
        // from VolatileSlices of the device's DmaSpace) or host buffers.
        let n = unsafe { libc::writev(self.file.as_raw_fd(), iov.as_ptr(), count) };
        // Negative: the call failed and errno says why.
        usize::try_from(n).map_err(|_| io::Error::last_os_error())
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

    /// The bytes the kernel sees.
    fn bytes(r: &IfReq) -> [u8; IFREQ_SIZE] {
        // SAFETY: `IfReq` is repr(C), IFREQ_SIZE bytes without padding
        // (checked at compile time), and every byte was initialized by
        // `IfReq::new`; any bytes are a valid `[u8; IFREQ_SIZE]`.
        unsafe { std::mem::transmute::<IfReq, [u8; IFREQ_SIZE]>(*r) }
    }

    #[test]
    fn ioctl_numbers_are_the_kernels() {
        assert_eq!(TUNSETIFF(), 0x4004_54ca);
        assert_eq!(TUNSETOFFLOAD(), 0x4004_54d0);
        assert_eq!(TUNSETVNETHDRSZ(), 0x4004_54d8);
        assert_eq!(TUNSETQUEUE(), 0x4004_54d9);
        assert_eq!(TUNGETIFF(), 0x8004_54d2);
    }

    #[test]
    fn a_passed_descriptor_that_is_no_tap_is_refused() {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two descriptors pipe() returns.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: pipe() succeeded: both descriptors are new and ours.
        let (r, _w) = unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        assert!(matches!(Tap::from_file(r), Err(TapError::NotUsable(_))));
        let f = File::open("/dev/null").unwrap();
        assert!(matches!(Tap::from_file(f), Err(TapError::NotUsable(_))));
    }

    #[test]
    fn ifreq_layout() {
        let mut r = IfReq::new("tap-test0");
        assert_eq!(r.name(), "tap-test0");
        r.set_inet(Ipv4Addr::new(192, 168, 249, 1));
        assert_eq!(&bytes(&r)[20..24], &[192, 168, 249, 1]);
        assert_eq!(&bytes(&r)[16..18], &AF_INET_FAMILY.to_ne_bytes());
        r.set_flags(0x1234);
        assert_eq!(r.flags(), 0x1234);
        assert!(matches!(
            Tap::open("a-very-long-tap-name", false),
            Err(TapError::Name(_))
        ));
    }
}
