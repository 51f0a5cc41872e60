//! The writing half of the front-end channel, shared by the request path
//! and the thread answering the back-end's IOTLB misses.
//!
//! WHY apart from [`super::client::Client`]: an invalidation waits for the
//! back-end's acknowledgement while holding the client (the reply reader).
//! A back-end may answer nothing until it got the UPDATE for its own miss,
//! so the miss thread must be able to send that UPDATE without the client:
//! it needs only this lock, which no one holds across a wait for a reply.
//! Messages written here never ask for a reply, so every reply on the
//! socket still belongs to whoever holds the client.

use std::io::Write;
use std::net::Shutdown;
use std::os::fd::RawFd;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

use virtio_iommu::locks::Unpoison;

use super::client::{encode_message, FLAG_NEED_REPLY, FLAG_VERSION_1};

/// One writer of whole messages on the front-end socket.
pub struct Writer {
    sock: UnixStream,
    /// Held for one message, so two writers' bytes never interleave.
    lock: Mutex<()>,
}

impl Writer {
    /// A writer on (a clone of) the front-end socket.
    pub fn new(sock: UnixStream) -> Self {
        Self {
            sock,
            lock: Mutex::new(()),
        }
    }

    /// Writes one message with its file descriptors, whole.
    pub fn write_message(
        &self,
        code: u32,
        need_reply: bool,
        body: &[u8],
        fds: &[RawFd],
    ) -> std::io::Result<()> {
        let mut flags = FLAG_VERSION_1;
        if need_reply {
            flags |= FLAG_NEED_REPLY;
        }
        let msg = encode_message(code, flags, body);
        let _whole = self.lock.lock().unpoisoned();
        // The descriptors travel with the first byte; the rest follows with
        // plain writes if the kernel took only part of the message.
        let sent = self
            .sock
            .send_with_fds(&[msg.as_slice()], fds)
            .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))?;
        let rest = msg.get(sent..).unwrap_or_default();
        if !rest.is_empty() {
            (&self.sock).write_all(rest)?;
        }
        Ok(())
    }

    /// Disconnects the back-end: both directions of the socket are shut
    /// down, so no further message (an UPDATE above all) can reach it.
    pub fn shutdown(&self) {
        let _whole = self.lock.lock().unpoisoned();
        // ENOTCONN when the peer is already gone: disconnected either way.
        let _ = self.sock.shutdown(Shutdown::Both);
    }
}
