//! The VMM's one VM slot and its transitions, for the REST API and `main`:
//! empty -> created (`vm.create`, or the command line) -> running
//! (`vm.boot`), and back to empty by `vm.delete` of a created VM.
//!
//! WHY the VM is built on the caller's thread: `vm.boot` answers once the
//! VM is built and its vCPUs started, as cloud-hypervisor's does, and
//! nothing in a build waits on a vCPU; `main` only waits on the exit
//! channel. A VM is never torn down in the process (see `crate::reboot`):
//! ending a running VM ends the VMM.

use std::sync::{Arc, Mutex, MutexGuard};

use log::{info, warn};

use super::routes::{ApiError, VmApi, VmSlot, VmmApi};
use super::vm_config;
use crate::config::VmConfig;
use crate::error::Error;
use crate::exit::{ExitEvent, ExitSender};

/// Builds and starts a VM (`crate::vm::start`; a fake in tests).
pub type Builder = Box<dyn Fn(&VmConfig, ExitSender) -> Result<Booted, Error> + Send + Sync>;

type Finish = Box<dyn FnOnce(&ExitEvent) + Send>;

/// A VM whose vCPUs run: what the API asks of it, and what to do once the
/// VMM's exit channel said why it ends.
pub struct Booted {
    /// The running VM as the REST API sees it.
    pub api: Arc<dyn VmApi>,
    /// Flushes the serial output and logs the devices' figures. The vCPU
    /// threads are not stopped: the caller ends the process right after.
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
    },
}

/// The VMM: at most one VM, created, booted and ended through it.
pub struct Controller {
    phase: Mutex<Phase>,
    exit: ExitSender,
    build: Builder,
}

impl Controller {
    /// A VMM with no VM whose ending is announced on `exit`.
    pub fn new(exit: ExitSender, build: Builder) -> Self {
        Self {
            phase: Mutex::new(Phase::Empty),
            exit,
            build,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Phase> {
        // A panic ends the process (`crate::panic_exit`): no half-made
        // state to protect.
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
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
        match (self.build)(&config, self.exit.clone()) {
            Ok(booted) => {
                *self.lock() = Phase::Running {
                    vm: booted.api,
                    finish: Some(booted.finish),
                };
                Ok(())
            }
            Err(e) => {
                *self.lock() = Phase::Created {
                    config,
                    booting: false,
                };
                Err(e)
            }
        }
    }

    /// The created or running VM's configuration as `vm.info` prints it:
    /// what a reboot hands over to the next process image.
    pub fn config_json(&self) -> Option<String> {
        match &*self.lock() {
            Phase::Empty => None,
            Phase::Created { config, .. } => Some(vm_config::to_json(config).to_string()),
            // The running VM's own view: it includes hotplugged devices.
            Phase::Running { vm, .. } => Some(vm.config().to_string()),
        }
    }

    /// Once the exit channel said why the VMM ends: flushes the running
    /// VM's serial output and logs its figures.
    pub fn finish(&self, event: &ExitEvent) {
        let finish = match &mut *self.lock() {
            Phase::Running { finish, .. } => finish.take(),
            _ => None,
        };
        match finish {
            Some(f) => f(event),
            None => info!("{}", event.describe()),
        }
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

    fn delete(&self) -> Result<(), ApiError> {
        let mut phase = self.lock();
        match &*phase {
            Phase::Empty => Ok(()),
            Phase::Created { booting: false, .. } => {
                *phase = Phase::Empty;
                info!("VM deleted through the API");
                Ok(())
            }
            _ => Err(ApiError::WrongState(
                "vm.delete: the VM runs (it is shut down, with the VMM)".into(),
            )),
        }
    }

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
    use crate::api::routes::RunState;

    /// A VM that reports its reboot on the exit channel, as `VmState` does,
    /// and its configuration as built.
    struct FakeVm(ExitSender, Value);

    impl VmApi for FakeVm {
        fn config(&self) -> Value {
            self.1.clone()
        }
        fn memory_actual_size(&self) -> u64 {
            0
        }
        fn counters(&self) -> Value {
            json!({})
        }
        fn state(&self) -> RunState {
            RunState::Running
        }
        fn pause(&self) -> Result<(), ApiError> {
            Ok(())
        }
        fn resume(&self) -> Result<(), ApiError> {
            Ok(())
        }
        fn power_button(&self) -> Result<(), ApiError> {
            Ok(())
        }
        fn can_reboot(&self) -> Result<(), ApiError> {
            Ok(())
        }
        fn shutdown(&self) {
            let _ = self.0.send(ExitEvent::ApiShutdown);
        }
        fn reboot(&self) {
            let _ = self.0.send(ExitEvent::ApiReboot);
        }
    }

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
                api: Arc::new(FakeVm(exit, vm_config::to_json(config))),
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
        assert_eq!(c.delete().map_err(|e| e.status()), Err(405));
        assert_eq!(c.create(config()).map_err(|e| e.status()), Err(409));
        assert_eq!(c.config_json(), Some(json));
        // vm.reboot goes to the running VM, which asks main to re-exec.
        c.reboot();
        assert_eq!(rx.try_recv(), Ok(ExitEvent::ApiReboot));
        c.finish(&ExitEvent::ApiReboot);
        c.finish(&ExitEvent::ApiReboot);
        assert_eq!(probe.finished.load(Ordering::SeqCst), 1, "finished once");
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
        c.finish(&ExitEvent::ApiShutdown);
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
                api: Arc::new(FakeVm(exit, vm_config::to_json(config))),
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
