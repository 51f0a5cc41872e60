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
//! - QEMU 7.2's vhost-user-net on the same testpmd, the reference (only
//!   with `DMAVISOR_REFERENCES=1`: `make bench-guest`, `make soak`), with
//!   and without virtio-iommu-pci (lazy and strict); behind a vIOMMU both
//!   VMMs reach testpmd through a counting relay
//!   (`guest/vhost-user-count.py`) that tallies their device-IOTLB
//!   messages alike, and dmavisor's own counters must agree with it;
//! - multiqueue (num_queues=4) with dmavisor listening (vhost_mode=server);
//! - a slow back-end: the relay holds every invalidation's acknowledgement;
//! - the test back-end dying mid-transfer (fault injection);
//! - a guest reboot of a VM with a vhost-user NIC: the VM is rebuilt in
//!   place and reconnects to the test back-end (`--reconnect`), and the
//!   second boot's NIC carries the transfers.

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
/// Bytes each way behind the vIOMMU, where every frame costs IOTLB
/// round trips and 1 MiB to the host takes minutes in the runner; the
/// figures compared (IOTLB messages per frame, rates) do not need more.
const VIOMMU_SIZE: u64 = 512 << 10;
const CASE_TIMEOUT_SECS: u32 = 600;
const GUEST_SCRIPT_TIMEOUT: u32 = 420;
const SESSION_TIMEOUT: Duration = Duration::from_secs(3000);

/// Bytes each way of the slow-acknowledgement case, and how long the relay
/// holds each acknowledgement: a few hundred invalidations of 20 ms.
const SLOW_ACK_SIZE: u64 = 128 << 10;
const SLOW_ACK_MS: u64 = 20;

/// Two boots of the guest in one case, the second moving `SIZE` each way.
const REBOOT_CASE_TIMEOUT_SECS: u32 = 1200;

fn net_case(name: &str, mode: &str, bin: &str, kernel: &str, initrd: &str) -> Case {
    net_case_with(name, mode, bin, kernel, initrd, SIZE, &[])
}

/// A case moving `size` bytes each way, with extra environment for
/// net-host.sh.
fn net_case_with(
    name: &str,
    mode: &str,
    bin: &str,
    kernel: &str,
    initrd: &str,
    size: u64,
    env: &[String],
) -> Case {
    Case::new(
        name,
        [
            vec!["env".into(), format!("NET_SIZE={size}")],
            env.to_vec(),
            vec![
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
        ]
        .concat(),
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
            let mut cases = vec![
                net_case("vu_test_backend", "dmavisor-vhost-user", &bin, &bk, &binit),
                net_case(
                    "vu_disconnect",
                    "dmavisor-vhost-user-disconnect",
                    &bin,
                    &bk,
                    &binit,
                ),
                Case::new(
                    "vu_guest_reboot",
                    vec![
                        "env".into(),
                        format!("NET_SIZE={SIZE}"),
                        "sh".into(),
                        path_arg(&guest_script("net-host.sh")),
                        "dmavisor-vhost-user-reboot".into(),
                        bin.clone(),
                        bk.clone(),
                        binit.clone(),
                    ],
                    REBOOT_CASE_TIMEOUT_SECS,
                ),
                Case::new(
                    "vu_guest_reboot_backend_gone",
                    vec![
                        "env".into(),
                        "VU_RECONNECT=0".into(),
                        "sh".into(),
                        path_arg(&guest_script("net-host.sh")),
                        "dmavisor-vhost-user-reboot".into(),
                        bin.clone(),
                        bk.clone(),
                        binit.clone(),
                    ],
                    CASE_TIMEOUT_SECS,
                ),
                net_case("vu_testpmd", "dmavisor-testpmd", &bin, &bk, &binit),
                net_case("vu_testpmd_mq", "dmavisor-testpmd-mq", &bin, &bk, &binit),
                net_case_with(
                    "vu_testpmd_lazy",
                    "dmavisor-testpmd-lazy",
                    &bin,
                    &tk,
                    &tinit,
                    VIOMMU_SIZE,
                    &[],
                ),
                net_case_with(
                    "vu_testpmd_strict",
                    "dmavisor-testpmd-strict",
                    &bin,
                    &tk,
                    &tinit,
                    VIOMMU_SIZE,
                    &[],
                ),
                net_case_with(
                    "vu_testpmd_slow_ack",
                    "dmavisor-testpmd-strict",
                    &bin,
                    &tk,
                    &tinit,
                    SLOW_ACK_SIZE,
                    &[format!("VU_ACK_DELAY_MS={SLOW_ACK_MS}")],
                ),
            ];
            // QEMU on the same testpmd: the reference, reported when it
            // ran (integration_tests::references_enabled).
            if integration_tests::references_enabled() {
                cases.extend([
                    net_case("qemu_vu_testpmd", "qemu-testpmd", "-", &bk, &binit),
                    net_case_with(
                        "qemu_vu_testpmd_lazy",
                        "qemu-testpmd-lazy",
                        "-",
                        &tk,
                        &tinit,
                        VIOMMU_SIZE,
                        &[],
                    ),
                    net_case_with(
                        "qemu_vu_testpmd_strict",
                        "qemu-testpmd-strict",
                        "-",
                        &tk,
                        &tinit,
                        VIOMMU_SIZE,
                        &[],
                    ),
                ]);
            }
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

/// What dmavisor printed at exit for the back-end's IOTLB.
#[derive(Debug)]
struct IotlbCounts {
    misses: u64,
    refused: u64,
    invalidations: u64,
    ranges: u64,
    ack_wait_us: u64,
}

fn iotlb_counts(out: &str) -> Option<IotlbCounts> {
    let line = out.lines().find(|l| l.contains("IOTLB misses"))?;
    let num_after = |key: &str| -> Option<u64> {
        let rest = line.split(key).nth(1)?.trim_start();
        rest.split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    Some(IotlbCounts {
        misses: num_after("IOTLB misses")?,
        refused: num_after("refused")?,
        invalidations: num_after("invalidations")?,
        ranges: num_after("for")?,
        ack_wait_us: num_after("acknowledged after")?,
    })
}

/// The counting relay's tally (`guest/vhost-user-count.py`, between the
/// VMM and testpmd behind a vIOMMU): the same count for either VMM.
fn relay_counts(out: &str) -> Option<serde_json::Value> {
    out.lines()
        .find_map(|l| l.trim().strip_prefix("VU-COUNT "))
        .and_then(|j| serde_json::from_str(j).ok())
}

/// Frames the guest received and sent in the two transfers.
fn guest_frames(out: &str) -> Option<u64> {
    let line = marker_line(out, "GUEST-NET-STATS")?;
    let rx: u64 = token_value(line, "rx_packets")?.parse().ok()?;
    let tx: u64 = token_value(line, "tx_packets")?.parse().ok()?;
    Some(rx + tx)
}

/// One VMM's device-IOTLB messages per 1000 guest frames, as the relay
/// counted them: [misses, updates, invalidations].
fn iotlb_per_1000_frames(out: &str) -> Option<[f64; 3]> {
    let c = relay_counts(out)?;
    let frames = guest_frames(out)?.max(1) as f64;
    let per = |k: &str| c[k].as_u64().map(|v| v as f64 * 1000.0 / frames);
    Some([
        per("iotlb_misses")?,
        per("iotlb_updates")?,
        per("iotlb_invalidations")?,
    ])
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

/// The RX-packets of testpmd's forwarding stream from `port`/`queue`
/// (printed at exit when there are more streams than ports).
fn stream_rx_packets(out: &str, port: u32, queue: u32) -> Option<u64> {
    let header = format!("Forward Stats for RX Port={port:2}/Queue={queue:2}");
    let mut lines = out.lines().filter(|l| l.starts_with("BACKEND:"));
    lines.find(|l| l.contains(&header))?;
    lines
        .next()?
        .split("RX-packets:")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// num_queues=4 against testpmd with two queues, and dmavisor listening
/// (vhost_mode=server; testpmd connects with client=1): the guest (2
/// vCPUs) sees two queue pairs, so its VQ_PAIRS_SET on the control queue
/// (served by dmavisor, which enables the back-end's rings) succeeded;
/// pings sent from CPU 1 leave on the second transmit queue and testpmd
/// receives them on its queue 1; traffic both ways is intact.
#[test]
fn vhost_user_net_multiqueue() {
    transfers("vu_testpmd_mq");
    let r = case("vu_testpmd_mq");
    let out = &r.output;
    assert!(
        out.contains("waiting for a vhost-user back-end to connect"),
        "dmavisor did not listen:\n{}",
        r.tail(40)
    );
    let q = marker_line(out, "GUEST-NET-QUEUES").expect("queue marker");
    assert_eq!(token_value(q, "rx"), Some("2"), "{q}");
    assert_eq!(token_value(q, "tx"), Some("2"), "{q}");
    let ping = marker_line(out, "GUEST-PING-CPU1").unwrap_or_else(|| panic!("{}", r.tail(40)));
    assert_ne!(token_value(ping, "received"), Some("0"), "{ping}");
    let second = stream_rx_packets(out, 0, 1);
    assert!(
        second.is_some_and(|n| n >= 5),
        "testpmd's queue 1 of the guest's port received {second:?} frames:\n{}",
        r.tail(60)
    );
}

/// Behind the vIOMMU: the guest's ping and its 512 KiB to the host arrive
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
    let g2h = check_guest_to_host(name, out, VIOMMU_SIZE, &context);
    let h2g_done = match (
        marker_line(out, "GUEST-RX"),
        peer_result(out, "host_to_guest"),
    ) {
        (Some(rx), Some(host_tx))
            if token_value(rx, "bytes") == Some(VIOMMU_SIZE.to_string().as_str()) =>
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
    let own = iotlb_counts(out).unwrap_or_else(|| panic!("{name}: no IOTLB counters:\n{context}"));
    println!(
        "{{\"bench\": \"vhost-user-iotlb\", \"case\": \"{name}\", \"guest_to_host_MBps\": {g2h:.3}, \"host_to_guest_completed\": {h2g_done}, \"misses\": {}, \"invalidations\": {}, \"ranges\": {}}}",
        own.misses, own.invalidations, own.ranges
    );
    assert!(
        own.misses > 0,
        "{name}: testpmd never asked for a translation"
    );
    assert!(own.invalidations > 0, "{name}: no UNMAP reached testpmd");
    // dmavisor's own counters agree with what crossed the socket.
    let relay = relay_counts(out).unwrap_or_else(|| panic!("{name}: no VU-COUNT:\n{context}"));
    assert_eq!(relay["iotlb_misses"], own.misses, "{name}: {own:?} {relay}");
    assert_eq!(
        relay["iotlb_updates"],
        own.misses - own.refused,
        "{name}: every miss not refused is answered by one UPDATE: {own:?} {relay}"
    );
    assert_eq!(
        relay["iotlb_invalidations"], own.invalidations,
        "{name}: {own:?} {relay}"
    );
    g2h
}

/// Device-IOTLB messages per 1000 guest frames, dmavisor and QEMU on the
/// same testpmd through the same relay, printed when QEMU's case completed.
fn compare_iotlb_traffic(ours: &str, qemu: &str, config: &str) {
    let Some(q) = session().case(qemu).ok().filter(|q| q.exit == Some(0)) else {
        return;
    };
    let (Some(d), Some(r)) = (
        iotlb_per_1000_frames(&case(ours).output),
        iotlb_per_1000_frames(&q.output),
    ) else {
        return;
    };
    println!(
        "{{\"bench\": \"vhost-user-iotlb-per-1000-frames\", \"config\": \"{config}\", \"order\": \"[misses, updates, invalidations]\", \"dmavisor\": [{:.1}, {:.1}, {:.1}], \"qemu\": [{:.1}, {:.1}, {:.1}]}}",
        d[0], d[1], d[2], r[0], r[1], r[2]
    );
}

/// Behind the vIOMMU in `config` (lazy or strict): dmavisor's case
/// checked, and QEMU's vhost-user-net behind virtio-iommu-pci on the same
/// testpmd beside it (its guest-to-host rate and device-IOTLB traffic)
/// when that reference completed.
fn check_against_qemu(config: &str) {
    let (ours, qemu) = (
        format!("vu_testpmd_{config}"),
        format!("qemu_vu_testpmd_{config}"),
    );
    let g2h = check_behind_viommu(&ours);
    let reference = session()
        .case(&qemu)
        .ok()
        .and_then(|q| peer_mbps(&q.output, "guest_to_host", VIOMMU_SIZE));
    if let Some(qg2h) = reference {
        println!(
            "{{\"bench\": \"vhost-user-net-ratio\", \"config\": \"viommu_{config}\", \"dmavisor_over_qemu_guest_to_host\": {:.3}}}",
            g2h / qg2h.max(1e-9)
        );
    }
    compare_iotlb_traffic(&ours, &qemu, config);
}

#[test]
fn vhost_user_net_viommu_lazy() {
    check_against_qemu("lazy");
}

#[test]
fn vhost_user_net_viommu_strict() {
    check_against_qemu("strict");
}

/// A slow back-end: the relay holds every INVALIDATE's acknowledgement for
/// 20 ms (strict guest, 128 KiB to the host). Every invalidation dmavisor
/// sent was held (the relay's count equals dmavisor's), dmavisor waited at
/// least that long in all (its acknowledgement wait, the time the UNMAPs
/// behind them were held before completing: the UNMAP path calls the
/// back-end's invalidation synchronously, see iotlb.rs's unit test
/// `unmap_completes_only_after_the_back_end_acknowledged`), and the data
/// still arrived intact.
#[test]
fn vhost_user_iotlb_invalidated_before_unmap_completes() {
    let name = "vu_testpmd_slow_ack";
    let r = case(name);
    eprintln!("{}", r.summary(name));
    let out = &r.output;
    let context = r.tail(60);
    assert_eq!(r.exit, Some(0), "{name} script failed:\n{context}");
    assert!(out.contains("VMM-EXIT rc=0"), "{name}:\n{context}");
    check_guest_to_host(name, out, SLOW_ACK_SIZE, &context);
    let own = iotlb_counts(out).unwrap_or_else(|| panic!("{name}: no IOTLB counters:\n{context}"));
    let relay = relay_counts(out).unwrap_or_else(|| panic!("{name}: no VU-COUNT:\n{context}"));
    let delayed = relay["delayed_acks"].as_u64().unwrap_or(0);
    assert!(own.invalidations > 0, "{name}: no invalidation: {own:?}");
    assert_eq!(delayed, own.invalidations, "{name}: {own:?} {relay}");
    let held_us = delayed * SLOW_ACK_MS * 1000;
    assert!(
        own.ack_wait_us >= held_us * 95 / 100,
        "{name}: dmavisor waited {} us for {delayed} acknowledgements held {SLOW_ACK_MS} ms each",
        own.ack_wait_us
    );
    // For scale: the same wait without the delay, in the strict case.
    let plain = session()
        .case("vu_testpmd_strict")
        .ok()
        .and_then(|p| iotlb_counts(&p.output));
    println!(
        "{{\"bench\": \"vhost-user-ack-wait\", \"slow_ack_us_per_invalidation\": {:.0}, \"plain_strict_us_per_invalidation\": {}}}",
        own.ack_wait_us as f64 / delayed.max(1) as f64,
        plain.map_or("null".to_string(), |p| format!(
            "{:.0}",
            p.ack_wait_us as f64 / p.invalidations.max(1) as f64
        ))
    );
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

/// The lines of a reboot case a reader needs: the guest's markers, the
/// VMM's lifecycle and vhost-user lines, the back-end's sessions.
fn print_reboot_transcript(name: &str, out: &str) {
    println!("--- {name} transcript ---");
    for l in out.lines().filter(|l| {
        [
            "GUEST-PING",
            "GUEST-REBOOT",
            "GUEST-TX",
            "GUEST-RX",
            "GUEST-REBIND",
            "REBOOT-RESULT",
            "VMM-EXIT",
            "requested a reboot",
            "rebuilding the VM failed",
            "rebooted in place",
            "torn down",
            "vhost-user-net at",
            "event: vm",
            "front-end",
        ]
        .iter()
        .any(|m| l.contains(m))
    }) {
        println!("{l}");
    }
    println!("--- end of transcript ---");
}

/// Issue 29: the guest of a VM with a vhost-user NIC reboots from inside
/// (`reboot -f` once its NIC answered a ping). The VM is torn down (the
/// back-end's rings stopped, its connection closed) and rebuilt in place,
/// in the same process: the rebuilt VM connects to the same socket, where
/// the test back-end (`--reconnect`) serves it from a fresh state. The
/// second boot's NIC then answers pings, moves `SIZE` bytes each way with
/// matching MD5s and survives a driver rebind; the guest powers off, the
/// VMM serves on with the VM created, and `vmm.shutdown` ends it with 0.
#[test]
fn vhost_user_guest_reboot_rebuilds() {
    let name = "vu_guest_reboot";
    let r = case(name);
    let out = &r.output;
    let context = r.tail(80);
    print_reboot_transcript(name, out);
    let boots = |key: &str| out.lines().filter(|l| l.contains(key)).count();
    assert_eq!(boots("GUEST-REBOOTING boot=1"), 1, "{context}");
    assert_eq!(
        boots("GUEST-REBOOTED boot=2"),
        1,
        "no second boot:\n{context}"
    );
    assert!(out.contains("guest requested a reboot"), "{context}");
    assert_eq!(boots("VM rebooted in place"), 1, "{context}");
    // Both boots' NIC answered: the first before the reboot, the second
    // on the rebuilt VM's new connection.
    let pings: Vec<u32> = out
        .lines()
        .filter_map(|l| marker_line(l, "GUEST-PING "))
        .map(|l| {
            token_value(l, "received")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        })
        .collect();
    assert_eq!(pings.len(), 2, "{pings:?}\n{context}");
    assert!(pings.iter().all(|&n| n >= 1), "{pings:?}\n{context}");
    let line =
        marker_line(out, "REBOOT-RESULT").unwrap_or_else(|| panic!("no REBOOT-RESULT:\n{context}"));
    let field = |k: &str| token_value(line, k).unwrap_or_else(|| panic!("no {k}= in {line}"));
    assert_eq!(
        field("sessions"),
        "2",
        "the back-end saw no second front-end: {line}"
    );
    assert_eq!(field("backend_alive"), "1", "{line}");
    assert_eq!(field("state_after_poweroff"), "Created", "{line}");
    assert_eq!(field("shutdown"), "204", "{line}");
    // Each teardown released guest RAM (the reboot's and the power-off's).
    assert!(boots("guest RAM released") >= 2, "{context}");
    // The data went over the rebuilt VM's NIC, checksummed on both ends.
    transfers(name);
}

/// Issue 29: the same reboot with the test back-end in its default mode,
/// which ends with its first connection (as cloud-hypervisor's
/// vhost-user-net back-end does). The rebuild cannot connect: it fails at
/// once instead of hanging, the VMM says why and serves on with the VM
/// created, and `vmm.shutdown` ends it with 0.
#[test]
fn vhost_user_reboot_without_backend_stays_created() {
    let name = "vu_guest_reboot_backend_gone";
    let r = case(name);
    let out = &r.output;
    let context = r.tail(80);
    print_reboot_transcript(name, out);
    assert_eq!(r.exit, Some(0), "{context}");
    let count = |key: &str| out.lines().filter(|l| l.contains(key)).count();
    assert_eq!(count("GUEST-REBOOTING boot=1"), 1, "{context}");
    assert_eq!(count("GUEST-REBOOTED"), 0, "a second boot:\n{context}");
    assert_eq!(count("VM rebooted in place"), 0, "{context}");
    let failed = out
        .lines()
        .find(|l| l.contains("reboot: rebuilding the VM failed"))
        .unwrap_or_else(|| panic!("no reason for the failed rebuild:\n{context}"));
    assert!(failed.contains("dmv-vhost-user.sock"), "{failed}");
    assert!(out.contains("event: vm shutdown"), "{context}");
    let line =
        marker_line(out, "REBOOT-RESULT").unwrap_or_else(|| panic!("no REBOOT-RESULT:\n{context}"));
    let field = |k: &str| token_value(line, k).unwrap_or_else(|| panic!("no {k}= in {line}"));
    assert_eq!(field("sessions"), "1", "{line}");
    assert_eq!(field("backend_alive"), "0", "{line}");
    assert_eq!(field("state_after_poweroff"), "Created", "{line}");
    assert_eq!(field("shutdown"), "204", "{line}");
    assert_eq!(field("vmm_rc"), "0", "{line}");
}
