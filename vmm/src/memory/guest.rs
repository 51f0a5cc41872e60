//! Allocation of guest RAM as anonymous host mappings.

use log::debug;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{GuestAddress, GuestRegionMmap};

use super::layout;
use crate::error::Error;

/// Guest memory type used throughout the VMM.
pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<()>;

/// Alignment of every guest RAM mapping in the host (one huge page).
pub const HOST_ALIGN: usize = 2 << 20;

/// Maps `mem_size` bytes of guest RAM following the layout's regions;
/// with `thp`, asks for transparent huge pages.
///
/// WHY huge pages: KVM maps guest RAM with the host page size it finds, so
/// 2 MiB host pages mean 512 times fewer nested page-table entries and
/// faults (and, in the nested runner, fewer emulated nested walks). A host
/// that refuses (THP disabled) keeps working with 4 KiB pages.
///
/// WHY aligned mappings: KVM maps a 2 MiB guest page with one nested entry
/// only when its guest-physical and host-virtual addresses agree modulo
/// 2 MiB. A plain anonymous mmap is only page-aligned (the runner's 6.1
/// kernel placed 512 MiB at 0x...1c5000), so every nested entry was 4 KiB
/// although the host backed the RAM with huge pages. Each region is
/// therefore placed at a 2 MiB-aligned host address (its guest start is
/// 2 MiB-aligned too), as QEMU does.
pub fn create_guest_memory(mem_size: u64, thp: bool) -> Result<GuestMemoryMmap, Error> {
    let mut regions = Vec::new();
    for (start, len) in layout::ram_regions(mem_size) {
        let len = usize::try_from(len).map_err(|e| Error::GuestMemory(e.to_string()))?;
        let host = map_aligned(len)?;
        // SAFETY: `host..host + len` is a read-write anonymous mapping this
        // process owns and never unmaps: guest RAM lives as long as the VMM.
        let region = unsafe { MmapRegionBuilder::new(len).with_raw_mmap_pointer(host) }
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE)
            .build()
            .map_err(|e| Error::GuestMemory(e.to_string()))?;
        let region = GuestRegionMmap::new(region, GuestAddress(start))
            .ok_or_else(|| Error::GuestMemory(format!("RAM region at {start:#x} overflows")))?;
        regions.push(region);
        if thp {
            // SAFETY: the range is exactly one mapping this process owns;
            // MADV_HUGEPAGE changes how it is backed, never its contents.
            let rc = unsafe { libc::madvise(host.cast(), len, libc::MADV_HUGEPAGE) };
            if rc != 0 {
                debug!(
                    "guest RAM at {start:#x}: MADV_HUGEPAGE: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
    }
    GuestMemoryMmap::from_regions(regions).map_err(|e| Error::GuestMemory(e.to_string()))
}

/// An anonymous read-write mapping of `len` bytes at a [`HOST_ALIGN`]-aligned
/// address: `len + HOST_ALIGN` bytes are reserved, then the unaligned head
/// and the tail are unmapped.
fn map_aligned(len: usize) -> Result<*mut u8, Error> {
    let err = |what: &str| {
        Error::GuestMemory(format!(
            "{what} ({len} bytes): {}",
            std::io::Error::last_os_error()
        ))
    };
    let total = len
        .checked_add(HOST_ALIGN)
        .ok_or_else(|| Error::GuestMemory(format!("RAM region of {len} bytes is too large")))?;
    // SAFETY: a fresh anonymous mapping at an address of the kernel's
    // choice; nothing else refers to it yet.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(err("mmap guest RAM"));
    }
    let start = base as usize;
    let aligned = start.next_multiple_of(HOST_ALIGN);
    let head = aligned - start;
    let tail = total - head - len;
    // SAFETY: both ranges lie inside the mapping made above and outside the
    // part kept for guest RAM; nothing refers to them.
    unsafe {
        if head > 0 && libc::munmap(base, head) != 0 {
            return Err(err("munmap below guest RAM"));
        }
        if tail > 0 && libc::munmap((aligned + len) as *mut libc::c_void, tail) != 0 {
            return Err(err("munmap above guest RAM"));
        }
    }
    Ok(aligned as *mut u8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestMemoryBackend, GuestMemoryRegion};

    #[test]
    fn ram_regions_are_host_aligned_to_huge_pages() {
        for size in [64u64 << 20, (64 << 20) + 4096] {
            let mem = create_guest_memory(size, true).unwrap();
            for region in mem.iter() {
                let host = mem.get_host_address(region.start_addr()).unwrap() as usize;
                assert_eq!(
                    host % HOST_ALIGN,
                    0,
                    "region at {:#x}",
                    region.start_addr().0
                );
                assert_eq!(region.start_addr().0 % HOST_ALIGN as u64, 0);
            }
        }
    }

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
