//! `--device` on a function that cannot be assigned ends dmavisor with one
//! clear line and exit status 1, before any guest is built (no KVM needed).

use std::os::unix::fs;
use std::process::Command;

fn run(path: &std::path::Path) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dmavisor"))
        .args(["--kernel", "/nonexistent-kernel", "--device"])
        .arg(format!("path={}", path.display()))
        .output()
        .expect("run dmavisor");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_function_not_bound_to_vfio_pci_is_refused_in_one_line() {
    let dir = std::env::temp_dir().join(format!("dmavisor-device-{}", std::process::id()));
    let fake = dir.join("0000:00:05.0");
    std::fs::create_dir_all(&fake).unwrap();
    let _ = std::fs::remove_file(fake.join("driver"));
    fs::symlink("../../../bus/pci/drivers/e1000e", fake.join("driver")).unwrap();
    let (code, err) = run(&fake);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.starts_with("dmavisor: error: device setup: vfio 0000:00:05.0: ")
            && err.contains("is bound to e1000e, not vfio-pci"),
        "{err}"
    );
    let (code, err) = run(&dir.join("0000:00:06.0"));
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("does not exist"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
