//! QEMU command lines for the reference boots.
//!
//! Why: tests boot the same kernel and initramfs under QEMU next to
//! dmavisor, so that a failure can be pinned on the VMM. One builder keeps
//! those QEMU runs alike (KVM, host CPU, q35, serial on stdout, no reboot),
//! so they differ only in what a test asks for.

use std::path::PathBuf;

use crate::paths::path_arg;

/// The QEMU binary the reference boots run.
pub const QEMU_BINARY: &str = "qemu-system-x86_64";

/// One QEMU boot of a kernel with an initramfs, turned into a command line
/// with [`QemuCommand::into_argv`].
#[derive(Debug, Clone)]
pub struct QemuCommand {
    kernel: PathBuf,
    initrd: PathBuf,
    cmdline: String,
    smp: u32,
    memory_mib: u32,
    devices: Vec<String>,
}

impl QemuCommand {
    /// 2 vCPUs and 512 MiB (as [`crate::vmm::GuestBoot::new`]), no devices.
    pub fn new(kernel: impl Into<PathBuf>, initrd: impl Into<PathBuf>, cmdline: &str) -> Self {
        QemuCommand {
            kernel: kernel.into(),
            initrd: initrd.into(),
            cmdline: cmdline.to_string(),
            smp: 2,
            memory_mib: 512,
            devices: Vec::new(),
        }
    }

    /// Number of vCPUs (`-smp`).
    pub fn smp(mut self, cpus: u32) -> Self {
        self.smp = cpus;
        self
    }

    /// Guest RAM in MiB (`-m`).
    pub fn memory_mib(mut self, mib: u32) -> Self {
        self.memory_mib = mib;
        self
    }

    /// Adds `-device spec`; devices keep the order they are added in.
    pub fn device(mut self, spec: &str) -> Self {
        self.devices.push(spec.to_string());
        self
    }

    /// The argv, starting with [`QEMU_BINARY`]; the serial console goes to
    /// stdout and a guest reboot ends QEMU.
    pub fn into_argv(self) -> Vec<String> {
        let mut v: Vec<String> = [
            QEMU_BINARY,
            "-enable-kvm",
            "-cpu",
            "host",
            "-M",
            "q35",
            "-smp",
            &self.smp.to_string(),
            "-m",
            &self.memory_mib.to_string(),
            "-nographic",
            "-nodefaults",
            "-no-reboot",
            "-serial",
            "stdio",
        ]
        .map(String::from)
        .to_vec();
        for d in self.devices {
            v.push("-device".into());
            v.push(d);
        }
        v.extend([
            "-append".into(),
            self.cmdline,
            "-kernel".into(),
            path_arg(&self.kernel),
            "-initrd".into(),
            path_arg(&self.initrd),
        ]);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_of_a_reference_boot_with_devices() {
        let argv = QemuCommand::new("/k/vmlinuz", "/i/initrd.gz", "console=ttyS0 quiet")
            .smp(1)
            .device("virtio-iommu-pci")
            .device("edu,dma_mask=0xffffffffffffffff")
            .into_argv();
        assert_eq!(
            argv.join(" "),
            "qemu-system-x86_64 -enable-kvm -cpu host -M q35 -smp 1 -m 512 \
             -nographic -nodefaults -no-reboot -serial stdio \
             -device virtio-iommu-pci -device edu,dma_mask=0xffffffffffffffff \
             -append console=ttyS0 quiet -kernel /k/vmlinuz -initrd /i/initrd.gz"
        );
        // the kernel command line stays one argument
        assert_eq!(argv.len(), 25, "{argv:?}");
        assert_eq!(argv[20], "console=ttyS0 quiet");
    }

    #[test]
    fn defaults_without_devices() {
        let argv = QemuCommand::new("/k", "/i", "c").into_argv();
        assert_eq!(
            argv.join(" "),
            "qemu-system-x86_64 -enable-kvm -cpu host -M q35 -smp 2 -m 512 \
             -nographic -nodefaults -no-reboot -serial stdio -append c -kernel /k -initrd /i"
        );
        let big = QemuCommand::new("/k", "/i", "c")
            .memory_mib(1024)
            .into_argv();
        assert!(big.join(" ").contains(" -m 1024 "), "{big:?}");
    }
}
