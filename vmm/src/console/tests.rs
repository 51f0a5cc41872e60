//! The console on a pty, driven through its rings as a guest would.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

use super::*;
use crate::config::ConsoleConfig;
use crate::dma::DmaSpace;
use crate::virtio::test_ring::{leaked_ram, DriverRing, IrqCount, RingAddrs};
use crate::virtio::{ActivateContext, ActiveQueue, VirtioDevice};
use crate::width::const_u16;

const WRITE: u16 = const_u16(virtio_bindings::virtio_ring::VRING_DESC_F_WRITE as i128);

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !done() {
        assert!(t0.elapsed() < Duration::from_secs(5), "{what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A console's two queues as a guest sets them up: rings in `mem`
/// (identity DMA), their kicks and the interrupt counter.
struct Started {
    rx: DriverRing<'static>,
    tx: DriverRing<'static>,
    rx_kick: EventFd,
    tx_kick: EventFd,
    irq: Arc<IrqCount>,
}

fn start(dev: &mut Console, mem: &'static GuestMemoryMmap) -> Started {
    let rx = DriverRing::new(
        mem,
        RingAddrs {
            desc: 0x1000,
            avail: 0x1400,
            used: 0x1600,
        },
        64,
    );
    let tx = DriverRing::new(
        mem,
        RingAddrs {
            desc: 0x2000,
            avail: 0x2400,
            used: 0x2600,
        },
        64,
    );
    let rx_kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let tx_kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let irq = Arc::new(IrqCount::default());
    dev.activate(ActivateContext {
        mem: DmaSpace::identity(mem.clone()),
        interrupt: irq.clone(),
        queues: vec![
            ActiveQueue {
                index: 0,
                queue: rx.queue(),
                kick: rx_kick.try_clone().unwrap(),
            },
            ActiveQueue {
                index: 1,
                queue: tx.queue(),
                kick: tx_kick.try_clone().unwrap(),
            },
        ],
        features: 0,
    })
    .unwrap();
    Started {
        rx,
        tx,
        rx_kick,
        tx_kick,
        irq,
    }
}

#[test]
fn output_reaches_the_pty_and_pty_input_fills_receive_buffers() {
    let mem = leaked_ram(0x10000);
    let backend = open_backend(&ConsoleConfig::Pty(None)).unwrap().unwrap();
    let path = backend.pty_path.clone().expect("a pty path");
    let mut dev = Console::new(backend);
    assert_eq!(dev.device_type(), 3);
    assert_eq!(dev.features(), 0, "one port, no MULTIPORT");
    assert_eq!(dev.queue_max_sizes().len(), 2);
    let Started {
        mut rx,
        mut tx,
        rx_kick,
        tx_kick,
        irq,
    } = start(&mut dev, mem);
    let mut slave = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&path)
        .unwrap();

    // Guest to host: two readable descriptors in one chain.
    mem.write_slice(b"hel", GuestAddress(0x8000)).unwrap();
    mem.write_slice(b"lo\n", GuestAddress(0x8100)).unwrap();
    tx.desc(
        0,
        0x8000,
        3,
        u16::try_from(virtio_bindings::virtio_ring::VRING_DESC_F_NEXT).unwrap(),
        1,
    );
    tx.desc(1, 0x8100, 3, 0, 0);
    tx.offer(0);
    tx_kick.write(1).unwrap();
    let mut seen = Vec::new();
    while !seen.ends_with(b"hello\n") {
        let mut b = [0u8; 16];
        let n = slave.read(&mut b).unwrap();
        seen.extend_from_slice(&b[..n]);
    }
    assert_eq!(seen, b"hello\n", "raw: no CR added");
    wait_for("tx used", || tx.used_idx() == 1);
    assert_eq!(tx.used(0), (0, 0));

    // Host to guest: input typed before the guest offers a buffer waits.
    slave.write_all(b"abc").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(rx.used_idx(), 0);
    rx.desc(0, 0x9000, 64, WRITE, 0);
    rx.offer(0);
    rx_kick.write(1).unwrap();
    wait_for("rx used", || rx.used_idx() == 1);
    assert_eq!(rx.used(0), (0, 3));
    let mut got = [0u8; 3];
    mem.read_slice(&mut got, GuestAddress(0x9000)).unwrap();
    assert_eq!(&got, b"abc");
    assert!(irq.queue() >= 2);
    assert_eq!(irq.needs_reset(), 0);

    // After a reset the worker is gone: an offer stays unused.
    dev.reset();
    tx.desc(2, 0x8000, 3, 0, 0);
    tx.offer(2);
    tx_kick.write(1).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(tx.used_idx(), 1);
}

#[test]
fn a_bad_buffer_address_stops_the_queue_not_the_vmm() {
    let mem = leaked_ram(0x10000);
    let backend = open_backend(&ConsoleConfig::Null).unwrap().unwrap();
    let mut dev = Console::new(backend);
    let mut tx = DriverRing::new(
        mem,
        RingAddrs {
            desc: 0x2000,
            avail: 0x2400,
            used: 0x2600,
        },
        64,
    );
    let kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let irq = Arc::new(IrqCount::default());
    dev.activate(ActivateContext {
        mem: DmaSpace::identity(mem.clone()),
        interrupt: irq.clone(),
        queues: vec![ActiveQueue {
            index: 1,
            queue: tx.queue(),
            kick: kick.try_clone().unwrap(),
        }],
        features: 0,
    })
    .unwrap();
    tx.desc(0, 0xffff_0000, 16, 0, 0);
    tx.offer(0);
    kick.write(1).unwrap();
    wait_for("needs reset", || irq.needs_reset() == 1);
    assert_eq!(tx.used_idx(), 0);
    dev.reset();
}

#[test]
fn off_is_no_device() {
    assert!(open_backend(&ConsoleConfig::Off).unwrap().is_none());
}

/// Behind a quiescing vIOMMU: an idle console (its worker waiting in
/// `poll`) holds no section, so the guest's UNMAP of a receive buffer
/// completes at once; input that then arrives for that buffer fails
/// translation, the queue stops (DEVICE_NEEDS_RESET) and the page the
/// IOVA pointed to is never written.
#[test]
fn behind_the_viommu_an_unmap_completes_and_the_buffer_is_not_written() {
    use crate::dma::test_iommu::{TestIommu, RW};
    use virtio_iommu::quiesce::Quiescer;

    let mem = leaked_ram(0x20000);
    let iommu = TestIommu::new(0x40);
    let q = Quiescer::new();
    iommu.dev.add_invalidator(q.clone());
    iommu.attach(1);
    // Rings identity-mapped; the receive buffer at IOVA 0x100000 -> 0x9000.
    iommu.map(1, 0, 0x8000, 0, RW);
    iommu.map(1, 0x100000, 0x1000, 0x9000, RW);
    let backend = open_backend(&ConsoleConfig::Pty(None)).unwrap().unwrap();
    let path = backend.pty_path.clone().unwrap();
    let mut dev = Console::new(backend);
    let mut rx = DriverRing::new(
        mem,
        RingAddrs {
            desc: 0x1000,
            avail: 0x1400,
            used: 0x1600,
        },
        64,
    );
    let kick = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    let irq = Arc::new(IrqCount::default());
    dev.activate(ActivateContext {
        mem: iommu.space(mem).with_quiescer(q.clone()),
        interrupt: irq.clone(),
        queues: vec![ActiveQueue {
            index: 0,
            queue: rx.queue(),
            kick: kick.try_clone().unwrap(),
        }],
        features: 0,
    })
    .unwrap();
    rx.desc(0, 0x100000, 64, WRITE, 0);
    rx.offer(0);
    kick.write(1).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    iommu.unmap(1, 0x100000, 0x1000);
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "the UNMAP waited for an idle worker"
    );
    let mut slave = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(&path)
        .unwrap();
    slave.write_all(b"zz").unwrap();
    wait_for("needs reset", || irq.needs_reset() == 1);
    assert_eq!(rx.used_idx(), 0);
    let mut page = [0u8; 2];
    mem.read_slice(&mut page, GuestAddress(0x9000)).unwrap();
    assert_eq!(page, [0, 0], "the unmapped buffer was written");
    dev.reset();
}

/// A console on a socket: a client sees what the guest transmits and its
/// bytes fill receive buffers; the device dropped, the file is gone.
#[test]
fn a_socket_client_sees_output_and_fills_receive_buffers() {
    use std::os::unix::net::UnixStream;
    let dir = std::env::temp_dir().join(format!("dmavisor-console-sock-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c.sock");
    let mem = leaked_ram(0x10000);
    let backend = open_backend(&ConsoleConfig::Socket(path.clone()))
        .unwrap()
        .unwrap();
    let mut dev = Console::new(backend);
    let Started {
        mut rx,
        mut tx,
        rx_kick,
        tx_kick,
        irq: _,
    } = start(&mut dev, mem);
    let mut client = UnixStream::connect(&path).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    // The client's bytes wait for a receive buffer, then fill it.
    client.write_all(b"typed").unwrap();
    rx.desc(0, 0x9000, 64, WRITE, 0);
    rx.offer(0);
    rx_kick.write(1).unwrap();
    wait_for("rx used", || rx.used_idx() == 1);
    assert_eq!(rx.used(0), (0, 5));
    let mut got = [0u8; 5];
    mem.read_slice(&mut got, GuestAddress(0x9000)).unwrap();
    assert_eq!(&got, b"typed");
    // Guest output reaches the client (it is accepted: its input came).
    mem.write_slice(b"out\n", GuestAddress(0x8000)).unwrap();
    tx.desc(0, 0x8000, 4, 0, 0);
    tx.offer(0);
    tx_kick.write(1).unwrap();
    let mut seen = [0u8; 4];
    client.read_exact(&mut seen).unwrap();
    assert_eq!(&seen, b"out\n");
    wait_for("tx used", || tx.used_idx() == 1);
    drop(dev);
    assert!(!path.exists(), "the socket file outlived the device");
    let mut b = [0u8; 1];
    assert_eq!(client.read(&mut b).unwrap(), 0, "the client was not closed");
}
