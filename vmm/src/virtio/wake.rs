//! The epoll set a device thread sleeps on: each of its eventfds (stop,
//! queue kicks, ...) readable under its own token. One constructor, so the
//! virtio-net, virtio-blk and vhost-user threads register their wake-ups
//! the same way.

use std::io;
use std::os::fd::RawFd;

use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};

/// An epoll set with every `(fd, token)` registered for input.
pub fn epoll_on(fds: &[(RawFd, u64)]) -> io::Result<Epoll> {
    let epoll = Epoll::new()?;
    for &(fd, token) in fds {
        epoll.ctl(
            ControlOperation::Add,
            fd,
            EpollEvent::new(EventSet::IN, token),
        )?;
    }
    Ok(epoll)
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
}
