//! Guest buffers as host iovecs, for `readv` and `writev` on the TAP.

use vm_memory::{GuestAddress, GuestMemory, GuestMemoryError, Permissions};

use crate::dma::DmaSpace;
use crate::virtio::chain::Buffer;
use crate::width::usize_from_u64;

/// A buffer the device's DMA space refused (the vIOMMU, or not guest RAM).
#[derive(Debug, thiserror::Error)]
#[error("buffer {addr:#x}: {source}")]
pub struct BufferAccessError {
    /// The buffer's address.
    pub addr: u64,
    /// The access error.
    #[source]
    pub source: GuestMemoryError,
}

/// Appends host iovecs for the first `want` bytes of `buffers`, each
/// translated through `mem` for `access` (a buffer may span several guest
/// RAM regions, hence several iovecs).
pub fn append_iovecs(
    mem: &DmaSpace,
    buffers: &[Buffer],
    want: u64,
    access: Permissions,
    iov: &mut Vec<libc::iovec>,
) -> Result<(), BufferAccessError> {
    let mut left = want;
    for b in buffers {
        if left == 0 {
            break;
        }
        let len = u64::from(b.len).min(left);
        left -= len;
        let err = |source| BufferAccessError {
            addr: b.addr,
            source,
        };
        for s in mem
            .get_slices(GuestAddress(b.addr), usize_from_u64(len), access)
            .map_err(err)?
        {
            let s = s.map_err(err)?;
            if s.is_empty() {
                continue;
            }
            let base: *mut u8 = if matches!(access, Permissions::Write | Permissions::ReadWrite) {
                s.ptr_guard_mut().as_ptr()
            } else {
                s.ptr_guard().as_ptr().cast_mut()
            };
            iov.push(libc::iovec {
                iov_base: base.cast(),
                iov_len: s.len(),
            });
        }
    }
    Ok(())
}
