//! Fuzzes the REST API's routing with arbitrary methods, URLs and bodies:
//! every answer is one of the documented status codes with a JSON body
//! (or none for 204), only the shutdown, delete and reboot endpoints ask
//! for a shutdown or reboot, and only with a 204; the fake VMM keeps the
//! real one's slot (empty, created, running: `vm.create` bodies go through
//! the real `VmConfig` parser) and the fake VM the pause state machine, so
//! sequences of creates, boots, deletes, pauses and resumes are covered.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use vmm::api::routes::{handle, After, ApiError, RunState, VmApi, VmSlot, VmmApi};
use vmm::config::VmConfig;

struct Vm {
    paused: AtomicBool,
}

impl VmApi for Vm {
    fn config(&self) -> Value {
        json!({ "cpus": { "boot_vcpus": 1, "max_vcpus": 1 } })
    }
    fn memory_actual_size(&self) -> u64 {
        1 << 30
    }
    fn counters(&self) -> Value {
        json!({})
    }
    fn state(&self) -> RunState {
        if self.paused.load(Ordering::Relaxed) {
            RunState::Paused
        } else {
            RunState::Running
        }
    }
    fn pause(&self) -> Result<(), ApiError> {
        if self.paused.swap(true, Ordering::Relaxed) {
            return Err(ApiError::WrongState("paused".into()));
        }
        Ok(())
    }
    fn resume(&self) -> Result<(), ApiError> {
        if !self.paused.swap(false, Ordering::Relaxed) {
            return Err(ApiError::WrongState("running".into()));
        }
        Ok(())
    }
    fn power_button(&self) -> Result<(), ApiError> {
        Ok(())
    }
    fn can_reboot(&self) -> Result<(), ApiError> {
        Ok(())
    }
    fn shutdown(&self) {}
    fn reboot(&self) {}
}

/// `None`: no VM; `Some(config, None)`: created; `Some(_, Some(vm))`: running.
type Slot = Option<(VmConfig, Option<Arc<Vm>>)>;

struct Vmm {
    slot: Mutex<Slot>,
}

impl Vmm {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl VmmApi for Vmm {
    fn slot(&self) -> VmSlot {
        match &*self.lock() {
            None => VmSlot::Empty,
            Some((c, None)) => VmSlot::Created {
                config: vmm::api::vm_config::to_json(c),
                memory: c.memory.size,
                booting: false,
            },
            Some((_, Some(vm))) => VmSlot::Running(vm.clone()),
        }
    }
    fn create(&self, config: VmConfig) -> Result<(), ApiError> {
        let mut slot = self.lock();
        if slot.is_some() {
            return Err(ApiError::Conflict("exists".into()));
        }
        *slot = Some((config, None));
        Ok(())
    }
    fn boot(&self) -> Result<(), ApiError> {
        match &mut *self.lock() {
            Some((_, vm @ None)) => {
                *vm = Some(Arc::new(Vm {
                    paused: AtomicBool::new(false),
                }));
                Ok(())
            }
            _ => Err(ApiError::WrongState("not created".into())),
        }
    }
    fn delete(&self) -> Result<(), ApiError> {
        let mut slot = self.lock();
        if matches!(&*slot, Some((_, Some(_)))) {
            return Err(ApiError::WrongState("running".into()));
        }
        *slot = None;
        Ok(())
    }
    fn shutdown(&self) {}
    fn reboot(&self) {}
}

static VMM: Vmm = Vmm {
    slot: Mutex::new(None),
};

const METHODS: [&str; 5] = ["GET", "PUT", "POST", "DELETE", "PATCH"];

fuzz_target!(|data: &[u8]| {
    let Some((&m, rest)) = data.split_first() else {
        return;
    };
    let method = METHODS[usize::from(m) % METHODS.len()];
    let (url, body) = match rest.iter().position(|b| *b == 0) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let url = String::from_utf8_lossy(url);
    let running = matches!(VMM.slot(), VmSlot::Running(_));
    let r = handle(method, &url, body, &VMM);
    assert!(
        [200, 204, 400, 404, 405, 409, 501].contains(&r.status),
        "{method} {url}: {}",
        r.status
    );
    let path = url.split('?').next().unwrap_or_default();
    let want = match path {
        "/api/v1/vmm.shutdown" | "/api/v1/vm.shutdown" if r.status == 204 => After::Shutdown,
        "/api/v1/vm.delete" if r.status == 204 && running => After::Shutdown,
        "/api/v1/vm.reboot" if r.status == 204 => After::Reboot,
        _ => After::Nothing,
    };
    assert_eq!(r.after, want, "{method} {url}");
    match &r.body {
        Some(b) => assert!(serde_json::from_str::<Value>(b).is_ok(), "{b}"),
        None => assert_eq!(r.status, 204),
    }
});
