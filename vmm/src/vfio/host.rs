//! The host side of one assigned function, as its mirror drives it: the
//! type1 container's map and unmap calls and the function's bus-master
//! bit.
//!
//! WHY a trait: the mirror's safety path (a failed unmap stops the
//! function before the guest's UNMAP completes) must be tested, and no
//! machine that runs the tests has a function to assign. Tests put a fake
//! behind the trait that records every call and fails on demand;
//! [`VfioHost`] is the production side over `vfio-ioctls`.

use std::io;
use std::sync::Arc;

use vfio_bindings::bindings::vfio::{
    vfio_iommu_type1_dma_map, vfio_iommu_type1_dma_unmap, VFIO_DMA_MAP_FLAG_READ,
    VFIO_DMA_MAP_FLAG_WRITE, VFIO_DMA_UNMAP_FLAG_ALL, VFIO_PCI_CONFIG_REGION_INDEX, VFIO_UNMAP_ALL,
};
use vfio_ioctls::{VfioContainer, VfioDevice};
use virtio_iommu::mapping::Perm;
use vmm_sys_util::ioctl::{ioctl_with_mut_ref, ioctl_with_ref, ioctl_with_val};

use super::bus_master::{BusMasterGate, COMMAND_BUS_MASTER};
use crate::width::const_u32;

/// The type1 container's ioctl numbers (private: the macro makes public
/// functions).
mod ioctl_nr {
    use vfio_bindings::bindings::vfio::{VFIO_BASE, VFIO_TYPE};
    use vmm_sys_util::ioctl_io_nr;

    ioctl_io_nr!(VFIO_CHECK_EXTENSION, VFIO_TYPE as u32, VFIO_BASE + 1);
    ioctl_io_nr!(VFIO_IOMMU_MAP_DMA, VFIO_TYPE as u32, VFIO_BASE + 13);
    ioctl_io_nr!(VFIO_IOMMU_UNMAP_DMA, VFIO_TYPE as u32, VFIO_BASE + 14);
}
use ioctl_nr::{VFIO_CHECK_EXTENSION, VFIO_IOMMU_MAP_DMA, VFIO_IOMMU_UNMAP_DMA};

/// The ioctl arguments' own sizes, for their 32-bit `argsz` fields.
const MAP_ARGSZ: u32 = const_u32(std::mem::size_of::<vfio_iommu_type1_dma_map>() as i128);
const UNMAP_ARGSZ: u32 = const_u32(std::mem::size_of::<vfio_iommu_type1_dma_unmap>() as i128);

/// What the mirror asks of the host for one assigned function.
pub trait HostFunction: Send + Sync {
    /// Whether the container drops every mapping in one call
    /// (`VFIO_UNMAP_ALL`, Linux 5.12 and later). Asked once.
    fn can_unmap_all(&self) -> bool;

    /// Maps `iova..iova+len` to the host memory at `host` with `perm`.
    ///
    /// # Safety
    ///
    /// `host..host+len` must stay mapped until it is unmapped here, and
    /// may then be read and written by the device at any time: it must be
    /// memory no Rust reference points into (guest RAM, only ever
    /// accessed through volatile slices).
    unsafe fn map_dma(&self, iova: u64, len: u64, host: u64, perm: Perm) -> io::Result<()>;

    /// Unmaps every mapping inside `iova..iova+len`.
    fn unmap_dma(&self, iova: u64, len: u64) -> io::Result<()>;

    /// Unmaps everything (only when [`can_unmap_all`](Self::can_unmap_all)).
    fn unmap_all(&self) -> io::Result<()>;

    /// Clears bus mastering in the function and keeps the guest from
    /// setting it again; `Ok` only if the device reads back with it clear.
    fn stop_bus_master(&self) -> io::Result<()>;
}

/// The production [`HostFunction`]: the function's own container and its
/// VFIO device.
pub struct VfioHost {
    container: Arc<VfioContainer>,
    device: Arc<VfioDevice>,
    gate: Arc<BusMasterGate>,
    unmap_all: bool,
}

impl VfioHost {
    /// The host side of `device` in `container`; `gate` is the one its
    /// PCI model forwards guest command writes through. Probes
    /// `VFIO_UNMAP_ALL` (the container has its IOMMU set by now).
    pub fn new(
        container: Arc<VfioContainer>,
        device: Arc<VfioDevice>,
        gate: Arc<BusMasterGate>,
    ) -> Self {
        // SAFETY: VFIO_CHECK_EXTENSION takes an integer and touches no
        // memory of ours.
        let r = unsafe {
            ioctl_with_val(
                &*container,
                VFIO_CHECK_EXTENSION(),
                libc::c_ulong::from(VFIO_UNMAP_ALL),
            )
        };
        Self {
            container,
            device,
            gate,
            unmap_all: r > 0,
        }
    }

    /// Reads (`write` None) or writes the 2-byte command register through
    /// the VFIO config region, failing on a short or failed transfer.
    fn command(&self, write: Option<[u8; 2]>) -> io::Result<[u8; 2]> {
        use std::os::fd::AsRawFd;
        let base = self.device.get_region_offset(VFIO_PCI_CONFIG_REGION_INDEX);
        let at = base
            .checked_add(4)
            .and_then(|a| libc::off_t::try_from(a).ok())
            .ok_or_else(|| io::Error::other("config region offset out of range"))?;
        let fd = self.device.as_raw_fd();
        let mut buf = write.unwrap_or([0, 0]);
        let n = match write {
            // SAFETY: `fd` is the VFIO device's, open while `self.device`
            // lives; the call reads 2 bytes from `buf`, which lives
            // across it.
            Some(_) => unsafe { libc::pwrite(fd, buf.as_ptr().cast(), 2, at) },
            // SAFETY: as above; the call writes at most 2 bytes to `buf`.
            None => unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), 2, at) },
        };
        match n {
            2 => Ok(buf),
            n if n < 0 => Err(io::Error::last_os_error()),
            n => Err(io::Error::other(format!(
                "command register: {n} of 2 bytes"
            ))),
        }
    }
}

impl HostFunction for VfioHost {
    fn can_unmap_all(&self) -> bool {
        self.unmap_all
    }

    unsafe fn map_dma(&self, iova: u64, len: u64, host: u64, perm: Perm) -> io::Result<()> {
        let mut flags = 0;
        if perm.contains(Perm::READ) {
            flags |= VFIO_DMA_MAP_FLAG_READ;
        }
        if perm.contains(Perm::WRITE) {
            flags |= VFIO_DMA_MAP_FLAG_WRITE;
        }
        let arg = vfio_iommu_type1_dma_map {
            argsz: MAP_ARGSZ,
            flags,
            vaddr: host,
            iova,
            size: len,
        };
        // SAFETY: the ioctl reads `arg` only; what the mapping lets the
        // device reach is the caller's contract (see the trait).
        let r = unsafe { ioctl_with_ref(&*self.container, VFIO_IOMMU_MAP_DMA(), &arg) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn unmap_dma(&self, iova: u64, len: u64) -> io::Result<()> {
        let mut arg = vfio_iommu_type1_dma_unmap {
            argsz: UNMAP_ARGSZ,
            iova,
            size: len,
            ..Default::default()
        };
        // SAFETY: the ioctl reads and writes `arg` only.
        let r = unsafe { ioctl_with_mut_ref(&*self.container, VFIO_IOMMU_UNMAP_DMA(), &mut arg) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn unmap_all(&self) -> io::Result<()> {
        if !self.unmap_all {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        }
        let mut arg = vfio_iommu_type1_dma_unmap {
            argsz: UNMAP_ARGSZ,
            flags: VFIO_DMA_UNMAP_FLAG_ALL,
            ..Default::default()
        };
        // SAFETY: the ioctl reads and writes `arg` only.
        let r = unsafe { ioctl_with_mut_ref(&*self.container, VFIO_IOMMU_UNMAP_DMA(), &mut arg) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn stop_bus_master(&self) -> io::Result<()> {
        self.gate.stop(|| {
            let [low, high] = self.command(None)?;
            self.command(Some([low & !COMMAND_BUS_MASTER, high]))?;
            let [back, _] = self.command(None)?;
            if back & COMMAND_BUS_MASTER != 0 {
                return Err(io::Error::other("bus mastering still on after clearing it"));
            }
            Ok(())
        })
    }
}
