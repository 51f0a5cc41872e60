//! Loading the kernel, initramfs and command line into guest memory.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use linux_loader::loader::bootparam::setup_header;
use linux_loader::loader::{BzImage, Elf, KernelLoader, PvhBootCapability};
use log::info;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, ReadVolatile};

use crate::error::Error;
use crate::memory::layout::{CMDLINE_MAX_SIZE, CMDLINE_START, HIGH_RAM_START};
use crate::memory::GuestMemoryMmap;

/// Offset of the 64-bit entry point from the bzImage's protected-mode load address.
const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;

/// How the kernel must be entered.
#[derive(Clone, Copy, Debug)]
pub enum BootProtocol {
    /// 64-bit Linux boot protocol with a zero page; keeps the setup header.
    Linux64 {
        /// Setup header read from the bzImage.
        header: setup_header,
    },
    /// PVH entry in 32-bit protected mode.
    Pvh,
}

/// A kernel placed in guest memory.
#[derive(Clone, Copy, Debug)]
pub struct LoadedKernel {
    /// Entry point (guest physical).
    pub entry: u64,
    /// End of the loaded image (guest physical).
    pub end: u64,
    /// Protocol for entry.
    pub protocol: BootProtocol,
}

fn open(what: &'static str, path: &Path) -> Result<File, Error> {
    let file = File::open(path).map_err(|source| Error::ReadFile {
        what,
        path: path.to_path_buf(),
        source,
    })?;
    let meta = file.metadata().map_err(|source| Error::ReadFile {
        what,
        path: path.to_path_buf(),
        source,
    })?;
    if !meta.is_file() {
        return Err(Error::ReadFile {
            what,
            path: path.to_path_buf(),
            source: std::io::Error::other("not a regular file"),
        });
    }
    Ok(file)
}

/// Loads a bzImage or an ELF vmlinux (PVH) from `path`.
pub fn load_kernel(mem: &GuestMemoryMmap, path: &Path) -> Result<LoadedKernel, Error> {
    let mut file = open("kernel", path)?;
    let mut magic = [0u8; 4];
    let is_elf = file.read_exact(&mut magic).is_ok() && magic == *b"\x7fELF";
    let not_kernel = |reason: String| Error::NotAKernel {
        path: path.to_path_buf(),
        reason,
    };
    if is_elf {
        let result = Elf::load(mem, None, &mut file, Some(GuestAddress(HIGH_RAM_START)))
            .map_err(|e| not_kernel(e.to_string()))?;
        match result.pvh_boot_cap {
            PvhBootCapability::PvhEntryPresent(entry) => {
                info!("ELF kernel with PVH entry at {:#x}", entry.0);
                Ok(LoadedKernel {
                    entry: entry.0,
                    end: result.kernel_end,
                    protocol: BootProtocol::Pvh,
                })
            }
            _ => Err(not_kernel(
                "ELF image has no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY); use the bzImage"
                    .into(),
            )),
        }
    } else {
        let result = BzImage::load(mem, None, &mut file, Some(GuestAddress(HIGH_RAM_START)))
            .map_err(|e| {
                not_kernel(format!(
                    "neither an ELF vmlinux nor a loadable bzImage ({e})"
                ))
            })?;
        let header = result
            .setup_header
            .ok_or_else(|| not_kernel("bzImage without setup header".into()))?;
        if header.version < 0x020c {
            return Err(not_kernel(format!(
                "boot protocol {}.{:02} is too old for 64-bit entry (need 2.12)",
                header.version >> 8,
                header.version & 0xff
            )));
        }
        // XLF_KERNEL_64: the image has a 64-bit entry at +0x200.
        if header.xloadflags & 1 == 0 {
            return Err(not_kernel("bzImage has no 64-bit entry point".into()));
        }
        info!(
            "bzImage protocol {}.{:02} loaded at {:#x}",
            header.version >> 8,
            header.version & 0xff,
            result.kernel_load.0
        );
        Ok(LoadedKernel {
            entry: result.kernel_load.0 + BZIMAGE_64BIT_ENTRY_OFFSET,
            end: result.kernel_end,
            protocol: BootProtocol::Linux64 { header },
        })
    }
}

/// Writes the NUL-terminated command line at [`CMDLINE_START`]; returns its
/// length without the NUL. `max_len` is the kernel's limit, if it told one.
pub fn load_cmdline(
    mem: &GuestMemoryMmap,
    cmdline: &str,
    max_len: Option<usize>,
) -> Result<usize, Error> {
    let limit = max_len
        .unwrap_or(CMDLINE_MAX_SIZE - 1)
        .min(CMDLINE_MAX_SIZE - 1);
    let bad = |reason: String| Error::InvalidOption {
        option: "cmdline",
        value: cmdline.to_string(),
        reason,
    };
    if cmdline.len() > limit {
        return Err(bad(format!(
            "longer than the kernel's limit of {limit} bytes"
        )));
    }
    if cmdline
        .bytes()
        .any(|b| b == 0 || !(b == b' ' || b.is_ascii_graphic()))
    {
        return Err(bad("only printable ASCII is allowed".into()));
    }
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(CMDLINE_START))
        .map_err(|_| Error::GuestWrite("command line"))?;
    Ok(cmdline.len())
}

/// Copies the initramfs to the highest page-aligned address that ends at or
/// below `max_end` and starts above `min_start`; returns (address, size).
pub fn load_initramfs(
    mem: &GuestMemoryMmap,
    path: &Path,
    min_start: u64,
    max_end: u64,
) -> Result<(u64, u64), Error> {
    let mut file = open("initramfs", path)?;
    let size = file
        .metadata()
        .map_err(|source| Error::ReadFile {
            what: "initramfs",
            path: path.to_path_buf(),
            source,
        })?
        .len();
    let start = max_end
        .checked_sub(size)
        .map(|s| s & !0xfff)
        .filter(|s| *s >= min_start)
        .ok_or_else(|| {
            Error::DoesNotFit(format!(
                "initramfs '{}' ({size} bytes) does not fit between {min_start:#x} and {max_end:#x}",
                path.display()
            ))
        })?;
    let mut slice = mem
        .get_slice(GuestAddress(start), size as usize)
        .map_err(|_| Error::GuestWrite("initramfs"))?;
    file.read_exact_volatile(&mut slice)
        .map_err(|e| Error::ReadFile {
            what: "initramfs",
            path: path.to_path_buf(),
            source: std::io::Error::other(e.to_string()),
        })?;
    Ok((start, size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 64 << 20)]).unwrap()
    }

    #[test]
    fn missing_kernel_names_the_path() {
        let err = load_kernel(&mem(), Path::new("/nonexistent/vmlinuz")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("/nonexistent/vmlinuz"), "{msg}");
        assert!(msg.contains("kernel"), "{msg}");
    }

    #[test]
    fn garbage_is_not_a_kernel() {
        let dir = std::env::temp_dir().join(format!("dmavisor-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("garbage");
        std::fs::File::create(&p)
            .unwrap()
            .write_all(&[0x55u8; 8192])
            .unwrap();
        let err = load_kernel(&mem(), &p).unwrap_err();
        assert!(matches!(err, Error::NotAKernel { .. }), "{err}");
        let empty = dir.join("empty");
        std::fs::File::create(&empty).unwrap();
        assert!(matches!(
            load_kernel(&mem(), &empty).unwrap_err(),
            Error::NotAKernel { .. }
        ));
        assert!(matches!(
            load_kernel(&mem(), &dir).unwrap_err(),
            Error::ReadFile { .. }
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn cmdline_is_nul_terminated_and_checked() {
        let m = mem();
        assert_eq!(load_cmdline(&m, "console=ttyS0 quiet", None).unwrap(), 19);
        let mut buf = [0u8; 20];
        m.read_slice(&mut buf, GuestAddress(CMDLINE_START)).unwrap();
        assert_eq!(&buf, b"console=ttyS0 quiet\0");
        assert!(load_cmdline(&m, "a\nb", None).is_err());
        assert!(load_cmdline(&m, &"x".repeat(300), Some(255)).is_err());
    }

    #[test]
    fn initramfs_goes_high_and_aligned() {
        let dir = std::env::temp_dir().join(format!("dmavisor-initrd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("initrd");
        std::fs::File::create(&p)
            .unwrap()
            .write_all(&[7u8; 5000])
            .unwrap();
        let m = mem();
        let (addr, size) = load_initramfs(&m, &p, 0x100000, 64 << 20).unwrap();
        assert_eq!(size, 5000);
        assert_eq!(addr % 4096, 0);
        assert!(addr + size <= 64 << 20);
        let b: u8 = m.read_obj(GuestAddress(addr + 4999)).unwrap();
        assert_eq!(b, 7);
        assert!(matches!(
            load_initramfs(&m, &p, 0x100000, 0x100100),
            Err(Error::DoesNotFit(_))
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
