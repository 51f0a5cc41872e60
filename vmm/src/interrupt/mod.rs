//! MSI delivery through KVM: GSI routing + irqfd.
//!
//! WHY one router per VM: `KVM_SET_GSI_ROUTING` replaces the *whole*
//! routing table, including the default PIC/IOAPIC routes that
//! `KVM_CREATE_IRQCHIP` installed (the serial port's irqfd on GSI 4 relies
//! on them). So every device's MSI routes, plus those defaults, are kept in
//! one table here, and every change re-installs all of it.
//!
//! A device gets [`MsiVector`]s: a GSI of its own and an eventfd registered
//! as that GSI's irqfd. Writing the eventfd (from a device thread) injects
//! the MSI in the kernel, without a VMM lock on the path.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kvm_bindings::{
    kvm_irq_routing_entry, KvmIrqRouting, KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE, KVM_IRQ_ROUTING_IRQCHIP, KVM_IRQ_ROUTING_MSI,
};
use kvm_ioctls::VmFd;
use thiserror::Error;
use virtio_iommu::locks::Unpoison;
use vm_allocator::IdAllocator;
use vmm_sys_util::eventfd::EventFd;

/// GSIs 0..24 are the IOAPIC pins; MSI routes are allocated above them.
pub const FIRST_MSI_GSI: u32 = 24;
/// Upper bound on GSIs we hand out (KVM allows 4096 routes on x86).
pub const MAX_GSI: u32 = 4095;
const IOAPIC_PINS: u32 = 24;
// The MSI GSI range is not empty (what `IdAllocator::new` checks).
const _: () = assert!(FIRST_MSI_GSI <= MAX_GSI);
const PIC_PINS: u32 = 16;

/// Errors while setting up interrupts.
#[derive(Debug, Error)]
pub enum InterruptError {
    /// All GSIs are in use.
    #[error("no free GSI for an MSI route")]
    NoGsi,
    /// A KVM ioctl failed.
    #[error("KVM {what}: {source}")]
    Kvm {
        /// The operation.
        what: &'static str,
        /// errno.
        source: kvm_ioctls::Error,
    },
    /// Creating an eventfd failed.
    #[error("eventfd: {0}")]
    EventFd(std::io::Error),
    /// The routing table could not be built.
    #[error("routing table of {0} entries cannot be allocated")]
    Table(usize),
}

/// An MSI message as programmed by the guest (MSI-X table entry).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsiMessage {
    /// Message address (64-bit).
    pub addr: u64,
    /// Message data.
    pub data: u32,
}

struct RouterState {
    /// The MSI GSIs (`FIRST_MSI_GSI..=MAX_GSI`): `vm-allocator` hands out
    /// the lowest free one, so a GSI a dropped [`MsiVector`] released
    /// (a removed or re-assigned device's) is used again. `None` only if
    /// the range were empty, which the assertion above rules out.
    gsis: Option<IdAllocator>,
    /// GSI -> its MSI message, for vectors that currently have a route.
    routes: BTreeMap<u32, MsiMessage>,
}

impl RouterState {
    fn new(first: u32, last: u32) -> Self {
        Self {
            gsis: IdAllocator::new(first, last).ok(),
            routes: BTreeMap::new(),
        }
    }

    /// A free GSI, or [`InterruptError::NoGsi`] when all are in use.
    fn allocate_gsi(&mut self) -> Result<u32, InterruptError> {
        self.gsis
            .as_mut()
            .ok_or(InterruptError::NoGsi)?
            .allocate_id()
            .map_err(|_| InterruptError::NoGsi)
    }

    /// Returns `gsi` for reuse; one not handed out (a bookkeeping bug,
    /// not guest-reachable) is logged.
    fn free_gsi(&mut self, gsi: u32) {
        let freed = self.gsis.as_mut().map(|a| a.free_id(gsi));
        if let Some(Err(e)) = freed {
            log::warn!("releasing GSI {gsi}: {e}");
        }
    }
}

/// The VM's GSI routing table (see the module doc).
pub struct GsiRouter {
    vm: Arc<VmFd>,
    state: Mutex<RouterState>,
}

fn irqchip_entry(gsi: u32, chip: u32, pin: u32) -> kvm_irq_routing_entry {
    let mut e = kvm_irq_routing_entry {
        gsi,
        type_: KVM_IRQ_ROUTING_IRQCHIP,
        ..Default::default()
    };
    e.u.irqchip.irqchip = chip;
    e.u.irqchip.pin = pin;
    e
}

fn msi_entry(gsi: u32, msg: MsiMessage) -> kvm_irq_routing_entry {
    let mut e = kvm_irq_routing_entry {
        gsi,
        type_: KVM_IRQ_ROUTING_MSI,
        ..Default::default()
    };
    e.u.msi.address_lo = (msg.addr & 0xffff_ffff) as u32;
    e.u.msi.address_hi = (msg.addr >> 32) as u32;
    e.u.msi.data = msg.data;
    e
}

/// The full table: the irqchip defaults (PIC pins 0..16 and IOAPIC pins
/// 0..24 on the GSI of the same number, as KVM sets up) plus `routes`.
pub fn routing_entries(routes: &BTreeMap<u32, MsiMessage>) -> Vec<kvm_irq_routing_entry> {
    let mut v = Vec::with_capacity((PIC_PINS + IOAPIC_PINS) as usize + routes.len());
    for gsi in 0..IOAPIC_PINS {
        if gsi < PIC_PINS {
            let (chip, pin) = if gsi < 8 {
                (KVM_IRQCHIP_PIC_MASTER, gsi)
            } else {
                (KVM_IRQCHIP_PIC_SLAVE, gsi - 8)
            };
            v.push(irqchip_entry(gsi, chip, pin));
        }
        v.push(irqchip_entry(gsi, KVM_IRQCHIP_IOAPIC, gsi));
    }
    v.extend(routes.iter().map(|(gsi, msg)| msi_entry(*gsi, *msg)));
    v
}

impl GsiRouter {
    /// A router for `vm` (which must already have its in-kernel irqchip).
    pub fn new(vm: Arc<VmFd>) -> Self {
        Self {
            vm,
            state: Mutex::new(RouterState::new(FIRST_MSI_GSI, MAX_GSI)),
        }
    }

    fn allocate_gsi(&self) -> Result<u32, InterruptError> {
        self.state.lock().unpoisoned().allocate_gsi()
    }

    fn commit(&self, st: &RouterState) -> Result<(), InterruptError> {
        let entries = routing_entries(&st.routes);
        let table = KvmIrqRouting::from_entries(&entries)
            .map_err(|_| InterruptError::Table(entries.len()))?;
        self.vm
            .set_gsi_routing(&table)
            .map_err(|source| InterruptError::Kvm {
                what: "KVM_SET_GSI_ROUTING",
                source,
            })
    }

    /// Routes `gsi` to `msg` (or removes its route for `None`) and installs
    /// the table if anything changed.
    pub fn set_route(&self, gsi: u32, msg: Option<MsiMessage>) -> Result<(), InterruptError> {
        let mut st = self.state.lock().unpoisoned();
        let changed = match msg {
            Some(m) => st.routes.insert(gsi, m) != Some(m),
            None => st.routes.remove(&gsi).is_some(),
        };
        if changed {
            self.commit(&st)?;
        }
        Ok(())
    }

    fn release(&self, gsi: u32) {
        let mut st = self.state.lock().unpoisoned();
        if st.routes.remove(&gsi).is_some() {
            if let Err(e) = self.commit(&st) {
                log::warn!("removing MSI route of GSI {gsi}: {e}");
            }
        }
        st.free_gsi(gsi);
    }

    /// A new vector: a free GSI with an irqfd, not routed yet.
    pub fn new_vector(self: &Arc<Self>) -> Result<MsiVector, InterruptError> {
        let gsi = self.allocate_gsi()?;
        let evt = match EventFd::new(libc::EFD_NONBLOCK) {
            Ok(e) => e,
            Err(e) => {
                self.release(gsi);
                return Err(InterruptError::EventFd(e));
            }
        };
        if let Err(source) = self.vm.register_irqfd(&evt, gsi) {
            self.release(gsi);
            return Err(InterruptError::Kvm {
                what: "KVM_IRQFD",
                source,
            });
        }
        Ok(MsiVector {
            router: self.clone(),
            gsi,
            evt,
            routed: None,
            attached: true,
        })
    }
}

/// One MSI vector of a device: its GSI and irqfd.
pub struct MsiVector {
    router: Arc<GsiRouter>,
    gsi: u32,
    evt: EventFd,
    routed: Option<MsiMessage>,
    /// The eventfd is KVM's irqfd for the GSI (false while masked).
    attached: bool,
}

impl MsiVector {
    /// The GSI this vector injects.
    pub fn gsi(&self) -> u32 {
        self.gsi
    }

    /// Points the vector at `msg` (no ioctl if unchanged).
    pub fn route(&mut self, msg: MsiMessage) -> Result<(), InterruptError> {
        if self.routed == Some(msg) {
            return Ok(());
        }
        self.router.set_route(self.gsi, Some(msg))?;
        self.routed = Some(msg);
        Ok(())
    }

    /// Injects the interrupt (non-blocking).
    pub fn trigger(&self) {
        if let Err(e) = self.evt.write(1) {
            log::debug!("MSI on GSI {}: {e}", self.gsi);
        }
    }

    /// Masks or unmasks the vector at its source. WHY the irqfd and not
    /// the route: an assigned function signals the eventfd from the host
    /// kernel, past any check of the VMM's, and an irqfd on a GSI without
    /// a route still consumes the signal (lost: no pending bit could be
    /// set). Detached, the eventfd only counts, and
    /// [`Self::take_signals`] turns the count into the pending bit.
    pub fn set_masked(&mut self, masked: bool) -> Result<(), InterruptError> {
        if masked != self.attached {
            return Ok(());
        }
        let r = if masked {
            self.router.vm.unregister_irqfd(&self.evt, self.gsi)
        } else {
            self.router.vm.register_irqfd(&self.evt, self.gsi)
        };
        r.map_err(|source| InterruptError::Kvm {
            what: "KVM_IRQFD",
            source,
        })?;
        self.attached = !masked;
        Ok(())
    }

    /// Whether the eventfd was signalled since the last call, consuming
    /// the count. Only meaningful while masked (attached, KVM consumes
    /// the signals itself).
    pub fn take_signals(&self) -> bool {
        !self.attached && self.evt.read().is_ok_and(|n| n > 0)
    }

    /// Another handle to the irqfd, for a thread that triggers it.
    pub fn try_clone_eventfd(&self) -> std::io::Result<EventFd> {
        self.evt.try_clone()
    }
}

impl Drop for MsiVector {
    fn drop(&mut self) {
        if !self.attached {
            self.router.release(self.gsi);
            return;
        }
        if let Err(e) = self.router.vm.unregister_irqfd(&self.evt, self.gsi) {
            log::debug!("unregistering irqfd of GSI {}: {e}", self.gsi);
        }
        self.router.release(self.gsi);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gsis_run_out_with_an_error_and_freed_ones_are_reused() {
        let mut st = RouterState::new(FIRST_MSI_GSI, FIRST_MSI_GSI + 2);
        let got: Vec<u32> = (0..3).map(|_| st.allocate_gsi().unwrap()).collect();
        assert_eq!(got, [24, 25, 26]);
        assert!(matches!(st.allocate_gsi(), Err(InterruptError::NoGsi)));
        st.free_gsi(25);
        st.free_gsi(24);
        // The lowest freed first.
        assert_eq!(st.allocate_gsi().unwrap(), 24);
        assert_eq!(st.allocate_gsi().unwrap(), 25);
        assert!(matches!(st.allocate_gsi(), Err(InterruptError::NoGsi)));
        // Freeing one never handed out, or twice, is logged, not a panic.
        st.free_gsi(3);
        st.free_gsi(26);
        st.free_gsi(26);
        assert_eq!(st.allocate_gsi().unwrap(), 26);
    }

    #[test]
    fn the_full_msi_range_is_handed_out_in_order() {
        let mut st = RouterState::new(FIRST_MSI_GSI, MAX_GSI);
        for want in FIRST_MSI_GSI..=MAX_GSI {
            assert_eq!(st.allocate_gsi().unwrap(), want);
        }
        assert!(matches!(st.allocate_gsi(), Err(InterruptError::NoGsi)));
    }

    #[test]
    fn table_keeps_irqchip_defaults_and_adds_msi() {
        let mut routes = BTreeMap::new();
        routes.insert(
            30,
            MsiMessage {
                addr: 0x1_fee0_1000,
                data: 0x41,
            },
        );
        let t = routing_entries(&routes);
        // 16 PIC + 24 IOAPIC + 1 MSI.
        assert_eq!(t.len(), 41);
        let ioapic4 = t
            .iter()
            .find(|e| {
                e.gsi == 4
                    && e.type_ == KVM_IRQ_ROUTING_IRQCHIP
                    // SAFETY: irqchip entries use the irqchip member.
                    && unsafe { e.u.irqchip.irqchip } == KVM_IRQCHIP_IOAPIC
            })
            .unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { ioapic4.u.irqchip.pin }, 4);
        let slave = t.iter().find(|e| e.gsi == 9).unwrap();
        // SAFETY: as above.
        unsafe {
            assert_eq!(slave.u.irqchip.irqchip, KVM_IRQCHIP_PIC_SLAVE);
            assert_eq!(slave.u.irqchip.pin, 1);
        }
        let msi = t.last().unwrap();
        assert_eq!(msi.gsi, 30);
        assert_eq!(msi.type_, KVM_IRQ_ROUTING_MSI);
        // SAFETY: MSI entries use the msi member.
        unsafe {
            assert_eq!(msi.u.msi.address_lo, 0xfee0_1000);
            assert_eq!(msi.u.msi.address_hi, 1);
            assert_eq!(msi.u.msi.data, 0x41);
        }
    }
}
