//! The VMM's one VM slot and its transitions, for the REST API and `main`:
//! empty -> created (`vm.create`, or the command line) -> running
//! (`vm.boot`), and back to empty by `vm.delete` of a created VM.
//!
//! WHY the VM is built on the caller's thread: `vm.boot` answers once the
//! VM is built and its vCPUs started, as cloud-hypervisor's does, and
//! nothing in a build waits on a vCPU.
//!
//! Every VM ends on `main`'s thread ([`Controller::on_exit`]), one exit
//! event at a time: the guest's power-off or reboot, `vm.shutdown`,
//! `vm.reboot`, `vm.delete` of a running VM (which waits for it) and
//! `vmm.shutdown`. The VM is torn down in the process (`crate::vm_owner`)
//! and the VMM goes on: it serves the API with the VM created again
//! (`vm.boot` starts it anew), or, for a reboot, builds it again at once
//! from its configuration (hotplugged devices included). A VMM without
//! an API socket ends after a power-off or a reboot, with status 0, as
//! nothing could boot its VM again; failures end it with status 1.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use log::{debug, info, warn};

use virtio_iommu::locks::Unpoison;

use super::routes::{ApiError, ColdPlug, VmApi, VmSlot, VmmApi};
use super::vm_config;
use crate::config::VmConfig;
use crate::error::Error;
use crate::exit::{ExitEvent, ExitSender};
use crate::net::passed_taps;

/// Builds and starts a VM (`crate::vm::start`; a fake in tests).
pub type Builder = Box<dyn Fn(&VmConfig, ExitSender) -> Result<Booted, Error> + Send + Sync>;

type Finish = Box<dyn FnOnce(&ExitEvent) + Send>;

/// A VM whose vCPUs run: what the API asks of it, and what to do once the
/// VMM's exit channel said why it ends.
pub struct Booted {
    /// The running VM as the REST API sees it.
    pub api: Arc<dyn VmApi>,
    /// Flushes the serial output, logs the devices' figures and tears
    /// the VM down (every thread joined, guest RAM released).
    pub finish: Box<dyn FnOnce(&ExitEvent) + Send>,
}

enum Phase {
    Empty,
    Created {
        config: VmConfig,
        booting: bool,
    },
    /// Its configuration is the VM's own (`VmApi::config`): hotplug
    /// changes it.
    Running {
        vm: Arc<dyn VmApi>,
        finish: Option<Finish>,
        /// What it was booted from: its configuration if its own view
        /// cannot be read back.
        booted_from: VmConfig,
    },
}

/// How long `vm.delete` of a running VM waits for `main` to tear it down.
pub const DELETE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the teardown before the VMM ends may take. WHY a bound: the
/// process ending releases everything at once (as it did before VMs were
/// torn down in the process), so a device whose stop hangs (a back-end
/// that never answers) must not keep the VMM from ending.
pub const EXIT_TEARDOWN_BOUND: Duration = Duration::from_secs(30);

/// Ends the process with `code` after `bound`, if it has not ended by
/// then; the VMM's last act, so nothing is left to wait for.
fn exit_anyway_after(bound: Duration, code: i32) {
    // The narrowest allow-list there is (sleep, write, exit): that of the
    // serial reader.
    let spawned = crate::sandbox::spawn(
        crate::sandbox::ThreadKind::Serial,
        "exit-watchdog",
        move || {
            std::thread::sleep(bound);
            eprintln!("dmavisor: the VM's teardown took over {bound:?}; ending the VMM anyway");
            std::process::exit(code);
        },
    );
    if let Err(e) = spawned {
        warn!("no exit watchdog ({e}); the teardown is not bounded");
    }
}

/// The VMM: at most one VM, created, booted and ended through it.
pub struct Controller {
    phase: Mutex<Phase>,
    /// Signalled whenever a torn-down VM's phase settles.
    settled: Condvar,
    exit: ExitSender,
    build: Builder,
    /// The API serves: a VM that ends leaves the VMM running.
    serving: AtomicBool,
    /// The teardown before the VMM ends is bounded by
    /// [`EXIT_TEARDOWN_BOUND`] (the process is ended anyway after it).
    bounded_exit: AtomicBool,
}

impl Controller {
    /// A VMM with no VM whose ending is announced on `exit`.
    pub fn new(exit: ExitSender, build: Builder) -> Self {
        Self {
            phase: Mutex::new(Phase::Empty),
            settled: Condvar::new(),
            exit,
            build,
            serving: AtomicBool::new(false),
            bounded_exit: AtomicBool::new(false),
        }
    }

    /// Ends the process [`EXIT_TEARDOWN_BOUND`] after an event that ends
    /// the VMM, whether the VM's teardown has finished or not (`main`;
    /// tests leave it off, they are not the process).
    pub fn bound_exit_teardown(&self) {
        self.bounded_exit.store(true, Ordering::SeqCst);
    }

    /// The API serves (`--api-socket`): a VM that powers off or reboots
    /// leaves the VMM running.
    pub fn set_serving_api(&self, on: bool) {
        self.serving.store(on, Ordering::SeqCst);
    }

    fn lock(&self) -> MutexGuard<'_, Phase> {
        // A panic ends the process (`crate::panic_exit`): no half-made
        // state to protect.
        self.phase.lock().unpoisoned()
    }

    /// Takes `config` (the command line's VM, or the one a reboot handed
    /// over) as the VM being booted: no API request can take it away
    /// before [`Controller::boot_reserved`] builds it.
    pub fn reserve(&self, config: VmConfig) -> Result<(), Error> {
        let mut phase = self.lock();
        if !matches!(*phase, Phase::Empty) {
            return Err(Error::VmExists);
        }
        *phase = Phase::Created {
            config,
            booting: true,
        };
        Ok(())
    }

    /// Builds the VM [`Controller::reserve`] took, with the builder's own
    /// error for `main`'s exit code.
    pub fn boot_reserved(&self) -> Result<(), Error> {
        let config = match &*self.lock() {
            Phase::Created {
                config,
                booting: true,
            } => config.clone(),
            _ => return Err(Error::NothingReserved),
        };
        self.build_and_run(config)
    }

    /// [`Controller::reserve`], then [`Controller::boot_reserved`].
    pub fn create_and_boot(&self, config: VmConfig) -> Result<(), Error> {
        self.reserve(config)?;
        self.boot_reserved()
    }

    fn build_and_run(&self, config: VmConfig) -> Result<(), Error> {
        crate::event_monitor::emit("vm", "booting", &[]);
        match (self.build)(&config, self.exit.clone()) {
            Ok(booted) => {
                crate::event_monitor::emit("vm", "booted", &[]);
                *self.lock() = Phase::Running {
                    vm: booted.api,
                    finish: Some(booted.finish),
                    booted_from: config,
                };
                Ok(())
            }
            Err(e) => {
                *self.lock() = Phase::Created {
                    config,
                    booting: false,
                };
                self.settled.notify_all();
                Err(e)
            }
        }
    }

    /// The created or running VM's configuration as `vm.info` prints it
    /// (a running one's includes its hotplugged devices).
    pub fn config_json(&self) -> Option<String> {
        match &*self.lock() {
            Phase::Empty => None,
            Phase::Created { config, .. } => Some(vm_config::to_json(config).to_string()),
            // The running VM's own view: it includes hotplugged devices.
            Phase::Running { vm, .. } => Some(vm.config().to_string()),
        }
    }

    /// Handles one event of the exit channel on `main`'s thread: tears
    /// the running VM down (if one runs), drops what it had sent before it
    /// stopped (`pending` yields the channel's queued events), then serves
    /// on, rebuilds it for a reboot, or returns the exit code that ends
    /// the VMM.
    pub fn on_exit(
        &self,
        event: &ExitEvent,
        mut pending: impl FnMut() -> Option<ExitEvent>,
    ) -> Option<i32> {
        let ends_vmm = match event {
            ExitEvent::ApiShutdown | ExitEvent::TripleFault { .. } | ExitEvent::Error(_) => true,
            ExitEvent::PowerOff | ExitEvent::Reset => !self.serving.load(Ordering::SeqCst),
            ExitEvent::VmShutdown | ExitEvent::ApiReboot => false,
        };
        if ends_vmm && self.bounded_exit.load(Ordering::SeqCst) {
            exit_anyway_after(EXIT_TEARDOWN_BOUND, event.exit_code());
        }
        let stopped = self.stop_running(event);
        let (mut shutdown_asked, mut vm_shutdown_asked) = (false, false);
        if stopped.is_some() {
            // The VM's threads are joined: whatever it sent is queued
            // now, and is about a VM that is gone. A vmm.shutdown outlives
            // it, and a vm.shutdown (or vm.delete) wins over a reboot.
            while let Some(e) = pending() {
                match e {
                    ExitEvent::ApiShutdown => shutdown_asked = true,
                    ExitEvent::VmShutdown => vm_shutdown_asked = true,
                    other => debug!("dropped after the teardown: {}", other.describe()),
                }
            }
        }
        let rebuild = matches!(event, ExitEvent::Reset | ExitEvent::ApiReboot)
            && !vm_shutdown_asked
            && !(ends_vmm || shutdown_asked);
        if stopped.is_some() && !rebuild {
            crate::event_monitor::emit("vm", "shutdown", &[]);
        }
        if ends_vmm || shutdown_asked {
            return Some(if ends_vmm { event.exit_code() } else { 0 });
        }
        let Some(config) = stopped else {
            debug!("{}: no VM runs", event.describe());
            return None;
        };
        if rebuild {
            crate::event_monitor::emit("vm", "rebooting", &[]);
            // A VM that cannot come back (a vhost-user back-end that ended
            // with its connection, or refuses a new one) stays created:
            // every step of a build fails or times out, none waits
            // unbounded, and the failure is logged and reported.
            match self.build_and_run(config) {
                Ok(()) => {
                    info!("VM rebooted in place");
                    crate::event_monitor::emit("vm", "rebooted", &[]);
                }
                Err(e) => {
                    let why = format!("rebuilding the VM failed: {e}");
                    warn!("reboot: {why}; the VM stays created (vm.boot starts it again)");
                    crate::event_monitor::emit("vm", "shutdown", &[("reason", &why)]);
                }
            }
        } else {
            self.settle(config);
        }
        None
    }

    /// Takes the running VM out of its slot and tears it down; the slot
    /// stays busy (created, being booted) until the caller settles it.
    /// Returns the configuration to boot it again with.
    fn stop_running(&self, event: &ExitEvent) -> Option<VmConfig> {
        let (vm, finish, config) = {
            let mut phase = self.lock();
            let Phase::Running { .. } = &*phase else {
                return None;
            };
            let Phase::Running {
                vm,
                finish,
                booted_from,
            } = std::mem::replace(&mut *phase, Phase::Empty)
            else {
                return None;
            };
            // The VM's own view includes hotplugged devices.
            let config = vm_config::parse(vm.config().to_string().as_bytes()).unwrap_or_else(|e| {
                warn!("the running VM's configuration does not parse ({e}); using the booted one");
                booted_from
            });
            *phase = Phase::Created {
                config: config.clone(),
                booting: true,
            };
            (vm, finish, config)
        };
        // The API's view holds devices too: it goes first.
        drop(vm);
        match finish {
            Some(f) => f(event),
            None => info!("{}", event.describe()),
        }
        Some(config)
    }

    fn settle(&self, config: VmConfig) {
        *self.lock() = Phase::Created {
            config,
            booting: false,
        };
        self.settled.notify_all();
    }
}

impl VmmApi for Controller {
    fn slot(&self) -> VmSlot {
        match &*self.lock() {
            Phase::Empty => VmSlot::Empty,
            Phase::Created { config, booting } => VmSlot::Created {
                config: vm_config::to_json(config),
                memory: config.memory.size,
                booting: *booting,
            },
            Phase::Running { vm, .. } => VmSlot::Running(vm.clone()),
        }
    }

    fn create(&self, config: VmConfig) -> Result<(), ApiError> {
        let mut phase = self.lock();
        if !matches!(*phase, Phase::Empty) {
            return Err(ApiError::Conflict(
                "vm.create: a VM exists already (vm.delete it first)".into(),
            ));
        }
        *phase = Phase::Created {
            config,
            booting: false,
        };
        info!("VM created through the API");
        Ok(())
    }

    fn boot(&self) -> Result<(), ApiError> {
        let config = {
            let mut phase = self.lock();
            let config = match &*phase {
                Phase::Created {
                    config,
                    booting: false,
                } => config.clone(),
                Phase::Empty => {
                    return Err(ApiError::NotCreated(
                        "vm.boot: no VM has been created".into(),
                    ))
                }
                _ => return Err(ApiError::WrongState("vm.boot: the VM is booted".into())),
            };
            *phase = Phase::Created {
                config: config.clone(),
                booting: true,
            };
            config
        };
        self.build_and_run(config).map_err(|e| {
            warn!("vm.boot: {e}");
            ApiError::Failed(format!("vm.boot: {e}; the VM stays created"))
        })?;
        info!("VM booted through the API");
        Ok(())
    }

    fn cold_plug(&self, change: ColdPlug) -> Result<(), ApiError> {
        let mut phase = self.lock();
        let Phase::Created {
            config,
            booting: false,
        } = &mut *phase
        else {
            return Err(ApiError::WrongState(
                "the VM is not in the created state".into(),
            ));
        };
        super::cold_plug::apply(config, change)
    }

    fn delete(&self) -> Result<(), ApiError> {
        let mut phase = self.lock();
        if let Phase::Running { vm, .. } = &*phase {
            // main tears it down (`on_exit`); the reply waits for it.
            vm.shutdown();
            let deadline = Instant::now() + DELETE_TIMEOUT;
            while matches!(
                &*phase,
                Phase::Running { .. } | Phase::Created { booting: true, .. }
            ) {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(ApiError::Failed(format!(
                        "vm.delete: the VM was not shut down within {DELETE_TIMEOUT:?}"
                    )));
                }
                phase = self.settled.wait_timeout(phase, left).unpoisoned().0;
            }
        }
        match &*phase {
            Phase::Empty => Ok(()),
            Phase::Created {
                booting: false,
                config,
            } => {
                // TAP queues a client passed for this VM end with it.
                for net in &config.net {
                    passed_taps::forget(&net.tap);
                }
                *phase = Phase::Empty;
                info!("VM deleted through the API");
                crate::event_monitor::emit("vm", "deleted", &[]);
                Ok(())
            }
            _ => Err(ApiError::WrongState(
                "vm.delete: the VM is being booted".into(),
            )),
        }
    }

    /// `vmm.shutdown`: main tears the VM down (if one runs) and ends.
    fn shutdown(&self) {
        // The main thread may already be gone with another reason.
        let _ = self.exit.send(ExitEvent::ApiShutdown);
    }

    fn reboot(&self) {
        let vm = match &*self.lock() {
            Phase::Running { vm, .. } => Some(vm.clone()),
            _ => None,
        };
        match vm {
            Some(vm) => vm.reboot(),
            None => warn!("vm.reboot: no VM runs"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::mpsc::{channel, Receiver};

    use serde_json::{json, Value};

    use super::*;
    use crate::api::test_fakes::FakeVm;
    use crate::net::passed_taps;

    struct Probe {
        builds: AtomicU32,
        finished: AtomicU32,
        fail: AtomicBool,
    }

    fn controller() -> (Controller, Arc<Probe>, Receiver<ExitEvent>) {
        let (tx, rx) = channel();
        let probe = Arc::new(Probe {
            builds: AtomicU32::new(0),
            finished: AtomicU32::new(0),
            fail: AtomicBool::new(false),
        });
        let p = probe.clone();
        let build: Builder = Box::new(move |config, exit| {
            p.builds.fetch_add(1, Ordering::SeqCst);
            if p.fail.load(Ordering::SeqCst) {
                return Err(Error::ReadFile {
                    what: "kernel",
                    path: "/k".into(),
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                });
            }
            let done = p.clone();
            Ok(Booted {
                api: Arc::new(
                    FakeVm::default()
                        .with_config(vm_config::to_json(config))
                        .reporting_exits(exit),
                ),
                finish: Box::new(move |_| {
                    done.finished.fetch_add(1, Ordering::SeqCst);
                }),
            })
        });
        (Controller::new(tx, build), probe, rx)
    }

    fn config() -> VmConfig {
        vm_config::parse(br#"{"payload": {"kernel": "/k"}, "cpus": {"boot_vcpus": 2}}"#)
            .expect("valid")
    }

    fn is_empty(c: &Controller) -> bool {
        matches!(c.slot(), VmSlot::Empty)
    }

    #[test]
    fn create_boot_finish() {
        let (c, probe, rx) = controller();
        assert!(is_empty(&c) && c.config_json().is_none());
        assert_eq!(c.boot().map_err(|e| e.status()), Err(404));
        c.create(config()).expect("create");
        assert!(matches!(c.slot(), VmSlot::Created { booting: false, .. }));
        assert_eq!(c.create(config()).map_err(|e| e.status()), Err(409));
        let json = c.config_json().expect("created");
        assert_eq!(vm_config::parse(json.as_bytes()).expect("valid"), config());
        c.boot().expect("boot");
        assert!(matches!(c.slot(), VmSlot::Running(_)));
        assert_eq!(probe.builds.load(Ordering::SeqCst), 1);
        assert_eq!(c.boot().map_err(|e| e.status()), Err(405));
        assert_eq!(c.create(config()).map_err(|e| e.status()), Err(409));
        assert_eq!(c.config_json().as_ref(), Some(&json));
        // vm.reboot goes to the running VM, which asks main to rebuild
        // it: torn down once, built again in place.
        c.reboot();
        let event = rx.try_recv().expect("an event");
        assert_eq!(event, ExitEvent::ApiReboot);
        assert_eq!(c.on_exit(&event, || rx.try_recv().ok()), None);
        assert_eq!(probe.finished.load(Ordering::SeqCst), 1, "torn down once");
        assert_eq!(probe.builds.load(Ordering::SeqCst), 2, "built again");
        assert!(matches!(c.slot(), VmSlot::Running(_)));
        assert_eq!(c.config_json(), Some(json));
    }

    /// Feeds `events` to `on_exit` as main does, draining what follows.
    fn deliver(c: &Controller, rx: &Receiver<ExitEvent>, event: ExitEvent) -> Option<i32> {
        c.on_exit(&event, || rx.try_recv().ok())
    }

    #[test]
    fn vm_shutdown_tears_down_and_vm_boot_starts_it_again() {
        let (c, probe, rx) = controller();
        c.set_serving_api(true);
        c.create(config()).expect("create");
        c.boot().expect("boot");
        // vm.shutdown: the VM asks main, which tears it down and serves on.
        if let VmSlot::Running(vm) = c.slot() {
            vm.shutdown();
        }
        let event = rx.try_recv().expect("an event");
        assert_eq!(event, ExitEvent::VmShutdown);
        assert_eq!(deliver(&c, &rx, event), None, "the VMM goes on");
        assert_eq!(probe.finished.load(Ordering::SeqCst), 1);
        assert!(matches!(c.slot(), VmSlot::Created { booting: false, .. }));
        assert_eq!(
            vm_config::parse(c.config_json().expect("kept").as_bytes()).expect("valid"),
            config()
        );
        // A second vm.shutdown finds nothing to shut down.
        assert_eq!(deliver(&c, &rx, ExitEvent::VmShutdown), None);
        assert_eq!(probe.finished.load(Ordering::SeqCst), 1);
        // vm.boot: the same configuration again.
        c.boot().expect("boot again");
        assert_eq!(probe.builds.load(Ordering::SeqCst), 2);
        assert!(matches!(c.slot(), VmSlot::Running(_)));
        // vmm.shutdown: the VM torn down, the VMM ends with 0.
        c.shutdown();
        let event = rx.try_recv().expect("an event");
        assert_eq!(deliver(&c, &rx, event), Some(0));
        assert_eq!(probe.finished.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn guest_power_off_and_reboot_end_a_vmm_without_api() {
        for event in [ExitEvent::PowerOff, ExitEvent::Reset] {
            let (c, probe, rx) = controller();
            c.create_and_boot(config()).expect("boot");
            assert_eq!(deliver(&c, &rx, event.clone()), Some(0), "{event:?}");
            assert_eq!(probe.finished.load(Ordering::SeqCst), 1, "torn down");
            assert_eq!(probe.builds.load(Ordering::SeqCst), 1, "not rebuilt");
        }
        let (c, probe, rx) = controller();
        c.set_serving_api(true);
        c.create_and_boot(config()).expect("boot");
        let crash = ExitEvent::TripleFault { vcpu: 0 };
        assert_eq!(deliver(&c, &rx, crash), Some(1), "failures end the VMM");
        assert_eq!(probe.finished.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn guest_reboot_rebuilds_in_place_and_power_off_leaves_it_created() {
        let (c, probe, rx) = controller();
        c.set_serving_api(true);
        c.create_and_boot(config()).expect("boot");
        assert_eq!(deliver(&c, &rx, ExitEvent::Reset), None);
        assert_eq!(probe.finished.load(Ordering::SeqCst), 1);
        assert_eq!(probe.builds.load(Ordering::SeqCst), 2);
        assert!(matches!(c.slot(), VmSlot::Running(_)));
        assert_eq!(deliver(&c, &rx, ExitEvent::PowerOff), None);
        assert_eq!(probe.finished.load(Ordering::SeqCst), 2);
        assert_eq!(probe.builds.load(Ordering::SeqCst), 2);
        assert!(matches!(c.slot(), VmSlot::Created { booting: false, .. }));
        // A rebuild that fails leaves the VM created, the VMM serving.
        c.boot().expect("boot");
        probe.fail.store(true, Ordering::SeqCst);
        assert_eq!(deliver(&c, &rx, ExitEvent::Reset), None);
        assert!(matches!(c.slot(), VmSlot::Created { booting: false, .. }));
    }

    /// A VM with a vhost-user NIC is rebuilt like any other (its back-end
    /// reconnected by the build); when the back-end is gone the rebuild
    /// fails and the VM stays created, the VMM serving, with vm.boot
    /// able to start it again once the back-end is back.
    #[test]
    fn a_vhost_user_vm_is_rebuilt_on_a_guest_reboot() {
        let (c, probe, rx) = controller();
        c.set_serving_api(true);
        let vu = vm_config::parse(
            br#"{"payload": {"kernel": "/k"}, "memory": {"size": 1073741824, "shared": true},
                "net": [{"vhost_user": true, "vhost_socket": "/tmp/vu.sock"}]}"#,
        )
        .expect("valid");
        c.create_and_boot(vu.clone()).expect("boot");
        assert_eq!(deliver(&c, &rx, ExitEvent::Reset), None);
        assert_eq!(probe.finished.load(Ordering::SeqCst), 1);
        assert_eq!(probe.builds.load(Ordering::SeqCst), 2, "rebuilt");
        assert!(matches!(c.slot(), VmSlot::Running(_)));
        // The back-end ended with its connection: the rebuild fails.
        probe.fail.store(true, Ordering::SeqCst);
        assert_eq!(deliver(&c, &rx, ExitEvent::Reset), None, "the VMM goes on");
        assert_eq!(probe.finished.load(Ordering::SeqCst), 2);
        assert_eq!(probe.builds.load(Ordering::SeqCst), 3);
        assert!(matches!(c.slot(), VmSlot::Created { booting: false, .. }));
        let kept = vm_config::parse(c.config_json().expect("created").as_bytes()).expect("valid");
        assert_eq!(kept, vu, "the configuration is kept for vm.boot");
        probe.fail.store(false, Ordering::SeqCst);
        c.boot().expect("boot once the back-end is back");
        assert_eq!(probe.builds.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn what_a_torn_down_vm_sent_is_dropped() {
        let (c, probe, rx) = controller();
        c.set_serving_api(true);
        c.create_and_boot(config()).expect("boot");
        // A second vCPU's reset queued behind the first one's power-off:
        // about the VM that is gone, so nothing is rebuilt.
        let tx = c.exit.clone();
        tx.send(ExitEvent::Reset).expect("queued");
        assert_eq!(deliver(&c, &rx, ExitEvent::PowerOff), None);
        assert_eq!(probe.builds.load(Ordering::SeqCst), 1);
        assert!(rx.try_recv().is_err(), "drained");
        assert!(matches!(c.slot(), VmSlot::Created { booting: false, .. }));
        // A vmm.shutdown queued behind a VM's end is kept.
        c.boot().expect("boot");
        tx.send(ExitEvent::ApiShutdown).expect("queued");
        assert_eq!(deliver(&c, &rx, ExitEvent::Reset), Some(0));
        assert_eq!(probe.builds.load(Ordering::SeqCst), 2, "no rebuild");
    }

    #[test]
    fn delete_of_a_running_vm_waits_for_its_teardown() {
        let (c, probe, rx) = controller();
        c.set_serving_api(true);
        let c = Arc::new(c);
        c.create_and_boot(config()).expect("boot");
        // main's loop.
        let main = {
            let c = c.clone();
            std::thread::spawn(move || {
                while let Ok(e) = rx.recv() {
                    if let Some(code) = c.on_exit(&e, || rx.try_recv().ok()) {
                        return code;
                    }
                }
                -1
            })
        };
        c.delete().expect("delete");
        assert!(is_empty(&c), "deleted once torn down");
        assert_eq!(probe.finished.load(Ordering::SeqCst), 1);
        c.shutdown();
        assert_eq!(main.join().expect("main"), 0);
    }

    #[test]
    fn a_failed_build_leaves_the_vm_created() {
        let (c, probe, _rx) = controller();
        c.create(config()).expect("create");
        probe.fail.store(true, Ordering::SeqCst);
        let err = c.boot().unwrap_err();
        assert_eq!(err.status(), 500);
        assert!(err.to_string().contains("kernel"), "{err}");
        assert!(matches!(c.slot(), VmSlot::Created { booting: false, .. }));
        probe.fail.store(false, Ordering::SeqCst);
        c.boot().expect("second boot");
        assert_eq!(probe.builds.load(Ordering::SeqCst), 2);
    }

    /// libvirt's order: vm.create, then vm.add-net (TAP queues passed with
    /// SCM_RIGHTS), vm.add-disk and vm.add-device before vm.boot. Each is
    /// a 204 that changes the created VM's configuration, which the boot
    /// builds; bad or duplicate ids change nothing; vm.remove-device takes
    /// a device out again; the passed TAP lives until vm.delete.
    #[test]
    fn devices_added_before_boot_join_the_configuration() {
        use crate::api::routes::handle_with_fds;
        use crate::net::tap::Tap;

        let (c, probe, _rx) = controller();
        let put = |path: &str, body: &str, fds: Vec<std::fs::File>| {
            handle_with_fds("PUT", &format!("/api/v1/{path}"), body.as_bytes(), fds, &c)
        };
        assert_eq!(
            put("vm.add-disk", r#"{"path": "/d.img"}"#, vec![]).status,
            404
        );
        c.create(config()).expect("create");
        let tap = Tap::open("dmvcold0", false).expect("a TAP (root, /dev/net/tun)");
        let name = tap.name().to_string();
        let r = put(
            "vm.add-net",
            r#"{"id": "n0", "mac": "52:54:00:00:00:07"}"#,
            vec![tap.into_file()],
        );
        assert_eq!((r.status, r.body.clone()), (204, None), "{r:?}");
        let r = put("vm.add-disk", r#"{"path": "/d.img", "id": "d0"}"#, vec![]);
        assert_eq!(r.status, 204, "{r:?}");
        let r = put("vm.add-disk", r#"{"path": "/e.img", "id": "n0"}"#, vec![]);
        assert_eq!(r.status, 400, "a duplicate id: {r:?}");
        let r = put(
            "vm.add-device",
            r#"{"path": "/sys/bus/pci/devices/0000:01:00.0", "id": "x0"}"#,
            vec![],
        );
        assert_eq!(r.status, 204, "{r:?}");
        assert_eq!(
            put("vm.remove-device", r#"{"id": "x0"}"#, vec![]).status,
            204
        );
        assert_eq!(
            put("vm.remove-device", r#"{"id": "x0"}"#, vec![]).status,
            404
        );
        let json: Value = serde_json::from_str(&c.config_json().expect("created")).expect("json");
        assert_eq!(json["net"][0]["tap"], name.as_str(), "{json}");
        assert_eq!(json["net"][0]["id"], "n0", "{json}");
        assert_eq!(json["disks"][0]["id"], "d0", "{json}");
        assert_eq!(json["devices"], json!([]), "{json}");
        assert_eq!(passed_taps::queue_count(&name), 1);
        // The boot builds what was added.
        c.boot().expect("boot");
        assert_eq!(probe.builds.load(Ordering::SeqCst), 1);
        let built = c.config_json().expect("running");
        assert!(built.contains(&name) && built.contains("d0"), "{built}");
        // After a running VM, nothing is cold-plugged (hotplug's business).
        let r = put("vm.add-disk", r#"{"path": "/f.img"}"#, vec![]);
        assert_ne!(r.status, 204, "{r:?}");
    }

    #[test]
    fn a_created_vm_forgets_its_passed_taps_when_deleted() {
        use crate::api::routes::handle_with_fds;
        use crate::net::tap::Tap;

        let (c, _probe, _rx) = controller();
        c.create(config()).expect("create");
        let tap = Tap::open("dmvcold1", false).expect("a TAP (root, /dev/net/tun)");
        let name = tap.name().to_string();
        let r = handle_with_fds(
            "PUT",
            "/api/v1/vm.add-net",
            br#"{"id": "n1"}"#,
            vec![tap.into_file()],
            &c,
        );
        assert_eq!(r.status, 204, "{r:?}");
        assert!(std::path::Path::new("/sys/class/net").join(&name).exists());
        c.delete().expect("delete");
        assert_eq!(passed_taps::queue_count(&name), 0);
        assert!(!std::path::Path::new("/sys/class/net").join(&name).exists());
    }

    #[test]
    fn delete_forgets_a_created_vm() {
        let (c, probe, rx) = controller();
        c.delete().expect("nothing to delete");
        c.create(config()).expect("create");
        c.delete().expect("delete");
        assert!(is_empty(&c));
        assert_eq!(c.boot().map_err(|e| e.status()), Err(404));
        assert_eq!(probe.builds.load(Ordering::SeqCst), 0);
        // Without a VM, the VMM still shuts down through the channel.
        c.shutdown();
        assert_eq!(rx.try_recv(), Ok(ExitEvent::ApiShutdown));
        assert_eq!(deliver(&c, &rx, ExitEvent::ApiShutdown), Some(0));
        assert_eq!(probe.finished.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn create_and_boot_reports_the_builders_error() {
        let (c, probe, _rx) = controller();
        probe.fail.store(true, Ordering::SeqCst);
        // The builder's own error, for main's exit code.
        let err = c.create_and_boot(config()).unwrap_err();
        assert!(matches!(err, Error::ReadFile { .. }), "{err}");
        let (c, _probe, _rx) = controller();
        c.create_and_boot(config()).expect("boot");
        assert!(matches!(c.slot(), VmSlot::Running(_)));
        assert!(c.create_and_boot(config()).is_err());
    }

    #[test]
    fn a_vm_being_built_is_neither_deleted_nor_booted_twice() {
        let (tx, _rx) = channel();
        let (entered_tx, entered) = channel::<()>();
        let (release, released) = channel::<()>();
        let entered_tx = Mutex::new(entered_tx);
        let released = Mutex::new(released);
        let build: Builder = Box::new(move |config, exit| {
            let _ = entered_tx.lock().map(|t| t.send(()));
            let _ = released.lock().map(|r| r.recv());
            Ok(Booted {
                api: Arc::new(
                    FakeVm::default()
                        .with_config(vm_config::to_json(config))
                        .reporting_exits(exit),
                ),
                finish: Box::new(|_| {}),
            })
        });
        let c = Arc::new(Controller::new(tx, build));
        let booting = {
            let c = c.clone();
            std::thread::spawn(move || c.create_and_boot(config()).is_ok())
        };
        entered.recv().expect("the build started");
        assert!(matches!(c.slot(), VmSlot::Created { booting: true, .. }));
        assert_eq!(c.delete().map_err(|e| e.status()), Err(405));
        assert_eq!(c.boot().map_err(|e| e.status()), Err(405));
        assert_eq!(c.create(config()).map_err(|e| e.status()), Err(409));
        release.send(()).expect("the build waits");
        assert!(booting.join().expect("no panic"));
        assert!(matches!(c.slot(), VmSlot::Running(_)));
    }
}
