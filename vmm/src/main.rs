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
use vmm::{api, cli, event_monitor, panic_exit, sandbox, sandbox_rules, vm};

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

/// Serves the API (if asked) and boots the VM of the command line (if
/// any); the VM then runs on its own threads. The sandbox goes in first:
/// every thread starts inside it.
fn start(cli: &cli::Cli, vmm: &Arc<Controller>) -> Result<(), Error> {
    let config = cli.to_config()?;
    let socket = cli.api_socket()?;
    let options = cli.sandbox()?;
    virtio_iommu::barrier::prefer(cli.quiescer_barrier()?);
    if let Err(e) = confine(&options, config.as_ref(), socket.as_ref()) {
        eprintln!("dmavisor: error: {e}");
        std::process::exit(1);
    }
    if let Some(c) = config.clone() {
        vmm.reserve(c)?;
    }
    if let Some(s) = &socket {
        api::spawn(s, vmm.clone())?;
        vmm.set_serving_api(true);
    }
    if config.is_some() {
        vmm.boot_reserved()?;
    }
    Ok(())
}

/// no_new_privs, Landlock (if asked) and the seccomp mode of every thread
/// started from now on; the main thread itself is never filtered (it
/// tears VMs down and builds them again on a reboot, which needs the
/// calls of every thread kind).
fn confine(
    options: &cli::SandboxOptions,
    config: Option<&VmConfig>,
    socket: Option<&ApiSocket>,
) -> Result<(), SandboxError> {
    // The vIOMMU quiescer's barrier: membarrier's registration is a call
    // no thread filter allows, so it is made here, before any filter and
    // any VM exist; every quiescer of the process uses the choice.
    let _ = virtio_iommu::barrier::choose();
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

/// Opens `--event-monitor`'s stream before any thread starts (and before
/// Landlock, which may not allow its path): exit code and error if not.
fn open_event_monitor(cli: &cli::Cli) -> Result<(), (i32, String)> {
    let Some(target) = cli.event_monitor().map_err(|e| (2, e.to_string()))? else {
        return Ok(());
    };
    let file = target
        .open()
        .map_err(|e| (1, format!("--event-monitor {target:?}: {e}")))?;
    // main runs once: nothing was installed before.
    let _ = event_monitor::install(Box::new(file));
    Ok(())
}

fn main() {
    let cli = cli::Cli::parse();
    if cli.version {
        println!("{}", cli::version_line());
        return;
    }
    init_logging(cli.verbose);
    if let Err((code, e)) = open_event_monitor(&cli) {
        eprintln!("dmavisor: error: {e}");
        std::process::exit(code);
    }
    event_monitor::emit("vmm", "starting", &[]);
    panic_exit::install();
    let (exit_tx, exit_rx) = channel();
    let vmm = Arc::new(Controller::new(
        exit_tx,
        Box::new(|config, exit| Ok(vm::start(config, exit)?)),
    ));
    vmm.bound_exit_teardown();
    if let Err(e) = start(&cli, &vmm) {
        eprintln!("dmavisor: error: {e}");
        let code = if matches!(e.step_error(), Error::InvalidOption { .. }) {
            2
        } else {
            1
        };
        std::process::exit(code);
    }
    // The controller holds a sender: this waits for the events that end
    // a VM (torn down, then rebuilt or left created) or the VMM.
    let event = loop {
        let event = exit_rx
            .recv()
            .unwrap_or(ExitEvent::Error(Failure::ChannelClosed));
        if let Some(code) = vmm.on_exit(&event, || exit_rx.try_recv().ok()) {
            break (event, code);
        }
    };
    let (event, code) = event;
    event_monitor::emit("vmm", "shutdown", &[]);
    if code != 0 {
        eprintln!("dmavisor: {}", event.describe());
    }
    std::process::exit(code);
}
