//! The descriptor walker: turns a descriptor chain head into the list of
//! device-readable and device-writable buffers, or says why it cannot.
//!
//! WHY our own walker rather than iterating virtio-queue's
//! `DescriptorChain`: that iterator ends silently on every malformed
//! descriptor (bad index, unreadable table, nested indirect), so a device
//! could not tell "short chain" from "hostile ring". Here every violation of
//! the split-ring rules is a [`ChainError`] and the device decides: mark the
//! queue broken (DEVICE_NEEDS_RESET) rather than guess.
//!
//! Rules enforced (virtio 1.2, 2.7.5): the head and every `next` index are
//! inside the table; a chain visits at most as many descriptors as its table
//! has (so loops end); INDIRECT is not combined with NEXT, not nested, and
//! its table length is a non-zero multiple of 16; device-writable buffers
//! come after device-readable ones; the total length fits in 32 bits.
//! Descriptor reads go through the given memory object (the device's
//! [`DmaSpace`](crate::dma::DmaSpace)), so a vIOMMU translates them too.

use thiserror::Error;
use virtio_queue::{Queue, QueueOwnedT};
use vm_memory::{Bytes, GuestAddress, GuestMemory};

/// Descriptor flag: the chain continues at `next`.
pub const VIRTQ_DESC_F_NEXT: u16 = 1;
/// Descriptor flag: the buffer is device-writable.
pub const VIRTQ_DESC_F_WRITE: u16 = 2;
/// Descriptor flag: the buffer is a table of descriptors.
pub const VIRTQ_DESC_F_INDIRECT: u16 = 4;
/// Size of one split-ring descriptor.
pub const DESCRIPTOR_SIZE: u64 = 16;
/// Upper bound on descriptors in one chain (direct + indirect), which also
/// bounds the iovec arrays built from it.
pub const MAX_CHAIN_DESCRIPTORS: usize = 1024;

/// Why a chain was rejected.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum ChainError {
    /// The head index is not inside the descriptor table.
    #[error("chain head {head} outside a table of {size}")]
    HeadOutOfRange {
        /// Head index from the avail ring.
        head: u16,
        /// Queue size.
        size: u16,
    },
    /// A `next` index is not inside its table.
    #[error("descriptor next index {next} outside a table of {size}")]
    NextOutOfRange {
        /// The bad index.
        next: u16,
        /// Size of the table it indexes.
        size: u32,
    },
    /// The chain is longer than its table (a loop) or than the limit.
    #[error("descriptor chain loops or is too long")]
    TooLong,
    /// An indirect descriptor inside an indirect table.
    #[error("nested indirect descriptor")]
    NestedIndirect,
    /// An indirect descriptor that also has NEXT set.
    #[error("indirect descriptor with NEXT set")]
    IndirectWithNext,
    /// An indirect table whose length is 0 or not a multiple of 16.
    #[error("indirect table of invalid length {0}")]
    BadIndirectLength(u32),
    /// A descriptor could not be read (outside RAM or refused by the IOMMU).
    #[error("descriptor at {0:#x} is not readable")]
    Unreadable(u64),
    /// A device-readable buffer after a device-writable one.
    #[error("device-readable descriptor after a device-writable one")]
    ReadableAfterWritable,
    /// The buffers add up to more than 4 GiB.
    #[error("chain length overflows 32 bits")]
    LengthOverflow,
}

/// One guest buffer (an I/O virtual address and a length).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Buffer {
    /// Address as the driver wrote it (translated on access).
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
}

/// A walked chain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    /// Head index (what goes in the used ring).
    pub head: u16,
    /// Device-readable buffers, in order.
    pub readable: Vec<Buffer>,
    /// Device-writable buffers, in order.
    pub writable: Vec<Buffer>,
}

impl Chain {
    /// Total device-readable bytes.
    pub fn readable_len(&self) -> u64 {
        self.readable.iter().map(|b| u64::from(b.len)).sum()
    }

    /// Total device-writable bytes.
    pub fn writable_len(&self) -> u64 {
        self.writable.iter().map(|b| u64::from(b.len)).sum()
    }
}

#[derive(Clone, Copy)]
struct RawDescriptor {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

fn read_descriptor<M: GuestMemory + ?Sized>(
    mem: &M,
    table: u64,
    index: u16,
) -> Result<RawDescriptor, ChainError> {
    let at = table
        .checked_add(u64::from(index) * DESCRIPTOR_SIZE)
        .ok_or(ChainError::Unreadable(table))?;
    let mut raw = [0u8; 16];
    mem.read_slice(&mut raw, GuestAddress(at))
        .map_err(|_| ChainError::Unreadable(at))?;
    let [a0, a1, a2, a3, a4, a5, a6, a7, l0, l1, l2, l3, f0, f1, n0, n1] = raw;
    Ok(RawDescriptor {
        addr: u64::from_le_bytes([a0, a1, a2, a3, a4, a5, a6, a7]),
        len: u32::from_le_bytes([l0, l1, l2, l3]),
        flags: u16::from_le_bytes([f0, f1]),
        next: u16::from_le_bytes([n0, n1]),
    })
}

/// Walks the chain starting at `head` in the descriptor table at
/// `desc_table` (an I/O virtual address) of a queue of `queue_size`
/// entries. `out` is cleared and filled (reused to avoid allocations).
pub fn walk_into<M: GuestMemory + ?Sized>(
    mem: &M,
    desc_table: u64,
    queue_size: u16,
    head: u16,
    out: &mut Chain,
) -> Result<(), ChainError> {
    out.head = head;
    out.readable.clear();
    out.writable.clear();
    if head >= queue_size {
        return Err(ChainError::HeadOutOfRange {
            head,
            size: queue_size,
        });
    }
    let mut table = desc_table;
    let mut table_size = u32::from(queue_size);
    let mut index = head;
    let mut in_table = 0u32;
    let mut indirect = false;
    let mut total = 0u32;
    let mut count = 0usize;
    loop {
        in_table += 1;
        count += 1;
        if in_table > table_size || count > MAX_CHAIN_DESCRIPTORS {
            return Err(ChainError::TooLong);
        }
        let d = read_descriptor(mem, table, index)?;
        if d.flags & VIRTQ_DESC_F_INDIRECT != 0 {
            if indirect {
                return Err(ChainError::NestedIndirect);
            }
            if d.flags & VIRTQ_DESC_F_NEXT != 0 {
                return Err(ChainError::IndirectWithNext);
            }
            if d.len == 0 || u64::from(d.len) % DESCRIPTOR_SIZE != 0 {
                return Err(ChainError::BadIndirectLength(d.len));
            }
            let entries = u64::from(d.len) / DESCRIPTOR_SIZE;
            if entries > u64::from(u16::MAX) + 1 {
                return Err(ChainError::BadIndirectLength(d.len));
            }
            table = d.addr;
            table_size =
                u32::try_from(entries).map_err(|_| ChainError::BadIndirectLength(d.len))?;
            index = 0;
            in_table = 0;
            indirect = true;
            continue;
        }
        total = total.checked_add(d.len).ok_or(ChainError::LengthOverflow)?;
        let buf = Buffer {
            addr: d.addr,
            len: d.len,
        };
        if d.flags & VIRTQ_DESC_F_WRITE != 0 {
            out.writable.push(buf);
        } else {
            if !out.writable.is_empty() {
                return Err(ChainError::ReadableAfterWritable);
            }
            out.readable.push(buf);
        }
        if d.flags & VIRTQ_DESC_F_NEXT == 0 {
            return Ok(());
        }
        if u32::from(d.next) >= table_size {
            return Err(ChainError::NextOutOfRange {
                next: d.next,
                size: table_size,
            });
        }
        index = d.next;
    }
}

/// Takes the next available chain's head off `queue`: `Ok(None)` when the
/// driver has offered nothing more, an error when the avail ring cannot be
/// trusted (its index more than a queue size ahead, or unreadable).
///
/// WHY not `QueueT::pop_descriptor_chain`: it logs the avail ring error and
/// returns `None`, which looks like "nothing to do" while
/// `enable_notification` keeps saying "more to do"; a loop over the two
/// spins on a hostile index for ever (issue 28). The error must reach the
/// device, which then stops the queue.
pub fn pop_head<M: GuestMemory>(
    queue: &mut Queue,
    mem: &M,
) -> Result<Option<u16>, virtio_queue::Error> {
    let mut avail = queue.iter(mem)?;
    Ok(avail.next().map(|c| c.head_index()))
}

/// [`walk_into`] returning a fresh [`Chain`].
pub fn walk<M: GuestMemory + ?Sized>(
    mem: &M,
    desc_table: u64,
    queue_size: u16,
    head: u16,
) -> Result<Chain, ChainError> {
    let mut c = Chain::default();
    walk_into(mem, desc_table, queue_size, head, &mut c)?;
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::GuestMemoryMmap;
    use crate::virtio::test_ring::put_desc as put;

    const TABLE: u64 = 0x1000;
    const INDIRECT: u64 = 0x3000;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap()
    }

    #[test]
    fn readable_then_writable_chain() {
        let m = mem();
        put(&m, TABLE, 0, 0x8000, 12, VIRTQ_DESC_F_NEXT, 5);
        put(&m, TABLE, 5, 0x9000, 100, VIRTQ_DESC_F_NEXT, 2);
        put(&m, TABLE, 2, 0xa000, 4096, VIRTQ_DESC_F_WRITE, 0);
        let c = walk(&m, TABLE, 8, 0).unwrap();
        assert_eq!(c.head, 0);
        assert_eq!(c.readable.len(), 2);
        assert_eq!(c.readable_len(), 112);
        assert_eq!(
            c.writable,
            vec![Buffer {
                addr: 0xa000,
                len: 4096
            }]
        );
    }

    #[test]
    fn bad_indices_are_errors() {
        let m = mem();
        assert_eq!(
            walk(&m, TABLE, 8, 8),
            Err(ChainError::HeadOutOfRange { head: 8, size: 8 })
        );
        put(&m, TABLE, 0, 0x8000, 1, VIRTQ_DESC_F_NEXT, 9);
        assert_eq!(
            walk(&m, TABLE, 8, 0),
            Err(ChainError::NextOutOfRange { next: 9, size: 8 })
        );
    }

    #[test]
    fn loops_end() {
        let m = mem();
        put(&m, TABLE, 0, 0x8000, 1, VIRTQ_DESC_F_NEXT, 1);
        put(&m, TABLE, 1, 0x8000, 1, VIRTQ_DESC_F_NEXT, 0);
        assert_eq!(walk(&m, TABLE, 8, 0), Err(ChainError::TooLong));
        // Self-loop.
        put(&m, TABLE, 3, 0x8000, 1, VIRTQ_DESC_F_NEXT, 3);
        assert_eq!(walk(&m, TABLE, 8, 3), Err(ChainError::TooLong));
    }

    #[test]
    fn indirect_rules() {
        let m = mem();
        put(&m, INDIRECT, 0, 0x8000, 10, VIRTQ_DESC_F_NEXT, 1);
        put(&m, INDIRECT, 1, 0x9000, 20, VIRTQ_DESC_F_WRITE, 0);
        put(&m, TABLE, 0, INDIRECT, 32, VIRTQ_DESC_F_INDIRECT, 0);
        let c = walk(&m, TABLE, 8, 0).unwrap();
        assert_eq!(c.readable_len(), 10);
        assert_eq!(c.writable_len(), 20);
        // Indirect + NEXT.
        put(
            &m,
            TABLE,
            0,
            INDIRECT,
            32,
            VIRTQ_DESC_F_INDIRECT | VIRTQ_DESC_F_NEXT,
            1,
        );
        assert_eq!(walk(&m, TABLE, 8, 0), Err(ChainError::IndirectWithNext));
        // Bad length.
        put(&m, TABLE, 0, INDIRECT, 33, VIRTQ_DESC_F_INDIRECT, 0);
        assert_eq!(
            walk(&m, TABLE, 8, 0),
            Err(ChainError::BadIndirectLength(33))
        );
        // Nested.
        put(&m, TABLE, 0, INDIRECT, 32, VIRTQ_DESC_F_INDIRECT, 0);
        put(&m, INDIRECT, 1, INDIRECT, 16, VIRTQ_DESC_F_INDIRECT, 0);
        assert_eq!(walk(&m, TABLE, 8, 0), Err(ChainError::NestedIndirect));
        // Indirect next past its own table.
        put(&m, INDIRECT, 1, 0x9000, 20, VIRTQ_DESC_F_NEXT, 2);
        assert_eq!(
            walk(&m, TABLE, 8, 0),
            Err(ChainError::NextOutOfRange { next: 2, size: 2 })
        );
        // Indirect table outside RAM.
        put(&m, TABLE, 0, 0xffff_0000, 32, VIRTQ_DESC_F_INDIRECT, 0);
        assert_eq!(
            walk(&m, TABLE, 8, 0),
            Err(ChainError::Unreadable(0xffff_0000))
        );
    }

    #[test]
    fn ordering_and_length_rules() {
        let m = mem();
        put(
            &m,
            TABLE,
            0,
            0x8000,
            1,
            VIRTQ_DESC_F_WRITE | VIRTQ_DESC_F_NEXT,
            1,
        );
        put(&m, TABLE, 1, 0x8000, 1, 0, 0);
        assert_eq!(
            walk(&m, TABLE, 8, 0),
            Err(ChainError::ReadableAfterWritable)
        );
        put(&m, TABLE, 0, 0x8000, u32::MAX, VIRTQ_DESC_F_NEXT, 1);
        put(&m, TABLE, 1, 0x8000, 2, 0, 0);
        assert_eq!(walk(&m, TABLE, 8, 0), Err(ChainError::LengthOverflow));
        // Table itself outside RAM.
        assert_eq!(
            walk(&m, 0xffff_fff0, 8, 1),
            Err(ChainError::Unreadable(0x1_0000_0000))
        );
    }

    /// The next head, then nothing, then an error (not `None`) for an
    /// avail index more than a queue ahead; the error stays until a reset.
    #[test]
    fn pop_head_reports_a_jumped_avail_index() {
        use crate::virtio::test_ring::{leaked_ram, DriverRing, RingAddrs};
        let mem = leaked_ram(0x10000);
        let addrs = RingAddrs {
            desc: 0x1000,
            avail: 0x2000,
            used: 0x3000,
        };
        let mut ring = DriverRing::new(mem, addrs, 8);
        let mut q = ring.queue();
        ring.offer(5);
        assert_eq!(pop_head(&mut q, mem).unwrap(), Some(5));
        assert_eq!(pop_head(&mut q, mem).unwrap(), None);
        // A full queue ahead is still legal.
        ring.set_avail_idx(1 + 8);
        assert!(pop_head(&mut q, mem).unwrap().is_some());
        // Two taken now: one more than a queue beyond them is not.
        ring.set_avail_idx(2 + 8 + 1);
        for _ in 0..2 {
            assert!(matches!(
                pop_head(&mut q, mem),
                Err(virtio_queue::Error::InvalidAvailRingIndex)
            ));
        }
    }
}
