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

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use integration_tests::images::{build_initramfs, ensure_images, InitramfsSpec};
use integration_tests::markers::{guest_script_exit, marker_int, marker_value};
use integration_tests::paths::{guest_script, repo_root, scratch_dir};
use integration_tests::session::{run_session, Case, CaseResult, SessionResult};
use integration_tests::vmm::dmavisor_binary;

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

struct Session {
    result: Result<SessionResult, String>,
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Builds the static guest tool (gcc is part of the project's host deps).
fn build_tool() -> Result<PathBuf, String> {
    std::fs::create_dir_all(scratch_dir())
        .map_err(|e| format!("{}: {e}", scratch_dir().display()))?;
    let out = scratch_dir().join("viommu-dma");
    let src = repo_root().join("tests/integration/guest/viommu-dma.c");
    let st = Command::new("gcc")
        .args(["-static", "-O2", "-Wall", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .map_err(|e| format!("gcc: {e}"))?;
    if !st.success() {
        return Err(format!("gcc {} failed: {st}", src.display()));
    }
    Ok(out)
}

fn dmavisor(name: &str, bin: &Path, kernel: &Path, initrd: &Path, extra: &[&str]) -> Case {
    let mut argv = vec![
        s(bin),
        "--kernel".into(),
        s(kernel),
        "--initramfs".into(),
        s(initrd),
        "--cpus".into(),
        "boot=1".into(),
        "--memory".into(),
        "size=512M".into(),
        "--serial".into(),
        "tty".into(),
    ];
    argv.extend(extra.iter().map(|a| a.to_string()));
    Case::new(name, argv, CASE_TIMEOUT_SECS)
}

fn qemu(name: &str, kernel: &Path, initrd: &Path, cmdline: &str) -> Case {
    let argv = [
        "qemu-system-x86_64",
        "-enable-kvm",
        "-cpu",
        "host",
        "-M",
        "q35",
        "-smp",
        "1",
        "-m",
        "512",
        "-nographic",
        "-nodefaults",
        "-no-reboot",
        "-serial",
        "stdio",
        "-device",
        "virtio-iommu-pci",
        "-device",
        "edu,dma_mask=0xffffffffffffffff",
        "-append",
        cmdline,
    ];
    let mut v: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
    v.extend(["-kernel".into(), s(kernel), "-initrd".into(), s(initrd)]);
    Case::new(name, v, CASE_TIMEOUT_SECS)
}

fn session() -> &'static Session {
    static SESSION: OnceLock<Session> = OnceLock::new();
    SESSION.get_or_init(|| {
        let prepare = || -> Result<Vec<Case>, String> {
            let tool = build_tool()?;
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
            let bin = dmavisor_binary().map_err(|e| e.to_string())?;
            let k = &trixie.vmlinuz;
            let vfio = format!("{CMDLINE} viommu_mode=vfio");
            let vfio_strict = format!("{CMDLINE} viommu_mode=vfio iommu.strict=1");
            let phys = format!("{CMDLINE} viommu_mode=phys");
            let d = |name, initrd: &Path, cmdline: &str, extra: &[&str]| {
                let mut args = vec!["--cmdline", cmdline];
                args.extend_from_slice(extra);
                dmavisor(name, &bin, k, initrd, &args)
            };
            Ok(vec![
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
            ])
        };
        Session {
            result: prepare().and_then(|cases| {
                run_session("viommu", &cases, SESSION_TIMEOUT, None).map_err(|e| e.to_string())
            }),
        }
    })
}

fn case(name: &str) -> CaseResult {
    match &session().result {
        Ok(sess) => {
            let r = sess.case(name).unwrap_or_else(|e| panic!("{e}"));
            eprintln!(
                "case {name}: exit {:?} in {:.2} s",
                r.exit,
                r.secs.unwrap_or(f64::NAN)
            );
            r.clone()
        }
        Err(e) => panic!("viommu session failed: {e}"),
    }
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

/// The test device's IOMMU group line, e.g. "IOMMU-GROUP 0 type=DMA-FQ devices=0000:00:02.0,".
fn group_type_of_device(out: &str) -> String {
    let bdf = marker_value(out, "bdf").unwrap_or_else(|| panic!("no bdf in:\n{out}"));
    let line = out
        .lines()
        .find(|l| l.starts_with("IOMMU-GROUP ") && l.contains(bdf))
        .unwrap_or_else(|| panic!("{bdf} is in no IOMMU group:\n{out}"));
    marker_value(line, "type")
        .unwrap_or_else(|| panic!("no type in {line}"))
        .to_string()
}

/// DMA through a mapped IOVA works; after UNMAP and to a never-mapped
/// IOVA it is blocked, memory is unchanged, and the guest driver logged
/// the fault events for exactly those addresses.
fn assert_protects(name: &str, dmavisor_registers: bool) {
    let out = completed(name);
    assert_eq!(int(&out, "mapped_ok"), 1, "{name}: mapped DMA:\n{out}");
    assert_eq!(int(&out, "mapped_diff"), 0, "{name}:\n{out}");
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
    for iova in [UNMAPPED_IOVA, NEVER_IOVA] {
        assert!(
            faults.iter().any(|l| l.contains(&format!("at {iova}"))),
            "{name}: no guest fault event for {iova}:\n{out}"
        );
    }
    if dmavisor_registers {
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
    assert_eq!(group_type_of_device(&out), "DMA-FQ", "output:\n{out}");
    assert!(
        out.contains("virtio_iommu virtio0: input address: 48 bits"),
        "driver did not bind:\n{out}"
    );
}

#[test]
fn viommu_in_tree_driver_strict_group() {
    let out = completed("vfio_strict");
    assert_eq!(group_type_of_device(&out), "DMA", "output:\n{out}");
    assert_protects("vfio_strict", true);
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
