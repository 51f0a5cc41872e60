//! Fuzzes the vhost-user back-end channel: whatever bytes a back-end
//! writes (headers, sizes, IOTLB messages of any type, garbage) are served
//! by `serve_backend_channel` without a panic or a hang; it ends when the
//! stream does, answering only what asked for an answer. The endpoint is
//! unattached, so every miss must be refused.
#![no_main]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, OnceLock};

use libfuzzer_sys::fuzz_target;
use virtio_iommu::device::{IommuConfig, IommuDevice};
use vmm::memory::{create_guest_memory, GuestMemoryMmap};
use vmm::vhost_user::client::Client;
use vmm::vhost_user::iotlb::{serve_backend_channel, BackendIotlb};
use vmm::vhost_user::stop::BackendStop;

fn setup() -> &'static (IommuDevice, GuestMemoryMmap) {
    static S: OnceLock<(IommuDevice, GuestMemoryMmap)> = OnceLock::new();
    S.get_or_init(|| {
        let dev = IommuDevice::new(IommuConfig::default()).expect("iommu");
        dev.add_endpoint(1).expect("endpoint");
        let mem = create_guest_memory(64 << 20, false, true).expect("memory");
        (dev, mem)
    })
}

fuzz_target!(|data: &[u8]| {
    let (dev, mem) = setup();
    let (mut feed, theirs) = UnixStream::pair().expect("socketpair");
    let (front, _back_end) = UnixStream::pair().expect("socketpair");
    let client = Client::from_stream(front).expect("client");
    // No invalidation is sent here, so no stop may be needed.
    let stop = Arc::new(BackendStop::new(Box::new(|why| {
        panic!("back-end stop in the channel fuzzer: {why}")
    })));
    let iotlb = Arc::new(BackendIotlb::new(
        Arc::new(Mutex::new(client)),
        stop,
        mem.clone(),
    ));
    iotlb.set_endpoint(dev.endpoint_dma(1).expect("endpoint dma"));
    let served = iotlb.clone();
    let server = std::thread::spawn(move || serve_backend_channel(theirs, served));
    let _ = feed.write_all(data);
    let _ = feed.shutdown(std::net::Shutdown::Write);
    let mut replies = Vec::new();
    let _ = feed.read_to_end(&mut replies);
    server.join().expect("the channel thread panicked");
    let refused = iotlb
        .stats
        .refused
        .load(std::sync::atomic::Ordering::Relaxed);
    let misses = iotlb
        .stats
        .misses
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(refused, misses, "an unattached endpoint translated a miss");
});
