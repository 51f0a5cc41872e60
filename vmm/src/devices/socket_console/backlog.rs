//! The guest output a socket console keeps for a client that is not there
//! yet: a ring of at most `cap` bytes, the oldest dropped first (and
//! counted) when it is full.
//!
//! WHY bounded and dropping the oldest: a guest nobody watches may write
//! without end, and the VMM's memory must not grow with it; what a client
//! arriving late wants most is the newest output (the login banner, the
//! last lines before a panic).

use std::collections::VecDeque;
use std::io::{self, Write};

/// Output waiting for a client.
pub(super) struct Backlog {
    bytes: VecDeque<u8>,
    cap: usize,
    dropped: u64,
}

impl Backlog {
    /// An empty ring of `cap` bytes. WHY allocated now: the writer runs on
    /// a vCPU or the console worker, which should not allocate per write.
    pub(super) fn new(cap: usize) -> Self {
        Self {
            bytes: VecDeque::with_capacity(cap),
            cap,
            dropped: 0,
        }
    }

    /// Keeps `data` after what is there, dropping the oldest bytes beyond
    /// the bound.
    pub(super) fn push(&mut self, data: &[u8]) {
        let keep = data
            .get(data.len().saturating_sub(self.cap)..)
            .unwrap_or_default();
        let excess = (self.bytes.len() + keep.len()).saturating_sub(self.cap);
        self.bytes.drain(..excess);
        self.bytes.extend(keep);
        let lost = excess + (data.len() - keep.len());
        self.dropped = self.dropped.saturating_add(lost as u64);
    }

    /// How many bytes wait.
    pub(super) fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Nothing waits.
    pub(super) fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// How many bytes were dropped so far because the ring was full.
    pub(super) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Writes to `to` (non-blocking) as much as it takes now, oldest
    /// first; what it does not take stays for later. Each byte leaves the
    /// ring once written, so nothing is sent twice. An error other than
    /// "would block" means the client is gone (the bytes stay too).
    pub(super) fn drain_into(&mut self, to: &mut impl Write) -> io::Result<()> {
        loop {
            let (front, _) = self.bytes.as_slices();
            if front.is_empty() {
                return Ok(());
            }
            match to.write(front) {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    self.bytes.drain(..n.min(front.len()));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes at most `room` bytes, then "would block".
    struct Pipe {
        got: Vec<u8>,
        room: usize,
    }

    impl Write for Pipe {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let n = buf.len().min(self.room);
            if n == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.room -= n;
            self.got.extend_from_slice(&buf[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_oldest_bytes_go_first_and_are_counted() {
        let mut b = Backlog::new(8);
        b.push(b"abcdef");
        b.push(b"ghij");
        assert_eq!(b.len(), 8);
        assert_eq!(b.dropped(), 2);
        // One write larger than the ring: only its tail is kept.
        b.push(b"0123456789");
        assert_eq!(b.dropped(), 12);
        let mut p = Pipe {
            got: Vec::new(),
            room: 100,
        };
        b.drain_into(&mut p).unwrap();
        assert_eq!(p.got, b"23456789");
        assert!(b.is_empty());
    }

    #[test]
    fn what_the_client_cannot_take_stays_and_is_sent_once() {
        let mut b = Backlog::new(8);
        // Wrapped around: the ring's bytes are in two slices.
        b.push(b"xxxxxx");
        b.push(b"abcdefgh");
        let mut p = Pipe {
            got: Vec::new(),
            room: 3,
        };
        b.drain_into(&mut p).unwrap();
        assert_eq!(p.got, b"abc");
        assert_eq!(b.len(), 5);
        p.room = 100;
        b.drain_into(&mut p).unwrap();
        assert_eq!(p.got, b"abcdefgh");
        b.drain_into(&mut p).unwrap();
        assert_eq!(p.got, b"abcdefgh", "sent twice");
    }

    #[test]
    fn a_client_gone_keeps_the_bytes() {
        struct Gone;
        impl Write for Gone {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                Err(io::ErrorKind::BrokenPipe.into())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut b = Backlog::new(8);
        b.push(b"kept");
        assert!(b.drain_into(&mut Gone).is_err());
        assert_eq!(b.len(), 4);
    }
}
