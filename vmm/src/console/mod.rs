//! The virtio-console (virtio 1.2, 5.3): one port, no MULTIPORT, receiveq
//! 0 and transmitq 1. What libvirt's ch driver attaches `<console>` to and
//! `virsh console` opens (through its `Pty` back-end).

mod backend;
mod device;
mod worker;

pub use backend::{open_backend, Backend};
pub use device::Console;

use std::path::PathBuf;

use crate::config::ConsoleConfig;
use crate::error::Error;
use crate::resources::VmResources;
use crate::virtio::plug::plug_virtio_pci;

/// Plugs the virtio-console `config` asks for into bus 0 (none for
/// `Off`); returns the slave path of its pty, if it has one. Its workers
/// go through `ThreadDma` sections like every device's, so putting it
/// behind the vIOMMU is a matter of the plug flag (not offered yet: CH's
/// `console.iommu` is not read).
pub fn add_console(res: &VmResources, config: &ConsoleConfig) -> Result<Option<PathBuf>, Error> {
    let Some(backend) = open_backend(config).map_err(|source| Error::Os {
        what: "virtio-console back-end",
        source,
    })?
    else {
        return Ok(None);
    };
    let pty = backend.pty_path.clone();
    plug_virtio_pci(
        res,
        Box::new(Console::new(backend)),
        "virtio-console",
        false,
        "console",
        None,
    )?;
    Ok(pty)
}

#[cfg(test)]
mod tests;
