//! Stopping a vhost-user back-end that could not confirm an invalidation.
//!
//! WHY: the guest's UNMAP may complete only when no consumer can reach the
//! unmapped memory any more. A back-end that did not acknowledge its
//! INVALIDATE (time-out, send error, closed or broken connection) may still
//! hold the translation, so before the invalidator returns the device is
//! stopped instead: every running ring stopped with GET_VRING_BASE (the
//! spec's "stopped": the back-end no longer touches the ring), the
//! connection shut down (no UPDATE can reach the back-end afterwards), and
//! the device marked DEVICE_NEEDS_RESET with a configuration interrupt.
//! When the rings cannot be confirmed stopped, neither by the back-end's
//! answers nor by its process being gone, nothing else is safe: the VMM
//! ends with one error line before the UNMAP can complete.

use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use log::error;

use virtio_iommu::locks::Unpoison;

use super::client::Client;
use crate::virtio::VirtioInterrupt;

/// How long the back-end gets to answer GET_VRING_BASE for every running
/// ring, or its process to disappear, once it failed an invalidation.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(2);

/// Exit code of a VMM that could not stop a back-end (as any VMM failure).
pub const FAIL_CLOSED_EXIT_CODE: i32 = 1;

/// What ends the VMM when a back-end cannot be stopped; tests record it.
pub type Unconfirmed = Box<dyn Fn(&str) + Send + Sync>;

/// Ends the process with one line on stderr, as a panic does
/// (`panic_exit`), but with the failure code: the guest must not run on.
pub fn end_vmm(reason: &str) {
    let line = format!("dmavisor: error: {reason}; ending the VMM");
    error!("{line}");
    eprintln!("{line}");
    std::process::exit(FAIL_CLOSED_EXIT_CODE);
}

#[derive(Default)]
struct State {
    /// Rings handed to the back-end and not stopped since.
    running: Vec<u16>,
    /// The transport's interrupts of the current activation.
    interrupt: Option<Arc<dyn VirtioInterrupt>>,
    /// Our end of the back-end channel (its misses), shut down too.
    channel: Option<UnixStream>,
    /// The device was stopped; the connection is not used again.
    stopped: bool,
}

/// The state a stop needs, shared by the device (which fills it at
/// activation) and its IOTLB (which stops it). Lock order: the client,
/// then this.
pub struct BackendStop {
    state: Mutex<State>,
    unconfirmed: Unconfirmed,
}

/// How a stop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// The device was stopped earlier.
    Already,
    /// Every running ring was stopped (or none ran), or the back-end's
    /// process is gone.
    Confirmed,
    /// Neither could be confirmed: the unconfirmed action (the VMM's end)
    /// ran.
    Unconfirmed,
}

impl BackendStop {
    /// A stop whose failure runs `unconfirmed` ([`end_vmm`] in the VMM).
    pub fn new(unconfirmed: Unconfirmed) -> Self {
        Self {
            state: Mutex::new(State::default()),
            unconfirmed,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unpoisoned()
    }

    /// An activation handed `rings` to the back-end; `interrupt` marks the
    /// device for a reset.
    pub fn started(&self, rings: Vec<u16>, interrupt: Arc<dyn VirtioInterrupt>) {
        let mut s = self.state();
        s.running = rings;
        s.interrupt = Some(interrupt);
    }

    /// Takes the running rings (the caller stops them: reset, bus
    /// mastering off).
    pub fn take_running(&self) -> Vec<u16> {
        std::mem::take(&mut self.state().running)
    }

    /// Rings started again (bus mastering back on).
    pub fn restarted(&self, rings: &[u16]) {
        self.state().running.extend_from_slice(rings);
    }

    /// Our end of the back-end channel, shut down with the connection.
    pub fn set_channel(&self, channel: UnixStream) {
        self.state().channel = Some(channel);
    }

    /// Whether the device was stopped.
    pub fn is_stopped(&self) -> bool {
        self.state().stopped
    }

    /// Stops the device because of `why` (see the module's doc). The
    /// caller holds `client`; when this returns the back-end is stopped or
    /// the unconfirmed action ran.
    pub fn stop(&self, client: &mut Client, why: &str) -> Stopped {
        let (rings, interrupt, channel) = {
            let mut s = self.state();
            if s.stopped {
                return Stopped::Already;
            }
            s.stopped = true;
            (
                std::mem::take(&mut s.running),
                s.interrupt.clone(),
                s.channel.take(),
            )
        };
        error!("vhost-user: {why}; stopping the device");
        let deadline = Instant::now() + STOP_TIMEOUT;
        let mut unstopped = Vec::new();
        for ring in rings {
            if let Err(e) = client.stop_ring_after_failure(u32::from(ring), deadline) {
                error!("vhost-user: ring {ring} not confirmed stopped: {e}");
                unstopped.push(ring);
            }
        }
        let peer = client.peer_pid();
        client.shutdown();
        if let Some(ch) = channel {
            let _ = ch.shutdown(std::net::Shutdown::Both);
        }
        if let Some(i) = interrupt {
            i.set_needs_reset();
        }
        if unstopped.is_empty() || peer.is_some_and(|p| gone_by(p, deadline)) {
            return Stopped::Confirmed;
        }
        (self.unconfirmed)(&format!(
            "a vhost-user back-end (pid {}) did not confirm an invalidation ({why}) \
             and its rings {unstopped:?} could not be stopped",
            peer.map_or_else(|| "unknown".to_string(), |p| p.to_string())
        ));
        Stopped::Unconfirmed
    }
}

/// Whether process `pid` is gone (or a zombie, whose memory is already
/// released) by `deadline`.
fn gone_by(pid: i32, deadline: Instant) -> bool {
    loop {
        if process_gone(pid) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn process_gone(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    let r = unsafe { libc::kill(pid, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return true;
    }
    // "pid (comm) S ...": the state follows the last ')'.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().to_string())
        })
        .is_some_and(|rest| rest.starts_with('Z') || rest.starts_with('X'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_own_process_is_not_gone_and_a_reaped_child_is() {
        assert!(!process_gone(i32::try_from(std::process::id()).unwrap()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        child.wait().unwrap();
        assert!(process_gone(pid));
    }

    #[test]
    fn a_zombie_counts_as_gone() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        // Not reaped: once it exited it is a zombie.
        assert!(gone_by(pid, Instant::now() + Duration::from_secs(5)));
        child.wait().unwrap();
    }
}
