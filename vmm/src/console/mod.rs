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
use crate::virtio::iommu::IommuPlatform;
use crate::virtio::plug::plug_virtio_pci;

/// Plugs the virtio-console `config` asks for into bus 0 (none for
/// `Off`), behind the vIOMMU `iommu` when `behind_iommu` (cloud-
/// hypervisor's `console.iommu`); returns the slave path of its pty, if
/// it has one. WHY the plug flag is all it takes: its worker touches
/// guest memory only inside `ThreadDma` sections of the DMA space the
/// transport gives it (a translating one behind the vIOMMU), so an UNMAP
/// waits for a section in progress and a later access fails translation
/// (`tests::behind_the_viommu_an_unmap_completes_and_the_buffer_is_not_written`).
pub fn add_console(
    res: &VmResources,
    config: &ConsoleConfig,
    behind_iommu: bool,
    iommu: Option<&mut IommuPlatform>,
) -> Result<Option<PathBuf>, Error> {
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
        behind_iommu,
        "console",
        iommu,
    )?;
    Ok(pty)
}

#[cfg(test)]
mod tests;
