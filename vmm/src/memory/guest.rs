//! Allocation of guest RAM as anonymous host mappings.

use vm_memory::GuestAddress;

use super::layout;
use crate::error::Error;

/// Guest memory type used throughout the VMM.
pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<()>;

/// Maps `mem_size` bytes of guest RAM following the layout's regions.
pub fn create_guest_memory(mem_size: u64) -> Result<GuestMemoryMmap, Error> {
    let ranges: Vec<(GuestAddress, usize)> = layout::ram_regions(mem_size)
        .into_iter()
        .map(|(start, len)| (GuestAddress(start), len as usize))
        .collect();
    GuestMemoryMmap::from_ranges(&ranges).map_err(|e| Error::GuestMemory(e.to_string()))
}
