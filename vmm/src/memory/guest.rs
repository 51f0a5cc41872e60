//! Allocation of guest RAM: anonymous host mappings, or one memfd that a
//! vhost-user back-end can map (`--memory shared=on`).

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};

use log::debug;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{FileOffset, GuestAddress, GuestRegionMmap};

use super::layout;
use crate::error::Error;

/// Guest memory type used throughout the VMM.
pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<()>;

/// Alignment of every guest RAM mapping in the host (one huge page).
pub const HOST_ALIGN: usize = 2 << 20;

/// Why guest RAM could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum RamError {
    /// A region is larger than the host's address space.
    #[error(transparent)]
    Length(#[from] std::num::TryFromIntError),
    /// A region is too large to align.
    #[error("RAM region of {0} bytes is too large")]
    TooLarge(usize),
    /// A region ends past the top of the guest address space.
    #[error("RAM region at {0:#x} overflows")]
    Overflow(u64),
    /// The memfd offset does not fit `off_t`.
    #[error("memfd offset {0:#x} too large")]
    OffsetTooLarge(u64),
    /// A host call on the memfd failed.
    #[error("{what}: {source}")]
    Os {
        /// The call.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// Mapping or unmapping host memory failed.
    #[error("{what} ({len} bytes): {source}")]
    Map {
        /// The call.
        what: &'static str,
        /// Bytes of the region.
        len: usize,
        /// Why.
        source: std::io::Error,
    },
    /// vm-memory refused a region.
    #[error(transparent)]
    Mmap(vm_memory::mmap::MmapRegionError),
    /// vm-memory refused the set of regions.
    #[error(transparent)]
    Regions(vm_memory::GuestRegionCollectionError),
}

impl From<RamError> for Error {
    fn from(e: RamError) -> Self {
        Self::GuestMemory(Box::new(e))
    }
}

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
///
/// With `shared`, every region is a window of one memfd (offsets follow the
/// regions' order) mapped MAP_SHARED at that aligned address, and each
/// region records its file and offset: that is what the vhost-user memory
/// table hands to a back-end.
pub fn create_guest_memory(
    mem_size: u64,
    thp: bool,
    shared: bool,
) -> Result<GuestMemoryMmap, Error> {
    let memfd = if shared {
        Some(create_memfd(mem_size)?)
    } else {
        None
    };
    let mut regions = Vec::new();
    let mut file_offset = 0u64;
    for (start, len) in layout::ram_regions(mem_size) {
        let len = usize::try_from(len).map_err(RamError::from)?;
        let host = map_aligned(len)?;
        let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        let mut backing = None;
        if let Some(fd) = &memfd {
            map_file_over(host, len, fd, file_offset)?;
            flags = libc::MAP_SHARED | libc::MAP_NORESERVE;
            let file = fd.try_clone().map_err(|source| RamError::Os {
                what: "dup guest RAM memfd",
                source,
            })?;
            backing = Some(FileOffset::new(file, file_offset));
            file_offset += len as u64;
        }
        // SAFETY: `host..host + len` is a read-write mapping (anonymous, or
        // of the memfd) this process owns and never unmaps: guest RAM lives
        // as long as the VMM.
        let mut builder = unsafe { MmapRegionBuilder::new(len).with_raw_mmap_pointer(host) }
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(flags);
        if let Some(f) = backing {
            builder = builder.with_file_offset(f);
        }
        let region = builder.build().map_err(RamError::Mmap)?;
        let region =
            GuestRegionMmap::new(region, GuestAddress(start)).ok_or(RamError::Overflow(start))?;
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
    Ok(GuestMemoryMmap::from_regions(regions).map_err(RamError::Regions)?)
}

/// A memfd of `size` bytes for shared guest RAM.
fn create_memfd(size: u64) -> Result<File, RamError> {
    // SAFETY: a NUL-terminated name and flags; the call creates a new fd.
    let fd = unsafe { libc::memfd_create(c"dmavisor-ram".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(RamError::Os {
            what: "memfd_create for shared guest RAM",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size).map_err(|source| RamError::Os {
        what: "size shared guest RAM",
        source,
    })?;
    Ok(file)
}

/// Replaces the anonymous reservation at `host` with `len` bytes of `file`
/// from `offset`, MAP_SHARED, at the same (aligned) address.
fn map_file_over(host: *mut u8, len: usize, file: &File, offset: u64) -> Result<(), RamError> {
    let off = libc::off_t::try_from(offset).map_err(|_| RamError::OffsetTooLarge(offset))?;
    // SAFETY: MAP_FIXED over `host..host + len`, a range this process
    // reserved in `map_aligned` and that nothing references yet.
    let got = unsafe {
        libc::mmap(
            host.cast(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_NORESERVE,
            file.as_raw_fd(),
            off,
        )
    };
    if got == libc::MAP_FAILED || got.cast::<u8>() != host {
        return Err(RamError::Map {
            what: "map shared guest RAM",
            len,
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// An anonymous read-write mapping of `len` bytes at a [`HOST_ALIGN`]-aligned
/// address: `len + HOST_ALIGN` bytes are reserved, then the unaligned head
/// and the tail are unmapped.
fn map_aligned(len: usize) -> Result<*mut u8, RamError> {
    let err = |what: &'static str| RamError::Map {
        what,
        len,
        source: std::io::Error::last_os_error(),
    };
    let total = len.checked_add(HOST_ALIGN).ok_or(RamError::TooLarge(len))?;
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
            let mem = create_guest_memory(size, true, false).unwrap();
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
            let mem = create_guest_memory(64 << 20, thp, false).unwrap();
            let at = GuestAddress((32 << 20) + 8);
            mem.write_obj(0x5aa5_u32, at).unwrap();
            assert_eq!(mem.read_obj::<u32>(at).unwrap(), 0x5aa5);
            assert_eq!(mem.iter().map(|r| r.len()).sum::<u64>(), 64 << 20);
        }
    }

    #[test]
    fn shared_ram_is_one_memfd_seen_through_each_region() {
        use std::os::unix::fs::FileExt;
        let mem = create_guest_memory(64 << 20, true, true).unwrap();
        let region = mem.iter().next().unwrap();
        let fo = region.file_offset().expect("shared RAM records its memfd");
        assert_eq!(fo.start(), 0);
        let host = mem.get_host_address(region.start_addr()).unwrap() as usize;
        assert_eq!(host % HOST_ALIGN, 0);
        // A write through the guest mapping is visible through the file,
        // as it will be to a back-end that maps the same fd.
        let at = GuestAddress(0x10_0008);
        mem.write_obj(0xfeed_beef_u32, at).unwrap();
        let mut word = [0u8; 4];
        fo.file().read_exact_at(&mut word, 0x10_0008).unwrap();
        assert_eq!(u32::from_le_bytes(word), 0xfeed_beef);
    }
}
