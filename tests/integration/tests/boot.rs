//! Issue 2: the VMM boots stock Debian guests (bzImage and PVH vmlinux)
//! with SMP and the requested memory, and powering the guest off ends the
//! VMM with status 0. A QEMU boot of the same kernel + initramfs in the same
//! session is the reference: if it passes and dmavisor fails, the VMM is at
//! fault, not the images or the runner.
//!
//! All guest boots run in ONE KVM-environment session (nested boots are
//! slow); each test inspects its own case.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use integration_tests::images::{build_initramfs, ensure_images, InitramfsSpec};
use integration_tests::markers::{guest_script_exit, marker_int};
use integration_tests::paths::guest_script;
use integration_tests::qemu::QemuCommand;
use integration_tests::session::{Case, CaseResult, Plan, SharedSession};
use integration_tests::vmm::{dmavisor_binary, GuestBoot, DEFAULT_CMDLINE};

const CMDLINE: &str = DEFAULT_CMDLINE;
const CASE_TIMEOUT_SECS: u32 = 300;
const SESSION_TIMEOUT: Duration = Duration::from_secs(1800);

fn dmavisor_case(name: &str, bin: &Path, kernel: &Path, initrd: &Path) -> Case {
    let mut boot = GuestBoot::new(kernel, initrd);
    boot.cmdline = CMDLINE.into();
    Case::new(name, boot.argv(bin), CASE_TIMEOUT_SECS)
}

fn qemu_case(name: &str, kernel: &Path, initrd: &Path) -> Case {
    let argv = QemuCommand::new(kernel, initrd, CMDLINE).into_argv();
    Case::new(name, argv, CASE_TIMEOUT_SECS)
}

fn boots() -> &'static SharedSession {
    static BOOTS: OnceLock<SharedSession> = OnceLock::new();
    BOOTS.get_or_init(|| {
        SharedSession::run("boot", SESSION_TIMEOUT, || {
            let script = guest_script("boot-info.sh");
            let bookworm = ensure_images("bookworm").map_err(|e| e.to_string())?;
            let trixie = ensure_images("trixie").map_err(|e| e.to_string())?;
            let bw_initrd = build_initramfs(&InitramfsSpec::new("bookworm", &script))
                .map_err(|e| e.to_string())?;
            let tx_initrd = build_initramfs(&InitramfsSpec::new("trixie", &script))
                .map_err(|e| e.to_string())?;
            let mut cases = vec![qemu_case("qemu_bookworm", &bookworm.vmlinuz, &bw_initrd)];
            let vmm_error = match dmavisor_binary() {
                Ok(bin) => {
                    cases.push(dmavisor_case(
                        "dmavisor_bookworm",
                        &bin,
                        &bookworm.vmlinuz,
                        &bw_initrd,
                    ));
                    cases.push(dmavisor_case(
                        "dmavisor_trixie_bzimage",
                        &bin,
                        &trixie.vmlinuz,
                        &tx_initrd,
                    ));
                    // Large guests: 4 GiB (RAM split around the 32-bit PCI
                    // hole) and 3584 MiB, 4 vCPUs each, `max` as management
                    // stacks pass it.
                    for (name, mib, max) in [
                        ("dmavisor_4g_4vcpus", 4096, Some(8)),
                        ("dmavisor_3584m_4vcpus", 3584, None),
                    ] {
                        let mut boot = GuestBoot::new(&bookworm.vmlinuz, &bw_initrd);
                        boot.cmdline = CMDLINE.into();
                        boot.cpus = 4;
                        boot.cpus_max = max;
                        boot.memory_mib = mib;
                        cases.push(Case::new(name, boot.argv(&bin), CASE_TIMEOUT_SECS));
                    }
                    if let Some(vmlinux) = &trixie.vmlinux {
                        cases.push(dmavisor_case(
                            "dmavisor_trixie_pvh",
                            &bin,
                            vmlinux,
                            &tx_initrd,
                        ));
                    }
                    None
                }
                Err(e) => Some(e.to_string()),
            };
            Ok(Plan { cases, vmm_error })
        })
    })
}

/// The case's result, or a panic message explaining why it is missing.
fn case(name: &str) -> CaseResult {
    let b = boots();
    let r = b.case(name).unwrap_or_else(|e| panic!("{e}"));
    if let Ok(sess) = &b.result {
        eprintln!(
            "{} (session {:.1} s)",
            r.summary(name),
            sess.run.elapsed.as_secs_f64()
        );
    }
    r.clone()
}

/// Asserts a clean boot to userspace with 2 CPUs and ~512 MiB.
fn assert_booted(name: &str) {
    let r = case(name);
    let out = &r.output;
    assert_eq!(r.exit, Some(0), "{name}: VMM exit status; output:\n{out}");
    assert_eq!(
        guest_script_exit(out),
        Some(0),
        "{name}: guest script did not finish; output:\n{out}"
    );
    assert_eq!(
        marker_int(out, "cpus"),
        Some(2),
        "{name}: CPUs; output:\n{out}"
    );
    let mem_kb = marker_int(out, "memtotal_kb").unwrap_or(0);
    // MemTotal excludes firmware/kernel reservations: expect 384..=512 MiB.
    assert!(
        (384 * 1024..=512 * 1024).contains(&mem_kb),
        "{name}: MemTotal {mem_kb} kB not plausible for 512 MiB; output:\n{out}"
    );
    assert!(
        !out.contains("Kernel panic"),
        "{name}: guest panicked:\n{out}"
    );
}

/// Issue 12: large guests. 4 GiB and 3584 MiB with 4 vCPUs boot to
/// userspace, the guest sees all CPUs online and (nearly) all RAM, and the
/// 4 GiB guest's RAM continues above 4 GiB (split around the PCI hole).
#[test]
fn boot_4g_4vcpus() {
    for (name, mib) in [
        ("dmavisor_4g_4vcpus", 4096),
        ("dmavisor_3584m_4vcpus", 3584),
    ] {
        let r = case(name);
        let out = &r.output;
        assert_eq!(r.exit, Some(0), "{name}: VMM exit status; output:\n{out}");
        assert_eq!(guest_script_exit(out), Some(0), "{name}:\n{out}");
        assert_eq!(marker_int(out, "cpus"), Some(4), "{name}: CPUs:\n{out}");
        assert!(out.contains("online=0-3 "), "{name}: online CPUs:\n{out}");
        let mem_kb = marker_int(out, "memtotal_kb").unwrap_or(0);
        // The kernel keeps up to ~6% (memmap, code, reservations).
        assert!(
            (mib * 1024 * 94 / 100..=mib * 1024).contains(&mem_kb),
            "{name}: MemTotal {mem_kb} kB for {mib} MiB:\n{out}"
        );
        let top = out
            .split("ram_top=0x")
            .nth(1)
            .and_then(|t| t.split_whitespace().next())
            .and_then(|t| u64::from_str_radix(t, 16).ok())
            .unwrap_or_else(|| panic!("{name}: no ram_top:\n{out}"));
        if mib == 4096 {
            assert!(top >= 1 << 32, "{name}: RAM ends at {top:#x}, below 4 GiB");
        }
        assert!(!out.contains("Kernel panic"), "{name}: guest panicked");
        let info = out.lines().find(|l| l.contains("GUEST-INFO"));
        println!("{name}: {}", info.unwrap_or_default().trim());
    }
}

#[test]
fn reference_qemu_boots_bookworm_guest() {
    assert_booted("qemu_bookworm");
}

#[test]
fn boot_bookworm_guest_smp() {
    assert_booted("dmavisor_bookworm");
}

#[test]
fn boot_trixie_guest() {
    assert_booted("dmavisor_trixie_bzimage");
}

#[test]
fn boot_trixie_guest_pvh() {
    let b = boots();
    if let Ok(sess) = &b.result {
        assert!(
            sess.cases.contains_key("dmavisor_trixie_pvh") || b.vmm_error.is_some(),
            "no vmlinux was extracted for trixie (resources/guest-images)"
        );
    }
    assert_booted("dmavisor_trixie_pvh");
}

#[test]
fn missing_kernel_is_clear_error() {
    let bin = dmavisor_binary().expect("build dmavisor");
    let missing = "/nonexistent/dmavisor-test/vmlinuz";
    let out = Command::new(&bin)
        .args([
            "--kernel",
            missing,
            "--cmdline",
            CMDLINE,
            "--cpus",
            "boot=1",
            "--memory",
            "size=128M",
            "--serial",
            "off",
        ])
        .output()
        .expect("run dmavisor");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let all = format!("{stdout}{stderr}");
    assert!(
        matches!(out.status.code(), Some(c) if c != 0),
        "expected a non-zero exit status, got {:?}; output:\n{all}",
        out.status
    );
    assert!(!all.contains("panicked"), "dmavisor panicked:\n{all}");
    // Other lines may be warnings about the host (e.g. a PVM /dev/kvm);
    // exactly one line reports the error, and it names the path.
    let errors: Vec<&str> = all
        .lines()
        .filter(|l| l.to_ascii_lowercase().contains("error"))
        .collect();
    assert_eq!(
        errors.len(),
        1,
        "expected exactly one error line, got:\n{all}"
    );
    assert!(
        errors[0].contains(missing),
        "the error line does not name the path: {}",
        errors[0]
    );
}
