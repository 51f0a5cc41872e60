//! Issue 4: dmavisor's virtio-iommu with the Debian trixie 6.12 guest and
//! its in-tree `virtio_iommu` driver.
//!
//! The DMA checks use the edu-compatible DMA test device (`--dma-test`),
//! driven from guest userspace by `guest/viommu-dma.c`:
//! - with the driver: the device is handed to vfio-pci and a VFIO type1
//!   container makes the guest kernel's IOMMU driver MAP/UNMAP buffers at
//!   IOVAs the tool chooses (no out-of-tree module, so nothing has to match
//!   the guest kernel's build);
//! - without a driver: the device DMAs to guest-physical addresses of a
//!   locked buffer (from /proc/self/pagemap), which is what `bypass` is
//!   about.
//!
//! QEMU's virtio-iommu-pci with its edu device runs the same guest in the
//! same session as the reference for the VFIO case.
//!
//! All boots run in ONE KVM-environment session (nested boots are slow).

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use integration_tests::images::{build_initramfs, ensure_images, InitramfsSpec};
use integration_tests::markers::{
    guest_script_exit, json_field, marker_int, marker_line, marker_value, peer_result, token_value,
};
use integration_tests::paths::{build_guest_tool, guest_script, path_arg};
use integration_tests::qemu::QemuCommand;
use integration_tests::session::{Case, CaseResult, Plan, SharedSession};
use integration_tests::vmm::{dmavisor_binary, GuestBoot};

/// `loglevel=3` keeps the driver's fault messages (KERN_ERR) off the console,
/// where they would split marker lines; the script reads them from dmesg.
const CMDLINE: &str = "console=ttyS0 quiet loglevel=3 panic=-1";
const CASE_TIMEOUT_SECS: u32 = 400;
const SESSION_TIMEOUT: Duration = Duration::from_secs(2700);
/// Bytes per transfer in `viommu-dma.c`.
const XFER: i64 = 2048;
/// The IOVAs `viommu-dma.c` uses.
const UNMAPPED_IOVA: &str = "0x10001000";
const NEVER_IOVA: &str = "0x20000000";

fn dmavisor(
    name: &str,
    bin: &Path,
    kernel: &Path,
    initrd: &Path,
    cmdline: &str,
    extra: &[&str],
) -> Case {
    let boot = GuestBoot {
        cmdline: cmdline.into(),
        cpus: 1,
        extra_args: extra.iter().map(|a| a.to_string()).collect(),
        ..GuestBoot::new(kernel, initrd)
    };
    Case::new(name, boot.argv(bin), CASE_TIMEOUT_SECS)
}

fn qemu(name: &str, kernel: &Path, initrd: &Path, cmdline: &str) -> Case {
    let argv = QemuCommand::new(kernel, initrd, cmdline)
        .smp(1)
        .device("virtio-iommu-pci")
        .device("edu,dma_mask=0xffffffffffffffff")
        .into_argv();
    Case::new(name, argv, CASE_TIMEOUT_SECS)
}

fn session() -> &'static SharedSession {
    static SESSION: OnceLock<SharedSession> = OnceLock::new();
    SESSION.get_or_init(|| {
        SharedSession::run("viommu", SESSION_TIMEOUT, || {
            let tool = build_guest_tool("viommu-dma")?;
            let script = guest_script("viommu-dma.sh");
            let trixie = ensure_images("trixie").map_err(|e| e.to_string())?;
            let with_driver = build_initramfs(&InitramfsSpec {
                modules: ["virtio_iommu", "vfio", "vfio_iommu_type1", "vfio_pci"]
                    .map(String::from)
                    .to_vec(),
                files: vec![(tool.clone(), "/viommu-dma".into())],
                ..InitramfsSpec::new("trixie", &script)
            })
            .map_err(|e| e.to_string())?;
            let no_driver = build_initramfs(&InitramfsSpec {
                files: vec![(tool, "/viommu-dma".into())],
                ..InitramfsSpec::new("trixie", &script)
            })
            .map_err(|e| e.to_string())?;
            let net_unmap = build_initramfs(&InitramfsSpec {
                modules: ["virtio_iommu", "vfio", "vfio_iommu_type1", "vfio_pci"]
                    .map(String::from)
                    .to_vec(),
                files: vec![(build_guest_tool("net-rx-unmap")?, "/net-rx-unmap".into())],
                ..InitramfsSpec::new("trixie", guest_script("net-rx-unmap.sh"))
            })
            .map_err(|e| e.to_string())?;
            let bin = dmavisor_binary().map_err(|e| e.to_string())?;
            let k = &trixie.vmlinuz;
            let vfio = format!("{CMDLINE} viommu_mode=vfio");
            let vfio_strict = format!("{CMDLINE} viommu_mode=vfio iommu.strict=1");
            let phys = format!("{CMDLINE} viommu_mode=phys");
            let race = format!(
                "{CMDLINE} viommu_mode=race viommu_race_iters={}",
                integration_tests::race_iters()
            );
            let d = |name, initrd: &Path, cmdline: &str, extra: &[&str]| {
                dmavisor(name, &bin, k, initrd, cmdline, extra)
            };
            Ok(Plan::from(vec![
                d(
                    "vfio_lazy",
                    &with_driver,
                    &vfio,
                    &["--iommu", "--dma-test", "iommu=on"],
                ),
                d(
                    "vfio_strict",
                    &with_driver,
                    &vfio_strict,
                    &["--iommu", "--dma-test", "iommu=on"],
                ),
                d(
                    "race_vfio",
                    &with_driver,
                    &race,
                    &["--iommu", "--dma-test", "iommu=on"],
                ),
                d(
                    "vfio_baseline",
                    &with_driver,
                    &vfio,
                    &["--iommu", "impl=baseline", "--dma-test", "iommu=on"],
                ),
                d(
                    "phys_bypass_on",
                    &no_driver,
                    &phys,
                    &["--iommu", "bypass=on", "--dma-test", "iommu=on"],
                ),
                d(
                    "phys_bypass_off",
                    &no_driver,
                    &phys,
                    &["--iommu", "bypass=off", "--dma-test", "iommu=on"],
                ),
                d("phys_no_iommu", &no_driver, &phys, &["--dma-test"]),
                qemu("qemu_vfio_lazy", k, &with_driver, &vfio),
                Case::new(
                    "net_rx_unmap",
                    vec![
                        "sh".into(),
                        path_arg(&guest_script("net-rx-unmap-host.sh")),
                        path_arg(&bin),
                        path_arg(k),
                        path_arg(&net_unmap),
                        NET_UNMAP_ROUNDS.to_string(),
                    ],
                    CASE_TIMEOUT_SECS,
                ),
            ]))
        })
    })
}

fn case(name: &str) -> CaseResult {
    let r = session().case(name).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", r.summary(name));
    r.clone()
}

/// The case ran to the end of its guest script with status 0.
fn completed(name: &str) -> String {
    let r = case(name);
    let out = r.output;
    assert_eq!(r.exit, Some(0), "{name}: VMM exit status; output:\n{out}");
    assert_eq!(
        guest_script_exit(&out),
        Some(0),
        "{name}: guest script; output:\n{out}"
    );
    assert!(!out.contains("Kernel panic"), "{name}: panic:\n{out}");
    out
}

fn int(out: &str, key: &str) -> i64 {
    marker_int(out, key).unwrap_or_else(|| panic!("no {key}= in output:\n{out}"))
}

/// The type of the IOMMU group of the device the guest names with `bdf=`
/// (the test device, or the NIC), from its group line, e.g.
/// "IOMMU-GROUP 0 type=DMA-FQ devices=0000:00:02.0,".
fn group_type(out: &str) -> Option<&str> {
    let bdf = marker_value(out, "bdf")?;
    let line = out
        .lines()
        .find(|l| l.starts_with("IOMMU-GROUP ") && l.contains(bdf))?;
    marker_value(line, "type")
}

/// DMA through a mapped IOVA works; after UNMAP and to a never-mapped
/// IOVA it is blocked, memory is unchanged, and the guest driver logged
/// the fault events for exactly those addresses.
fn assert_protects(name: &str, dmavisor_registers: bool) {
    let out = completed(name);
    assert_eq!(int(&out, "mapped_diff"), 0, "{name}: mapped DMA:\n{out}");
    assert_eq!(
        int(&out, "after_unmap_changed"),
        0,
        "{name}: DMA after unmap changed memory:\n{out}"
    );
    assert_eq!(
        int(&out, "still_diff"),
        0,
        "{name}: mapping survives:\n{out}"
    );
    let faults: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("FAULT-LOG ") && l.contains("fault from EP"))
        .collect();
    // QEMU reports one event per 4 bytes and drops the rest when the event
    // queue is full, so only the first faulting address is certain there.
    let iovas: &[&str] = if dmavisor_registers {
        &[UNMAPPED_IOVA, NEVER_IOVA]
    } else {
        &[UNMAPPED_IOVA]
    };
    for iova in iovas {
        assert!(
            faults.iter().any(|l| l.contains(&format!("at {iova}"))),
            "{name}: no guest fault event for {iova}:\n{out}"
        );
    }
    if dmavisor_registers {
        // The device's own error/counter registers (QEMU's edu has none).
        assert_eq!(int(&out, "mapped_ok"), 1, "{name}:\n{out}");
        assert_eq!(int(&out, "still_ok"), 1, "{name}:\n{out}");
        assert_eq!(int(&out, "mapped_to_dev_err"), 0, "{name}:\n{out}");
        assert_eq!(
            int(&out, "after_unmap_err"),
            1,
            "{name}: IOMMU fault:\n{out}"
        );
        assert_eq!(int(&out, "never_mapped_err"), 1, "{name}:\n{out}");
        assert_eq!(int(&out, "faults"), 2, "{name}:\n{out}");
        // Two round trips of two transfers each went through.
        assert_eq!(int(&out, "bytes"), 4 * XFER, "{name}:\n{out}");
        // Endpoint id = BDF: the device is 00:02.0 = 16 unless moved.
        let bdf = marker_value(&out, "bdf").unwrap_or("");
        let dev = u16::from_str_radix(bdf.get(8..10).unwrap_or("zz"), 16).unwrap_or(0xffff);
        let ep = format!("fault from EP {}", dev << 3);
        assert!(
            faults.iter().all(|l| l.contains(&ep)),
            "{name}: faults not from {ep}:\n{out}"
        );
    }
}

#[test]
fn viommu_blocks_dma_after_unmap() {
    assert_protects("vfio_lazy", true);
}

#[test]
fn viommu_blocks_dma_after_unmap_baseline_tables() {
    assert_protects("vfio_baseline", true);
}

#[test]
fn reference_qemu_virtio_iommu_blocks_dma_after_unmap() {
    assert_protects("qemu_vfio_lazy", false);
}

#[test]
fn viommu_in_tree_driver_lazy_group() {
    let out = completed("vfio_lazy");
    assert_eq!(group_type(&out), Some("DMA-FQ"), "output:\n{out}");
    assert!(
        out.contains("virtio_iommu virtio0: input address: 48 bits"),
        "driver did not bind:\n{out}"
    );
}

#[test]
fn viommu_in_tree_driver_strict_group() {
    let out = completed("vfio_strict");
    assert_eq!(group_type(&out), Some("DMA"), "output:\n{out}");
    assert_protects("vfio_strict", true);
}

/// Issue 9: once the guest's UNMAP has completed, no DMA through the old
/// mapping lands, even with DMA in flight. The guest maps a page through
/// VFIO (the in-tree driver, whose VFIO domains are always strict), lets
/// the DMA test device stream into it, unmaps, and fills the page with a
/// canary at once; the device's next pass must be refused and the canary
/// survive, in every iteration.
#[test]
fn dma_after_unmap_never_lands_under_race() {
    let out = completed("race_vfio");
    let iters =
        i64::try_from(integration_tests::race_iters()).expect("DMAVISOR_RACE_ITERS fits an i64");
    assert_eq!(int(&out, "race_iters"), iters, "{out}");
    assert_eq!(
        int(&out, "race_corrupted"),
        0,
        "canaries overwritten after UNMAP returned:\n{out}"
    );
    // Every stream was ended by the vIOMMU refusing its next pass, i.e.
    // the DMA really was in flight when the UNMAP came.
    assert_eq!(int(&out, "race_not_faulted"), 0, "{out}");
    // ...and its first pass had filled the page before the UNMAP.
    assert_eq!(int(&out, "race_missed"), 0, "{out}");
    assert_eq!(int(&out, "faults"), iters, "{out}");
}

/// Rounds of `guest/net-rx-unmap.c`: each posts 64 receive buffers under a
/// flood of frames and unmaps those the device has not completed.
const NET_UNMAP_ROUNDS: i64 = 50;

/// Rounds in which an UNMAP issued after the first frame must have beaten
/// the device, for the test to show the tight race at all. How often that
/// happens depends on the runner's timing and load: 45 and 46 of 50 rounds
/// on a quiet runner, 26 with the machine busy, and CI once failed the old
/// bound of 10 (it did not say which assertion). The fail-closed stop no
/// longer depends on it: every round unmaps its last buffer before the
/// device starts, so every round must end with the device stopped.
const NET_UNMAP_MIN_TIGHT: i64 = 1;

/// Issue 9: a guest that unmaps receive buffers it posted to virtio-net
/// while frames arrive. Once an UNMAP returned, the device must neither
/// write the page (the canary the guest puts there survives) nor complete
/// the buffer; it stops the queue (DEVICE_NEEDS_RESET) and reports a fault
/// to the guest's IOMMU driver instead.
#[test]
fn virtio_net_rx_buffer_unmapped_by_guest() {
    let r = case("net_rx_unmap");
    let ctx = r.tail(60);
    eprintln!("{}", r.summary("net_rx_unmap"));
    let out = r.output;
    // Every round's line, so a failure says which rounds went wrong.
    let rounds: String = out
        .lines()
        .filter(|l| l.contains("NET-UNMAP round"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(out.contains("VMM-EXIT rc=0"), "VMM:\n{ctx}");
    assert_eq!(guest_script_exit(&out), Some(0), "{ctx}");
    let line = marker_line(&out, "NET-UNMAP-RESULT").unwrap_or_else(|| panic!("{ctx}"));
    let get = |k: &str| -> i64 {
        token_value(line, k)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} in {line}"))
    };
    println!(
        "{{\"test\": \"net-rx-unmap\", \"rounds\": {}, \"raced\": {}, \"raced_rounds\": {}, \"tight_rounds\": {}, \"corrupted\": {}, \"needs_reset\": {}, \"frames\": {}}}",
        get("rounds"),
        get("raced"),
        get("raced_rounds"),
        get("tight_rounds"),
        get("corrupted"),
        get("needs_reset"),
        get("frames")
    );
    assert_eq!(get("rounds"), NET_UNMAP_ROUNDS, "{line}");
    assert_eq!(
        get("corrupted"),
        0,
        "a buffer was written after its UNMAP: {out}"
    );
    assert!(
        get("frames") >= NET_UNMAP_ROUNDS,
        "frames must land while mapped: {line}\n{rounds}"
    );
    // Every round leaves at least its early-unmapped buffer for the device
    // to reach under the flood: every round must end with it stopped.
    assert_eq!(get("raced_rounds"), NET_UNMAP_ROUNDS, "{line}\n{rounds}");
    assert_eq!(get("needs_reset"), NET_UNMAP_ROUNDS, "{line}\n{rounds}");
    assert!(
        get("tight_rounds") >= NET_UNMAP_MIN_TIGHT,
        "no UNMAP ever raced the device: {line}\n{rounds}"
    );
    assert!(out.contains("FAULT-LOG"), "no fault reported: {ctx}");
}

/// Issue 9: with bus mastering cleared in its command register (memory
/// decoding still on) the DMA test device does no DMA: a transfer and a
/// stream both fail with "bus master off" (4) and the page is untouched;
/// with bus mastering back on, DMA works again. Checked without a vIOMMU
/// and through one in bypass (the gate sits before any translation).
#[test]
fn bus_master_off_blocks_dma() {
    for name in ["phys_no_iommu", "phys_bypass_on"] {
        let out = completed(name);
        assert_eq!(int(&out, "nomaster_err"), 4, "{name}:\n{out}");
        assert_eq!(int(&out, "nomaster_stream_err"), 4, "{name}:\n{out}");
        assert_eq!(int(&out, "nomaster_running"), 0, "{name}:\n{out}");
        assert_eq!(int(&out, "nomaster_changed"), 0, "{name}:\n{out}");
        assert_eq!(int(&out, "master_again_err"), 0, "{name}:\n{out}");
    }
}

#[test]
fn viommu_bypass_config() {
    // No driver, bypass on: the endpoint DMAs untranslated.
    let on = completed("phys_bypass_on");
    assert_eq!(int(&on, "phys_ok"), 1, "bypass=on:\n{on}");
    assert_eq!(int(&on, "phys_write_err"), 0, "bypass=on:\n{on}");
    assert!(
        int(&on, "phys_write_changed") > XFER - 64,
        "bypass=on:\n{on}"
    );
    assert_eq!(int(&on, "faults"), 0, "bypass=on:\n{on}");
    // No driver, bypass off: every DMA is blocked and memory unchanged.
    let off = completed("phys_bypass_off");
    assert_eq!(int(&off, "phys_ok"), 0, "bypass=off:\n{off}");
    assert_eq!(int(&off, "phys_to_dev_err"), 1, "bypass=off:\n{off}");
    assert_eq!(int(&off, "phys_write_err"), 1, "bypass=off:\n{off}");
    assert_eq!(int(&off, "phys_write_changed"), 0, "bypass=off:\n{off}");
    assert_eq!(int(&off, "bytes"), 0, "bypass=off:\n{off}");
    assert_eq!(int(&off, "faults"), 3, "bypass=off:\n{off}");
    // ...until the driver attaches the endpoint (same default bypass=off).
    let attached = completed("vfio_lazy");
    assert_eq!(int(&attached, "mapped_ok"), 1, "attached:\n{attached}");
    // Control: without a vIOMMU the same guest DMA works.
    let plain = completed("phys_no_iommu");
    assert_eq!(int(&plain, "phys_ok"), 1, "no iommu:\n{plain}");
    assert_eq!(int(&plain, "phys_write_err"), 0, "no iommu:\n{plain}");
}

// ---------------------------------------------------------------------
// virtio-net behind the vIOMMU: a second session (its own group).
// ---------------------------------------------------------------------

/// Bytes each way. 2 MiB, not the 8 MiB of tests/virtio_net.rs: strict
/// vIOMMU traffic is what trips the runner's emulator (docs/runner.md,
/// issue 16), for every VMM, at a rate that grows with the volume; the
/// 8 MiB figures come from `make soak`. The nested runner moves 2 MiB
/// through a strict vIOMMU in about 10 s; the time-out is generous
/// because a loaded machine is ten times slower.
const NET_SIZE: u64 = 2 << 20;
const NET_CASE_TIMEOUT_SECS: u32 = 1000;
const NET_SESSION_TIMEOUT: Duration = Duration::from_secs(4800);
const NET_MODES: [&str; 3] = ["off", "lazy", "strict"];
fn net_session() -> &'static SharedSession {
    static SESSION: OnceLock<SharedSession> = OnceLock::new();
    SESSION.get_or_init(|| {
        SharedSession::run("viommu-net", NET_SESSION_TIMEOUT, || {
            let trixie = ensure_images("trixie").map_err(|e| e.to_string())?;
            let initrd = build_initramfs(&InitramfsSpec {
                modules: ["virtio_iommu", "virtio_net"].map(String::from).to_vec(),
                files: vec![(guest_script("net-guest.sh"), "/net-guest.sh".into())],
                script_timeout: Some(NET_CASE_TIMEOUT_SECS - 60),
                ..InitramfsSpec::new("trixie", guest_script("viommu-net-guest.sh"))
            })
            .map_err(|e| e.to_string())?;
            let bin = path_arg(&dmavisor_binary().map_err(|e| e.to_string())?);
            let mut cases = Vec::new();
            for vmm in ["dmavisor", "qemu"] {
                for mode in NET_MODES {
                    cases.push(Case::new(
                        &format!("net_{vmm}_{mode}"),
                        vec![
                            "sh".into(),
                            path_arg(&guest_script("viommu-net-host.sh")),
                            vmm.into(),
                            mode.into(),
                            bin.clone(),
                            path_arg(&trixie.vmlinuz),
                            path_arg(&initrd),
                            NET_SIZE.to_string(),
                        ],
                        NET_CASE_TIMEOUT_SECS,
                    ));
                }
            }
            Ok(Plan::from(cases))
        })
    })
}

fn net_case(name: &str) -> CaseResult {
    net_session()
        .case(name)
        .unwrap_or_else(|e| panic!("{e}"))
        .clone()
}

/// Checks both transfers and their MD5s; returns the throughputs
/// (guest->host as timed by the host peer, host->guest as timed in the
/// guest) in MB/s.
fn net_transfers(name: &str) -> (f64, f64, String) {
    let r = net_case(name);
    let ctx = r.tail(80);
    eprintln!("{}", r.summary(name));
    let out = r.output;
    assert!(out.contains("VMM-EXIT rc=0"), "{name}: VMM:\n{ctx}");
    assert_eq!(guest_script_exit(&out), Some(0), "{name}:\n{ctx}");
    let tx = marker_line(&out, "GUEST-TX").unwrap_or_else(|| panic!("{name}:\n{ctx}"));
    let rx = marker_line(&out, "GUEST-RX").unwrap_or_else(|| panic!("{name}:\n{ctx}"));
    let peer = |dir: &str| {
        peer_result(&out, dir).unwrap_or_else(|| panic!("{name}: no peer result {dir}:\n{ctx}"))
    };
    let (host_rx, host_tx) = (peer("guest_to_host"), peer("host_to_guest"));
    let size = NET_SIZE.to_string();
    let size = Some(size.as_str());
    assert_eq!(token_value(tx, "bytes"), size, "{name}: {tx}");
    assert_eq!(json_field(host_rx, "bytes"), size, "{name}: {host_rx}");
    assert_eq!(
        json_field(host_rx, "md5"),
        token_value(tx, "md5"),
        "{name}: g->h corrupted"
    );
    assert_eq!(token_value(rx, "rc"), Some("0"), "{name}: {rx}");
    assert_eq!(token_value(rx, "bytes"), size, "{name}: {rx}");
    assert_eq!(
        token_value(rx, "md5"),
        json_field(host_tx, "md5"),
        "{name}: h->g corrupted"
    );
    let mb = NET_SIZE as f64 / 1e6;
    let num = |v: Option<&str>| v.and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    let g2h_secs = num(json_field(host_rx, "secs"));
    let h2g_secs = num(token_value(rx, "t1")) - num(token_value(rx, "t0"));
    let rate = |secs: f64| if secs > 0.0 { mb / secs } else { 0.0 };
    (rate(g2h_secs), rate(h2g_secs), out)
}

fn assert_net_behind_viommu(name: &str, nic_group_type: &str) {
    let (g2h, h2g, out) = net_transfers(name);
    assert!(g2h > 0.0 && h2g > 0.0, "{name}: no throughput");
    assert_eq!(
        group_type(&out),
        Some(nic_group_type),
        "{name}: NIC group:\n{out}"
    );
    assert!(
        !out.contains("FAULT-LOG"),
        "{name}: the NIC faulted during traffic:\n{out}"
    );
}

#[test]
fn viommu_in_tree_driver_lazy() {
    assert_net_behind_viommu("net_dmavisor_lazy", "DMA-FQ");
}

#[test]
fn viommu_in_tree_driver_strict() {
    assert_net_behind_viommu("net_dmavisor_strict", "DMA");
}

#[test]
fn viommu_net_throughput_ratios() {
    // Prints, for dmavisor and QEMU, the iommu=on (lazy, strict) throughput
    // as a ratio to iommu=off, from the same session. Only dmavisor's runs
    // must pass; QEMU's are reported when they completed.
    for vmm in ["dmavisor", "qemu"] {
        let runs: Vec<Option<(f64, f64)>> = NET_MODES
            .iter()
            .map(|m| {
                let name = format!("net_{vmm}_{m}");
                let r = std::panic::catch_unwind(|| net_transfers(&name))
                    .ok()
                    .map(|(a, b, _)| (a, b));
                println!(
                    "{{\"bench\": \"viommu-net-case\", \"case\": \"{name}\", \"bytes\": {NET_SIZE}, \"MBps\": {}}}",
                    r.map_or("null".into(), |(a, b)| format!("[{a:.4}, {b:.4}]"))
                );
                r
            })
            .collect();
        if let [Some(off), lazy, strict] = runs.as_slice() {
            let ratio =
                |r: &Option<(f64, f64)>| r.map(|(a, b)| (a / off.0.max(1e-9), b / off.1.max(1e-9)));
            let fmt = |r: Option<(f64, f64)>| match r {
                Some((a, b)) => format!("[{a:.3}, {b:.3}]"),
                None => "null".into(),
            };
            println!(
                "{{\"bench\": \"viommu-net\", \"vmm\": \"{vmm}\", \"off_MBps\": [{:.3}, {:.3}], \"lazy_MBps\": {}, \"strict_MBps\": {}, \"lazy_over_off\": {}, \"strict_over_off\": {}, \"order\": \"[guest_to_host, host_to_guest]\"}}",
                off.0,
                off.1,
                fmt(*lazy),
                fmt(*strict),
                fmt(ratio(lazy)),
                fmt(ratio(strict)),
            );
        }
    }
    // Only dmavisor's three runs are required to have passed.
    for m in NET_MODES {
        net_transfers(&format!("net_dmavisor_{m}"));
    }
}
