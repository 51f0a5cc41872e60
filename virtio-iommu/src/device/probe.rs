//! PROBE request: the endpoint's property list.
//!
//! WHY the exact fill rules: the spec requires properties back to back
//! (`length + 4` apart), the remaining bytes of `probe_size` zeroed (which also
//! forms the NONE terminator), and no property written at all when the
//! driver's buffer is smaller than `probe_size`.

use crate::wire::{LeWriter, PageTableFmt, ResvMem, Status, WireError};

/// Writes `regions` as RESV_MEM properties into `props` (exactly probe_size
/// bytes) and zero-fills the rest. On a property list that does not fit
/// (prevented by configuration validation) nothing partial is left behind and
/// S_DEVERR is returned. `fmt`: the page-table format property, after the
/// regions (only with the project page-table feature negotiated).
pub fn fill_properties(props: &mut [u8], regions: &[ResvMem], fmt: Option<PageTableFmt>) -> Status {
    props.fill(0);
    let mut w = LeWriter::new(props);
    let res: Result<(), WireError> = regions
        .iter()
        .try_for_each(|r| r.encode(&mut w))
        .and_then(|()| fmt.map_or(Ok(()), |f| f.encode(&mut w)));
    match res {
        Ok(()) => Status::Ok,
        Err(_) => {
            props.fill(0);
            Status::DevErr
        }
    }
}
