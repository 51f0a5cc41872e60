//! Issue 10: a NIC assigned to the guest through VFIO (`--device`).
//!
//! The runner provides the NIC (`run-kvm --assign-nic`): in the nested
//! runner an emulated e1000e behind L1's emulated Intel IOMMU, bound to
//! vfio-pci in L2, with a second e1000e on the same emulated hub as its
//! peer (address DMAVISOR_ASSIGN_PEER); on a KVM host, the NIC the user
//! names in DMAVISOR_ASSIGN_BDF. The guest (bookworm, its in-tree e1000e
//! driver) moves data both ways with the peer over the assigned NIC, as in
//! tests/virtio_net.rs, and the content is checked on both sides.

use std::sync::OnceLock;
use std::time::Duration;

use integration_tests::images::{build_initramfs, ensure_images, InitramfsSpec};
use integration_tests::markers::{
    guest_script_exit, json_field, marker_line, peer_result, token_value,
};
use integration_tests::paths::{guest_script, path_arg};
use integration_tests::session::{Case, CaseResult, Plan, SharedSession};
use integration_tests::vmm::dmavisor_binary;

/// Bytes each way (the guest script's default).
const SIZE: u64 = 8 << 20;
const CASE_TIMEOUT_SECS: u32 = 900;
const SESSION_TIMEOUT: Duration = Duration::from_secs(1500);

fn session() -> &'static SharedSession {
    static RUN: OnceLock<SharedSession> = OnceLock::new();
    RUN.get_or_init(|| {
        SharedSession::run_with_assigned_nic("vfio", SESSION_TIMEOUT, || {
            let images = ensure_images("bookworm").map_err(|e| e.to_string())?;
            let mut spec = InitramfsSpec::new("bookworm", guest_script("net-guest.sh"));
            spec.modules = vec!["e1000e".into()];
            spec.script_timeout = Some(CASE_TIMEOUT_SECS - 60);
            let initrd = build_initramfs(&spec).map_err(|e| e.to_string())?;
            let bin = dmavisor_binary().map_err(|e| e.to_string())?;
            let case = Case::new(
                "vfio_nic_no_viommu",
                vec![
                    "sh".into(),
                    path_arg(&guest_script("net-host.sh")),
                    "dmavisor-vfio".into(),
                    path_arg(&bin),
                    path_arg(&images.vmlinuz),
                    path_arg(&initrd),
                ],
                CASE_TIMEOUT_SECS,
            );
            Ok(Plan::from(vec![case]))
        })
    })
}

fn case(name: &str) -> CaseResult {
    let r = session().case(name).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", r.summary(name));
    r.clone()
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    token_value(line, key).unwrap_or_else(|| panic!("no {key}= in '{line}'"))
}

/// TCP both ways over the assigned NIC without a vIOMMU: all guest RAM is
/// mapped in the VFIO container, the guest's e1000e driver runs the real
/// (emulated-by-L1) device, its MSI-X interrupts arrive through irqfds,
/// and the data arrives intact on both sides; a driver unbind and bind
/// (device reset) keeps the NIC working.
#[test]
fn vfio_nic_no_viommu() {
    let r = case("vfio_nic_no_viommu");
    let out = &r.output;
    let context = r.tail(80);
    assert_eq!(r.exit, Some(0), "script failed:\n{context}");
    assert!(
        out.contains("VMM-EXIT rc=0"),
        "VMM did not exit 0:\n{context}"
    );
    assert_eq!(guest_script_exit(out), Some(0), "{context}");
    let iface = marker_line(out, "GUEST-NET-IFACE").unwrap_or_else(|| panic!("{context}"));
    assert_eq!(field(iface, "driver"), "e1000e", "{iface}");
    let ping = marker_line(out, "GUEST-PING").unwrap_or_else(|| panic!("{context}"));
    assert_ne!(field(ping, "received"), "0", "{ping}");
    let tx = marker_line(out, "GUEST-TX").unwrap_or_else(|| panic!("{context}"));
    let host_rx = peer_result(out, "guest_to_host").unwrap_or_else(|| panic!("{context}"));
    assert_eq!(field(tx, "bytes"), SIZE.to_string(), "{tx}");
    assert_eq!(
        json_field(host_rx, "bytes"),
        Some(SIZE.to_string().as_str())
    );
    assert_eq!(
        json_field(host_rx, "md5"),
        Some(field(tx, "md5")),
        "guest->host corrupted"
    );
    let rx = marker_line(out, "GUEST-RX").unwrap_or_else(|| panic!("{context}"));
    let host_tx = peer_result(out, "host_to_guest").unwrap_or_else(|| panic!("{context}"));
    assert_eq!(field(rx, "bytes"), SIZE.to_string(), "{rx}");
    assert_eq!(
        Some(field(rx, "md5")),
        json_field(host_tx, "md5"),
        "host->guest corrupted"
    );
    let rebind = marker_line(out, "GUEST-REBIND").unwrap_or_else(|| panic!("{context}"));
    assert_eq!(
        field(rebind, "ok"),
        "1",
        "no traffic after rebind: {rebind}"
    );
    assert!(
        out.contains("vfio nic0: assigned at"),
        "VMM did not report the assignment:\n{context}"
    );
}
