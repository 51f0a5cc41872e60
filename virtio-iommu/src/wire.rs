//! Exact little-endian wire layouts of the virtio-iommu device (virtio 1.2/1.3,
//! "IOMMU device" section), plus the bounds-checked reader/writer helpers used
//! to parse guest bytes.
//!
//! WHY a hand-written reader instead of `#[repr(C)]` structs and transmutes:
//! every byte here comes from a hostile guest, buffers can be short, unaligned
//! or split oddly by the transport, and a transmute would silently accept all
//! of that. [`LeReader`] makes every field access an explicit, checked read
//! that returns [`WireError`] instead of panicking.
//!
//! Layouts (offsets in bytes, all little-endian):
//!
//! | struct                 | layout |
//! |------------------------|--------|
//! | `req_head` (4)         | type u8, reserved\[3\] |
//! | `req_tail` (4)         | status u8, reserved\[3\] |
//! | ATTACH (readable 20)   | head, domain le32, endpoint le32, flags le32, reserved\[4\] |
//! | DETACH (readable 20)   | head, domain le32, endpoint le32, reserved\[8\] |
//! | MAP (readable 36)      | head, domain le32, virt_start le64, virt_end le64, phys_start le64, flags le32 |
//! | UNMAP (readable 28)    | head, domain le32, virt_start le64, virt_end le64, reserved\[4\] |
//! | PROBE (readable 72)    | head, endpoint le32, reserved\[64\]; writable: properties\[probe_size\], tail |
//! | probe property (4+len) | type le16 (12 bits type, 4 reserved), length le16, value\[length\] |
//! | RESV_MEM value (20)    | subtype u8, reserved\[3\], start le64, end le64 |
//! | fault event (24)       | reason u8, reserved\[3\], flags le32, endpoint le32, reserved1 le32, address le64 |
//! | ATTACH_TABLE (readable 80) | head, domain le32, endpoint le32, flags le32, format le16, reserved\[6\], root le64, reserved\[48\] (draft) |
//! | INVALIDATE (readable 60)   | head, granularity le16, type le16, flags le16, reserved\[2\], domain le32, pasid le32, reserved\[4\], archid le64, virt_start le64, nr_pages le64, granule u8, reserved\[11\] (draft) |
//! | PAGE_TABLE_FMT value (4)   | format le16, reserved\[2\] (draft; property type 6) |
//! | config (40)            | page_size_mask le64, input_range {start,end le64}, domain_range {start,end le32}, probe_size le32, bypass u8, reserved u8, num_queues le16 (draft) |
//!
//! The page-table requests, the PAGE_TABLE_FMT property and `num_queues`
//! follow the virtio-iommu drafts; docs/wire-formats.md gives every
//! field's offset, the draft it comes from and the choices made where the
//! drafts disagree. Only the feature bits (22, 23) and the table format
//! code ([`crate::pgtable::FORMAT_X86_4L`]) are the project's own.

use thiserror::Error;

use crate::pgtable::FORMAT_X86_4L;

/// Feature bit numbers (device-specific range 0..=23).
pub mod feature {
    /// `input_range` in config space is valid.
    pub const INPUT_RANGE: u32 = 0;
    /// `domain_range` in config space is valid.
    pub const DOMAIN_RANGE: u32 = 1;
    /// MAP and UNMAP requests are available.
    pub const MAP_UNMAP: u32 = 2;
    /// Legacy: unattached endpoints bypass (superseded by BYPASS_CONFIG).
    pub const BYPASS: u32 = 3;
    /// PROBE request is available.
    pub const PROBE: u32 = 4;
    /// VIRTIO_IOMMU_MAP_F_MMIO is available.
    pub const MMIO: u32 = 5;
    /// `bypass` config field and VIRTIO_IOMMU_ATTACH_F_BYPASS are available.
    pub const BYPASS_CONFIG: u32 = 6;
    /// Project proposal: several request queues (see docs/multiqueue.md).
    pub const MULTIQUEUE: u32 = 23;
    /// Project proposal: guest-written I/O page tables walked by the device
    /// (ATTACH_TABLE, INVALIDATE; see docs/page-table.md).
    pub const PAGE_TABLE: u32 = 22;
    /// Generic virtio: the device is a modern (1.0+) device.
    pub use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;

    /// The feature bit as a mask.
    pub const fn bit(n: u32) -> u64 {
        1u64 << n
    }
}

/// Request types.
pub mod req_type {
    /// VIRTIO_IOMMU_T_ATTACH: put an endpoint in a domain.
    pub const ATTACH: u8 = 1;
    /// VIRTIO_IOMMU_T_DETACH: take an endpoint out of its domain.
    pub const DETACH: u8 = 2;
    /// VIRTIO_IOMMU_T_MAP: map an IOVA range of a domain.
    pub const MAP: u8 = 3;
    /// VIRTIO_IOMMU_T_UNMAP: unmap the mappings inside an IOVA range.
    pub const UNMAP: u8 = 4;
    /// VIRTIO_IOMMU_T_PROBE: ask for an endpoint's properties.
    pub const PROBE: u8 = 5;
    /// VIRTIO_IOMMU_T_ATTACH_TABLE (drafts): give a domain a guest page table.
    pub const ATTACH_TABLE: u8 = 0x06;
    /// VIRTIO_IOMMU_T_INVALIDATE (drafts): drop cached walks of a range.
    pub const INVALIDATE: u8 = 0x07;
}

/// VIRTIO_IOMMU_ATTACH_F_BYPASS: create/attach to a bypass (identity) domain.
pub const ATTACH_F_BYPASS: u32 = 1 << 0;
/// Every ATTACH flag this device recognizes (when BYPASS_CONFIG is negotiated).
pub const ATTACH_F_ALL: u32 = ATTACH_F_BYPASS;

/// MAP flag: the device may read the mapping (the flags equal the bits of
/// `mapping::Perm`).
pub const MAP_F_READ: u32 = 1 << 0;
/// MAP flag: the device may write the mapping.
pub const MAP_F_WRITE: u32 = 1 << 1;
/// MAP flag: the mapping is of MMIO (VIRTIO_IOMMU_F_MMIO).
pub const MAP_F_MMIO: u32 = 1 << 2;
/// Every MAP flag this device recognizes.
pub const MAP_F_ALL: u32 = MAP_F_READ | MAP_F_WRITE | MAP_F_MMIO;

/// Probe property type: ends the property list.
pub const PROBE_T_NONE: u16 = 0;
/// Probe property type: a reserved memory region.
pub const PROBE_T_RESV_MEM: u16 = 1;
/// VIRTIO_IOMMU_PROBE_T_PAGE_TABLE_FMT (drafts): a table format the device
/// walks for the endpoint.
pub const PROBE_T_PAGE_TABLE_FMT: u16 = 6;
/// Value length of a PAGE_TABLE_FMT property (format le16, reserved\[2\]).
pub const PAGE_TABLE_FMT_LEN: u16 = 4;
/// Total bytes of one PAGE_TABLE_FMT property.
pub const PAGE_TABLE_FMT_PROP_SIZE: usize = PROP_HEAD_SIZE + PAGE_TABLE_FMT_LEN as usize;
/// Only the low 12 bits of a property's type word are the type.
pub const PROBE_T_MASK: u16 = 0x0fff;

/// RESV_MEM subtype: the region is unusable for DMA; the driver never maps it.
pub const RESV_MEM_T_RESERVED: u8 = 0;
/// RESV_MEM subtype: the region is the MSI doorbell, identity-mapped.
pub const RESV_MEM_T_MSI: u8 = 1;

/// Fault reason: not given.
pub const FAULT_R_UNKNOWN: u8 = 0;
/// Fault reason: the endpoint is not in a domain.
pub const FAULT_R_DOMAIN: u8 = 1;
/// Fault reason: no mapping (or the wrong permission) at the address.
pub const FAULT_R_MAPPING: u8 = 2;

/// Fault flag: the access was a read.
pub const FAULT_F_READ: u32 = 1 << 0;
/// Fault flag: the access was a write.
pub const FAULT_F_WRITE: u32 = 1 << 1;
/// Fault flag: the access was an instruction fetch.
pub const FAULT_F_EXEC: u32 = 1 << 2;
/// Fault flag: `address` holds the faulting address.
pub const FAULT_F_ADDRESS: u32 = 1 << 8;

/// Bytes of `req_head`.
pub const HEAD_SIZE: usize = 4;
/// Bytes of `req_tail`.
pub const TAIL_SIZE: usize = 4;
/// Device-readable bytes of an ATTACH request (head and body).
pub const ATTACH_SIZE: usize = HEAD_SIZE + 16;
/// Device-readable bytes of a DETACH request.
pub const DETACH_SIZE: usize = HEAD_SIZE + 16;
/// Device-readable bytes of a MAP request.
pub const MAP_SIZE: usize = HEAD_SIZE + 32;
/// Device-readable bytes of an UNMAP request.
pub const UNMAP_SIZE: usize = HEAD_SIZE + 24;
/// Device-readable bytes of a PROBE request.
pub const PROBE_SIZE: usize = HEAD_SIZE + 4 + 64;
/// Device-readable bytes of an ATTACH_TABLE request (page-table mode; the
/// drafts' 84-byte request less its tail).
pub const ATTACH_TABLE_SIZE: usize = HEAD_SIZE + 76;
/// Device-readable bytes of an INVALIDATE request (page-table mode; the
/// drafts' 64-byte request less its tail).
pub const INVALIDATE_SIZE: usize = HEAD_SIZE + 56;
/// Bytes of a probe property's header (type, length).
pub const PROP_HEAD_SIZE: usize = 4;
/// Value length of a RESV_MEM property (without its 4-byte header).
pub const RESV_MEM_LEN: u16 = 20;
/// Total bytes of one RESV_MEM property.
pub const RESV_MEM_PROP_SIZE: usize = PROP_HEAD_SIZE + RESV_MEM_LEN as usize;
/// Bytes of a fault event.
pub const FAULT_SIZE: usize = 24;
/// Bytes of the configuration space.
pub const CONFIG_SIZE: usize = 40;
/// Byte offset of `num_queues` (le16, drafts): the number of request
/// queues with the multi-queue feature offered, zero otherwise.
pub const CONFIG_NUM_QUEUES_OFFSET: usize = 38;

/// INVALIDATE granularity: every cached walk of the domain.
pub const INVAL_G_DOMAIN: u16 = 1 << 0;
/// INVALIDATE granularity: one PASID of the domain (no PASIDs here).
pub const INVAL_G_PASID: u16 = 1 << 1;
/// INVALIDATE granularity: `nr_pages` pages of `1 << granule` bytes from
/// `virt_start`.
pub const INVAL_G_VA: u16 = 1 << 2;
/// INVALIDATE type: the IOMMU's own translation cache.
pub const INV_T_IOTLB: u16 = 1 << 0;
/// INVALIDATE type: the endpoints' ATS caches (no ATS here: nothing to do).
pub const INV_T_DEV_IOTLB: u16 = 1 << 1;
/// INVALIDATE type: PASID table caches (no PASID tables here).
pub const INV_T_PASID: u16 = 1 << 2;
/// Every INVALIDATE type bit the drafts define.
pub const INV_T_ALL: u16 = INV_T_IOTLB | INV_T_DEV_IOTLB | INV_T_PASID;
/// INVALIDATE flag: `pasid` is valid.
pub const INVAL_F_PASID: u16 = 1 << 0;
/// INVALIDATE flag: `archid` (an ASID-like tag) is valid.
pub const INVAL_F_ARCHID: u16 = 1 << 1;
/// INVALIDATE flag: only leaf entries changed.
pub const INVAL_F_LEAF: u16 = 1 << 2;
/// Every INVALIDATE flag the drafts define.
pub const INVAL_F_ALL: u16 = INVAL_F_PASID | INVAL_F_ARCHID | INVAL_F_LEAF;
/// The granule of the project's table format (4 KiB pages).
pub const GRANULE_4K: u8 = 12;

/// Status codes written into `req_tail.status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// All good.
    Ok = 0,
    /// Virtio communication error.
    IoErr = 1,
    /// Unsupported request.
    Unsupp = 2,
    /// Internal device error.
    DevErr = 3,
    /// Invalid parameters.
    Inval = 4,
    /// Out-of-range parameters.
    Range = 5,
    /// Entry not found.
    NoEnt = 6,
    /// Bad address.
    Fault = 7,
    /// Insufficient resources.
    NoMem = 8,
}

impl Status {
    /// Decodes a status byte (used by tests and by drivers written in Rust).
    pub fn from_u8(v: u8) -> Option<Status> {
        Some(match v {
            0 => Status::Ok,
            1 => Status::IoErr,
            2 => Status::Unsupp,
            3 => Status::DevErr,
            4 => Status::Inval,
            5 => Status::Range,
            6 => Status::NoEnt,
            7 => Status::Fault,
            8 => Status::NoMem,
            _ => return None,
        })
    }
}

/// Why guest bytes could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum WireError {
    /// The buffer ends before the field at `offset` of `need` bytes.
    #[error("buffer too short: need {need} bytes at offset {offset}, have {have}")]
    TooShort {
        /// Where the field starts.
        offset: usize,
        /// How many bytes it needs.
        need: usize,
        /// How many bytes the buffer has.
        have: usize,
    },
    /// The request type byte is not one of the spec's types.
    #[error("unknown request type {0}")]
    UnknownType(u8),
}

/// Sequential, bounds-checked little-endian reader over guest bytes.
#[derive(Debug, Clone)]
pub struct LeReader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> LeReader<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Current offset from the start of the buffer.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Takes the next `N` bytes, or reports how short the buffer is.
    pub fn bytes<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let short = WireError::TooShort {
            offset: self.pos,
            need: N,
            have: self.buf.len(),
        };
        let end = self.pos.checked_add(N).ok_or(short)?;
        let slice = self.buf.get(self.pos..end).ok_or(short)?;
        let mut out = [0u8; N];
        out.copy_from_slice(slice);
        self.pos = end;
        Ok(out)
    }

    /// Reads one byte.
    pub fn u8(&mut self) -> Result<u8, WireError> {
        Ok(u8::from_le_bytes(self.bytes::<1>()?))
    }

    /// Reads a little-endian u16.
    pub fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.bytes::<2>()?))
    }

    /// Reads a little-endian u32.
    pub fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.bytes::<4>()?))
    }

    /// Reads a little-endian u64.
    pub fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.bytes::<8>()?))
    }
}

/// Sequential little-endian writer into a fixed buffer; writes that do not fit
/// fail with [`WireError::TooShort`] and leave the buffer untouched.
#[derive(Debug)]
pub struct LeWriter<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> LeWriter<'a> {
    /// A writer at the start of `buf`.
    pub fn new(buf: &'a mut [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Bytes written so far.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Appends `data`, or fails without writing when it does not fit.
    pub fn put(&mut self, data: &[u8]) -> Result<(), WireError> {
        let short = WireError::TooShort {
            offset: self.pos,
            need: data.len(),
            have: self.buf.len(),
        };
        let end = self.pos.checked_add(data.len()).ok_or(short)?;
        let dst = self.buf.get_mut(self.pos..end).ok_or(short)?;
        dst.copy_from_slice(data);
        self.pos = end;
        Ok(())
    }

    /// Writes one byte.
    pub fn u8(&mut self, v: u8) -> Result<(), WireError> {
        self.put(&[v])
    }

    /// Writes a little-endian u16.
    pub fn u16(&mut self, v: u16) -> Result<(), WireError> {
        self.put(&v.to_le_bytes())
    }

    /// Writes a little-endian u32.
    pub fn u32(&mut self, v: u32) -> Result<(), WireError> {
        self.put(&v.to_le_bytes())
    }

    /// Writes a little-endian u64.
    pub fn u64(&mut self, v: u64) -> Result<(), WireError> {
        self.put(&v.to_le_bytes())
    }
}

/// ATTACH request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachReq {
    /// The domain to attach to (created on first use).
    pub domain: u32,
    /// The endpoint to attach.
    pub endpoint: u32,
    /// ATTACH_F_* flags.
    pub flags: u32,
    /// Must be zero (device MUST answer S_INVAL otherwise).
    pub reserved: [u8; 4],
}

/// DETACH request body (its reserved bytes are ignored, as the spec says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DetachReq {
    /// The domain the endpoint should leave.
    pub domain: u32,
    /// The endpoint to detach.
    pub endpoint: u32,
}

/// MAP request body; `virt_end` is inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapReq {
    /// The domain to map in.
    pub domain: u32,
    /// First IOVA of the range.
    pub virt_start: u64,
    /// Last IOVA of the range (inclusive).
    pub virt_end: u64,
    /// Guest-physical address `virt_start` maps to.
    pub phys_start: u64,
    /// MAP_F_* flags.
    pub flags: u32,
}

/// UNMAP request body; `virt_end` is inclusive; reserved bytes are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnmapReq {
    /// The domain to unmap from.
    pub domain: u32,
    /// First IOVA of the range.
    pub virt_start: u64,
    /// Last IOVA of the range (inclusive).
    pub virt_end: u64,
}

/// PROBE request body (device-readable part; reserved bytes are ignored).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeReq {
    /// The endpoint whose properties are asked for.
    pub endpoint: u32,
}

/// ATTACH_TABLE request body (drafts): domain `domain`, which `endpoint`
/// is in, translates through the guest table of `format` whose root is at
/// guest-physical `root`. The reserved bytes are kept so that the device
/// can refuse a request that sets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachTableReq {
    /// The domain.
    pub domain: u32,
    /// An endpoint of the domain (the drafts attach per endpoint).
    pub endpoint: u32,
    /// No flag is defined for a page table: must be zero.
    pub flags: u32,
    /// The table format (PAGE_TABLE_FMT's `format`).
    pub format: u16,
    /// Must be zero (S_INVAL otherwise).
    pub reserved: [u8; 6],
    /// Guest-physical address of the root table (4 KiB aligned).
    pub root: u64,
    /// Must be zero (S_INVAL otherwise).
    pub reserved2: [u8; 48],
}

impl AttachTableReq {
    /// A well-formed request for the project's table format.
    pub fn new(domain: u32, endpoint: u32, root: u64) -> Self {
        Self {
            domain,
            endpoint,
            flags: 0,
            format: FORMAT_X86_4L,
            reserved: [0; 6],
            root,
            reserved2: [0; 48],
        }
    }
}

/// INVALIDATE request body (drafts). The reserved bytes are kept so that
/// the device can refuse a request that sets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidateReq {
    /// INVAL_G_*: what the request covers.
    pub granularity: u16,
    /// INV_T_*: which caches.
    pub inv_type: u16,
    /// INVAL_F_*.
    pub flags: u16,
    /// Must be zero.
    pub reserved1: [u8; 2],
    /// The domain.
    pub domain: u32,
    /// The PASID (with INVAL_F_PASID).
    pub pasid: u32,
    /// Must be zero.
    pub reserved2: [u8; 4],
    /// Architecture-specific tag (with INVAL_F_ARCHID).
    pub archid: u64,
    /// First IOVA (INVAL_G_VA).
    pub virt_start: u64,
    /// Pages of `1 << granule` bytes (INVAL_G_VA).
    pub nr_pages: u64,
    /// log2 of the page size.
    pub granule: u8,
    /// Must be zero.
    pub reserved3: [u8; 11],
}

impl InvalidateReq {
    /// The IOTLB entries of the 4 KiB pages covering
    /// `virt_start..=virt_end`; an empty range (`virt_end < virt_start`)
    /// gives `nr_pages` 0, which the device refuses.
    pub fn range(domain: u32, virt_start: u64, virt_end: u64) -> Self {
        let start = virt_start & !0xfff;
        let pages = if virt_end < virt_start {
            0
        } else {
            ((virt_end - start) >> GRANULE_4K).saturating_add(1)
        };
        Self {
            granularity: INVAL_G_VA,
            virt_start: start,
            nr_pages: pages,
            granule: GRANULE_4K,
            ..Self::domain(domain)
        }
    }

    /// Every IOTLB entry of the domain.
    pub fn domain(domain: u32) -> Self {
        Self {
            granularity: INVAL_G_DOMAIN,
            inv_type: INV_T_IOTLB,
            flags: 0,
            reserved1: [0; 2],
            domain,
            pasid: 0,
            reserved2: [0; 4],
            archid: 0,
            virt_start: 0,
            nr_pages: 0,
            granule: 0,
            reserved3: [0; 11],
        }
    }
}

/// One parsed request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// An ATTACH request.
    Attach(AttachReq),
    /// A DETACH request.
    Detach(DetachReq),
    /// A MAP request.
    Map(MapReq),
    /// An UNMAP request.
    Unmap(UnmapReq),
    /// A PROBE request.
    Probe(ProbeReq),
    /// An ATTACH_TABLE request (page-table mode).
    AttachTable(AttachTableReq),
    /// An INVALIDATE request (page-table mode).
    Invalidate(InvalidateReq),
}

/// Reads the type byte of a request head; the head's reserved bytes are ignored
/// (device MUST ignore them).
pub fn request_type(readable: &[u8]) -> Result<u8, WireError> {
    let mut r = LeReader::new(readable);
    let t = r.u8()?;
    r.bytes::<3>()?;
    Ok(t)
}

/// Parses the device-readable part of a request. The readable part must hold
/// the whole spec structure (without the tail) for its type; trailing bytes are
/// ignored so that a future, longer layout is still accepted.
pub fn parse_request(readable: &[u8]) -> Result<Request, WireError> {
    let t = request_type(readable)?;
    let mut r = LeReader::new(readable);
    r.bytes::<HEAD_SIZE>()?;
    Ok(match t {
        req_type::ATTACH => Request::Attach(AttachReq {
            domain: r.u32()?,
            endpoint: r.u32()?,
            flags: r.u32()?,
            reserved: r.bytes::<4>()?,
        }),
        req_type::DETACH => {
            let domain = r.u32()?;
            let endpoint = r.u32()?;
            r.bytes::<8>()?;
            Request::Detach(DetachReq { domain, endpoint })
        }
        req_type::MAP => Request::Map(MapReq {
            domain: r.u32()?,
            virt_start: r.u64()?,
            virt_end: r.u64()?,
            phys_start: r.u64()?,
            flags: r.u32()?,
        }),
        req_type::UNMAP => {
            let domain = r.u32()?;
            let virt_start = r.u64()?;
            let virt_end = r.u64()?;
            r.bytes::<4>()?;
            Request::Unmap(UnmapReq {
                domain,
                virt_start,
                virt_end,
            })
        }
        req_type::PROBE => {
            let endpoint = r.u32()?;
            r.bytes::<64>()?;
            Request::Probe(ProbeReq { endpoint })
        }
        req_type::ATTACH_TABLE => Request::AttachTable(AttachTableReq {
            domain: r.u32()?,
            endpoint: r.u32()?,
            flags: r.u32()?,
            format: r.u16()?,
            reserved: r.bytes::<6>()?,
            root: r.u64()?,
            reserved2: r.bytes::<48>()?,
        }),
        req_type::INVALIDATE => Request::Invalidate(InvalidateReq {
            granularity: r.u16()?,
            inv_type: r.u16()?,
            flags: r.u16()?,
            reserved1: r.bytes::<2>()?,
            domain: r.u32()?,
            pasid: r.u32()?,
            reserved2: r.bytes::<4>()?,
            archid: r.u64()?,
            virt_start: r.u64()?,
            nr_pages: r.u64()?,
            granule: r.u8()?,
            reserved3: r.bytes::<11>()?,
        }),
        other => return Err(WireError::UnknownType(other)),
    })
}

/// Encodes a request tail (status + zeroed reserved bytes).
pub fn encode_tail(status: Status) -> [u8; TAIL_SIZE] {
    [status as u8, 0, 0, 0]
}

/// Serializes requests; used by tests, the fuzzer and any Rust-side driver.
impl Request {
    /// The request's device-readable bytes: head, then body.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(PROBE_SIZE);
        match *self {
            Request::Attach(a) => {
                v.extend_from_slice(&[req_type::ATTACH, 0, 0, 0]);
                v.extend_from_slice(&a.domain.to_le_bytes());
                v.extend_from_slice(&a.endpoint.to_le_bytes());
                v.extend_from_slice(&a.flags.to_le_bytes());
                v.extend_from_slice(&a.reserved);
            }
            Request::Detach(d) => {
                v.extend_from_slice(&[req_type::DETACH, 0, 0, 0]);
                v.extend_from_slice(&d.domain.to_le_bytes());
                v.extend_from_slice(&d.endpoint.to_le_bytes());
                v.extend_from_slice(&[0u8; 8]);
            }
            Request::Map(m) => {
                v.extend_from_slice(&[req_type::MAP, 0, 0, 0]);
                v.extend_from_slice(&m.domain.to_le_bytes());
                v.extend_from_slice(&m.virt_start.to_le_bytes());
                v.extend_from_slice(&m.virt_end.to_le_bytes());
                v.extend_from_slice(&m.phys_start.to_le_bytes());
                v.extend_from_slice(&m.flags.to_le_bytes());
            }
            Request::Unmap(u) => {
                v.extend_from_slice(&[req_type::UNMAP, 0, 0, 0]);
                v.extend_from_slice(&u.domain.to_le_bytes());
                v.extend_from_slice(&u.virt_start.to_le_bytes());
                v.extend_from_slice(&u.virt_end.to_le_bytes());
                v.extend_from_slice(&[0u8; 4]);
            }
            Request::Probe(p) => {
                v.extend_from_slice(&[req_type::PROBE, 0, 0, 0]);
                v.extend_from_slice(&p.endpoint.to_le_bytes());
                v.extend_from_slice(&[0u8; 64]);
            }
            Request::AttachTable(a) => {
                v.extend_from_slice(&[req_type::ATTACH_TABLE, 0, 0, 0]);
                v.extend_from_slice(&a.domain.to_le_bytes());
                v.extend_from_slice(&a.endpoint.to_le_bytes());
                v.extend_from_slice(&a.flags.to_le_bytes());
                v.extend_from_slice(&a.format.to_le_bytes());
                v.extend_from_slice(&a.reserved);
                v.extend_from_slice(&a.root.to_le_bytes());
                v.extend_from_slice(&a.reserved2);
            }
            Request::Invalidate(i) => {
                v.extend_from_slice(&[req_type::INVALIDATE, 0, 0, 0]);
                v.extend_from_slice(&i.granularity.to_le_bytes());
                v.extend_from_slice(&i.inv_type.to_le_bytes());
                v.extend_from_slice(&i.flags.to_le_bytes());
                v.extend_from_slice(&i.reserved1);
                v.extend_from_slice(&i.domain.to_le_bytes());
                v.extend_from_slice(&i.pasid.to_le_bytes());
                v.extend_from_slice(&i.reserved2);
                v.extend_from_slice(&i.archid.to_le_bytes());
                v.extend_from_slice(&i.virt_start.to_le_bytes());
                v.extend_from_slice(&i.nr_pages.to_le_bytes());
                v.push(i.granule);
                v.extend_from_slice(&i.reserved3);
            }
        }
        v
    }
}

/// A reserved IOVA region reported through a RESV_MEM probe property.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResvMem {
    /// RESV_MEM_T_RESERVED or RESV_MEM_T_MSI.
    pub subtype: u8,
    /// First IOVA of the region.
    pub start: u64,
    /// Inclusive.
    pub end: u64,
}

impl ResvMem {
    /// Writes this region as one RESV_MEM property.
    pub fn encode(&self, w: &mut LeWriter<'_>) -> Result<(), WireError> {
        let mut prop = [0u8; RESV_MEM_PROP_SIZE];
        let mut pw = LeWriter::new(&mut prop);
        pw.u16(PROBE_T_RESV_MEM)?;
        pw.u16(RESV_MEM_LEN)?;
        pw.u8(self.subtype)?;
        pw.put(&[0u8; 3])?;
        pw.u64(self.start)?;
        pw.u64(self.end)?;
        w.put(&prop)
    }
}

/// The PAGE_TABLE_FMT probe property (drafts): a table format the device
/// walks for this endpoint's domain. The drafts' value is only the format
/// code; levels and input size are implied by the code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageTableFmt {
    /// Format code ([`crate::pgtable::FORMAT_X86_4L`] for the project's).
    pub format: u16,
}

impl PageTableFmt {
    /// Writes this format as one PAGE_TABLE_FMT property.
    pub fn encode(&self, w: &mut LeWriter<'_>) -> Result<(), WireError> {
        let mut prop = [0u8; PAGE_TABLE_FMT_PROP_SIZE];
        let mut pw = LeWriter::new(&mut prop);
        pw.u16(PROBE_T_PAGE_TABLE_FMT)?;
        pw.u16(PAGE_TABLE_FMT_LEN)?;
        pw.u16(self.format)?;
        pw.put(&[0u8; 2])?;
        w.put(&prop)
    }
}

/// One decoded probe property (for tests and Rust-side drivers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeProp {
    /// A RESV_MEM property.
    ResvMem(ResvMem),
    /// A PAGE_TABLE_FMT property (page-table mode).
    PageTableFmt(PageTableFmt),
    /// A property of a type this decoder does not know (type, length).
    Other(u16, u16),
}

/// Decodes a probe property list as a driver would: stops at a NONE property
/// or at the end of the buffer.
pub fn decode_probe_props(props: &[u8]) -> Result<Vec<ProbeProp>, WireError> {
    let mut out = Vec::new();
    let mut r = LeReader::new(props);
    while r.pos() < props.len() {
        let ty = r.u16()? & PROBE_T_MASK;
        let len = r.u16()?;
        if ty == PROBE_T_NONE {
            break;
        }
        if ty == PROBE_T_RESV_MEM && len >= RESV_MEM_LEN {
            let mut vr = r.clone();
            let subtype = vr.u8()?;
            vr.bytes::<3>()?;
            let start = vr.u64()?;
            let end = vr.u64()?;
            out.push(ProbeProp::ResvMem(ResvMem {
                subtype,
                start,
                end,
            }));
        } else if ty == PROBE_T_PAGE_TABLE_FMT && len >= PAGE_TABLE_FMT_LEN {
            let mut vr = r.clone();
            let format = vr.u16()?;
            out.push(ProbeProp::PageTableFmt(PageTableFmt { format }));
        } else {
            out.push(ProbeProp::Other(ty, len));
        }
        for _ in 0..len {
            r.u8()?;
        }
    }
    Ok(out)
}

/// A fault event as written into an event-queue buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultEvent {
    /// FAULT_R_* reason.
    pub reason: u8,
    /// FAULT_F_* flags.
    pub flags: u32,
    /// The endpoint whose access faulted.
    pub endpoint: u32,
    /// The faulting address (valid with FAULT_F_ADDRESS).
    pub address: u64,
}

impl FaultEvent {
    /// The event's FAULT_SIZE bytes.
    pub fn encode(&self) -> [u8; FAULT_SIZE] {
        let mut out = [0u8; FAULT_SIZE];
        let mut w = LeWriter::new(&mut out);
        // The buffer is exactly FAULT_SIZE long, so these writes cannot fail;
        // the results are still checked rather than unwrapped.
        let ok = w.u8(self.reason).is_ok()
            && w.put(&[0u8; 3]).is_ok()
            && w.u32(self.flags).is_ok()
            && w.u32(self.endpoint).is_ok()
            && w.u32(0).is_ok()
            && w.u64(self.address).is_ok();
        debug_assert!(ok);
        out
    }

    /// Parses an event's bytes (tests and Rust-side drivers).
    pub fn decode(buf: &[u8]) -> Result<FaultEvent, WireError> {
        let mut r = LeReader::new(buf);
        let reason = r.u8()?;
        r.bytes::<3>()?;
        let flags = r.u32()?;
        let endpoint = r.u32()?;
        r.u32()?;
        let address = r.u64()?;
        Ok(FaultEvent {
            reason,
            flags,
            endpoint,
            address,
        })
    }
}

/// The device configuration space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigSpace {
    /// Supported page sizes (bit n: 2^n bytes).
    pub page_size_mask: u64,
    /// First IOVA the device translates.
    pub input_start: u64,
    /// Last IOVA the device translates (inclusive).
    pub input_end: u64,
    /// First valid domain ID.
    pub domain_start: u32,
    /// Last valid domain ID (inclusive).
    pub domain_end: u32,
    /// Bytes of PROBE properties per endpoint.
    pub probe_size: u32,
    /// Unattached endpoints bypass translation when 1.
    pub bypass: u8,
    /// Request queues (multi-queue offered), else 0.
    pub num_queues: u16,
}

/// Byte offset of the `bypass` field, the only driver-writable field.
pub const CONFIG_BYPASS_OFFSET: usize = 36;

impl ConfigSpace {
    /// The configuration space's CONFIG_SIZE bytes.
    pub fn encode(&self) -> [u8; CONFIG_SIZE] {
        let mut out = [0u8; CONFIG_SIZE];
        let mut w = LeWriter::new(&mut out);
        let ok = w.u64(self.page_size_mask).is_ok()
            && w.u64(self.input_start).is_ok()
            && w.u64(self.input_end).is_ok()
            && w.u32(self.domain_start).is_ok()
            && w.u32(self.domain_end).is_ok()
            && w.u32(self.probe_size).is_ok()
            && w.u8(self.bypass).is_ok()
            && w.u8(0).is_ok()
            && w.u16(self.num_queues).is_ok();
        debug_assert!(ok);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_rejects_short_buffers() {
        let mut r = LeReader::new(&[1, 2, 3]);
        assert_eq!(r.u16().unwrap(), 0x0201);
        assert!(matches!(
            r.u16(),
            Err(WireError::TooShort { offset: 2, .. })
        ));
        // A failed read does not advance.
        assert_eq!(r.u8().unwrap(), 3);
    }

    #[test]
    fn requests_roundtrip_and_have_spec_sizes() {
        let reqs = [
            (
                Request::Attach(AttachReq {
                    domain: 7,
                    endpoint: 8,
                    flags: 1,
                    reserved: [0; 4],
                }),
                ATTACH_SIZE,
            ),
            (
                Request::Detach(DetachReq {
                    domain: 7,
                    endpoint: 8,
                }),
                DETACH_SIZE,
            ),
            (
                Request::Map(MapReq {
                    domain: 1,
                    virt_start: 0x1000,
                    virt_end: 0x1fff,
                    phys_start: 0xa000,
                    flags: 3,
                }),
                MAP_SIZE,
            ),
            (
                Request::Unmap(UnmapReq {
                    domain: 1,
                    virt_start: 0x1000,
                    virt_end: 0x1fff,
                }),
                UNMAP_SIZE,
            ),
            (Request::Probe(ProbeReq { endpoint: 9 }), PROBE_SIZE),
            (
                Request::AttachTable(AttachTableReq::new(3, 4, 0x1234_5000)),
                ATTACH_TABLE_SIZE,
            ),
            (
                Request::Invalidate(InvalidateReq::range(3, 0x1000, 0x3fff)),
                INVALIDATE_SIZE,
            ),
        ];
        for (req, size) in reqs {
            let bytes = req.encode();
            assert_eq!(bytes.len(), size);
            assert_eq!(parse_request(&bytes).unwrap(), req);
            // Any truncation fails to parse.
            for cut in 0..size {
                assert!(parse_request(&bytes[..cut]).is_err(), "{req:?} cut {cut}");
            }
        }
    }

    #[test]
    fn map_layout_is_little_endian_at_spec_offsets() {
        let bytes = Request::Map(MapReq {
            domain: 0x0403_0201,
            virt_start: 0x1122_3344_5566_7788,
            virt_end: 0,
            phys_start: 0,
            flags: 0x5,
        })
        .encode();
        assert_eq!(bytes[0], 3);
        assert_eq!(&bytes[4..8], &[1, 2, 3, 4]);
        assert_eq!(bytes[8], 0x88);
        assert_eq!(bytes[15], 0x11);
        assert_eq!(bytes[32], 5);
    }

    #[test]
    fn unknown_type_is_reported() {
        assert_eq!(
            parse_request(&[9, 0, 0, 0, 0, 0]),
            Err(WireError::UnknownType(9))
        );
    }

    #[test]
    fn fault_and_config_layouts() {
        let f = FaultEvent {
            reason: FAULT_R_MAPPING,
            flags: FAULT_F_WRITE | FAULT_F_ADDRESS,
            endpoint: 0x10,
            address: 0xdead_b000,
        };
        let b = f.encode();
        assert_eq!(b[0], 2);
        assert_eq!(&b[4..8], &0x102u32.to_le_bytes());
        assert_eq!(&b[8..12], &0x10u32.to_le_bytes());
        assert_eq!(&b[12..16], &[0; 4]);
        assert_eq!(&b[16..24], &0xdead_b000u64.to_le_bytes());
        assert_eq!(FaultEvent::decode(&b).unwrap(), f);

        let c = ConfigSpace {
            page_size_mask: 0x1000,
            input_start: 0,
            input_end: u64::MAX,
            domain_start: 1,
            domain_end: 9,
            probe_size: 512,
            bypass: 1,
            num_queues: 0x0203,
        }
        .encode();
        assert_eq!(&c[0..8], &0x1000u64.to_le_bytes());
        assert_eq!(&c[16..24], &u64::MAX.to_le_bytes());
        assert_eq!(&c[24..28], &1u32.to_le_bytes());
        assert_eq!(&c[28..32], &9u32.to_le_bytes());
        assert_eq!(&c[32..36], &512u32.to_le_bytes());
        assert_eq!(c[CONFIG_BYPASS_OFFSET], 1);
        assert_eq!(c[37], 0);
        assert_eq!(&c[CONFIG_NUM_QUEUES_OFFSET..40], &[3, 2]);
    }

    #[test]
    fn resv_mem_property_roundtrip() {
        let mut buf = [0u8; 64];
        let mut w = LeWriter::new(&mut buf);
        let r = ResvMem {
            subtype: RESV_MEM_T_MSI,
            start: 0xfee0_0000,
            end: 0xfeef_ffff,
        };
        r.encode(&mut w).unwrap();
        assert_eq!(w.pos(), RESV_MEM_PROP_SIZE);
        assert_eq!(&buf[0..4], &[1, 0, 20, 0]);
        assert_eq!(
            decode_probe_props(&buf).unwrap(),
            vec![ProbeProp::ResvMem(r)]
        );
    }
}
