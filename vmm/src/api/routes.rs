//! The REST API's routes: cloud-hypervisor's paths, methods and status
//! codes, answered from a [`VmmApi`] (the VMM: no VM, a created one, a
//! running one) and the running VM's [`VmApi`].
//!
//! Pure request-to-reply logic (no sockets), so every path, method,
//! state transition and malformed input is unit-tested. As in
//! cloud-hypervisor's description, a request for a VM that was not
//! created gets 404, one the VM's state does not allow (pausing a VM that
//! was created but not booted, resuming a running VM, pausing a paused
//! one) 405, and `vm.create` while a VM exists 409. Endpoints of its OpenAPI
//! description that dmavisor does not implement yet answer 501 with a
//! message, after the same validation of their JSON body as an
//! implemented one would do: a management stack learns what is missing,
//! not that the VMM is broken, and a bad body is still a 400.

use std::fs::File;
use std::sync::Arc;

use serde_json::{json, Value};

pub use super::error::ApiError;

use crate::block::config::{DiskConfig, DiskSpec};
use crate::config::VmConfig;
use crate::net::config::NetSpec;
use crate::net::NetConfig;
use crate::vfio::config::{DeviceSpec, VfioConfig};

/// The path prefix of every endpoint.
pub const PREFIX: &str = "/api/v1/";

/// What `vm.info` reports as the VM's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    /// `vm.create` gave a configuration; not booted yet.
    Created,
    /// The vCPUs run.
    Running,
    /// `vm.pause` parked every vCPU.
    Paused,
}

impl RunState {
    /// cloud-hypervisor's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "Created",
            Self::Running => "Running",
            Self::Paused => "Paused",
        }
    }
}

/// What the API can ask of the running VM. Implementations must not block
/// on the vCPUs indefinitely: the answers come from atomics and a
/// configuration snapshot, and a pause waits a bounded time.
pub trait VmApi: Send + Sync {
    /// The VM's configuration as cloud-hypervisor's `VmConfig` shapes it.
    fn config(&self) -> Value;
    /// Guest RAM in bytes.
    fn memory_actual_size(&self) -> u64;
    /// Per-device counters: device name -> counter name -> value.
    fn counters(&self) -> Value;
    /// Running or paused.
    fn state(&self) -> RunState;
    /// Parks every vCPU (bounded wait; on time-out the VM keeps running).
    fn pause(&self) -> Result<(), ApiError>;
    /// Lets a paused VM run again.
    fn resume(&self) -> Result<(), ApiError>;
    /// Presses the ACPI power button.
    fn power_button(&self) -> Result<(), ApiError>;
    /// Whether [`VmApi::reboot`] can rebuild this VM; checked before the
    /// 204 is sent, so a refusal changes nothing.
    fn can_reboot(&self) -> Result<(), ApiError>;
    /// Ends the VM (`vm.shutdown`): it is torn down and the VMM goes on
    /// serving the API, where `vm.boot` starts it again. Called by the
    /// server once the reply that asked for it has been sent.
    fn shutdown(&self);
    /// Tears the VM down and boots it again from its configuration.
    /// Called by the server once the reply that asked for it has been sent.
    fn reboot(&self);
    /// Assigns a host PCI function (`vm.add-device`) and tells the guest
    /// its slot changed; returns cloud-hypervisor's `PciDeviceInfo`
    /// (`{"id": .., "bdf": ..}`).
    fn add_device(&self, _device: VfioConfig) -> Result<Value, ApiError> {
        Err(ApiError::Unsupported(
            "vm.add-device: this VM has no PCI hotplug; the VM is unchanged".into(),
        ))
    }
    /// Makes a virtio-net device of `net` (on the TAP it names, or on the
    /// passed tap `fds`, one per queue pair) and hotplugs it as `id`
    /// (`vm.add-net`); returns its `PciDeviceInfo`.
    fn add_net(
        &self,
        _id: Option<String>,
        _net: NetConfig,
        _fds: Vec<File>,
    ) -> Result<Value, ApiError> {
        Err(ApiError::Unsupported(
            "vm.add-net: this VM has no PCI hotplug; the VM is unchanged".into(),
        ))
    }
    /// Makes a virtio-blk device on `disk`'s image and hotplugs it
    /// (`vm.add-disk`); returns its `PciDeviceInfo`.
    fn add_disk(&self, _disk: DiskConfig) -> Result<Value, ApiError> {
        Err(ApiError::Unsupported(
            "vm.add-disk: this VM has no PCI hotplug; the VM is unchanged".into(),
        ))
    }
    /// Asks the guest to give up the hotplugged function `id`
    /// (`vm.remove-device`); it is torn down when the guest ejects it.
    fn remove_device(&self, _id: &str) -> Result<(), ApiError> {
        Err(ApiError::Unsupported(
            "vm.remove-device: this VM has no PCI hotplug; the VM is unchanged".into(),
        ))
    }
}

/// The VM a [`VmmApi`] holds.
#[derive(Clone)]
pub enum VmSlot {
    /// None: only `vm.create` (and the VMM's endpoints) make sense.
    Empty,
    /// Created, not running: its configuration as `vm.info` prints it.
    Created {
        /// cloud-hypervisor's `VmConfig` shape.
        config: Value,
        /// Guest RAM in bytes.
        memory: u64,
        /// Being built right now (the VMM was started with the VM on its
        /// command line, or `vm.reboot` handed it over).
        booting: bool,
    },
    /// Its vCPUs run (or are paused).
    Running(Arc<dyn VmApi>),
}

/// What the API can ask of the VMM itself. `boot` builds the VM on the
/// calling thread and returns once its vCPUs are started: it never waits
/// on them.
pub trait VmmApi: Send + Sync {
    /// The VM, if any.
    fn slot(&self) -> VmSlot;
    /// Keeps `config` as the VM to boot ([`ApiError::Conflict`] if a VM
    /// exists already).
    fn create(&self, config: VmConfig) -> Result<(), ApiError>;
    /// Builds and starts the created VM.
    fn boot(&self) -> Result<(), ApiError>;
    /// Forgets the VM: a running one is shut down first, as
    /// `vm.shutdown` does (nothing to do if there is none).
    fn delete(&self) -> Result<(), ApiError>;
    /// Ends the VMM (and its VM, if one runs) with exit status 0; called
    /// once the reply has been sent.
    fn shutdown(&self);
    /// Reboots the running VM; called once the reply has been sent.
    fn reboot(&self);
    /// Changes the created, not booted, VM's configuration (`vm.add-*`
    /// and `vm.remove-device` before `vm.boot`: libvirt adds its NICs
    /// that way).
    fn cold_plug(&self, _change: ColdPlug) -> Result<(), ApiError> {
        Err(ApiError::Unsupported(
            "this VMM cannot change a VM before it boots".into(),
        ))
    }
}

/// A change to a created VM's configuration ([`VmmApi::cold_plug`]).
pub enum ColdPlug {
    /// `vm.add-device`.
    Device(VfioConfig),
    /// `vm.add-net`, with the TAP queues that came with the request.
    Net(NetConfig, Vec<File>),
    /// `vm.add-disk`.
    Disk(DiskConfig),
    /// `vm.remove-device` of the device with this id.
    Remove(String),
}

/// Where `vm.add-*` and `vm.remove-device` land: the running VM (hotplug,
/// answered with cloud-hypervisor's `PciDeviceInfo`), or the created VM's
/// configuration (cold plug, answered 204 as cloud-hypervisor does).
#[derive(Clone, Copy)]
enum Plug<'a> {
    Hot(&'a dyn VmApi),
    Cold(&'a dyn VmmApi),
}

impl Plug<'_> {
    fn added(r: Result<Value, ApiError>) -> Reply {
        match r {
            Ok(info) => Reply::json(200, &info),
            Err(e) => Reply::error(e.status(), e.to_string()),
        }
    }

    fn add_device(self, d: VfioConfig) -> Reply {
        match self {
            Self::Hot(vm) => Self::added(vm.add_device(d)),
            Self::Cold(vmm) => Reply::from_result(vmm.cold_plug(ColdPlug::Device(d))),
        }
    }

    fn add_disk(self, d: DiskConfig) -> Reply {
        match self {
            Self::Hot(vm) => Self::added(vm.add_disk(d)),
            Self::Cold(vmm) => Reply::from_result(vmm.cold_plug(ColdPlug::Disk(d))),
        }
    }

    fn remove_device(self, id: &str) -> Reply {
        match self {
            Self::Hot(vm) => Reply::from_result(vm.remove_device(id)),
            Self::Cold(vmm) => Reply::from_result(vmm.cold_plug(ColdPlug::Remove(id.to_string()))),
        }
    }
}

/// What the server does once the reply is sent (the process may end or
/// be replaced right after, so the reply goes first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    /// Nothing.
    Nothing,
    /// [`VmmApi::shutdown`].
    Shutdown,
    /// [`VmApi::shutdown`] of the running VM.
    ShutdownVm,
    /// [`VmmApi::reboot`].
    Reboot,
}

/// An HTTP answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// JSON body, if any.
    pub body: Option<String>,
    /// What follows the reply.
    pub after: After,
}

impl Reply {
    fn json(status: u16, v: &Value) -> Self {
        Self {
            status,
            body: Some(v.to_string()),
            after: After::Nothing,
        }
    }

    /// 204 No Content, then `after`.
    fn no_content(after: After) -> Self {
        Self {
            status: 204,
            body: None,
            after,
        }
    }

    fn from_result(r: Result<(), ApiError>) -> Self {
        match r {
            Ok(()) => Self::no_content(After::Nothing),
            Err(e) => Self::error(e.status(), e.to_string()),
        }
    }

    /// An error reply: a JSON array of messages, as cloud-hypervisor
    /// sends its error chain (ch-remote parses the body as one).
    pub fn error(status: u16, msg: impl Into<String>) -> Self {
        Self::json(status, &json!([msg.into()]))
    }
}

/// How an endpoint is served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    Ping,
    VmmShutdown,
    Info,
    Counters,
    VmShutdown,
    Pause,
    Resume,
    PowerButton,
    Reboot,
    Create,
    Boot,
    Delete,
    AddDevice,
    AddNet,
    AddDisk,
    RemoveDevice,
    /// Known to cloud-hypervisor, not implemented here; `true` when its
    /// request carries a JSON body.
    Missing(bool),
}

/// The endpoint `name` (the path after [`PREFIX`]) and its method.
fn endpoint(name: &str) -> Option<(Endpoint, &'static str)> {
    Some(match name {
        "vmm.ping" => (Endpoint::Ping, "GET"),
        "vmm.shutdown" => (Endpoint::VmmShutdown, "PUT"),
        "vm.info" => (Endpoint::Info, "GET"),
        "vm.counters" => (Endpoint::Counters, "GET"),
        "vm.shutdown" => (Endpoint::VmShutdown, "PUT"),
        "vm.pause" => (Endpoint::Pause, "PUT"),
        "vm.resume" => (Endpoint::Resume, "PUT"),
        "vm.power-button" => (Endpoint::PowerButton, "PUT"),
        "vm.reboot" => (Endpoint::Reboot, "PUT"),
        "vm.create" => (Endpoint::Create, "PUT"),
        "vm.boot" => (Endpoint::Boot, "PUT"),
        "vm.delete" => (Endpoint::Delete, "PUT"),
        "vm.add-device" => (Endpoint::AddDevice, "PUT"),
        "vm.remove-device" => (Endpoint::RemoveDevice, "PUT"),
        "vm.add-net" => (Endpoint::AddNet, "PUT"),
        "vm.add-disk" => (Endpoint::AddDisk, "PUT"),
        // The rest of cloud-hypervisor v53's description: known, not
        // implemented (docs: "What dmavisor does not do").
        "vm.resize"
        | "vm.resize-disk"
        | "vm.resize-zone"
        | "vm.snapshot"
        | "vm.restore"
        | "vm.coredump"
        | "vm.add-fs"
        | "vm.add-pmem"
        | "vm.add-vsock"
        | "vm.add-vdpa"
        | "vm.add-user-device"
        | "vm.add-generic-vhost-user"
        | "vm.send-migration"
        | "vm.receive-migration" => (Endpoint::Missing(true), "PUT"),
        "vm.nmi" => (Endpoint::Missing(false), "PUT"),
        _ => return None,
    })
}

/// The running VM, or the reply for a VM that was not created (404) or
/// not booted (405).
fn running(vmm: &dyn VmmApi, path: &str) -> Result<Arc<dyn VmApi>, Reply> {
    match vmm.slot() {
        VmSlot::Running(vm) => Ok(vm),
        VmSlot::Empty => Err(Reply::error(
            404,
            format!("{path}: no VM has been created (vm.create)"),
        )),
        VmSlot::Created { .. } => Err(Reply::error(
            405,
            format!("{path}: the VM is not booted (vm.boot)"),
        )),
    }
}

fn info(vmm: &dyn VmmApi, path: &str) -> Reply {
    let (config, state, memory) = match vmm.slot() {
        VmSlot::Empty => return Reply::error(404, format!("{path}: no VM has been created")),
        VmSlot::Created { config, memory, .. } => (config, RunState::Created, memory),
        VmSlot::Running(vm) => (vm.config(), vm.state(), vm.memory_actual_size()),
    };
    Reply::json(
        200,
        &json!({
            "config": config,
            "state": state.as_str(),
            "memory_actual_size": memory,
        }),
    )
}

fn create(vmm: &dyn VmmApi, body: &[u8]) -> Reply {
    let config = match super::vm_config::parse(body) {
        Ok(c) => c,
        Err(e) => return Reply::error(400, e.to_string()),
    };
    Reply::from_result(vmm.create(config))
}

fn boot(vmm: &dyn VmmApi) -> Reply {
    match vmm.slot() {
        VmSlot::Empty => Reply::error(404, "vm.boot: no VM has been created (vm.create)"),
        VmSlot::Created { booting: true, .. } => {
            Reply::error(405, "vm.boot: the VM is being booted already")
        }
        VmSlot::Running(_) => Reply::error(405, "vm.boot: the VM is booted already"),
        VmSlot::Created { .. } => Reply::from_result(vmm.boot()),
    }
}

/// A running VM is shut down as `vm.shutdown` does, then forgotten (the
/// reply waits for both); a created one is forgotten.
fn delete(vmm: &dyn VmmApi) -> Reply {
    // The slot's view of a running VM is let go before the delete waits
    // for its teardown: it holds the VM's devices, and guest RAM with them.
    if matches!(vmm.slot(), VmSlot::Created { booting: true, .. }) {
        return Reply::error(405, "vm.delete: the VM is being booted");
    }
    Reply::from_result(vmm.delete())
}

/// `vm.add-device`: the body is cloud-hypervisor's `DeviceConfig`.
fn add_device(target: Plug<'_>, body: &[u8]) -> Reply {
    let device = match super::ch_fields::parse_section::<DeviceSpec>(body, super::ch_fields::DEVICE)
    {
        Ok(spec) => VfioConfig::from_spec(&spec),
        Err(e) => return Reply::error(400, format!("vm.add-device: invalid DeviceConfig: {e}")),
    };
    match device {
        Ok(d) => target.add_device(d),
        Err(e) => Reply::error(400, format!("vm.add-device: {e}")),
    }
}

/// The note an error reply carries when the request's descriptors were
/// not used (they are closed with the request).
fn fds_note(n: usize) -> String {
    match n {
        0 => String::new(),
        n => format!(" ({n} file descriptors received and closed)"),
    }
}

/// `vm.add-net`: the body is cloud-hypervisor's `NetConfig`. As in
/// cloud-hypervisor, its `fds` numbers are the client's own and mean
/// nothing here: the descriptors that came with the request
/// (`SCM_RIGHTS`) are the TAP queues, one per queue pair, and
/// `num_queues` defaults to two per descriptor. `id` names the device.
fn add_net(target: Plug<'_>, body: &[u8], fds: Vec<File>) -> Reply {
    let n = fds.len();
    let bad = |msg: String| Reply::error(400, format!("vm.add-net: {msg}{}", fds_note(n)));
    let mut obj = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) => o,
        Ok(_) => return bad("the body must be a NetConfig object".into()),
        Err(e) => return bad(format!("invalid NetConfig: {e}")),
    };
    let id = match obj.remove("id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(_) => return bad("id must be a string".into()),
    };
    match obj.remove("fds") {
        None | Some(Value::Null) | Some(Value::Array(_)) => {}
        Some(_) => return bad("fds must be an array".into()),
    }
    if let Err(e) = super::ch_fields::drop_unused(&mut obj, super::ch_fields::NET, "") {
        return bad(e.to_string());
    }
    let mut spec = match serde_json::from_value::<NetSpec>(Value::Object(obj)) {
        Ok(s) => s,
        Err(e) => return bad(format!("invalid NetConfig: {e}")),
    };
    if n > 0 && spec.num_queues.is_none() {
        spec.num_queues = Some(2 * n as u64);
    }
    let net = match NetConfig::from_spec(&spec) {
        Ok(c) => c,
        Err(e) => return bad(e.to_string()),
    };
    if n > 0 && n * 2 != net.num_queues {
        return bad(format!(
            "{n} tap fds for num_queues {}: one fd per queue pair",
            net.num_queues
        ));
    }
    let result = match target {
        Plug::Hot(vm) => vm.add_net(id, net, fds),
        Plug::Cold(vmm) => {
            let mut net = net;
            net.id = id;
            return match vmm.cold_plug(ColdPlug::Net(net, fds)) {
                Ok(()) => Reply::no_content(After::Nothing),
                Err(e) => Reply::error(e.status(), format!("{e}{}", fds_note(n))),
            };
        }
    };
    match result {
        Ok(info) => Reply::json(200, &info),
        Err(e) => Reply::error(e.status(), format!("{e}{}", fds_note(n))),
    }
}

/// `vm.add-disk`: the body is cloud-hypervisor's `DiskConfig`.
fn add_disk(target: Plug<'_>, body: &[u8]) -> Reply {
    let disk = match super::ch_fields::parse_section::<DiskSpec>(body, super::ch_fields::DISK) {
        Ok(spec) => DiskConfig::from_spec(&spec),
        Err(e) => return Reply::error(400, format!("vm.add-disk: invalid DiskConfig: {e}")),
    };
    match disk {
        Ok(d) => target.add_disk(d),
        Err(e) => Reply::error(400, format!("vm.add-disk: {e}")),
    }
}

/// `vm.remove-device`: the body is cloud-hypervisor's `VmRemoveDeviceData`.
fn remove_device(target: Plug<'_>, body: &[u8]) -> Reply {
    #[derive(serde::Deserialize)]
    struct RemoveDevice {
        id: String,
    }
    match serde_json::from_slice::<RemoveDevice>(body) {
        Ok(r) => target.remove_device(&r.id),
        Err(e) => Reply::error(400, format!("vm.remove-device: invalid body: {e}")),
    }
}

/// Whether the server answers `url` on its own loop: endpoints that only
/// read snapshots and atomics, or end the VMM by a message on its exit
/// channel, so a `vmm.ping` or `vmm.shutdown` is answered even while a
/// lifecycle request (`vm.boot` waiting for a vhost-user back-end, a
/// `vm.pause` waiting for the vCPUs) runs. Everything else changes the VM
/// and is answered one at a time, in arrival order, off the loop
/// (`super::worker`), as the VMM has always served them.
pub fn answers_at_once(url: &str) -> bool {
    let path = url.split('?').next().unwrap_or(url);
    match path.strip_prefix(PREFIX).and_then(endpoint) {
        // Unknown paths are a 404 without looking at the VMM.
        None => true,
        Some((ep, _)) => matches!(
            ep,
            Endpoint::Ping
                | Endpoint::VmmShutdown
                | Endpoint::Info
                | Endpoint::Counters
                | Endpoint::VmShutdown
        ),
    }
}

/// Answers one request. `url` may carry a query string (ignored, as by
/// cloud-hypervisor).
pub fn handle(method: &str, url: &str, body: &[u8], vmm: &dyn VmmApi) -> Reply {
    handle_with_fds(method, url, body, Vec::new(), vmm)
}

/// [`handle`] for a request that carried file descriptors (`SCM_RIGHTS`,
/// as `ch-remote add-net` sends tap fds). Only `vm.add-net` takes them;
/// whatever is not used is closed when the request is answered, and an
/// error reply says how many were received.
pub fn handle_with_fds(
    method: &str,
    url: &str,
    body: &[u8],
    fds: Vec<File>,
    vmm: &dyn VmmApi,
) -> Reply {
    let path = url.split('?').next().unwrap_or(url);
    let Some((ep, want)) = path.strip_prefix(PREFIX).and_then(endpoint) else {
        return Reply::error(404, format!("no endpoint {path}"));
    };
    if method != want {
        return Reply::error(405, format!("{path} takes {want}, not {method}"));
    }
    let vm = || running(vmm, path);
    match ep {
        Endpoint::Ping => Reply::json(
            200,
            &json!({
                "build_version": env!("CARGO_PKG_VERSION"),
                "version": env!("CARGO_PKG_VERSION"),
                "pid": std::process::id(),
                "features": [],
            }),
        ),
        Endpoint::Info => info(vmm, path),
        Endpoint::Create => create(vmm, body),
        Endpoint::Boot => boot(vmm),
        Endpoint::Delete => delete(vmm),
        Endpoint::VmmShutdown => Reply::no_content(After::Shutdown),
        Endpoint::Counters => vm().map_or_else(|r| r, |vm| Reply::json(200, &vm.counters())),
        Endpoint::VmShutdown => vm().map_or_else(|r| r, |_| Reply::no_content(After::ShutdownVm)),
        Endpoint::Pause => vm().map_or_else(|r| r, |vm| Reply::from_result(vm.pause())),
        Endpoint::Resume => vm().map_or_else(|r| r, |vm| Reply::from_result(vm.resume())),
        Endpoint::PowerButton => {
            vm().map_or_else(|r| r, |vm| Reply::from_result(vm.power_button()))
        }
        Endpoint::Reboot => vm().map_or_else(
            |r| r,
            |vm| match vm.can_reboot() {
                Ok(()) => Reply::no_content(After::Reboot),
                Err(e) => Reply::error(e.status(), e.to_string()),
            },
        ),
        Endpoint::AddDevice | Endpoint::AddNet | Endpoint::AddDisk | Endpoint::RemoveDevice => {
            let slot = vmm.slot();
            let target = match &slot {
                VmSlot::Running(vm) => Plug::Hot(vm.as_ref()),
                VmSlot::Created { booting: false, .. } => Plug::Cold(vmm),
                VmSlot::Created { booting: true, .. } => {
                    return Reply::error(405, format!("{path}: the VM is being booted"));
                }
                VmSlot::Empty => {
                    return Reply::error(
                        404,
                        format!("{path}: no VM has been created (vm.create)"),
                    );
                }
            };
            match ep {
                Endpoint::AddDevice => add_device(target, body),
                Endpoint::AddNet => add_net(target, body, fds),
                Endpoint::AddDisk => add_disk(target, body),
                _ => remove_device(target, body),
            }
        }
        Endpoint::Missing(takes_body) => {
            if takes_body {
                if let Err(e) = serde_json::from_slice::<Value>(body) {
                    return Reply::error(400, format!("invalid JSON body: {e}"));
                }
            }
            Reply::error(
                501,
                format!(
                    "{path} is not implemented by dmavisor yet; the VM is unchanged{}",
                    fds_note(fds.len())
                ),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Mutex;

    use super::*;
    use virtio_iommu::locks::Unpoison;

    /// A VM with the state machine of the real one: pause only when
    /// running, resume only when paused; `stuck` makes pauses time out,
    /// `no_reboot` refuses reboots.
    #[derive(Default)]
    struct FakeVm {
        presses: AtomicU32,
        paused: AtomicBool,
        stuck: AtomicBool,
        no_reboot: AtomicBool,
        /// Hotplug works; the assigned functions' ids.
        hotplug: AtomicBool,
        devices: Mutex<Vec<String>>,
    }

    impl VmApi for FakeVm {
        fn config(&self) -> Value {
            json!({ "cpus": { "boot_vcpus": 2, "max_vcpus": 2 } })
        }
        fn memory_actual_size(&self) -> u64 {
            512 << 20
        }
        fn counters(&self) -> Value {
            json!({ "nic0": { "vfio_map_calls": 3 } })
        }
        fn state(&self) -> RunState {
            if self.paused.load(Ordering::Relaxed) {
                RunState::Paused
            } else {
                RunState::Running
            }
        }
        fn pause(&self) -> Result<(), ApiError> {
            if self.stuck.load(Ordering::Relaxed) {
                return Err(ApiError::Failed("1 of 2 vCPUs stopped".into()));
            }
            if self.paused.swap(true, Ordering::Relaxed) {
                return Err(ApiError::WrongState("already paused".into()));
            }
            Ok(())
        }
        fn resume(&self) -> Result<(), ApiError> {
            if !self.paused.swap(false, Ordering::Relaxed) {
                return Err(ApiError::WrongState("not paused".into()));
            }
            Ok(())
        }
        fn power_button(&self) -> Result<(), ApiError> {
            self.presses.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        fn can_reboot(&self) -> Result<(), ApiError> {
            if self.no_reboot.load(Ordering::Relaxed) {
                return Err(ApiError::Unsupported("vhost-user".into()));
            }
            Ok(())
        }
        fn shutdown(&self) {}
        fn reboot(&self) {}
        fn add_device(&self, device: VfioConfig) -> Result<Value, ApiError> {
            if !self.hotplug.load(Ordering::Relaxed) {
                return Err(ApiError::Unsupported("no hotplug".into()));
            }
            let mut devices = self.devices.lock().unwrap();
            let id = device.name();
            if devices.contains(&id) {
                return Err(ApiError::BadRequest(format!("{id} exists")));
            }
            devices.push(id.clone());
            Ok(json!({ "id": id, "bdf": "0000:00:18.0" }))
        }
        fn remove_device(&self, id: &str) -> Result<(), ApiError> {
            let mut devices = self.devices.lock().unwrap();
            let before = devices.len();
            devices.retain(|d| d != id);
            if devices.len() == before {
                return Err(ApiError::BadRequest(format!("no {id}")));
            }
            Ok(())
        }
    }

    enum FakeSlot {
        Empty,
        Created(Box<VmConfig>, bool),
        Running(Arc<FakeVm>),
    }

    /// A VMM with the real one's slot transitions; `fail_boot` makes
    /// builds fail (a missing kernel file).
    struct FakeVmm {
        slot: Mutex<FakeSlot>,
        shutdowns: AtomicU32,
        reboots: AtomicU32,
        fail_boot: AtomicBool,
    }

    impl FakeVmm {
        fn new(slot: FakeSlot) -> Self {
            Self {
                slot: Mutex::new(slot),
                shutdowns: AtomicU32::new(0),
                reboots: AtomicU32::new(0),
                fail_boot: AtomicBool::new(false),
            }
        }
        fn running() -> (Self, Arc<FakeVm>) {
            let vm = Arc::new(FakeVm::default());
            (Self::new(FakeSlot::Running(vm.clone())), vm)
        }
        fn lock(&self) -> std::sync::MutexGuard<'_, FakeSlot> {
            self.slot.lock().unpoisoned()
        }
        fn created_config(&self) -> Option<VmConfig> {
            match &*self.lock() {
                FakeSlot::Created(c, _) => Some((**c).clone()),
                _ => None,
            }
        }
    }

    impl VmmApi for FakeVmm {
        fn slot(&self) -> VmSlot {
            match &*self.lock() {
                FakeSlot::Empty => VmSlot::Empty,
                FakeSlot::Created(c, booting) => VmSlot::Created {
                    config: super::super::vm_config::to_json(c),
                    memory: c.memory.size,
                    booting: *booting,
                },
                FakeSlot::Running(vm) => VmSlot::Running(vm.clone()),
            }
        }
        fn create(&self, config: VmConfig) -> Result<(), ApiError> {
            let mut slot = self.lock();
            if !matches!(*slot, FakeSlot::Empty) {
                return Err(ApiError::Conflict("a VM exists".into()));
            }
            *slot = FakeSlot::Created(Box::new(config), false);
            Ok(())
        }
        fn boot(&self) -> Result<(), ApiError> {
            let mut slot = self.lock();
            if !matches!(*slot, FakeSlot::Created(_, false)) {
                return Err(ApiError::WrongState("not created".into()));
            }
            if self.fail_boot.load(Ordering::Relaxed) {
                return Err(ApiError::Failed("cannot read kernel '/k'".into()));
            }
            *slot = FakeSlot::Running(Arc::new(FakeVm::default()));
            Ok(())
        }
        fn delete(&self) -> Result<(), ApiError> {
            let mut slot = self.lock();
            match *slot {
                FakeSlot::Created(_, true) => Err(ApiError::WrongState("booting".into())),
                _ => {
                    *slot = FakeSlot::Empty;
                    Ok(())
                }
            }
        }
        fn shutdown(&self) {
            self.shutdowns.fetch_add(1, Ordering::Relaxed);
        }
        fn reboot(&self) {
            self.reboots.fetch_add(1, Ordering::Relaxed);
        }
    }

    const CREATE_BODY: &[u8] = br#"{"payload": {"kernel": "/k", "initramfs": "/i",
        "cmdline": "console=ttyS0"}, "cpus": {"boot_vcpus": 2, "max_vcpus": 2},
        "memory": {"size": 536870912}, "serial": {"mode": "Tty"}}"#;

    fn body(r: &Reply) -> Value {
        serde_json::from_str(r.body.as_deref().unwrap_or("null")).unwrap_or(Value::Null)
    }

    fn put(vmm: &FakeVmm, name: &str) -> Reply {
        handle("PUT", &format!("{PREFIX}{name}"), b"", vmm)
    }

    fn info(vmm: &FakeVmm) -> Reply {
        handle("GET", "/api/v1/vm.info", b"", vmm)
    }

    fn state(vmm: &FakeVmm) -> Value {
        body(&info(vmm))["state"].clone()
    }

    fn body_has_error(r: &Reply) -> bool {
        body(r)[0].as_str().is_some_and(|s| !s.is_empty())
    }

    #[test]
    fn ping_info_counters() {
        let (vmm, _vm) = FakeVmm::running();
        let r = handle("GET", "/api/v1/vmm.ping", b"", &vmm);
        assert_eq!(r.status, 200);
        assert_eq!(body(&r)["pid"], json!(std::process::id()));
        let r = handle("GET", "/api/v1/vm.info?x=1", b"", &vmm);
        assert_eq!(r.status, 200);
        assert_eq!(body(&r)["config"]["cpus"]["boot_vcpus"], json!(2));
        assert_eq!(body(&r)["memory_actual_size"], json!(512u64 << 20));
        assert_eq!(body(&r)["state"], json!("Running"));
        let r = handle("GET", "/api/v1/vm.counters", b"", &vmm);
        assert_eq!(body(&r)["nic0"]["vfio_map_calls"], json!(3));
        assert_eq!(r.after, After::Nothing);
    }

    #[test]
    fn only_reads_and_shutdowns_are_answered_on_the_loop() {
        for url in [
            "/api/v1/vmm.ping",
            "/api/v1/vmm.shutdown",
            "/api/v1/vm.info?x=1",
            "/api/v1/vm.counters",
            "/api/v1/vm.shutdown",
            "/nope",
        ] {
            assert!(answers_at_once(url), "{url}");
        }
        for url in [
            "/api/v1/vm.boot",
            "/api/v1/vm.pause",
            "/api/v1/vm.resume",
            "/api/v1/vm.create",
            "/api/v1/vm.delete",
            "/api/v1/vm.reboot",
            "/api/v1/vm.add-device",
            "/api/v1/vm.remove-device",
        ] {
            assert!(!answers_at_once(url), "{url}");
        }
    }

    #[test]
    fn shutdowns_answer_204_then_shut_down() {
        let (vmm, _vm) = FakeVmm::running();
        // vmm.shutdown ends the VMM, vm.shutdown only the VM.
        for (url, after) in [
            ("/api/v1/vmm.shutdown", After::Shutdown),
            ("/api/v1/vm.shutdown", After::ShutdownVm),
        ] {
            let r = handle("PUT", url, b"", &vmm);
            assert_eq!((r.status, r.body, r.after), (204, None, after), "{url}");
        }
        // The server calls it after replying, not the route.
        assert_eq!(vmm.shutdowns.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn pause_and_resume_follow_the_state_machine() {
        let (vmm, _vm) = FakeVmm::running();
        assert_eq!(state(&vmm), json!("Running"));
        let r = put(&vmm, "vm.resume");
        assert_eq!(r.status, 405, "resume of a running VM: {r:?}");
        assert!(body_has_error(&r));
        assert_eq!(state(&vmm), json!("Running"));
        let r = put(&vmm, "vm.pause");
        assert_eq!(
            (r.status, r.body.clone(), r.after),
            (204, None, After::Nothing)
        );
        assert_eq!(state(&vmm), json!("Paused"));
        let r = put(&vmm, "vm.pause");
        assert_eq!(r.status, 405, "pause of a paused VM: {r:?}");
        assert!(body_has_error(&r));
        assert_eq!(state(&vmm), json!("Paused"));
        let r = put(&vmm, "vm.resume");
        assert_eq!((r.status, r.body.clone()), (204, None));
        assert_eq!(state(&vmm), json!("Running"));
        for (method, name) in [("GET", "vm.pause"), ("POST", "vm.resume")] {
            let r = handle(method, &format!("{PREFIX}{name}"), b"", &vmm);
            assert_eq!(r.status, 405, "{method} {name}");
        }
        assert_eq!(state(&vmm), json!("Running"));
    }

    #[test]
    fn a_pause_that_times_out_is_a_500_and_the_vm_runs() {
        let (vmm, vm) = FakeVmm::running();
        vm.stuck.store(true, Ordering::Relaxed);
        let r = put(&vmm, "vm.pause");
        assert_eq!(r.status, 500, "{r:?}");
        assert!(body(&r)[0].as_str().is_some_and(|m| m.contains("vCPUs")));
        assert_eq!(state(&vmm), json!("Running"));
    }

    #[test]
    fn power_button_presses_once_per_request() {
        let (vmm, vm) = FakeVmm::running();
        let r = put(&vmm, "vm.power-button");
        assert_eq!(
            (r.status, r.body.clone(), r.after),
            (204, None, After::Nothing)
        );
        assert_eq!(vm.presses.load(Ordering::Relaxed), 1);
        let r = handle("GET", "/api/v1/vm.power-button", b"", &vmm);
        assert_eq!(r.status, 405);
        assert_eq!(vm.presses.load(Ordering::Relaxed), 1);
        // Allowed while paused: the interrupt waits in KVM.
        put(&vmm, "vm.pause");
        assert_eq!(put(&vmm, "vm.power-button").status, 204);
        assert_eq!(vm.presses.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn reboot_answers_204_then_reboots_or_refuses_with_a_reason() {
        let (vmm, vm) = FakeVmm::running();
        let r = put(&vmm, "vm.reboot");
        assert_eq!(
            (r.status, r.body.clone(), r.after),
            (204, None, After::Reboot)
        );
        // The server calls it after replying, not the route.
        assert_eq!(vmm.reboots.load(Ordering::Relaxed), 0);
        vm.no_reboot.store(true, Ordering::Relaxed);
        let r = put(&vmm, "vm.reboot");
        assert_eq!((r.status, r.after), (501, After::Nothing), "{r:?}");
        assert!(body_has_error(&r));
        assert_eq!(handle("GET", "/api/v1/vm.reboot", b"", &vmm).status, 405);
    }

    /// Every endpoint of cloud-hypervisor v53's OpenAPI description is
    /// known: implemented, or a 501 that says so (never the 404 of a
    /// path that does not exist), and only a made-up path is a 404.
    #[test]
    fn every_cloud_hypervisor_endpoint_is_known() {
        let (vmm, _vm) = FakeVmm::running();
        let ch_v53 = [
            "vmm.ping",
            "vmm.shutdown",
            "vm.info",
            "vm.counters",
            "vm.create",
            "vm.delete",
            "vm.boot",
            "vm.pause",
            "vm.resume",
            "vm.shutdown",
            "vm.reboot",
            "vm.power-button",
            "vm.resize",
            "vm.resize-disk",
            "vm.resize-zone",
            "vm.add-device",
            "vm.remove-device",
            "vm.add-disk",
            "vm.add-fs",
            "vm.add-generic-vhost-user",
            "vm.add-pmem",
            "vm.add-net",
            "vm.add-vsock",
            "vm.add-vdpa",
            "vm.add-user-device",
            "vm.snapshot",
            "vm.coredump",
            "vm.nmi",
            "vm.restore",
            "vm.receive-migration",
            "vm.send-migration",
        ];
        assert_eq!(ch_v53.len(), 31);
        let mut missing = Vec::new();
        for name in ch_v53 {
            let (ep, _) = endpoint(name).unwrap_or_else(|| panic!("{name} is unknown"));
            if matches!(ep, Endpoint::Missing(_)) {
                missing.push(name);
            }
        }
        // What dmavisor lacks, as the README lists it.
        assert_eq!(missing.len(), 15, "{missing:?}");
        let r = handle("PUT", "/api/v1/vm.nmi", b"", &vmm);
        assert_eq!(r.status, 501, "{r:?}");
        assert_eq!(
            handle("PUT", "/api/v1/vm.frobnicate", b"{}", &vmm).status,
            404
        );
    }

    #[test]
    fn devices_are_added_and_removed_with_cloud_hypervisors_bodies() {
        let (vmm, vm) = FakeVmm::running();
        vm.hotplug.store(true, Ordering::Relaxed);
        let add = |body: &[u8]| handle("PUT", "/api/v1/vm.add-device", body, &vmm);
        let r =
            add(br#"{"path": "/sys/bus/pci/devices/0000:01:00.0", "iommu": true, "id": "nic0"}"#);
        assert_eq!(r.status, 200, "{r:?}");
        let info: Value = serde_json::from_str(r.body.as_deref().unwrap_or("")).unwrap();
        assert_eq!(info, json!({ "id": "nic0", "bdf": "0000:00:18.0" }));
        // Without an id the BDF names it.
        let r = add(br#"{"path": "/sys/bus/pci/devices/0000:02:00.0"}"#);
        assert_eq!(r.status, 200, "{r:?}");
        assert!(r.body.unwrap_or_default().contains("0000:02:00.0"));
        for (body, status) in [
            (
                &br#"{"path": "/sys/bus/pci/devices/0000:01:00.0", "id": "nic0"}"#[..],
                400,
            ),
            (br#"{"iommu": true}"#, 400),
            (br#"{"path": "/x", "pci_segment": 1}"#, 400),
            (br#"{"path": "/x", "bogus": 1}"#, 400),
            (br#"{"path": 7}"#, 400),
        ] {
            let r = add(body);
            assert_eq!(r.status, status, "{}: {r:?}", String::from_utf8_lossy(body));
            assert!(body_has_error(&r));
        }
        assert_eq!(vm.devices.lock().unwrap().len(), 2, "refusals add nothing");
        let remove = |body: &[u8]| handle("PUT", "/api/v1/vm.remove-device", body, &vmm);
        assert_eq!(remove(br#"{"id": "nic0"}"#).status, 204);
        for body in [
            &br#"{"id": "nic0"}"#[..],
            br#"{}"#,
            br#"{"id": 3}"#,
            b"nic0",
        ] {
            let r = remove(body);
            assert_eq!(r.status, 400, "{}: {r:?}", String::from_utf8_lossy(body));
            assert!(body_has_error(&r));
        }
        assert_eq!(
            *vm.devices.lock().unwrap(),
            vec!["0000:02:00.0".to_string()]
        );
        assert_eq!(
            handle("GET", "/api/v1/vm.add-device", b"", &vmm).status,
            405
        );
        // A VM without hotplug says so.
        vm.hotplug.store(false, Ordering::Relaxed);
        assert_eq!(add(br#"{"path": "/x"}"#).status, 501);
    }

    #[test]
    fn bad_requests_change_nothing() {
        let (vmm, _vm) = FakeVmm::running();
        for (method, url, body, status) in [
            ("GET", "/api/v1/vm.nope", &b""[..], 404),
            ("GET", "/api/v1/vm.pause2", b"", 404),
            ("PUT", "/api/v1/vm.Pause", b"", 404),
            ("GET", "/api/v2/vmm.ping", b"", 404),
            ("GET", "/", b"", 404),
            ("PUT", "/api/v1/vmm.ping", b"", 405),
            ("GET", "/api/v1/vmm.shutdown", b"", 405),
            ("DELETE", "/api/v1/vm.shutdown", b"", 405),
            ("GET", "/api/v1/vm.reboot", b"", 405),
            ("GET", "/api/v1/vm.create", b"", 405),
            ("POST", "/api/v1/vm.boot", b"", 405),
            ("GET", "/api/v1/vm.delete", b"", 405),
            ("PUT", "/api/v1/vm.add-device", b"{\"path\": ", 400),
            ("PUT", "/api/v1/vm.create", b"\xff\xfe", 400),
            ("PUT", "/api/v1/vm.create", b"{\"payload\": ", 400),
            ("PUT", "/api/v1/vm.add-device", b"{\"path\": \"/x\"}", 501),
            ("PUT", "/api/v1/vm.resize", b"{\"desired_vcpus\": 2}", 501),
            // A VM runs: no second one, no second boot.
            ("PUT", "/api/v1/vm.create", CREATE_BODY, 409),
            ("PUT", "/api/v1/vm.boot", b"", 405),
        ] {
            let r = handle(method, url, body, &vmm);
            assert_eq!(r.status, status, "{method} {url}: {r:?}");
            assert!(body_has_error(&r), "{method} {url}: {r:?}");
            assert_eq!(r.after, After::Nothing, "{method} {url}");
        }
        assert_eq!(vmm.shutdowns.load(Ordering::Relaxed), 0);
        assert_eq!(state(&vmm), json!("Running"));
    }

    #[test]
    fn before_create_only_create_and_the_vmm_endpoints_work() {
        let vmm = FakeVmm::new(FakeSlot::Empty);
        let r = info(&vmm);
        assert_eq!(r.status, 404, "vm.info before create: {r:?}");
        assert!(body_has_error(&r));
        for (method, name, status) in [
            ("GET", "vm.counters", 404),
            ("PUT", "vm.boot", 404),
            ("PUT", "vm.pause", 404),
            ("PUT", "vm.resume", 404),
            ("PUT", "vm.power-button", 404),
            ("PUT", "vm.reboot", 404),
            ("PUT", "vm.shutdown", 404),
        ] {
            let r = handle(method, &format!("{PREFIX}{name}"), b"", &vmm);
            assert_eq!(
                (r.status, r.after),
                (status, After::Nothing),
                "{name}: {r:?}"
            );
            assert!(body_has_error(&r), "{name}: {r:?}");
        }
        assert_eq!(handle("GET", "/api/v1/vmm.ping", b"", &vmm).status, 200);
        // Deleting nothing is not an error (cloud-hypervisor's behaviour).
        let r = put(&vmm, "vm.delete");
        assert_eq!((r.status, r.after), (204, After::Nothing));
        assert!(matches!(vmm.slot(), VmSlot::Empty));
        let r = put(&vmm, "vmm.shutdown");
        assert_eq!((r.status, r.after), (204, After::Shutdown));
    }

    #[test]
    fn create_boot_and_info_through_the_states() {
        let vmm = FakeVmm::new(FakeSlot::Empty);
        let r = handle("PUT", "/api/v1/vm.create", CREATE_BODY, &vmm);
        assert_eq!(
            (r.status, r.body.clone(), r.after),
            (204, None, After::Nothing)
        );
        let created = vmm.created_config().expect("created");
        assert_eq!(created.cpus.boot, 2);
        assert_eq!(created.memory.size, 512 << 20);
        assert_eq!(
            created.initramfs.as_deref(),
            Some(std::path::Path::new("/i"))
        );
        let r = info(&vmm);
        assert_eq!(r.status, 200);
        assert_eq!(body(&r)["state"], json!("Created"));
        assert_eq!(body(&r)["config"]["payload"]["kernel"], json!("/k"));
        assert_eq!(body(&r)["memory_actual_size"], json!(512u64 << 20));
        // Created, not booted: 405 for what needs a running VM.
        for (method, name) in [
            ("PUT", "vm.pause"),
            ("PUT", "vm.resume"),
            ("PUT", "vm.reboot"),
            ("PUT", "vm.power-button"),
            ("PUT", "vm.shutdown"),
            ("GET", "vm.counters"),
        ] {
            let r = handle(method, &format!("{PREFIX}{name}"), b"", &vmm);
            assert_eq!((r.status, r.after), (405, After::Nothing), "{name}: {r:?}");
        }
        // A second create is a conflict and keeps the first config.
        let other = br#"{"payload": {"kernel": "/other"}}"#;
        let r = handle("PUT", "/api/v1/vm.create", other, &vmm);
        assert_eq!(r.status, 409, "{r:?}");
        assert_eq!(vmm.created_config(), Some(created));
        // Boot: running, the VM's own answers from now on.
        let r = put(&vmm, "vm.boot");
        assert_eq!(
            (r.status, r.body.clone(), r.after),
            (204, None, After::Nothing)
        );
        assert_eq!(state(&vmm), json!("Running"));
        assert_eq!(put(&vmm, "vm.pause").status, 204);
        assert_eq!(state(&vmm), json!("Paused"));
    }

    #[test]
    fn a_failed_boot_is_a_500_and_the_vm_stays_created() {
        let vmm = FakeVmm::new(FakeSlot::Empty);
        assert_eq!(
            handle("PUT", "/api/v1/vm.create", CREATE_BODY, &vmm).status,
            204
        );
        vmm.fail_boot.store(true, Ordering::Relaxed);
        let r = put(&vmm, "vm.boot");
        assert_eq!((r.status, r.after), (500, After::Nothing), "{r:?}");
        assert!(body(&r)[0].as_str().is_some_and(|m| m.contains("kernel")));
        assert_eq!(state(&vmm), json!("Created"));
        vmm.fail_boot.store(false, Ordering::Relaxed);
        assert_eq!(put(&vmm, "vm.boot").status, 204);
        assert_eq!(state(&vmm), json!("Running"));
    }

    #[test]
    fn a_bad_create_body_changes_nothing() {
        let vmm = FakeVmm::new(FakeSlot::Empty);
        for body in [
            &b""[..],
            b"{}",
            b"{\"payload\": {\"kernel\": \"/k\"}, \"cpus\": {\"boot_vcpus\": 0}}",
            b"{\"payload\": {\"kernel\": \"/k\"}, \"bogus\": 1}",
        ] {
            let r = handle("PUT", "/api/v1/vm.create", body, &vmm);
            assert_eq!(r.status, 400, "{}: {r:?}", String::from_utf8_lossy(body));
            assert!(body_has_error(&r));
            assert!(matches!(vmm.slot(), VmSlot::Empty));
        }
        // With a VM created, a bad body is still a 400 and keeps it.
        assert_eq!(
            handle("PUT", "/api/v1/vm.create", CREATE_BODY, &vmm).status,
            204
        );
        let r = handle("PUT", "/api/v1/vm.create", b"{", &vmm);
        assert_eq!(r.status, 400);
        assert!(vmm.created_config().is_some());
    }

    #[test]
    fn delete_forgets_a_created_vm_and_shuts_down_a_running_one() {
        let vmm = FakeVmm::new(FakeSlot::Empty);
        assert_eq!(
            handle("PUT", "/api/v1/vm.create", CREATE_BODY, &vmm).status,
            204
        );
        let r = put(&vmm, "vm.delete");
        assert_eq!((r.status, r.after), (204, After::Nothing));
        assert!(matches!(vmm.slot(), VmSlot::Empty));
        assert_eq!(info(&vmm).status, 404);
        // A new one can be created after the delete.
        assert_eq!(
            handle("PUT", "/api/v1/vm.create", CREATE_BODY, &vmm).status,
            204
        );
        // A running one is shut down and forgotten before the reply.
        let (running, _vm) = FakeVmm::running();
        let r = put(&running, "vm.delete");
        assert_eq!((r.status, r.after), (204, After::Nothing));
        assert!(matches!(running.slot(), VmSlot::Empty));
        // One being booted (from the command line) is left alone.
        let booting = FakeVmm::new(FakeSlot::Created(
            Box::new(super::super::vm_config::parse(CREATE_BODY).expect("valid")),
            true,
        ));
        for name in ["vm.delete", "vm.boot"] {
            let r = put(&booting, name);
            assert_eq!((r.status, r.after), (405, After::Nothing), "{name}");
        }
        assert_eq!(body(&info(&booting))["state"], json!("Created"));
    }
}
