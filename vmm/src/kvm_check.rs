//! Opening /dev/kvm with errors that tell the user what to do.

use std::path::Path;

use kvm_ioctls::{Cap, Kvm};
use log::warn;

pub use crate::error::RUNNER_HINT;
use crate::error::{Error, KvmUnusable};

/// Environment variable naming another KVM device node (tests use it to
/// exercise the "no KVM" path; default `/dev/kvm`).
pub const KVM_DEVICE_ENV: &str = "DMAVISOR_KVM_DEVICE";

/// Opens /dev/kvm (or `$DMAVISOR_KVM_DEVICE`) and checks the capabilities
/// the VMM relies on.
pub fn open_kvm() -> Result<Kvm, Error> {
    let path = std::env::var_os(KVM_DEVICE_ENV).unwrap_or_else(|| "/dev/kvm".into());
    open_kvm_at(Path::new(&path))
}

/// Like [`open_kvm`] for an explicit device path.
pub fn open_kvm_at(path: &Path) -> Result<Kvm, Error> {
    let dev = || path.display().to_string();
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| KvmUnusable::InvalidPath { path: dev() })?;
    let kvm = Kvm::new_with_path(&c_path).map_err(|source| match source.errno() {
        libc::ENOENT => KvmUnusable::Missing { path: dev() },
        libc::EACCES | libc::EPERM => KvmUnusable::NoPermission { path: dev() },
        _ => KvmUnusable::Open {
            path: dev(),
            source,
        },
    })?;
    let version = kvm.get_api_version();
    if i64::from(version) != i64::from(kvm_bindings::KVM_API_VERSION) {
        return Err(KvmUnusable::ApiVersion {
            path: dev(),
            version,
        }
        .into());
    }
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
            return Err(KvmUnusable::MissingCap {
                path: dev(),
                what,
                cap,
            }
            .into());
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
    fn missing_device_says_so_and_points_to_the_runner() {
        let err = open_kvm_at(Path::new("/nonexistent/kvm"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/kvm does not exist"), "{err}");
        assert!(err.contains("resources/run-kvm"), "{err}");
    }

    #[test]
    fn a_file_that_is_not_kvm_is_refused() {
        // /dev/null opens but the KVM ioctls fail on it.
        let err = open_kvm_at(Path::new("/dev/null")).unwrap_err().to_string();
        assert!(err.contains("/dev/null"), "{err}");
    }

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
