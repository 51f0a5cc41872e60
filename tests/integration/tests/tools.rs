//! The test tooling itself: guest images, initramfs builder and the KVM
//! runner. If these break, every guest test fails in confusing ways, so they
//! get direct checks of their documented behaviour.

use std::process::Command;
use std::time::Duration;

use integration_tests::images::{build_initramfs, ensure_images, InitramfsSpec};
use integration_tests::paths::{guest_script, resource, scratch_dir};
use integration_tests::runner::{run_capture, run_script_in_kvm, RunnerOptions, EXIT_TIMEOUT};

/// Reads one file out of a gzip'd cpio.
fn cpio_file(image: &std::path::Path, name: &str) -> Vec<u8> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "zcat '{}' | cpio -i --quiet --to-stdout '{}'",
            image.display(),
            name
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "cpio extraction of {name} failed");
    out.stdout
}

#[test]
fn initramfs_loads_dependencies_first_and_decompressed() {
    // trixie ships .ko.xz; virtio_net needs net_failover which needs failover.
    let mut spec = InitramfsSpec::new("trixie", guest_script("boot-info.sh"));
    spec.modules = vec!["virtio_net".into()];
    let image = build_initramfs(&spec).unwrap();
    let order = String::from_utf8(cpio_file(&image, "etc/modules.order")).unwrap();
    let names: Vec<&str> = order
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let pos = |n: &str| {
        names
            .iter()
            .position(|x| *x == n)
            .unwrap_or_else(|| panic!("{n} missing from {names:?}"))
    };
    assert!(pos("failover") < pos("net_failover"), "{names:?}");
    assert!(pos("net_failover") < pos("virtio_net"), "{names:?}");
    let ko = cpio_file(&image, "lib/modules/virtio_net.ko");
    assert_eq!(&ko[..4], b"\x7fELF", "module not stored decompressed");
    // Same inputs -> same cached image.
    assert_eq!(build_initramfs(&spec).unwrap(), image);
}

#[test]
fn initramfs_rejects_unknown_module() {
    let out = Command::new(resource("mkinitramfs"))
        .args(["--suite", "bookworm", "--modules", "no_such_module_xyz"])
        .arg("--script")
        .arg(guest_script("boot-info.sh"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("no_such_module_xyz"), "{err}");
}

#[test]
fn extracted_vmlinux_is_elf_with_pvh_entry() {
    for suite in ["bookworm", "trixie"] {
        let img = ensure_images(suite).unwrap();
        let vmlinux = img.vmlinux.expect("vmlinux extracted");
        let out = Command::new("readelf")
            .arg("-n")
            .arg(&vmlinux)
            .output()
            .unwrap();
        let notes = String::from_utf8_lossy(&out.stdout);
        // XEN_ELFNOTE_PHYS32_ENTRY (18) is what PVH boot jumps to.
        assert!(
            notes.contains("(0x00000012)") || notes.contains("PHYS32_ENTRY"),
            "{suite}: no PVH entry note in {}",
            vmlinux.display()
        );
    }
}

#[test]
fn runner_direct_mode_times_out_with_124() {
    let mut cmd = Command::new(resource("run-kvm"));
    cmd.env("DMAVISOR_RUNNER", "direct")
        .args(["--timeout", "1", "--", "sleep", "30"]);
    let out = run_capture(&mut cmd).unwrap();
    assert_eq!(out.status, Some(EXIT_TIMEOUT), "{}", out.describe());
    assert!(out.elapsed < Duration::from_secs(20));
}

#[test]
fn runner_watchdog_stops_a_silent_command_only() {
    let run = |script: &str| {
        let mut cmd = Command::new(resource("run-kvm"));
        cmd.env("DMAVISOR_RUNNER", "direct").args([
            "--quiet-timeout",
            "3",
            "--",
            "sh",
            "-c",
            script,
        ]);
        run_capture(&mut cmd).unwrap()
    };
    // Silent after its first line: stopped by the watchdog, not the time-out.
    let silent = run("echo start; sleep 60");
    assert_eq!(silent.status, Some(EXIT_TIMEOUT), "{}", silent.describe());
    assert!(silent.elapsed < Duration::from_secs(30));
    assert!(
        silent
            .stderr
            .contains("watchdog: no output from the command"),
        "{}",
        silent.describe()
    );
    assert_eq!(silent.stdout, "start\n");
    // Output every second (stdout or stderr) keeps it alive past 3 s.
    let busy = run("for i in 1 2 3 4 5 6; do echo $i; echo e$i >&2; sleep 1; done; exit 4");
    assert_eq!(busy.status, Some(4), "{}", busy.describe());
}

#[test]
fn runner_streams_output_status_and_results_with_kvm() {
    let marker = scratch_dir().join(format!("runner-selftest-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let script = format!(
        "test -c /dev/kvm || {{ echo no-kvm >&2; exit 2; }}\n\
         echo out-line \"$(pwd)\"\n\
         echo err-line >&2\n\
         echo written > '{}'\n\
         exit 7\n",
        marker.display()
    );
    let out = run_script_in_kvm(
        "selftest",
        &script,
        Duration::from_secs(600),
        &RunnerOptions::default(),
    )
    .unwrap();
    assert_eq!(out.status, Some(7), "{}", out.describe());
    let cwd = std::env::current_dir().unwrap();
    assert_eq!(
        out.stdout,
        format!("out-line {}\n", cwd.display()),
        "{}",
        out.describe()
    );
    assert!(out.stderr.contains("err-line"), "{}", out.describe());
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "written\n");
    let _ = std::fs::remove_file(&marker);
}

/// `run-kvm --assign-nic` (issue 10's runner): the command gets a NIC bound
/// to vfio-pci in a viable IOMMU group, named by DMAVISOR_ASSIGN_BDF, and
/// the address of its peer on the same emulated hub. On a KVM host the
/// user names the NIC; without one run-kvm refuses with a clear error.
#[test]
fn runner_assigns_a_nic_behind_an_iommu() {
    let kvm_host = std::path::Path::new("/sys/module/kvm_intel").exists()
        || std::path::Path::new("/sys/module/kvm_amd").exists();
    let script = "bdf=$DMAVISOR_ASSIGN_BDF\n\
         d=/sys/bus/pci/devices/$bdf\n\
         g=$(basename \"$(readlink $d/iommu_group)\")\n\
         echo \"ASSIGN bdf=$bdf driver=$(basename \"$(readlink $d/driver)\") \
         group=$g members=$(ls /sys/kernel/iommu_groups/$g/devices | wc -l) \
         vfio=$(test -c /dev/vfio/$g && echo yes) peer=$DMAVISOR_ASSIGN_PEER \
         class=$(cat $d/class)\"\n";
    let mut cmd = Command::new(resource("run-kvm"));
    cmd.args(["--assign-nic", "--timeout", "600", "--", "sh", "-c", script]);
    if kvm_host && std::env::var_os("DMAVISOR_ASSIGN_BDF").is_none() {
        let out = run_capture(&mut cmd).unwrap();
        assert_eq!(out.status, Some(125), "{}", out.describe());
        assert!(
            out.stderr
                .contains("--assign-nic on a KVM host needs DMAVISOR_ASSIGN_BDF"),
            "{}",
            out.describe()
        );
        return;
    }
    let out = run_capture(&mut cmd).unwrap();
    assert_eq!(out.status, Some(0), "{}", out.describe());
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("ASSIGN "))
        .unwrap_or_else(|| panic!("{}", out.describe()));
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|t| t.strip_prefix(&format!("{k}=")))
            .unwrap_or("")
    };
    assert_eq!(field("driver"), "vfio-pci", "{line}");
    assert_eq!(field("vfio"), "yes", "group has a VFIO node: {line}");
    assert_eq!(field("members"), "1", "the NIC alone in its group: {line}");
    assert!(
        field("class").starts_with("0x02"),
        "a network controller: {line}"
    );
    assert!(!field("peer").is_empty(), "{line}");
}
