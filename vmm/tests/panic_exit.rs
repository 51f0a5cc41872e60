//! A panic in any VMM thread ends the process with one clear line and
//! exit code 101 (vmm/src/panic_exit.rs). The check re-runs this test
//! binary as a child that installs the hook and panics in a named thread,
//! the way a vCPU or device thread would.

use std::process::Command;

const CHILD_ENV: &str = "DMAVISOR_PANIC_EXIT_CHILD";

#[test]
fn panic_in_a_thread_ends_the_process() {
    if std::env::var_os(CHILD_ENV).is_some() {
        vmm::panic_exit::install();
        let worker = std::thread::Builder::new()
            .name("vcpu1".into())
            .spawn(|| panic!("guest did something odd"))
            .expect("spawn");
        let _ = worker.join();
        // Without the hook the join returns and the child exits 0 here.
        std::thread::sleep(std::time::Duration::from_secs(5));
        return;
    }
    let exe = std::env::current_exe().expect("test binary path");
    let out = Command::new(exe)
        .args([
            "--exact",
            "panic_in_a_thread_ends_the_process",
            "--nocapture",
        ])
        .env(CHILD_ENV, "1")
        .output()
        .expect("run child");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(vmm::panic_exit::PANIC_EXIT_CODE),
        "{stderr}"
    );
    assert!(
        stderr.contains("dmavisor: error: thread 'vcpu1' panicked at")
            && stderr.contains("guest did something odd; ending the VMM"),
        "{stderr}"
    );
}
