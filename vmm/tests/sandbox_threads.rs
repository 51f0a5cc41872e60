//! What every thread kind does besides its device work, run natively under
//! its real filter in `--seccomp true` mode: the wait loop of
//! `virtio::wake`, locks and condition variables, large allocations,
//! sleeping, clones of eventfds, stderr; a vCPU starting a device worker
//! (the worker's filter stacks on the vCPU's); a block worker's image I/O.
//!
//! WHY in a child process: a refused call ends the process (SIGSYS handler),
//! which must not be the test runner. No guest can run here, so this is
//! how the lists are checked outside the nested runner.

use std::collections::HashMap;
use std::process::Command;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use std::os::unix::net::UnixStream;
use virtio_iommu::quiesce::Quiescer;
use vmm::block::DiskImage;
use vmm::devices::pty;
use vmm::devices::serial::{spawn_pty_reader, SerialDevice};
use vmm::devices::socket_console::SocketConsole;
use vmm::sandbox::{self, SeccompMode, ThreadKind};
use vmm::virtio::wake::Wake;
use vmm_sys_util::eventfd::EventFd;

const CHILD_ENV: &str = "DMAVISOR_SANDBOX_THREADS_CHILD";
const DONE: &str = "SANDBOX-THREADS-DONE";

/// The part of every thread's life that is not its device.
fn runtime_work(name: &str) {
    // glibc's malloc reads this when it first shrinks a thread's arena.
    std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap();
    // The logger's terminal check (TCGETS on stderr), made by any thread
    // that logs: the nested suite found the DMA test stream ended by it.
    let _ = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let stop = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let clone = kick.try_clone().unwrap();
    let wake = Wake::new(&[&kick], &stop).unwrap();
    clone.write(1).unwrap();
    assert!(wake.wait().unwrap());
    stop.write(1).unwrap();
    assert!(!wake.wait().unwrap());

    let pair = Arc::new((Mutex::new(false), Condvar::new()));
    let (lock, cv) = &*pair;
    let guard = lock.lock().unwrap();
    let _ = cv.wait_timeout(guard, Duration::from_millis(1)).unwrap();

    let mut big: Vec<u8> = Vec::with_capacity(1 << 20);
    big.resize(16 << 20, 1);
    big.shrink_to(1 << 20);
    drop(big);
    let mut map = HashMap::new();
    map.insert(name.to_string(), 1);
    std::thread::sleep(Duration::from_millis(1));
    eprintln!("{name}: runtime ok");
}

/// A serial port or console in Socket mode, built by this (API) thread:
/// the socket bound, its thread (the serial filter stacked on this one)
/// accepting a client, replaying it what was written before it came,
/// reading its input and writing it output, the client leaving and a
/// next one served; then dropped (thread joined, file removed).
fn socket_work() {
    use std::io::{Read, Write};
    let path = std::env::temp_dir().join(format!("dmavisor-sandbox-sock-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut sock = SocketConsole::bind(&path, "serial").unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let into = got.clone();
    sock.start("t-serial-socket", move |b: &[u8]| {
        into.lock().unwrap().extend_from_slice(b);
        b.len()
    })
    .unwrap();
    let mut out = sock.writer();
    // Before anyone connects: kept, and written by the thread on accept.
    out.write_all(b"k").unwrap();
    for round in 0..2u8 {
        let mut c = UnixStream::connect(&path).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(&[b'a' + round]).unwrap();
        let t0 = std::time::Instant::now();
        while got.lock().unwrap().len() <= usize::from(round) {
            assert!(t0.elapsed() < Duration::from_secs(5), "no input");
            std::thread::sleep(Duration::from_millis(2));
        }
        // Accepted (its input came): output reaches it, after the replay
        // for the first.
        out.write_all(b"o").unwrap();
        let want: &[u8] = if round == 0 { b"ko" } else { b"o" };
        let mut b = vec![0u8; want.len()];
        c.read_exact(&mut b).unwrap();
        assert_eq!(b, want);
    }
    drop(sock);
    assert!(!path.exists(), "socket file left");
    eprintln!("t-serial-socket: ok");
}

fn block_work(image: &DiskImage) {
    let mut data = vec![0x5au8; 8192];
    let mut iov = [libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    }];
    image.write_at(&mut iov, 4096).unwrap();
    image.flush().unwrap();
    let mut back = vec![0u8; 8192];
    let mut iov = [libc::iovec {
        iov_base: back.as_mut_ptr().cast(),
        iov_len: back.len(),
    }];
    image.read_at(&mut iov, 4096).unwrap();
    assert_eq!(back, data);
    // Either may be unsupported by the file system; the call is what counts.
    let _ = image.discard(0, 4096);
    let _ = image.write_zeroes(8192, 4096);
}

/// What a thread that completes vIOMMU kicks adds: the quiescer's sync,
/// whose barrier is membarrier when the kernel has it.
fn sync_work(q: &Quiescer, name: &str) {
    q.synchronize();
    eprintln!("{name}: sync ok ({:?})", virtio_iommu::barrier::choose());
}

/// The kinds that complete vIOMMU kicks.
const SYNCING: [ThreadKind; 4] = [
    ThreadKind::Vcpu,
    ThreadKind::IommuRequest,
    ThreadKind::Api,
    ThreadKind::Hotplug,
];

fn child() {
    // Before any filter, as the VMM's main does with --quiescer-barrier
    // membarrier: its registration, so that every sync below makes the
    // call the filters must allow (the fence makes none; sticky, the
    // default, makes the same call only as its safety net).
    virtio_iommu::barrier::prefer(virtio_iommu::barrier::BarrierKind::Membarrier);
    let quiescer = Quiescer::new();
    sandbox::set_no_new_privs().unwrap();
    sandbox::seccomp::set_mode(SeccompMode::Enforce).unwrap();
    let file = tempfile_image();
    let image = Arc::new(DiskImage::from_file(file, "scratch", false, None).unwrap());
    for kind in ThreadKind::ALL {
        let image = image.clone();
        let q = quiescer.clone();
        let name = format!("t-{}", kind.short_name());
        let t = sandbox::spawn(kind, name.clone(), move || {
            runtime_work(&name);
            if SYNCING.contains(&kind) {
                sync_work(&q, &name);
            }
            match kind {
                ThreadKind::BlockWorker => block_work(&image),
                ThreadKind::Api => {
                    // A serial port or console in Pty mode: /dev/ptmx and
                    // its ioctls (TIOCSPTLCK, TIOCGPTN, TCGETS, TCSETS).
                    let pty = pty::open().unwrap();
                    std::io::Write::write_all(&mut pty.writer().unwrap(), b"x").unwrap();
                    // Its reader, the serial filter stacked on this one,
                    // waiting out the time without a client, then stopped.
                    let irq = EventFd::new(libc::EFD_NONBLOCK).unwrap();
                    let uart = SerialDevice::new(irq, Box::new(std::io::sink()));
                    let reader =
                        spawn_pty_reader(pty.reader().unwrap(), Arc::new(Mutex::new(uart)))
                            .unwrap();
                    std::thread::sleep(Duration::from_millis(250));
                    reader.stop();
                    socket_work();
                }
                ThreadKind::Hotplug => {
                    // VFIO finds a function's group through its sysfs link.
                    std::fs::read_link("/proc/self/exe").unwrap();
                }
                ThreadKind::Vcpu => {
                    // A vhost-user reply's time-out, set from a vCPU.
                    let (sock, _peer) = UnixStream::pair().unwrap();
                    sock.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
                    // DRIVER_OK on a vCPU starts the device's workers.
                    let w = sandbox::spawn(ThreadKind::NetWorker, "t-vcpu-net", || {
                        runtime_work("t-vcpu-net")
                    })
                    .unwrap();
                    w.join().unwrap();
                    // DRIVER_OK of the vIOMMU: its request queues.
                    let q = q.clone();
                    let w = sandbox::spawn(ThreadKind::IommuRequest, "t-vcpu-viommu", move || {
                        sync_work(&q, "t-vcpu-viommu")
                    })
                    .unwrap();
                    w.join().unwrap();
                }
                _ => {}
            }
        })
        .unwrap();
        t.join().unwrap();
    }
    println!("{DONE}");
}

fn tempfile_image() -> std::fs::File {
    let path = std::env::temp_dir().join(format!("dmavisor-sandbox-img-{}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    file.set_len(1 << 20).unwrap();
    std::fs::remove_file(&path).unwrap();
    file
}

#[test]
fn every_thread_kind_lives_under_its_filter() {
    if std::env::var_os(CHILD_ENV).is_some() {
        child();
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--exact",
            "every_thread_kind_lives_under_its_filter",
            "--nocapture",
        ])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("error: seccomp"), "{stderr}");
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains(DONE), "{stdout}\n{stderr}");
    for kind in ThreadKind::ALL {
        let line = format!("t-{}: runtime ok", kind.short_name());
        assert!(stderr.contains(&line), "{line}: {stderr}");
    }
    assert!(stderr.contains("t-vcpu-net: runtime ok"), "{stderr}");
    for kind in SYNCING {
        let line = format!("t-{}: sync ok", kind.short_name());
        assert!(stderr.contains(&line), "{line}: {stderr}");
    }
    assert!(stderr.contains("t-vcpu-viommu: sync ok"), "{stderr}");
    assert!(stderr.contains("t-serial-socket: ok"), "{stderr}");
}
