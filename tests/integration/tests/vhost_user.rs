//! Issue 11: virtio-net on a vhost-user back-end (`--net vhost_user=on`).
//!
//! One runner session; each case starts a back-end in the runner, then the
//! VMM with guest RAM shared with it (`--memory shared=on`), and the guest
//! (`guest/net-guest.sh`) pings the host and moves `SIZE` bytes each way
//! over TCP to the Python peer on the back-end's TAP (192.168.249.1), with
//! MD5s on both ends and a driver rebind (device reset) in between:
//!
//! - the project's test back-end (`tests/vhost-user-net-backend`, on
//!   rust-vmm's vhost-user-backend crate), no vIOMMU;
//! - DPDK's testpmd (vhost PMD to TAP PMD), without the vIOMMU, and behind
//!   it with the trixie guest's in-tree virtio-iommu driver, lazy and
//!   strict: testpmd runs with `iommu-support=1`, sees IOVAs only and asks
//!   dmavisor for every translation (IOTLB misses), and dmavisor sends it
//!   the UNMAPs as acknowledged IOTLB invalidations;
//! - QEMU 7.2's vhost-user-net on the same testpmd, the reference, with
//!   and without virtio-iommu-pci;
//! - the test back-end dying mid-transfer (fault injection).

use std::sync::OnceLock;
use std::time::Duration;

use integration_tests::images::{build_initramfs, ensure_images, InitramfsSpec};
use integration_tests::markers::{json_field, marker_line, peer_result, token_value};
use integration_tests::net_checks::{check_guest_to_host, check_transfers, peer_mbps};
use integration_tests::paths::{guest_script, path_arg};
use integration_tests::session::{Case, CaseResult, Plan, SharedSession};
use integration_tests::vmm::dmavisor_binary;

/// Bytes each way: enough for hundreds of map/unmap rounds, small enough
/// for the nested runner (where testpmd's busy-polling shares two
/// emulated CPUs with the guest).
const SIZE: u64 = 1 << 20;
const CASE_TIMEOUT_SECS: u32 = 600;
const GUEST_SCRIPT_TIMEOUT: u32 = 420;
const SESSION_TIMEOUT: Duration = Duration::from_secs(3000);

fn net_case(name: &str, mode: &str, bin: &str, kernel: &str, initrd: &str) -> Case {
    Case::new(
        name,
        vec![
            "env".into(),
            format!("NET_SIZE={SIZE}"),
            // Host-to-guest through testpmd behind a vIOMMU stops (see
            // check_behind_viommu): give up on it after 30 s, not 180, and
            // let the guest power off by itself so dmavisor's exit report
            // (the IOTLB counters) is printed.
            "NET_STALL=30".into(),
            "NET_STALL_KILL=0".into(),
            "sh".into(),
            path_arg(&guest_script("net-host.sh")),
            mode.into(),
            bin.into(),
            kernel.into(),
            initrd.into(),
        ],
        CASE_TIMEOUT_SECS,
    )
}

fn session() -> &'static SharedSession {
    static RUN: OnceLock<SharedSession> = OnceLock::new();
    RUN.get_or_init(|| {
        SharedSession::run("vhost-user", SESSION_TIMEOUT, || {
            let bin = path_arg(&dmavisor_binary().map_err(|e| e.to_string())?);
            let initrd_for = |suite: &str, modules: &[&str]| -> Result<String, String> {
                let mut spec = InitramfsSpec::new(suite, guest_script("net-guest.sh"));
                spec.modules = modules.iter().map(|m| m.to_string()).collect();
                if suite == "trixie" {
                    spec.optional_modules = vec!["virtio_pci".into()];
                }
                spec.script_timeout = Some(GUEST_SCRIPT_TIMEOUT);
                build_initramfs(&spec)
                    .map(|p| path_arg(&p))
                    .map_err(|e| e.to_string())
            };
            let book = ensure_images("bookworm").map_err(|e| e.to_string())?;
            let trixie = ensure_images("trixie").map_err(|e| e.to_string())?;
            let (bk, tk) = (path_arg(&book.vmlinuz), path_arg(&trixie.vmlinuz));
            let binit = initrd_for("bookworm", &["virtio_pci", "virtio_net"])?;
            let tinit = initrd_for("trixie", &["virtio_iommu", "virtio_net"])?;
            let cases = vec![
                net_case("vu_test_backend", "dmavisor-vhost-user", &bin, &bk, &binit),
                net_case(
                    "vu_disconnect",
                    "dmavisor-vhost-user-disconnect",
                    &bin,
                    &bk,
                    &binit,
                ),
                net_case("vu_testpmd", "dmavisor-testpmd", &bin, &bk, &binit),
                net_case(
                    "vu_testpmd_lazy",
                    "dmavisor-testpmd-lazy",
                    &bin,
                    &tk,
                    &tinit,
                ),
                net_case(
                    "vu_testpmd_strict",
                    "dmavisor-testpmd-strict",
                    &bin,
                    &tk,
                    &tinit,
                ),
                net_case("qemu_vu_testpmd", "qemu-testpmd", "-", &bk, &binit),
                net_case(
                    "qemu_vu_testpmd_lazy",
                    "qemu-testpmd-lazy",
                    "-",
                    &tk,
                    &tinit,
                ),
            ];
            Ok(Plan {
                cases,
                vmm_error: None,
            })
        })
    })
}

fn case(name: &str) -> CaseResult {
    session()
        .case(name)
        .unwrap_or_else(|e| panic!("{e}"))
        .clone()
}

/// Checks one case's traffic and returns its throughputs.
fn transfers(name: &str) -> (f64, f64) {
    check_transfers(name, &case(name), SIZE, "vhost-user-net")
}

/// The (misses, invalidations, ranges) dmavisor printed at exit for the
/// back-end's IOTLB.
fn iotlb_counts(out: &str) -> Option<(u64, u64, u64)> {
    let line = out.lines().find(|l| l.contains("IOTLB misses"))?;
    let num_after = |key: &str| -> Option<u64> {
        let rest = line.split(key).nth(1)?.trim_start();
        rest.split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    Some((
        num_after("IOTLB misses")?,
        num_after("invalidations")?,
        num_after("for")?,
    ))
}

/// The project's test back-end: traffic both ways, intact, and again after
/// a device reset; the back-end's socket was ready before the VMM started.
#[test]
fn vhost_user_net_test_backend() {
    transfers("vu_test_backend");
    let out = case("vu_test_backend").output;
    assert!(
        out.contains("BACKEND-READY socket=1"),
        "back-end never listened"
    );
}

/// DPDK's testpmd, no vIOMMU, with QEMU's vhost-user-net on the same
/// back-end beside it when that reference completed.
#[test]
fn vhost_user_net_testpmd() {
    let (g2h, h2g) = transfers("vu_testpmd");
    let out = case("vu_testpmd").output;
    // testpmd forwarded the frames: its port statistics at exit count at
    // least the 1 MiB's segments (about 725 of 1448 bytes each way).
    let forwarded = out
        .lines()
        .filter(|l| l.starts_with("BACKEND:"))
        .filter_map(|l| l.split("RX-packets:").nth(1))
        .filter_map(|r| r.split_whitespace().next()?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    assert!(
        forwarded >= 500,
        "testpmd forwarded {forwarded} frames on a port:\n{}",
        case("vu_testpmd").tail(40)
    );
    // The reference is reported when it ran and completed, never required
    // (a runner that died after dmavisor's cases must not fail them).
    let completed = session()
        .case("qemu_vu_testpmd")
        .is_ok_and(|q| q.exit == Some(0) && q.output.contains("GUEST-NET-DONE"));
    if completed {
        let (qg, qh) = transfers("qemu_vu_testpmd");
        println!(
            "{{\"bench\": \"vhost-user-net-ratio\", \"config\": \"no_viommu\", \"dmavisor_over_qemu\": [{:.3}, {:.3}], \"order\": \"[guest_to_host, host_to_guest]\"}}",
            g2h / qg.max(1e-9),
            h2g / qh.max(1e-9)
        );
    }
}

/// Behind the vIOMMU: the guest's ping and its 1 MiB to the host arrive
/// intact through testpmd; testpmd's every translation came from dmavisor
/// (IOTLB misses answered) and the guest's UNMAPs reached it as
/// acknowledged invalidations; the guest saw the NIC in a translating
/// domain. Host to guest is reported, not required: DPDK 22.11 delivers
/// about 500 frames to such a guest and then drops the rest (806 of 1315
/// in the runs of 2026-11-25), and so it does under QEMU's vhost-user-net
/// behind virtio-iommu-pci (831 of 1326), so the limit is the back-end's;
/// when the transfer completes its checksum is checked. Returns the
/// guest-to-host rate.
fn check_behind_viommu(name: &str) -> f64 {
    let r = case(name);
    eprintln!("{}", r.summary(name));
    let out = &r.output;
    let context = r.tail(60);
    assert_eq!(r.exit, Some(0), "{name} script failed:\n{context}");
    assert!(
        out.contains("VMM-EXIT rc=0"),
        "{name}: the guest did not power off:\n{context}"
    );
    let g = marker_line(out, "GUEST-NET-IOMMU").expect("iommu marker");
    assert!(g.contains("type=DMA"), "{name}: NIC not translated: {g}");
    let ping = marker_line(out, "GUEST-PING").unwrap_or_else(|| panic!("{context}"));
    assert_ne!(token_value(ping, "received"), Some("0"), "{name}: {ping}");
    let g2h = check_guest_to_host(name, out, SIZE, &context);
    let h2g_done = match (
        marker_line(out, "GUEST-RX"),
        peer_result(out, "host_to_guest"),
    ) {
        (Some(rx), Some(host_tx))
            if token_value(rx, "bytes") == Some(SIZE.to_string().as_str()) =>
        {
            assert_eq!(
                token_value(rx, "md5"),
                json_field(host_tx, "md5"),
                "{name}: host->guest data corrupted"
            );
            true
        }
        _ => false,
    };
    let (misses, invalidations, ranges) =
        iotlb_counts(out).unwrap_or_else(|| panic!("{name}: no IOTLB counters:\n{context}"));
    println!(
        "{{\"bench\": \"vhost-user-iotlb\", \"case\": \"{name}\", \"guest_to_host_MBps\": {g2h:.3}, \"host_to_guest_completed\": {h2g_done}, \"misses\": {misses}, \"invalidations\": {invalidations}, \"ranges\": {ranges}}}"
    );
    assert!(misses > 0, "{name}: testpmd never asked for a translation");
    assert!(invalidations > 0, "{name}: no UNMAP reached testpmd");
    g2h
}

/// Lazy, with QEMU's vhost-user-net behind virtio-iommu-pci on the same
/// testpmd beside it when its guest-to-host transfer completed.
#[test]
fn vhost_user_net_viommu_lazy() {
    let g2h = check_behind_viommu("vu_testpmd_lazy");
    let qemu = session()
        .case("qemu_vu_testpmd_lazy")
        .ok()
        .and_then(|q| peer_mbps(&q.output, "guest_to_host", SIZE));
    if let Some(qg2h) = qemu {
        println!(
            "{{\"bench\": \"vhost-user-net-ratio\", \"config\": \"viommu_lazy\", \"dmavisor_over_qemu_guest_to_host\": {:.3}}}",
            g2h / qg2h.max(1e-9)
        );
    }
}

#[test]
fn vhost_user_net_viommu_strict() {
    check_behind_viommu("vu_testpmd_strict");
}

/// The back-end dies mid-transfer (the test back-end's fault injection:
/// it exits after 300 frames from the guest without a word): dmavisor
/// notices the hang-up and says so, keeps running and answering its API,
/// the guest keeps running (its heartbeats go on for 30 s), and
/// `vmm.shutdown` still ends the VMM with 0 (the reset of a device whose
/// back-end is gone does not hang).
#[test]
fn vhost_user_backend_disconnect() {
    let r = case("vu_disconnect");
    eprintln!("{}", r.summary("vu_disconnect"));
    let out = &r.output;
    let context = r.tail(60);
    let line = marker_line(out, "DISCONNECT-RESULT")
        .unwrap_or_else(|| panic!("no DISCONNECT-RESULT:\n{context}"));
    let field = |k: &str| token_value(line, k).unwrap_or_else(|| panic!("no {k}= in {line}"));
    assert_eq!(
        field("backend_rc"),
        "3",
        "the back-end did not die by injection: {line}"
    );
    assert!(
        out.contains("closed the connection"),
        "dmavisor did not report the hang-up:\n{context}"
    );
    assert_eq!(field("vmm_alive"), "1", "{line}");
    assert_eq!(field("api_ping"), "200", "{line}");
    assert_eq!(field("shutdown"), "204", "{line}");
    assert_eq!(field("vmm_rc"), "0", "{line}");
    let before: u32 = field("heartbeats_before").parse().unwrap_or(0);
    let after: u32 = field("heartbeats_after").parse().unwrap_or(0);
    assert!(
        after >= before + 5,
        "the guest stopped after the back-end died: {line}"
    );
}
