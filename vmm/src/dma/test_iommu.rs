//! A virtio-iommu for unit tests of devices behind it: one endpoint, and
//! requests sent the way a driver's kick sends them (each one completed,
//! so UNMAPs reach the registered consumers before `send` returns).

use std::sync::Arc;

use virtio_iommu::device::{IommuConfig, IommuDevice};
use virtio_iommu::wire::{AttachReq, MapReq, Request, UnmapReq};

use super::iommu::IommuTranslate;
use super::DmaSpace;
use crate::memory::GuestMemoryMmap;

/// MAP flags: read and write.
pub const RW: u32 = 3;

/// The device and its one endpoint.
#[derive(Clone)]
pub struct TestIommu {
    pub dev: Arc<IommuDevice>,
    pub ep: u32,
}

impl TestIommu {
    /// A device with every feature negotiated and endpoint `ep`.
    pub fn new(ep: u32) -> Self {
        let dev = IommuDevice::new(IommuConfig::default()).expect("iommu");
        dev.add_endpoint(ep).expect("endpoint");
        dev.ack_features(dev.device_features());
        Self::with_device(dev, ep)
    }

    /// A device the caller set up (features, endpoint `ep`).
    pub fn with_device(dev: IommuDevice, ep: u32) -> Self {
        Self {
            dev: Arc::new(dev),
            ep,
        }
    }

    /// Sends one request as one kick; returns the status byte.
    pub fn send(&self, req: Request) -> u8 {
        let mut w = self.dev.new_worker();
        let mut tail = [0xffu8; 4];
        assert_eq!(self.dev.handle_request(&mut w, &req.encode(), &mut tail), 4);
        self.dev.complete_kick(&mut w);
        tail[0]
    }

    pub fn attach(&self, domain: u32) {
        let st = self.send(Request::Attach(AttachReq {
            domain,
            endpoint: self.ep,
            flags: 0,
            reserved: [0; 4],
        }));
        assert_eq!(st, 0, "ATTACH");
    }

    /// Maps `[iova, iova + len)` to `gpa` with `flags`.
    pub fn map(&self, domain: u32, iova: u64, len: u64, gpa: u64, flags: u32) {
        let st = self.send(Request::Map(MapReq {
            domain,
            virt_start: iova,
            virt_end: iova + len - 1,
            phys_start: gpa,
            flags,
        }));
        assert_eq!(st, 0, "MAP");
    }

    pub fn unmap(&self, domain: u32, iova: u64, len: u64) {
        let st = self.send(Request::Unmap(UnmapReq {
            domain,
            virt_start: iova,
            virt_end: iova + len - 1,
        }));
        assert_eq!(st, 0, "UNMAP");
    }

    /// The endpoint's DMA space over `mem` (no quiescer).
    pub fn space(&self, mem: &GuestMemoryMmap) -> DmaSpace {
        let t = IommuTranslate::new(self.dev.endpoint_dma(self.ep).expect("endpoint"), None);
        DmaSpace::translated(mem.clone(), Arc::new(t))
    }
}
