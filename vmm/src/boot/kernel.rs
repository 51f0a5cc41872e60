//! Loading the kernel, initramfs and command line into guest memory.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use linux_loader::loader::bootparam::setup_header;
use linux_loader::loader::{BzImage, Elf, KernelLoader, PvhBootCapability};
use log::info;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, ReadVolatile};

use crate::error::{DoesNotFit, Error, KernelRejected, OptionReason};
use crate::memory::layout::{CMDLINE_MAX_SIZE, CMDLINE_START, HIGH_RAM_START};
use crate::memory::GuestMemoryMmap;
use crate::width::usize_from_u64;

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
    let not_kernel = |reason: KernelRejected| Error::NotAKernel {
        path: path.to_path_buf(),
        reason,
    };
    if is_elf {
        let result = Elf::load(mem, None, &mut file, Some(GuestAddress(HIGH_RAM_START)))
            .map_err(|e| not_kernel(KernelRejected::Elf(e)))?;
        match result.pvh_boot_cap {
            PvhBootCapability::PvhEntryPresent(entry) => {
                info!("ELF kernel with PVH entry at {:#x}", entry.0);
                Ok(LoadedKernel {
                    entry: entry.0,
                    end: result.kernel_end,
                    protocol: BootProtocol::Pvh,
                })
            }
            _ => Err(not_kernel(KernelRejected::NoPvhEntry)),
        }
    } else {
        let result = BzImage::load(mem, None, &mut file, Some(GuestAddress(HIGH_RAM_START)))
            .map_err(|e| not_kernel(KernelRejected::NotBzImage(e)))?;
        let header = result
            .setup_header
            .ok_or_else(|| not_kernel(KernelRejected::NoSetupHeader))?;
        if header.version < 0x020c {
            return Err(not_kernel(KernelRejected::OldProtocol {
                version: header.version,
            }));
        }
        // XLF_KERNEL_64: the image has a 64-bit entry at +0x200.
        if header.xloadflags & 1 == 0 {
            return Err(not_kernel(KernelRejected::No64BitEntry));
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
    let bad = |reason: OptionReason| Error::InvalidOption {
        option: "cmdline",
        value: cmdline.to_string(),
        reason,
    };
    if cmdline.len() > limit {
        return Err(bad(format!(
            "longer than the kernel's limit of {limit} bytes"
        )
        .into()));
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
        .ok_or_else(|| DoesNotFit::Initramfs {
            path: path.to_path_buf(),
            size,
            min_start,
            max_end,
        })?;
    let mut slice = mem
        .get_slice(GuestAddress(start), usize_from_u64(size))
        .map_err(|_| Error::GuestWrite("initramfs"))?;
    file.read_exact_volatile(&mut slice)
        .map_err(|e| Error::ReadFile {
            what: "initramfs",
            path: path.to_path_buf(),
            source: std::io::Error::other(e),
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

    /// A minimal ELF64 "kernel": one PT_LOAD of `code` at 1 MiB and, if
    /// `pvh`, a Xen PHYS32_ENTRY note pointing at it.
    fn tiny_elf(code: &[u8], pvh: bool) -> Vec<u8> {
        let entry: u64 = 0x100000;
        let mut note = Vec::new();
        for v in [4u32, 4, 18] {
            note.extend_from_slice(&v.to_le_bytes());
        }
        note.extend_from_slice(b"Xen\0");
        note.extend_from_slice(&u32::try_from(entry).unwrap().to_le_bytes());
        let phnum: u16 = if pvh { 2 } else { 1 };
        let mut img = vec![0u8; 0x1000 + code.len()];
        img[0..8].copy_from_slice(&[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
        let mut w = |off: usize, bytes: &[u8]| img[off..off + bytes.len()].copy_from_slice(bytes);
        w(16, &2u16.to_le_bytes()); // ET_EXEC
        w(18, &0x3eu16.to_le_bytes()); // x86-64
        w(20, &1u32.to_le_bytes());
        w(24, &entry.to_le_bytes());
        w(32, &64u64.to_le_bytes()); // e_phoff
        w(52, &64u16.to_le_bytes()); // e_ehsize
        w(54, &56u16.to_le_bytes()); // e_phentsize
        w(56, &phnum.to_le_bytes());
        let phdr = |ty: u32, flags: u32, off: u64, addr: u64, size: u64, align: u64| {
            let mut p = Vec::new();
            p.extend_from_slice(&ty.to_le_bytes());
            p.extend_from_slice(&flags.to_le_bytes());
            for v in [off, addr, addr, size, size, align] {
                p.extend_from_slice(&v.to_le_bytes());
            }
            p
        };
        w(64, &phdr(1, 5, 0x1000, entry, code.len() as u64, 0x1000));
        if pvh {
            w(120, &phdr(4, 4, 0x200, 0, note.len() as u64, 4));
            w(0x200, &note);
        }
        w(0x1000, code);
        img
    }

    fn write_temp(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("dmavisor-elf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    }

    #[test]
    fn elf_with_pvh_note_boots_via_pvh() {
        let m = mem();
        let p = write_temp("pvh.elf", &tiny_elf(&[0x0f, 0x0b, 0xeb, 0xfe], true));
        let k = load_kernel(&m, &p).unwrap();
        assert!(matches!(k.protocol, BootProtocol::Pvh));
        assert_eq!(k.entry, 0x100000);
        let code: [u8; 4] = m.read_obj(GuestAddress(0x100000)).unwrap();
        assert_eq!(code, [0x0f, 0x0b, 0xeb, 0xfe]);
        std::fs::remove_file(p).unwrap();
    }

    #[test]
    fn elf_without_pvh_note_is_refused() {
        let p = write_temp("nopvh.elf", &tiny_elf(&[0xf4], false));
        let err = load_kernel(&mem(), &p).unwrap_err().to_string();
        assert!(err.contains("PVH"), "{err}");
        std::fs::remove_file(p).unwrap();
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
