//! Allocation of guest RAM as anonymous host mappings.

use log::debug;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use super::layout;
use crate::error::Error;

/// Guest memory type used throughout the VMM.
pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<()>;

/// Maps `mem_size` bytes of guest RAM following the layout's regions;
/// with `thp`, asks for transparent huge pages.
///
/// WHY huge pages: KVM maps guest RAM with the host page size it finds, so
/// 2 MiB host pages mean 512 times fewer nested page-table entries and
/// faults (and, in the nested runner, fewer emulated nested walks). A host
/// that refuses (THP disabled) keeps working with 4 KiB pages.
pub fn create_guest_memory(mem_size: u64, thp: bool) -> Result<GuestMemoryMmap, Error> {
    let ranges: Vec<(GuestAddress, usize)> = layout::ram_regions(mem_size)
        .into_iter()
        .map(|(start, len)| (GuestAddress(start), len as usize))
        .collect();
    let mem =
        GuestMemoryMmap::from_ranges(&ranges).map_err(|e| Error::GuestMemory(e.to_string()))?;
    if thp {
        for region in mem.iter() {
            let (Ok(host), Ok(len)) = (
                mem.get_host_address(region.start_addr()),
                usize::try_from(region.len()),
            ) else {
                continue;
            };
            // SAFETY: the range is exactly one mapping this process owns;
            // MADV_HUGEPAGE changes how it is backed, never its contents.
            let rc = unsafe { libc::madvise(host.cast(), len, libc::MADV_HUGEPAGE) };
            if rc != 0 {
                debug!(
                    "guest RAM at {:#x}: MADV_HUGEPAGE: {}",
                    region.start_addr().0,
                    std::io::Error::last_os_error()
                );
            }
        }
    }
    Ok(mem)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::Bytes;

    #[test]
    fn ram_with_and_without_huge_pages_is_usable() {
        for thp in [true, false] {
            let mem = create_guest_memory(64 << 20, thp).unwrap();
            let at = GuestAddress((32 << 20) + 8);
            mem.write_obj(0x5aa5_u32, at).unwrap();
            assert_eq!(mem.read_obj::<u32>(at).unwrap(), 0x5aa5);
            assert_eq!(mem.iter().map(|r| r.len()).sum::<u64>(), 64 << 20);
        }
    }
}
