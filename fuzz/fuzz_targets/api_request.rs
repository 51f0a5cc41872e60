//! Fuzzes the REST API's routing with arbitrary methods, URLs and bodies:
//! every answer is one of the documented status codes with a JSON body
//! (or none for 204), and only the shutdown endpoints ask for a shutdown.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{json, Value};
use vmm::api::routes::{handle, VmApi};

struct Vm;

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
    fn shutdown(&self) {}
}

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
    let r = handle(method, &url, body, &Vm);
    assert!(
        [200, 204, 400, 404, 405, 501].contains(&r.status),
        "{method} {url}: {}",
        r.status
    );
    assert_eq!(r.shutdown, r.status == 204);
    match &r.body {
        Some(b) => assert!(serde_json::from_str::<Value>(b).is_ok(), "{b}"),
        None => assert_eq!(r.status, 204),
    }
});
