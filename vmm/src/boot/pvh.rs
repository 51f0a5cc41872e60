//! PVH boot data: `hvm_start_info`, the module list (initramfs) and the
//! memory map, as the PVH ABI defines them.

use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info,
};
use vm_memory::{Bytes, GuestAddress};

use crate::error::{DoesNotFit, Error};
use crate::memory::layout::{
    e820_entries, CMDLINE_START, PVH_INFO_START, PVH_MEMMAP_MAX_ENTRIES, PVH_MEMMAP_START,
    PVH_MODLIST_START,
};
use crate::memory::GuestMemoryMmap;

/// `hvm_start_info.magic`.
pub const XEN_HVM_START_MAGIC_VALUE: u32 = 0x336e_c578;

/// Writes start info, module list and memory map; returns the start info
/// address to pass in RBX.
pub fn write_start_info(
    mem: &GuestMemoryMmap,
    mem_size: u64,
    initramfs: Option<(u64, u64)>,
    rsdp: u64,
) -> Result<u64, Error> {
    let entries = e820_entries(mem_size);
    if entries.len() > PVH_MEMMAP_MAX_ENTRIES {
        return Err(DoesNotFit::PvhMemmapEntries.into());
    }
    let count = u32::try_from(entries.len()).map_err(|_| DoesNotFit::PvhMemmapEntries)?;
    for (i, e) in entries.iter().enumerate() {
        let entry = hvm_memmap_table_entry {
            addr: e.addr,
            size: e.size,
            type_: e.kind as u32,
            reserved: 0,
        };
        mem.write_obj(
            entry,
            GuestAddress(
                PVH_MEMMAP_START + (i * std::mem::size_of::<hvm_memmap_table_entry>()) as u64,
            ),
        )
        .map_err(|_| Error::GuestWrite("PVH memory map"))?;
    }
    let mut info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC_VALUE,
        version: 1,
        cmdline_paddr: CMDLINE_START,
        rsdp_paddr: rsdp,
        memmap_paddr: PVH_MEMMAP_START,
        memmap_entries: count,
        ..Default::default()
    };
    if let Some((addr, size)) = initramfs {
        let module = hvm_modlist_entry {
            paddr: addr,
            size,
            ..Default::default()
        };
        mem.write_obj(module, GuestAddress(PVH_MODLIST_START))
            .map_err(|_| Error::GuestWrite("PVH module list"))?;
        info.nr_modules = 1;
        info.modlist_paddr = PVH_MODLIST_START;
    }
    mem.write_obj(info, GuestAddress(PVH_INFO_START))
        .map_err(|_| Error::GuestWrite("PVH start info"))?;
    Ok(PVH_INFO_START)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_info_layout() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap();
        let at = write_start_info(&mem, 64 << 20, Some((0x300_0000, 0x1000)), 0xe0000).unwrap();
        let info: hvm_start_info = mem.read_obj(GuestAddress(at)).unwrap();
        assert_eq!(info.magic, XEN_HVM_START_MAGIC_VALUE);
        assert_eq!(info.version, 1);
        assert_eq!(info.nr_modules, 1);
        assert_eq!(info.rsdp_paddr, 0xe0000);
        assert_eq!(info.memmap_entries, 3);
        let m: hvm_modlist_entry = mem.read_obj(GuestAddress(info.modlist_paddr)).unwrap();
        assert_eq!(m.paddr, 0x300_0000);
        assert_eq!(m.size, 0x1000);
        let e1: hvm_memmap_table_entry = mem.read_obj(GuestAddress(PVH_MEMMAP_START + 24)).unwrap();
        assert_eq!(e1.addr, 0x100000);
        assert_eq!(e1.size, (64 << 20) - 0x100000);
        assert_eq!(e1.type_, 1);
        // Without an initramfs no module is announced.
        write_start_info(&mem, 64 << 20, None, 0xe0000).unwrap();
        let info: hvm_start_info = mem.read_obj(GuestAddress(at)).unwrap();
        assert_eq!(info.nr_modules, 0);
    }
}
