//! Issue 12: cloud-hypervisor's REST API on `--api-socket`, driven with
//! `curl --unix-socket` from the runner while a guest runs
//! (`guest/api-host.sh`, `guest/api-guest.sh`): the read-only endpoints,
//! bad requests, pause and resume (the guest's one-per-second heartbeats
//! stop and go on), reboot (the guest boots a second time behind the same
//! socket and PID), the ACPI power button (the guest sees the press and
//! powers off; the VMM serves on), `vmm.shutdown` of a paused VM, a VM
//! configured remotely: dmavisor started with only `--api-socket`, then
//! `vm.create` (cloud-hypervisor's `VmConfig` JSON) and `vm.boot`; and
//! issue 29's VM owner: `vm.shutdown` then `vm.boot` again in the same
//! process, and a reboot the guest asks for rebuilt in place.
//!
//! The cases run in ONE KVM-environment session; the requests and
//! answers are printed as a transcript.

use std::sync::OnceLock;
use std::time::Duration;

use integration_tests::images::{build_initramfs, ensure_images, InitramfsSpec};
use integration_tests::markers::token_value;
use integration_tests::paths::{guest_script, path_arg};
use integration_tests::session::{Case, CaseResult, Plan, SharedSession};
use integration_tests::vmm::dmavisor_binary;
use serde_json::Value;

/// Two boots, about 20 s of waiting on heartbeats, and slack for slow
/// nested runners.
const LIFECYCLE_TIMEOUT_SECS: u32 = 600;
const SHUTDOWN_TIMEOUT_SECS: u32 = 300;
/// Two boots (the second after the reboot) and slack.
const CREATE_TIMEOUT_SECS: u32 = 600;
/// Two boots and slack.
const BOOT_AGAIN_TIMEOUT_SECS: u32 = 600;
const GUEST_REBOOT_TIMEOUT_SECS: u32 = 600;
/// One boot and slack.
const EVENTS_TIMEOUT_SECS: u32 = 400;
/// One boot and slack.
const CONSOLE_TIMEOUT_SECS: u32 = 400;
const SESSION_TIMEOUT: Duration = Duration::from_secs(2100);

fn session() -> &'static SharedSession {
    static SESSION: OnceLock<SharedSession> = OnceLock::new();
    SESSION.get_or_init(|| {
        SharedSession::run("api", SESSION_TIMEOUT, || {
            let bookworm = ensure_images("bookworm").map_err(|e| e.to_string())?;
            let mut spec = InitramfsSpec::new("bookworm", guest_script("api-guest.sh"));
            // The power button's driver and its /dev/input/eventN; the
            // virtio-blk driver for boot_again's disk.
            spec.modules = vec!["button".into(), "evdev".into(), "virtio_blk".into()];
            spec.optional_modules = vec!["virtio_pci".into()];
            let initrd = build_initramfs(&spec).map_err(|e| e.to_string())?;
            // virtio_console_pty's guest: hvc0 from the virtio-console.
            let mut console_spec = InitramfsSpec::new("bookworm", guest_script("console-guest.sh"));
            console_spec.modules = vec!["virtio_console".into()];
            console_spec.optional_modules = vec!["virtio_pci".into()];
            let console_initrd = build_initramfs(&console_spec).map_err(|e| e.to_string())?;
            // console_socket_behind_viommu's: trixie's kernel has the
            // virtio-iommu driver (bookworm's has none).
            let trixie = ensure_images("trixie").map_err(|e| e.to_string())?;
            let mut viommu_spec = InitramfsSpec::new("trixie", guest_script("console-guest.sh"));
            viommu_spec.modules = vec!["virtio_iommu".into(), "virtio_console".into()];
            viommu_spec.optional_modules = vec!["virtio_pci".into()];
            let viommu_initrd = build_initramfs(&viommu_spec).map_err(|e| e.to_string())?;
            let (cases, vmm_error) = match dmavisor_binary() {
                Ok(bin) => {
                    let case = |mode: &str, timeout| {
                        Case::new(
                            &format!("api_{mode}"),
                            vec![
                                "sh".into(),
                                path_arg(&guest_script("api-host.sh")),
                                mode.into(),
                                path_arg(&bin),
                                path_arg(&bookworm.vmlinuz),
                                path_arg(&initrd),
                            ],
                            timeout,
                        )
                    };
                    (
                        vec![
                            case("lifecycle", LIFECYCLE_TIMEOUT_SECS),
                            case("shutdown", SHUTDOWN_TIMEOUT_SECS),
                            case("create", CREATE_TIMEOUT_SECS),
                            case("boot_again", BOOT_AGAIN_TIMEOUT_SECS),
                            case("guest_reboot", GUEST_REBOOT_TIMEOUT_SECS),
                            Case::new(
                                "api_events",
                                vec![
                                    "python3".into(),
                                    path_arg(&guest_script("events-host.py")),
                                    path_arg(&bin),
                                    path_arg(&bookworm.vmlinuz),
                                    path_arg(&initrd),
                                ],
                                EVENTS_TIMEOUT_SECS,
                            ),
                            Case::new(
                                "virtio_console_pty",
                                vec![
                                    "python3".into(),
                                    path_arg(&guest_script("console-host.py")),
                                    path_arg(&bin),
                                    path_arg(&bookworm.vmlinuz),
                                    path_arg(&console_initrd),
                                ],
                                CONSOLE_TIMEOUT_SECS,
                            ),
                            Case::new(
                                "serial_and_console_socket",
                                vec![
                                    "python3".into(),
                                    path_arg(&guest_script("socket-host.py")),
                                    path_arg(&bin),
                                    path_arg(&bookworm.vmlinuz),
                                    path_arg(&console_initrd),
                                ],
                                CONSOLE_TIMEOUT_SECS,
                            ),
                            Case::new(
                                "console_socket_behind_viommu",
                                vec![
                                    "python3".into(),
                                    path_arg(&guest_script("socket-host.py")),
                                    path_arg(&bin),
                                    path_arg(&trixie.vmlinuz),
                                    path_arg(&viommu_initrd),
                                    "iommu".into(),
                                ],
                                CONSOLE_TIMEOUT_SECS,
                            ),
                        ],
                        None,
                    )
                }
                Err(e) => (Vec::new(), Some(e.to_string())),
            };
            Ok(Plan { cases, vmm_error })
        })
    })
}

fn case(name: &str) -> CaseResult {
    let s = session();
    let r = s.case(name).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", r.summary(name));
    r.clone()
}

/// The transcript of one case: its request, reply and observation lines,
/// the guest's markers, the VMM's lifecycle log lines and its exit status.
fn print_transcript(name: &str, out: &str) {
    println!("--- API transcript of {name} ---");
    let guest_markers = [
        "GUEST-UP",
        "GUEST-POWER-BUTTON",
        "GUEST-BUTTON-OPEN",
        "GUEST-REBOOTING",
        "GUEST-DISKS",
    ];
    let vmm_lines = [
        "through the API",
        "rebooted in place",
        "guest requested a reboot",
        "guest powered off",
        "torn down",
        "API listening",
    ];
    for l in out.lines().filter(|l| {
        l.starts_with("API-")
            || l.starts_with("VMM-EXIT")
            || (l.starts_with("SERIAL: ") && guest_markers.iter().any(|m| l.contains(m)))
            || l.contains("GUEST-SCRIPT-EXIT")
            || (l.starts_with("VMM: ") && vmm_lines.iter().any(|m| l.contains(m)))
    }) {
        println!("{l}");
    }
    println!("--- end of transcript ---");
}

/// The status and JSON body of the reply to request `name`.
fn reply(out: &str, name: &str) -> (u16, Value) {
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("API-REP {name} ")))
        .unwrap_or_else(|| panic!("no reply to {name}:\n{out}"));
    let rest = line.splitn(3, ' ').nth(2).unwrap_or_default();
    let (code, body) = rest.split_once(' ').unwrap_or((rest, ""));
    let code = code.trim_start_matches("HTTP=").parse().unwrap_or(0);
    (
        code,
        serde_json::from_str(body.trim()).unwrap_or(Value::Null),
    )
}

/// `key=` of the `API-OBS name ...` line.
fn observed(out: &str, name: &str, key: &str) -> i64 {
    out.lines()
        .find(|l| l.starts_with(&format!("API-OBS {name} ")))
        .and_then(|l| token_value(l, key))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= observed for {name}:\n{out}"))
}

fn serial_count(out: &str, marker: &str) -> usize {
    out.lines()
        .filter(|l| l.starts_with("SERIAL: ") && l.contains(marker))
        .count()
}

/// The whole lifecycle through the API, in one VMM process.
#[test]
fn api_socket_endpoints() {
    let r = case("api_lifecycle");
    let out = &r.output;
    print_transcript("api_lifecycle", out);
    assert!(
        out.contains("SERIAL: GUEST-UP cpus=2"),
        "guest not up:\n{out}"
    );

    // Read-only endpoints, cloud-hypervisor's fields.
    let (code, ping) = reply(out, "ping");
    assert_eq!(code, 200, "{out}");
    let pid = ping["pid"].as_u64().unwrap_or(0);
    assert!(pid > 0, "{ping}");
    assert!(ping["version"].is_string(), "{ping}");
    let (code, info) = reply(out, "info");
    assert_eq!(code, 200, "{out}");
    assert_eq!(info["state"], "Running", "{info}");
    assert_eq!(info["config"]["cpus"]["boot_vcpus"], 2, "{info}");
    assert_eq!(info["config"]["cpus"]["max_vcpus"], 4, "{info}");
    assert_eq!(info["config"]["memory"]["size"], 512u64 << 20, "{info}");
    assert_eq!(info["memory_actual_size"], 512u64 << 20, "{info}");
    let (code, counters) = reply(out, "counters");
    assert_eq!(code, 200, "{out}");
    assert!(counters.is_object(), "{counters}");

    // Bad requests: 4xx (501 for what dmavisor lacks), the VM runs on.
    for (name, want) in [
        ("unknown", 404),
        ("wrong_method", 405),
        ("bad_json", 400),
        ("not_implemented", 501),
        ("create_running", 409),
        ("boot_running", 405),
        ("resume_running", 405),
    ] {
        let (code, body) = reply(out, name);
        assert_eq!(code, want, "{name}: {out}");
        assert!(body[0].is_string(), "{name}: {body}");
    }
    assert!(out.contains("API-ALIVE after_bad_requests 1"), "{out}");

    // Pause: heartbeats stop; a second pause is refused.
    assert_eq!(reply(out, "pause").0, 204, "{out}");
    assert_eq!(reply(out, "info_paused").1["state"], "Paused", "{out}");
    let (code, body) = reply(out, "pause_again");
    assert_eq!(code, 405, "{out}");
    assert!(body[0].is_string(), "{body}");
    let before = observed(out, "paused_beats", "before");
    assert!(before >= 3, "heartbeats before the pause: {before}\n{out}");
    assert_eq!(
        observed(out, "paused_beats", "after"),
        before,
        "the guest ran while paused:\n{out}"
    );
    assert!(out.contains("API-ALIVE while_paused 1"), "{out}");

    // Resume: heartbeats go on; a second resume is refused.
    assert_eq!(reply(out, "resume").0, 204, "{out}");
    assert_eq!(reply(out, "info_resumed").1["state"], "Running", "{out}");
    assert_eq!(reply(out, "resume_again").0, 405, "{out}");
    let after = observed(out, "resumed_beats", "after");
    assert!(
        after >= before + 3,
        "heartbeats after resume: {before} -> {after}\n{out}"
    );

    // Reboot: the guest boots again behind the same socket and process.
    assert_eq!(reply(out, "reboot").0, 204, "{out}");
    assert_eq!(serial_count(out, "GUEST-UP cpus=2"), 2, "boots:\n{out}");
    let (code, ping2) = reply(out, "ping_after_reboot");
    assert_eq!(code, 200, "{out}");
    assert_eq!(ping2["pid"].as_u64(), Some(pid), "same process: {ping2}");
    let (code, info2) = reply(out, "info_after_reboot");
    assert_eq!(code, 200, "{out}");
    assert_eq!(info2["state"], "Running", "{info2}");
    assert_eq!(info2["config"], info["config"], "same configuration");

    // Power button: the guest sees the press and powers off cleanly.
    assert_eq!(reply(out, "power_button").0, 204, "{out}");
    assert_eq!(
        serial_count(out, "GUEST-POWER-BUTTON-DEVICE /dev/input/event"),
        2,
        "no power button device in the guest:\n{out}"
    );
    assert_eq!(
        serial_count(out, "GUEST-POWER-BUTTON pressed"),
        1,
        "press not seen:\n{out}"
    );
    assert_eq!(serial_count(out, "GUEST-SCRIPT-EXIT=0"), 1, "{out}");
    assert!(out.contains("guest powered off"), "{out}");
    // The VM is torn down and the VMM serves on (issue 29), until
    // vmm.shutdown.
    let (code, off) = reply(out, "info_after_poweroff");
    assert_eq!(code, 200, "{out}");
    assert_eq!(off["state"], "Created", "{off}");
    assert!(out.contains("API-ALIVE after_poweroff 1"), "{out}");
    assert!(out.contains("guest RAM released"), "{out}");
    assert_eq!(reply(out, "vmm_shutdown").0, 204, "{out}");
    assert!(!out.contains("API-EXIT-TIMEOUT"), "{out}");
    assert!(out.contains("VMM-EXIT rc=0"), "{out}");
    assert!(!out.contains("Kernel panic"), "{out}");
}

/// `vmm.shutdown` ends a paused VM's VMM with status 0.
#[test]
fn api_shutdown_of_a_paused_vm() {
    let r = case("api_shutdown");
    let out = &r.output;
    print_transcript("api_shutdown", out);
    assert!(
        out.contains("SERIAL: GUEST-UP cpus=2"),
        "guest not up:\n{out}"
    );
    assert_eq!(reply(out, "ping").0, 200, "{out}");
    assert_eq!(reply(out, "pause").0, 204, "{out}");
    assert_eq!(reply(out, "shutdown").0, 204, "{out}");
    assert!(!out.contains("API-EXIT-TIMEOUT"), "{out}");
    assert!(out.contains("VMM-EXIT rc=0"), "{out}");
    assert!(out.contains("shut down through the API"), "{out}");
}

/// A VMM started with only `--api-socket`: nothing to answer for before
/// `vm.create` (404s), bad bodies refused (400) with the VMM still
/// answering, then `vm.create` with a JSON body and `vm.boot` bring the
/// guest up; `vm.info` shows it Running with the configuration sent;
/// `vm.reboot` brings the same VM back (its configuration is not on the
/// command line: the rebuild takes the running VM's); `vm.shutdown`
/// leaves the VMM serving with the VM created; `vmm.shutdown` ends it
/// with status 0.
#[test]
fn api_create_and_boot_remotely() {
    let r = case("api_create");
    let out = &r.output;
    print_transcript("api_create", out);

    assert_eq!(reply(out, "ping").0, 200, "{out}");
    for (name, want) in [
        ("info_before_create", 404),
        ("boot_before_create", 404),
        ("create_bad_json", 400),
        ("create_bad_value", 400),
        ("create_unknown_field", 400),
        // The bad bodies created nothing.
        ("info_after_bad_creates", 404),
    ] {
        let (code, body) = reply(out, name);
        assert_eq!(code, want, "{name}: {out}");
        assert!(body[0].is_string(), "{name}: {body}");
    }
    let bad_value = reply(out, "create_bad_value").1;
    assert!(
        bad_value[0]
            .as_str()
            .is_some_and(|e| e.contains("boot_vcpus") || e.contains("cpus")),
        "{bad_value}"
    );
    assert!(out.contains("API-ALIVE after_bad_creates 1"), "{out}");

    // Created, not booted.
    assert_eq!(reply(out, "create").0, 204, "{out}");
    let (code, created) = reply(out, "info_created");
    assert_eq!(code, 200, "{out}");
    assert_eq!(created["state"], "Created", "{created}");
    let config = &created["config"];
    assert_eq!(config["cpus"]["boot_vcpus"], 2, "{config}");
    assert_eq!(config["memory"]["size"], 512u64 << 20, "{config}");
    assert!(
        config["payload"]["kernel"]
            .as_str()
            .is_some_and(|k| k.ends_with("vmlinuz")),
        "{config}"
    );
    assert_eq!(reply(out, "create_again").0, 409, "{out}");
    assert_eq!(reply(out, "pause_created").0, 405, "{out}");

    // Booted: the guest comes up with 2 vCPUs and beats.
    assert_eq!(reply(out, "boot").0, 204, "{out}");
    assert!(
        out.contains("SERIAL: GUEST-UP cpus=2"),
        "guest not up:\n{out}"
    );
    assert!(
        serial_count(out, "GUEST-BEAT") >= 3,
        "no heartbeats:\n{out}"
    );
    let (code, running) = reply(out, "info_running");
    assert_eq!(code, 200, "{out}");
    assert_eq!(running["state"], "Running", "{running}");
    assert_eq!(&running["config"], config, "the configuration sent");
    assert_eq!(running["memory_actual_size"], 512u64 << 20, "{running}");
    assert_eq!(reply(out, "boot_again").0, 405, "{out}");

    // Reboot: the same VM again, in the same process.
    assert_eq!(reply(out, "reboot").0, 204, "{out}");
    assert_eq!(serial_count(out, "GUEST-UP cpus=2"), 2, "boots:\n{out}");
    let pid = reply(out, "ping").1["pid"].as_u64();
    assert!(pid.is_some(), "{out}");
    assert_eq!(
        reply(out, "ping_after_reboot").1["pid"].as_u64(),
        pid,
        "{out}"
    );
    let (code, rebooted) = reply(out, "info_after_reboot");
    assert_eq!(code, 200, "{out}");
    assert_eq!(rebooted["state"], "Running", "{rebooted}");
    assert_eq!(&rebooted["config"], config, "the same configuration");

    // vm.shutdown: the VMM serves on with the VM created; vmm.shutdown
    // ends it with 0.
    assert_eq!(reply(out, "shutdown").0, 204, "{out}");
    let (code, down) = reply(out, "info_after_shutdown");
    assert_eq!(code, 200, "{out}");
    assert_eq!(down["state"], "Created", "{down}");
    assert_eq!(&down["config"], config, "{down}");
    assert!(out.contains("API-ALIVE after_shutdown 1"), "{out}");
    assert_eq!(reply(out, "vmm_shutdown").0, 204, "{out}");
    assert!(!out.contains("API-EXIT-TIMEOUT"), "{out}");
    assert!(out.contains("VMM-EXIT rc=0"), "{out}");
    assert!(out.contains("shut down through the API"), "{out}");
    assert!(!out.contains("Kernel panic"), "{out}");
}

/// Lines of the VMM's log with `text`.
fn vmm_count(out: &str, text: &str) -> usize {
    out.lines()
        .filter(|l| l.starts_with("VMM: ") && l.contains(text))
        .count()
}

/// Issue 29: `vm.shutdown` tears the VM down in the process and the VMM
/// goes on answering (`vm.info` says Created, the guest stops beating);
/// `vm.boot` boots the same VM a second time in the same process;
/// `vm.delete` of the running VM frees it (`vm.info` 404); `vmm.shutdown`
/// ends the VMM with 0. Each teardown joined every thread and released
/// guest RAM (the VMM's own report).
#[test]
fn shutdown_then_boot_again() {
    let r = case("api_boot_again");
    let out = &r.output;
    print_transcript("api_boot_again", out);
    let (code, ping) = reply(out, "ping");
    assert_eq!(code, 200, "{out}");
    let pid = ping["pid"].as_u64();
    assert!(pid.is_some(), "{ping}");

    assert_eq!(reply(out, "shutdown").0, 204, "{out}");
    let (code, down) = reply(out, "info_after_shutdown");
    assert_eq!(code, 200, "{out}");
    assert_eq!(down["state"], "Created", "{down}");
    assert_eq!(down["config"]["cpus"]["boot_vcpus"], 2, "{down}");
    assert_eq!(reply(out, "ping_after_shutdown").1["pid"].as_u64(), pid);
    assert!(out.contains("API-ALIVE after_shutdown 1"), "{out}");
    let before = observed(out, "shut_down_beats", "before");
    assert!(before >= 2, "{out}");
    assert_eq!(
        observed(out, "shut_down_beats", "after"),
        before,
        "the guest ran after vm.shutdown:\n{out}"
    );

    // The same VM again, same process.
    assert_eq!(reply(out, "boot").0, 204, "{out}");
    assert_eq!(serial_count(out, "GUEST-UP cpus=2"), 2, "boots:\n{out}");
    // Both boots drove the disk: each teardown stopped a started device.
    assert_eq!(serial_count(out, "GUEST-DISKS vda"), 2, "{out}");
    assert_eq!(
        vmm_count(out, "joined, 1 device(s)"),
        2,
        "each teardown stopped the disk:\n{out}"
    );
    assert!(
        serial_count(out, "GUEST-BEAT") >= usize::try_from(before).unwrap() + 2,
        "no heartbeats after vm.boot:\n{out}"
    );
    assert_eq!(reply(out, "ping_after_boot").1["pid"].as_u64(), pid);
    let (code, up) = reply(out, "info_after_boot");
    assert_eq!(code, 200, "{out}");
    assert_eq!(up["state"], "Running", "{up}");
    assert_eq!(up["config"], down["config"], "the same configuration");

    // vm.delete of the running VM: torn down and forgotten.
    assert_eq!(reply(out, "delete").0, 204, "{out}");
    assert_eq!(reply(out, "info_after_delete").0, 404, "{out}");
    assert!(out.contains("API-ALIVE after_delete 1"), "{out}");
    assert_eq!(
        vmm_count(out, "guest RAM released"),
        2,
        "two teardowns, each releasing guest RAM:\n{out}"
    );
    assert_eq!(reply(out, "vmm_shutdown").0, 204, "{out}");
    assert!(!out.contains("API-EXIT-TIMEOUT"), "{out}");
    assert!(out.contains("VMM-EXIT rc=0"), "{out}");
    assert!(!out.contains("Kernel panic"), "{out}");
}

/// Issue 29: the guest runs `reboot`; the VM is torn down and rebuilt in
/// place (no new process image: the same PID answers), the guest boots a
/// second time; then `vm.shutdown` and `vmm.shutdown` (exit 0).
#[test]
fn guest_reboot_rebuilds_in_place() {
    let r = case("api_guest_reboot");
    let out = &r.output;
    print_transcript("api_guest_reboot", out);
    let (code, ping) = reply(out, "ping");
    assert_eq!(code, 200, "{out}");
    let pid = ping["pid"].as_u64();
    assert!(pid.is_some(), "{ping}");
    assert_eq!(reply(out, "power_button").0, 204, "{out}");
    assert_eq!(serial_count(out, "GUEST-REBOOTING"), 1, "{out}");
    assert!(out.contains("guest requested a reboot"), "{out}");
    assert_eq!(vmm_count(out, "VM rebooted in place"), 1, "{out}");
    assert_eq!(serial_count(out, "GUEST-UP cpus=2"), 2, "boots:\n{out}");
    assert_eq!(serial_count(out, "GUEST-BUTTON-OPEN"), 2, "{out}");
    assert_eq!(reply(out, "ping_after_reboot").1["pid"].as_u64(), pid);
    let (code, info) = reply(out, "info_after_reboot");
    assert_eq!(code, 200, "{out}");
    assert_eq!(info["state"], "Running", "{info}");
    // Then off: the VM torn down, the VMM still answering, then ended.
    assert_eq!(reply(out, "shutdown").0, 204, "{out}");
    assert_eq!(reply(out, "info_after_shutdown").1["state"], "Created");
    assert_eq!(vmm_count(out, "guest RAM released"), 2, "{out}");
    assert_eq!(reply(out, "vmm_shutdown").0, 204, "{out}");
    assert!(!out.contains("API-EXIT-TIMEOUT"), "{out}");
    assert!(out.contains("VMM-EXIT rc=0"), "{out}");
    assert!(!out.contains("Kernel panic"), "{out}");
}

/// Issue 29: dmavisor started as libvirt's ch driver starts
/// cloud-hypervisor (`--api-socket fd=N` on a socket the runner made,
/// `--event-monitor path=FIFO` whose reader opens after the start); the
/// VM created and booted through the API, paused, resumed, shut down,
/// then the VMM. The FIFO carries cloud-hypervisor's events in order,
/// each a well-formed JSON object.
#[test]
fn event_monitor_reports_lifecycle() {
    let r = case("api_events");
    let out = &r.output;
    println!("--- events transcript ---");
    for l in out
        .lines()
        .filter(|l| l.starts_with("API-") || l.starts_with("EVENT") || l.starts_with("VMM-EXIT"))
    {
        println!("{l}");
    }
    println!("--- end of transcript ---");
    for (name, code) in [
        ("ping", 200),
        ("create", 204),
        ("boot", 204),
        ("pause", 204),
        ("resume", 204),
        ("shutdown", 204),
        ("vmm_shutdown", 204),
    ] {
        assert_eq!(reply(out, name).0, code, "{name}:\n{out}");
    }
    assert!(serial_count(out, "GUEST-UP") >= 1, "no boot:\n{out}");
    assert!(!out.contains("EVENT-BAD"), "{out}");
    let events: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("EVENT "))
        .map(|l| l.rsplit_once(' ').map_or(l, |(head, _props)| head))
        .collect();
    assert_eq!(
        events,
        [
            "vmm starting",
            "vm booting",
            "vm booted",
            "vm pausing",
            "vm paused",
            "vm resuming",
            "vm resumed",
            "vm shutdown",
            "vmm shutdown",
        ],
        "{out}"
    );
    assert!(
        out.contains("reader_done=1"),
        "the FIFO ended with the VMM:\n{out}"
    );
    assert!(!out.contains("API-EXIT-TIMEOUT"), "{out}");
    assert!(out.contains("VMM-EXIT rc=0"), "{out}");
}

/// libvirt's `<console type='pty'>` and `<serial type='pty'>`: serial and
/// console both on tty are refused (400); `vm.create` with both `Pty`;
/// `vm.info`'s `config.console.file` and `config.serial.file` are
/// `/dev/pts/N`s the runner opens; the guest's marker written on hvc0
/// comes out of the console's, and the line typed into it reaches the
/// guest (which says it on the serial port, read from its pty); the VM
/// is shut down (the console's worker joined) and the VMM exits 0.
#[test]
fn virtio_console_pty() {
    let r = case("virtio_console_pty");
    let out = &r.output;
    for l in out.lines().filter(|l| {
        l.starts_with("API-")
            || l.starts_with("CONSOLE-OBS")
            || l.starts_with("SERIAL: ")
            || l.starts_with("VMM-EXIT")
            || (l.starts_with("VMM: ")
                && ["console", "SIGSYS", "torn down"]
                    .iter()
                    .any(|m| l.contains(m)))
    }) {
        println!("{l}");
    }
    let (code, refused) = reply(out, "create_both_tty");
    assert_eq!(code, 400, "{out}");
    assert!(refused.to_string().contains("both on tty"), "{refused}");
    assert_eq!(reply(out, "create").0, 204, "{out}");
    assert_eq!(reply(out, "boot").0, 204, "{out}");
    let (code, info) = reply(out, "info");
    assert_eq!(code, 200, "{out}");
    assert_eq!(info["config"]["console"]["mode"], "Pty", "{info}");
    let pty = info["config"]["console"]["file"]
        .as_str()
        .unwrap_or_default();
    assert!(pty.starts_with("/dev/pts/"), "{info}");
    assert_eq!(info["config"]["serial"]["mode"], "Pty", "{info}");
    let serial = info["config"]["serial"]["file"]
        .as_str()
        .unwrap_or_default();
    assert!(serial.starts_with("/dev/pts/") && serial != pty, "{info}");
    assert!(
        out.contains("SERIAL: GUEST-HVC0 present"),
        "no hvc0:\n{out}"
    );
    assert!(
        out.contains("CONSOLE-OBS marker_seen=1"),
        "the guest's hvc0 output did not come out of the pty:\n{out}"
    );
    assert!(
        out.contains("SERIAL: GUEST-ECHO PING-7731"),
        "the pty's input did not reach the guest's hvc0:\n{out}"
    );
    assert_eq!(reply(out, "shutdown").0, 204, "{out}");
    assert_eq!(reply(out, "vmm_shutdown").0, 204, "{out}");
    // vm.info's own configuration (the pty's path included) parses back
    // when the VM is torn down.
    assert!(!out.contains("does not parse"), "{out}");
    assert!(!out.contains("API-EXIT-TIMEOUT"), "{out}");
    assert!(out.contains("VMM-EXIT rc=0"), "{out}");
}

/// cloud-hypervisor's `--serial socket=PATH` and `--console socket=PATH`
/// (libvirt's `<serial type='unix'>` through the API): a path that exists
/// is refused at startup and left alone; the runner connects to both
/// sockets; the guest's marker written on hvc0 comes out of the
/// console's socket, and the line written into it reaches the guest,
/// which says it on the serial port, read from the serial's socket;
/// `vm.info` shows both; `vm.shutdown` removes both socket files.
#[test]
fn serial_and_console_socket() {
    let r = case("serial_and_console_socket");
    let out = &r.output;
    for l in out.lines().filter(|l| {
        l.starts_with("API-")
            || l.starts_with("SOCKET-OBS")
            || l.starts_with("SERIAL: ")
            || l.starts_with("VMM-EXIT")
            || (l.starts_with("VMM: ")
                && ["socket", "SIGSYS", "torn down"]
                    .iter()
                    .any(|m| l.contains(m)))
    }) {
        println!("{l}");
    }
    let exists = out
        .lines()
        .find(|l| l.starts_with("SOCKET-OBS exists_rc="))
        .and_then(|l| token_value(l.split(" exists_said").next().unwrap_or(l), "exists_rc"))
        .unwrap_or_default();
    assert!(
        !exists.is_empty() && exists != "0",
        "started on a taken path:\n{out}"
    );
    assert!(
        out.contains("the path exists"),
        "no clear error for a taken path:\n{out}"
    );
    assert!(out.contains("SOCKET-OBS exists_kept=1"), "{out}");
    // The refused start failed after guest RAM was mapped: it must have
    // been released with the half-built VM (issue 29: a failed boot
    // releases guest RAM), which the VMM's owner reports when it is not.
    let refused = out
        .lines()
        .find(|l| l.starts_with("SOCKET-OBS exists_rc="))
        .unwrap_or_default();
    assert!(
        !refused.contains("still referenced"),
        "the refused start left guest RAM mapped:\n{out}"
    );
    assert!(
        out.contains("SOCKET-OBS serial_connected=1 console_connected=1"),
        "{out}"
    );
    assert!(
        out.contains("SERIAL: GUEST-HVC0 present"),
        "no hvc0, or the serial socket showed nothing:\n{out}"
    );
    assert!(
        out.contains("SOCKET-OBS marker_seen=1"),
        "the guest's hvc0 output did not come out of the socket:\n{out}"
    );
    assert!(
        out.contains("SERIAL: GUEST-ECHO PING-4417"),
        "the socket's input did not reach the guest's hvc0:\n{out}"
    );
    let (code, info) = reply(out, "info");
    assert_eq!(code, 200, "{out}");
    assert_eq!(info["config"]["serial"]["mode"], "Socket", "{info}");
    assert_eq!(info["config"]["console"]["mode"], "Socket", "{info}");
    let socket = info["config"]["console"]["socket"]
        .as_str()
        .unwrap_or_default();
    assert!(socket.ends_with("console.sock"), "{info}");
    assert_eq!(reply(out, "shutdown").0, 204, "{out}");
    assert!(
        out.contains("SOCKET-OBS removed_after_shutdown=1"),
        "a socket file outlived its VM:\n{out}"
    );
    assert_eq!(reply(out, "vmm_shutdown").0, 204, "{out}");
    assert!(out.contains("SOCKET-OBS left_after_exit=0"), "{out}");
    assert!(!out.contains("SIGSYS"), "{out}");
    assert!(!out.contains("API-EXIT-TIMEOUT"), "{out}");
    assert!(out.contains("VMM-EXIT rc=0"), "{out}");
}

/// `--console socket=PATH,iommu=on` with `--iommu`: the virtio-console is
/// an endpoint of the vIOMMU (the VMM says so; the guest finds its
/// function in an IOMMU group), and hvc0 still carries the marker out
/// and the typed line in, through the guest's DMA mappings.
#[test]
fn console_socket_behind_viommu() {
    let r = case("console_socket_behind_viommu");
    let out = &r.output;
    for l in out.lines().filter(|l| {
        l.starts_with("SOCKET-OBS")
            || l.starts_with("SERIAL: GUEST")
            || l.starts_with("VMM-EXIT")
            || (l.starts_with("VMM: ")
                && ["socket", "virtio-console", "SIGSYS", "torn down"]
                    .iter()
                    .any(|m| l.contains(m)))
    }) {
        println!("{l}");
    }
    assert!(
        out.lines()
            .any(|l| l.contains("virtio-console at PCI") && l.contains("behind the vIOMMU")),
        "the console was not plugged behind the vIOMMU:\n{out}"
    );
    let group = out
        .lines()
        .find_map(|l| l.strip_prefix("SERIAL: GUEST-CONSOLE-IOMMU-GROUP "))
        .unwrap_or("missing")
        .trim();
    assert!(
        group.parse::<u32>().is_ok(),
        "the guest sees the console in no IOMMU group ({group}):\n{out}"
    );
    assert!(out.contains("SOCKET-OBS marker_seen=1"), "{out}");
    assert!(out.contains("SERIAL: GUEST-ECHO PING-4417"), "{out}");
    assert!(!out.contains("SIGSYS"), "{out}");
    assert!(out.contains("VMM-EXIT rc=0"), "{out}");
}
