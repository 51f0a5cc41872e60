//! [`VmResources`]: the handles every device needs to plug into a VM (KVM,
//! guest RAM, the buses, PCI bus 0, interrupts, the exit channel). A module
//! of its own so that the devices that take it need not import `crate::vm`,
//! which builds the VM out of them.

use std::sync::Arc;

use kvm_ioctls::VmFd;

use crate::devices::bus::Bus;
use crate::exit::ExitSender;
use crate::interrupt::GsiRouter;
use crate::memory::GuestMemoryMmap;
use crate::pci::PciRoot;

/// Shared handles devices need to plug in (PCI devices, interrupts, DMA).
#[derive(Clone)]
pub struct VmResources {
    /// The KVM VM.
    pub vm: Arc<VmFd>,
    /// Guest RAM.
    pub mem: GuestMemoryMmap,
    /// Port I/O bus.
    pub pio: Arc<Bus>,
    /// MMIO bus.
    pub mmio: Arc<Bus>,
    /// PCI bus 0.
    pub pci: Arc<PciRoot>,
    /// Exit channel.
    pub exit: ExitSender,
    /// The VM's GSI routing table (MSI routes for every device).
    pub irq_router: Arc<GsiRouter>,
}
