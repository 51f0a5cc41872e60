//! Opening /dev/kvm with errors that tell the user what to do.

use std::path::Path;

use kvm_ioctls::{Cap, Kvm};
use log::warn;

use crate::error::Error;

/// Hint appended to every "no usable KVM" message.
pub const RUNNER_HINT: &str =
    "run dmavisor inside the nested-virt runner: resources/run-kvm -- dmavisor ...";

/// Opens /dev/kvm and checks the capabilities the VMM relies on.
pub fn open_kvm() -> Result<Kvm, Error> {
    let kvm = Kvm::new().map_err(|e| {
        let why = match e.errno() {
            libc::ENOENT => "/dev/kvm does not exist (no KVM on this host)".to_string(),
            libc::EACCES | libc::EPERM => {
                "no permission to open /dev/kvm (are you in group 'kvm'?)".to_string()
            }
            _ => format!("cannot open /dev/kvm: {e}"),
        };
        Error::Kvm(format!("{why}; {RUNNER_HINT}"))
    })?;
    let needed = [
        (Cap::Irqchip, "in-kernel irqchip"),
        (Cap::UserMemory, "user memory regions"),
        (Cap::SetTssAddr, "TSS address"),
        (Cap::Pit2, "in-kernel PIT"),
        (Cap::Irqfd, "irqfd"),
        (Cap::ExtCpuid, "KVM_GET_SUPPORTED_CPUID"),
    ];
    for (cap, what) in needed {
        if !kvm.check_extension(cap) {
            return Err(Error::Kvm(format!(
                "/dev/kvm lacks {what} (KVM_CAP {cap:?}); {RUNNER_HINT}"
            )));
        }
    }
    if is_pvm_host(Path::new("/sys/module")) {
        warn!("this host's /dev/kvm is PVM (kvm_pvm): stock kernels hang under it; {RUNNER_HINT}");
    }
    Ok(kvm)
}

/// True when the KVM module is PVM and no hardware KVM module is loaded.
pub fn is_pvm_host(sys_module: &Path) -> bool {
    sys_module.join("kvm_pvm").exists()
        && !sys_module.join("kvm_intel").exists()
        && !sys_module.join("kvm_amd").exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pvm_detection() {
        let dir = std::env::temp_dir().join(format!("dmavisor-sysmod-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("kvm_pvm")).unwrap();
        assert!(is_pvm_host(&dir));
        std::fs::create_dir_all(dir.join("kvm_amd")).unwrap();
        assert!(!is_pvm_host(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(!is_pvm_host(Path::new("/nonexistent")));
    }
}
