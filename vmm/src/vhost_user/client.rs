//! The front-end side of the vhost-user protocol: framing, file
//! descriptors, replies and acknowledgements on the back-end's socket.
//!
//! WHY our own transport: rust-vmm's `vhost` crate's `Frontend` cannot send
//! `VHOST_USER_IOTLB_MSG` and does not hand the back-end's IOTLB misses to
//! its caller, and its message framing (`Endpoint`) is private. The vIOMMU
//! path needs both, so the framing lives here; the message bodies and codes
//! are the crate's (`vhost::vhost_user::message`), not hand-written copies.
//!
//! Every read has a deadline: a back-end that stops answering fails the
//! request with [`ClientError::Timeout`] instead of hanging the vCPU that
//! wrote DRIVER_OK.

use std::io::{ErrorKind, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use log::info;

use thiserror::Error;
use vhost::vhost_user::message::{FrontendReq, VhostUserU64, MAX_MSG_SIZE};
use vm_memory::ByteValued;

use super::writer::Writer;
use crate::width::const_u32;
use vhost::vhost_user::message::VhostUserVringState;

/// How long a reply may take. Generous: a back-end in the nested runner
/// shares two emulated CPUs with the guest.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long server mode waits for the back-end to connect: long enough for
/// a back-end started after the VMM (as a management stack may), short
/// enough that a missing one is an error rather than a VMM that hangs.
pub const ACCEPT_TIMEOUT: Duration = Duration::from_secs(120);
const ACCEPT_POLL: Duration = Duration::from_millis(50);

/// How long SET_MEM_TABLE may take: the back-end maps all of guest RAM
/// and may populate it (DPDK 22.11's testpmd took 1.15 s for 512 MiB on
/// this development machine; under the nested runner's emulation that is
/// tens of seconds).
pub const MEM_TABLE_TIMEOUT: Duration = Duration::from_secs(180);

fn reply_timeout(request: FrontendReq) -> Duration {
    match request {
        FrontendReq::SET_MEM_TABLE => MEM_TABLE_TIMEOUT,
        _ => REPLY_TIMEOUT,
    }
}

/// Header flag: protocol version 1 (vhost-user spec, "Message Specification").
pub(super) const FLAG_VERSION_1: u32 = 0x1;
/// Header flag: this message is a reply.
pub(super) const FLAG_REPLY: u32 = 0x4;
/// Header flag: the sender asks for a REPLY_ACK.
pub(super) const FLAG_NEED_REPLY: u32 = 0x8;
/// Bytes in a message header: request, flags, size (three `u32`).
pub(super) const HEADER_LEN: usize = 12;
/// `SO_PEERCRED`'s option length, as the `socklen_t` getsockopt takes.
const UCRED_LEN: libc::socklen_t = const_u32(std::mem::size_of::<libc::ucred>() as i128);

/// One message on either channel: the header (request code, `flags`, the
/// body's size) followed by `body`, little-endian as the spec has it.
/// The header's 32-bit size of `body`.
#[allow(
    clippy::cast_possible_truncation,
    reason = "bodies are at most MAX_MSG_SIZE (4 KiB): Client::request refuses longer, the rest are fixed structs"
)]
fn body_len(body: &[u8]) -> u32 {
    body.len() as u32
}

pub(super) fn encode_message(code: u32, flags: u32, body: &[u8]) -> Vec<u8> {
    let mut msg = Vec::with_capacity(HEADER_LEN + body.len());
    msg.extend_from_slice(&code.to_le_bytes());
    msg.extend_from_slice(&flags.to_le_bytes());
    msg.extend_from_slice(&body_len(body).to_le_bytes());
    msg.extend_from_slice(body);
    msg
}

/// A header's (request code, flags, body size).
pub(super) fn decode_header(hdr: &[u8; HEADER_LEN]) -> (u32, u32, u32) {
    let word = |i: usize| {
        let mut b = [0u8; 4];
        b.copy_from_slice(hdr.get(i * 4..i * 4 + 4).unwrap_or(&[0; 4]));
        u32::from_le_bytes(b)
    };
    (word(0), word(1), word(2))
}

/// Why talking to the back-end failed.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The socket could not be connected.
    #[error("cannot connect to vhost-user back-end at {path}: {source}")]
    Connect {
        /// Socket path.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// In server mode, no back-end connected in time ([`ACCEPT_TIMEOUT`]).
    #[error("no vhost-user back-end connected to {path} in time")]
    NoBackend {
        /// Socket path.
        path: PathBuf,
    },
    /// The socket failed or the back-end closed it.
    #[error("vhost-user {request:?}: {source}")]
    Io {
        /// The request in flight.
        request: FrontendReq,
        /// OS error (UnexpectedEof when the back-end went away).
        source: std::io::Error,
    },
    /// No reply within [`REPLY_TIMEOUT`] ([`MEM_TABLE_TIMEOUT`] for the
    /// memory table).
    #[error("vhost-user {0:?}: the back-end did not answer in time ({t:?})", t = reply_timeout(*.0))]
    Timeout(FrontendReq),
    /// The reply does not match the request or is malformed.
    #[error("vhost-user {request:?}: bad reply: {reason}")]
    BadReply {
        /// The request in flight.
        request: FrontendReq,
        /// What is wrong.
        reason: String,
    },
    /// An earlier request failed on the socket or timed out: the
    /// connection is not used again (a dead back-end must cost one
    /// time-out, not one per request).
    #[error("vhost-user {0:?}: the connection to the back-end is broken")]
    Broken(FrontendReq),
    /// The back-end acknowledged with a failure status.
    #[error("vhost-user {request:?}: the back-end refused it (status {status})")]
    Refused {
        /// The request.
        request: FrontendReq,
        /// Non-zero status it returned.
        status: u64,
    },
}

/// One connection to a vhost-user back-end (the front-end's channel).
pub struct Client {
    /// The reading half: replies, read by whoever holds the client.
    sock: UnixStream,
    /// The writing half, shared with the IOTLB's miss thread.
    writer: Arc<Writer>,
    /// Deadline of a reply ([`REPLY_TIMEOUT`]; the memory table has its own).
    reply_timeout: Duration,
    /// REPLY_ACK was negotiated: every request without a reply of its own
    /// is acknowledged, so errors surface where they happen.
    reply_ack: bool,
    /// A request failed on the socket; nothing more is sent.
    broken: bool,
}

impl Client {
    /// Connects to the back-end listening at `path`.
    pub fn connect(path: &Path) -> Result<Self, ClientError> {
        let sock = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_stream(sock).map_err(|source| ClientError::Connect {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Server mode (`vhost_mode=server`): listens at `path` and waits up to
    /// [`ACCEPT_TIMEOUT`] for the back-end to connect. A socket file left
    /// at `path` by an earlier run is replaced; the file is removed once
    /// the back-end is connected, so nothing else can connect to it.
    pub fn accept(path: &Path) -> Result<Self, ClientError> {
        Self::accept_within(path, ACCEPT_TIMEOUT)
    }

    fn accept_within(path: &Path, timeout: Duration) -> Result<Self, ClientError> {
        let os = |source: std::io::Error| ClientError::Connect {
            path: path.to_path_buf(),
            source,
        };
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
            std::fs::remove_file(path).map_err(os)?;
        }
        let listener = UnixListener::bind(path).map_err(os)?;
        listener.set_nonblocking(true).map_err(os)?;
        info!(
            "waiting for a vhost-user back-end to connect to {}",
            path.display()
        );
        let deadline = Instant::now() + timeout;
        let accepted = loop {
            match listener.accept() {
                Ok((sock, _)) => break Ok(sock),
                Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                    std::thread::sleep(ACCEPT_POLL);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    break Err(ClientError::NoBackend {
                        path: path.to_path_buf(),
                    })
                }
                Err(e) => break Err(os(e)),
            }
        };
        let _ = std::fs::remove_file(path);
        let sock = accepted?;
        sock.set_nonblocking(false).map_err(os)?;
        Self::from_stream(sock).map_err(os)
    }

    /// Wraps an already connected socket (a back-end that connected to us).
    pub fn from_stream(sock: UnixStream) -> std::io::Result<Self> {
        sock.set_read_timeout(Some(REPLY_TIMEOUT))?;
        sock.set_write_timeout(Some(REPLY_TIMEOUT))?;
        let writer = Arc::new(Writer::new(sock.try_clone()?));
        Ok(Self {
            sock,
            writer,
            reply_timeout: REPLY_TIMEOUT,
            reply_ack: false,
            broken: false,
        })
    }

    /// Shortens the reply deadline (tests of a back-end that never answers).
    #[cfg(test)]
    pub(super) fn set_reply_timeout(&mut self, t: Duration) {
        self.reply_timeout = t;
    }

    /// The writing half, for messages that ask for no reply (UPDATEs).
    pub fn writer(&self) -> Arc<Writer> {
        self.writer.clone()
    }

    /// The process at the other end (SO_PEERCRED), if the kernel names it.
    pub fn peer_pid(&self) -> Option<i32> {
        let mut cred = libc::ucred {
            pid: 0,
            uid: 0,
            gid: 0,
        };
        let mut len = UCRED_LEN;
        // SAFETY: `cred` and `len` are valid for writes of the sizes given;
        // the socket is owned by `self` and open.
        let r = unsafe {
            libc::getsockopt(
                self.sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        };
        (r == 0 && cred.pid > 0).then_some(cred.pid)
    }

    /// Disconnects the back-end for good (see [`Writer::shutdown`]).
    pub fn shutdown(&mut self) {
        self.broken = true;
        self.writer.shutdown();
    }

    /// Sends `request` asking for an acknowledgement, without waiting for
    /// it: the caller orders the send under a lock of its own and then
    /// waits with [`Client::wait_ack`] after dropping that lock.
    pub(super) fn send_acked(
        &mut self,
        request: FrontendReq,
        body: &[u8],
    ) -> Result<(), ClientError> {
        self.send(request, body, &[], true)
    }

    /// Waits for the acknowledgement of the request [`Client::send_acked`]
    /// sent; a non-zero status is a refusal.
    pub(super) fn wait_ack(&mut self, request: FrontendReq) -> Result<(), ClientError> {
        let reply = self.recv_reply(request)?;
        match u64_body(request, &reply)? {
            0 => Ok(()),
            status => Err(ClientError::Refused { request, status }),
        }
    }

    /// Stops ring `index` (GET_VRING_BASE) on a connection that may have
    /// failed: sent even when [`Client::is_broken`], replies of IOTLB
    /// messages that arrive late are skipped, and the whole exchange ends
    /// by `deadline`. Returns the ring's next available index.
    pub(super) fn stop_ring_after_failure(
        &mut self,
        index: u32,
        deadline: Instant,
    ) -> Result<u32, ClientError> {
        let request = FrontendReq::GET_VRING_BASE;
        let state = VhostUserVringState::new(index, 0);
        self.send_message(request, state.as_slice(), &[], false)?;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ClientError::Timeout(request));
            }
            self.sock
                .set_read_timeout(Some(left))
                .map_err(|source| ClientError::Io { request, source })?;
            let mut hdr = [0u8; HEADER_LEN];
            self.read_exact(request, &mut hdr)?;
            let (code, _, size) = decode_header(&hdr);
            let size = size as usize;
            if size > MAX_MSG_SIZE {
                return Err(ClientError::BadReply {
                    request,
                    reason: format!("{size} bytes"),
                });
            }
            let mut body = vec![0u8; size];
            self.read_exact(request, &mut body)?;
            if code == u32::from(FrontendReq::IOTLB_MSG) {
                continue;
            }
            let mut out = VhostUserVringState::default();
            if code != u32::from(request) || body.len() != out.as_slice().len() {
                return Err(ClientError::BadReply {
                    request,
                    reason: format!("reply {code} of {} bytes", body.len()),
                });
            }
            out.as_mut_slice().copy_from_slice(&body);
            return Ok(out.num);
        }
    }

    /// The socket, for watching it for hang-up.
    pub fn raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// From now on, requests without their own reply are acknowledged.
    pub fn enable_reply_ack(&mut self) {
        self.reply_ack = true;
    }

    /// Sends a request whose reply is a `u64` (GET_FEATURES, ...).
    pub fn get_u64(&mut self, request: FrontendReq) -> Result<u64, ClientError> {
        self.send(request, &[], &[], false)?;
        let body = self.recv_reply(request)?;
        u64_body(request, &body)
    }

    /// Sends a request with a body and no reply of its own; waits for the
    /// acknowledgement when REPLY_ACK was negotiated.
    pub fn set<T: ByteValued>(
        &mut self,
        request: FrontendReq,
        body: &T,
        fds: &[RawFd],
    ) -> Result<(), ClientError> {
        self.set_bytes(request, body.as_slice(), fds)
    }

    /// [`Client::set`] on raw body bytes (a header plus an array).
    pub fn set_bytes(
        &mut self,
        request: FrontendReq,
        body: &[u8],
        fds: &[RawFd],
    ) -> Result<(), ClientError> {
        let ack = self.reply_ack;
        self.send(request, body, fds, ack)?;
        if ack {
            let reply = self.recv_reply(request)?;
            let status = u64_body(request, &reply)?;
            if status != 0 {
                return Err(ClientError::Refused { request, status });
            }
        }
        Ok(())
    }

    /// Sends a request with a body whose reply carries a body of the same
    /// type (GET_VRING_BASE).
    pub fn get_with<T: ByteValued + Default>(
        &mut self,
        request: FrontendReq,
        body: &T,
    ) -> Result<T, ClientError> {
        self.send(request, body.as_slice(), &[], false)?;
        let reply = self.recv_reply(request)?;
        let mut out = T::default();
        if reply.len() != out.as_slice().len() {
            return Err(ClientError::BadReply {
                request,
                reason: format!("{} bytes, expected {}", reply.len(), out.as_slice().len()),
            });
        }
        out.as_mut_slice().copy_from_slice(&reply);
        Ok(out)
    }

    /// Whether the connection failed (see [`ClientError::Broken`]).
    pub fn is_broken(&self) -> bool {
        self.broken
    }

    fn send(
        &mut self,
        request: FrontendReq,
        body: &[u8],
        fds: &[RawFd],
        need_reply: bool,
    ) -> Result<(), ClientError> {
        if self.broken {
            return Err(ClientError::Broken(request));
        }
        let r = self.send_message(request, body, fds, need_reply);
        self.broken |= r.is_err();
        r
    }

    fn send_message(
        &mut self,
        request: FrontendReq,
        body: &[u8],
        fds: &[RawFd],
        need_reply: bool,
    ) -> Result<(), ClientError> {
        let io = |source| ClientError::Io { request, source };
        if body.len() > MAX_MSG_SIZE {
            return Err(io(std::io::Error::from(ErrorKind::InvalidInput)));
        }
        self.writer
            .write_message(u32::from(request), need_reply, body, fds)
            .map_err(io)
    }

    fn recv_reply(&mut self, request: FrontendReq) -> Result<Vec<u8>, ClientError> {
        let r = self
            .sock
            .set_read_timeout(Some(match request {
                FrontendReq::SET_MEM_TABLE => MEM_TABLE_TIMEOUT,
                _ => self.reply_timeout,
            }))
            .map_err(|source| ClientError::Io { request, source })
            .and_then(|()| self.read_reply(request));
        // A reply that does not fit leaves the stream out of step.
        self.broken |= r.is_err();
        r
    }

    fn read_reply(&mut self, request: FrontendReq) -> Result<Vec<u8>, ClientError> {
        let mut hdr = [0u8; HEADER_LEN];
        self.read_exact(request, &mut hdr)?;
        let (code, flags, size) = decode_header(&hdr);
        let bad = |reason: String| ClientError::BadReply { request, reason };
        if code != u32::from(request) {
            return Err(bad(format!("reply to request {code}")));
        }
        if flags & FLAG_REPLY == 0 || flags & 0x3 != FLAG_VERSION_1 {
            return Err(bad(format!("flags {flags:#x}")));
        }
        let size = size as usize;
        if size > MAX_MSG_SIZE {
            return Err(bad(format!("{size} bytes")));
        }
        let mut body = vec![0u8; size];
        self.read_exact(request, &mut body)?;
        Ok(body)
    }

    fn read_exact(&mut self, request: FrontendReq, buf: &mut [u8]) -> Result<(), ClientError> {
        self.sock
            .read_exact(buf)
            .map_err(|source| match source.kind() {
                ErrorKind::WouldBlock | ErrorKind::TimedOut => ClientError::Timeout(request),
                _ => ClientError::Io { request, source },
            })
    }
}

fn u64_body(request: FrontendReq, body: &[u8]) -> Result<u64, ClientError> {
    let mut v = VhostUserU64::default();
    if body.len() != v.as_slice().len() {
        return Err(ClientError::BadReply {
            request,
            reason: format!("{} bytes, expected 8", body.len()),
        });
    }
    v.as_mut_slice().copy_from_slice(body);
    Ok(v.value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A fake back-end end of the socket: reads one request, answers.
    fn read_request(peer: &mut UnixStream) -> (u32, u32, Vec<u8>) {
        let mut hdr = [0u8; HEADER_LEN];
        peer.read_exact(&mut hdr).unwrap();
        let w = |i: usize| u32::from_le_bytes(hdr[i * 4..i * 4 + 4].try_into().unwrap());
        let mut body = vec![0u8; w(2) as usize];
        peer.read_exact(&mut body).unwrap();
        (w(0), w(1), body)
    }

    fn reply(peer: &mut UnixStream, code: u32, body: &[u8]) {
        let mut m = Vec::new();
        m.extend_from_slice(&code.to_le_bytes());
        m.extend_from_slice(&(FLAG_VERSION_1 | FLAG_REPLY).to_le_bytes());
        m.extend_from_slice(&u32::try_from(body.len()).unwrap().to_le_bytes());
        m.extend_from_slice(body);
        peer.write_all(&m).unwrap();
    }

    #[test]
    fn get_u64_round_trip() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut c = Client::from_stream(a).unwrap();
        let t = std::thread::spawn(move || {
            let (code, flags, body) = read_request(&mut b);
            assert_eq!(code, u32::from(FrontendReq::GET_FEATURES));
            assert_eq!(flags, FLAG_VERSION_1);
            assert!(body.is_empty());
            reply(&mut b, code, &0x1234_u64.to_le_bytes());
        });
        assert_eq!(c.get_u64(FrontendReq::GET_FEATURES).unwrap(), 0x1234);
        t.join().unwrap();
    }

    #[test]
    fn acknowledged_request_reports_refusal() {
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut c = Client::from_stream(a).unwrap();
        c.enable_reply_ack();
        let t = std::thread::spawn(move || {
            let (code, flags, body) = read_request(&mut b);
            assert_eq!(flags & FLAG_NEED_REPLY, FLAG_NEED_REPLY);
            assert_eq!(body, 7u64.to_le_bytes());
            reply(&mut b, code, &1u64.to_le_bytes());
        });
        let err = c
            .set(FrontendReq::SET_FEATURES, &VhostUserU64::new(7), &[])
            .unwrap_err();
        assert!(
            matches!(err, ClientError::Refused { status: 1, .. }),
            "{err}"
        );
        t.join().unwrap();
    }

    #[test]
    fn mismatched_or_oversized_reply_is_rejected() {
        let wrong_code = |b: &mut UnixStream| {
            reply(b, u32::from(FrontendReq::GET_QUEUE_NUM), &[0; 8]);
        };
        let oversized = |b: &mut UnixStream| {
            let mut m = Vec::new();
            m.extend_from_slice(&u32::from(FrontendReq::GET_FEATURES).to_le_bytes());
            m.extend_from_slice(&(FLAG_VERSION_1 | FLAG_REPLY).to_le_bytes());
            m.extend_from_slice(&(1u32 << 20).to_le_bytes());
            b.write_all(&m).unwrap();
        };
        let not_a_reply = |b: &mut UnixStream| {
            let mut m = Vec::new();
            m.extend_from_slice(&u32::from(FrontendReq::GET_FEATURES).to_le_bytes());
            m.extend_from_slice(&FLAG_VERSION_1.to_le_bytes());
            m.extend_from_slice(&8u32.to_le_bytes());
            m.extend_from_slice(&[0; 8]);
            b.write_all(&m).unwrap();
        };
        let answers: [fn(&mut UnixStream); 3] = [wrong_code, oversized, not_a_reply];
        for answer in answers {
            let (a, mut b) = UnixStream::pair().unwrap();
            let mut c = Client::from_stream(a).unwrap();
            let t = std::thread::spawn(move || {
                read_request(&mut b);
                answer(&mut b);
                b
            });
            assert!(matches!(
                c.get_u64(FrontendReq::GET_FEATURES),
                Err(ClientError::BadReply { .. })
            ));
            // The stream is out of step: the connection is not used again.
            assert!(c.is_broken());
            drop(t.join().unwrap());
        }
    }

    #[test]
    fn back_end_gone_is_an_error_not_a_hang() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut c = Client::from_stream(a).unwrap();
        drop(b);
        let err = c.get_u64(FrontendReq::GET_FEATURES).unwrap_err();
        assert!(matches!(err, ClientError::Io { .. }), "{err}");
        assert!(c.is_broken());
        let again = c.get_u64(FrontendReq::GET_FEATURES).unwrap_err();
        assert!(matches!(again, ClientError::Broken(_)), "{again}");
    }

    #[test]
    fn server_mode_replaces_a_stale_socket_accepts_and_removes_the_file() {
        let dir = std::env::temp_dir().join(format!("dmv-vu-accept-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("vu.sock");
        // A socket file from an earlier run, nobody listening.
        drop(UnixListener::bind(&path).unwrap());
        let p = path.clone();
        let backend = std::thread::spawn(move || {
            for _ in 0..100 {
                std::thread::sleep(Duration::from_millis(20));
                if let Ok(s) = UnixStream::connect(&p) {
                    return s;
                }
            }
            panic!("never connected");
        });
        let mut c = Client::accept_within(&path, Duration::from_secs(10)).unwrap();
        let mut b = backend.join().unwrap();
        assert!(!path.exists(), "the socket file stays after the accept");
        // The connection works: a request reaches the back-end.
        let t = std::thread::spawn(move || {
            let (code, _, _) = read_request(&mut b);
            reply(&mut b, code, &7u64.to_le_bytes());
        });
        assert_eq!(c.get_u64(FrontendReq::GET_FEATURES).unwrap(), 7);
        t.join().unwrap();
        // Nobody connects: an error in time, not a hang.
        let started = Instant::now();
        let e = Client::accept_within(&path, Duration::from_millis(200)).err();
        assert!(matches!(e, Some(ClientError::NoBackend { .. })), "{e:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
