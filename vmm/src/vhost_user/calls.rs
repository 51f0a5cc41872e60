//! The thread between a vhost-user back-end and the guest's interrupts.
//!
//! WHY a thread and not irqfd: the transport's MSI-X vectors can be masked
//! and re-targeted by the guest at any time; routing the back-end's call
//! eventfds through [`VirtioInterrupt::notify_queue`] keeps one delivery
//! path (masking, pending bits, ISR) for every device. The same loop
//! watches the socket for hang-up, because a back-end that dies never
//! signals a call again and the guest would wait forever.

use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;

use log::{error, warn};
use vmm_sys_util::epoll::{Epoll, EpollEvent, EventSet};
use vmm_sys_util::eventfd::EventFd;

use crate::virtio::wake::epoll_with;
use crate::virtio::VirtioInterrupt;

const TOKEN_STOP: u64 = u64::MAX;
const TOKEN_SOCKET: u64 = u64::MAX - 1;

/// What the forwarder thread owns.
pub struct CallForwarder {
    /// (queue index, the eventfd the back-end signals for it).
    pub calls: Vec<(u16, EventFd)>,
    /// The back-end connection, watched for hang-up only (replies are read
    /// by the request path).
    pub socket_fd: RawFd,
    /// Written by the device to end the thread.
    pub stop: EventFd,
    /// The transport's interrupts.
    pub interrupt: Arc<dyn VirtioInterrupt>,
    /// For messages.
    pub socket: PathBuf,
}

/// Forwards calls to interrupts until stopped or until the back-end hangs
/// up (then the device is marked DEVICE_NEEDS_RESET).
pub fn run_call_forwarder(f: CallForwarder) {
    let epoll = match setup(&f) {
        Ok(e) => e,
        Err(e) => {
            error!("vhost-user-net: call forwarder: {e}");
            f.interrupt.set_needs_reset();
            return;
        }
    };
    let mut events = vec![EpollEvent::default(); f.calls.len() + 2];
    loop {
        let n = match epoll.wait(-1, &mut events) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                warn!("vhost-user-net: epoll: {e}");
                f.interrupt.set_needs_reset();
                return;
            }
        };
        for ev in events.iter().take(n) {
            match ev.data() {
                TOKEN_STOP => return,
                TOKEN_SOCKET => {
                    error!(
                        "vhost-user-net: the back-end at {} closed the connection; the device needs a reset",
                        f.socket.display()
                    );
                    f.interrupt.set_needs_reset();
                    return;
                }
                token => {
                    let Some((queue, fd)) =
                        usize::try_from(token).ok().and_then(|i| f.calls.get(i))
                    else {
                        continue;
                    };
                    // Reading resets the counter; several calls coalesce
                    // into one interrupt, as with irqfd.
                    if fd.read().is_ok() {
                        f.interrupt.notify_queue(*queue);
                    }
                }
            }
        }
    }
}

fn setup(f: &CallForwarder) -> std::io::Result<Epoll> {
    let mut fds = vec![
        (f.stop.as_raw_fd(), TOKEN_STOP, EventSet::IN),
        (
            f.socket_fd,
            TOKEN_SOCKET,
            EventSet::READ_HANG_UP | EventSet::HANG_UP,
        ),
    ];
    for (i, (_, fd)) in f.calls.iter().enumerate() {
        fds.push((fd.as_raw_fd(), i as u64, EventSet::IN));
    }
    epoll_with(&fds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    #[derive(Default)]
    struct Recorder {
        queues: Mutex<Vec<u16>>,
        needs_reset: Mutex<bool>,
    }

    impl VirtioInterrupt for Recorder {
        fn notify_queue(&self, queue: u16) {
            self.queues.lock().unwrap().push(queue);
        }
        fn notify_config(&self) {}
        fn set_needs_reset(&self) {
            *self.needs_reset.lock().unwrap() = true;
        }
    }

    fn wait_for(what: impl Fn() -> bool) {
        let t = Instant::now();
        while !what() {
            assert!(t.elapsed() < Duration::from_secs(5), "timed out");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn calls_become_queue_interrupts_and_hang_up_needs_reset() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let rec = Arc::new(Recorder::default());
        let call0 = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let call1 = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let stop = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let f = CallForwarder {
            calls: vec![
                (0, call0.try_clone().unwrap()),
                (1, call1.try_clone().unwrap()),
            ],
            socket_fd: ours.as_raw_fd(),
            stop: stop.try_clone().unwrap(),
            interrupt: rec.clone(),
            socket: PathBuf::from("/test"),
        };
        let t = std::thread::spawn(move || run_call_forwarder(f));
        call1.write(1).unwrap();
        wait_for(|| rec.queues.lock().unwrap().as_slice() == [1]);
        call0.write(1).unwrap();
        wait_for(|| rec.queues.lock().unwrap().len() == 2);
        assert!(!*rec.needs_reset.lock().unwrap());
        drop(theirs);
        t.join().unwrap();
        assert!(
            *rec.needs_reset.lock().unwrap(),
            "hang-up must need a reset"
        );
        drop(ours);
    }

    #[test]
    fn stop_ends_the_thread_without_reset() {
        let (ours, _theirs) = UnixStream::pair().unwrap();
        let rec = Arc::new(Recorder::default());
        let stop = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let f = CallForwarder {
            calls: Vec::new(),
            socket_fd: ours.as_raw_fd(),
            stop: stop.try_clone().unwrap(),
            interrupt: rec.clone(),
            socket: PathBuf::from("/test"),
        };
        let t = std::thread::spawn(move || run_call_forwarder(f));
        stop.write(1).unwrap();
        t.join().unwrap();
        assert!(!*rec.needs_reset.lock().unwrap());
    }
}
