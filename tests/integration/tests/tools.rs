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

/// The vhost-user counting relay (`guest/vhost-user-count.py`, used by the
/// vhost_user group to compare dmavisor's and QEMU's IOTLB traffic):
/// file descriptors cross it intact (the back-end writes into the
/// front-end's pipe), the back-end channel is relayed (a MISS sent by the
/// back-end reaches the front-end), its counts are exact, and it holds
/// the acknowledgement of an INVALIDATE only.
#[test]
fn vhost_user_count_relays_descriptors_and_counts_iotlb_messages() {
    let dir = scratch_dir().join(format!("vu-count-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (back, front) = (dir.join("back.sock"), dir.join("front.sock"));
    let relay = Command::new("python3")
        .arg(guest_script("vhost-user-count.py"))
        .args(["--once", "--delay-invalidate-ack", "300", "--listen"])
        .arg(&front)
        .arg("--backend")
        .arg(&back)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let driver = Command::new("timeout")
        .args(["30", "python3"])
        .arg(guest_script("vhost-user-count-driver.py"))
        .arg(&back)
        .arg(&front)
        .output()
        .unwrap();
    let relay = relay.wait_with_output().unwrap();
    let (d, r) = (
        String::from_utf8_lossy(&driver.stdout),
        String::from_utf8_lossy(&relay.stdout),
    );
    let why = format!(
        "driver: {d}{}\nrelay: {r}",
        String::from_utf8_lossy(&driver.stderr)
    );
    assert!(driver.status.success(), "{why}");
    assert!(d.contains("'pipe': 'through-the-relay'"), "{why}");
    assert!(d.contains("'backend_iotlb_kinds': [2, 2, 3]"), "{why}");
    assert!(d.contains("'frontend_got': [1, 1]"), "{why}");
    assert!(d.contains("'slow_acks': [False, False, True]"), "{why}");
    let counts: serde_json::Value = r
        .lines()
        .find_map(|l| l.strip_prefix("VU-COUNT "))
        .and_then(|j| serde_json::from_str(j).ok())
        .unwrap_or_else(|| panic!("no VU-COUNT line: {why}"));
    assert_eq!(counts["iotlb_updates"], 2, "{why}");
    assert_eq!(counts["iotlb_invalidations"], 1, "{why}");
    assert_eq!(counts["invalidated_bytes"], 0x2000, "{why}");
    assert_eq!(counts["iotlb_misses"], 1, "{why}");
    assert_eq!(counts["delayed_acks"], 1, "{why}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The runner refuses an L1 emulator whose VMRUN fix it cannot prove, with
/// one clear line and before it boots anything: single-threaded TCG on an
/// unfixed emulator stalls every boot, which would otherwise show up as a
/// watchdog stop per test. The unfixed emulator is the fixed one with the
/// bytes the fix replaced put back (as resources/repro does), started both
/// through a copy of fetch-l1-qemu's wrapper and as a bare binary.
#[test]
fn runner_refuses_an_unfixed_emulator() {
    let home = integration_tests::paths::build_dir().join("l1-qemu");
    let fixed = home.join("root/usr/bin/qemu-system-x86_64");
    if !fixed.exists() {
        let mut fetch = Command::new(resource("fetch-l1-qemu"));
        run_capture(&mut fetch).unwrap();
    }
    let patch_tool = resource("dmavisor_tools/l1_qemu_patch.py");
    let verify = |binary: &std::path::Path| {
        let mut cmd = Command::new("python3");
        cmd.arg(&patch_tool).arg(binary).arg("--verify");
        run_capture(&mut cmd).unwrap()
    };
    let proof = verify(&fixed);
    assert_eq!(proof.status, Some(0), "{}", proof.describe());

    let dir = scratch_dir().join(format!("unfixed-l1-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let unfixed = dir.join("qemu-unfixed");
    std::fs::copy(&fixed, &unfixed).unwrap();
    let sidecar = std::fs::read_to_string(format!("{}.vmrun-fix.json", fixed.display())).unwrap();
    let site: serde_json::Value = serde_json::from_str(&sidecar).unwrap();
    let offset = site["file_offset"].as_u64().unwrap();
    let original: Vec<u8> = (0..site["original"].as_str().unwrap().len() / 2)
        .map(|i| u8::from_str_radix(&site["original"].as_str().unwrap()[2 * i..2 * i + 2], 16))
        .collect::<Result<_, _>>()
        .unwrap();
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(&unfixed)
            .unwrap();
        f.seek(SeekFrom::Start(offset)).unwrap();
        f.write_all(&original).unwrap();
    }
    let refused = verify(&unfixed);
    assert_eq!(refused.status, Some(1), "{}", refused.describe());

    let wrapper_text = std::fs::read_to_string(home.join("qemu-system-x86_64")).unwrap();
    let fixed_text = fixed.display().to_string();
    assert!(wrapper_text.contains(&fixed_text), "{wrapper_text}");
    let wrapper = dir.join("qemu-unfixed.sh");
    std::fs::write(
        &wrapper,
        wrapper_text.replace(&fixed_text, &unfixed.display().to_string()),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for emulator in [&wrapper, &unfixed] {
        let mut cmd = Command::new(resource("run-kvm"));
        cmd.env("DMAVISOR_RUNNER", "nested")
            .env("DMAVISOR_RUNNER_QEMU", emulator)
            .env_remove("DMAVISOR_RUNNER_ALLOW_UNFIXED")
            .args(["--timeout", "120", "--", "true"]);
        let out = run_capture(&mut cmd).unwrap();
        assert_eq!(out.status, Some(125), "{}", out.describe());
        assert!(out.elapsed < Duration::from_secs(60), "{}", out.describe());
        let lines: Vec<&str> = out
            .stderr
            .lines()
            .filter(|l| l.contains("refusing an unfixed L1 emulator"))
            .collect();
        assert_eq!(lines.len(), 1, "{}", out.describe());
        assert!(lines[0].contains("fetch-l1-qemu --force"), "{}", lines[0]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
