//! The control queue of a multi-queue vhost-user-net device, served in
//! the VMM.
//!
//! WHY here and not in the back-end: a vhost-user-net back-end serves data
//! rings only (DPDK's vhost library and rust-vmm's vhost-user-backend have
//! no control queue), so the front-end answers the guest's control
//! commands and tells the back-end which rings to use with
//! SET_VRING_ENABLE. This is the thread that does it, woken by the control
//! queue's ioeventfd.
//!
//! WHY the round trip waits until the queue is served: the chains are read
//! inside the thread's quiescence section, which every UNMAP waits for, and
//! a back-end may take its full reply time-out. So the command is checked
//! and acknowledged in the section, and the back-end told after it; a
//! back-end that then refuses marks the device DEVICE_NEEDS_RESET.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use log::{debug, warn};
use vhost::vhost_user::message::{FrontendReq, VhostUserVringState};
use vmm_sys_util::epoll::EpollEvent;
use vmm_sys_util::eventfd::EventFd;

use virtio_iommu::locks::Unpoison;

use super::client::Client;
use crate::dma::{DmaSpace, ThreadDma};
use crate::net::ctrl::{serve_ctrl_queue, CtrlCommand};
use crate::net::queue::WorkerQueue;
use crate::virtio::chain::Chain;
use crate::virtio::wake::epoll_on;
use crate::virtio::VirtioInterrupt;

const TOKEN_STOP: u64 = 0;
const TOKEN_KICK: u64 = 1;

/// What the control thread owns.
pub struct CtrlQueueServer {
    /// The control queue.
    pub queue: WorkerQueue,
    /// The device's DMA space (the queue's addresses are IOVAs behind the
    /// vIOMMU).
    pub mem: DmaSpace,
    /// The transport's interrupts.
    pub interrupt: Arc<dyn VirtioInterrupt>,
    /// The back-end connection, shared with the device and its IOTLB.
    pub client: Arc<Mutex<Client>>,
    /// Data rings handed to the back-end (ring i belongs to pair i / 2).
    pub rings: Vec<u16>,
    /// Queue pairs the device offers.
    pub pairs: usize,
    /// Queue pairs the driver uses, once the back-end enabled them (read
    /// when rings start again after bus mastering was off).
    pub pairs_used: Arc<AtomicUsize>,
    /// Written by the device to end the thread.
    pub stop: EventFd,
}

/// Enables the rings of the first `pairs` pairs and disables the others.
/// Returns false (VIRTIO_NET_ERR) for a count the device does not offer
/// or when the back-end refused.
pub fn enable_pairs(client: &Mutex<Client>, rings: &[u16], offered: usize, pairs: u16) -> bool {
    let pairs = usize::from(pairs);
    if !(1..=offered).contains(&pairs) {
        return false;
    }
    let mut client = client.lock().unpoisoned();
    for &ring in rings {
        let on = usize::from(ring / 2) < pairs;
        let state = VhostUserVringState::new(u32::from(ring), u32::from(on));
        if let Err(e) = client.set(FrontendReq::SET_VRING_ENABLE, &state, &[]) {
            warn!("vhost-user-net: ring {ring} enable={on}: {e}");
            return false;
        }
    }
    debug!("vhost-user-net: driver uses {pairs} queue pair(s)");
    true
}

/// Serves the control queue until stopped.
pub fn run_ctrl_queue(mut s: CtrlQueueServer) {
    let epoll = match epoll_on(&[
        (s.stop.as_raw_fd(), TOKEN_STOP),
        (s.queue.kick.as_raw_fd(), TOKEN_KICK),
    ]) {
        Ok(ep) => ep,
        Err(e) => {
            warn!("vhost-user-net control queue: {e}");
            s.interrupt.set_needs_reset();
            return;
        }
    };
    // Past the quiescer's reader limit the thread must not run: no UNMAP
    // would wait for it.
    let mut dma = match ThreadDma::new(s.mem.clone()) {
        Ok(d) => d,
        Err(e) => {
            warn!("vhost-user-net control queue: {e}");
            s.interrupt.set_needs_reset();
            return;
        }
    };
    let mut chain = Chain::default();
    let mut events = [EpollEvent::default(); 2];
    loop {
        // Parked while asleep: no UNMAP waits for an idle thread.
        let n = match dma.parked(|| epoll.wait(-1, &mut events)) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                warn!("vhost-user-net control queue: epoll: {e}");
                s.interrupt.set_needs_reset();
                return;
            }
        };
        for ev in events.iter().take(n) {
            if ev.data() == TOKEN_STOP {
                return;
            }
            let _ = s.queue.kick.read();
            // No DMA without bus mastering; the transport kicks every
            // queue when the bit is set again.
            if !dma.bus_master() {
                continue;
            }
            let offered = s.pairs;
            let mut wanted = None;
            serve_ctrl_queue(
                &mut s.queue,
                &mut dma,
                &*s.interrupt,
                &mut chain,
                &mut |cmd| match cmd {
                    CtrlCommand::SetQueuePairs(n) => {
                        let ok = (1..=offered).contains(&usize::from(n));
                        if ok {
                            wanted = Some(n);
                        }
                        ok
                    }
                },
            );
            // Outside the section: the back-end's answer may take long.
            if let Some(n) = wanted {
                if enable_pairs(&s.client, &s.rings, offered, n) {
                    s.pairs_used.store(usize::from(n), Ordering::SeqCst);
                } else {
                    s.interrupt.set_needs_reset();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixStream;

    /// The (ring, enabled) of every SET_VRING_ENABLE the back-end got.
    fn ring_states(backend: &mut UnixStream, n: usize) -> Vec<(u32, u32)> {
        (0..n)
            .map(|_| {
                let mut m = [0u8; 20];
                backend.read_exact(&mut m).unwrap();
                let w = |i: usize| u32::from_le_bytes(m[i * 4..i * 4 + 4].try_into().unwrap());
                assert_eq!(w(0), u32::from(FrontendReq::SET_VRING_ENABLE));
                assert_eq!(w(2), 8);
                (w(3), w(4))
            })
            .collect()
    }

    #[test]
    fn vq_pairs_set_enables_the_first_pairs_and_disables_the_rest() {
        let (ours, mut backend) = UnixStream::pair().unwrap();
        let client = Mutex::new(Client::from_stream(ours).unwrap());
        let rings = [0, 1, 2, 3];
        assert!(enable_pairs(&client, &rings, 2, 1));
        assert_eq!(
            ring_states(&mut backend, 4),
            [(0, 1), (1, 1), (2, 0), (3, 0)]
        );
        assert!(enable_pairs(&client, &rings, 2, 2));
        assert_eq!(
            ring_states(&mut backend, 4),
            [(0, 1), (1, 1), (2, 1), (3, 1)]
        );
        // More pairs than offered, or none: refused, nothing sent.
        assert!(!enable_pairs(&client, &rings, 2, 3));
        assert!(!enable_pairs(&client, &rings, 2, 0));
        backend.set_nonblocking(true).unwrap();
        assert!(backend.read(&mut [0u8; 1]).is_err());
    }
}
