//! BARs of an assigned function mapped straight into the guest: a KVM
//! memory slot over the VFIO region's mmap, so that the guest's register
//! accesses (a NIC's doorbells and descriptor tails) reach the device
//! without a VM exit, as on bare metal.
//!
//! Only a BAR that VFIO lets us mmap whole and that holds no MSI-X
//! structure is mapped (the MSI-X table is emulated, so its BAR stays
//! trapped); the rest keep the trapped path of [`super::VfioPciDevice`].
//! The slot follows the guest: it exists while the BAR has an address and
//! the command register's memory-space bit is set, and moves with the BAR.

use std::os::fd::AsRawFd;

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use log::debug;
use vfio_bindings::bindings::vfio::VFIO_REGION_INFO_FLAG_MMAP;
use vfio_ioctls::{VfioDevice, VfioRegionInfoCap};

use crate::memory::slots::device_slot;
use crate::width::usize_from_u64;

/// Host page size KVM slots are made of.
const PAGE: u64 = 4096;

/// One BAR's mmap and the KVM slot that puts it in the guest.
pub struct DirectBar {
    bar: usize,
    /// The mmap of the whole region (`size` bytes).
    host: *mut libc::c_void,
    size: u64,
    slot: u32,
    /// Guest-physical address the slot maps now.
    mapped_at: Option<u64>,
}

// SAFETY: `host` is a private mmap only this value unmaps; KVM and the
// device access it, the VMM never dereferences it.
unsafe impl Send for DirectBar {}

impl DirectBar {
    /// Maps BAR `bar` of `device` if it can be mapped whole; None keeps it
    /// trapped (no mmap flag, a sparse mmap that leaves holes, a size KVM
    /// cannot slot, no free slot, or mmap failing).
    pub fn try_new(device: &VfioDevice, bar: usize) -> Option<Self> {
        let index = u32::try_from(bar).ok()?;
        let size = device.get_region_size(index);
        if device.get_region_flags(index) & VFIO_REGION_INFO_FLAG_MMAP == 0
            || size == 0
            || size & (PAGE - 1) != 0
        {
            return None;
        }
        // A sparse-mmap capability lists the parts that may be mapped; only
        // one part covering the whole region is good enough here.
        let whole = device.get_region_caps(index).iter().all(|cap| match cap {
            VfioRegionInfoCap::SparseMmap(s) => {
                s.areas.len() == 1
                    && s.areas
                        .first()
                        .is_some_and(|a| a.offset == 0 && a.size == size)
            }
            _ => true,
        });
        if !whole {
            return None;
        }
        let len = usize::try_from(size).ok()?;
        let offset = libc::off_t::try_from(device.get_region_offset(index)).ok()?;
        let slot = device_slot()?;
        // SAFETY: a fresh shared mapping of the device fd's region, checked
        // below; nothing else refers to this address range.
        let host = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                device.as_raw_fd(),
                offset,
            )
        };
        if host == libc::MAP_FAILED {
            debug!(
                "vfio BAR {bar}: mmap failed ({}), trapped",
                std::io::Error::last_os_error()
            );
            return None;
        }
        Some(Self {
            bar,
            host,
            size,
            slot,
            mapped_at: None,
        })
    }

    /// The BAR index.
    pub fn bar(&self) -> usize {
        self.bar
    }

    /// Puts the slot at `want` (None: removes it).
    pub fn place(&mut self, vm: &VmFd, want: Option<u64>) -> Result<(), DirectBarError> {
        if want == self.mapped_at {
            return Ok(());
        }
        if self.mapped_at.is_some() {
            self.set(vm, 0, 0)?;
            self.mapped_at = None;
        }
        if let Some(addr) = want {
            if addr & (PAGE - 1) != 0 {
                return Err(DirectBarError::Unaligned {
                    bar: self.bar,
                    addr,
                });
            }
            self.set(vm, addr, self.size)?;
            self.mapped_at = Some(addr);
        }
        Ok(())
    }

    fn set(&self, vm: &VmFd, addr: u64, size: u64) -> Result<(), DirectBarError> {
        let region = kvm_userspace_memory_region {
            slot: self.slot,
            flags: 0,
            guest_phys_addr: addr,
            memory_size: size,
            userspace_addr: self.host as u64,
        };
        // SAFETY: `host` is a live mapping of `size` bytes owned by self,
        // which removes the slot (VfioPciDevice's drop) before unmapping.
        unsafe { vm.set_user_memory_region(region) }.map_err(|source| DirectBarError::Slot {
            bar: self.bar,
            slot: self.slot,
            source,
        })
    }
}

/// Why a BAR's KVM slot could not be moved.
#[derive(Debug, thiserror::Error)]
pub enum DirectBarError {
    /// The guest placed the BAR off a page boundary.
    #[error("BAR {bar} at {addr:#x} is not page aligned")]
    Unaligned {
        /// The BAR index.
        bar: usize,
        /// Where the guest put it.
        addr: u64,
    },
    /// KVM refused the memory slot.
    #[error("BAR {bar} slot {slot}: {source}")]
    Slot {
        /// The BAR index.
        bar: usize,
        /// The KVM slot.
        slot: u32,
        /// errno.
        source: kvm_ioctls::Error,
    },
}

impl Drop for DirectBar {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `try_new`, unmapped once; the owner
        // removed the KVM slot first (see `VfioPciDevice`'s drop).
        unsafe { libc::munmap(self.host, usize_from_u64(self.size)) };
    }
}
