//! The raw image behind a disk: positioned vectored I/O straight between
//! the file and guest memory, flush, and hole punching.
//!
//! WHY `preadv`/`pwritev` on iovecs into guest memory rather than a bounce
//! buffer: in the nested runner every byte the VMM copies is emulated, and a
//! second copy per request would show in the throughput next to QEMU. The
//! iovecs come from the device's `DmaSpace` (translated, bounds-checked
//! slices), so no unchecked guest address reaches the kernel.
//!
//! WHY positioned I/O on one shared `File`: every queue's worker uses the
//! same image without a lock; the file offset is never used.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use log::warn;
use thiserror::Error;

use super::SECTOR_SIZE;

/// Length of the GET_ID answer (virtio 1.2, 5.2.6).
pub const ID_BYTES: usize = virtio_bindings::virtio_blk::VIRTIO_BLK_ID_BYTES as usize;
/// Most iovecs one `preadv`/`pwritev` call takes (Linux's `UIO_MAXIOV`).
pub const MAX_IOVECS: usize = 1024;

/// Why an image cannot back a disk.
#[derive(Debug, Error)]
pub enum ImageError {
    /// The file cannot be opened.
    #[error("cannot open disk image '{path}': {source}")]
    Open {
        /// Path given.
        path: String,
        /// OS error.
        source: io::Error,
    },
    /// Its size cannot be found.
    #[error("cannot find the size of disk image '{path}': {source}")]
    Size {
        /// Path given.
        path: String,
        /// OS error.
        source: io::Error,
    },
    /// It holds not even one sector.
    #[error("disk image '{path}' is smaller than one 512-byte sector")]
    Empty {
        /// Path given.
        path: String,
    },
}

/// A raw disk image opened for the device.
#[derive(Debug)]
pub struct DiskImage {
    file: File,
    /// Whole sectors of the image: a trailing partial sector is not exposed.
    sectors: u64,
    readonly: bool,
    /// The file system punches holes (DISCARD and WRITE_ZEROES are offered).
    punch_hole: bool,
    id: [u8; ID_BYTES],
}

/// The GET_ID answer: the user's id, else one made of the file's device
/// and inode numbers (stable across runs, like a serial number).
fn make_id(file: &File, id: Option<&str>) -> [u8; ID_BYTES] {
    let text = match (id, file.metadata()) {
        (Some(id), _) => id.to_string(),
        (None, Ok(m)) => format!("dmv{:x}-{:x}", m.dev(), m.ino()),
        (None, Err(_)) => "dmavisor-disk".to_string(),
    };
    let mut out = [0u8; ID_BYTES];
    for (o, b) in out.iter_mut().zip(text.bytes()) {
        *o = b;
    }
    out
}

/// Whether `fallocate(PUNCH_HOLE)` works on `file`: tried on an empty range
/// just past its end, which holds no data.
fn probe_punch_hole(file: &File, size: u64) -> bool {
    let (Ok(off), Ok(len)) = (i64::try_from(size), i64::try_from(SECTOR_SIZE)) else {
        return false;
    };
    // SAFETY: fallocate on an fd we own; no memory is passed.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            len,
        )
    };
    r == 0
}

impl DiskImage {
    /// Opens `path` (read-write unless `readonly`).
    pub fn open(path: &Path, readonly: bool, id: Option<&str>) -> Result<Self, ImageError> {
        let name = path.display().to_string();
        let file = OpenOptions::new()
            .read(true)
            .write(!readonly)
            .open(path)
            .map_err(|source| ImageError::Open {
                path: name.clone(),
                source,
            })?;
        Self::from_file(file, &name, readonly, id)
    }

    /// Uses an already open file (tests, fuzzing: a memfd). `name` is for
    /// messages only.
    pub fn from_file(
        mut file: File,
        name: &str,
        readonly: bool,
        id: Option<&str>,
    ) -> Result<Self, ImageError> {
        // Seeking to the end also sizes block devices, whose metadata says 0.
        let size = file
            .seek(SeekFrom::End(0))
            .map_err(|source| ImageError::Size {
                path: name.to_string(),
                source,
            })?;
        let sectors = size / SECTOR_SIZE;
        if sectors == 0 {
            return Err(ImageError::Empty {
                path: name.to_string(),
            });
        }
        if size % SECTOR_SIZE != 0 {
            warn!(
                "disk image '{name}': the last {} bytes are not a whole sector and stay hidden",
                size % SECTOR_SIZE
            );
        }
        let punch_hole = !readonly && probe_punch_hole(&file, size);
        Ok(Self {
            id: make_id(&file, id),
            file,
            sectors,
            readonly,
            punch_hole,
        })
    }

    /// Capacity in 512-byte sectors.
    pub fn sectors(&self) -> u64 {
        self.sectors
    }

    /// Whether writes are refused.
    pub fn readonly(&self) -> bool {
        self.readonly
    }

    /// Whether DISCARD and WRITE_ZEROES can be served.
    pub fn punch_hole(&self) -> bool {
        self.punch_hole
    }

    /// The 20-byte GET_ID answer.
    pub fn id(&self) -> &[u8; ID_BYTES] {
        &self.id
    }

    /// Reads into `iov` (at most [`MAX_IOVECS`]) from byte `offset`, all of
    /// it: a short read (the file shrank underneath) is an error.
    pub fn read_at(&self, iov: &mut [libc::iovec], offset: u64) -> io::Result<()> {
        self.io_all(iov, offset, false)
    }

    /// Writes `iov` at byte `offset`, all of it.
    pub fn write_at(&self, iov: &mut [libc::iovec], offset: u64) -> io::Result<()> {
        if self.readonly {
            return Err(io::Error::from(io::ErrorKind::PermissionDenied));
        }
        self.io_all(iov, offset, true)
    }

    fn io_all(&self, mut iov: &mut [libc::iovec], mut offset: u64, write: bool) -> io::Result<()> {
        while let Some(first) = iov.first() {
            if first.iov_len == 0 {
                iov = &mut iov[1..];
                continue;
            }
            let off =
                i64::try_from(offset).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
            let count = i32::try_from(iov.len().min(MAX_IOVECS))
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
            let fd = self.file.as_raw_fd();
            // SAFETY: every iovec points into a live guest memory mapping
            // (a VolatileSlice of the device's DmaSpace, valid for its
            // length) or into a buffer of the caller; the kernel checks
            // the rest. `count` is at most the slice's length.
            let n = unsafe {
                if write {
                    libc::pwritev(fd, iov.as_ptr(), count, off)
                } else {
                    libc::preadv(fd, iov.as_ptr(), count, off)
                }
            };
            // Negative: the call failed (errno); zero: end of the image.
            let mut done = match usize::try_from(n) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
                Ok(done) => done,
                Err(_) => {
                    let e = io::Error::last_os_error();
                    if e.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(e);
                }
            };
            offset += done as u64;
            // Drop the iovecs completed, shorten the one cut in the middle.
            while let Some(v) = iov.first_mut() {
                if done >= v.iov_len {
                    done -= v.iov_len;
                    iov = &mut iov[1..];
                } else {
                    v.iov_base = (v.iov_base as *mut u8).wrapping_add(done) as *mut libc::c_void;
                    v.iov_len -= done;
                    break;
                }
            }
        }
        Ok(())
    }

    /// Makes written data durable (VIRTIO_BLK_T_FLUSH).
    pub fn flush(&self) -> io::Result<()> {
        if self.readonly {
            return Ok(());
        }
        self.file.sync_data()
    }

    /// Deallocates `[offset, offset + len)`; it reads back as zeroes.
    pub fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        )
    }

    /// Zeroes `[offset, offset + len)`: ZERO_RANGE where the file system has
    /// it, else a punched hole (which reads as zeroes too).
    pub fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        match self.fallocate(
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        ) {
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => self.discard(offset, len),
            r => r,
        }
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        if self.readonly || !self.punch_hole {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        }
        let bad = || io::Error::from(io::ErrorKind::InvalidInput);
        let off = i64::try_from(offset).map_err(|_| bad())?;
        let len = i64::try_from(len).map_err(|_| bad())?;
        if len == 0 {
            return Ok(());
        }
        // SAFETY: fallocate on an fd we own; no memory is passed.
        if unsafe { libc::fallocate(self.file.as_raw_fd(), mode, off, len) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::test_util;
    use crate::block::test_util::temp_image;

    #[test]
    fn sizes_ids_and_refusals() {
        let (p, _) = temp_image(4096 + 100);
        let img = DiskImage::open(&p, false, Some("serial-0123456789abcdefXYZ")).unwrap();
        assert_eq!(img.sectors(), 8, "the partial sector is hidden");
        assert_eq!(&img.id()[..], b"serial-0123456789abc");
        let ro = DiskImage::open(&p, true, None).unwrap();
        assert!(ro.readonly() && !ro.punch_hole());
        assert!(ro.id().starts_with(b"dmv"));
        let mut buf = [0u8; 512];
        let mut iov = [libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        }];
        assert!(ro.write_at(&mut iov, 0).is_err());
        ro.read_at(&mut iov, 512).unwrap();
        assert_eq!(buf[0], (512 % 251) as u8);
        // Reading past the end is a short read, an error.
        assert!(ro.read_at(&mut iov, 4096).is_err());
        let (empty, _) = temp_image(100);
        assert!(matches!(
            DiskImage::open(&empty, false, None),
            Err(ImageError::Empty { .. })
        ));
        assert!(DiskImage::open(Path::new("/nonexistent/x.raw"), false, None).is_err());
        let _ = std::fs::remove_file(p);
        let _ = std::fs::remove_file(empty);
    }

    #[test]
    fn vectored_io_crosses_iovecs() {
        let (p, _) = temp_image(8192);
        let img = DiskImage::open(&p, false, None).unwrap();
        let mut a = [0xaau8; 700];
        let mut b = [0xbbu8; 324];
        let mut iov = [
            libc::iovec {
                iov_base: a.as_mut_ptr().cast(),
                iov_len: a.len(),
            },
            libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            },
        ];
        img.write_at(&mut iov, 1024).unwrap();
        let mut back = vec![0u8; 1024];
        let mut iov = [libc::iovec {
            iov_base: back.as_mut_ptr().cast(),
            iov_len: back.len(),
        }];
        img.read_at(&mut iov, 1024).unwrap();
        assert!(back[..700].iter().all(|x| *x == 0xaa));
        assert!(back[700..].iter().all(|x| *x == 0xbb));
        img.flush().unwrap();
        if img.punch_hole() {
            img.write_zeroes(1024, 512).unwrap();
            img.discard(1536, 512).unwrap();
            img.read_at(&mut iov, 1024).unwrap();
            assert!(back.iter().all(|x| *x == 0));
        }
        let _ = std::fs::remove_file(p);
    }

    #[test]
    fn more_iovecs_than_one_call_takes() {
        let (p, _) = temp_image(8192);
        let img = DiskImage::open(&p, true, None).unwrap();
        let mut back = vec![0u8; 4 * (MAX_IOVECS + 100)];
        let mut iov: Vec<libc::iovec> = back
            .chunks_mut(4)
            .map(|c| libc::iovec {
                iov_base: c.as_mut_ptr().cast(),
                iov_len: c.len(),
            })
            .collect();
        img.read_at(&mut iov, 100).unwrap();
        let want: Vec<u8> = (100..100 + back.len()).map(test_util::pattern).collect();
        assert_eq!(back, want);
        let _ = std::fs::remove_file(p);
    }
}
