//! Issue 12 (virtio-blk part): `--disk` on a raw image.
//!
//! One runner session; for each case `guest/blk-host.sh` makes an 8 MiB raw
//! image with a known pattern in a fresh directory of the runner, boots a
//! guest with it as /dev/vda and prints the image's MD5s after the VMM
//! exits; the guest (`guest/blk-guest.sh`) reads the first MiB, writes
//! 4 MiB of random data at 1 MiB with O_DIRECT and fsync (FLUSH), drops
//! its caches and reads them back. Cases:
//! - `blk_dmavisor`: bookworm, two request queues, no vIOMMU;
//! - `blk_dmavisor_viommu`: trixie, the disk behind `--iommu`, the in-tree
//!   virtio-iommu driver strict (`iommu.strict=1`);
//! - `blk_dmavisor_ro`: `readonly=on`, the guest's writes must fail and the
//!   image stay as it was;
//! - `blk_qemu`, `blk_qemu_viommu`: QEMU's virtio-blk-pci on the same kind
//!   of image, without and behind its virtio-iommu-pci (strict), the
//!   references for the throughput ratios (reported, not asserted).
//!
//! Booting from the disk (`guest/rootfs-host.sh`, case `rootfs_dmavisor`):
//! a copy of the Debian root image (`resources/mkrootfs`, systemd as init)
//! is the guest's only disk; the initramfs switch_roots into it and the
//! disk's systemd runs `guest/rootfs-guest.sh`. Three boots of the same
//! copy, each powered off by the disk's systemd and the image checked from
//! the runner after each (e2fsck, the written file's MD5 through debugfs):
//! 1. bookworm, no vIOMMU: writes a file;
//! 2. trixie's kernel, the disk behind `--iommu`, the in-tree driver
//!    strict: reads boot 1's file back, writes a new one;
//! 3. bookworm, no vIOMMU: reads boot 2's file back.
//!
//! Each configuration thus writes a file a rebooted guest reads back and
//! reads one written before a reboot; sharing the middle boot saves a
//! fourth (each boot of the disk's systemd costs about a minute in the
//! nested runner).
//!
//! The guest driver as users install it (`guest/module-deb-host.sh`, case
//! `module_deb`): its Debian package (`make -C guest-driver deb`) written
//! into a copy of the root image, installed there with dpkg by the disk's
//! systemd, loaded with modprobe, and one DMA through the vIOMMU.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use integration_tests::images::{build_initramfs, ensure_images, ensure_rootfs, InitramfsSpec};
use integration_tests::markers::{guest_script_exit, marker_line, marker_value, token_value};
use integration_tests::paths::{guest_script, path_arg, repo_root};
use integration_tests::session::{Case, CaseResult, Plan, SharedSession};
use integration_tests::vmm::dmavisor_binary;

const WRITTEN: u64 = 4 << 20;
const CASE_TIMEOUT_SECS: u32 = 900;
const GUEST_SCRIPT_TIMEOUT: u32 = 800;
const SESSION_TIMEOUT: Duration = Duration::from_secs(3600);
/// The case of the three boots from the root disk.
const ROOTFS_CASE: &str = "rootfs_dmavisor";
/// The case that installs the guest driver's Debian package.
const MODULE_DEB_CASE: &str = "module_deb";

fn blk_case(mode: &str, bin: &str, kernel: &Path, initrd: &Path) -> Case {
    Case::new(
        &format!("blk_{}", mode.replace('-', "_")),
        vec![
            "sh".into(),
            path_arg(&guest_script("blk-host.sh")),
            mode.into(),
            bin.into(),
            path_arg(kernel),
            path_arg(initrd),
        ],
        CASE_TIMEOUT_SECS,
    )
}

fn rootfs_case(bin: &str, bookworm: (&Path, &Path), trixie: (&Path, &Path), image: &Path) -> Case {
    Case::new(
        ROOTFS_CASE,
        vec![
            "sh".into(),
            path_arg(&guest_script("rootfs-host.sh")),
            bin.into(),
            path_arg(bookworm.0),
            path_arg(bookworm.1),
            path_arg(trixie.0),
            path_arg(trixie.1),
            path_arg(image),
        ],
        CASE_TIMEOUT_SECS,
    )
}

/// The guest driver's Debian package (`make -C guest-driver deb`, which
/// prints its path last) and the case that installs and loads it.
fn module_deb_case(bin: &str, kernel: &Path, initrd: &Path, image: &Path) -> Result<Case, String> {
    // A make that runs the tests (`make test`) passes its flags down in
    // MAKEFLAGS, `-w` among them, which adds "Entering directory" lines to
    // stdout: the package is the line that names a .deb.
    let out = std::process::Command::new("make")
        .args(["-s", "--no-print-directory", "-C"])
        .arg(repo_root().join("guest-driver"))
        .arg("deb")
        .env_remove("MAKEFLAGS")
        .env_remove("MAKELEVEL")
        .env_remove("MFLAGS")
        .output()
        .map_err(|e| format!("make -C guest-driver deb: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let deb = stdout
        .lines()
        .map(str::trim)
        .rfind(|l| l.ends_with(".deb"))
        .unwrap_or_default()
        .to_string();
    if !out.status.success() || !deb.ends_with(".deb") {
        return Err(format!(
            "make -C guest-driver deb: {}\n{stdout}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(Case::new(
        MODULE_DEB_CASE,
        vec![
            "sh".into(),
            path_arg(&guest_script("module-deb-host.sh")),
            bin.into(),
            path_arg(kernel),
            path_arg(initrd),
            path_arg(image),
            deb,
        ],
        CASE_TIMEOUT_SECS,
    ))
}

/// The initramfs that mounts the root disk and hands `script` to the
/// disk's init (`root=` on the command line, `resources/mkinitramfs`).
/// crc32c_generic: ext4's metadata checksums need a crc32c driver, and the
/// modular ext4 does not pull one in.
fn rootfs_initramfs(
    suite: &str,
    first: &[&str],
    script: &str,
) -> Result<std::path::PathBuf, String> {
    let mut spec = InitramfsSpec::new(suite, guest_script(script));
    spec.modules = first
        .iter()
        .chain(&["virtio_blk", "ext4", "crc32c_generic"])
        .map(|m| m.to_string())
        .collect();
    spec.optional_modules = vec!["virtio_pci".into()];
    build_initramfs(&spec).map_err(|e| e.to_string())
}

fn run() -> &'static SharedSession {
    static RUN: OnceLock<SharedSession> = OnceLock::new();
    RUN.get_or_init(|| {
        SharedSession::run("virtio-blk", SESSION_TIMEOUT, || {
            let bookworm = ensure_images("bookworm").map_err(|e| e.to_string())?;
            let mut spec = InitramfsSpec::new("bookworm", guest_script("blk-guest.sh"));
            spec.modules = vec!["virtio_pci".into(), "virtio_blk".into()];
            spec.script_timeout = Some(GUEST_SCRIPT_TIMEOUT);
            let initrd = build_initramfs(&spec).map_err(|e| e.to_string())?;
            let trixie = ensure_images("trixie").map_err(|e| e.to_string())?;
            let mut tspec = InitramfsSpec::new("trixie", guest_script("blk-guest.sh"));
            tspec.modules = vec!["virtio_iommu".into(), "virtio_blk".into()];
            tspec.optional_modules = vec!["virtio_pci".into()];
            tspec.script_timeout = Some(GUEST_SCRIPT_TIMEOUT);
            let tinitrd = build_initramfs(&tspec).map_err(|e| e.to_string())?;
            let rootfs = ensure_rootfs().map_err(|e| e.to_string())?;
            let rinitrd = rootfs_initramfs("bookworm", &[], "rootfs-guest.sh")?;
            let trinitrd = rootfs_initramfs("trixie", &["virtio_iommu"], "rootfs-guest.sh")?;
            let dinitrd = rootfs_initramfs("bookworm", &[], "module-deb-guest.sh")?;
            let mut cases = Vec::new();
            let vmm_error = match dmavisor_binary() {
                Ok(bin) => {
                    let bin = path_arg(&bin);
                    cases.push(blk_case("dmavisor", &bin, &bookworm.vmlinuz, &initrd));
                    cases.push(blk_case("dmavisor-viommu", &bin, &trixie.vmlinuz, &tinitrd));
                    cases.push(blk_case("dmavisor-ro", &bin, &bookworm.vmlinuz, &initrd));
                    cases.push(rootfs_case(
                        &bin,
                        (&bookworm.vmlinuz, &rinitrd),
                        (&trixie.vmlinuz, &trinitrd),
                        &rootfs,
                    ));
                    cases.push(module_deb_case(&bin, &bookworm.vmlinuz, &dinitrd, &rootfs)?);
                    None
                }
                Err(e) => Some(e.to_string()),
            };
            cases.push(blk_case("qemu", "-", &bookworm.vmlinuz, &initrd));
            // QEMU behind its vIOMMU: a second, longer reference
            // (integration_tests::references_enabled).
            if integration_tests::references_enabled() {
                cases.push(blk_case("qemu-viommu", "-", &trixie.vmlinuz, &tinitrd));
            }
            Ok(Plan { cases, vmm_error })
        })
    })
}

fn case(name: &str) -> CaseResult {
    let r = run().case(name).unwrap_or_else(|e| panic!("{e}")).clone();
    eprintln!("{}", r.summary(name));
    r
}

fn field<'a>(line: &'a str, key: &str, ctx: &str) -> &'a str {
    token_value(line, key).unwrap_or_else(|| panic!("no {key}= in '{line}':\n{ctx}"))
}

fn line<'a>(out: &'a str, key: &str, ctx: &str) -> &'a str {
    marker_line(out, key).unwrap_or_else(|| panic!("no {key} line:\n{ctx}"))
}

/// What a completed read-write case showed: its output and the write and
/// read throughputs (MB/s, timed in the guest).
struct ReadWrite {
    out: String,
    write_mbps: f64,
    read_mbps: f64,
}

/// Checks a read-write case: the VMM and the guest script ended well, the
/// guest read the host's first MiB intact, wrote and read back 4 MiB with
/// equal MD5s, and the image holds them after the VMM exited (the rest of
/// it untouched).
fn check_read_write(name: &str) -> ReadWrite {
    let r = case(name);
    let ctx = r.tail(60);
    let out = r.output;
    assert!(out.contains("VMM-EXIT rc=0"), "{name}: VMM:\n{ctx}");
    assert_eq!(guest_script_exit(&out), Some(0), "{name}:\n{ctx}");
    let info = line(&out, "GUEST-BLK-INFO", &ctx);
    assert_eq!(field(info, "sectors", &ctx), "16384", "{name}: {info}");
    assert_eq!(field(info, "ro", &ctx), "0", "{name}: {info}");
    let before = line(&out, "HOST-IMG-BEFORE", &ctx);
    let after = line(&out, "HOST-IMG-AFTER", &ctx);
    let head = line(&out, "GUEST-BLK-HEAD", &ctx);
    assert_eq!(
        field(head, "md5", &ctx),
        field(before, "md5_head", &ctx),
        "{name}: the guest read the image's first MiB wrong"
    );
    let w = line(&out, "GUEST-BLK-WRITE", &ctx);
    let rd = line(&out, "GUEST-BLK-READ", &ctx);
    for l in [w, rd] {
        assert_eq!(field(l, "rc", &ctx), "0", "{name}: {l}");
    }
    assert_eq!(field(rd, "bytes", &ctx), WRITTEN.to_string(), "{rd}");
    assert_eq!(
        field(rd, "md5", &ctx),
        field(w, "md5", &ctx),
        "{name}: read back differs from what was written"
    );
    assert_eq!(
        field(after, "md5_written", &ctx),
        field(w, "md5", &ctx),
        "{name}: the image does not hold what the guest wrote"
    );
    assert_eq!(field(after, "size", &ctx), "8388608", "{name}: {after}");
    assert_eq!(
        field(after, "md5_head", &ctx),
        field(before, "md5_head", &ctx),
        "{name}: the first MiB changed"
    );
    assert!(
        !out.contains("GUEST-IO-ERROR"),
        "{name}: I/O errors:\n{ctx}"
    );
    println!("{name}: {w}\n{name}: {rd}");
    // dmavisor -v prints the vIOMMU's request counts at exit.
    if let Some(c) = out
        .lines()
        .find(|l| l.contains(" MAP, ") && l.contains(" UNMAP, "))
    {
        println!("{name}: {}", c.trim());
    }
    let secs = |l: &str| {
        let t = |k| field(l, k, &ctx).parse::<f64>().unwrap_or(0.0);
        t("t1") - t("t0")
    };
    let rate = |s: f64| WRITTEN as f64 / 1e6 / s.max(0.01);
    ReadWrite {
        write_mbps: rate(secs(w)),
        read_mbps: rate(secs(rd)),
        out,
    }
}

/// No vIOMMU, two request queues: data intact both ways and in the image.
#[test]
fn virtio_blk_read_write() {
    let rw = check_read_write("blk_dmavisor");
    let info = line(&rw.out, "GUEST-BLK-INFO", "");
    assert_eq!(token_value(info, "queues"), Some("2"), "{info}");
    assert!(
        token_value(info, "serial").is_some_and(|s| s.starts_with("dmv")),
        "GET_ID: {info}"
    );
    println!(
        "{{\"bench\": \"virtio-blk\", \"vmm\": \"dmavisor\", \"bytes\": {WRITTEN}, \"write_MBps\": {:.3}, \"read_MBps\": {:.3}}}",
        rw.write_mbps, rw.read_mbps
    );
}

/// Behind the vIOMMU with the in-tree driver strict: the disk is in a
/// translating (DMA) group, ACCESS_PLATFORM was negotiated, no fault on
/// either side, data intact.
#[test]
fn virtio_blk_behind_viommu() {
    let rw = check_read_write("blk_dmavisor_viommu");
    let out = &rw.out;
    let info = line(out, "GUEST-BLK-INFO", "");
    let bdf = token_value(info, "bdf").unwrap_or_default();
    let group = out
        .lines()
        .find(|l| l.starts_with("IOMMU-GROUP ") && !bdf.is_empty() && l.contains(bdf))
        .unwrap_or_else(|| panic!("disk {bdf} in no IOMMU group:\n{out}"));
    assert_eq!(
        marker_value(group, "type"),
        Some("DMA"),
        "strict: a DMA domain expected: {group}"
    );
    let features = token_value(info, "features").unwrap_or_default();
    assert_eq!(
        features.as_bytes().get(33),
        Some(&b'1'),
        "ACCESS_PLATFORM not negotiated: {features}"
    );
    assert!(!out.contains("FAULT-LOG"), "guest saw DMA faults:\n{out}");
    assert!(
        !out.contains("device DMA refused"),
        "dmavisor refused DMA:\n{out}"
    );
    println!(
        "{{\"bench\": \"virtio-blk\", \"vmm\": \"dmavisor\", \"viommu\": \"strict\", \"bytes\": {WRITTEN}, \"write_MBps\": {:.3}, \"read_MBps\": {:.3}}}",
        rw.write_mbps, rw.read_mbps
    );
}

/// readonly=on: the guest sees a read-only disk, its writes fail, and the
/// image is byte for byte what it was.
#[test]
fn virtio_blk_readonly() {
    let name = "blk_dmavisor_ro";
    let r = case(name);
    let ctx = r.tail(60);
    let out = r.output;
    assert!(out.contains("VMM-EXIT rc=0"), "{name}: VMM:\n{ctx}");
    assert_eq!(guest_script_exit(&out), Some(0), "{name}:\n{ctx}");
    let info = line(&out, "GUEST-BLK-INFO", &ctx);
    assert_eq!(field(info, "ro", &ctx), "1", "{info}");
    let ro = line(&out, "GUEST-BLK-ROWRITE", &ctx);
    assert_ne!(field(ro, "rc", &ctx), "0", "a write succeeded: {ro}");
    assert_ne!(
        field(ro, "rc_after_setrw", &ctx),
        "0",
        "a write succeeded after blockdev --setrw: {ro}"
    );
    let before = line(&out, "HOST-IMG-BEFORE", &ctx);
    let after = line(&out, "HOST-IMG-AFTER", &ctx);
    assert_eq!(
        field(after, "md5_all", &ctx),
        field(before, "md5_all", &ctx),
        "the read-only image changed"
    );
    let head = line(&out, "GUEST-BLK-HEAD", &ctx);
    assert_eq!(field(head, "md5", &ctx), field(before, "md5_head", &ctx));
    println!("virtio-blk read-only: {ro}");
}

/// QEMU's virtio-blk-pci on the same guest and image: the reference, and
/// the ratios (reported only).
#[test]
fn qemu_virtio_blk_reference() {
    let q = check_read_write("blk_qemu");
    println!(
        "{{\"bench\": \"virtio-blk\", \"vmm\": \"qemu\", \"bytes\": {WRITTEN}, \"write_MBps\": {:.3}, \"read_MBps\": {:.3}}}",
        q.write_mbps, q.read_mbps
    );
    let completed = |name: &str| std::panic::catch_unwind(|| check_read_write(name)).ok();
    let ours = completed("blk_dmavisor");
    let viommu = completed("blk_dmavisor_viommu");
    let qviommu = completed("blk_qemu_viommu");
    let ratio = |d: &Option<ReadWrite>, q: Option<&ReadWrite>| match (d, q) {
        (Some(d), Some(q)) => format!(
            "[{:.3}, {:.3}]",
            d.write_mbps / q.write_mbps.max(1e-9),
            d.read_mbps / q.read_mbps.max(1e-9)
        ),
        _ => "null".into(),
    };
    if let Some(v) = &qviommu {
        println!(
            "{{\"bench\": \"virtio-blk\", \"vmm\": \"qemu\", \"viommu\": \"strict\", \"bytes\": {WRITTEN}, \"write_MBps\": {:.3}, \"read_MBps\": {:.3}}}",
            v.write_mbps, v.read_mbps
        );
    }
    println!(
        "{{\"bench\": \"virtio-blk-ratio\", \"dmavisor_over_qemu\": {}, \"dmavisor_viommu_strict_over_qemu\": {}, \"dmavisor_viommu_strict_over_qemu_viommu_strict\": {}, \"order\": \"[sequential_write, sequential_read]\"}}",
        ratio(&ours, Some(&q)),
        ratio(&viommu, Some(&q)),
        ratio(&viommu, qviommu.as_ref())
    );
}

/// One boot of the root disk: its number, configuration (`plain` or
/// `viommu`) and output, from its `HOST-BOOT` line to its `VMM-EXIT`.
struct DiskBoot<'a> {
    n: usize,
    mode: &'a str,
    out: &'a str,
}

/// Splits the case's output into its boots; panics unless all three ended.
fn disk_boots(out: &str) -> Vec<DiskBoot<'_>> {
    let mut boots = Vec::new();
    let mut rest = out;
    while let Some(start) = rest.find("HOST-BOOT ") {
        let from = &rest[start..];
        let Some(end) = from.find("VMM-EXIT boot=") else {
            break;
        };
        let eol = from[end..].find('\n').map_or(from.len(), |i| end + i + 1);
        let text = &from[..eol];
        let head = text.lines().next().unwrap_or_default();
        boots.push(DiskBoot {
            n: field(head, "boot", out).parse().unwrap_or(0),
            mode: field(head, "mode", out),
            out: text,
        });
        rest = &from[eol..];
    }
    let modes: Vec<(usize, &str)> = boots.iter().map(|b| (b.n, b.mode)).collect();
    assert_eq!(
        modes,
        [(1, "plain"), (2, "viommu"), (3, "plain")],
        "{ROOTFS_CASE}: not all three boots ended:\n{out}"
    );
    boots
}

/// Checks one boot: the VMM and the test script ended well, the file
/// system was clean after the guest's power-off, and the system that ran
/// the script was the disk's: PID 1 is systemd, the file /sbin/init
/// resolves to, / is /dev/vda (ext4, read-write), the initramfs's busybox
/// is gone, and /etc/os-release is the image's. Returns the GUEST-ROOT
/// line.
fn check_disk_boot<'a>(b: &DiskBoot<'a>) -> &'a str {
    let (out, what) = (b.out, format!("{ROOTFS_CASE} boot {} ({})", b.n, b.mode));
    let vmm = line(out, "VMM-EXIT boot=", out);
    assert_eq!(field(vmm, "rc", out), "0", "{what}: VMM:\n{out}");
    assert_eq!(guest_script_exit(out), Some(0), "{what}:\n{out}");
    for bad in ["ROOT-MOUNT-FAILED", "MODULE-LOAD-FAILED", "GUEST-IO-ERROR"] {
        assert!(!out.contains(bad), "{what}: {bad}:\n{out}");
    }
    let fsck = line(out, "HOST-ROOTFS-FSCK", out);
    assert_eq!(
        field(fsck, "rc", out),
        "0",
        "{what}: the file system is not clean after the guest's power-off: {fsck}"
    );
    let root = line(out, "GUEST-ROOT ", out);
    for (key, want) in [
        ("pid1_exe", "/usr/lib/systemd/systemd"),
        ("pid1_is_sbin_init", "1"),
        ("pid1_comm", "systemd"),
        ("root_dev", "/dev/vda"),
        ("root_fs", "ext4"),
        ("root_mode", "rw"),
        ("busybox", "0"),
        ("os", "bookworm"),
    ] {
        assert_eq!(token_value(root, key), Some(want), "{what}: {root}");
    }
    let secs = |k: &str| field(vmm, k, out).parse::<f64>().unwrap_or(f64::NAN);
    let uptime = |m: &str| {
        marker_line(out, m)
            .and_then(|l| token_value(l, "uptime"))
            .unwrap_or("?")
            .to_string()
    };
    println!(
        "{what}: VMM ran {:.1} s; guest uptime at the test hook's start {} s, at its end {} s",
        secs("t1") - secs("t0"),
        uptime("GUEST-HOOK-START"),
        uptime("GUEST-HOOK-END")
    );
    root
}

/// The MD5 boot `b` wrote (checked against what debugfs reads from the
/// image after it) or read.
fn written_md5<'a>(b: &DiskBoot<'a>) -> &'a str {
    let w = line(b.out, "GUEST-ROOTFS-WRITE", b.out);
    assert_eq!(field(w, "rc", b.out), "0", "boot {}: {w}", b.n);
    assert_eq!(field(w, "bytes", b.out), "1048576", "boot {}: {w}", b.n);
    let host = line(b.out, "HOST-ROOTFS-FILE", b.out);
    assert_eq!(
        field(host, "md5", b.out),
        field(w, "md5", b.out),
        "boot {}: the image does not hold what the guest wrote",
        b.n
    );
    field(w, "md5", b.out)
}

fn read_md5<'a>(b: &DiskBoot<'a>) -> &'a str {
    let r = line(b.out, "GUEST-ROOTFS-READ", b.out);
    field(r, "md5", b.out)
}

/// The three boots, each checked; the output of the whole case.
fn checked_disk_boots() -> (String, [String; 3]) {
    static CHECKED: OnceLock<Result<(String, [String; 3]), String>> = OnceLock::new();
    CHECKED
        .get_or_init(|| {
            std::panic::catch_unwind(|| {
                let r = case(ROOTFS_CASE);
                let boots = disk_boots(&r.output);
                let roots: Vec<&str> = boots.iter().map(check_disk_boot).collect();
                let ids: Vec<_> = roots.iter().map(|r| token_value(r, "boot_id")).collect();
                assert!(
                    ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2],
                    "{ROOTFS_CASE}: not three boots: {ids:?}"
                );
                let texts = [0, 1, 2].map(|i| boots[i].out.to_string());
                (r.output.clone(), texts)
            })
            .map_err(|e| {
                e.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            })
        })
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn boot_of(out: &str) -> DiskBoot<'_> {
    let head = out.lines().next().unwrap_or_default();
    DiskBoot {
        n: field(head, "boot", out).parse().unwrap_or(0),
        mode: field(head, "mode", out),
        out,
    }
}

/// The guest boots a Debian root disk with its own systemd as PID 1
/// (checked in every boot), writes a file and powers off; the next boot
/// (behind the vIOMMU) reads it back intact. It also reads back, after a
/// reboot, the file the vIOMMU boot wrote.
#[test]
fn boot_from_virtio_blk() {
    let (_, texts) = checked_disk_boots();
    let [first, second, third] = texts.each_ref().map(|t| boot_of(t));
    let w1 = written_md5(&first);
    assert_eq!(
        read_md5(&second),
        w1,
        "boot 2 read something else than boot 1 wrote"
    );
    let w2 = written_md5(&second);
    assert_eq!(
        read_md5(&third),
        w2,
        "boot 3 read something else than boot 2 wrote"
    );
    assert!(
        !third.out.contains("GUEST-ROOTFS-WRITE"),
        "boot 3 was to read only:\n{}",
        third.out
    );
    println!("{ROOTFS_CASE}: boot 1 wrote {w1}, boot 2 read it and wrote {w2}, boot 3 read it");
}

/// The same behind the vIOMMU, the in-tree driver strict (boot 2): the
/// disk sits in a translating group, its DMA went through the vIOMMU,
/// what it read had been written before the reboot and what it wrote is
/// read back after the next, and no DMA fault is seen on either side.
#[test]
fn boot_from_virtio_blk_behind_viommu() {
    let (out, texts) = checked_disk_boots();
    let b = boot_of(&texts[1]);
    assert_eq!(b.mode, "viommu");
    let groups: Vec<&str> = b
        .out
        .lines()
        .filter(|l| l.starts_with("IOMMU-GROUP "))
        .collect();
    // The disk is the only device behind the vIOMMU, so every group the
    // guest made must translate.
    assert!(!groups.is_empty(), "boot 2: no IOMMU group:\n{}", b.out);
    for g in &groups {
        assert_eq!(marker_value(g, "type"), Some("DMA"), "boot 2: {g}");
    }
    assert!(
        b.out.contains("DMA translated"),
        "boot 2: the disk's DMA was not translated:\n{}",
        b.out
    );
    // dmavisor -v at exit: "virtio-iommu: N MAP, N UNMAP, ...".
    let counts = b
        .out
        .lines()
        .find(|l| l.contains(" MAP, ") && l.contains("virtio-iommu: "))
        .and_then(|l| l.split_once("virtio-iommu: "))
        .map(|(_, r)| r.trim())
        .unwrap_or_else(|| panic!("boot 2: no vIOMMU request counts:\n{}", b.out));
    let maps: u64 = counts
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(maps > 0, "boot 2: no MAP requests: {counts}");
    assert!(!out.contains("FAULT-LOG"), "guest saw DMA faults:\n{out}");
    assert!(
        !out.contains("device DMA refused"),
        "dmavisor refused DMA:\n{out}"
    );
    let texts1 = boot_of(&texts[0]);
    let texts3 = boot_of(&texts[2]);
    assert_eq!(
        read_md5(&b),
        written_md5(&texts1),
        "boot 2 read something else than boot 1 wrote"
    );
    assert_eq!(
        read_md5(&texts3),
        written_md5(&b),
        "boot 3 read something else than boot 2 wrote"
    );
    println!("{ROOTFS_CASE}: boot 2 behind the vIOMMU: {counts}");
}

/// The guest driver's Debian package installs on the bookworm root disk
/// with dpkg (its postinst's depmod included), modprobe loads vviommu from
/// the package's path, it binds the vIOMMU, and a DMA through it works.
#[test]
fn guest_module_deb_installs_and_loads() {
    let r = case(MODULE_DEB_CASE);
    let out = &r.output;
    let ctx = r.tail(60);
    let l = line(out, "GUEST-MODULE-DEB", &ctx);
    let kver = field(l, "kver", &ctx);
    assert_eq!(field(l, "dpkg_rc", &ctx), "0", "{ctx}");
    assert_eq!(field(l, "status", &ctx), "install_ok_installed", "{ctx}");
    assert_eq!(
        field(l, "path", &ctx),
        format!("/lib/modules/{kver}/updates/vviommu/vviommu.ko"),
        "{ctx}"
    );
    assert_eq!(field(l, "modprobe_rc", &ctx), "0", "{ctx}");
    assert_eq!(field(l, "loaded", &ctx), "1", "{ctx}");
    assert_eq!(field(l, "bound", &ctx), "1", "{ctx}");
    assert_eq!(field(l, "edu_rc", &ctx), "0", "{ctx}");
    assert_eq!(field(l, "dma_ok", &ctx), "1", "{ctx}");
    let fsck = line(out, "HOST-ROOTFS-FSCK", &ctx);
    assert_eq!(field(fsck, "rc", &ctx), "0", "{ctx}");
    assert_eq!(field(line(out, "VMM-EXIT", &ctx), "rc", &ctx), "0", "{ctx}");
}
