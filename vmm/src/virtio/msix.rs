//! MSI-X table and pending-bit array emulation (PCI 3.0, 6.8.2).
//!
//! The table lives in a BAR; each entry the guest unmasks is routed to its
//! own GSI ([`MsiVector`]). Device threads call [`MsixState::signal`]: a
//! masked vector records a pending bit instead and fires on unmask, as the
//! spec requires. An assigned function signals its vectors from the host
//! kernel, past [`MsixState::signal`]: for it masking is carried out at
//! the sink ([`MsiSink::set_masked`]), whose held-back signals become
//! pending bits when the PBA is read or the vector unmasked.

use crate::interrupt::{InterruptError, MsiMessage, MsiVector};
use crate::warn_limited;
use crate::width::usize_from_u64;

/// PCI capability id of MSI-X.
pub const MSIX_CAP_ID: u8 = 0x11;
/// Size of one table entry.
pub const MSIX_ENTRY_SIZE: u64 = 16;
/// Message control: MSI-X enable.
pub const MSIX_ENABLE: u16 = 1 << 15;
/// Message control: function mask.
pub const MSIX_FUNCTION_MASK: u16 = 1 << 14;
/// Vector control: entry masked.
const ENTRY_MASKED: u32 = 1;

/// Where a table entry's interrupts go: a KVM GSI + irqfd in the VMM
/// ([`MsiVector`]), a recorder in tests.
pub trait MsiSink: Send {
    /// Points the vector at `msg`.
    fn route(&mut self, msg: MsiMessage) -> Result<(), InterruptError>;
    /// Injects the interrupt.
    fn trigger(&self);
    /// Stops (true) or resumes (false) delivery of signals that reach the
    /// vector without [`MsixState::signal`] (an assigned function's).
    fn set_masked(&mut self, _masked: bool) -> Result<(), InterruptError> {
        Ok(())
    }
    /// Whether such a signal arrived while masked (consumes it).
    fn take_signals(&mut self) -> bool {
        false
    }
}

impl MsiSink for MsiVector {
    fn route(&mut self, msg: MsiMessage) -> Result<(), InterruptError> {
        MsiVector::route(self, msg)
    }
    fn trigger(&self) {
        MsiVector::trigger(self)
    }
    // Masking stays with `MsixState::signal`: an emulated device raises
    // its vectors only through it, and detaching an irqfd costs KVM an
    // SRCU grace period. Vectors signalled from outside use
    // `crate::vfio::msix_block::ExternalVector`.
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    addr_lo: u32,
    addr_hi: u32,
    data: u32,
    ctrl: u32,
}

impl Default for Entry {
    fn default() -> Self {
        // Entries come out of reset masked.
        Self {
            addr_lo: 0,
            addr_hi: 0,
            data: 0,
            ctrl: ENTRY_MASKED,
        }
    }
}

/// MSI-X state of one function.
pub struct MsixState {
    entries: Vec<Entry>,
    pending: Vec<bool>,
    vectors: Vec<Box<dyn MsiSink>>,
    /// Per vector, whether its sink delivers (told by `set_masked`).
    open: Vec<bool>,
    enabled: bool,
    function_masked: bool,
}

impl MsixState {
    /// A table of `vectors.len()` entries, each backed by one vector.
    pub fn new(vectors: Vec<Box<dyn MsiSink>>) -> Self {
        let n = vectors.len();
        let mut s = Self {
            entries: vec![Entry::default(); n],
            pending: vec![false; n],
            vectors,
            open: vec![true; n],
            enabled: false,
            function_masked: false,
        };
        // Entries come out of reset masked, and MSI-X disabled: the sinks
        // are closed until the guest says otherwise.
        s.sync_all();
        s
    }

    /// Whether the guest set the function mask.
    pub fn function_masked(&self) -> bool {
        self.function_masked
    }

    /// Number of table entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether MSI-X is enabled in the capability.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    fn masked(&self, v: usize) -> bool {
        self.function_masked
            || self
                .entries
                .get(v)
                .is_none_or(|e| e.ctrl & ENTRY_MASKED != 0)
    }

    /// Closes the sink of a vector that may not deliver, keeping what it
    /// held back as pending.
    fn close(&mut self, v: usize) {
        let (Some(open), Some(vec)) = (self.open.get_mut(v), self.vectors.get_mut(v)) else {
            return;
        };
        if !*open {
            return;
        }
        match vec.set_masked(true) {
            Ok(()) => *open = false,
            // The guest keeps receiving this vector's interrupts while
            // masked: wrong, but no memory is at stake.
            Err(err) => warn_limited!("MSI-X vector {v}: masking: {err}"),
        }
    }

    /// Collects the signals a closed sink held back into the PBA.
    fn collect(&mut self, v: usize) {
        if self.open.get(v).copied().unwrap_or(true) {
            return;
        }
        if let (Some(vec), Some(p)) = (self.vectors.get_mut(v), self.pending.get_mut(v)) {
            if vec.take_signals() {
                *p = true;
            }
        }
    }

    /// Points the vector's GSI at the entry's message and fires a pending
    /// interrupt if the entry is now deliverable; closes its sink if not.
    fn sync(&mut self, v: usize) {
        if !self.enabled || self.masked(v) {
            self.close(v);
            return;
        }
        self.collect(v);
        let (Some(e), Some(vec)) = (self.entries.get(v), self.vectors.get_mut(v)) else {
            return;
        };
        let msg = MsiMessage {
            addr: u64::from(e.addr_lo) | (u64::from(e.addr_hi) << 32),
            data: e.data,
        };
        if let Err(err) = vec.route(msg) {
            warn_limited!("MSI-X vector {v}: {err}");
            return;
        }
        if let Some(open) = self.open.get_mut(v).filter(|o| !**o) {
            match vec.set_masked(false) {
                Ok(()) => *open = true,
                Err(err) => warn_limited!("MSI-X vector {v}: unmasking: {err}"),
            }
        }
        if let Some(p) = self.pending.get_mut(v) {
            if *p {
                *p = false;
                vec.trigger();
            }
        }
    }

    fn sync_all(&mut self) {
        for v in 0..self.entries.len() {
            self.sync(v);
        }
    }

    /// Applies the message control bits written by the guest.
    pub fn set_control(&mut self, control: u16) {
        let enabled = control & MSIX_ENABLE != 0;
        let masked = control & MSIX_FUNCTION_MASK != 0;
        if enabled != self.enabled || masked != self.function_masked {
            self.enabled = enabled;
            self.function_masked = masked;
            self.sync_all();
        }
    }

    /// Raises vector `v` (ignored if out of range or MSI-X is disabled).
    pub fn signal(&mut self, v: u16) {
        let v = usize::from(v);
        if v >= self.entries.len() || !self.enabled {
            return;
        }
        if self.masked(v) {
            if let Some(p) = self.pending.get_mut(v) {
                *p = true;
            }
            return;
        }
        if let Some(vec) = self.vectors.get(v) {
            vec.trigger();
        }
    }

    /// Guest read in the table at `offset`.
    pub fn read_table(&self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let v = (offset / MSIX_ENTRY_SIZE) as usize;
        let Some(e) = self.entries.get(v) else {
            return;
        };
        let words = [e.addr_lo, e.addr_hi, e.data, e.ctrl];
        let mut bytes = [0u8; 16];
        for (i, w) in words.iter().enumerate() {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
        let start = (offset % MSIX_ENTRY_SIZE) as usize;
        if let Some(src) = bytes.get(start..start + data.len()) {
            data.copy_from_slice(src);
        }
    }

    /// Guest write in the table at `offset` (4- or 8-byte accesses).
    pub fn write_table(&mut self, offset: u64, data: &[u8]) {
        let v = (offset / MSIX_ENTRY_SIZE) as usize;
        let start = (offset % MSIX_ENTRY_SIZE) as usize;
        let Some(e) = self.entries.get_mut(v) else {
            return;
        };
        let mut words = [e.addr_lo, e.addr_hi, e.data, e.ctrl];
        let mut bytes = [0u8; 16];
        for (i, w) in words.iter().enumerate() {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
        let Some(dst) = bytes.get_mut(start..start + data.len()) else {
            return;
        };
        dst.copy_from_slice(data);
        for (i, w) in words.iter_mut().enumerate() {
            let mut b = [0u8; 4];
            b.copy_from_slice(&bytes[i * 4..i * 4 + 4]);
            *w = u32::from_le_bytes(b);
        }
        *e = Entry {
            addr_lo: words[0],
            addr_hi: words[1],
            data: words[2],
            // Only the mask bit is writable in vector control.
            ctrl: words[3] & ENTRY_MASKED,
        };
        self.sync(v);
    }

    /// Guest read of the pending bit array at `offset`.
    pub fn read_pba(&mut self, offset: u64, data: &mut [u8]) {
        for v in 0..self.entries.len() {
            self.collect(v);
        }
        for (i, b) in data.iter_mut().enumerate() {
            let first = (usize_from_u64(offset) + i) * 8;
            *b = (0..8).fold(0u8, |acc, bit| {
                let set = self.pending.get(first + bit).copied().unwrap_or(false);
                acc | (u8::from(set) << bit)
            });
        }
    }

    /// Back to the power-on state (device reset keeps MSI-X config space
    /// state, which belongs to PCI, but pending bits are dropped).
    pub fn clear_pending(&mut self) {
        self.pending.iter_mut().for_each(|p| *p = false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct Probe {
        fired: AtomicU32,
        routed: Mutex<Option<MsiMessage>>,
    }

    struct Sink(Arc<Probe>);

    impl MsiSink for Sink {
        fn route(&mut self, msg: MsiMessage) -> Result<(), InterruptError> {
            *self.0.routed.lock().unwrap() = Some(msg);
            Ok(())
        }
        fn trigger(&self) {
            self.0.fired.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn state(n: usize) -> (MsixState, Vec<Arc<Probe>>) {
        let probes: Vec<Arc<Probe>> = (0..n).map(|_| Arc::default()).collect();
        let sinks = probes
            .iter()
            .map(|p| Box::new(Sink(p.clone())) as Box<dyn MsiSink>)
            .collect();
        (MsixState::new(sinks), probes)
    }

    #[test]
    fn masked_vectors_pend_and_fire_on_unmask() {
        let (mut m, probes) = state(2);
        m.set_control(MSIX_ENABLE);
        m.write_table(16, &0xfee0_0000u32.to_le_bytes());
        m.write_table(24, &0x31u32.to_le_bytes());
        // Still masked: the signal pends.
        m.signal(1);
        assert_eq!(probes[1].fired.load(Ordering::SeqCst), 0);
        let mut pba = [0u8; 1];
        m.read_pba(0, &mut pba);
        assert_eq!(pba[0], 0b10);
        // Unmask: routed and the pending interrupt fires once.
        m.write_table(28, &0u32.to_le_bytes());
        assert_eq!(probes[1].fired.load(Ordering::SeqCst), 1);
        assert_eq!(
            *probes[1].routed.lock().unwrap(),
            Some(MsiMessage {
                addr: 0xfee0_0000,
                data: 0x31
            })
        );
        m.read_pba(0, &mut pba);
        assert_eq!(pba[0], 0);
        m.signal(1);
        assert_eq!(probes[1].fired.load(Ordering::SeqCst), 2);
        // Function mask holds everything back.
        m.set_control(MSIX_ENABLE | MSIX_FUNCTION_MASK);
        m.signal(1);
        assert_eq!(probes[1].fired.load(Ordering::SeqCst), 2);
        m.set_control(MSIX_ENABLE);
        assert_eq!(probes[1].fired.load(Ordering::SeqCst), 3);
        // Out-of-range vectors and accesses are ignored.
        m.signal(7);
        m.write_table(0x1000, &[1, 2, 3, 4]);
        let mut d = [0xffu8; 4];
        m.read_table(0x1000, &mut d);
        assert_eq!(d, [0; 4]);
        m.read_table(28, &mut d);
        assert_eq!(u32::from_le_bytes(d), 0);
    }

    #[test]
    fn disabled_msix_drops_signals() {
        let (mut m, probes) = state(1);
        m.write_table(12, &0u32.to_le_bytes());
        m.signal(0);
        assert_eq!(probes[0].fired.load(Ordering::SeqCst), 0);
    }
}
