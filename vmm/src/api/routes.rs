//! The REST API's routes: cloud-hypervisor's paths, methods and status
//! codes, answered from a [`VmApi`].
//!
//! Pure request-to-reply logic (no sockets), so every path, method,
//! state transition and malformed input is unit-tested. A request the VM's
//! state does not allow (resuming a running VM, pausing a paused one) gets
//! 405, as in cloud-hypervisor's description. Endpoints of its OpenAPI
//! description that dmavisor does not implement yet answer 501 with a
//! message, after the same validation of their JSON body as an
//! implemented one would do: a management stack learns what is missing,
//! not that the VMM is broken, and a bad body is still a 400.

use serde_json::{json, Value};

pub use super::error::ApiError;

/// The path prefix of every endpoint.
pub const PREFIX: &str = "/api/v1/";

/// What `vm.info` reports as the VM's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunState {
    /// The vCPUs run.
    Running,
    /// `vm.pause` parked every vCPU.
    Paused,
}

impl RunState {
    /// cloud-hypervisor's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
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
    /// Ends the VM (and, since dmavisor cannot create another one in the
    /// same process yet, the VMM) with exit status 0. Called by the server
    /// once the reply that asked for it has been sent.
    fn shutdown(&self);
    /// Tears the VM down and boots it again from its configuration.
    /// Called by the server once the reply that asked for it has been sent.
    fn reboot(&self);
}

/// What the server does once the reply is sent (the process may end or
/// be replaced right after, so the reply goes first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    /// Nothing.
    Nothing,
    /// [`VmApi::shutdown`].
    Shutdown,
    /// [`VmApi::reboot`].
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

    /// An error reply: `{"error": msg}`.
    pub fn error(status: u16, msg: impl Into<String>) -> Self {
        Self::json(status, &json!({ "error": msg.into() }))
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
        "vm.boot" | "vm.delete" => (Endpoint::Missing(false), "PUT"),
        "vm.create" | "vm.add-device" | "vm.remove-device" | "vm.add-disk" | "vm.add-net"
        | "vm.resize" | "vm.snapshot" | "vm.restore" => (Endpoint::Missing(true), "PUT"),
        _ => return None,
    })
}

/// Answers one request. `url` may carry a query string (ignored, as by
/// cloud-hypervisor).
pub fn handle(method: &str, url: &str, body: &[u8], vm: &dyn VmApi) -> Reply {
    let path = url.split('?').next().unwrap_or(url);
    let Some((ep, want)) = path.strip_prefix(PREFIX).and_then(endpoint) else {
        return Reply::error(404, format!("no endpoint {path}"));
    };
    if method != want {
        return Reply::error(405, format!("{path} takes {want}, not {method}"));
    }
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
        Endpoint::Info => Reply::json(
            200,
            &json!({
                "config": vm.config(),
                "state": vm.state().as_str(),
                "memory_actual_size": vm.memory_actual_size(),
            }),
        ),
        Endpoint::Counters => Reply::json(200, &vm.counters()),
        Endpoint::VmmShutdown | Endpoint::VmShutdown => Reply::no_content(After::Shutdown),
        Endpoint::Pause => Reply::from_result(vm.pause()),
        Endpoint::Resume => Reply::from_result(vm.resume()),
        Endpoint::PowerButton => Reply::from_result(vm.power_button()),
        Endpoint::Reboot => match vm.can_reboot() {
            Ok(()) => Reply::no_content(After::Reboot),
            Err(e) => Reply::error(e.status(), e.to_string()),
        },
        Endpoint::Missing(takes_body) => {
            if takes_body {
                if let Err(e) = serde_json::from_slice::<Value>(body) {
                    return Reply::error(400, format!("invalid JSON body: {e}"));
                }
            }
            Reply::error(
                501,
                format!("{path} is not implemented by dmavisor yet; the VM is unchanged"),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use super::*;

    /// A VM with the state machine of the real one: pause only when
    /// running, resume only when paused; `stuck` makes pauses time out,
    /// `no_reboot` refuses reboots.
    #[derive(Default)]
    struct FakeVm {
        shutdowns: AtomicU32,
        reboots: AtomicU32,
        presses: AtomicU32,
        paused: AtomicBool,
        stuck: AtomicBool,
        no_reboot: AtomicBool,
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
        fn shutdown(&self) {
            self.shutdowns.fetch_add(1, Ordering::Relaxed);
        }
        fn reboot(&self) {
            self.reboots.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn body(r: &Reply) -> Value {
        serde_json::from_str(r.body.as_deref().unwrap_or("null")).unwrap_or(Value::Null)
    }

    fn put(vm: &FakeVm, name: &str) -> Reply {
        handle("PUT", &format!("{PREFIX}{name}"), b"", vm)
    }

    fn state(vm: &FakeVm) -> Value {
        body(&handle("GET", "/api/v1/vm.info", b"", vm))["state"].clone()
    }

    #[test]
    fn ping_info_counters() {
        let vm = FakeVm::default();
        let r = handle("GET", "/api/v1/vmm.ping", b"", &vm);
        assert_eq!(r.status, 200);
        assert_eq!(body(&r)["pid"], json!(std::process::id()));
        let r = handle("GET", "/api/v1/vm.info?x=1", b"", &vm);
        assert_eq!(r.status, 200);
        assert_eq!(body(&r)["config"]["cpus"]["boot_vcpus"], json!(2));
        assert_eq!(body(&r)["memory_actual_size"], json!(512u64 << 20));
        assert_eq!(body(&r)["state"], json!("Running"));
        let r = handle("GET", "/api/v1/vm.counters", b"", &vm);
        assert_eq!(body(&r)["nic0"]["vfio_map_calls"], json!(3));
        assert_eq!(r.after, After::Nothing);
    }

    #[test]
    fn shutdowns_answer_204_then_shut_down() {
        let vm = FakeVm::default();
        for url in ["/api/v1/vmm.shutdown", "/api/v1/vm.shutdown"] {
            let r = handle("PUT", url, b"", &vm);
            assert_eq!(
                (r.status, r.body, r.after),
                (204, None, After::Shutdown),
                "{url}"
            );
        }
        // The server calls it after replying, not the route.
        assert_eq!(vm.shutdowns.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn pause_and_resume_follow_the_state_machine() {
        let vm = FakeVm::default();
        assert_eq!(state(&vm), json!("Running"));
        let r = put(&vm, "vm.resume");
        assert_eq!(r.status, 405, "resume of a running VM: {r:?}");
        assert!(body_has_error(&r));
        assert_eq!(state(&vm), json!("Running"));
        let r = put(&vm, "vm.pause");
        assert_eq!(
            (r.status, r.body.clone(), r.after),
            (204, None, After::Nothing)
        );
        assert_eq!(state(&vm), json!("Paused"));
        let r = put(&vm, "vm.pause");
        assert_eq!(r.status, 405, "pause of a paused VM: {r:?}");
        assert!(body_has_error(&r));
        assert_eq!(state(&vm), json!("Paused"));
        let r = put(&vm, "vm.resume");
        assert_eq!((r.status, r.body.clone()), (204, None));
        assert_eq!(state(&vm), json!("Running"));
        for (method, name) in [("GET", "vm.pause"), ("POST", "vm.resume")] {
            let r = handle(method, &format!("{PREFIX}{name}"), b"", &vm);
            assert_eq!(r.status, 405, "{method} {name}");
        }
        assert_eq!(state(&vm), json!("Running"));
    }

    #[test]
    fn a_pause_that_times_out_is_a_500_and_the_vm_runs() {
        let vm = FakeVm::default();
        vm.stuck.store(true, Ordering::Relaxed);
        let r = put(&vm, "vm.pause");
        assert_eq!(r.status, 500, "{r:?}");
        assert!(body(&r)["error"]
            .as_str()
            .is_some_and(|m| m.contains("vCPUs")));
        assert_eq!(state(&vm), json!("Running"));
    }

    #[test]
    fn power_button_presses_once_per_request() {
        let vm = FakeVm::default();
        let r = put(&vm, "vm.power-button");
        assert_eq!(
            (r.status, r.body.clone(), r.after),
            (204, None, After::Nothing)
        );
        assert_eq!(vm.presses.load(Ordering::Relaxed), 1);
        let r = handle("GET", "/api/v1/vm.power-button", b"", &vm);
        assert_eq!(r.status, 405);
        assert_eq!(vm.presses.load(Ordering::Relaxed), 1);
        // Allowed while paused: the interrupt waits in KVM.
        put(&vm, "vm.pause");
        assert_eq!(put(&vm, "vm.power-button").status, 204);
        assert_eq!(vm.presses.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn reboot_answers_204_then_reboots_or_refuses_with_a_reason() {
        let vm = FakeVm::default();
        let r = put(&vm, "vm.reboot");
        assert_eq!(
            (r.status, r.body.clone(), r.after),
            (204, None, After::Reboot)
        );
        // The server calls it after replying, not the route.
        assert_eq!(vm.reboots.load(Ordering::Relaxed), 0);
        vm.no_reboot.store(true, Ordering::Relaxed);
        let r = put(&vm, "vm.reboot");
        assert_eq!((r.status, r.after), (501, After::Nothing), "{r:?}");
        assert!(body_has_error(&r));
        assert_eq!(handle("GET", "/api/v1/vm.reboot", b"", &vm).status, 405);
    }

    #[test]
    fn bad_requests_change_nothing() {
        let vm = FakeVm::default();
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
            ("PUT", "/api/v1/vm.add-device", b"{\"path\": ", 400),
            ("PUT", "/api/v1/vm.create", b"\xff\xfe", 400),
            ("PUT", "/api/v1/vm.add-device", b"{\"path\": \"/x\"}", 501),
            ("PUT", "/api/v1/vm.boot", b"", 501),
            ("PUT", "/api/v1/vm.delete", b"", 501),
        ] {
            let r = handle(method, url, body, &vm);
            assert_eq!(r.status, status, "{method} {url}: {r:?}");
            assert!(body_has_error(&r), "{method} {url}: {r:?}");
            assert_eq!(r.after, After::Nothing, "{method} {url}");
        }
        assert_eq!(vm.shutdowns.load(Ordering::Relaxed), 0);
        assert_eq!(vm.presses.load(Ordering::Relaxed), 0);
        assert_eq!(state(&vm), json!("Running"));
    }

    fn body_has_error(r: &Reply) -> bool {
        body(r)["error"].as_str().is_some_and(|s| !s.is_empty())
    }
}
