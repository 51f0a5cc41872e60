//! The epoll set a device thread sleeps on: each of its eventfds (stop,
//! queue kicks, ...) readable under its own token. One constructor, so the
//! virtio-net, virtio-blk and vhost-user threads register their wake-ups
//! the same way. [`Wake`] is the whole loop of a thread that only waits
//! for its kicks and a stop (the vIOMMU's request and event threads).

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use crate::width::usize_from_u64;

/// An epoll set with every `(fd, token)` registered for input.
pub fn epoll_on(fds: &[(RawFd, u64)]) -> io::Result<Epoll> {
    epoll_with(
        &fds.iter()
            .map(|&(fd, token)| (fd, token, EventSet::IN))
            .collect::<Vec<_>>(),
    )
}

/// An epoll set with every `(fd, token, events)` registered (for a
/// descriptor watched for something else than input, such as a peer's
/// hang-up).
pub fn epoll_with(fds: &[(RawFd, u64, EventSet)]) -> io::Result<Epoll> {
    let epoll = Epoll::new()?;
    for &(fd, token, events) in fds {
        epoll.ctl(ControlOperation::Add, fd, EpollEvent::new(events, token))?;
    }
    Ok(epoll)
}

/// Token of the stop eventfd in a [`Wake`] set.
const STOP: u64 = u64::MAX;

/// The wake-ups of a thread that serves on any of its eventfds until a stop
/// eventfd is readable, in one epoll set built when the thread starts.
pub struct Wake<'a> {
    epoll: Epoll,
    fds: Vec<&'a EventFd>,
}

impl<'a> Wake<'a> {
    /// `fds` wake the thread (token = index); `stop` ends it.
    pub fn new(fds: &[&'a EventFd], stop: &EventFd) -> io::Result<Wake<'a>> {
        let mut tokens: Vec<(RawFd, u64)> = fds
            .iter()
            .enumerate()
            .map(|(i, e)| (e.as_raw_fd(), i as u64))
            .collect();
        tokens.push((stop.as_raw_fd(), STOP));
        Ok(Wake {
            epoll: epoll_on(&tokens)?,
            fds: fds.to_vec(),
        })
    }

    /// Sleeps until a wake-up or the stop is readable: `Ok(false)` for the
    /// stop (not consumed: every thread of a device watches the same one),
    /// otherwise the readable wake-ups are consumed and `Ok(true)`.
    pub fn wait(&self) -> io::Result<bool> {
        // Level-triggered: more ready descriptors than this array holds are
        // reported again by the next wait.
        let mut events = [EpollEvent::default(); 8];
        let n = loop {
            match self.epoll.wait(-1, &mut events) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        };
        if events[..n].iter().any(|e| e.data() == STOP) {
            return Ok(false);
        }
        for e in &events[..n] {
            if let Some(fd) = self.fds.get(usize_from_u64(e.data())) {
                // Non-blocking: a spurious wake-up reads EAGAIN, which is fine.
                let _ = fd.read();
            }
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use vmm_sys_util::eventfd::EventFd;

    #[test]
    fn a_written_eventfd_wakes_with_its_token() {
        let (a, b) = (EventFd::new(0).unwrap(), EventFd::new(0).unwrap());
        let ep = epoll_on(&[(a.as_raw_fd(), 7), (b.as_raw_fd(), 9)]).unwrap();
        b.write(1).unwrap();
        let mut ev = [EpollEvent::default(); 2];
        assert_eq!(ep.wait(1000, &mut ev).unwrap(), 1);
        assert_eq!(ev[0].data(), 9);
        assert!(epoll_on(&[(-1, 1)]).is_err());
    }

    #[test]
    fn wake_consumes_kicks_and_reports_the_stop() {
        let kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let stop = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let wake = Wake::new(&[&kick], &stop).unwrap();
        kick.write(3).unwrap();
        assert!(wake.wait().unwrap());
        assert!(kick.read().is_err(), "the kick was consumed");
        stop.write(1).unwrap();
        assert!(!wake.wait().unwrap());
        assert_eq!(
            stop.read().unwrap(),
            1,
            "the stop stays for the other threads"
        );
    }
}
