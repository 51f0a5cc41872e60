//! The running VM as the REST API sees it: a configuration snapshot in
//! cloud-hypervisor's `VmConfig` shape, the devices' counters, the vCPUs'
//! pause control, the power button, and the exit channel that `shutdown`
//! and `reboot` use.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvm_bindings::kvm_clock_data;
use kvm_ioctls::VmFd;
use log::{info, warn};
use serde_json::{json, Map, Value};

use virtio_iommu::device::IommuDevice;

use virtio_iommu::locks::Unpoison;

use super::error::ApiError;
use super::routes::{RunState, VmApi};
use crate::block::DiskConfig;
use crate::config::VmConfig;
use crate::devices::ged::GedTrigger;
use crate::exit::{ExitEvent, ExitSender};
use crate::net::NetConfig;
use crate::vcpu_control::VcpuControl;
use crate::vfio::hotplug::{HotplugError, VfioHotplug};
use crate::vfio::VfioConfig;
use crate::vhost_user::iotlb::BackendIotlb;

/// Name of the vIOMMU's entry in `vm.counters`.
pub const IOMMU_COUNTERS: &str = "iommu";

/// The devices that count their DMA work, as `vm.counters` reports them.
#[derive(Default)]
pub struct CounterSources {
    /// The vIOMMU's device model (requests and invalidation batches).
    pub iommu: Option<Arc<IommuDevice>>,
    /// The assigned functions (those behind the vIOMMU count).
    pub vfio: Option<Arc<VfioHotplug>>,
    /// vhost-user back-ends behind the vIOMMU (their IOTLBs), by name.
    pub vhost_user: Vec<(String, Arc<BackendIotlb>)>,
}

/// How long `vm.pause` waits for every vCPU to park before it gives up
/// and lets the VM run on (a vCPU handles one exit in far less; nested
/// TCG runners are slow, hence the margin).
pub const PAUSE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the API controls of a running VM.
pub struct Lifecycle {
    /// The vCPUs' pause state.
    pub control: Arc<VcpuControl>,
    /// The VM, whose kvmclock is held still while paused (so the guest
    /// sees no time pass, and no soft-lockup or RCU-stall warnings after
    /// a long pause). `None` in tests without KVM.
    pub clock: Option<Arc<VmFd>>,
    /// The power button's event register.
    pub power_button: Option<GedTrigger>,
    /// Adds and removes assigned functions (`vm.add-device`,
    /// `vm.remove-device`). `None` in tests without KVM.
    pub hotplug: Option<Arc<VfioHotplug>>,
}

/// What the API reads of a running VM.
pub struct VmState {
    /// The configuration the VM was built from; its `devices` are those
    /// of `lifecycle.hotplug` while it runs.
    config: VmConfig,
    memory: u64,
    counters: CounterSources,
    exit: ExitSender,
    lifecycle: Lifecycle,
    /// The guest's clock when it was paused.
    frozen_clock: Mutex<Option<kvm_clock_data>>,
}

impl VmState {
    /// The state of the VM built from `config`.
    pub fn new(
        config: &VmConfig,
        counters: CounterSources,
        exit: ExitSender,
        lifecycle: Lifecycle,
    ) -> Self {
        Self {
            config: config.clone(),
            memory: config.memory.size,
            counters,
            exit,
            lifecycle,
            frozen_clock: Mutex::new(None),
        }
    }
}

/// The answer to a refused or failed hotplug request: the caller's
/// mistakes are 400s (cloud-hypervisor answers every device error 500,
/// which tells a management stack less), what failed on the host is 500.
fn hotplug_error(e: HotplugError) -> ApiError {
    match e {
        HotplugError::DuplicateId(_)
        | HotplugError::UnknownId(_)
        | HotplugError::Removing(_)
        | HotplugError::BadId
        | HotplugError::NoSlot(..)
        | HotplugError::Refused(_)
        | HotplugError::Assign(crate::error::Error::InvalidOption { .. }) => {
            ApiError::BadRequest(e.to_string())
        }
        HotplugError::Assign(_) | HotplugError::Notify(_) => ApiError::Failed(e.to_string()),
    }
}

/// cloud-hypervisor's `PciDeviceInfo`: the device's id and where it sits.
fn pci_device_info(id: &str, addr: crate::pci::PciAddress) -> Value {
    json!({
        "id": id,
        "bdf": format!("0000:{addr}"),
    })
}

impl VmApi for VmState {
    fn config(&self) -> Value {
        match &self.lifecycle.hotplug {
            // Every hotplugged device with the id it was added as.
            Some(h) => super::vm_config::to_json(&super::running_config::running_config(
                &self.config,
                h.configs(),
                h.virtio_configs().into_iter().map(|(_, cfg)| cfg),
            )),
            None => super::vm_config::to_json(&self.config),
        }
    }

    fn memory_actual_size(&self) -> u64 {
        self.memory
    }

    /// cloud-hypervisor's shape: `{ device: { counter: value } }`.
    fn counters(&self) -> Value {
        let mut out = Map::new();
        if let Some(iommu) = &self.counters.iommu {
            let c = iommu.request_counts();
            out.insert(
                IOMMU_COUNTERS.into(),
                json!({
                    "attach_requests": c.attach,
                    "detach_requests": c.detach,
                    "map_requests": c.map,
                    "unmap_requests": c.unmap,
                    "probe_requests": c.probe,
                    "failed_requests": c.failed,
                    "invalidation_batches": c.invalidation_batches,
                    "invalidator_calls": c.invalidator_calls,
                    "invalidate_requests": c.invalidate,
                    "attach_table_requests": c.attach_table,
                    "invalidate_ns": c.invalidate_ns,
                    "invalidation_ns": c.invalidation_ns,
                }),
            );
        }
        let mirrors = self
            .counters
            .vfio
            .as_ref()
            .map(|h| h.mirrors())
            .unwrap_or_default();
        for (name, m) in &mirrors {
            let s = &m.stats;
            out.insert(
                name.clone(),
                json!({
                    "vfio_map_calls": s.map_calls.load(Ordering::Relaxed),
                    "vfio_unmap_calls": s.unmap_calls.load(Ordering::Relaxed),
                    "vfio_pages_mapped": s.pages_mapped.load(Ordering::Relaxed),
                    "invalidated_ranges": s.ranges.load(Ordering::Relaxed),
                }),
            );
        }
        for (name, iotlb) in &self.counters.vhost_user {
            let s = &iotlb.stats;
            out.insert(
                name.clone(),
                json!({
                    "iotlb_misses": s.misses.load(Ordering::Relaxed),
                    "iotlb_misses_refused": s.refused.load(Ordering::Relaxed),
                    "iotlb_invalidations": s.invalidations.load(Ordering::Relaxed),
                    "iotlb_ack_wait_us": s.ack_wait_us.load(Ordering::Relaxed),
                    "invalidated_ranges": s.ranges.load(Ordering::Relaxed),
                }),
            );
        }
        Value::Object(out)
    }

    fn state(&self) -> RunState {
        if self.lifecycle.control.is_paused() {
            RunState::Paused
        } else {
            RunState::Running
        }
    }

    fn pause(&self) -> Result<(), ApiError> {
        crate::event_monitor::emit("vm", "pausing", &[]);
        self.lifecycle.control.pause(PAUSE_TIMEOUT)?;
        if let Some(vm) = &self.lifecycle.clock {
            match vm.get_clock() {
                Ok(c) => {
                    *self.frozen_clock.lock().unpoisoned() = Some(c);
                }
                Err(e) => warn!("vm.pause: KVM_GET_CLOCK: {e}; the guest will see the pause"),
            }
        }
        info!("VM paused through the API");
        crate::event_monitor::emit("vm", "paused", &[]);
        Ok(())
    }

    fn resume(&self) -> Result<(), ApiError> {
        if !self.lifecycle.control.is_paused() {
            return Err(crate::vcpu_control::PauseError::NotPaused.into());
        }
        crate::event_monitor::emit("vm", "resuming", &[]);
        let frozen = self.frozen_clock.lock().unpoisoned().take();
        if let (Some(vm), Some(c)) = (&self.lifecycle.clock, frozen) {
            let at = kvm_clock_data {
                clock: c.clock,
                ..Default::default()
            };
            if let Err(e) = vm.set_clock(&at) {
                warn!("vm.resume: KVM_SET_CLOCK: {e}; the guest will see the pause");
            }
        }
        self.lifecycle.control.resume()?;
        info!("VM resumed through the API");
        crate::event_monitor::emit("vm", "resumed", &[]);
        Ok(())
    }

    fn power_button(&self) -> Result<(), ApiError> {
        let Some(button) = &self.lifecycle.power_button else {
            return Err(ApiError::Unsupported("this VM has no power button".into()));
        };
        button
            .power_button()
            .map_err(|e| ApiError::Failed(format!("raising the power button interrupt: {e}")))?;
        info!("power button pressed through the API");
        Ok(())
    }

    fn add_device(&self, device: VfioConfig) -> Result<Value, ApiError> {
        let Some(h) = &self.lifecycle.hotplug else {
            return Err(ApiError::Unsupported(
                "vm.add-device: this VM has no PCI hotplug".into(),
            ));
        };
        let (id, addr) = h.add(device).map_err(hotplug_error)?;
        Ok(json!({
            "id": id,
            "bdf": format!("0000:{addr}"),
        }))
    }

    fn add_net(
        &self,
        id: Option<String>,
        net: NetConfig,
        fds: Vec<std::fs::File>,
    ) -> Result<Value, ApiError> {
        let Some(h) = &self.lifecycle.hotplug else {
            return Err(ApiError::Unsupported(
                "vm.add-net: this VM has no PCI hotplug".into(),
            ));
        };
        let (id, addr) = crate::virtio_hotplug::add_net(h, id, net, fds).map_err(hotplug_error)?;
        Ok(pci_device_info(&id, addr))
    }

    fn add_disk(&self, disk: DiskConfig) -> Result<Value, ApiError> {
        let Some(h) = &self.lifecycle.hotplug else {
            return Err(ApiError::Unsupported(
                "vm.add-disk: this VM has no PCI hotplug".into(),
            ));
        };
        let (id, addr) = crate::virtio_hotplug::add_disk(h, disk).map_err(hotplug_error)?;
        Ok(pci_device_info(&id, addr))
    }

    fn remove_device(&self, id: &str) -> Result<(), ApiError> {
        let Some(h) = &self.lifecycle.hotplug else {
            return Err(ApiError::Unsupported(
                "vm.remove-device: this VM has no PCI hotplug".into(),
            ));
        };
        h.request_removal(id).map_err(hotplug_error)
    }

    /// Every VM can be rebuilt: one with vhost-user devices reconnects
    /// to their back-ends, and a back-end that does not take the new
    /// connection fails the rebuild, which leaves the VM created
    /// (`super::controller`).
    fn can_reboot(&self) -> Result<(), ApiError> {
        Ok(())
    }

    fn shutdown(&self) {
        // The main thread tears the VM down and the VMM goes on; it may
        // already be gone with another reason.
        let _ = self.exit.send(ExitEvent::VmShutdown);
    }

    fn reboot(&self) {
        let _ = self.exit.send(ExitEvent::ApiReboot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::vm_config;
    use crate::devices::ged;
    use std::sync::mpsc;

    /// A configuration as `vm.create` takes it: `extra` fields after the
    /// payload.
    fn config(extra: &str) -> VmConfig {
        let body = format!(r#"{{"payload": {{"kernel": "/k"}}{extra}}}"#);
        vm_config::parse(body.as_bytes()).expect("a valid VM")
    }

    #[test]
    fn counters_report_the_viommu_requests() {
        use virtio_iommu::device::IommuConfig;
        use virtio_iommu::wire::{AttachReq, Request};
        let iommu = Arc::new(IommuDevice::new(IommuConfig::default()).expect("device"));
        iommu.add_endpoint(8).expect("endpoint");
        iommu.ack_features(iommu.device_features());
        let mut w = iommu.new_worker();
        let attach = Request::Attach(AttachReq {
            domain: 1,
            endpoint: 8,
            flags: 0,
            reserved: [0; 4],
        })
        .encode();
        let mut tail = [0u8; 4];
        for _ in 0..2 {
            iommu.handle_request(&mut w, &attach, &mut tail);
        }
        iommu.complete_kick(&mut w);
        let (tx, _rx) = mpsc::channel();
        let sources = CounterSources {
            iommu: Some(iommu),
            ..CounterSources::default()
        };
        let s = VmState::new(&config(""), sources, tx, lifecycle(1));
        let c = s.counters();
        assert_eq!(c[IOMMU_COUNTERS]["attach_requests"], json!(2));
        assert_eq!(c[IOMMU_COUNTERS]["map_requests"], json!(0));
        assert_eq!(c[IOMMU_COUNTERS]["invalidation_batches"], json!(0));
    }

    #[test]
    fn shutdown_sends_the_api_exit_event() {
        let (tx, rx) = mpsc::channel();
        let s = VmState::new(&config(""), CounterSources::default(), tx, lifecycle(1));
        assert_eq!(s.counters(), json!({}));
        s.shutdown();
        assert_eq!(rx.try_recv(), Ok(ExitEvent::VmShutdown));
        assert_eq!(s.can_reboot(), Ok(()));
        s.reboot();
        assert_eq!(rx.try_recv(), Ok(ExitEvent::ApiReboot));
    }

    fn lifecycle(vcpus: usize) -> Lifecycle {
        Lifecycle {
            control: VcpuControl::new(vcpus),
            clock: None,
            power_button: None,
            hotplug: None,
        }
    }

    fn state_of(extra: &str, lc: Lifecycle) -> VmState {
        let (tx, _rx) = mpsc::channel();
        VmState::new(&config(extra), CounterSources::default(), tx, lc)
    }

    #[test]
    fn pause_resume_drive_the_vcpu_control() {
        // No vCPU threads: every one of the 0 vCPUs parks at once.
        let s = state_of("", lifecycle(0));
        assert_eq!(s.state(), RunState::Running);
        assert_eq!(s.resume().map_err(|e| e.status()), Err(405));
        s.pause().unwrap();
        assert_eq!(s.state(), RunState::Paused);
        assert_eq!(s.pause().map_err(|e| e.status()), Err(405));
        s.resume().unwrap();
        assert_eq!(s.state(), RunState::Running);
    }

    #[test]
    fn a_vcpu_that_never_parks_fails_the_pause() {
        // One vCPU that never reaches a checkpoint.
        let s = state_of("", lifecycle(1));
        let t0 = std::time::Instant::now();
        let err = s.pause().unwrap_err();
        assert_eq!(err.status(), 500, "{err}");
        assert!(t0.elapsed() < PAUSE_TIMEOUT + Duration::from_secs(2));
        assert_eq!(s.state(), RunState::Running);
    }

    #[test]
    fn hotplug_refusals_are_400_and_host_failures_500() {
        let status = |e| hotplug_error(e).status();
        assert_eq!(status(HotplugError::DuplicateId("nic0".into())), 400);
        assert_eq!(status(HotplugError::UnknownId("nic9".into())), 400);
        assert_eq!(status(HotplugError::Removing("nic0".into())), 400);
        // iommu=on in a VM without --iommu is the caller's mistake.
        let no_iommu = crate::error::Error::InvalidOption {
            option: "device",
            value: "path=/x,iommu=on".into(),
            reason: "needs --iommu".into(),
        };
        assert_eq!(status(HotplugError::Assign(no_iommu)), 400);
        let io = std::io::Error::from(std::io::ErrorKind::Other);
        assert_eq!(status(HotplugError::Notify(io)), 500);
    }

    #[test]
    fn power_button_raises_the_ged_interrupt() {
        let irq = vmm_sys_util::eventfd::EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let probe = irq.try_clone().unwrap();
        let (_dev, trigger) = ged::ged(irq);
        let mut lc = lifecycle(0);
        lc.power_button = Some(trigger);
        let s = state_of("", lc);
        s.power_button().unwrap();
        assert_eq!(probe.read().unwrap(), 1);
        let without = state_of("", lifecycle(0));
        assert_eq!(without.power_button().map_err(|e| e.status()), Err(501));
    }

    #[test]
    fn vhost_user_vms_can_be_rebooted() {
        let (tx, rx) = mpsc::channel();
        let vu = config(
            r#", "net": [{"vhost_user": true, "vhost_socket": "/tmp/vu.sock"}],
                "memory": {"size": 1073741824, "shared": true}"#,
        );
        let s = VmState::new(&vu, CounterSources::default(), tx, lifecycle(0));
        assert_eq!(s.can_reboot(), Ok(()));
        s.reboot();
        assert_eq!(rx.try_recv(), Ok(ExitEvent::ApiReboot));
    }
}
