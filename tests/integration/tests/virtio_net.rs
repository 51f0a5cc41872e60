//! Issue 3: virtio-pci transport + virtio-net on a TAP.
//!
//! One runner session boots the Debian bookworm guest twice with the same
//! initramfs (`guest/net-guest.sh`) and the same TAP setup (host end
//! 192.168.249.1/24, guest 192.168.249.2): once under dmavisor
//! (`--net tap=dmvtap0,...`, dmavisor creates and configures the TAP), once
//! under QEMU's virtio-net-pci as the reference. In each, the guest pings
//! the host and moves 8 MiB each way over TCP to a Python peer
//! (`guest/net-peer.py`), with MD5s computed on both ends. Throughputs are
//! printed as JSON lines, with the dmavisor/QEMU ratio.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use integration_tests::images::{build_initramfs, ensure_images, InitramfsSpec};
use integration_tests::markers::{marker_line, token_value};
use integration_tests::net_checks;
use integration_tests::paths::{guest_script, path_arg};
use integration_tests::session::{Case, CaseResult, Plan, SharedSession};
use integration_tests::vmm::{dmavisor_binary, net_host_argv};

const SIZE: u64 = 8 << 20;
const CASE_TIMEOUT_SECS: u32 = 600;
/// The guest's init kills the script after this (then powers off).
const GUEST_SCRIPT_TIMEOUT: u32 = 420;
const SESSION_TIMEOUT: Duration = Duration::from_secs(2400);

fn net_case(mode: &str, bin: &str, kernel: &Path, initrd: &Path) -> Case {
    Case::new(
        &format!("net_{}", mode.replace('-', "_")),
        net_host_argv(mode, bin, kernel, initrd),
        CASE_TIMEOUT_SECS,
    )
}

fn run() -> &'static SharedSession {
    static RUN: OnceLock<SharedSession> = OnceLock::new();
    RUN.get_or_init(|| {
        SharedSession::run("virtio-net", SESSION_TIMEOUT, || {
            let images = ensure_images("bookworm").map_err(|e| e.to_string())?;
            let mut spec = InitramfsSpec::new("bookworm", guest_script("net-guest.sh"));
            spec.modules = vec!["virtio_pci".into(), "virtio_net".into()];
            spec.script_timeout = Some(GUEST_SCRIPT_TIMEOUT);
            let initrd = build_initramfs(&spec).map_err(|e| e.to_string())?;
            let mut cases = Vec::new();
            let vmm_error = match dmavisor_binary() {
                Ok(bin) => {
                    let bin = path_arg(&bin);
                    cases.push(net_case("dmavisor", &bin, &images.vmlinuz, &initrd));
                    cases.push(net_case("dmavisor-mq", &bin, &images.vmlinuz, &initrd));
                    None
                }
                Err(e) => Some(e.to_string()),
            };
            // Behind the vIOMMU: trixie's in-tree virtio-iommu driver (VIOT)
            // maps every buffer; the device translates each access.
            let trixie = ensure_images("trixie").map_err(|e| e.to_string())?;
            let mut tspec = InitramfsSpec::new("trixie", guest_script("net-guest.sh"));
            tspec.modules = vec!["virtio_iommu".into(), "virtio_net".into()];
            tspec.optional_modules = vec!["virtio_pci".into()];
            tspec.script_timeout = Some(GUEST_SCRIPT_TIMEOUT);
            let tinitrd = build_initramfs(&tspec).map_err(|e| e.to_string())?;
            if let Some(bin) = cases.first().and_then(|c| c.argv.get(3)).cloned() {
                cases.push(net_case("dmavisor-viommu", &bin, &trixie.vmlinuz, &tinitrd));
            }
            cases.push(net_case("qemu", "-", &images.vmlinuz, &initrd));
            Ok(Plan { cases, vmm_error })
        })
    })
}

fn case(name: &str) -> CaseResult {
    run().case(name).unwrap_or_else(|e| panic!("{e}")).clone()
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    token_value(line, key).unwrap_or_else(|| panic!("no {key}= in '{line}'"))
}

/// See [`net_checks::check_transfers`].
fn check_transfers(name: &str) -> (f64, f64) {
    net_checks::check_transfers(name, &case(name), SIZE, "virtio-net-tap")
}

#[test]
fn virtio_net_tap_traffic() {
    let (g2h, h2g) = check_transfers("net_dmavisor");
    assert!(g2h > 0.0 && h2g > 0.0);
    // The reference run is reported, not required, here (its own test
    // below fails if QEMU does).
    if let Ok(sess) = &run().result {
        if let Ok(q) = sess.case("net_qemu") {
            if q.exit == Some(0) && q.output.contains("GUEST-NET-DONE") {
                let (qg2h, qh2g) = check_transfers("net_qemu");
                println!(
                    "{{\"bench\": \"virtio-net-tap-ratio\", \"dmavisor_over_qemu_guest_to_host\": {:.3}, \"dmavisor_over_qemu_host_to_guest\": {:.3}}}",
                    g2h / qg2h.max(1e-9),
                    h2g / qh2g.max(1e-9)
                );
            }
        }
    }
}

/// num_queues=4: two queue pairs plus the control queue; the guest (2
/// vCPUs) uses both pairs after VQ_PAIRS_SET on the control queue.
#[test]
fn virtio_net_multiqueue() {
    check_transfers("net_dmavisor_mq");
    let out = case("net_dmavisor_mq").output;
    let q = marker_line(&out, "GUEST-NET-QUEUES").expect("queue marker");
    assert_eq!(field(q, "rx"), "2", "{q}");
    assert_eq!(field(q, "tx"), "2", "{q}");
    let single = case("net_dmavisor").output;
    let q1 = marker_line(&single, "GUEST-NET-QUEUES").expect("queue marker");
    assert_eq!(field(q1, "rx"), "1", "{q1}");
}

/// `--iommu` + `--net ...,iommu=on` with a trixie guest: the NIC is in an
/// IOMMU group with a translating domain, ACCESS_PLATFORM is negotiated,
/// and all traffic (rings and buffers) goes through IOVA translation.
#[test]
fn virtio_net_behind_viommu() {
    check_transfers("net_dmavisor_viommu");
    let out = case("net_dmavisor_viommu").output;
    let g = marker_line(&out, "GUEST-NET-IOMMU").expect("iommu marker");
    assert!(
        field(g, "type").starts_with("DMA"),
        "NIC not behind a translating IOMMU domain: {g}"
    );
    let iface = marker_line(&out, "GUEST-NET-IFACE").expect("iface marker");
    let features = field(iface, "features");
    assert_eq!(
        features.as_bytes().get(33),
        Some(&b'1'),
        "ACCESS_PLATFORM not negotiated: {features}"
    );
}

/// Issue 9: with bus mastering cleared in the NIC's command register the
/// device does no DMA: three pings get no reply and no frame is received
/// (without the gate they go through as before). With the bit restored the
/// device serves the queues again without a reset (pings answered). With
/// and without the vIOMMU.
#[test]
fn virtio_net_bus_master_off_blocks_dma() {
    for name in ["net_dmavisor", "net_dmavisor_viommu"] {
        check_transfers(name);
        let out = case(name).output;
        let l = marker_line(&out, "GUEST-NOMASTER").unwrap_or_else(|| panic!("{name}: no marker"));
        let now: u32 = field(l, "command").parse().unwrap_or(u32::MAX);
        let was: u32 = field(l, "was").parse().unwrap_or(0);
        assert_eq!(now & 4, 0, "{name}: bus master still set: {l}");
        assert_eq!(was & 4, 4, "{name}: driver had not set bus master: {l}");
        assert_eq!(field(l, "received"), "0", "{name}: ping went through: {l}");
        assert_eq!(field(l, "rx_packets"), "0", "{name}: frames received: {l}");
        assert_ne!(
            field(l, "again"),
            "0",
            "{name}: no traffic with bus mastering back: {l}"
        );
    }
}

#[test]
fn qemu_virtio_net_reference() {
    check_transfers("net_qemu");
}
