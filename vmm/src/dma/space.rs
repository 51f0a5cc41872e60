//! [`DmaSpace`]: a device's view of guest memory, translated per access.

use std::iter::FusedIterator;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use log::{error, warn};
use virtio_iommu::quiesce::{Quiescer, ReaderSlot, TooManyReaders};
use vm_memory::bitmap::BS;
use vm_memory::guest_memory::{
    Error as MemError, GuestMemoryBackendSliceIterator, GuestMemorySliceIterator,
    Result as MemResult,
};
use vm_memory::{GuestAddress, GuestMemory, GuestMemoryBackend, Permissions, VolatileSlice};

use super::{DmaAccess, DmaFault, DmaTranslate};
use crate::memory::GuestMemoryMmap;

/// One device's DMA address space: guest RAM seen through an optional
/// translator. Cheap to clone (the RAM map and the translator are shared).
#[derive(Clone)]
pub struct DmaSpace {
    mem: GuestMemoryMmap,
    translator: Option<Arc<dyn DmaTranslate>>,
    faults: Arc<AtomicU64>,
    /// The vIOMMU's quiescence of device threads (see [`DmaSpace::reader`]).
    quiescer: Option<Arc<Quiescer>>,
    /// The PCI command register's bus-master bit, shared by every clone
    /// (see [`DmaSpace::set_bus_master`]).
    bus_master: Arc<AtomicBool>,
    /// Set for good when a thread of the device could not get a reader
    /// slot (see [`DmaSpace::reader`]); shared by every clone.
    refused: Arc<AtomicBool>,
}

impl DmaSpace {
    /// Identity over guest RAM: the device sees guest-physical addresses.
    pub fn identity(mem: GuestMemoryMmap) -> Self {
        Self {
            mem,
            translator: None,
            faults: Arc::default(),
            quiescer: None,
            bus_master: Arc::new(AtomicBool::new(true)),
            refused: Arc::default(),
        }
    }

    /// Every access is translated by `translator` (a vIOMMU endpoint).
    pub fn translated(mem: GuestMemoryMmap, translator: Arc<dyn DmaTranslate>) -> Self {
        Self {
            mem,
            translator: Some(translator),
            faults: Arc::default(),
            quiescer: None,
            bus_master: Arc::new(AtomicBool::new(true)),
            refused: Arc::default(),
        }
    }

    /// The same space, with UNMAP completion waiting for the device threads
    /// that use it (the vIOMMU registers `quiescer` as a DMA consumer).
    pub fn with_quiescer(mut self, quiescer: Arc<Quiescer>) -> Self {
        self.quiescer = Some(quiescer);
        self
    }

    /// A reader slot for one device thread (or for one device whose
    /// accesses a lock serialises): tests only; devices get theirs through
    /// [`ThreadDma`](super::ThreadDma), whose guard enters it. Behind a
    /// quiescing vIOMMU the space refuses any access made on a thread that
    /// holds no access guard, so that no device path can translate outside
    /// a section. `None` when the space is not behind a quiescing vIOMMU
    /// (nothing to wait for).
    ///
    /// When the quiescer's reader limit is reached the device must not
    /// run: a thread without a slot is one no UNMAP waits for. The space
    /// (every clone of it) then refuses every access for good, logged
    /// once, and this returns `None`; the device's DMA fails as with bus
    /// mastering off. A caller that can fail its setup instead (device not
    /// started, DEVICE_NEEDS_RESET) uses [`try_reader`](Self::try_reader).
    #[cfg(test)]
    pub(crate) fn reader(&self) -> Option<Arc<ReaderSlot>> {
        self.try_reader().unwrap_or(None)
    }

    /// As [`reader`](Self::reader), and also tells the caller when the
    /// limit was reached (the space refuses every access from then on).
    /// Only [`ThreadDma`](super::ThreadDma) takes slots outside tests:
    /// device code gets its sections from its access guard.
    pub(crate) fn try_reader(&self) -> Result<Option<Arc<ReaderSlot>>, TooManyReaders> {
        let Some(q) = self.quiescer.as_ref() else {
            return Ok(None);
        };
        match q.register() {
            Ok(slot) => Ok(Some(slot)),
            Err(e) => {
                if !self.refused.swap(true, Ordering::SeqCst) {
                    error!("device DMA refused for good: {e}; the device cannot be protected");
                }
                Err(e)
            }
        }
    }

    /// Whether the space refuses every access because one of its device's
    /// threads could not get a reader slot.
    pub fn refused(&self) -> bool {
        self.refused.load(Ordering::SeqCst)
    }

    /// Follows the PCI command register of the device that owns this space
    /// (and every clone of it): with bus mastering off every access fails
    /// at once, as a master abort would on real hardware, without a
    /// vIOMMU fault event. A space starts enabled; the PCI transport sets
    /// it from the command register before the device can run.
    ///
    /// An access already past this check when the bit is cleared
    /// completes, as a posted write in flight does on real PCIe.
    pub fn set_bus_master(&self, enabled: bool) {
        self.bus_master.store(enabled, Ordering::SeqCst);
    }

    /// Whether the owning device may do DMA (see [`set_bus_master`](Self::set_bus_master)),
    /// and its space does not refuse it (see [`reader`](Self::reader)).
    pub fn bus_master(&self) -> bool {
        self.bus_master.load(Ordering::SeqCst) && !self.refused()
    }

    /// Whether accesses go through a translator.
    pub fn is_translated(&self) -> bool {
        self.translator.is_some()
    }

    /// Number of accesses refused by the translator so far.
    pub fn fault_count(&self) -> u64 {
        self.faults.load(Ordering::Relaxed)
    }

    /// The translated slices of an access, without the guard check (see
    /// [`GuestMemory::get_slices`] and [`GuestMemory::check_range`]).
    fn slices(
        &self,
        addr: GuestAddress,
        count: usize,
        access: Permissions,
    ) -> MemResult<DmaSliceIter<'_>> {
        if count > 0 && !self.bus_master() {
            return Err(MemError::InvalidGuestAddress(addr));
        }
        Ok(DmaSliceIter {
            space: self,
            iova: addr.0,
            remaining: count as u64,
            access: access.into(),
            current: None,
            done: count == 0,
        })
    }

    fn record_fault(&self, fault: DmaFault) {
        if self.faults.fetch_add(1, Ordering::Relaxed) == 0 {
            // Later faults are only counted: a guest can cause them at will.
            warn!("device DMA refused: {fault} (further faults counted, not logged)");
        }
    }
}

impl GuestMemory for DmaSpace {
    type PhysicalMemory = GuestMemoryMmap;
    type Bitmap = ();

    /// Allowed outside an access guard: it only says whether the range is
    /// mapped now and lets no slice out, so there is nothing for an UNMAP
    /// to wait for (the transport checks a queue's rings at activation on
    /// the vCPU thread this way).
    fn check_range(&self, addr: GuestAddress, count: usize, access: Permissions) -> bool {
        match self.slices(addr, count, access) {
            Ok(mut it) => it.all(|s| s.is_ok()),
            Err(_) => false,
        }
    }

    fn get_slices<'a>(
        &'a self,
        addr: GuestAddress,
        count: usize,
        access: Permissions,
    ) -> MemResult<impl GuestMemorySliceIterator<'a, BS<'a, Self::Bitmap>>> {
        // Behind a quiescing vIOMMU an access outside an access guard is
        // one no UNMAP waits for: refused, as with bus mastering off.
        if count > 0 && self.quiescer.is_some() && !super::guard::in_guard() {
            if !UNGUARDED_LOGGED.swap(true, Ordering::Relaxed) {
                error!("device DMA outside an access guard refused (a bug; logged once)");
            }
            return Err(MemError::InvalidGuestAddress(addr));
        }
        self.slices(addr, count, access)
    }

    fn physical_memory(&self) -> Option<&Self::PhysicalMemory> {
        // Handing out the physical map would bypass the translator (or
        // the bus-master gate).
        match self.translator {
            None if self.bus_master() => Some(&self.mem),
            _ => None,
        }
    }
}

/// Whether an access outside a guard was logged (once per process: only
/// a bug in the VMM can cause one, not the guest).
static UNGUARDED_LOGGED: AtomicBool = AtomicBool::new(false);

/// The host slices backing one translated access, in order. Ends after the
/// first error (a fault or an address outside guest RAM).
pub struct DmaSliceIter<'a> {
    space: &'a DmaSpace,
    iova: u64,
    remaining: u64,
    access: DmaAccess,
    current: Option<GuestMemoryBackendSliceIterator<'a, GuestMemoryMmap>>,
    done: bool,
}

impl<'a> DmaSliceIter<'a> {
    fn fail(&mut self, err: MemError) -> Option<MemResult<VolatileSlice<'a, BS<'a, ()>>>> {
        self.done = true;
        self.current = None;
        Some(Err(err))
    }

    /// Translates the next run and returns its guest-physical (gpa, len).
    fn next_run(&mut self) -> Result<(u64, u64), DmaFault> {
        let Some(t) = &self.space.translator else {
            return Ok((self.iova, self.remaining));
        };
        match t.translate_run(self.iova, self.remaining, self.access) {
            Ok((gpa, run)) if run > 0 && run <= self.remaining => Ok((gpa, run)),
            // A translator that makes no progress or overshoots is treated as
            // a fault rather than trusted.
            Ok(_) => Err(DmaFault::Unmapped { iova: self.iova }),
            Err(f) => Err(f),
        }
    }
}

impl<'a> Iterator for DmaSliceIter<'a> {
    type Item = MemResult<VolatileSlice<'a, BS<'a, ()>>>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.done {
                return None;
            }
            if let Some(cur) = self.current.as_mut() {
                match cur.next() {
                    Some(Ok(slice)) => return Some(Ok(slice)),
                    Some(Err(e)) => return self.fail(e),
                    None => self.current = None,
                }
            }
            if self.remaining == 0 {
                self.done = true;
                return None;
            }
            let (gpa, run) = match self.next_run() {
                Ok(r) => r,
                Err(fault) => {
                    self.space.record_fault(fault);
                    return self.fail(MemError::InvalidGuestAddress(GuestAddress(self.iova)));
                }
            };
            let Ok(run_len) = usize::try_from(run) else {
                return self.fail(MemError::GuestAddressOverflow);
            };
            if gpa.checked_add(run - 1).is_none() {
                return self.fail(MemError::GuestAddressOverflow);
            }
            self.remaining -= run;
            if self.remaining > 0 {
                match self.iova.checked_add(run) {
                    Some(next) => self.iova = next,
                    None => return self.fail(MemError::GuestAddressOverflow),
                }
            }
            self.current = Some(GuestMemoryBackend::get_slices(
                &self.space.mem,
                GuestAddress(gpa),
                run_len,
            ));
        }
    }
}

impl FusedIterator for DmaSliceIter<'_> {}

impl<'a> GuestMemorySliceIterator<'a, BS<'a, ()>> for DmaSliceIter<'a> {}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    /// Maps IOVA page p to GPA page (p + 1), one page per run; page 7 faults.
    struct ShiftByPage;

    impl DmaTranslate for ShiftByPage {
        fn translate_run(
            &self,
            iova: u64,
            len: u64,
            access: DmaAccess,
        ) -> Result<(u64, u64), DmaFault> {
            let page = iova >> 12;
            if page == 7 || page >= 16 {
                return Err(DmaFault::Unmapped { iova });
            }
            if page == 8 && access != DmaAccess::Read {
                return Err(DmaFault::Permission { iova });
            }
            let in_page = 0x1000 - (iova & 0xfff);
            Ok((iova + 0x1000, len.min(in_page)))
        }
    }

    fn ram() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap()
    }

    #[test]
    fn identity_reads_and_writes_guest_ram() {
        let mem = ram();
        let dma = DmaSpace::identity(mem.clone());
        dma.write_obj(0x1234_5678u32, GuestAddress(0x100)).unwrap();
        assert_eq!(
            mem.read_obj::<u32>(GuestAddress(0x100)).unwrap(),
            0x1234_5678
        );
        assert!(dma.physical_memory().is_some());
        assert!(dma.read_obj::<u32>(GuestAddress(0x10000)).is_err());
        assert!(!GuestMemory::check_range(
            &dma,
            GuestAddress(0xfffe),
            4,
            Permissions::Read
        ));
    }

    #[test]
    fn translated_accesses_cross_runs_and_fault() {
        let mem = ram();
        let dma = DmaSpace::translated(mem.clone(), Arc::new(ShiftByPage));
        assert!(dma.physical_memory().is_none());
        // A write that spans IOVA pages 1 and 2 lands in GPA pages 2 and 3.
        let data: Vec<u8> = (0..32).collect();
        dma.write_slice(&data, GuestAddress(0x1ff0)).unwrap();
        let mut back = [0u8; 32];
        mem.read_slice(&mut back, GuestAddress(0x2ff0)).unwrap();
        assert_eq!(&back[..], &data[..]);
        dma.read_slice(&mut back, GuestAddress(0x1ff0)).unwrap();
        assert_eq!(&back[..], &data[..]);
        // Unmapped page: refused and counted.
        assert!(dma.read_obj::<u32>(GuestAddress(0x7000)).is_err());
        // Read-only page: reads pass, writes fault.
        assert!(dma.read_obj::<u32>(GuestAddress(0x8000)).is_ok());
        assert!(dma.write_obj(1u32, GuestAddress(0x8000)).is_err());
        assert_eq!(dma.fault_count(), 2);
        // Translated past the end of RAM: an error, not a panic.
        assert!(dma.read_obj::<u32>(GuestAddress(0xf000)).is_err());
        assert!(dma.read_obj::<u32>(GuestAddress(u64::MAX - 1)).is_err());
    }

    #[test]
    fn bus_master_off_fails_every_access_of_every_clone() {
        let mem = ram();
        let dma = DmaSpace::identity(mem.clone());
        let clone = dma.clone();
        mem.write_obj(0x11u8, GuestAddress(0x1000)).unwrap();
        dma.set_bus_master(false);
        assert!(!clone.bus_master());
        assert!(clone.write_obj(0x22u8, GuestAddress(0x1000)).is_err());
        assert!(clone.read_obj::<u8>(GuestAddress(0x1000)).is_err());
        assert!(clone.physical_memory().is_none());
        assert_eq!(mem.read_obj::<u8>(GuestAddress(0x1000)).unwrap(), 0x11);
        assert_eq!(clone.fault_count(), 0, "not an IOMMU fault");
        dma.set_bus_master(true);
        clone.write_obj(0x33u8, GuestAddress(0x1000)).unwrap();
        assert_eq!(mem.read_obj::<u8>(GuestAddress(0x1000)).unwrap(), 0x33);
    }
}
