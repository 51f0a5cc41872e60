//! The mirror against a real virtio-iommu device and a fake host function
//! whose container records every call and fails on demand.
//!
//! WHY a fake: no test machine has a function to assign, and the path
//! under test (a failed VFIO unmap) is one a real host rarely takes. The
//! fake's call log also carries the "completion" the transport publishes
//! after `complete_kick`, so the order of the log proves that the stop
//! happened before the guest could see its request complete.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use virtio_iommu::mapping::Perm;
use virtio_iommu::wire::{DetachReq, MapReq, Request, UnmapReq};
use vm_memory::GuestAddress;

use super::host::HostFunction;
use super::mirror::VfioMirror;
use crate::dma::test_iommu::{TestIommu, RW};
use crate::memory::GuestMemoryMmap;

const EP: u32 = 0x20;
const RAM: usize = 0x100000;

/// One call the mirror made, or the transport's publication of a
/// request's completion.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Map {
        iova: u64,
        len: u64,
    },
    Unmap {
        iova: u64,
        len: u64,
        ok: bool,
    },
    UnmapAll {
        ok: bool,
    },
    StopBusMaster {
        ok: bool,
    },
    /// The VMM would have exited here.
    Fatal,
    /// The transport published the request's completion.
    Completed,
}

/// A container and function in memory: what is mapped, whether bus
/// mastering is on, and every call in order.
struct FakeHost {
    unmap_all: bool,
    /// Outcomes of the next unmap calls (of either kind), in order; an
    /// empty script lets them pass.
    script: Mutex<VecDeque<bool>>,
    /// Bus mastering cannot be cleared.
    stuck_master: bool,
    mapped: Mutex<BTreeMap<u64, u64>>,
    bus_master: AtomicBool,
    log: Arc<Mutex<Vec<Call>>>,
}

impl FakeHost {
    fn new(unmap_all: bool, stuck_master: bool) -> Arc<Self> {
        Arc::new(Self {
            unmap_all,
            script: Mutex::default(),
            stuck_master,
            mapped: Mutex::default(),
            bus_master: AtomicBool::new(true),
            log: Arc::default(),
        })
    }

    /// The next unmaps succeed or fail as `outcomes` says.
    fn script(&self, outcomes: &[bool]) {
        self.script.lock().unwrap().extend(outcomes);
    }

    fn next_ok(&self) -> bool {
        self.script.lock().unwrap().pop_front().unwrap_or(true)
    }

    fn record(&self, c: Call) {
        self.log.lock().unwrap().push(c);
    }

    fn calls(&self) -> Vec<Call> {
        self.log.lock().unwrap().clone()
    }

    fn is_empty(&self) -> bool {
        self.mapped.lock().unwrap().is_empty()
    }
}

impl HostFunction for FakeHost {
    fn can_unmap_all(&self) -> bool {
        self.unmap_all
    }

    unsafe fn map_dma(&self, iova: u64, len: u64, _host: u64, _perm: Perm) -> io::Result<()> {
        self.record(Call::Map { iova, len });
        self.mapped.lock().unwrap().insert(iova, iova + len - 1);
        Ok(())
    }

    fn unmap_dma(&self, iova: u64, len: u64) -> io::Result<()> {
        let ok = self.next_ok();
        self.record(Call::Unmap { iova, len, ok });
        if !ok {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let last = iova + (len - 1);
        self.mapped
            .lock()
            .unwrap()
            .retain(|&s, &mut e| !(s >= iova && e <= last));
        Ok(())
    }

    fn unmap_all(&self) -> io::Result<()> {
        assert!(self.unmap_all, "UNMAP_ALL used without the extension");
        let ok = self.next_ok();
        self.record(Call::UnmapAll { ok });
        if !ok {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.mapped.lock().unwrap().clear();
        Ok(())
    }

    fn stop_bus_master(&self) -> io::Result<()> {
        let ok = !self.stuck_master;
        self.record(Call::StopBusMaster { ok });
        if !ok {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.bus_master.store(false, Ordering::SeqCst);
        Ok(())
    }
}

/// A device whose endpoint `EP` is mirrored into `host`, attached to
/// domain 1 with `0x10000..0x12000` and `0x20000..0x21000` mapped. A stop
/// that fails records `Fatal` in the host's log instead of ending the
/// test process.
fn setup(host: &Arc<FakeHost>) -> (TestIommu, Arc<VfioMirror>) {
    let iommu = TestIommu::new(EP);
    iommu.dev.require_explicit_maps(EP).unwrap();
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), RAM)]).unwrap();
    let log = host.log.clone();
    let fatal = move |_: &str| log.lock().unwrap().push(Call::Fatal);
    let mirror = Arc::new(VfioMirror::new("fake".into(), EP, host.clone(), mem).with_fatal(fatal));
    iommu.dev.add_invalidator(mirror.clone());
    iommu.dev.add_map_mirror(mirror.clone());
    iommu.attach(1);
    iommu.map(1, 0x10000, 0x2000, 0x40000, RW);
    iommu.map(1, 0x20000, 0x1000, 0x50000, RW);
    assert_eq!(host.mapped.lock().unwrap().len(), 2);
    (iommu, mirror)
}

/// Sends `req` as one kick on a request thread, which records the
/// completion in `host`'s log once `complete_kick` returned (the point
/// where the transport publishes); returns the status the guest sees.
fn send_and_publish(iommu: &TestIommu, host: &FakeHost, req: Request) -> u8 {
    let (tx, rx) = mpsc::channel();
    let (dev, log) = (iommu.dev.clone(), host.log.clone());
    thread::spawn(move || {
        let mut w = dev.new_worker();
        let mut tail = [0xffu8; 4];
        dev.handle_request(&mut w, &req.encode(), &mut tail);
        dev.complete_kick(&mut w);
        log.lock().unwrap().push(Call::Completed);
        tx.send(tail[0]).unwrap();
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the request completed")
}

fn position(calls: &[Call], want: impl Fn(&Call) -> bool) -> usize {
    calls
        .iter()
        .position(want)
        .unwrap_or_else(|| panic!("call missing from {calls:#?}"))
}

fn unmap_req() -> Request {
    Request::Unmap(UnmapReq {
        domain: 1,
        virt_start: 0x10000,
        virt_end: 0x11fff,
    })
}

fn detach_req() -> Request {
    Request::Detach(DetachReq {
        domain: 1,
        endpoint: EP,
    })
}

/// After the completion is visible: the failed call, then bus mastering
/// cleared, then the container emptied, then the completion; and the
/// function stays stopped (a later MAP or identity domain reaches the
/// host no more, while the MAP itself still completes: the domain may
/// serve other endpoints).
fn check_stopped(iommu: &TestIommu, host: &FakeHost, mirror: &VfioMirror) {
    let calls = host.calls();
    let failed = position(&calls, |c| {
        matches!(
            c,
            Call::Unmap { ok: false, .. } | Call::UnmapAll { ok: false }
        )
    });
    let stopped = position(&calls, |c| *c == Call::StopBusMaster { ok: true });
    let done = position(&calls, |c| *c == Call::Completed);
    assert!(failed < stopped && stopped < done, "{calls:#?}");
    assert!(!calls.contains(&Call::Fatal), "{calls:#?}");
    assert!(!host.bus_master.load(Ordering::SeqCst), "bus mastering off");
    assert!(host.is_empty(), "container emptied: {calls:#?}");
    assert!(mirror.failed());
    // Nothing is mapped for the device again.
    let before = host.calls().len();
    let map = Request::Map(MapReq {
        domain: 1,
        virt_start: 0x30000,
        virt_end: 0x30fff,
        phys_start: 0x60000,
        flags: RW,
    });
    iommu.attach(1);
    assert_eq!(send_and_publish(iommu, host, map), 0);
    let bypass = Request::Attach(virtio_iommu::wire::AttachReq {
        domain: 3,
        endpoint: EP,
        flags: virtio_iommu::wire::ATTACH_F_BYPASS,
        reserved: [0; 4],
    });
    assert_eq!(send_and_publish(iommu, host, bypass), 0);
    let after = host.calls();
    assert!(
        !after[before..]
            .iter()
            .any(|c| matches!(c, Call::Map { .. })),
        "{after:#?}"
    );
    assert!(host.is_empty());
}

#[test]
fn vfio_unmap_failure_stops_the_function() {
    // With UNMAP_ALL: the UNMAP's call fails; the stop empties in one.
    let host = FakeHost::new(true, false);
    let (iommu, mirror) = setup(&host);
    host.script(&[false]);
    let status = send_and_publish(&iommu, &host, unmap_req());
    assert_eq!(status, 0);
    check_stopped(&iommu, &host, &mirror);
    assert!(host.calls().contains(&Call::UnmapAll { ok: true }));

    // Without it: the stop's span over everything fails too, and the
    // mappings go one by one.
    let host = FakeHost::new(false, false);
    let (iommu, mirror) = setup(&host);
    host.script(&[false, false]);
    let status = send_and_publish(&iommu, &host, unmap_req());
    assert_eq!(status, 0);
    check_stopped(&iommu, &host, &mirror);

    // A DETACH whose emptying fails stops the function the same way.
    for unmap_all in [true, false] {
        let host = FakeHost::new(unmap_all, false);
        let (iommu, mirror) = setup(&host);
        host.script(&[false]);
        assert_eq!(send_and_publish(&iommu, &host, detach_req()), 0);
        check_stopped(&iommu, &host, &mirror);
    }
}

/// When the stop itself fails (bus mastering cannot be cleared), the VMM
/// ends before the completion could be published.
#[test]
fn vfio_stop_failure_ends_the_vmm_before_completion() {
    let host = FakeHost::new(true, true);
    let (iommu, _mirror) = setup(&host);
    host.script(&[false]);
    send_and_publish(&iommu, &host, unmap_req());
    let calls = host.calls();
    let fatal = position(&calls, |c| *c == Call::Fatal);
    let done = position(&calls, |c| *c == Call::Completed);
    assert!(fatal < done, "{calls:#?}");
}

/// Without VFIO_UNMAP_ALL a domain change unmaps what was recorded, and
/// never asks for UNMAP_ALL (the fake refuses it); with it, one call.
#[test]
fn domain_change_empties_the_container_with_or_without_unmap_all() {
    for unmap_all in [false, true] {
        let host = FakeHost::new(unmap_all, false);
        let (iommu, mirror) = setup(&host);
        assert_eq!(send_and_publish(&iommu, &host, detach_req()), 0);
        assert!(host.is_empty(), "{:#?}", host.calls());
        assert!(!mirror.failed());
        let calls = host.calls();
        if unmap_all {
            assert!(calls.contains(&Call::UnmapAll { ok: true }));
        } else {
            assert!(calls.contains(&Call::Unmap {
                iova: 0x10000,
                len: 0x11000,
                ok: true
            }));
        }
        // The function works on: attached again, it maps.
        iommu.attach(1);
        iommu.map(1, 0x10000, 0x1000, 0x40000, RW);
        assert!(!host.is_empty());
    }
}

/// An UNMAP that works unmaps the joined span and completes after it.
#[test]
fn unmap_reaches_the_container_before_completion() {
    let host = FakeHost::new(true, false);
    let (iommu, mirror) = setup(&host);
    assert_eq!(send_and_publish(&iommu, &host, unmap_req()), 0);
    let calls = host.calls();
    let unmapped = position(&calls, |c| {
        *c == Call::Unmap {
            iova: 0x10000,
            len: 0x2000,
            ok: true,
        }
    });
    assert!(unmapped < position(&calls, |c| *c == Call::Completed));
    assert_eq!(host.mapped.lock().unwrap().len(), 1);
    assert!(!mirror.failed());
    assert!(host.bus_master.load(Ordering::SeqCst));
}
