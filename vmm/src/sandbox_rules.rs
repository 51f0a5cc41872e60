//! The Landlock rules of a VM: the files its configuration names, the host
//! devices and system files the VMM itself opens, and `--landlock-rules`.
//!
//! WHY apart from `sandbox`: the sandbox is a leaf every device module
//! starts its threads through; reading a `VmConfig` would make it import
//! the device modules that import it.

use std::path::{Path, PathBuf};

use crate::api_socket::ApiSocket;
use crate::config::{ConsoleConfig, SerialConfig, VmConfig};
use crate::sandbox::{LandlockAccess, LandlockRule};

use LandlockAccess::{Read, ReadWrite};

/// Rules for the paths `config` names: they must exist (the VM would fail
/// on them anyway).
pub fn config_rules(config: &VmConfig) -> Vec<LandlockRule> {
    let mut rules = vec![LandlockRule::new(&config.kernel, Read)];
    rules.extend(config.initramfs.iter().map(|i| LandlockRule::new(i, Read)));
    if let SerialConfig::File(path) = &config.serial {
        rules.push(creatable(path));
    }
    // Socket modes create their socket in its directory, and remove it.
    if let SerialConfig::Socket(path) = &config.serial {
        rules.push(LandlockRule::new(parent(path), ReadWrite));
    }
    if let ConsoleConfig::Socket(path) = &config.console {
        rules.push(LandlockRule::new(parent(path), ReadWrite));
    }
    for d in &config.disks {
        let access = if d.readonly { Read } else { ReadWrite };
        rules.push(LandlockRule::new(&d.path, access));
    }
    for n in &config.net {
        // Connecting to a socket needs no Landlock right; creating one
        // (server mode) needs its directory.
        if let (Some(socket), true) = (&n.vhost_user_socket, n.vhost_server) {
            rules.push(LandlockRule::new(parent(socket), ReadWrite));
        }
    }
    for d in &config.devices {
        rules.push(LandlockRule::new(&d.path, ReadWrite));
    }
    rules
}

/// The API socket's directory: the socket file is created (and a stale one
/// replaced) after the sandbox is in place.
pub fn api_socket_rules(socket: Option<&ApiSocket>) -> Vec<LandlockRule> {
    match socket {
        Some(ApiSocket::Path(p)) => vec![LandlockRule::new(parent(p), ReadWrite)],
        _ => Vec::new(),
    }
}

/// What the VMM opens whatever the configuration, where the host has it:
/// KVM, TUN and VFIO nodes; the sysfs and procfs files it reads; and its
/// own binary with the dynamic loader's files (read and execute; kept from
/// when `vm.reboot` re-executed the binary, which reboots in place no
/// longer do).
pub fn host_rules() -> Vec<LandlockRule> {
    let kvm = std::env::var_os(crate::kvm_check::KVM_DEVICE_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| "/dev/kvm".into());
    let mut rules = vec![
        LandlockRule::new(kvm, ReadWrite),
        LandlockRule::new("/dev/net/tun", ReadWrite),
        LandlockRule::new("/dev/vfio", ReadWrite),
        LandlockRule::new("/dev/null", ReadWrite),
        // `Pty` serial and console modes: a new pair from the multiplexer.
        LandlockRule::new("/dev/ptmx", ReadWrite),
        LandlockRule::new("/dev/urandom", Read),
        LandlockRule::new("/proc", Read),
        LandlockRule::new("/sys/module", Read),
        LandlockRule::new("/sys/kernel/mm/transparent_hugepage", Read),
        LandlockRule::new("/sys/kernel/iommu_groups", Read),
        LandlockRule::new("/sys/bus/pci", Read),
        LandlockRule::new("/etc/ld.so.cache", Read),
        LandlockRule::new("/lib", Read),
        LandlockRule::new("/lib64", Read),
        LandlockRule::new("/usr/lib", Read),
        LandlockRule::new("/usr/lib64", Read),
    ];
    if let Ok(exe) = std::env::current_exe() {
        rules.push(LandlockRule::new(exe, Read));
    }
    rules
}

/// A file the VMM may create: the file itself when it exists, else its
/// directory.
fn creatable(path: &Path) -> LandlockRule {
    if path.exists() {
        LandlockRule::new(path, ReadWrite)
    } else {
        LandlockRule::new(parent(path), ReadWrite)
    }
}

fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;

    #[test]
    fn rules_name_every_configured_path() {
        let c = Cli::try_parse_from([
            "dmavisor",
            "--kernel",
            "/k",
            "--initramfs",
            "/i",
            "--disk",
            "path=/ro.img,readonly=on",
            "--disk",
            "path=/rw.img",
            "--serial",
            "file=/nonexistent-dir/serial.log",
            "--device",
            "path=/sys/bus/pci/devices/0000:00:01.0",
            "--console",
            "socket=/run/c/console.sock",
        ])
        .unwrap()
        .to_config()
        .unwrap()
        .unwrap();
        let rules = config_rules(&c);
        let has = |p: &str, a| rules.contains(&LandlockRule::new(p, a));
        assert!(has("/k", Read) && has("/i", Read));
        assert!(has("/ro.img", Read) && has("/rw.img", ReadWrite));
        assert!(has("/nonexistent-dir", ReadWrite));
        assert!(has("/sys/bus/pci/devices/0000:00:01.0", ReadWrite));
        assert!(has("/run/c", ReadWrite), "the console socket's directory");
        assert_eq!(rules.len(), 7);
        assert_eq!(
            api_socket_rules(Some(&ApiSocket::Path("/run/x/api.sock".into()))),
            vec![LandlockRule::new("/run/x", ReadWrite)]
        );
        assert!(api_socket_rules(Some(&ApiSocket::Fd(3))).is_empty());
    }
}
