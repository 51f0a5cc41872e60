//! The virtio-pci modern transport (virtio 1.2, 4.1).
//!
//! One 64-bit memory BAR holds every structure; vendor-specific PCI
//! capabilities tell the driver where:
//!
//! ```text
//! BAR0 + 0x0000  common configuration (0x38 bytes)
//! BAR0 + 0x1000  ISR status (1 byte, read-to-clear)
//! BAR0 + 0x2000  device-specific configuration (up to 4 KiB)
//! BAR0 + 0x3000  notify area: queue i at 0x3000 + 4 * i
//! BAR0 + 0x4000  MSI-X table (16 bytes per vector)
//! BAR0 + 0x6000  MSI-X pending bit array
//! ```
//!
//! WHY one notify address per queue (`notify_off_multiplier` = 4): each
//! address gets its own ioeventfd without data matching, so a kick is an
//! eventfd signal in the kernel and never reaches a vCPU thread's device
//! code. Writes that do reach us (e.g. before ioeventfds are registered)
//! signal the same eventfd.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use kvm_ioctls::{IoEventAddress, NoDatamatch, VmFd};
use log::{debug, info, warn};
use thiserror::Error;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::EventFd;

use virtio_iommu::locks::Unpoison;

use super::common_cfg::{CommonCfgAction, CommonConfig, COMMON_CFG_SIZE, VIRTIO_MSI_NO_VECTOR};
use super::msix::{MsiSink, MsixState, MSIX_CAP_ID, MSIX_ENTRY_SIZE};
use super::{
    feature, ActivateContext, ActiveQueue, VirtioDevice, VirtioInterrupt, VIRTIO_F_ACCESS_PLATFORM,
    VIRTIO_F_VERSION_1, VIRTIO_RING_F_EVENT_IDX,
};
use crate::dma::DmaSpace;
use crate::interrupt::{GsiRouter, InterruptError};
use crate::pci::{
    BarKind, BarPlaceError, BarReprogram, PciConfigError, PciConfiguration, PciDevice, PciHeader,
};
use crate::width::{const_u32, const_u8};

/// PCI vendor id of virtio devices.
pub const VIRTIO_PCI_VENDOR_ID: u16 = 0x1af4;
/// Modern device ids are 0x1040 + virtio device id.
pub const VIRTIO_PCI_DEVICE_ID_BASE: u16 = 0x1040;
/// The BAR holding every virtio structure.
pub const VIRTIO_BAR: usize = 0;
/// Its size.
pub const VIRTIO_BAR_SIZE: u64 = 0x8000;
/// Offsets inside the BAR.
pub const COMMON_CFG_OFFSET: u64 = 0x0000;
/// ISR status.
pub const ISR_OFFSET: u64 = 0x1000;
/// Device-specific configuration.
pub const DEVICE_CFG_OFFSET: u64 = 0x2000;
/// Size reserved for the device configuration.
pub const DEVICE_CFG_SIZE: u64 = 0x1000;
/// Notify area.
pub const NOTIFY_OFFSET: u64 = 0x3000;
/// Notify area size (up to 1024 queues).
pub const NOTIFY_SIZE: u64 = 0x1000;
/// Bytes between two queues' notify addresses.
pub const NOTIFY_OFF_MULTIPLIER: u32 = 4;
/// MSI-X table.
pub const MSIX_TABLE_OFFSET: u64 = 0x4000;
/// MSI-X pending bit array.
pub const MSIX_PBA_OFFSET: u64 = 0x6000;
/// Largest number of queues (bounded by the MSI-X table room).
pub const MAX_QUEUES: usize = 255;

/// The BAR layout in the 8- and 32-bit fields of the capabilities that
/// describe it (narrowed by the compiler: a layout that did not fit would
/// fail the build).
const BAR_INDEX: u8 = const_u8(VIRTIO_BAR as i128);
const COMMON_CAP: (u32, u32) = (
    const_u32(COMMON_CFG_OFFSET as i128),
    const_u32(COMMON_CFG_SIZE as i128),
);
const NOTIFY_CAP_OFFSET: u32 = const_u32(NOTIFY_OFFSET as i128);
const ISR_CAP_OFFSET: u32 = const_u32(ISR_OFFSET as i128);
const DEVICE_CAP: (u32, u32) = (
    const_u32(DEVICE_CFG_OFFSET as i128),
    const_u32(DEVICE_CFG_SIZE as i128),
);
/// MSI-X table and PBA: offset in the BAR, BAR index in the low bits.
const MSIX_TABLE_BIR: u32 = const_u32((MSIX_TABLE_OFFSET | VIRTIO_BAR as u64) as i128);
const MSIX_PBA_BIR: u32 = const_u32((MSIX_PBA_OFFSET | VIRTIO_BAR as u64) as i128);

const CAP_VENDOR: u8 = 0x09;
const CFG_TYPE_COMMON: u8 = 1;
const CFG_TYPE_NOTIFY: u8 = 2;
const CFG_TYPE_ISR: u8 = 3;
const CFG_TYPE_DEVICE: u8 = 4;
/// ISR bit: a queue interrupt.
const ISR_QUEUE: u8 = 1;
/// ISR bit: a configuration change.
const ISR_CONFIG: u8 = 2;

/// Errors while creating the transport.
#[derive(Debug, Error)]
pub enum VirtioPciError {
    /// The configuration space could not be built.
    #[error("PCI configuration: {0}")]
    Config(#[from] PciConfigError),
    /// MSI-X vectors could not be set up.
    #[error("MSI-X: {0}")]
    Interrupt(#[from] InterruptError),
    /// An event fd could not be created.
    #[error("eventfd: {0}")]
    EventFd(std::io::Error),
    /// The device has no queues or too many.
    #[error("device has {0} queues (1..={MAX_QUEUES} supported)")]
    Queues(usize),
    /// The device type has no virtio-pci device id (0x1040 + type, 16 bits).
    #[error("virtio device type {0} has no PCI device id")]
    DeviceType(u32),
}

/// Interrupt delivery shared with the device's threads.
struct TransportInterrupt {
    msix: Arc<Mutex<MsixState>>,
    queue_vectors: Vec<AtomicU16>,
    config_vector: AtomicU16,
    isr: AtomicU8,
    needs_reset: AtomicBool,
}

impl TransportInterrupt {
    fn signal(&self, vector: u16) {
        if vector != VIRTIO_MSI_NO_VECTOR {
            self.msix.lock().unpoisoned().signal(vector);
        }
    }
}

impl VirtioInterrupt for TransportInterrupt {
    fn notify_queue(&self, queue: u16) {
        self.isr.fetch_or(ISR_QUEUE, Ordering::SeqCst);
        if let Some(v) = self.queue_vectors.get(usize::from(queue)) {
            self.signal(v.load(Ordering::Acquire));
        }
    }

    fn notify_config(&self) {
        self.isr.fetch_or(ISR_CONFIG, Ordering::SeqCst);
        self.signal(self.config_vector.load(Ordering::Acquire));
    }

    fn set_needs_reset(&self) {
        if !self.needs_reset.swap(true, Ordering::SeqCst) {
            self.notify_config();
        }
    }
}

/// Where the transport registers the ioeventfds of its notify addresses:
/// the VM (KVM signals the eventfd without leaving the kernel), or a
/// recorder in tests.
pub trait IoEvents: Send + Sync {
    /// Signal `fd` on every write to guest-physical MMIO address `addr`.
    fn register(&self, fd: &EventFd, addr: u64) -> Result<(), kvm_ioctls::Error>;
    /// Undoes [`IoEvents::register`].
    fn unregister(&self, fd: &EventFd, addr: u64) -> Result<(), kvm_ioctls::Error>;
}

impl IoEvents for VmFd {
    fn register(&self, fd: &EventFd, addr: u64) -> Result<(), kvm_ioctls::Error> {
        self.register_ioevent(fd, &IoEventAddress::Mmio(addr), NoDatamatch)
    }

    fn unregister(&self, fd: &EventFd, addr: u64) -> Result<(), kvm_ioctls::Error> {
        self.unregister_ioevent(fd, &IoEventAddress::Mmio(addr), NoDatamatch)
    }
}

/// Why a queue the driver set ready cannot be started.
#[derive(Debug, Error)]
enum QueueSetupError {
    /// The device has no such queue.
    #[error("no queue {0}")]
    NoQueue(usize),
    /// A size or ring address the driver wrote is not valid.
    #[error(transparent)]
    Queue(#[from] virtio_queue::Error),
    /// The rings lie outside what the device can reach by DMA.
    #[error("queue {index} rings (desc {desc:#x}, avail {avail:#x}, used {used:#x}, size {size}) are not in DMA-reachable memory")]
    Unreachable {
        /// The queue.
        index: usize,
        /// Descriptor table address.
        desc: u64,
        /// Available ring address.
        avail: u64,
        /// Used ring address.
        used: u64,
        /// Queue size.
        size: u16,
    },
}

/// A virtio device on the PCI bus.
pub struct VirtioPciDevice {
    config: PciConfiguration,
    common: CommonConfig,
    device: Box<dyn VirtioDevice>,
    interrupt: Arc<TransportInterrupt>,
    msix: Arc<Mutex<MsixState>>,
    msix_cap_reg: usize,
    kicks: Vec<EventFd>,
    ioevent_sink: Arc<dyn IoEvents>,
    ioevents: Vec<(u64, usize)>,
    dma: DmaSpace,
    active: bool,
    /// Hot-unplugged: never activated again (an access dispatched before
    /// the unplug may still reach it).
    unplugged: bool,
}

/// Builds a vendor-specific virtio capability body (after id and next).
fn virtio_cap(cfg_type: u8, (offset, length): (u32, u32), extra: Option<u32>) -> Vec<u8> {
    let cap_len: u8 = if extra.is_some() { 20 } else { 16 };
    let mut v = vec![cap_len, cfg_type, BAR_INDEX, 0, 0, 0];
    v.extend_from_slice(&offset.to_le_bytes());
    v.extend_from_slice(&length.to_le_bytes());
    if let Some(x) = extra {
        v.extend_from_slice(&x.to_le_bytes());
    }
    v
}

impl VirtioPciDevice {
    /// Wraps `device`. `iommu` offers VIRTIO_F_ACCESS_PLATFORM (the device
    /// sits behind the vIOMMU; `dma` should then translate). MSI-X vectors
    /// (one per queue plus one for configuration) come from `router`.
    pub fn new(
        device: Box<dyn VirtioDevice>,
        vm: Arc<VmFd>,
        router: &Arc<GsiRouter>,
        dma: DmaSpace,
        iommu: bool,
    ) -> Result<Self, VirtioPciError> {
        let num_vectors = device.queue_max_sizes().len() + 1;
        let mut sinks: Vec<Box<dyn MsiSink>> = Vec::with_capacity(num_vectors);
        for _ in 0..num_vectors {
            sinks.push(Box::new(router.new_vector()?));
        }
        Self::with_sinks(device, vm, sinks, dma, iommu)
    }

    fn with_sinks(
        device: Box<dyn VirtioDevice>,
        ioevent_sink: Arc<dyn IoEvents>,
        sinks: Vec<Box<dyn MsiSink>>,
        dma: DmaSpace,
        iommu: bool,
    ) -> Result<Self, VirtioPciError> {
        let sizes = device.queue_max_sizes();
        if sizes.is_empty() || sizes.len() > MAX_QUEUES {
            return Err(VirtioPciError::Queues(sizes.len()));
        }
        // At most MAX_QUEUES (255): the count and one vector more fit u16.
        let queue_count =
            u16::try_from(sizes.len()).map_err(|_| VirtioPciError::Queues(sizes.len()))?;
        let vector_count = queue_count + 1;
        let device_id = u16::try_from(device.device_type())
            .ok()
            .and_then(|t| VIRTIO_PCI_DEVICE_ID_BASE.checked_add(t))
            .ok_or(VirtioPciError::DeviceType(device.device_type()))?;
        let mut features = device.features() | feature(VIRTIO_F_VERSION_1);
        if iommu {
            features |= feature(VIRTIO_F_ACCESS_PLATFORM);
        }
        let (class, subclass) = device.pci_class();
        let mut config = PciConfiguration::new(PciHeader {
            vendor_id: VIRTIO_PCI_VENDOR_ID,
            device_id,
            class,
            subclass,
            prog_if: 0,
            // Modern-only devices have revision >= 1.
            revision: 1,
            subsystem_vendor_id: VIRTIO_PCI_VENDOR_ID,
            subsystem_id: 0x40,
            interrupt_pin: 0,
        });
        config.add_bar(
            VIRTIO_BAR,
            VIRTIO_BAR_SIZE,
            BarKind::Mem64 {
                prefetchable: false,
            },
        )?;
        config.add_capability(CAP_VENDOR, &virtio_cap(CFG_TYPE_COMMON, COMMON_CAP, None))?;
        config.add_capability(
            CAP_VENDOR,
            &virtio_cap(
                CFG_TYPE_NOTIFY,
                (
                    NOTIFY_CAP_OFFSET,
                    u32::from(queue_count) * NOTIFY_OFF_MULTIPLIER,
                ),
                Some(NOTIFY_OFF_MULTIPLIER),
            ),
        )?;
        config.add_capability(
            CAP_VENDOR,
            &virtio_cap(CFG_TYPE_ISR, (ISR_CAP_OFFSET, 1), None),
        )?;
        config.add_capability(CAP_VENDOR, &virtio_cap(CFG_TYPE_DEVICE, DEVICE_CAP, None))?;
        let mut msix_body = Vec::with_capacity(10);
        msix_body.extend_from_slice(&queue_count.to_le_bytes());
        msix_body.extend_from_slice(&MSIX_TABLE_BIR.to_le_bytes());
        msix_body.extend_from_slice(&MSIX_PBA_BIR.to_le_bytes());
        let msix_cap = config.add_capability(MSIX_CAP_ID, &msix_body)?;
        let msix_cap_reg = msix_cap / 4;
        // Message control is the upper half of the capability's first
        // register; only enable (bit 15) and function mask (bit 14) are
        // writable.
        config.set_writable_mask(msix_cap_reg, 0xc000_0000);

        let mut kicks = Vec::with_capacity(sizes.len());
        for _ in 0..sizes.len() {
            kicks.push(EventFd::new(libc::EFD_NONBLOCK).map_err(VirtioPciError::EventFd)?);
        }
        let msix = Arc::new(Mutex::new(MsixState::new(sinks)));
        let interrupt = Arc::new(TransportInterrupt {
            msix: msix.clone(),
            queue_vectors: sizes
                .iter()
                .map(|_| AtomicU16::new(VIRTIO_MSI_NO_VECTOR))
                .collect(),
            config_vector: AtomicU16::new(VIRTIO_MSI_NO_VECTOR),
            isr: AtomicU8::new(0),
            needs_reset: AtomicBool::new(false),
        });
        // No DMA until the driver sets bus mastering.
        dma.set_bus_master(config.bus_master_enabled());
        Ok(Self {
            config,
            common: CommonConfig::new(features, &sizes, vector_count),
            device,
            interrupt,
            msix,
            msix_cap_reg,
            kicks,
            ioevent_sink,
            ioevents: Vec::new(),
            dma,
            active: false,
            unplugged: false,
        })
    }

    /// Replaces the DMA space (e.g. once a vIOMMU endpoint exists for this
    /// device's BDF). Takes effect at the next activation.
    pub fn set_dma_space(&mut self, dma: DmaSpace) {
        dma.set_bus_master(self.config.bus_master_enabled());
        self.dma = dma;
    }

    fn sync_vectors(&self) {
        for (slot, q) in self
            .interrupt
            .queue_vectors
            .iter()
            .zip(self.common.queues())
        {
            slot.store(q.msix_vector, Ordering::Release);
        }
        self.interrupt
            .config_vector
            .store(self.common.msix_config(), Ordering::Release);
    }

    fn bar_addr(&self) -> Option<u64> {
        self.config
            .bar(VIRTIO_BAR)
            .map(|b| b.addr)
            .filter(|a| *a != 0)
    }

    fn register_ioevents(&mut self, queues: &[usize]) {
        let Some(base) = self.bar_addr() else {
            return;
        };
        for &q in queues {
            let addr = base + NOTIFY_OFFSET + q as u64 * u64::from(NOTIFY_OFF_MULTIPLIER);
            let Some(kick) = self.kicks.get(q) else {
                continue;
            };
            match self.ioevent_sink.register(kick, addr) {
                Ok(()) => self.ioevents.push((addr, q)),
                // Kicks still work through the MMIO exit path.
                Err(e) => warn!("ioeventfd for queue {q} at {addr:#x}: {e}"),
            }
        }
    }

    fn unregister_ioevents(&mut self) {
        for (addr, q) in std::mem::take(&mut self.ioevents) {
            if let Some(kick) = self.kicks.get(q) {
                if let Err(e) = self.ioevent_sink.unregister(kick, addr) {
                    debug!("removing ioeventfd at {addr:#x}: {e}");
                }
            }
        }
    }

    fn build_queue(&self, index: usize, event_idx: bool) -> Result<Queue, QueueSetupError> {
        let regs = self
            .common
            .queues()
            .get(index)
            .ok_or(QueueSetupError::NoQueue(index))?;
        let mut q = Queue::new(regs.max_size)?;
        q.try_set_size(regs.size)?;
        q.try_set_desc_table_address(GuestAddress(regs.desc))?;
        q.try_set_avail_ring_address(GuestAddress(regs.driver))?;
        q.try_set_used_ring_address(GuestAddress(regs.device))?;
        q.set_event_idx(event_idx);
        q.set_ready(true);
        if !q.is_valid(&self.dma) {
            return Err(QueueSetupError::Unreachable {
                index,
                desc: regs.desc,
                avail: regs.driver,
                used: regs.device,
                size: regs.size,
            });
        }
        Ok(q)
    }

    fn activate(&mut self) {
        if self.unplugged {
            warn!("virtio device not started: it was unplugged");
            return;
        }
        let features = self.common.driver_features();
        let event_idx = features & feature(VIRTIO_RING_F_EVENT_IDX) != 0;
        let ready: Vec<usize> = self
            .common
            .queues()
            .iter()
            .enumerate()
            .filter(|(_, q)| q.ready)
            .map(|(i, _)| i)
            .collect();
        let mut queues = Vec::with_capacity(ready.len());
        for &i in &ready {
            let queue = match self.build_queue(i, event_idx) {
                Ok(q) => q,
                Err(e) => {
                    warn!("virtio device not started: {e}");
                    self.interrupt.set_needs_reset();
                    return;
                }
            };
            let kick = match self.kicks.get(i).map(EventFd::try_clone) {
                Some(Ok(k)) => k,
                _ => {
                    warn!("virtio device not started: cannot share queue {i}'s eventfd");
                    self.interrupt.set_needs_reset();
                    return;
                }
            };
            // Below the queue count, which fits u16 (checked in `new`).
            let Ok(index) = u16::try_from(i) else {
                warn!("virtio device not started: queue {i} has no 16-bit index");
                self.interrupt.set_needs_reset();
                return;
            };
            queues.push(ActiveQueue { index, queue, kick });
        }
        let ctx = ActivateContext {
            mem: self.dma.clone(),
            interrupt: self.interrupt.clone(),
            queues,
            features,
        };
        match self.device.activate(ctx) {
            Ok(()) => {
                self.active = true;
                // Only the started device knows which queues it serves
                // inline; the others get an ioeventfd (a kick before it is
                // registered takes the MMIO exit path to the same eventfd).
                let kicked_by_fd: Vec<usize> = ready
                    .iter()
                    .copied()
                    .filter(|&i| u16::try_from(i).is_ok_and(|q| !self.device.serves_inline(q)))
                    .collect();
                self.register_ioevents(&kicked_by_fd);
                info!(
                    "virtio device type {} started: features {features:#x}, {} queue(s){}",
                    self.device.device_type(),
                    ready.len(),
                    if self.dma.is_translated() {
                        ", DMA translated"
                    } else {
                        ""
                    }
                );
            }
            Err(e) => {
                warn!("virtio device not started: {e}");
                self.interrupt.set_needs_reset();
            }
        }
    }

    fn reset(&mut self) {
        if self.active {
            self.device.reset();
            self.active = false;
        }
        self.unregister_ioevents();
        // Kicks from before the reset must not reach the next activation.
        for k in &self.kicks {
            let _ = k.read();
        }
        self.interrupt.needs_reset.store(false, Ordering::SeqCst);
        self.interrupt.isr.store(0, Ordering::SeqCst);
        self.msix.lock().unpoisoned().clear_pending();
        self.sync_vectors();
    }

    fn handle_action(&mut self, action: CommonCfgAction) {
        match action {
            CommonCfgAction::None => {}
            CommonCfgAction::VectorsChanged => self.sync_vectors(),
            CommonCfgAction::Reset => self.reset(),
            CommonCfgAction::Activate => {
                self.sync_vectors();
                self.activate();
            }
        }
    }

    fn msix_table_len(&self) -> u64 {
        (self.common.queues().len() as u64 + 1) * MSIX_ENTRY_SIZE
    }
}

impl PciDevice for VirtioPciDevice {
    fn config(&self) -> &PciConfiguration {
        &self.config
    }

    /// The device's reset path (the one the driver's status write takes):
    /// its queues' consumers stop and are joined before this returns.
    fn stop(&mut self) {
        if self.active {
            self.device.reset();
            self.active = false;
        }
        self.unregister_ioevents();
    }

    fn config_mut(&mut self) -> &mut PciConfiguration {
        &mut self.config
    }

    /// Hot-unplug: the device stops here, before its slot and BAR ranges
    /// can go to another function: its threads are joined (no DMA after
    /// this returns) and its notify ioeventfds leave KVM (they sit at BAR
    /// addresses the next function may be given).
    fn unplugged(&mut self) {
        self.reset();
        self.unplugged = true;
    }

    fn write_config_register(
        &mut self,
        reg: usize,
        offset: u64,
        data: &[u8],
    ) -> Option<BarReprogram> {
        let moved = self.config.write_reg(reg, offset, data);
        // The command register gates the device's DMA (a running worker's
        // space is a clone sharing the gate). Workers leave their queues
        // alone while it is closed; when it opens again, every queue is
        // kicked so that what the driver queued meanwhile is served.
        let was_master = self.dma.bus_master();
        self.dma.set_bus_master(self.config.bus_master_enabled());
        if self.active && was_master != self.dma.bus_master() {
            self.device.bus_master_changed(self.dma.bus_master());
        }
        if self.active && !was_master && self.dma.bus_master() {
            for (i, k) in (0..=u16::MAX).zip(self.kicks.iter()) {
                if self.device.serves_inline(i) {
                    self.device.serve_queue(i);
                } else if let Err(e) = k.write(1) {
                    warn!("virtio: cannot kick a queue after bus mastering was enabled: {e}");
                }
            }
        }
        if reg == self.msix_cap_reg {
            let control = (self.config.read_reg(reg) >> 16) as u16;
            self.msix.lock().unpoisoned().set_control(control);
        }
        // A BAR move waits for the root to accept it (`bars_moved`).
        moved
    }

    /// The notify addresses' ioeventfds (KVM's, outside the bus) follow
    /// the BAR once the root accepted its move, or come back with it when
    /// the move was refused. Never refuses: a kick whose ioeventfd could
    /// not be registered still arrives through the MMIO exit.
    fn bars_moved(&mut self) -> Result<(), BarPlaceError> {
        let base = self.bar_addr();
        let stale = self.ioevents.iter().any(|(addr, q)| {
            base.map(|b| b + NOTIFY_OFFSET + *q as u64 * u64::from(NOTIFY_OFF_MULTIPLIER))
                != Some(*addr)
        });
        if stale {
            let queues: Vec<usize> = self.ioevents.iter().map(|(_, q)| *q).collect();
            self.unregister_ioevents();
            self.register_ioevents(&queues);
        }
        Ok(())
    }

    fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if bar != VIRTIO_BAR {
            return;
        }
        let len = data.len() as u64;
        let within = |start: u64, size: u64| offset >= start && offset + len <= start + size;
        if within(COMMON_CFG_OFFSET, COMMON_CFG_SIZE) {
            let needs_reset = self.interrupt.needs_reset.load(Ordering::SeqCst);
            self.common
                .read(offset - COMMON_CFG_OFFSET, data, needs_reset);
        } else if within(ISR_OFFSET, 1) {
            if let Some(b) = data.first_mut() {
                *b = self.interrupt.isr.swap(0, Ordering::SeqCst);
            }
        } else if within(DEVICE_CFG_OFFSET, DEVICE_CFG_SIZE) {
            self.device.read_config(offset - DEVICE_CFG_OFFSET, data);
        } else if within(MSIX_TABLE_OFFSET, self.msix_table_len()) {
            self.msix
                .lock()
                .unpoisoned()
                .read_table(offset - MSIX_TABLE_OFFSET, data);
        } else if within(MSIX_PBA_OFFSET, 0x100) {
            self.msix
                .lock()
                .unpoisoned()
                .read_pba(offset - MSIX_PBA_OFFSET, data);
        }
    }

    fn write_bar(&mut self, bar: usize, offset: u64, data: &[u8]) {
        if bar != VIRTIO_BAR {
            return;
        }
        let len = data.len() as u64;
        let within = |start: u64, size: u64| offset >= start && offset + len <= start + size;
        if within(COMMON_CFG_OFFSET, COMMON_CFG_SIZE) {
            let action = self.common.write(offset - COMMON_CFG_OFFSET, data);
            self.handle_action(action);
        } else if within(DEVICE_CFG_OFFSET, DEVICE_CFG_SIZE) {
            self.device.write_config(offset - DEVICE_CFG_OFFSET, data);
        } else if within(NOTIFY_OFFSET, NOTIFY_SIZE) {
            // Within NOTIFY_SIZE: a 16-bit queue index.
            let q = u16::try_from((offset - NOTIFY_OFFSET) / u64::from(NOTIFY_OFF_MULTIPLIER));
            if let Ok(q) = q {
                if self.active && self.device.serves_inline(q) {
                    self.device.serve_queue(q);
                } else if let Some(k) = self.kicks.get(usize::from(q)) {
                    let _ = k.write(1);
                }
            }
        } else if within(MSIX_TABLE_OFFSET, self.msix_table_len()) {
            self.msix
                .lock()
                .unpoisoned()
                .write_table(offset - MSIX_TABLE_OFFSET, data);
        }
    }
}

impl Drop for VirtioPciDevice {
    fn drop(&mut self) {
        if self.active {
            self.device.reset();
        }
        self.unregister_ioevents();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::GuestMemoryMmap;
    use crate::pci::config::BAR0_REG;
    use crate::virtio::status::{ACKNOWLEDGE, DRIVER, DRIVER_OK, FEATURES_OK};
    use crate::virtio::ActivateError;
    use std::sync::atomic::AtomicUsize;

    /// Records the notify addresses registered and unregistered.
    #[derive(Default)]
    struct Recorder(Mutex<Vec<(bool, u64)>>);

    impl IoEvents for Recorder {
        fn register(&self, _fd: &EventFd, addr: u64) -> Result<(), kvm_ioctls::Error> {
            self.0.lock().unwrap().push((true, addr));
            Ok(())
        }
        fn unregister(&self, _fd: &EventFd, addr: u64) -> Result<(), kvm_ioctls::Error> {
            self.0.lock().unwrap().push((false, addr));
            Ok(())
        }
    }

    struct NoMsi;
    impl MsiSink for NoMsi {
        fn route(&mut self, _msg: crate::interrupt::MsiMessage) -> Result<(), InterruptError> {
            Ok(())
        }
        fn trigger(&self) {}
    }

    /// Two queues; queue 0 is served inline once started.
    #[derive(Default)]
    struct Fake {
        started: bool,
        served: Arc<AtomicUsize>,
    }

    impl VirtioDevice for Fake {
        fn device_type(&self) -> u32 {
            1
        }
        fn queue_max_sizes(&self) -> Vec<u16> {
            vec![16, 16]
        }
        fn features(&self) -> u64 {
            0
        }
        fn read_config(&self, _offset: u64, _data: &mut [u8]) {}
        fn activate(&mut self, _ctx: ActivateContext) -> Result<(), ActivateError> {
            self.started = true;
            Ok(())
        }
        fn reset(&mut self) {
            self.started = false;
        }
        fn serves_inline(&self, index: u16) -> bool {
            self.started && index == 0
        }
        fn serve_queue(&mut self, index: u16) {
            assert_eq!(index, 0);
            self.served.fetch_add(1, Ordering::SeqCst);
        }
    }

    const BAR: u64 = 0x1_0000_0000;

    fn common(dev: &mut VirtioPciDevice, offset: u64, data: &[u8]) {
        dev.write_bar(VIRTIO_BAR, COMMON_CFG_OFFSET + offset, data);
    }

    /// A device at `BAR` with memory space and bus mastering on, VERSION_1
    /// negotiated and FEATURES_OK set: where both tests below start. Also
    /// its ioeventfd recorder and the count of queues it served inline.
    fn negotiated_device() -> (VirtioPciDevice, Arc<Recorder>, Arc<AtomicUsize>) {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        let served = Arc::new(AtomicUsize::new(0));
        let rec = Arc::new(Recorder::default());
        let fake = Fake {
            started: false,
            served: served.clone(),
        };
        let sinks: Vec<Box<dyn MsiSink>> = (0..3).map(|_| Box::new(NoMsi) as _).collect();
        let mut dev = VirtioPciDevice::with_sinks(
            Box::new(fake),
            rec.clone(),
            sinks,
            DmaSpace::identity(mem),
            false,
        )
        .unwrap();
        dev.config_mut().set_bar_address(VIRTIO_BAR, BAR);
        // Memory space and bus mastering on.
        dev.write_config_register(1, 0, &[0x6, 0]);
        common(&mut dev, 0x14, &[ACKNOWLEDGE | DRIVER]);
        common(&mut dev, 0x08, &1u32.to_le_bytes());
        common(&mut dev, 0x0c, &1u32.to_le_bytes()); // VERSION_1
        common(&mut dev, 0x14, &[ACKNOWLEDGE | DRIVER | FEATURES_OK]);
        (dev, rec, served)
    }

    /// Hot-unplug stops the device before its slot can be reused: the
    /// device is reset (its workers joined), its ioeventfds leave KVM, and
    /// a guest access still in flight cannot start it again.
    #[test]
    fn an_unplugged_device_is_stopped_and_never_started_again() {
        let (mut dev, rec, _served) = negotiated_device();
        common(&mut dev, 0x16, &1u16.to_le_bytes());
        common(&mut dev, 0x20, &0x4000u64.to_le_bytes());
        common(&mut dev, 0x28, &0x5000u64.to_le_bytes());
        common(&mut dev, 0x30, &0x6000u64.to_le_bytes());
        common(&mut dev, 0x1c, &1u16.to_le_bytes());
        let ok = [ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK];
        common(&mut dev, 0x14, &ok);
        assert!(dev.active);
        let notify = BAR + NOTIFY_OFFSET + u64::from(NOTIFY_OFF_MULTIPLIER);
        assert_eq!(*rec.0.lock().unwrap(), vec![(true, notify)]);
        dev.unplugged();
        assert!(!dev.active, "the device was not reset");
        assert_eq!(
            *rec.0.lock().unwrap(),
            vec![(true, notify), (false, notify)],
            "the ioeventfd stayed in KVM"
        );
        // The guest resets and starts it again through an access that was
        // already on its way: refused.
        common(&mut dev, 0x14, &[0]);
        common(&mut dev, 0x14, &[ACKNOWLEDGE | DRIVER]);
        common(&mut dev, 0x08, &1u32.to_le_bytes());
        common(&mut dev, 0x0c, &1u32.to_le_bytes()); // VERSION_1
        common(&mut dev, 0x14, &[ACKNOWLEDGE | DRIVER | FEATURES_OK]);
        common(&mut dev, 0x1c, &1u16.to_le_bytes());
        common(&mut dev, 0x14, &ok);
        assert!(!dev.active, "an unplugged device started");
        assert_eq!(rec.0.lock().unwrap().len(), 2);
    }

    /// A queue served inline by the device gets no ioeventfd (a kick must
    /// exit to the vCPU, which serves it before re-entering the guest);
    /// the other queue keeps its ioeventfd; after a reset nothing is
    /// registered and a kick is not served.
    #[test]
    fn inline_queues_get_no_ioeventfd_and_are_served_on_notify() {
        let (mut dev, rec, served) = negotiated_device();
        for (q, base) in [(0u16, 0x1000u64), (1, 0x4000)] {
            common(&mut dev, 0x16, &q.to_le_bytes());
            common(&mut dev, 0x20, &base.to_le_bytes());
            common(&mut dev, 0x28, &(base + 0x1000).to_le_bytes());
            common(&mut dev, 0x30, &(base + 0x2000).to_le_bytes());
            common(&mut dev, 0x1c, &1u16.to_le_bytes());
        }
        common(
            &mut dev,
            0x14,
            &[ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK],
        );
        let notify = |q: u64| BAR + NOTIFY_OFFSET + q * u64::from(NOTIFY_OFF_MULTIPLIER);
        assert_eq!(*rec.0.lock().unwrap(), vec![(true, notify(1))]);

        dev.write_bar(VIRTIO_BAR, NOTIFY_OFFSET, &0u16.to_le_bytes());
        assert_eq!(
            served.load(Ordering::SeqCst),
            1,
            "served before the write returned"
        );
        // Queue 1's kick goes to its eventfd, not to serve_queue.
        dev.write_bar(
            VIRTIO_BAR,
            NOTIFY_OFFSET + u64::from(NOTIFY_OFF_MULTIPLIER),
            &1u16.to_le_bytes(),
        );
        assert_eq!(served.load(Ordering::SeqCst), 1);
        assert_eq!(dev.kicks[1].read().unwrap(), 1);

        common(&mut dev, 0x14, &[0]);
        assert_eq!(
            *rec.0.lock().unwrap(),
            vec![(true, notify(1)), (false, notify(1))]
        );
        dev.write_bar(VIRTIO_BAR, NOTIFY_OFFSET, &0u16.to_le_bytes());
        assert_eq!(served.load(Ordering::SeqCst), 1, "no service after reset");
    }

    /// Issue 28: the notify ioeventfds move with the BAR only once the
    /// root accepted the move (`bars_moved`), not when the guest wrote
    /// the register: a refused move must not leave them at the new
    /// address, over another device's range.
    #[test]
    fn notify_ioeventfds_follow_only_accepted_bar_moves() {
        let (mut dev, rec, _) = negotiated_device();
        common(&mut dev, 0x16, &1u16.to_le_bytes());
        common(&mut dev, 0x20, &0x4000u64.to_le_bytes());
        common(&mut dev, 0x28, &0x5000u64.to_le_bytes());
        common(&mut dev, 0x30, &0x6000u64.to_le_bytes());
        common(&mut dev, 0x1c, &1u16.to_le_bytes());
        common(
            &mut dev,
            0x14,
            &[ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK],
        );
        let notify = |bar: u64| bar + NOTIFY_OFFSET + u64::from(NOTIFY_OFF_MULTIPLIER);
        assert_eq!(*rec.0.lock().unwrap(), vec![(true, notify(BAR))]);
        let reg = BAR0_REG + VIRTIO_BAR;
        let moved = dev.write_config_register(reg + 1, 0, &2u32.to_le_bytes());
        assert!(moved.is_some());
        assert_eq!(rec.0.lock().unwrap().len(), 1, "moved before accepted");
        // Refused: the root puts the configuration back.
        dev.config_mut().set_bar_address(VIRTIO_BAR, BAR);
        dev.bars_moved().unwrap();
        assert_eq!(rec.0.lock().unwrap().len(), 1);
        // Accepted.
        dev.write_config_register(reg + 1, 0, &2u32.to_le_bytes());
        dev.bars_moved().unwrap();
        let to = BAR + 0x1_0000_0000;
        assert_eq!(
            *rec.0.lock().unwrap(),
            vec![
                (true, notify(BAR)),
                (false, notify(BAR)),
                (true, notify(to))
            ]
        );
    }
}
