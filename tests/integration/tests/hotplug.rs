//! Issue 29: virtio-net and virtio-blk devices hotplugged into a running
//! guest through the REST API, and removed again (`vm.add-net`,
//! `vm.add-disk`, `vm.remove-device`), as libvirt and ch-remote drive
//! cloud-hypervisor.
//!
//! One case, one guest (trixie 6.12, its in-tree virtio-iommu driver,
//! strict), booted with a vIOMMU but no disk and no NIC
//! (`guest/hotplug-host.py`, `guest/hotplug-guest.sh`). Round 1: a raw
//! image with a known pattern and a TAP the host script opened itself and
//! passed with `SCM_RIGHTS`, neither behind the vIOMMU. Round 2: the same
//! image and a TAP named in the `NetConfig`, both behind it. In each round
//! the guest finds both functions, reads the pattern from the disk, pings
//! over the NIC and sends the disk's first MiB to the host over it; then
//! both are removed and the guest sees them go.

use std::sync::OnceLock;
use std::time::Duration;

use integration_tests::images::{build_initramfs, ensure_images, InitramfsSpec};
use integration_tests::markers::token_value;
use integration_tests::paths::{guest_script, path_arg};
use integration_tests::session::{Case, CaseResult, Plan, SharedSession};
use integration_tests::vmm::dmavisor_binary;
use serde_json::Value;

/// One boot, two rounds of hotplug with pings and 1 MiB each way of
/// disk and NIC under TCG, and slack.
const CASE_TIMEOUT_SECS: u32 = 900;
const SESSION_TIMEOUT: Duration = Duration::from_secs(1200);
const CASE: &str = "dmavisor_virtio_hotplug";

fn session() -> &'static SharedSession {
    static SESSION: OnceLock<SharedSession> = OnceLock::new();
    SESSION.get_or_init(|| {
        SharedSession::run("hotplug", SESSION_TIMEOUT, || {
            let trixie = ensure_images("trixie").map_err(|e| e.to_string())?;
            let mut spec = InitramfsSpec::new("trixie", guest_script("hotplug-guest.sh"));
            spec.modules = ["virtio_iommu", "virtio_net", "virtio_blk"]
                .map(String::from)
                .to_vec();
            spec.optional_modules = vec!["virtio_pci".into()];
            spec.script_timeout = Some(CASE_TIMEOUT_SECS - 60);
            let initrd = build_initramfs(&spec).map_err(|e| e.to_string())?;
            let (cases, vmm_error) = match dmavisor_binary() {
                Ok(bin) => (
                    vec![Case::new(
                        CASE,
                        vec![
                            "python3".into(),
                            path_arg(&guest_script("hotplug-host.py")),
                            path_arg(&bin),
                            path_arg(&trixie.vmlinuz),
                            path_arg(&initrd),
                        ],
                        CASE_TIMEOUT_SECS,
                    )],
                    None,
                ),
                Err(e) => (Vec::new(), Some(e.to_string())),
            };
            Ok(Plan { cases, vmm_error })
        })
    })
}

fn case() -> CaseResult {
    let r = session().case(CASE).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", r.summary(CASE));
    r.clone()
}

/// The lines a reader needs: requests and replies, vm.info, the guest's
/// markers, the host sink, the VMM's hotplug lines and its exit.
fn print_transcript(out: &str) {
    println!("--- hotplug transcript ---");
    for l in out.lines().filter(|l| {
        l.starts_with("HP-")
            || l.starts_with("HOST-")
            || l.starts_with("VMM-EXIT")
            || (l.starts_with("SERIAL: ") && l.contains("GUEST-HP"))
            || (l.starts_with("VMM: ")
                && ["hotplugged", "removed from", "eject", "passed TAP"]
                    .iter()
                    .any(|m| l.contains(m)))
    }) {
        println!("{l}");
    }
    println!("--- end of transcript ---");
}

/// The status and JSON body of the reply labelled `label`.
fn reply(out: &str, label: &str) -> (u16, Value) {
    let prefix = format!("HP-API {label} ");
    let line = out
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no reply to {label}:\n{out}"));
    let rest = line.get(prefix.len()..).unwrap_or_default();
    let (code, body) = rest.split_once(' ').unwrap_or((rest, ""));
    (
        code.parse().unwrap_or(0),
        serde_json::from_str(body.trim()).unwrap_or(Value::Null),
    )
}

/// The guest's marker line `GUEST-HP-<what> round=<r> ...`.
fn marker(out: &str, what: &str, round: u32) -> String {
    let key = format!("GUEST-HP-{what} round={round}");
    out.lines()
        .find(|l| l.starts_with("SERIAL: ") && l.contains(&key))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no {key}:\n{out}"))
}

/// `key=` of the `HP-INFO label` line.
fn info(out: &str, label: &str, key: &str) -> String {
    let prefix = format!("HP-INFO {label} ");
    out.lines()
        .find(|l| l.starts_with(&prefix))
        .and_then(|l| token_value(l, key))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no HP-INFO {label} {key}=:\n{out}"))
}

fn host_md5(out: &str) -> String {
    out.lines()
        .find(|l| l.starts_with("HOST-IMG "))
        .and_then(|l| token_value(l, "md5_head"))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no HOST-IMG:\n{out}"))
}

/// One round: added (200 with cloud-hypervisor's `PciDeviceInfo`), seen
/// by the guest behind the vIOMMU or not, the pattern read, traffic over
/// the NIC, listed by vm.info while present, gone after the removal.
fn check_round(out: &str, round: u32, iommu: bool) {
    let (disk_id, net_id) = (format!("hpdisk{round}"), format!("hpnet{round}"));
    let mut bdfs = Vec::new();
    for (label, id) in [("add_disk", &disk_id), ("add_net", &net_id)] {
        let (code, body) = reply(out, &format!("{label}{round}"));
        assert_eq!(code, 200, "{label}{round}: {body}\n{out}");
        assert_eq!(body["id"], id.as_str(), "{body}");
        let bdf = body["bdf"].as_str().unwrap_or_default().to_string();
        let slot = bdf
            .get(8..10)
            .and_then(|s| u8::from_str_radix(s, 16).ok())
            .unwrap_or(0);
        assert!(bdf.starts_with("0000:00:") && bdf.ends_with(".0"), "{bdf}");
        // Behind the vIOMMU only the slots the VIOT names for hotplug.
        assert_eq!(slot >= 24, iommu, "{label}{round} at {bdf}");
        bdfs.push(bdf);
    }
    let seen = marker(out, "SEEN", round);
    for bdf in &bdfs {
        assert!(seen.contains(bdf.as_str()), "{bdf} not seen: {seen}");
    }
    let groups = marker(out, "IOMMU", round);
    let want = if iommu { "DMA" } else { "none" };
    for dev in ["blk", "net"] {
        let got = token_value(&groups, dev).unwrap_or_default();
        assert!(
            got == want || (iommu && got.starts_with("DMA")),
            "{dev} group {got}, want {want}: {groups}"
        );
    }
    let disk = marker(out, "DISK", round);
    assert_eq!(
        token_value(&disk, "md5"),
        Some(host_md5(out).as_str()),
        "the guest read another pattern: {disk}"
    );
    let ping = marker(out, "PING", round);
    let received: u32 = token_value(&ping, "received")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(received >= 1, "no ping answered: {ping}");
    let tx = marker(out, "TX", round);
    assert_eq!(token_value(&tx, "rc"), Some("0"), "{tx}");
    let present = format!("present{round}");
    assert!(info(out, &present, "disks").contains(&disk_id), "{out}");
    let tap = if round == 1 { "dmvhp1" } else { "dmvhp2" };
    assert!(info(out, &present, "net").contains(tap), "{out}");
    // Listed by the ids the adds returned, which remove-device takes.
    assert!(info(out, &present, "net_ids").contains(&net_id), "{out}");
    for label in ["remove_disk", "remove_net"] {
        assert_eq!(reply(out, &format!("{label}{round}")).0, 204, "{out}");
    }
    let gone = marker(out, "GONE", round);
    assert_eq!(token_value(&gone, "disk_gone"), Some("1"), "{gone}");
    assert_eq!(token_value(&gone, "net_gone"), Some("1"), "{gone}");
    let after = format!("gone{round}");
    assert_eq!(info(out, &after, "disks"), "[]", "{out}");
    assert_eq!(info(out, &after, "net"), "[]", "{out}");
    assert_eq!(info(out, &after, "net_ids"), "[]", "{out}");
}

#[test]
fn virtio_net_and_blk_hotplug() {
    let r = case();
    let out = &r.output;
    print_transcript(out);
    assert!(r.crash().is_none(), "{:?}\n{}", r.crash(), r.tail(80));
    check_round(out, 1, false);
    check_round(out, 2, true);
    // Refusals: an id in use, a descriptor that is no TAP.
    for label in ["add_disk_dup", "add_net_pipe"] {
        let (code, body) = reply(out, label);
        assert_eq!(code, 400, "{label}: {body}");
        assert!(body[0].is_string(), "{body}");
    }
    // The VMM tore down what the guest ejected, and ended with the guest.
    assert_eq!(
        out.lines()
            .filter(|l| l.contains("(ejected by the guest)"))
            .count(),
        4,
        "{out}"
    );
    assert!(out.contains("VMM-EXIT rc=0"), "{}", r.tail(40));
}

/// The NIC of round 1 runs on a TAP the host opened and passed with
/// `SCM_RIGHTS`: the guest pings through it and the host's sink receives
/// exactly the disk's first MiB.
#[test]
fn add_net_with_passed_tap_fd() {
    let r = case();
    let out = &r.output;
    let (code, body) = reply(out, "add_net1");
    assert_eq!(code, 200, "{body}\n{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("VMM: ") && l.contains("passed TAP dmvhp1")),
        "the NIC was not built on the passed TAP:\n{out}"
    );
    let ping = marker(out, "PING", 1);
    assert_ne!(token_value(&ping, "received"), Some("0"), "{ping}");
    let md5 = host_md5(out);
    let rx: Vec<&str> = out.lines().filter(|l| l.starts_with("HOST-RX ")).collect();
    assert!(
        rx.iter().any(|l| token_value(l, "bytes") == Some("1048576")
            && token_value(l, "md5") == Some(md5.as_str())),
        "the host did not receive the disk's first MiB: {rx:?}\n{out}"
    );
}
