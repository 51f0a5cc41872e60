//! The REST API's routes: cloud-hypervisor's paths, methods and status
//! codes, answered from a [`VmApi`].
//!
//! Pure request-to-reply logic (no sockets), so every path, method and
//! malformed input is unit-tested. Endpoints of cloud-hypervisor's OpenAPI
//! description that dmavisor does not implement yet answer 501 with a
//! message, after the same validation of their JSON body as an
//! implemented one would do: a management stack learns what is missing,
//! not that the VMM is broken, and a bad body is still a 400.

use serde_json::{json, Value};

/// The path prefix of every endpoint.
pub const PREFIX: &str = "/api/v1/";

/// What the API can ask of the running VM. Implementations must not block
/// on the vCPUs: the answers come from atomics and a configuration
/// snapshot.
pub trait VmApi: Send + Sync {
    /// The VM's configuration as cloud-hypervisor's `VmConfig` shapes it.
    fn config(&self) -> Value;
    /// Guest RAM in bytes.
    fn memory_actual_size(&self) -> u64;
    /// Per-device counters: device name -> counter name -> value.
    fn counters(&self) -> Value;
    /// Ends the VM (and, since dmavisor cannot create another one in the
    /// same process yet, the VMM) with exit status 0. Called by the server
    /// once the reply that asked for it has been sent.
    fn shutdown(&self);
}

/// An HTTP answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// JSON body, if any.
    pub body: Option<String>,
    /// The VM is to be shut down once this reply is sent (the process may
    /// end right after, so the reply goes first).
    pub shutdown: bool,
}

impl Reply {
    fn json(status: u16, v: &Value) -> Self {
        Self {
            status,
            body: Some(v.to_string()),
            shutdown: false,
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
        "vm.reboot" | "vm.power-button" | "vm.pause" | "vm.resume" | "vm.boot" | "vm.delete" => {
            (Endpoint::Missing(false), "PUT")
        }
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
                "state": "Running",
                "memory_actual_size": vm.memory_actual_size(),
            }),
        ),
        Endpoint::Counters => Reply::json(200, &vm.counters()),
        Endpoint::VmmShutdown | Endpoint::VmShutdown => Reply {
            status: 204,
            body: None,
            shutdown: true,
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
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[derive(Default)]
    struct FakeVm {
        shutdowns: AtomicU32,
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
        fn shutdown(&self) {
            self.shutdowns.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn body(r: &Reply) -> Value {
        serde_json::from_str(r.body.as_deref().unwrap_or("null")).unwrap_or(Value::Null)
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
        assert!(!r.shutdown);
    }

    #[test]
    fn shutdowns_answer_204_then_shut_down() {
        let vm = FakeVm::default();
        for url in ["/api/v1/vmm.shutdown", "/api/v1/vm.shutdown"] {
            let r = handle("PUT", url, b"", &vm);
            assert_eq!((r.status, r.body, r.shutdown), (204, None, true), "{url}");
        }
        // The server calls it after replying, not the route.
        assert_eq!(vm.shutdowns.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn bad_requests_change_nothing() {
        let vm = FakeVm::default();
        for (method, url, body, status) in [
            ("GET", "/api/v1/vm.nope", &b""[..], 404),
            ("GET", "/api/v2/vmm.ping", b"", 404),
            ("GET", "/", b"", 404),
            ("PUT", "/api/v1/vmm.ping", b"", 405),
            ("GET", "/api/v1/vmm.shutdown", b"", 405),
            ("DELETE", "/api/v1/vm.shutdown", b"", 405),
            ("PUT", "/api/v1/vm.add-device", b"{\"path\": ", 400),
            ("PUT", "/api/v1/vm.create", b"\xff\xfe", 400),
            ("PUT", "/api/v1/vm.add-device", b"{\"path\": \"/x\"}", 501),
            ("PUT", "/api/v1/vm.pause", b"", 501),
        ] {
            let r = handle(method, url, body, &vm);
            assert_eq!(r.status, status, "{method} {url}: {r:?}");
            assert!(body_has_error(&r), "{method} {url}: {r:?}");
            assert!(!r.shutdown, "{method} {url}");
        }
        assert_eq!(vm.shutdowns.load(Ordering::Relaxed), 0);
    }

    fn body_has_error(r: &Reply) -> bool {
        body(r)["error"].as_str().is_some_and(|s| !s.is_empty())
    }
}
