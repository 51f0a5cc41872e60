//! Issue 6: the vviommu guest driver (guest-driver/) on a Debian bookworm
//! 6.1 guest, against QEMU's virtio-iommu-pci as the peer device.
//!
//! ONE guest boot (QEMU TCG, q35, virtio-iommu-pci, virtio-net-pci with
//! iommu_platform=on, edu) runs the whole matrix inside
//! (guest-driver/tests/guest-matrix.sh, driven by run-qemu-matrix.sh): for
//! every policy x invalidation mode the module is loaded, virtio-net moves a
//! fresh random 1.5 MiB file over TCP from the host (md5 compared), the edu
//! device DMAs into mapped buffers, and a DMA after unmap must be blocked
//! where the policy promises it. The guest prints one `VVI-RESULT` line per
//! configuration; each test below checks its own lines.
//!
//! No KVM is needed (TCG), so this runs on any host with
//! qemu-system-x86_64, the bookworm guest image (resources/guest-images)
//! and the matching linux-headers package.

use std::collections::HashMap;
use std::process::Command;
use std::sync::OnceLock;

use integration_tests::paths::repo_root;
use integration_tests::vviommu_matrix::{
    check_every_configuration, check_policy, check_request_counts,
};

struct Run {
    output: String,
    error: Option<String>,
}

fn run() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(|| {
        let script = repo_root().join("guest-driver/tests/run-qemu-matrix.sh");
        match Command::new(&script).arg("matrix").output() {
            Ok(out) => {
                let output = String::from_utf8_lossy(&out.stdout).into_owned();
                let error = if out.status.success() {
                    None
                } else {
                    Some(format!(
                        "{} exited with {}: {}",
                        script.display(),
                        out.status,
                        String::from_utf8_lossy(&out.stderr)
                    ))
                };
                Run { output, error }
            }
            Err(e) => Run {
                output: String::new(),
                error: Some(format!("cannot run {}: {e}", script.display())),
            },
        }
    })
}

/// `key=value` fields of a result line (values may be quoted).
fn fields(line: &str) -> HashMap<String, String> {
    let mut map = HashMap::new();
    let mut rest = line;
    while let Some(eq) = rest.find('=') {
        let key_start = rest[..eq].rfind(' ').map_or(0, |i| i + 1);
        let key = rest[key_start..eq].to_string();
        let after = &rest[eq + 1..];
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            let end = quoted.find('"').unwrap_or(quoted.len());
            (&quoted[..end], &quoted[(end + 1).min(quoted.len())..])
        } else {
            let end = after.find(' ').unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        map.insert(key, value.to_string());
        rest = next;
    }
    map
}

fn result_lines() -> Vec<&'static str> {
    let r = run();
    assert!(r.error.is_none(), "{}", r.error.as_deref().unwrap_or(""));
    assert!(
        r.output.contains("VVI-DONE") && r.output.contains("GUEST-SCRIPT-EXIT=0"),
        "guest did not finish the matrix:\n{}",
        r.output
    );
    r.output
        .lines()
        .filter_map(|l| l.find("VVI-RESULT ").map(|i| &l[i..]))
        .collect()
}

/// The guest output, after checking the matrix ran to its end.
fn output() -> &'static str {
    result_lines();
    &run().output
}

/// The one result line starting with `prefix`.
fn result_line(prefix: &str) -> &'static str {
    result_lines()
        .into_iter()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix} line"))
}

fn check_config(policy: &str) {
    check_policy(output(), policy);
}

#[test]
fn bogus_policy_fails_with_clear_message() {
    let neg = result_line("VVI-RESULT negative policy=bogus");
    let f = fields(neg);
    assert_eq!(f["status"], "PASS", "{neg}");
    assert!(f["msg"].contains("unknown policy 'bogus'"), "{neg}");
    let inv = result_line("VVI-RESULT negative invalidation=");
    assert_eq!(fields(inv)["status"], "PASS", "{inv}");
}

#[test]
fn already_bound_endpoint_is_refused_and_keeps_working() {
    let l = result_line("VVI-RESULT refused ");
    let f = fields(l);
    assert_eq!(f["state"], "refused", "{l}");
    assert_eq!(f["dmesg_lines"], "1", "{l}");
    assert_eq!(f["edu_dma_ok"], "1", "{l}");
    assert_eq!(f["status"], "PASS", "{l}");
}

#[test]
fn policy_identity() {
    check_config("identity");
}

#[test]
fn policy_kmalloc() {
    check_config("kmalloc");
}

#[test]
fn policy_magazine() {
    check_config("magazine");
}

#[test]
fn policy_global() {
    check_config("global");
}

#[test]
fn policy_persistent() {
    check_config("persistent");
}

#[test]
fn policy_passthrough() {
    check_config("passthrough");
}

#[test]
fn every_configuration_reported_once() {
    check_every_configuration(output());
}

#[test]
fn request_counts_per_dma() {
    check_request_counts(output());
}

#[test]
fn field_parser_handles_quotes() {
    let f = fields("VVI-RESULT negative policy=bogus status=PASS msg=\"a b=c\" x=1");
    assert_eq!(f["policy"], "bogus");
    assert_eq!(f["msg"], "a b=c");
    assert_eq!(f["x"], "1");
}
