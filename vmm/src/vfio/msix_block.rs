//! The MSI-X capability of an assigned function, emulated.
//!
//! Why a file of its own: the function's interrupts are signalled by the
//! host kernel straight into each vector's irqfd, so masking only holds if
//! the emulation closes those irqfds itself (see [`MsiSink::set_masked`]);
//! that logic is tested here against a fake function and fake vectors,
//! without VFIO or KVM. VFIO sees only "MSI-X on, with these eventfds" and
//! "MSI-X off", through [`MsixSwitch`].

use log::debug;
use vfio_ioctls::{VfioDevice, VfioError};
use vmm_sys_util::eventfd::EventFd;

use crate::interrupt::{InterruptError, MsiMessage, MsiVector};
use crate::virtio::msix::{MsiSink, MsixState, MSIX_ENABLE, MSIX_FUNCTION_MASK};
use crate::warn_limited;

/// The VFIO side of MSI-X: switching it on with one eventfd per vector.
pub trait MsixSwitch {
    /// Enables MSI-X; vector `i` signals `fds[i]`.
    fn enable_msix(&self, fds: Vec<&EventFd>) -> Result<(), VfioError>;
    /// Disables MSI-X.
    fn disable_msix(&self) -> Result<(), VfioError>;
}

impl MsixSwitch for VfioDevice {
    fn enable_msix(&self, fds: Vec<&EventFd>) -> Result<(), VfioError> {
        VfioDevice::enable_msix(self, fds)
    }
    fn disable_msix(&self) -> Result<(), VfioError> {
        VfioDevice::disable_msix(self)
    }
}

/// A vector the host kernel signals straight into its irqfd (VFIO):
/// masking must detach the irqfd, as nothing of the VMM's is on the path.
pub struct ExternalVector(pub MsiVector);

impl MsiSink for ExternalVector {
    fn route(&mut self, msg: MsiMessage) -> Result<(), InterruptError> {
        self.0.route(msg)
    }
    fn trigger(&self) {
        self.0.trigger()
    }
    fn set_masked(&mut self, masked: bool) -> Result<(), InterruptError> {
        self.0.set_masked(masked)
    }
    fn take_signals(&mut self) -> bool {
        self.0.take_signals()
    }
}

/// Where the MSI-X structures of the function are, and their emulation.
pub struct MsixBlock {
    /// Byte offset of the capability in configuration space.
    pub cap: usize,
    /// BAR holding the table.
    pub table_bar: usize,
    table_offset: u64,
    table_len: u64,
    /// BAR holding the PBA.
    pub pba_bar: usize,
    pba_offset: u64,
    pba_len: u64,
    state: MsixState,
    /// The vectors' irqfds, handed to VFIO when the guest enables MSI-X.
    irqfds: Vec<EventFd>,
    /// MSI-X is enabled in VFIO.
    live: bool,
}

/// What a BAR access inside the MSI-X structures touches.
pub enum MsixAccess {
    /// The table, at this offset.
    Table(u64),
    /// The pending-bit array, at this offset.
    Pba(u64),
}

impl MsixBlock {
    /// The capability at `cap`, its table at `table` (BAR, offset) and PBA
    /// at `pba`, one vector per `(sink, irqfd)`.
    pub fn new(
        cap: usize,
        table: (usize, u64),
        pba: (usize, u64),
        vectors: Vec<(Box<dyn MsiSink>, EventFd)>,
    ) -> Self {
        let n = vectors.len() as u64;
        let (sinks, irqfds) = vectors.into_iter().unzip();
        Self {
            cap,
            table_bar: table.0,
            table_offset: table.1,
            table_len: n * 16,
            pba_bar: pba.0,
            pba_offset: pba.1,
            pba_len: n.div_ceil(64) * 8,
            state: MsixState::new(sinks),
            irqfds,
            live: false,
        }
    }

    /// Number of vectors.
    pub fn vectors(&self) -> usize {
        self.state.len()
    }

    /// Whether MSI-X is on in VFIO (to be switched off before a reset).
    pub fn live(&self) -> bool {
        self.live
    }

    /// The control word the guest reads: the table size is the device's,
    /// enable and function mask are the guest's.
    pub fn control(&self, device_control: u16) -> u16 {
        let mut c = device_control & 0x07ff;
        if self.state.enabled() {
            c |= MSIX_ENABLE;
        }
        if self.state.function_masked() {
            c |= MSIX_FUNCTION_MASK;
        }
        c
    }

    /// The guest wrote the control word: mask and unmask follow in the
    /// emulation, and MSI-X is switched on or off in VFIO.
    pub fn set_control(&mut self, name: &str, dev: &dyn MsixSwitch, control: u16) {
        let want = control & MSIX_ENABLE != 0;
        if want && !self.live {
            // On in VFIO first: vectors unmasked by this write must find
            // the function's interrupts wired.
            self.switch(name, dev, true);
        }
        self.state.set_control(control);
        if !want && self.live {
            self.switch(name, dev, false);
        }
    }

    fn switch(&mut self, name: &str, dev: &dyn MsixSwitch, on: bool) {
        let r = if on {
            dev.enable_msix(self.irqfds.iter().collect())
        } else {
            dev.disable_msix()
        };
        let what = if on { "on" } else { "off" };
        match r {
            Ok(()) => {
                self.live = on;
                debug!("vfio {name}: MSI-X {what}");
            }
            Err(e) => warn_limited!("vfio {name}: MSI-X {what}: {e}"),
        }
    }

    /// Which MSI-X structure an access at `offset` of BAR `bar` hits.
    pub fn target(&self, bar: usize, offset: u64) -> Option<MsixAccess> {
        let inside = |start: u64, len: u64| offset >= start && offset - start < len;
        if bar == self.table_bar && inside(self.table_offset, self.table_len) {
            return Some(MsixAccess::Table(offset - self.table_offset));
        }
        if bar == self.pba_bar && inside(self.pba_offset, self.pba_len) {
            return Some(MsixAccess::Pba(offset - self.pba_offset));
        }
        None
    }

    /// A guest read inside the structures.
    pub fn read(&mut self, at: MsixAccess, data: &mut [u8]) {
        match at {
            MsixAccess::Table(o) => self.state.read_table(o, data),
            MsixAccess::Pba(o) => self.state.read_pba(o, data),
        }
    }

    /// A guest write inside the structures (the PBA is read-only).
    pub fn write(&mut self, at: MsixAccess, data: &[u8]) {
        if let MsixAccess::Table(o) = at {
            self.state.write_table(o, data);
        }
    }
}

#[cfg(test)]
#[path = "msix_block_tests.rs"]
mod tests;
