//! dmavisor: a KVM virtual machine monitor whose virtual IOMMU keeps guest
//! DMA protection cheap.

use clap::Parser;

use vmm::api::ApiSocket;
use vmm::error::Error;
use vmm::exit::ExitEvent;
use vmm::{api, cli, panic_exit, reboot, vm};

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

fn main() {
    // Before anything opens a descriptor or starts a thread.
    reboot::record_startup_fds();
    let inherited_api = reboot::take_inherited_api_fd();
    let cli = cli::Cli::parse();
    init_logging(cli.verbose);
    panic_exit::install();
    let result = cli.to_config().and_then(|mut config| {
        // A rebooted image serves the socket its predecessor listened on.
        if let (Some(fd), Some(_)) = (inherited_api, &config.api_socket) {
            config.api_socket = Some(ApiSocket::Fd(fd));
        }
        vm::run(&config)
    });
    match result {
        Ok(ExitEvent::ApiReboot) => {
            let e = reboot::reexec(api::listener_fd());
            eprintln!("dmavisor: error: {e}");
            std::process::exit(1);
        }
        Ok(event) => {
            let code = event.exit_code();
            if code != 0 {
                eprintln!("dmavisor: {}", event.describe());
            }
            std::process::exit(code);
        }
        Err(e) => {
            eprintln!("dmavisor: error: {e}");
            let code = if matches!(e, Error::InvalidOption { .. }) {
                2
            } else {
                1
            };
            std::process::exit(code);
        }
    }
}
