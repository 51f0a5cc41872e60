//! MSI-X masking of an assigned function, against a fake function whose
//! interrupts bypass the VMM as VFIO's do (issue 28).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::*;
use crate::interrupt::{InterruptError, MsiMessage};

/// One vector as the host kernel sees it: an eventfd that KVM consumes
/// (delivering the MSI) while attached as irqfd, and that only counts
/// while detached.
#[derive(Default)]
struct Line {
    detached: AtomicBool,
    count: AtomicU64,
    delivered: AtomicU32,
    routed: Mutex<Option<MsiMessage>>,
}

impl Line {
    /// The function (or the VMM) writes the eventfd.
    fn signal(&self) {
        if self.detached.load(Ordering::SeqCst) {
            self.count.fetch_add(1, Ordering::SeqCst);
        } else {
            self.delivered.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn delivered(&self) -> u32 {
        self.delivered.load(Ordering::SeqCst)
    }
}

struct FakeVector(Arc<Line>);

impl MsiSink for FakeVector {
    fn route(&mut self, msg: MsiMessage) -> Result<(), InterruptError> {
        *self.0.routed.lock().unwrap() = Some(msg);
        Ok(())
    }
    fn trigger(&self) {
        self.0.signal();
    }
    fn set_masked(&mut self, masked: bool) -> Result<(), InterruptError> {
        self.0.detached.store(masked, Ordering::SeqCst);
        Ok(())
    }
    fn take_signals(&mut self) -> bool {
        self.0.detached.load(Ordering::SeqCst) && self.0.count.swap(0, Ordering::SeqCst) > 0
    }
}

/// The function: raises its vectors only while MSI-X is on in VFIO.
#[derive(Default)]
struct FakeFunction {
    on: AtomicBool,
    lines: Vec<Arc<Line>>,
}

impl FakeFunction {
    fn raise(&self, v: usize) {
        if self.on.load(Ordering::SeqCst) {
            self.lines[v].signal();
        }
    }
}

impl MsixSwitch for FakeFunction {
    fn enable_msix(&self, fds: Vec<&EventFd>) -> Result<(), VfioError> {
        assert_eq!(fds.len(), self.lines.len());
        self.on.store(true, Ordering::SeqCst);
        Ok(())
    }
    fn disable_msix(&self) -> Result<(), VfioError> {
        self.on.store(false, Ordering::SeqCst);
        Ok(())
    }
}

fn block(n: usize) -> (MsixBlock, FakeFunction) {
    let lines: Vec<Arc<Line>> = (0..n).map(|_| Arc::default()).collect();
    let vectors = lines
        .iter()
        .map(|l| {
            let fd = EventFd::new(libc::EFD_NONBLOCK).unwrap();
            (Box::new(FakeVector(l.clone())) as Box<dyn MsiSink>, fd)
        })
        .collect();
    let b = MsixBlock::new(0x50, (3, 0), (3, 0x2000), vectors);
    let f = FakeFunction {
        on: AtomicBool::new(false),
        lines,
    };
    (b, f)
}

fn pba(b: &mut MsixBlock) -> u8 {
    let mut d = [0u8; 1];
    let at = b.target(3, 0x2000).expect("PBA");
    b.read(at, &mut d);
    d[0]
}

fn table_write(b: &mut MsixBlock, v: u64, word: u64, value: u32) {
    let at = b.target(3, v * 16 + word * 4).expect("table");
    b.write(at, &value.to_le_bytes());
}

#[test]
fn vfio_msix_mask_is_honoured() {
    let (mut b, f) = block(2);
    assert!(
        f.lines.iter().all(|l| l.detached.load(Ordering::SeqCst)),
        "entries come out of reset masked"
    );
    b.set_control("t", &f, MSIX_ENABLE);
    assert!(b.live() && f.on.load(Ordering::SeqCst));
    table_write(&mut b, 0, 0, 0xfee0_0000);
    table_write(&mut b, 0, 2, 0x41);
    table_write(&mut b, 0, 3, 0);
    assert_eq!(
        *f.lines[0].routed.lock().unwrap(),
        Some(MsiMessage {
            addr: 0xfee0_0000,
            data: 0x41
        })
    );
    f.raise(0);
    assert_eq!(f.lines[0].delivered(), 1);

    // Per-vector mask: nothing reaches the guest, the PBA says pending.
    table_write(&mut b, 0, 3, 1);
    f.raise(0);
    f.raise(0);
    assert_eq!(f.lines[0].delivered(), 1, "masked vector delivered");
    assert_eq!(pba(&mut b), 0b01);
    assert_eq!(pba(&mut b), 0b01, "reading the PBA does not clear it");
    // Unmask: delivered once, the pending bit cleared.
    table_write(&mut b, 0, 3, 0);
    assert_eq!(f.lines[0].delivered(), 2);
    assert_eq!(pba(&mut b), 0);
    f.raise(0);
    assert_eq!(f.lines[0].delivered(), 3);

    // Unmasked with nothing pending: nothing extra delivered.
    table_write(&mut b, 0, 3, 1);
    table_write(&mut b, 0, 3, 0);
    assert_eq!(f.lines[0].delivered(), 3);

    // Function mask: same, for every vector, and it reads back.
    b.set_control("t", &f, MSIX_ENABLE | MSIX_FUNCTION_MASK);
    assert_eq!(b.control(7), 7 | MSIX_ENABLE | MSIX_FUNCTION_MASK);
    f.raise(0);
    assert_eq!(
        f.lines[0].delivered(),
        3,
        "function-masked vector delivered"
    );
    assert_eq!(pba(&mut b), 0b01);
    b.set_control("t", &f, MSIX_ENABLE);
    assert_eq!(f.lines[0].delivered(), 4);
    assert_eq!(pba(&mut b), 0);
    assert_eq!(b.control(7), 7 | MSIX_ENABLE);

    // A vector the guest never unmasked only pends.
    f.raise(1);
    assert_eq!(f.lines[1].delivered(), 0);
    assert_eq!(pba(&mut b), 0b10);

    // MSI-X off: off in VFIO too.
    b.set_control("t", &f, 0);
    assert!(!b.live() && !f.on.load(Ordering::SeqCst));
}

#[test]
fn accesses_outside_the_structures_are_not_msix() {
    let (b, _) = block(2);
    assert!(b.target(3, 2 * 16).is_none());
    assert!(b.target(2, 0).is_none());
    assert!(b.target(3, 0x2008).is_none());
    assert!(matches!(b.target(3, 0x1c), Some(MsixAccess::Table(0x1c))));
    assert!(b.target(3, u64::MAX).is_none());
}
