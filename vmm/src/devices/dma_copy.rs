//! One guest copy of the DMA test device, shared by its single transfers
//! (`crate::dma_test`) and its stream thread (`dma_stream.rs`), and the codes
//! of its DMA error register that a copy reports.
//!
//! WHY a module of its own: the device starts the stream and the stream
//! copies the way the device does; with the copy in either of them the two
//! would import each other.

use log::debug;
use vm_memory::{GuestAddress, GuestMemory, Permissions};

use crate::dma::DmaSpace;

/// Values of the DMA error register (0xa0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum DmaError {
    /// The last command completed.
    None = 0,
    /// The IOMMU refused the guest-side range (nothing was copied).
    IommuFault = 1,
    /// The device-side range is outside 0x40000..0x41000 or the count is
    /// larger than the buffer.
    BadDeviceRange = 2,
    /// The guest-side range is not guest RAM (after translation).
    NotRam = 3,
    /// Bus mastering is disabled in the PCI command register.
    BusMasterOff = 4,
}

/// Copies between `buf` and the guest range `[iova, iova + buf.len())` of
/// `dma`: the whole range is translated first and only then copied, so a
/// refused access changes nothing. Returns `IommuFault` when the
/// translator refused the range, `NotRam` when it is not guest RAM.
pub(crate) fn copy_guest(dma: &DmaSpace, buf: &mut [u8], iova: u64, to_ram: bool) -> DmaError {
    let count = buf.len();
    let access = if to_ram {
        Permissions::Write
    } else {
        Permissions::Read
    };
    let faults_before = dma.fault_count();
    let slices = match dma.get_slices(GuestAddress(iova), count, access) {
        Ok(it) => it.collect::<Result<Vec<_>, _>>(),
        Err(e) => Err(e),
    };
    let slices = match slices {
        Ok(s) => s,
        Err(e) => {
            debug!("dma-test: DMA at {iova:#x} len {count:#x} refused: {e}");
            return if dma.fault_count() != faults_before {
                DmaError::IommuFault
            } else {
                DmaError::NotRam
            };
        }
    };
    if slices.iter().map(|s| s.len()).sum::<usize>() != count {
        return DmaError::NotRam;
    }
    let mut pos = 0usize;
    for s in &slices {
        let len = s.len();
        let Some(chunk) = buf.get_mut(pos..pos + len) else {
            return DmaError::NotRam;
        };
        let copied = if to_ram {
            s.copy_from(chunk);
            len
        } else {
            s.copy_to(chunk)
        };
        if copied != len {
            return DmaError::NotRam;
        }
        pos += len;
    }
    DmaError::None
}
