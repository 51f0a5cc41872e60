//! Fuzzes the page-table mode (docs/page-table.md): a guest table made of
//! arbitrary bytes, walked by translations at arbitrary IOVAs, with
//! INVALIDATEs in between.
//!
//! Input: [root page u8][guest memory bytes... (up to 64 KiB)] then, after
//! the memory, ops of 9 bytes: [op u8][iova u64]. op & 3 == 3 invalidates
//! the 16 KiB around iova, otherwise translates 8 bytes with access op & 3.
//! Invariants: no panic; an accepted translation lies in guest RAM and
//! within one page; a whole-space INVALIDATE empties the cache.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use virtio_iommu::device::{IommuConfig, IommuDevice};
use virtio_iommu::mapping::Perm;
use virtio_iommu::wire::{feature, AttachReq, AttachTableReq, InvalidateReq, Request};

const MEM_SIZE: usize = 0x10000;
const EP: u32 = 8;

fn send(d: &IommuDevice, w: &mut virtio_iommu::mapping::QueueContext, req: Request) -> u8 {
    let mut out = [0xffu8; 4];
    d.handle_request(w, &req.encode(), &mut out);
    out[0]
}

fuzz_target!(|data: &[u8]| {
    let Some((&root_page, rest)) = data.split_first() else {
        return;
    };
    let mem_len = rest.len().min(MEM_SIZE);
    let (image, ops) = rest.split_at(mem_len);
    let Ok(mem) = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM_SIZE)]) else {
        return;
    };
    if mem.write_slice(image, GuestAddress(0)).is_err() {
        return;
    }
    let mem = Arc::new(mem);
    let Ok(d) = IommuDevice::new(IommuConfig {
        page_table: true,
        ..IommuConfig::default()
    }) else {
        return;
    };
    d.set_table_memory(mem.clone());
    if d.add_endpoint(EP).is_err() {
        return;
    }
    d.ack_features(d.device_features() | feature::bit(feature::PAGE_TABLE));
    let mut w = d.new_worker();
    let attach = Request::Attach(AttachReq {
        domain: 1,
        endpoint: EP,
        flags: 0,
        reserved: [0; 4],
    });
    assert_eq!(send(&d, &mut w, attach), 0);
    let root = u64::from(root_page) << 12;
    let st = send(
        &d,
        &mut w,
        Request::AttachTable(AttachTableReq::new(1, EP, root)),
    );
    d.complete_kick(&mut w);
    if st != 0 {
        return;
    }
    let Ok(dma) = d.endpoint_dma(EP) else {
        return;
    };
    for op in ops.chunks_exact(9) {
        let mut b = [0u8; 8];
        b.copy_from_slice(&op[1..9]);
        let iova = u64::from_le_bytes(b);
        match op[0] & 3 {
            3 => {
                let st = send(
                    &d,
                    &mut w,
                    Request::Invalidate(InvalidateReq::range(
                        1,
                        iova,
                        iova.saturating_add(0x3fff),
                    )),
                );
                assert_eq!(st, 0);
                d.complete_kick(&mut w);
            }
            a => {
                let access = Perm::from_bits_truncate(u32::from(a.max(1)));
                if let Some(Ok(run)) = dma.translate(iova, 8, access).next() {
                    assert!(run.len <= 4096);
                    assert!(run.gpa.saturating_add(run.len) <= MEM_SIZE as u64);
                }
            }
        }
    }
    let all = Request::Invalidate(InvalidateReq::domain(1));
    assert_eq!(send(&d, &mut w, all), 0);
    d.complete_kick(&mut w);
    assert_eq!(d.domain_stats(1).map(|s| s.mappings), Some(0));
});
