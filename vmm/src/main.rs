//! dmavisor: a KVM virtual machine monitor whose virtual IOMMU keeps guest
//! DMA protection cheap.

use clap::Parser;

use vmm::error::Error;
use vmm::{cli, panic_exit, vm};

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
    let cli = cli::Cli::parse();
    init_logging(cli.verbose);
    panic_exit::install();
    let result = cli.to_config().and_then(|config| vm::run(&config));
    match result {
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
