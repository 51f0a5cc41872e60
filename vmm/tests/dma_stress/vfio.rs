//! A VFIO-like consumer: dmavisor's real `VfioMirror` over a host
//! container that records its map and unmap calls, and an assigned
//! function's DMA that reaches only what the container maps at that
//! instant, as a host IOMMU translates.
//!
//! WHY a recording host: no machine that runs the tests has a function to
//! assign, and what the guarantee needs of a container is exactly its
//! state: once a guest's UNMAP or DETACH has completed, the container no
//! longer maps the range (checked directly by the guest threads, and by
//! the content of the pages the function writes).

use std::collections::BTreeMap;
use std::io;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use virtio_iommu::mapping::Perm;
use vm_memory::{Bytes, GuestAddress};
use vmm::vfio::host::HostFunction;

use virtio_iommu::locks::Unpoison;
use vmm::width::usize_from_u64;

use super::rng::Rng;
use super::{gpa_of, iova, Kind, Shared, REGION, SLOTS};

/// The host container of one function: first IOVA -> (last IOVA, host
/// address, permissions).
pub struct RecordingHost {
    live: Mutex<BTreeMap<u64, (u64, u64, Perm)>>,
    unmap_all: bool,
    /// Bus mastering was cleared by the mirror (it failed closed).
    stopped: AtomicBool,
    /// Map calls recorded.
    pub map_calls: AtomicU64,
    /// Unmap calls recorded (ranges and unmap-all).
    pub unmap_calls: AtomicU64,
}

impl RecordingHost {
    /// An empty container; `unmap_all`: the host kernel has
    /// `VFIO_UNMAP_ALL` (the mirror takes another path without it).
    pub fn new(unmap_all: bool) -> Self {
        Self {
            live: Mutex::new(BTreeMap::new()),
            unmap_all,
            stopped: AtomicBool::new(false),
            map_calls: AtomicU64::new(0),
            unmap_calls: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, (u64, u64, Perm)>> {
        self.live.lock().unpoisoned()
    }

    /// Whether the mirror stopped the function.
    pub fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Whether the container still maps anything in `range`.
    pub fn maps_any(&self, range: RangeInclusive<u64>) -> bool {
        let (first, last) = (*range.start(), *range.end());
        self.lock()
            .range(..=last)
            .next_back()
            .is_some_and(|(_, &(end, _, _))| end >= first)
    }

    /// One DMA write of `len` bytes of a fresh ticket at `iova`, under the
    /// container's lock (a host IOMMU translates each access atomically
    /// with respect to map and unmap). False if nothing maps it writable.
    pub fn dma_write(&self, shared: &Shared, iova: u64, len: u64) -> bool {
        let live = self.lock();
        if self.stopped() {
            return false;
        }
        let Some((&first, &(last, host, perm))) = live.range(..=iova).next_back() else {
            return false;
        };
        if iova + len - 1 > last || !perm.contains(Perm::WRITE) {
            return false;
        }
        let Some(gpa) = gpa_of(shared, host + (iova - first)) else {
            return false;
        };
        let ticket = shared.ticket();
        let buf: Vec<u8> = (0..len / 8).flat_map(|_| ticket.to_le_bytes()).collect();
        shared.mem.write_slice(&buf, GuestAddress(gpa)).is_ok()
    }
}

impl HostFunction for RecordingHost {
    fn can_unmap_all(&self) -> bool {
        self.unmap_all
    }

    unsafe fn map_dma(&self, iova: u64, len: u64, host: u64, perm: Perm) -> io::Result<()> {
        self.map_calls.fetch_add(1, Ordering::Relaxed);
        let last = iova
            .checked_add(len.saturating_sub(1))
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let mut live = self.lock();
        let overlaps = live
            .range(..=last)
            .next_back()
            .is_some_and(|(_, &(end, _, _))| end >= iova);
        if len == 0 || overlaps {
            // As type1 answers a mapping over an existing one.
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
        live.insert(iova, (last, host, perm));
        Ok(())
    }

    fn unmap_dma(&self, iova: u64, len: u64) -> io::Result<()> {
        self.unmap_calls.fetch_add(1, Ordering::Relaxed);
        let last = iova.saturating_add(len.saturating_sub(1));
        let mut live = self.lock();
        let inside: Vec<(u64, u64)> = live
            .range(..=last)
            .filter(|(_, &(end, _, _))| end >= iova)
            .map(|(&s, &(end, _, _))| (s, end))
            .collect();
        // Type1 (v2) refuses to cut a mapping in two.
        if inside.iter().any(|&(s, end)| s < iova || end > last) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        for (s, _) in inside {
            live.remove(&s);
        }
        Ok(())
    }

    fn unmap_all(&self) -> io::Result<()> {
        self.unmap_calls.fetch_add(1, Ordering::Relaxed);
        if !self.unmap_all {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        }
        self.lock().clear();
        Ok(())
    }

    fn stop_bus_master(&self) -> io::Result<()> {
        // Under the lock: no access is past its check when this returns.
        let _live = self.lock();
        self.stopped.store(true, Ordering::SeqCst);
        Ok(())
    }
}

/// The assigned functions' DMA: writes the VFIO region of random slots of
/// every guest thread (`hosts[guest]`) until the run stops.
pub fn run(shared: &Shared, hosts: &[Arc<RecordingHost>], mut rng: Rng) {
    let stats = shared.kind(Kind::Vfio);
    let guests = hosts.len() as u64;
    let mut n = 0u64;
    while !shared.stopped() {
        super::pace(&mut n);
        let Some(h) = hosts.get(usize_from_u64(rng.below(guests))) else {
            continue;
        };
        let at = iova(rng.below(SLOTS)) + Kind::Vfio.offset();
        if h.dma_write(shared, at, REGION) {
            stats.accesses.fetch_add(1, Ordering::Relaxed);
        } else {
            stats.refused.fetch_add(1, Ordering::Relaxed);
        }
    }
}
