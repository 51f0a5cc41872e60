//! Test doubles for the API's traits, shared by the API's unit tests.
//!
//! WHY one fake: the controller, the socket server and the descriptor
//! tests each need "a running VM that says yes" and differ only in what it
//! reports (its configuration, its counters), whether it tells the exit
//! channel about `vm.shutdown`/`vm.reboot`, and whether it keeps hotplugged
//! devices. Those are options here, so a new method on [`VmApi`] is
//! answered in one place. `routes`' own fake models pause/resume and PCI
//! hotplug state and stays next to the tests that need it.

use std::fs::File;
use std::sync::Mutex;

use serde_json::{json, Value};
use virtio_iommu::locks::Unpoison;

use super::routes::{ApiError, RunState, VmApi};
use crate::block::DiskConfig;
use crate::exit::{ExitEvent, ExitSender};
use crate::net::NetConfig;

/// What `vm.add-net` handed a [`FakeVm`] that keeps its plugs.
pub struct AddedNet {
    pub id: Option<String>,
    pub cfg: NetConfig,
    pub fds: Vec<File>,
}

/// A running VM: pause, resume, the power button and reboots all succeed.
/// Its configuration and counters are `{}` unless set; built with
/// [`FakeVm::reporting_exits`] it sends `VmShutdown`/`ApiReboot` on the
/// exit channel as the real VM does; with [`FakeVm::keeping_plugs`] it
/// takes `vm.add-net` and `vm.add-disk` and keeps what they give it
/// (otherwise it has no hotplug, as the trait's defaults say).
pub struct FakeVm {
    config: Value,
    counters: Value,
    exit: Option<ExitSender>,
    keeps_plugs: bool,
    /// NICs `vm.add-net` gave it, in order.
    pub nets: Mutex<Vec<AddedNet>>,
    /// Disks `vm.add-disk` gave it, in order.
    pub disks: Mutex<Vec<DiskConfig>>,
}

impl Default for FakeVm {
    fn default() -> Self {
        FakeVm {
            config: json!({}),
            counters: json!({}),
            exit: None,
            keeps_plugs: false,
            nets: Mutex::new(Vec::new()),
            disks: Mutex::new(Vec::new()),
        }
    }
}

impl FakeVm {
    /// Reports `config` as its configuration.
    pub fn with_config(mut self, config: Value) -> Self {
        self.config = config;
        self
    }

    /// Reports `counters` for `vm.counters`.
    pub fn with_counters(mut self, counters: Value) -> Self {
        self.counters = counters;
        self
    }

    /// Sends its shutdown and reboot on `exit`, as `VmState` does.
    pub fn reporting_exits(mut self, exit: ExitSender) -> Self {
        self.exit = Some(exit);
        self
    }

    /// Takes `vm.add-net` and `vm.add-disk`, keeping what they give it.
    pub fn keeping_plugs(mut self) -> Self {
        self.keeps_plugs = true;
        self
    }

    fn send(&self, event: ExitEvent) {
        if let Some(exit) = &self.exit {
            let _ = exit.send(event);
        }
    }

    fn no_hotplug(what: &str) -> ApiError {
        ApiError::Unsupported(format!("{what}: this VM has no PCI hotplug"))
    }
}

impl VmApi for FakeVm {
    fn config(&self) -> Value {
        self.config.clone()
    }
    fn memory_actual_size(&self) -> u64 {
        0
    }
    fn counters(&self) -> Value {
        self.counters.clone()
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
        self.send(ExitEvent::VmShutdown);
    }
    fn reboot(&self) {
        self.send(ExitEvent::ApiReboot);
    }
    fn add_net(
        &self,
        id: Option<String>,
        cfg: NetConfig,
        fds: Vec<File>,
    ) -> Result<Value, ApiError> {
        if !self.keeps_plugs {
            return Err(Self::no_hotplug("vm.add-net"));
        }
        let mut nets = self.nets.lock().unpoisoned();
        let name = id.clone().unwrap_or_else(|| format!("_net{}", nets.len()));
        nets.push(AddedNet { id, cfg, fds });
        Ok(json!({ "id": name, "bdf": "0000:00:05.0" }))
    }
    fn add_disk(&self, disk: DiskConfig) -> Result<Value, ApiError> {
        if !self.keeps_plugs {
            return Err(Self::no_hotplug("vm.add-disk"));
        }
        self.disks.lock().unpoisoned().push(disk);
        Ok(json!({ "id": "_disk0", "bdf": "0000:00:06.0" }))
    }
}
