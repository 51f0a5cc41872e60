//! Command line (cloud-hypervisor's flags for the supported subset).

use std::path::PathBuf;

use clap::{ArgAction, Parser};

use crate::config::{ConsoleConfig, CpusConfig, MemoryConfig, SerialConfig, VmConfig};
use crate::error::Error;
use crate::virtio::iommu::IommuOptions;

/// dmavisor: boots a Linux kernel in a KVM virtual machine.
///
/// The guest's `poweroff` ends dmavisor with exit code 0; a guest reboot
/// also ends it with exit code 0. With --api-socket neither does: the VM
/// is torn down and dmavisor serves on (a reboot rebuilds it in place),
/// until vmm.shutdown (exit code 0). A guest
/// triple fault or a KVM failure ends it with exit code 1, bad options with 2,
/// a panic in any of its threads with 101.
///
/// With only --api-socket, dmavisor serves cloud-hypervisor's REST API and
/// waits for vm.create and vm.boot; the VM's flags need --kernel.
///
/// Needs a hardware-backed /dev/kvm (kvm_intel/kvm_amd); elsewhere run it
/// inside resources/run-kvm. DMAVISOR_KVM_DEVICE names another device node.
#[derive(Debug, Parser)]
#[command(name = "dmavisor", about, long_about, disable_version_flag = true)]
pub struct Cli {
    /// Prints the version line management stacks parse (libvirt's ch
    /// driver needs `cloud-hypervisor vNN...`), then exits.
    #[arg(short = 'V', long)]
    pub version: bool,

    /// Kernel to boot: a bzImage (e.g. Debian's vmlinuz, 64-bit Linux boot
    /// protocol) or an ELF vmlinux with a PVH entry note (boots faster: the
    /// guest skips decompression). Without it (and with --api-socket) the
    /// VM comes from the API's vm.create.
    #[arg(
        long,
        value_name = "PATH",
        required_unless_present_any = ["api_socket", "version"]
    )]
    pub kernel: Option<PathBuf>,

    /// Initramfs (cpio, optionally compressed) handed to the kernel.
    #[arg(long, value_name = "PATH", requires = "kernel")]
    pub initramfs: Option<PathBuf>,

    /// Kernel command line, e.g. "console=ttyS0 quiet".
    #[arg(long, value_name = "STRING", default_value = "", requires = "kernel")]
    pub cmdline: String,

    /// vCPUs: boot=N[,max=M] (1..=64; max is accepted, vCPU hotplug is not
    /// implemented).
    #[arg(
        long,
        value_name = "boot=N[,max=M]",
        default_value = "boot=1",
        requires = "kernel"
    )]
    pub cpus: String,

    /// Guest RAM: size=SIZE with K/M/G suffix (at least 64M), e.g. size=512M;
    /// thp=on|off backs it with transparent huge pages where the host allows
    /// (default on); shared=on backs it with a memfd a vhost-user back-end
    /// can map (needed by --net vhost_user=on).
    #[arg(
        long,
        value_name = "size=SIZE[,thp=on|off][,shared=on]",
        default_value = "size=512M",
        requires = "kernel"
    )]
    pub memory: String,

    /// COM1 (ttyS0): tty (stdout/stdin), pty (a new pseudo-terminal whose
    /// path is logged and shown by vm.info), file=PATH (output only),
    /// socket=PATH (a UNIX socket the VMM creates and listens on, one
    /// client at a time, the newest 64 KiB of output written while none is
    /// connected kept for the next; the path must not exist, and is
    /// removed with the VM) or off.
    #[arg(
        long,
        value_name = "tty|pty|file=PATH|socket=PATH|off",
        default_value = "tty",
        requires = "kernel"
    )]
    pub serial: String,

    /// virtio-console (hvc0): off (no device), null, tty (stdout/stdin; not
    /// with --serial tty), pty (a new pseudo-terminal, its path logged and
    /// shown by vm.info), file=PATH (output only) or socket=PATH (as
    /// --serial's); ,iommu=on puts it behind the vIOMMU (needs --iommu).
    #[arg(
        long,
        value_name = "off|null|tty|pty|file=PATH|socket=PATH[,iommu=on]",
        default_value = "off",
        requires = "kernel"
    )]
    pub console: String,

    /// virtio-net on a TAP (repeatable): tap=NAME,mac=MAC,ip=IPv4,mask=IPv4,
    /// num_queues=2N,queue_size=N,iommu=on|off. Or a vhost-user back-end's:
    /// vhost_user=on,socket=PATH[,vhost_mode=client|server][,mac=MAC]
    /// [,num_queues=2N][,queue_size=N][,iommu=on|off] (with --memory shared=on;
    /// vhost_mode=server: dmavisor listens on PATH).
    #[arg(
        long,
        value_name = "tap=NAME,...|vhost_user=on,...",
        requires = "kernel"
    )]
    pub net: Vec<String>,

    /// virtio-blk on a raw image (repeatable): path=PATH[,readonly=on|off]
    /// [,iommu=on|off][,num_queues=N][,queue_size=N][,id=NAME].
    #[arg(long, value_name = "path=PATH,...", requires = "kernel")]
    pub disk: Vec<String>,

    /// A virtio-iommu (with a VIOT table):
    /// [impl=scalable|baseline][,bypass=on|off][,queues=N][,requests=auto|inline|thread].
    /// requests=inline serves a request queue in the vCPU that kicked it,
    /// thread gives each queue a thread; auto (default) picks inline for one
    /// queue, threads for several. Devices opt in with iommu=on.
    #[arg(long, value_name = "impl=..,bypass=..", num_args = 0..=1, default_missing_value = "", requires = "kernel")]
    pub iommu: Option<String>,

    /// An edu-compatible DMA test device (repeatable): iommu=on|off.
    #[arg(long = "dma-test", value_name = "iommu=on|off", num_args = 0..=1, default_missing_value = "", requires = "kernel")]
    pub dma_test: Vec<String>,

    /// A host PCI function to assign through VFIO (repeatable):
    /// path=/sys/bus/pci/devices/<BDF>[,iommu=on|off][,id=NAME]. It must be
    /// bound to vfio-pci.
    #[arg(long = "device", value_name = "path=..", requires = "kernel")]
    pub devices: Vec<String>,

    /// cloud-hypervisor's REST API on a Unix socket: path=PATH or fd=N
    /// (an inherited listening socket). Alone, without --kernel: the VMM
    /// waits for vm.create and vm.boot.
    #[arg(long = "api-socket", value_name = "path=..|fd=..")]
    pub api_socket: Option<String>,

    /// cloud-hypervisor's JSON lifecycle events (vm booted, paused,
    /// shutdown, ...): path=FILE (a file, or a FIFO whose reader may come
    /// later) or fd=N (an inherited descriptor).
    #[arg(long = "event-monitor", value_name = "path=..|fd=..")]
    pub event_monitor: Option<String>,

    /// Per-thread seccomp filters: true (a forbidden system call ends the
    /// VMM, naming the thread and the call), log (the kernel logs it and
    /// lets it run) or false.
    #[arg(long, value_name = "true|false|log", default_value = crate::sandbox::DEFAULT_SECCOMP)]
    pub seccomp: String,

    /// Landlock: before the guest runs, the VMM keeps access only to the
    /// files its configuration names, the host devices it opens and
    /// --landlock-rules; paths handed to the API later must fall inside.
    #[arg(long)]
    pub landlock: bool,

    /// More paths the VMM may use under --landlock (repeatable):
    /// path=PATH,access=r|rw.
    #[arg(long = "landlock-rules", value_name = "path=..,access=r|rw", num_args = 1.., requires = "landlock")]
    pub landlock_rules: Vec<String>,

    /// The vIOMMU quiescer's barrier between device threads and UNMAPs:
    /// sticky (the default: a device thread pays a full fence only on its
    /// first DMA section after an UNMAP, and parks before it sleeps; a
    /// sync interrupts other CPUs only for a thread that did neither
    /// within 20 us), fence (a full fence per DMA section, the cost stays
    /// on the device thread) or membarrier (none per section; every sync
    /// interrupts each CPU running a VMM thread, vCPUs included: worth it
    /// only when syncs are rare, i.e. with batched invalidation). sticky
    /// and membarrier fall back to fence where the kernel lacks
    /// membarrier.
    #[arg(
        long = "quiescer-barrier",
        value_name = "sticky|fence|membarrier",
        default_value = "sticky"
    )]
    pub quiescer_barrier: String,

    /// More logging on stderr (-v info, -vv debug, -vvv trace). RUST_LOG overrides.
    #[arg(short = 'v', action = ArgAction::Count)]
    pub verbose: u8,
}

/// `--seccomp`, `--landlock` and `--landlock-rules`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxOptions {
    /// What a thread's filter does with a call outside its list.
    pub seccomp: crate::sandbox::SeccompMode,
    /// Whether to restrict the VMM's file access with Landlock.
    pub landlock: bool,
    /// Paths allowed beyond the configuration's.
    pub landlock_rules: Vec<crate::sandbox::LandlockRule>,
}

impl Cli {
    /// `--console` (and its `iommu=`), checked against `--serial`.
    fn console_config(&self) -> Result<(ConsoleConfig, bool), Error> {
        let (console, iommu) = ConsoleConfig::parse_with_iommu(&self.console)?;
        console
            .check_with(&SerialConfig::parse(&self.serial)?)
            .map_err(|reason| Error::InvalidOption {
                option: "console",
                value: self.console.clone(),
                reason: reason.into(),
            })?;
        Ok((console, iommu))
    }

    /// Turns the raw flags into a validated configuration: `None` when no
    /// VM is given (no `--kernel`: the API creates it).
    pub fn to_config(&self) -> Result<Option<VmConfig>, Error> {
        let Some(kernel) = &self.kernel else {
            return Ok(None);
        };
        let (console, console_iommu) = self.console_config()?;
        Ok(Some(VmConfig {
            kernel: kernel.clone(),
            initramfs: self.initramfs.clone(),
            cmdline: self.cmdline.clone(),
            cpus: CpusConfig::parse(&self.cpus)?,
            memory: MemoryConfig::parse(&self.memory)?,
            serial: SerialConfig::parse(&self.serial)?,
            console,
            console_iommu,
            net: self
                .net
                .iter()
                .map(|n| crate::net::NetConfig::parse(n))
                .collect::<Result<_, _>>()?,
            disks: self
                .disk
                .iter()
                .map(|d| crate::block::DiskConfig::parse(d))
                .collect::<Result<_, _>>()?,
            iommu: self.iommu.as_deref().map(IommuOptions::parse).transpose()?,
            dma_test: self
                .dma_test
                .iter()
                .map(|d| crate::dma_test::DmaTestConfig::parse(d))
                .collect::<Result<_, _>>()?,
            devices: self
                .devices
                .iter()
                .map(|d| crate::vfio::VfioConfig::parse(d))
                .collect::<Result<_, _>>()?,
        }))
    }

    /// The sandbox the flags ask for.
    pub fn sandbox(&self) -> Result<SandboxOptions, Error> {
        Ok(SandboxOptions {
            seccomp: crate::sandbox::SeccompMode::parse(&self.seccomp)?,
            landlock: self.landlock,
            landlock_rules: self
                .landlock_rules
                .iter()
                .map(|r| crate::sandbox::LandlockRule::parse(r))
                .collect::<Result<_, _>>()?,
        })
    }

    /// The quiescer's barrier `--quiescer-barrier` asks for.
    pub fn quiescer_barrier(&self) -> Result<virtio_iommu::barrier::BarrierKind, Error> {
        use virtio_iommu::barrier::BarrierKind;
        match self.quiescer_barrier.as_str() {
            "sticky" => Ok(BarrierKind::Sticky),
            "fence" => Ok(BarrierKind::Fence),
            "membarrier" => Ok(BarrierKind::Membarrier),
            other => Err(Error::InvalidOption {
                option: "quiescer-barrier",
                value: other.to_string(),
                reason: "expected sticky, fence or membarrier".into(),
            }),
        }
    }

    /// Where lifecycle events go (`--event-monitor`), if anywhere.
    pub fn event_monitor(&self) -> Result<Option<crate::event_monitor::EventMonitorTarget>, Error> {
        self.event_monitor
            .as_deref()
            .map(crate::event_monitor::EventMonitorTarget::parse)
            .transpose()
    }

    /// Where the REST API listens (`--api-socket`), if anywhere.
    pub fn api_socket(&self) -> Result<Option<crate::api_socket::ApiSocket>, Error> {
        self.api_socket
            .as_deref()
            .map(crate::api_socket::ApiSocket::parse)
            .transpose()
    }
}

/// The cloud-hypervisor release whose REST API (endpoints, `VmConfig`
/// fields, event stream) dmavisor implements, the subset its README lists.
pub const CLOUD_HYPERVISOR_API: (u32, u32) = (53, 0);

/// `--version`'s line. WHY it starts as cloud-hypervisor's does: libvirt's
/// ch driver takes what follows `cloud-hypervisor ` (after the last `/`
/// of the whole output, a leading `v` and up to the first `-`) as
/// `major.minor.micro` and refuses releases it does not support; so the
/// line names the API level, and holds no `/`.
pub fn version_line() -> String {
    let (major, minor) = CLOUD_HYPERVISOR_API;
    format!(
        "cloud-hypervisor v{major}.{minor}.0 (dmavisor {}, API of cloud-hypervisor v{major})",
        env!("CARGO_PKG_VERSION")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libvirt's reading of `--version` (src/ch/ch_conf.c), restated:
    /// the version it finds, or `None` where it reports an error.
    fn libvirt_version(output: &str) -> Option<(u32, u32, u32)> {
        let rest = output.strip_prefix("cloud-hypervisor ")?;
        let rest = rest.rsplit('/').next()?;
        let rest = rest.strip_prefix('v').unwrap_or(rest);
        let rest = rest.split('-').next()?;
        let mut parts = rest.splitn(3, '.');
        let num = |s: Option<&str>| -> Option<u32> {
            let s = s?;
            let digits: String = s.chars().take_while(|c| c.is_ascii_digit()).collect();
            digits.parse().ok()
        };
        let major = num(parts.next())?;
        let minor = num(parts.next()).unwrap_or(0);
        let micro = num(parts.next()).unwrap_or(0);
        Some((major, minor, micro))
    }

    #[test]
    fn version_line_is_one_libvirt_accepts() {
        let line = version_line();
        let (major, minor, _) = libvirt_version(&format!("{line}\n")).expect("parsed");
        assert_eq!((major, minor), CLOUD_HYPERVISOR_API);
        // libvirt's ch driver needs v28 or later for what it sends.
        assert!(major >= 28, "{line}");
        assert!(line.contains("dmavisor"), "{line}");
        // The parser restated finds a '/' anywhere in the output.
        assert_eq!(libvirt_version("cloud-hypervisor v40.0 (a/b)"), None);
        let cli = Cli::try_parse_from(["dmavisor", "--version"]).expect("alone");
        assert!(cli.version && cli.kernel.is_none());
    }

    #[test]
    fn event_monitor_flag() {
        use crate::event_monitor::EventMonitorTarget;
        let cli = Cli::try_parse_from([
            "dmavisor",
            "--api-socket",
            "fd=3",
            "--event-monitor",
            "path=/run/ev.fifo",
        ])
        .unwrap();
        assert_eq!(
            cli.event_monitor().unwrap(),
            Some(EventMonitorTarget::Path("/run/ev.fifo".into()))
        );
        let cli =
            Cli::try_parse_from(["dmavisor", "--kernel", "/k", "--event-monitor", "x=1"]).unwrap();
        assert!(cli.event_monitor().is_err());
    }

    #[test]
    fn full_command_line() {
        let cli = Cli::try_parse_from([
            "dmavisor",
            "--kernel",
            "/k",
            "--initramfs",
            "/i",
            "--cmdline",
            "console=ttyS0",
            "--cpus",
            "boot=2",
            "--memory",
            "size=1G",
            "--serial",
            "off",
            "-vv",
        ])
        .unwrap();
        let c = cli.to_config().unwrap().unwrap();
        assert_eq!(c.cpus.boot, 2);
        assert_eq!(c.memory.size, 1 << 30);
        assert_eq!(c.serial, SerialConfig::Off);
        assert_eq!(c.cmdline, "console=ttyS0");
        assert_eq!(cli.verbose, 2);
    }

    #[test]
    fn defaults() {
        let c = Cli::try_parse_from(["dmavisor", "--kernel", "/k"])
            .unwrap()
            .to_config()
            .unwrap()
            .unwrap();
        assert_eq!(c.cpus.boot, 1);
        assert_eq!(c.memory.size, 512 << 20);
        assert_eq!(c.serial, SerialConfig::Tty);
        assert_eq!(c.console, ConsoleConfig::Off, "no device moves PCI slots");
        assert!(c.initramfs.is_none());
    }

    #[test]
    fn console_flag_and_its_conflict_with_the_serial_tty() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["dmavisor", "--kernel", "/k"];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(&argv).unwrap().to_config()
        };
        let c = parse(&["--console", "pty"]).unwrap().unwrap();
        assert_eq!(
            (c.console, c.serial),
            (ConsoleConfig::Pty(None), SerialConfig::Tty)
        );
        let e = parse(&["--console", "tty"]).unwrap_err().to_string();
        assert!(e.contains("both on tty"), "{e}");
        let c = parse(&["--console", "tty", "--serial", "pty"])
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.console, c.serial),
            (ConsoleConfig::Tty, SerialConfig::Pty(None))
        );
        let c = parse(&[
            "--console",
            "socket=build/c.sock",
            "--serial",
            "socket=build/s.sock",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (c.console, c.serial),
            (
                ConsoleConfig::Socket("build/c.sock".into()),
                SerialConfig::Socket("build/s.sock".into())
            )
        );
        let c = parse(&["--console", "pty,iommu=on", "--serial", "off"])
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.console, c.console_iommu),
            (ConsoleConfig::Pty(None), true)
        );
        let c = parse(&["--console", "socket=/c,iommu=off"])
            .unwrap()
            .unwrap();
        assert_eq!(
            (c.console, c.console_iommu),
            (ConsoleConfig::Socket("/c".into()), false)
        );
        for bad in [
            &["--console", "pty,iommu=yes"][..],
            &["--console", "off,iommu=on"],
            &["--serial", "pty,iommu=on"],
            &["--serial", "socket="],
            &["--console", "socket="],
            &["--serial", "unix=/s"],
            &["--console", "socket=/s", "--serial", "socket=/s"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn iommu_and_dma_test_flags() {
        let c = Cli::try_parse_from([
            "dmavisor",
            "--kernel",
            "/k",
            "--iommu",
            "--dma-test",
            "iommu=on",
            "--dma-test",
        ])
        .unwrap()
        .to_config()
        .unwrap()
        .unwrap();
        assert_eq!(c.iommu, Some(Default::default()));
        assert_eq!(c.dma_test.len(), 2);
        assert!(c.dma_test[0].iommu && !c.dma_test[1].iommu);
        let c = Cli::try_parse_from(["dmavisor", "--kernel", "/k", "--iommu", "impl=baseline"])
            .unwrap()
            .to_config()
            .unwrap()
            .unwrap();
        assert_eq!(
            c.iommu.unwrap().space_impl,
            virtio_iommu::mapping::SpaceImpl::Baseline
        );
        let none = Cli::try_parse_from(["dmavisor", "--kernel", "/k"])
            .unwrap()
            .to_config()
            .unwrap()
            .unwrap();
        assert!(none.iommu.is_none() && none.dma_test.is_empty());
    }

    #[test]
    fn disks_repeat() {
        let c = Cli::try_parse_from([
            "dmavisor",
            "--kernel",
            "/k",
            "--disk",
            "path=/a.raw,readonly=on",
            "--disk",
            "path=/b.raw,iommu=on,num_queues=2,id=data",
        ])
        .unwrap()
        .to_config()
        .unwrap()
        .unwrap();
        assert_eq!(c.disks.len(), 2);
        assert!(c.disks[0].readonly && !c.disks[0].iommu);
        assert_eq!(c.disks[1].id.as_deref(), Some("data"));
        assert!(
            Cli::try_parse_from(["dmavisor", "--kernel", "/k", "--disk", "readonly=on"])
                .unwrap()
                .to_config()
                .is_err()
        );
    }

    #[test]
    fn quiescer_barrier_flag() {
        use virtio_iommu::barrier::BarrierKind;
        let parse = |extra: &[&str]| {
            let mut args = vec!["dmavisor", "--kernel", "/k"];
            args.extend_from_slice(extra);
            Cli::try_parse_from(args).unwrap().quiescer_barrier()
        };
        assert_eq!(parse(&[]).unwrap(), BarrierKind::Sticky);
        assert_eq!(
            parse(&["--quiescer-barrier", "sticky"]).unwrap(),
            BarrierKind::Sticky
        );
        assert_eq!(
            parse(&["--quiescer-barrier", "membarrier"]).unwrap(),
            BarrierKind::Membarrier
        );
        assert_eq!(
            parse(&["--quiescer-barrier", "fence"]).unwrap(),
            BarrierKind::Fence
        );
        assert!(parse(&["--quiescer-barrier", "rcu"]).is_err());
    }

    #[test]
    fn sandbox_flags() {
        use crate::sandbox::{LandlockAccess, LandlockRule, SeccompMode};
        let cli = Cli::try_parse_from([
            "dmavisor",
            "--kernel",
            "/k",
            "--seccomp",
            "log",
            "--landlock",
            "--landlock-rules",
            "path=/a,access=r",
            "path=/b,access=rw",
        ])
        .unwrap();
        let s = cli.sandbox().unwrap();
        assert_eq!(s.seccomp, SeccompMode::Log);
        assert!(s.landlock);
        assert_eq!(
            s.landlock_rules,
            vec![
                LandlockRule::new("/a", LandlockAccess::Read),
                LandlockRule::new("/b", LandlockAccess::ReadWrite)
            ]
        );
        let default = Cli::try_parse_from(["dmavisor", "--kernel", "/k"]).unwrap();
        let d = default.sandbox().unwrap();
        assert!(!d.landlock && d.landlock_rules.is_empty());
        let bad = Cli::try_parse_from(["dmavisor", "--kernel", "/k", "--seccomp", "on"]).unwrap();
        assert!(bad.sandbox().is_err());
        // Rules without --landlock would silently do nothing.
        assert!(Cli::try_parse_from([
            "dmavisor",
            "--kernel",
            "/k",
            "--landlock-rules",
            "path=/a,access=r"
        ])
        .is_err());
    }

    #[test]
    fn kernel_is_required() {
        assert!(Cli::try_parse_from(["dmavisor"]).is_err());
    }

    #[test]
    fn api_socket_alone_waits_for_vm_create() {
        let cli = Cli::try_parse_from(["dmavisor", "--api-socket", "path=/run/a.sock"]).unwrap();
        assert!(cli.to_config().unwrap().is_none());
        assert_eq!(
            cli.api_socket().unwrap(),
            Some(crate::api_socket::ApiSocket::Path("/run/a.sock".into()))
        );
        let cli = Cli::try_parse_from(["dmavisor", "--api-socket", "fd=3", "-v"]).unwrap();
        assert!(cli.to_config().unwrap().is_none());
        // The VM's flags belong with --kernel.
        for flag in [
            &["--cpus", "boot=2"][..],
            &["--memory", "size=1G"],
            &["--serial", "off"],
            &["--console", "pty"],
            &["--initramfs", "/i"],
            &["--cmdline", "x"],
            &["--net", "tap=t0"],
            &["--disk", "path=/d"],
            &["--iommu"],
            &["--dma-test"],
            &["--device", "path=/x"],
        ] {
            let mut argv = vec!["dmavisor", "--api-socket", "path=/a"];
            argv.extend_from_slice(flag);
            assert!(Cli::try_parse_from(&argv).is_err(), "{flag:?}");
        }
        let cli = Cli::try_parse_from(["dmavisor", "--kernel", "/k"]).unwrap();
        assert_eq!(cli.api_socket().unwrap(), None);
        assert!(Cli::try_parse_from(["dmavisor", "--api-socket", "a=b"])
            .unwrap()
            .api_socket()
            .is_err());
    }
}
