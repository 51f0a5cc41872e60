//! The calls virtio hotplug and descriptor passing make, under the real
//! filters of the threads that make them (seccomp is on by default):
//! the API loop receives descriptors (`recvmsg` with `SCM_RIGHTS`), the
//! API worker checks a passed TAP (TUN ioctls) and opens an image
//! (`vm.add-disk`), the hotplug thread tears devices down (KVM ioctls,
//! joins). Each runs on its own thread with its kind's filter installed,
//! a refused call answered EPERM instead of the VMM's SIGSYS, so a gap
//! fails the test instead of ending it.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::net::UnixStream;

use seccompiler::SeccompAction;
use vmm_sys_util::eventfd::EventFd;

use super::filters::ThreadKind;
use super::seccomp::{compile, install};

/// Runs `f` on a thread filtered as `kind`; EPERM marks a refused call.
fn under_filter<T: Send + 'static>(kind: ThreadKind, f: impl FnOnce() -> T + Send + 'static) -> T {
    let program = compile(kind, SeccompAction::Errno(libc::EPERM as u32)).unwrap();
    std::thread::spawn(move || {
        install(kind, &program).unwrap();
        f()
    })
    .join()
    .unwrap()
}

/// errno of an ioctl TUNGETIFF on `fd` (not a TAP: ENOTTY or EBADFD when
/// let through, EPERM when refused).
fn tungetiff_errno(fd: i32) -> i32 {
    let mut ifr = [0u8; 40];
    // SAFETY: TUNGETIFF writes at most a `struct ifreq` (40 bytes) to
    // `ifr`, alive for the call.
    let r = unsafe { libc::ioctl(fd, 0x8004_54d2, ifr.as_mut_ptr()) };
    if r < 0 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    } else {
        0
    }
}

#[test]
fn api_and_hotplug_threads_may_do_what_hotplug_needs() {
    // The API loop: a request's bytes with a descriptor (recvmsg).
    let (a, b) = UnixStream::pair().unwrap();
    let probe = EventFd::new(0).unwrap();
    vmm_sys_util::sock_ctrl_msg::ScmSocket::send_with_fd(&a, &b"PUT"[..], probe.as_raw_fd())
        .unwrap();
    let got = under_filter(ThreadKind::ApiServer, move || {
        let mut buf = [0u8; 8];
        let mut fds = [0; 4];
        let mut iov = [libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        }];
        // SAFETY: `iov` points at `buf`, writable for the call.
        let r = unsafe { dbs_uhttp::ScmSocket::recv_with_fds(&b, &mut iov, &mut fds) };
        let n = r.map_err(|e| e.errno());
        if let Ok((_, 1)) = n {
            // SAFETY: recvmsg installed this descriptor for us.
            drop(unsafe { File::from_raw_fd(fds[0]) });
        }
        n
    });
    assert_eq!(
        got,
        Ok((3, 1)),
        "the API loop could not receive descriptors"
    );

    // The API worker: a passed TAP checked, an image opened read-write.
    let dir = std::env::temp_dir().join(format!("dmavisor-filter-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let img = dir.join("disk.raw");
    std::fs::write(&img, vec![0u8; 4096]).unwrap();
    for kind in [ThreadKind::Api, ThreadKind::Hotplug] {
        let (r, _w) = UnixStream::pair().unwrap();
        let path = img.clone();
        let (ioctl, open) = under_filter(kind, move || {
            let open = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map(drop)
                .map_err(|e| e.raw_os_error());
            (tungetiff_errno(r.as_raw_fd()), open)
        });
        assert_ne!(ioctl, libc::EPERM, "{kind:?}: TUNGETIFF refused");
        assert_eq!(open, Ok(()), "{kind:?}: opening an image refused");
    }
    // The filters refuse what they should: a net worker opens nothing
    // for writing (the same check that passed above can fail).
    let path = img.clone();
    let open = under_filter(ThreadKind::NetWorker, move || {
        OpenOptions::new()
            .write(true)
            .open(&path)
            .map(drop)
            .map_err(|e| e.raw_os_error())
    });
    assert_eq!(open, Err(Some(libc::EPERM)));
    let _ = std::fs::remove_dir_all(&dir);
}
