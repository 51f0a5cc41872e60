//! dmavisor: a KVM virtual machine monitor whose virtual IOMMU keeps guest
//! DMA protection cheap.

use std::sync::mpsc::channel;
use std::sync::Arc;

use clap::Parser;

use vmm::api::controller::Controller;
use vmm::api::ApiSocket;
use vmm::config::VmConfig;
use vmm::error::Error;
use vmm::exit::{ExitEvent, Failure};
use vmm::sandbox::SandboxError;
use vmm::{api, cli, panic_exit, reboot, sandbox, sandbox_rules, vm};

fn init_logging(verbosity: u8) {
    let default = match verbosity {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(default))
        .format_timestamp_millis()
        .init();
}

/// What a rebooted image inherits from the one before it.
struct Inherited {
    api_fd: Option<std::os::fd::RawFd>,
    config: Option<String>,
}

/// Serves the API (if asked) and boots the VM of the command line or of
/// the reboot hand-over (if any); the VM then runs on its own threads.
/// The sandbox goes in first: every thread starts inside it.
fn start(cli: &cli::Cli, vmm: &Arc<Controller>, inherited: Inherited) -> Result<(), Error> {
    // A handed-over configuration is the VM as it ran (created through
    // the API, or changed by hotplug since the command line built it).
    let config = match inherited.config {
        Some(json) => Some(
            api::vm_config::parse(json.as_bytes()).map_err(|e| Error::HandedOver(Box::new(e)))?,
        ),
        None => cli.to_config()?,
    };
    let mut socket = cli.api_socket()?;
    // A rebooted image serves the socket its predecessor listened on.
    if let (Some(fd), Some(_)) = (inherited.api_fd, &socket) {
        socket = Some(ApiSocket::Fd(fd));
    }
    let options = cli.sandbox()?;
    if let Err(e) = confine(&options, config.as_ref(), socket.as_ref()) {
        eprintln!("dmavisor: error: {e}");
        std::process::exit(1);
    }
    if let Some(c) = config.clone() {
        vmm.reserve(c)?;
    }
    if let Some(s) = &socket {
        api::spawn(s, vmm.clone())?;
    }
    if config.is_some() {
        vmm.boot_reserved()?;
    }
    Ok(())
}

/// no_new_privs, Landlock (if asked) and the seccomp mode of every thread
/// started from now on; the main thread itself is never filtered (it
/// re-executes the binary on `vm.reboot`, and a filter survives `execve`).
fn confine(
    options: &cli::SandboxOptions,
    config: Option<&VmConfig>,
    socket: Option<&ApiSocket>,
) -> Result<(), SandboxError> {
    sandbox::set_no_new_privs()?;
    if options.landlock {
        let mut rules = options.landlock_rules.clone();
        rules.extend(config.map(sandbox_rules::config_rules).unwrap_or_default());
        rules.extend(sandbox_rules::api_socket_rules(socket));
        sandbox::landlock::restrict(&rules, &sandbox_rules::host_rules())?;
    }
    sandbox::seccomp::set_mode(options.seccomp)?;
    sandbox::seccomp::start_probes();
    Ok(())
}

fn main() {
    // Before anything opens a descriptor or starts a thread.
    reboot::record_startup_fds();
    let inherited = Inherited {
        api_fd: reboot::take_inherited_api_fd(),
        config: reboot::take_inherited_config(),
    };
    let cli = cli::Cli::parse();
    init_logging(cli.verbose);
    panic_exit::install();
    let (exit_tx, exit_rx) = channel();
    let vmm = Arc::new(Controller::new(
        exit_tx,
        Box::new(|config, exit| Ok(vm::start(config, exit)?)),
    ));
    if let Err(e) = start(&cli, &vmm, inherited) {
        eprintln!("dmavisor: error: {e}");
        let code = if matches!(e.step_error(), Error::InvalidOption { .. }) {
            2
        } else {
            1
        };
        std::process::exit(code);
    }
    // The controller holds a sender: this waits until something ends the VMM.
    let event = exit_rx
        .recv()
        .unwrap_or(ExitEvent::Error(Failure::ChannelClosed));
    vmm.finish(&event);
    if event == ExitEvent::ApiReboot {
        // A VM created through the API is not in the arguments, and one
        // whose devices were hotplugged is no longer what they say.
        let from_cli = cli
            .to_config()
            .ok()
            .flatten()
            .map(|c| api::vm_config::to_json(&c).to_string());
        let handover = vmm
            .config_json()
            .filter(|now| Some(now) != from_cli.as_ref());
        let e = reboot::reexec(api::listener_fd(), handover.as_deref());
        eprintln!("dmavisor: error: {e}");
        std::process::exit(1);
    }
    let code = event.exit_code();
    if code != 0 {
        eprintln!("dmavisor: {}", event.describe());
    }
    std::process::exit(code);
}
