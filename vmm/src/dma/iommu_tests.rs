//! Tests of `iommu.rs` (the vIOMMU as a device's DMA translator) against a
//! real virtio-iommu device driven by `test_iommu.rs`.
//!
//! WHY apart from `iommu.rs`: the test device is built on `IommuTranslate`,
//! so tests inside `iommu.rs` would make the two modules import each other.

use std::sync::Arc;

use vmm_sys_util::eventfd::EventFd;

use super::iommu::IommuTranslate;
use crate::dma::test_iommu::{TestIommu, RW};
use crate::dma::{DmaSpace, ThreadDma};
use crate::memory::GuestMemoryMmap;
use virtio_iommu::device::{IommuConfig, IommuDevice};
use virtio_iommu::wire::feature;
use vm_memory::{Bytes, GuestAddress};

const EP: u32 = 0x18;

fn setup() -> (TestIommu, GuestMemoryMmap, DmaSpace, Arc<EventFd>) {
    let dev = IommuDevice::new(IommuConfig::default()).unwrap();
    dev.add_endpoint(EP).unwrap();
    dev.ack_features(dev.device_features() & !(1 << feature::BYPASS_CONFIG));
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x100000)]).unwrap();
    let evt = Arc::new(EventFd::new(libc::EFD_NONBLOCK).unwrap());
    let t = IommuTranslate::new(dev.endpoint_dma(EP).unwrap(), Some(evt.clone()));
    assert_eq!(t.endpoint_id(), EP);
    let space = DmaSpace::translated(mem.clone(), Arc::new(t));
    (TestIommu::with_device(dev, EP), mem, space, evt)
}

#[test]
fn unattached_endpoint_is_blocked_and_reported() {
    let (dev, mem, space, evt) = setup();
    mem.write_obj(0x55u8, GuestAddress(0x2000)).unwrap();
    assert!(space.write_obj(0xaau8, GuestAddress(0x2000)).is_err());
    assert_eq!(mem.read_obj::<u8>(GuestAddress(0x2000)).unwrap(), 0x55);
    assert_eq!(evt.read().unwrap(), 1);
    let ev = dev.dev.pop_fault_event().unwrap();
    // struct virtio_iommu_fault: reason, reserved[3], flags, endpoint, reserved, address
    assert_eq!(u32::from_le_bytes(ev[8..12].try_into().unwrap()), EP);
    assert_eq!(u64::from_le_bytes(ev[16..24].try_into().unwrap()), 0x2000);
}

#[test]
fn mapped_pages_translate_and_unmap_blocks() {
    let (dev, mem, space, evt) = setup();
    dev.attach(1);
    // IOVA 0x10000-0x11fff -> GPA 0x40000, read+write.
    dev.map(1, 0x10000, 0x2000, 0x40000, RW);
    let data: Vec<u8> = (0..64).collect();
    space.write_slice(&data, GuestAddress(0x10ff0)).unwrap();
    let mut back = [0u8; 64];
    mem.read_slice(&mut back, GuestAddress(0x40ff0)).unwrap();
    assert_eq!(&back[..], &data[..]);
    assert!(evt.read().is_err(), "no fault so far");
    dev.unmap(1, 0x10000, 0x2000);
    mem.write_slice(&[0x5a; 64], GuestAddress(0x40ff0)).unwrap();
    assert!(space.write_slice(&data, GuestAddress(0x10ff0)).is_err());
    mem.read_slice(&mut back, GuestAddress(0x40ff0)).unwrap();
    assert_eq!(back, [0x5a; 64]);
    assert_eq!(evt.read().unwrap(), 1);
    assert!(dev.dev.pop_fault_event().is_some());
}

/// Issue 9's promise at the seam: the kick that unmaps a page does not
/// complete while a device thread that may have translated it before
/// the UNMAP is still inside its section.
#[test]
fn unmap_completion_waits_for_a_device_section() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use virtio_iommu::quiesce::Quiescer;

    let (dev, mem, space, _evt) = setup();
    let q = Quiescer::new();
    dev.dev.add_invalidator(q.clone());
    let space = space.with_quiescer(q.clone());
    let mut dma = ThreadDma::new(space.clone()).expect("a reader behind a quiescing vIOMMU");
    assert!(DmaSpace::identity(mem).reader().is_none());
    dev.attach(1);
    dev.map(1, 0x10000, 0x1000, 0x40000, RW);
    // Outside a guard the mapped page is refused: no UNMAP would wait.
    assert!(space.write_obj(6u64, GuestAddress(0x10000)).is_err());
    let section = dma.access();
    section.write_obj(7u64, GuestAddress(0x10000)).unwrap();
    let device_done = Arc::new(AtomicBool::new(false));
    let unmapper = {
        let (dev, device_done) = (dev.clone(), device_done.clone());
        std::thread::spawn(move || {
            dev.unmap(1, 0x10000, 0x1000);
            device_done.load(Ordering::SeqCst)
        })
    };
    // Until the unmapper is inside the quiescer's wait (however slowly a
    // loaded machine schedules it), then a little longer.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while q.stats().waits == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(q.stats().waits, 1, "the UNMAP never reached the quiescer");
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(!unmapper.is_finished(), "UNMAP completed inside a section");
    device_done.store(true, Ordering::SeqCst);
    drop(section);
    assert!(
        unmapper.join().unwrap(),
        "UNMAP completed before the section ended"
    );
    assert!(dma.access().write_obj(8u64, GuestAddress(0x10000)).is_err());
    assert_eq!(q.stats().waited_for_reader, 1);
}

#[test]
fn read_only_mapping_refuses_writes() {
    let (dev, _mem, space, _evt) = setup();
    dev.attach(1);
    // Read-only.
    dev.map(1, 0x10000, 0x1000, 0x40000, 1);
    assert!(space.read_obj::<u64>(GuestAddress(0x10000)).is_ok());
    assert!(space.write_obj(1u64, GuestAddress(0x10000)).is_err());
}
