//! Platform devices and the address-range buses that dispatch guest accesses.

pub mod bus;
pub mod dma_copy;
pub mod dma_stream;
pub mod ged;
pub mod pci_hotplug;
pub mod power;
pub mod pty;
pub mod serial;
pub mod socket_console;
