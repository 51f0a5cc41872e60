//! The zero page (`boot_params`) for the 64-bit Linux boot protocol.

use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use vm_memory::{Bytes, GuestAddress};

use crate::error::{DoesNotFit, Error};
use crate::memory::layout::{e820_entries, CMDLINE_START, ZERO_PAGE_START};
use crate::memory::GuestMemoryMmap;
use crate::width::const_u32;

/// "Undefined" boot loader id: we are not a registered loader.
const LOADER_TYPE_UNDEFINED: u8 = 0xff;
/// Boot protocol magic in `boot_flag`.
const BOOT_FLAG_MAGIC: u16 = 0xaa55;
/// "HdrS".
const HEADER_MAGIC: u32 = 0x5372_6448;
/// The command line's address, as the zero page's 32-bit field.
const CMDLINE_PTR: u32 = const_u32(CMDLINE_START as i128);

/// Inputs of the zero page besides the kernel's own setup header.
pub struct ZeroPageParams {
    /// Length of the command line (without NUL).
    pub cmdline_len: usize,
    /// Initramfs (address, size).
    pub initramfs: Option<(u64, u64)>,
    /// Guest RAM size (for e820).
    pub mem_size: u64,
    /// RSDP address.
    pub rsdp: u64,
}

/// Builds the zero page from the kernel's setup header.
pub fn build_zero_page(header: &setup_header, p: &ZeroPageParams) -> Result<boot_params, Error> {
    let mut params = boot_params {
        hdr: *header,
        ..Default::default()
    };
    params.hdr.type_of_loader = LOADER_TYPE_UNDEFINED;
    params.hdr.boot_flag = BOOT_FLAG_MAGIC;
    params.hdr.header = HEADER_MAGIC;
    params.hdr.cmd_line_ptr = CMDLINE_PTR;
    let field = |v: u64, what| u32::try_from(v).map_err(|_| DoesNotFit::ZeroPageField(what));
    params.hdr.cmdline_size = field(p.cmdline_len as u64, "command line length")?;
    if let Some((addr, size)) = p.initramfs {
        params.hdr.ramdisk_image = field(addr, "initramfs address")?;
        params.hdr.ramdisk_size = field(size, "initramfs size")?;
    }
    params.acpi_rsdp_addr = p.rsdp;
    let entries = e820_entries(p.mem_size);
    let count = u8::try_from(entries.len()).map_err(|_| DoesNotFit::E820Entries)?;
    if entries.len() > params.e820_table.len() {
        return Err(DoesNotFit::E820Entries.into());
    }
    for (slot, e) in params.e820_table.iter_mut().zip(entries.iter()) {
        *slot = boot_e820_entry {
            addr: e.addr,
            size: e.size,
            r#type: e.kind as u32,
        };
    }
    params.e820_entries = count;
    Ok(params)
}

/// Writes the zero page at [`ZERO_PAGE_START`].
pub fn write_zero_page(mem: &GuestMemoryMmap, params: &boot_params) -> Result<(), Error> {
    mem.write_obj(*params, GuestAddress(ZERO_PAGE_START))
        .map_err(|_| Error::GuestWrite("zero page"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::layout::HIGH_RAM_START;

    #[test]
    fn zero_page_fields() {
        let header = setup_header {
            version: 0x020f,
            ..Default::default()
        };
        let p = build_zero_page(
            &header,
            &ZeroPageParams {
                cmdline_len: 13,
                initramfs: Some((0x1f00_0000, 0x12345)),
                mem_size: 512 << 20,
                rsdp: 0xe0000,
            },
        )
        .unwrap();
        assert_eq!({ p.hdr.type_of_loader }, 0xff);
        assert_eq!(u64::from(p.hdr.cmd_line_ptr), CMDLINE_START);
        assert_eq!({ p.hdr.cmdline_size }, 13);
        assert_eq!({ p.hdr.ramdisk_image }, 0x1f00_0000);
        assert_eq!({ p.hdr.ramdisk_size }, 0x12345);
        assert_eq!({ p.hdr.version }, 0x020f);
        assert_eq!({ p.acpi_rsdp_addr }, 0xe0000);
        assert_eq!(p.e820_entries, 3);
        let ram = p.e820_table[1];
        assert_eq!({ ram.addr }, HIGH_RAM_START);
        assert_eq!({ ram.r#type }, 1);
        assert_eq!({ p.e820_table[2].r#type }, 2);
    }
}
