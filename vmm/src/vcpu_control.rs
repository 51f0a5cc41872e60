//! Pausing and resuming the vCPU threads (`vm.pause` / `vm.resume`).
//!
//! A vCPU thread spends its life inside `KVM_RUN`, possibly halted there by
//! the in-kernel LAPIC for seconds. To pause it, the pausing thread sets a
//! flag and sends the vCPU thread a real-time signal whose handler does
//! nothing: the signal makes `KVM_RUN` return `EINTR`, and the thread
//! checks the flag ([`VcpuControl::checkpoint`]) before every entry and
//! parks on a condition variable until resumed.
//!
//! WHY a repeated kick instead of `immediate_exit`: a signal that lands
//! after the checkpoint but before the thread enters `KVM_RUN` is lost,
//! and the thread could then stay in the guest indefinitely. Setting
//! `kvm_run.immediate_exit` from the handler closes that window but needs
//! the handler to find the thread's `kvm_run`; kicking again every
//! [`KICK_INTERVAL`] until every thread has parked closes it too, with no
//! state in the handler. The wait is bounded: a vCPU that does not park
//! in time makes [`VcpuControl::pause`] undo the pause and fail, so the
//! API never waits on a vCPU indefinitely.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Once};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use log::{debug, warn};
use thiserror::Error;
use virtio_iommu::locks::Unpoison;
use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

/// How often a pausing thread kicks the vCPUs that have not parked yet.
pub const KICK_INTERVAL: Duration = Duration::from_millis(10);

/// Errors of pause and resume.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PauseError {
    /// `pause` on a paused VM.
    #[error("the VM is already paused")]
    AlreadyPaused,
    /// `resume` on a VM that is not paused.
    #[error("the VM is not paused")]
    NotPaused,
    /// Some vCPU did not park in time; the VM was resumed.
    #[error("{parked} of {total} vCPUs stopped within {waited:?}; the VM keeps running")]
    Timeout {
        /// vCPUs that had parked (or ended).
        parked: usize,
        /// vCPUs of the VM.
        total: usize,
        /// How long the pause waited.
        waited: Duration,
    },
    /// The kick signal's handler could not be installed.
    #[error("installing the vCPU kick signal handler: {0}")]
    Signal(#[source] vmm_sys_util::errno::Error),
}

/// Why [`VcpuControl::stop`] failed.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum StopError {
    /// Some vCPU thread did not end in time.
    #[error("{running} vCPU thread(s) still ran {waited:?} after the VM was told to stop")]
    Timeout {
        /// Threads not ended.
        running: usize,
        /// How long the stop waited.
        waited: Duration,
    },
    /// The kick signal's handler could not be installed.
    #[error("installing the vCPU kick signal handler: {0}")]
    Signal(#[source] vmm_sys_util::errno::Error),
}

/// The signal that kicks a vCPU thread out of `KVM_RUN`.
pub fn kick_signal() -> libc::c_int {
    SIGRTMIN()
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Nothing to do: being delivered is the point (KVM_RUN returns EINTR).
}

/// Installs the (empty) handler of [`kick_signal`] once per process.
pub fn install_kick_handler() -> Result<(), PauseError> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        result = register_signal_handler(kick_signal(), on_kick).map_err(PauseError::Signal);
    });
    result
}

#[derive(Default)]
struct State {
    /// vCPUs must park at their next checkpoint.
    pause: bool,
    /// Every vCPU had parked: the VM is paused (what `vm.info` reports).
    paused: bool,
    /// vCPU threads parked now.
    parked: usize,
    /// vCPU threads that have left their run loop for good.
    exited: usize,
    /// The VM is being torn down: every vCPU leaves its run loop at its
    /// next checkpoint, for good.
    stop: bool,
}

/// The pause state shared by the vCPU threads and the API.
pub struct VcpuControl {
    total: usize,
    /// `State::pause`, readable without the lock: every vCPU looks at it
    /// before every `KVM_RUN`, and a shared lock there would serialise the
    /// exits of all vCPUs.
    pause_requested: AtomicBool,
    state: Mutex<State>,
    changed: Condvar,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl VcpuControl {
    /// Control for a VM of `total` vCPUs.
    pub fn new(total: usize) -> Arc<Self> {
        Arc::new(Self {
            total,
            pause_requested: AtomicBool::new(false),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            threads: Mutex::new(Vec::new()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unpoisoned()
    }

    /// Registers a started vCPU thread so that pauses can kick it.
    pub fn add_thread(&self, handle: JoinHandle<()>) {
        self.threads.lock().unpoisoned().push(handle);
    }

    /// Called by a vCPU thread before each `KVM_RUN`: parks while the VM
    /// is to be paused. Returns false once the VM is being torn down
    /// ([`VcpuControl::stop`]): the thread must leave its run loop.
    pub fn checkpoint(&self) -> bool {
        // A pause or stop that sets the flag after this load kicks the
        // thread out of the KVM_RUN it is about to enter, and it comes
        // back here.
        if !self.pause_requested.load(Ordering::Acquire) {
            return true;
        }
        let mut st = self.lock();
        if st.stop {
            return false;
        }
        if !st.pause {
            return true;
        }
        st.parked += 1;
        self.changed.notify_all();
        while st.pause && !st.stop {
            st = self.changed.wait(st).unpoisoned();
        }
        st.parked -= 1;
        !st.stop
    }

    /// Ends every vCPU thread for good and joins it: a parked vCPU is let
    /// go, a running one is kicked out of `KVM_RUN` every
    /// [`KICK_INTERVAL`] until its checkpoint sends it out of its loop.
    /// Returns how many threads were joined.
    ///
    /// WHY joined and not only told: guest RAM may be unmapped and the VM
    /// file closed only once no thread can be inside `KVM_RUN` or a
    /// device access any more. A thread that has not ended within
    /// `timeout` is an error; the caller must then keep the VM's memory
    /// mapped (it ends the VMM).
    pub fn stop(&self, timeout: Duration) -> Result<usize, StopError> {
        if let Err(PauseError::Signal(e)) = install_kick_handler() {
            return Err(StopError::Signal(e));
        }
        {
            let mut st = self.lock();
            st.stop = true;
            self.pause_requested.store(true, Ordering::Release);
            self.changed.notify_all();
        }
        let started = Instant::now();
        loop {
            self.kick_all();
            let running = self
                .threads
                .lock()
                .unpoisoned()
                .iter()
                .filter(|t| !t.is_finished())
                .count();
            if running == 0 {
                break;
            }
            if started.elapsed() >= timeout {
                return Err(StopError::Timeout {
                    running,
                    waited: started.elapsed(),
                });
            }
            std::thread::sleep(KICK_INTERVAL);
        }
        let threads = std::mem::take(&mut *self.threads.lock().unpoisoned());
        let joined = threads.len();
        for t in threads {
            if t.join().is_err() {
                warn!("a vCPU thread panicked");
            }
        }
        debug!("{joined} vCPU thread(s) stopped in {:?}", started.elapsed());
        Ok(joined)
    }

    /// vCPU threads registered and not joined yet.
    pub fn threads(&self) -> usize {
        self.threads.lock().unpoisoned().len()
    }

    /// A guard that a vCPU thread holds while it runs: dropping it (the
    /// thread ending, by return or panic) counts the vCPU as stopped for
    /// good, so a pause does not wait for it.
    pub fn running_guard(self: &Arc<Self>) -> RunningGuard {
        RunningGuard(self.clone())
    }

    /// Whether the VM is paused.
    pub fn is_paused(&self) -> bool {
        self.lock().paused
    }

    fn kick_all(&self) {
        let signal = kick_signal();
        for t in self
            .threads
            .lock()
            .unpoisoned()
            .iter()
            .filter(|t| !t.is_finished())
        {
            if let Err(e) = t.kill(signal) {
                debug!("kicking a vCPU thread: {e}");
            }
        }
    }

    /// Stops every vCPU at its next checkpoint and waits, at most
    /// `timeout`, until all have parked. On time-out the pause is undone.
    pub fn pause(&self, timeout: Duration) -> Result<(), PauseError> {
        install_kick_handler()?;
        let started = Instant::now();
        {
            let mut st = self.lock();
            if st.pause || st.paused {
                return Err(PauseError::AlreadyPaused);
            }
            st.pause = true;
            self.pause_requested.store(true, Ordering::Release);
        }
        loop {
            self.kick_all();
            let st = self.lock();
            let stopped = st.parked + st.exited;
            if stopped >= self.total {
                drop(st);
                self.lock().paused = true;
                debug!("{} vCPUs paused in {:?}", self.total, started.elapsed());
                return Ok(());
            }
            let waited = started.elapsed();
            if waited >= timeout {
                let mut st = st;
                st.pause = false;
                self.pause_requested.store(false, Ordering::Release);
                self.changed.notify_all();
                warn!(
                    "pause: {stopped} of {} vCPUs stopped within {waited:?}; resuming",
                    self.total
                );
                return Err(PauseError::Timeout {
                    parked: stopped,
                    total: self.total,
                    waited,
                });
            }
            // Woken by a parking vCPU or after one kick interval.
            drop(self.changed.wait_timeout(st, KICK_INTERVAL).unpoisoned());
        }
    }

    /// Lets the parked vCPUs run again.
    pub fn resume(&self) -> Result<(), PauseError> {
        let mut st = self.lock();
        if !st.paused {
            return Err(PauseError::NotPaused);
        }
        st.pause = false;
        self.pause_requested.store(false, Ordering::Release);
        st.paused = false;
        self.changed.notify_all();
        Ok(())
    }
}

/// See [`VcpuControl::running_guard`].
pub struct RunningGuard(Arc<VcpuControl>);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.exited += 1;
        self.0.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::thread;

    /// A stand-in vCPU: "runs the guest" by counting in a loop, with a
    /// checkpoint per iteration, until told to stop.
    fn fake_vcpu(
        ctl: &Arc<VcpuControl>,
        count: Arc<AtomicU64>,
        stop: Arc<AtomicBool>,
        park: bool,
    ) -> JoinHandle<()> {
        let ctl = ctl.clone();
        thread::spawn(move || {
            let _running = ctl.running_guard();
            while !stop.load(Ordering::Relaxed) {
                if park && !ctl.checkpoint() {
                    return;
                }
                count.fetch_add(1, Ordering::Relaxed);
                thread::sleep(Duration::from_millis(1));
            }
        })
    }

    #[test]
    fn pause_parks_every_vcpu_and_resume_releases_them() {
        let ctl = VcpuControl::new(2);
        let count = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        for _ in 0..2 {
            ctl.add_thread(fake_vcpu(&ctl, count.clone(), stop.clone(), true));
        }
        assert!(!ctl.is_paused());
        assert_eq!(ctl.resume(), Err(PauseError::NotPaused));
        ctl.pause(Duration::from_secs(5)).unwrap();
        assert!(ctl.is_paused());
        let frozen = count.load(Ordering::Relaxed);
        thread::sleep(Duration::from_millis(50));
        assert_eq!(count.load(Ordering::Relaxed), frozen, "a paused vCPU ran");
        assert_eq!(
            ctl.pause(Duration::from_secs(5)),
            Err(PauseError::AlreadyPaused)
        );
        ctl.resume().unwrap();
        assert!(!ctl.is_paused());
        assert_eq!(ctl.resume(), Err(PauseError::NotPaused));
        let t0 = Instant::now();
        while count.load(Ordering::Relaxed) == frozen {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "no progress after resume"
            );
            thread::sleep(Duration::from_millis(1));
        }
        // Pause again works after a resume.
        ctl.pause(Duration::from_secs(5)).unwrap();
        ctl.resume().unwrap();
        stop.store(true, Ordering::Relaxed);
    }

    #[test]
    fn a_vcpu_that_never_parks_times_out_and_the_vm_keeps_running() {
        let ctl = VcpuControl::new(2);
        let count = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        ctl.add_thread(fake_vcpu(&ctl, count.clone(), stop.clone(), true));
        ctl.add_thread(fake_vcpu(&ctl, count.clone(), stop.clone(), false));
        let err = ctl.pause(Duration::from_millis(100)).unwrap_err();
        assert!(
            matches!(
                err,
                PauseError::Timeout {
                    parked: 1,
                    total: 2,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(!ctl.is_paused());
        // The parked one was let go: nothing parked, no pause pending, and
        // the count goes on (deadlines only bound a failure's wait).
        let parker_runs = |ctl: &VcpuControl| {
            let st = ctl.lock();
            (st.parked, st.pause)
        };
        let t0 = Instant::now();
        while parker_runs(&ctl) != (0, false) {
            assert!(t0.elapsed() < Duration::from_secs(5), "still parked");
            thread::sleep(Duration::from_millis(1));
        }
        let before = count.load(Ordering::Relaxed);
        while count.load(Ordering::Relaxed) < before + 10 {
            assert!(t0.elapsed() < Duration::from_secs(5), "no progress");
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(ctl.resume(), Err(PauseError::NotPaused));
        stop.store(true, Ordering::Relaxed);
    }

    #[test]
    fn stop_ends_running_parked_and_blocked_vcpus_and_joins_them() {
        let ctl = VcpuControl::new(3);
        let count = Arc::new(AtomicU64::new(0));
        // Never told to stop by its own flag: only the control ends it.
        let never = Arc::new(AtomicBool::new(false));
        let token = Arc::new(());
        for _ in 0..2 {
            let t = token.clone();
            let (c, n, s) = (ctl.clone(), count.clone(), never.clone());
            ctl.add_thread(thread::spawn(move || {
                let _t = t;
                let _running = c.running_guard();
                while !s.load(Ordering::Relaxed) {
                    if !c.checkpoint() {
                        return;
                    }
                    n.fetch_add(1, Ordering::Relaxed);
                    thread::sleep(Duration::from_millis(1));
                }
            }));
        }
        // A third one blocked in a syscall (as in KVM_RUN): only the kick
        // brings it back to its checkpoint.
        let mut fds = [0; 2];
        // SAFETY: fds is a valid array of two descriptors to fill.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let rd = fds[0];
        install_kick_handler().unwrap();
        let (c, t) = (ctl.clone(), token.clone());
        ctl.add_thread(thread::spawn(move || {
            let _t = t;
            let _running = c.running_guard();
            while c.checkpoint() {
                let mut b = [0u8; 1];
                // SAFETY: reads at most one byte into `b`.
                unsafe { libc::read(rd, b.as_mut_ptr().cast(), 1) };
            }
        }));
        // Parked first: a stop must also release a paused VM's vCPUs.
        ctl.pause(Duration::from_secs(5)).unwrap();
        assert_eq!(ctl.stop(Duration::from_secs(5)), Ok(3));
        assert_eq!(ctl.threads(), 0, "every handle joined");
        assert_eq!(Arc::strong_count(&token), 1, "every thread ended");
        let after = count.load(Ordering::Relaxed);
        thread::sleep(Duration::from_millis(20));
        assert_eq!(count.load(Ordering::Relaxed), after, "a stopped vCPU ran");
        // SAFETY: both descriptors are ours, closed once.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
    }

    #[test]
    fn a_vcpu_that_never_checks_in_fails_the_stop() {
        let ctl = VcpuControl::new(1);
        let count = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        ctl.add_thread(fake_vcpu(&ctl, count, stop.clone(), false));
        let err = ctl.stop(Duration::from_millis(100)).unwrap_err();
        assert!(
            matches!(err, StopError::Timeout { running: 1, .. }),
            "{err:?}"
        );
        stop.store(true, Ordering::Relaxed);
    }

    #[test]
    fn ended_vcpus_do_not_hold_up_a_pause() {
        let ctl = VcpuControl::new(2);
        let stop = Arc::new(AtomicBool::new(true));
        let count = Arc::new(AtomicU64::new(0));
        let done = fake_vcpu(&ctl, count.clone(), stop.clone(), true);
        while !done.is_finished() {
            thread::sleep(Duration::from_millis(1));
        }
        ctl.add_thread(done);
        let live_stop = Arc::new(AtomicBool::new(false));
        ctl.add_thread(fake_vcpu(&ctl, count, live_stop.clone(), true));
        ctl.pause(Duration::from_secs(5)).unwrap();
        ctl.resume().unwrap();
        live_stop.store(true, Ordering::Relaxed);
    }

    #[test]
    fn a_thread_blocked_in_a_syscall_is_kicked_out() {
        // A vCPU blocked in KVM_RUN is like a thread blocked in a syscall
        // that returns EINTR on a signal: here, a read of a pipe with
        // nothing in it.
        let ctl = VcpuControl::new(1);
        let mut fds = [0; 2];
        // SAFETY: fds is a valid array of two descriptors to fill.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let (rd, wr) = (fds[0], fds[1]);
        let interrupted = Arc::new(AtomicU64::new(0));
        let reading = Arc::new(AtomicBool::new(false));
        let c = ctl.clone();
        let i = interrupted.clone();
        let r = reading.clone();
        install_kick_handler().unwrap();
        let h = thread::spawn(move || {
            let _running = c.running_guard();
            loop {
                if !c.checkpoint() {
                    return;
                }
                r.store(true, Ordering::SeqCst);
                let mut b = [0u8; 1];
                // SAFETY: reads at most one byte into `b`.
                let n = unsafe { libc::read(rd, b.as_mut_ptr().cast(), 1) };
                if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    i.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                return;
            }
        });
        ctl.add_thread(h);
        // Past its checkpoint: only an interrupted read lets it park.
        while !reading.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(1));
        }
        ctl.pause(Duration::from_secs(5)).unwrap();
        assert!(interrupted.load(Ordering::Relaxed) >= 1);
        ctl.resume().unwrap();
        // Let it end: one byte in the pipe.
        // SAFETY: writes one byte from a valid buffer.
        assert_eq!(unsafe { libc::write(wr, [1u8].as_ptr().cast(), 1) }, 1);
        // SAFETY: both descriptors are ours and closed once.
        unsafe {
            libc::close(wr);
        }
        let _ = rd;
    }
}
