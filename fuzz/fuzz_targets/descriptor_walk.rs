//! Fuzzes the virtio descriptor walker (`vmm::virtio::chain::walk`) with
//! arbitrary guest memory, queue size, head index and table address.
//!
//! Input: [size u16][head u16][table u32][guest memory bytes...]. The walker
//! must never panic, must end on loops, and any chain it accepts must obey
//! the limits it promises (descriptor count, 32-bit total length, writable
//! buffers after readable ones is implied by the split lists).
#![no_main]

use libfuzzer_sys::fuzz_target;
use vm_memory::{Bytes, GuestAddress};
use vmm::dma::DmaSpace;
use vmm::memory::GuestMemoryMmap;
use vmm::virtio::chain::{walk, MAX_CHAIN_DESCRIPTORS};

const MEM_SIZE: usize = 0x10000;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let size = u16::from_le_bytes([data[0], data[1]]);
    let head = u16::from_le_bytes([data[2], data[3]]);
    // Tables mostly inside RAM, sometimes straddling or past its end.
    let table = u64::from(u32::from_le_bytes([data[4], data[5], data[6], data[7]]))
        % (MEM_SIZE as u64 + 0x200);
    let Ok(mem) = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE)]) else {
        return;
    };
    let body = &data[8..];
    let n = body.len().min(MEM_SIZE);
    if mem.write_slice(&body[..n], GuestAddress(0)).is_err() {
        return;
    }
    let dma = DmaSpace::identity(mem);
    if let Ok(chain) = walk(&dma, table, size, head) {
        assert!(head < size);
        assert!(chain.readable.len() + chain.writable.len() <= MAX_CHAIN_DESCRIPTORS);
        assert!(chain.readable_len() + chain.writable_len() <= u64::from(u32::MAX));
    }
});
