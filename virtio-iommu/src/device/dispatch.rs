//! Request dispatch: parse one request, run it, write its tail.
//!
//! Buffer rules (spec, "Device operations"):
//! - The tail lives in the device-writable part. If that part cannot hold it,
//!   the device cannot report anything: it writes nothing and the used length
//!   is 0 (the driver treats that as a failure).
//! - An unrecognized request type is also answered with used length 0 and no
//!   write ("the device SHOULD NOT write the buffer and SHOULD set the used
//!   length to zero"); so is PROBE when the PROBE feature is not offered.
//! - A readable part too short for its type gets S_INVAL.
//! - For PROBE the writable part is `properties[probe_size]` then the tail;
//!   if it is smaller than that, no property is written and S_INVAL goes in
//!   the last 4 bytes.
//! - Every other request writes its 4-byte tail at the start of the writable
//!   part; the used length is 4.

use super::probe::fill_properties;
use super::IommuDevice;
use crate::counters::Counted;
use crate::mapping::QueueContext;
use crate::wire::{
    encode_tail, feature, parse_request, req_type, request_type, ProbeReq, Request, Status,
    WireError, TAIL_SIZE,
};

/// Writes a tail at `offset` in `writable`; returns the used length.
fn put_tail(writable: &mut [u8], offset: usize, status: Status) -> usize {
    let Some(end) = offset.checked_add(TAIL_SIZE) else {
        return 0;
    };
    match writable.get_mut(offset..end) {
        Some(dst) => {
            dst.copy_from_slice(&encode_tail(status));
            end
        }
        None => 0,
    }
}

impl IommuDevice {
    /// Handles one request. `readable` is the device-readable part of the
    /// descriptor chain, `writable` the device-writable part. Returns the
    /// number of bytes written into `writable` (the used length). The
    /// caller must call [`complete_kick`](Self::complete_kick) after the last
    /// request of a kick before publishing any of them.
    pub fn handle_request(
        &self,
        w: &mut QueueContext,
        readable: &[u8],
        writable: &mut [u8],
    ) -> usize {
        if writable.len() < TAIL_SIZE {
            log::debug!("virtio-iommu: writable part too small for a tail");
            return 0;
        }
        let ty = match request_type(readable) {
            Ok(t) => t,
            Err(_) => {
                w.counters.malformed();
                return put_tail(writable, 0, Status::Inval);
            }
        };
        // The page-table requests exist only with their feature negotiated:
        // a driver that did not negotiate it gets the standard device.
        let table_req = matches!(ty, req_type::ATTACH_TABLE | req_type::INVALIDATE)
            && self.features.is_acked(feature::PAGE_TABLE);
        if !table_req
            && !matches!(
                ty,
                req_type::ATTACH
                    | req_type::DETACH
                    | req_type::MAP
                    | req_type::UNMAP
                    | req_type::PROBE
            )
        {
            log::debug!("virtio-iommu: unknown request type {ty}");
            w.counters.malformed();
            return 0;
        }
        if ty == req_type::PROBE && !self.features.is_offered(feature::PROBE) {
            w.counters.malformed();
            return 0;
        }
        let req = match parse_request(readable) {
            Ok(r) => r,
            Err(WireError::UnknownType(_)) => {
                w.counters.malformed();
                return 0;
            }
            Err(WireError::TooShort { .. }) => {
                w.counters.malformed();
                let off = if ty == req_type::PROBE {
                    // Tail follows the properties; with an unknown layout the
                    // safest place is the end of the writable part.
                    self.probe_tail_offset(writable.len())
                } else {
                    0
                };
                return put_tail(writable, off, Status::Inval);
            }
        };
        let (kind, status) = match req {
            Request::Attach(a) => (Counted::Attach, self.attach(w, &a)),
            Request::Detach(d) => (Counted::Detach, self.detach(w, &d)),
            Request::Map(m) => (Counted::Map, self.map(w, &m)),
            Request::Unmap(u) => (Counted::Unmap, self.unmap(w, &u)),
            Request::AttachTable(a) => (Counted::AttachTable, self.attach_table(w, &a)),
            Request::Invalidate(i) => {
                let t0 = std::time::Instant::now();
                let status = self.invalidate(w, &i);
                w.counters.invalidate_time(t0.elapsed());
                (Counted::Invalidate, status)
            }
            Request::Probe(p) => {
                let (used, status) = self.probe(&p, writable);
                w.counters.request(Counted::Probe, status == Status::Ok);
                return used;
            }
        };
        w.counters.request(kind, status == Status::Ok);
        put_tail(writable, 0, status)
    }

    /// Where the tail of a PROBE goes: after probe_size bytes of properties
    /// if the buffer is big enough, else in the last 4 bytes.
    fn probe_tail_offset(&self, writable_len: usize) -> usize {
        let ps = self.cfg.probe_size as usize;
        match ps.checked_add(TAIL_SIZE) {
            Some(need) if writable_len >= need => ps,
            _ => writable_len.saturating_sub(TAIL_SIZE),
        }
    }

    /// Answers a PROBE; returns the used length and the status written.
    fn probe(&self, req: &ProbeReq, writable: &mut [u8]) -> (usize, Status) {
        let ps = self.cfg.probe_size as usize;
        let tail_off = self.probe_tail_offset(writable.len());
        let status = if tail_off < ps {
            // Properties list smaller than probe_size: write no property.
            Status::Inval
        } else if let Some(props) = writable.get_mut(..ps) {
            match self.endpoints.get(req.endpoint) {
                Some(ep) => {
                    let mut regions = self.global_resv.clone();
                    regions.extend_from_slice(ep.resv());
                    let fmt = self
                        .features
                        .is_acked(feature::PAGE_TABLE)
                        .then_some(crate::pgtable::PROBE_FORMAT);
                    fill_properties(props, &regions, fmt)
                }
                None => {
                    // The used length covers the properties too, so make
                    // them a well-defined empty list.
                    props.fill(0);
                    Status::NoEnt
                }
            }
        } else {
            Status::DevErr
        };
        (put_tail(writable, tail_off, status), status)
    }
}
