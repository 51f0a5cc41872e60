//! One virtio-blk request (virtio 1.2, 5.2.6): parsed from a walked chain,
//! checked against the disk, executed, answered with a status byte.
//!
//! WHY a parser separate from the worker: everything here is guest input
//! (the chain's layout, the header, the sector range, discard segments)
//! and can be tested and fuzzed without a queue or a thread.
//!
//! Layout rules (VIRTIO_F_VERSION_1 implies any layout): the 16-byte header
//! is the first 16 device-readable bytes, whatever the descriptors'
//! boundaries; the status is the last device-writable byte; data is what
//! lies between. A chain without a writable byte cannot be answered at all
//! ([`RequestError::NoStatus`]: the worker stops the queue); every other
//! fault is answered with IOERR or UNSUPP and the queue goes on.
//!
//! Reads and writes are checked against the disk's [`Limits`] before any
//! data moves, and move [`Limits::section_bytes`] at a time, each chunk
//! translated and used in its own quiescence [`Section`].

use log::debug;
use thiserror::Error;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_DISCARD,
    VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
    VIRTIO_BLK_T_WRITE_ZEROES, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP,
};
use vm_memory::{Bytes, GuestAddress, GuestMemory, Permissions};

use super::image::{DiskImage, MAX_IOVECS};
use super::limits::Limits;
use super::section::Section;
use super::{MAX_DISCARD_SECTORS, MAX_DISCARD_SEGMENTS, SECTOR_SIZE};
use crate::dma::DmaSpace;
use crate::virtio::chain::{Buffer, Chain};
use crate::width::{const_u8, usize_from_u64};

/// `struct virtio_blk_outhdr`: type, ioprio (ignored), sector.
const HEADER_LEN: u64 = 16;
/// `struct virtio_blk_discard_write_zeroes`: sector, num_sectors, flags.
const SEGMENT_LEN: u64 = 16;
/// The status bytes, as the one byte the device writes (the bindings give
/// them as `u32`; the compiler checks they fit).
const STATUS_OK: u8 = const_u8(VIRTIO_BLK_S_OK as i128);
const STATUS_IOERR: u8 = const_u8(VIRTIO_BLK_S_IOERR as i128);
const STATUS_UNSUPP: u8 = const_u8(VIRTIO_BLK_S_UNSUPP as i128);

/// What a request asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestType {
    /// Read sectors into the writable data.
    In,
    /// Write the readable data to sectors.
    Out,
    /// Make earlier writes durable.
    Flush,
    /// The device id string.
    GetId,
    /// Deallocate ranges.
    Discard,
    /// Zero ranges.
    WriteZeroes,
    /// Anything else (answered UNSUPP).
    Other(u32),
}

impl From<u32> for RequestType {
    fn from(t: u32) -> Self {
        match t {
            VIRTIO_BLK_T_IN => Self::In,
            VIRTIO_BLK_T_OUT => Self::Out,
            VIRTIO_BLK_T_FLUSH => Self::Flush,
            VIRTIO_BLK_T_GET_ID => Self::GetId,
            VIRTIO_BLK_T_DISCARD => Self::Discard,
            VIRTIO_BLK_T_WRITE_ZEROES => Self::WriteZeroes,
            other => Self::Other(other),
        }
    }
}

/// Why a request failed.
#[derive(Debug, Error)]
pub enum RequestError {
    /// No device-writable byte for the status: the request cannot be
    /// answered (the worker stops the queue).
    #[error("request without a writable status byte")]
    NoStatus,
    /// The status byte could not be written (IOMMU refusal, not RAM).
    #[error("status byte at {0:#x} is not writable")]
    StatusUnwritable(u64),
    /// Fewer than 16 readable bytes.
    #[error("request header is {0} bytes long, not 16")]
    ShortHeader(u64),
    /// A header or discard segment could not be read.
    #[error("request buffer at {0:#x} is not readable")]
    Unreadable(u64),
    /// A data buffer was refused by the IOMMU or is not guest RAM.
    #[error("data buffer at {0:#x} is not accessible")]
    DataInaccessible(u64),
    /// Data length not a whole number of sectors.
    #[error("data length {0} is not a multiple of 512")]
    NotSectorMultiple(u64),
    /// The range leaves the disk (or overflows).
    #[error("sectors {sector}+{bytes} bytes outside a disk of {capacity} sectors")]
    OutOfRange {
        /// First sector.
        sector: u64,
        /// Length in bytes.
        bytes: u64,
        /// Disk capacity in sectors.
        capacity: u64,
    },
    /// A write to a read-only disk.
    #[error("write to a read-only disk")]
    ReadOnly,
    /// Malformed DISCARD / WRITE_ZEROES segments.
    #[error("discard/write-zeroes segments: {0}")]
    BadSegments(&'static str),
    /// More data segments than the advertised `seg_max`.
    #[error("{segments} data segments, more than seg_max {max}")]
    TooManySegments {
        /// Segments of the request.
        segments: usize,
        /// The limit.
        max: u32,
    },
    /// A data segment longer than the advertised `size_max`.
    #[error("data segment of {len} bytes, more than size_max {max}")]
    SegmentTooLarge {
        /// Its length.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// A type or flag the device does not implement.
    #[error("unsupported request type {0}")]
    Unsupported(u32),
    /// The image refused the operation.
    #[error("image I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl RequestError {
    /// The status byte that answers this error.
    pub fn status(&self) -> u8 {
        match self {
            Self::Unsupported(_) => STATUS_UNSUPP,
            _ => STATUS_IOERR,
        }
    }
}

/// A parsed request: its type, first sector, data buffers (header and
/// status cut off) and where its status goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// Raw type field.
    pub type_: u32,
    /// First sector (IN/OUT).
    pub sector: u64,
    /// Device-readable data after the header (OUT, DISCARD, WRITE_ZEROES).
    pub readable: Vec<Buffer>,
    /// Device-writable data before the status byte (IN, GET_ID).
    pub writable: Vec<Buffer>,
    /// Guest address of the status byte.
    pub status: u64,
}

/// The buffers of `bufs` after its first `skip` bytes.
fn skip_front(bufs: &[Buffer], mut skip: u64, out: &mut Vec<Buffer>) {
    out.clear();
    for b in bufs {
        match u32::try_from(skip) {
            // Cut in this buffer; addr wrap is caught at translation.
            Ok(s) if s < b.len => {
                out.push(Buffer {
                    addr: b.addr.wrapping_add(skip),
                    len: b.len - s,
                });
                skip = 0;
            }
            _ => skip -= u64::from(b.len),
        }
    }
}

fn total(bufs: &[Buffer]) -> u64 {
    bufs.iter().map(|b| u64::from(b.len)).sum()
}

/// Reads the first `out.len()` bytes of `bufs` into `out`.
fn gather(mem: &DmaSpace, bufs: &[Buffer], out: &mut [u8]) -> Result<(), RequestError> {
    let mut done = 0usize;
    for b in bufs {
        if done == out.len() {
            break;
        }
        let n = (b.len as usize).min(out.len() - done);
        let dst = out
            .get_mut(done..done + n)
            .ok_or(RequestError::Unreadable(b.addr))?;
        mem.read_slice(dst, GuestAddress(b.addr))
            .map_err(|_| RequestError::Unreadable(b.addr))?;
        done += n;
    }
    if done < out.len() {
        return Err(RequestError::ShortHeader(done as u64));
    }
    Ok(())
}

/// Splits `chain` into a [`Request`] (reusing `req`'s vectors).
///
/// Only `NoStatus` leaves `req.status` meaningless; after any other error
/// the caller still answers through `req.status`.
pub fn parse(mem: &DmaSpace, chain: &Chain, req: &mut Request) -> Result<(), RequestError> {
    // The status: the last byte of the last non-empty writable buffer.
    let Some(last) = chain.writable.iter().rposition(|b| b.len > 0) else {
        return Err(RequestError::NoStatus);
    };
    req.writable.clear();
    let mut status = 0;
    for (i, b) in chain.writable.iter().enumerate().take(last + 1) {
        if i == last {
            status = b.addr.wrapping_add(u64::from(b.len) - 1);
            if b.len > 1 {
                req.writable.push(Buffer {
                    addr: b.addr,
                    len: b.len - 1,
                });
            }
        } else if b.len > 0 {
            req.writable.push(*b);
        }
    }
    req.status = status;
    req.type_ = 0;
    req.sector = 0;
    req.readable.clear();
    let have = chain.readable_len();
    if have < HEADER_LEN {
        return Err(RequestError::ShortHeader(have));
    }
    let mut hdr = [0u8; usize_from_u64(HEADER_LEN)];
    gather(mem, &chain.readable, &mut hdr)?;
    let mut t = [0u8; 4];
    t.copy_from_slice(&hdr[0..4]);
    let mut s = [0u8; 8];
    s.copy_from_slice(&hdr[8..16]);
    req.type_ = u32::from_le_bytes(t);
    req.sector = u64::from_le_bytes(s);
    skip_front(&chain.readable, HEADER_LEN, &mut req.readable);
    Ok(())
}

/// Checks that `bytes` from `sector` are whole sectors inside the disk;
/// returns the byte offset.
fn check_range(sector: u64, bytes: u64, capacity: u64) -> Result<u64, RequestError> {
    if !bytes.is_multiple_of(SECTOR_SIZE) {
        return Err(RequestError::NotSectorMultiple(bytes));
    }
    let out = || RequestError::OutOfRange {
        sector,
        bytes,
        capacity,
    };
    let end = (bytes / SECTOR_SIZE).checked_add(sector).ok_or_else(out)?;
    if end > capacity {
        return Err(out());
    }
    sector.checked_mul(SECTOR_SIZE).ok_or_else(out)
}

/// Where a transfer is: the image offset its pending iovecs start at, and
/// their bytes.
struct Cursor {
    offset: u64,
    batch: u64,
}

/// Moves data between `bufs` (guest memory, translated now) and the image
/// at `offset`, [`MAX_IOVECS`] host slices at a time, and `section_bytes`
/// per quiescence section: the iovecs of a section are used up before it
/// is left, and the next chunk is translated in the next one.
fn transfer(
    disk: &DiskImage,
    bufs: &[Buffer],
    offset: u64,
    write_to_disk: bool,
    io: &mut RequestIo<'_, '_>,
) -> Result<(), RequestError> {
    let access = if write_to_disk {
        Permissions::Read
    } else {
        Permissions::Write
    };
    let section_bytes = io.limits.section_bytes.max(1);
    let (iov, section) = (&mut *io.iov, &mut *io.section);
    iov.clear();
    let mut at = Cursor { offset, batch: 0 };
    let flush = |iov: &mut Vec<libc::iovec>, at: &mut Cursor| -> Result<(), RequestError> {
        if write_to_disk {
            disk.write_at(iov, at.offset)?;
        } else {
            disk.read_at(iov, at.offset)?;
        }
        iov.clear();
        at.offset += at.batch;
        at.batch = 0;
        Ok(())
    };
    let mut in_section = 0u64;
    for b in bufs {
        let mut addr = b.addr;
        let mut left = u64::from(b.len);
        while left > 0 {
            if in_section >= section_bytes {
                flush(iov, &mut at)?;
                section.renew();
                in_section = 0;
            }
            let n = left.min(section_bytes - in_section);
            let piece = addr;
            let bad = || RequestError::DataInaccessible(piece);
            let len = usize::try_from(n).map_err(|_| bad())?;
            for s in section
                .get_slices(GuestAddress(piece), len, access)
                .map_err(|_| bad())?
            {
                let s = s.map_err(|_| bad())?;
                if s.is_empty() {
                    continue;
                }
                if iov.len() == MAX_IOVECS {
                    flush(iov, &mut at)?;
                }
                at.batch += s.len() as u64;
                iov.push(libc::iovec {
                    iov_base: s.ptr_guard_mut().as_ptr().cast(),
                    iov_len: s.len(),
                });
            }
            in_section += n;
            left -= n;
            if left > 0 {
                addr = addr.checked_add(n).ok_or_else(bad)?;
            }
        }
    }
    if !iov.is_empty() {
        flush(iov, &mut at)?;
    }
    Ok(())
}

/// DISCARD and WRITE_ZEROES: reads and checks the segments, then applies
/// them.
fn discard_or_zero(
    mem: &DmaSpace,
    disk: &DiskImage,
    req: &Request,
    zero: bool,
) -> Result<(), RequestError> {
    if disk.readonly() {
        return Err(RequestError::ReadOnly);
    }
    let t = req.type_;
    if !disk.punch_hole() {
        return Err(RequestError::Unsupported(t));
    }
    let len = total(&req.readable);
    if len == 0 || !len.is_multiple_of(SEGMENT_LEN) {
        return Err(RequestError::BadSegments("length not a multiple of 16"));
    }
    let count = len / SEGMENT_LEN;
    if count > u64::from(MAX_DISCARD_SEGMENTS) {
        return Err(RequestError::BadSegments("more segments than max_*_seg"));
    }
    let mut raw = [0u8; usize_from_u64(SEGMENT_LEN) * MAX_DISCARD_SEGMENTS as usize];
    let raw = raw
        .get_mut(..usize_from_u64(len))
        .ok_or(RequestError::BadSegments("internal bounds"))?;
    gather(mem, &req.readable, raw)?;
    let mut ranges = [(0u64, 0u64); MAX_DISCARD_SEGMENTS as usize];
    for (seg, r) in raw
        .chunks_exact(usize_from_u64(SEGMENT_LEN))
        .zip(ranges.iter_mut())
    {
        let mut s = [0u8; 8];
        s.copy_from_slice(&seg[0..8]);
        let mut n = [0u8; 4];
        n.copy_from_slice(&seg[8..12]);
        let mut f = [0u8; 4];
        f.copy_from_slice(&seg[12..16]);
        let (sector, sectors, flags) = (
            u64::from_le_bytes(s),
            u32::from_le_bytes(n),
            u32::from_le_bytes(f),
        );
        // DISCARD has no flags; WRITE_ZEROES only "may unmap".
        let allowed = if zero {
            VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP
        } else {
            0
        };
        if flags & !allowed != 0 {
            return Err(RequestError::Unsupported(t));
        }
        if sectors > MAX_DISCARD_SECTORS {
            return Err(RequestError::BadSegments("more sectors than max_*_sectors"));
        }
        let bytes = u64::from(sectors) * SECTOR_SIZE;
        *r = (check_range(sector, bytes, disk.sectors())?, bytes);
    }
    for (offset, bytes) in ranges.iter().take(count as usize) {
        if zero {
            disk.write_zeroes(*offset, *bytes)?;
        } else {
            disk.discard(*offset, *bytes)?;
        }
    }
    Ok(())
}

/// What moving a request's data needs from its worker: the disk's
/// limits, an iovec buffer kept between requests, and the section the
/// request runs in.
pub struct RequestIo<'r, 'a> {
    /// The disk's limits.
    pub limits: Limits,
    /// Host iovecs (kept for their capacity).
    pub iov: &'r mut Vec<libc::iovec>,
    /// The request's quiescence section.
    pub section: &'r mut Section<'a>,
}

/// Executes a parsed request; returns how many data bytes it wrote into
/// the guest's writable buffers (the status byte not counted).
pub fn execute(
    disk: &DiskImage,
    req: &Request,
    io: &mut RequestIo<'_, '_>,
) -> Result<u32, RequestError> {
    match RequestType::from(req.type_) {
        RequestType::In => {
            io.limits.check(&req.writable)?;
            let bytes = total(&req.writable);
            let offset = check_range(req.sector, bytes, disk.sectors())?;
            transfer(disk, &req.writable, offset, false, io)?;
            // The chain walker bounds a chain's total to 32 bits.
            Ok(u32::try_from(bytes).unwrap_or(u32::MAX))
        }
        RequestType::Out => {
            if disk.readonly() {
                return Err(RequestError::ReadOnly);
            }
            io.limits.check(&req.readable)?;
            let bytes = total(&req.readable);
            let offset = check_range(req.sector, bytes, disk.sectors())?;
            transfer(disk, &req.readable, offset, true, io)?;
            Ok(0)
        }
        RequestType::Flush => {
            disk.flush()?;
            Ok(0)
        }
        RequestType::GetId => {
            let mut left: &[u8] = disk.id();
            let mut written = 0u32;
            for b in &req.writable {
                if left.is_empty() {
                    break;
                }
                // At most b.len bytes, so `n` fits the u32 it is counted in.
                let n32 = u32::try_from(left.len()).map_or(b.len, |l| l.min(b.len));
                let n = n32 as usize;
                let (now, rest) = left.split_at(n);
                io.section
                    .write_slice(now, GuestAddress(b.addr))
                    .map_err(|_| RequestError::DataInaccessible(b.addr))?;
                left = rest;
                written += n32;
            }
            Ok(written)
        }
        RequestType::Discard => discard_or_zero(io.section, disk, req, false).map(|()| 0),
        RequestType::WriteZeroes => discard_or_zero(io.section, disk, req, true).map(|()| 0),
        RequestType::Other(t) => Err(RequestError::Unsupported(t)),
    }
}

/// What serving one chain came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Served {
    /// The status byte written.
    pub status: u8,
    /// The used-ring length: data bytes written plus the status byte.
    pub used_len: u32,
}

/// Parses, executes and answers the request in `chain`, in `io.section`
/// (renewed between chunks of data; the status is written in the last).
/// `Err` only when no status could be delivered (the queue must stop);
/// `failure` receives the error a request was answered with, for the
/// caller's log.
pub fn serve(
    disk: &DiskImage,
    chain: &Chain,
    req: &mut Request,
    io: &mut RequestIo<'_, '_>,
    failure: &mut Option<RequestError>,
) -> Result<Served, RequestError> {
    let outcome = parse(io.section, chain, req).and_then(|()| execute(disk, req, io));
    let (status, written) = match outcome {
        Ok(n) => (STATUS_OK, n),
        Err(RequestError::NoStatus) => return Err(RequestError::NoStatus),
        Err(e) => {
            debug!("virtio-blk request {}: {e}", chain.head);
            let s = e.status();
            *failure = Some(e);
            // Data written before a failure may stay; the guest is told
            // the request failed and must not rely on it.
            (s, 0)
        }
    };
    io.section
        .write_obj(status, GuestAddress(req.status))
        .map_err(|_| RequestError::StatusUnwritable(req.status))?;
    Ok(Served {
        status,
        used_len: written.saturating_add(1),
    })
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
