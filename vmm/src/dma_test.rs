//! A PCI DMA test device, register-compatible with QEMU's `edu` device
//! (vendor 0x1234, device 0x11e8), with 64-bit DMA addresses and explicit
//! fault reporting.
//!
//! Why: to show that the vIOMMU protects guest memory we need a device
//! whose DMA the guest can aim at any I/O virtual address and whose result
//! is observable. Reusing edu's register layout means guest helpers written
//! for QEMU's edu (e.g. `guest-driver/vvi_edu.c`) drive it unchanged, and the
//! same guest test runs against QEMU and dmavisor.
//!
//! BAR0 (1 MiB, 32-bit MMIO), little endian; 4- or 8-byte accesses (other
//! sizes are served from the same 64-bit register value):
//!
//! | off  | edu meaning                                   | here          |
//! |------|-----------------------------------------------|---------------|
//! | 0x00 | RO identification 0x010000ed                  | same          |
//! | 0x04 | RW liveness: reads back the inverse           | same          |
//! | 0x08 | RW factorial: write n, read n! (wrapping u32) | computed at once, in at most 33 steps |
//! | 0x20 | RW status: 0x01 computing (RO), 0x80 irq on factorial done | same |
//! | 0x24 | RO interrupt status                           | same          |
//! | 0x60 | WO interrupt raise (ORed into 0x24)           | same          |
//! | 0x64 | WO interrupt acknowledge (clears bits of 0x24)| same          |
//! | 0x80 | RW DMA source address                         | 64-bit        |
//! | 0x88 | RW DMA destination address                    | 64-bit        |
//! | 0x90 | RW DMA count                                  | at most 4096  |
//! | 0x98 | RW DMA command: 0x1 run, 0x2 edu->RAM, 0x4 irq 0x100 when done | bit 0 cleared when done; 0x8 streams (below) |
//!
//! Registers of our own (read-only):
//!
//! | off  | meaning |
//! |------|---------|
//! | 0xa0 | DMA error of the last command, see [`DmaError`] codes (0 = ok) |
//! | 0xa8 | bytes moved by successful DMA commands since reset (64-bit) |
//! | 0xb0 | number of DMA commands refused by the IOMMU since reset |
//! | 0xb8 | the I/O virtual address of the last refused command |
//! | 0xc0 | passes completed by the current or the last stream |
//!
//! Streaming (command bit 0x8, ours): the transfer is repeated on a thread
//! of the device, each pass translating and copying again, until the guest
//! clears the run bit (the bit reads as set until the stream has stopped)
//! or a pass fails (the error register then says why). It lets a guest
//! unmap a buffer while DMA into it is in flight, which is how the
//! project's race test checks that a completed UNMAP is never followed by
//! a write through the old mapping.
//!
//! The device buffer lives at device addresses 0x40000..0x41000 (as in
//! edu): for RAM->device the destination must lie there, for device->RAM
//! the source. The other address is an I/O virtual address that goes
//! through the device's [`DmaSpace`]: identity without a vIOMMU, translated
//! by its endpoint with `iommu=on`.
//!
//! A DMA is all-or-nothing: the whole guest range is translated first and
//! only then copied, so a refused access leaves guest memory unchanged. The
//! vIOMMU queues a fault event for the refusal (see `dma::iommu`). A
//! single transfer runs synchronously inside the MMIO write of the
//! command, so the guest sees the run bit already cleared on its next read.
//!
//! Interrupts: the interrupt status register works as in edu, but no
//! interrupt is delivered (no MSI capability); guests poll the command
//! register, which is what the project's helpers do.

use std::sync::{Arc, Mutex};

use log::debug;

use virtio_iommu::locks::Unpoison;

use crate::devices::dma_copy::copy_guest;
pub use crate::devices::dma_copy::DmaError;
use crate::devices::dma_stream::{DmaStreamer, StreamJob};
use crate::dma::{DmaSpace, ThreadDma};
use crate::error::Error;
use crate::memory::GuestMemoryMmap;
use crate::options::parse_on_off;
use crate::options::parse_options;
use crate::pci::{
    BarKind, BarReprogram, PciAddress, PciConfiguration, PciDevice, PciHeader, PciRoot,
};
use crate::virtio::iommu::IommuPlatform;
use crate::width::usize_from_u64;

/// PCI vendor id of QEMU's edu device.
pub const EDU_VENDOR_ID: u16 = 0x1234;
/// PCI device id of QEMU's edu device.
pub const EDU_DEVICE_ID: u16 = 0x11e8;
/// Size of BAR0 (as in edu).
pub const BAR0_SIZE: u64 = 1 << 20;
/// Device address of the DMA buffer.
pub const DMA_BUF_ADDR: u64 = 0x40000;
/// Size of the DMA buffer.
pub const DMA_BUF_SIZE: usize = 4096;

/// Register offsets in BAR0.
pub mod reg {
    /// Identification.
    pub const ID: u64 = 0x00;
    /// Liveness check.
    pub const LIVENESS: u64 = 0x04;
    /// Factorial.
    pub const FACTORIAL: u64 = 0x08;
    /// Status.
    pub const STATUS: u64 = 0x20;
    /// Interrupt status.
    pub const IRQ_STATUS: u64 = 0x24;
    /// Interrupt raise.
    pub const IRQ_RAISE: u64 = 0x60;
    /// Interrupt acknowledge.
    pub const IRQ_ACK: u64 = 0x64;
    /// DMA source.
    pub const DMA_SRC: u64 = 0x80;
    /// DMA destination.
    pub const DMA_DST: u64 = 0x88;
    /// DMA count.
    pub const DMA_CNT: u64 = 0x90;
    /// DMA command.
    pub const DMA_CMD: u64 = 0x98;
    /// Error code of the last DMA command (ours).
    pub const DMA_ERROR: u64 = 0xa0;
    /// Bytes moved (ours).
    pub const DMA_BYTES: u64 = 0xa8;
    /// DMA commands refused by the IOMMU (ours).
    pub const DMA_FAULTS: u64 = 0xb0;
    /// I/O virtual address of the last refused command (ours).
    pub const DMA_FAULT_ADDR: u64 = 0xb8;
    /// Passes completed by the current or the last stream (ours).
    pub const STREAM_PASSES: u64 = 0xc0;
}

/// Identification value: edu version 1.0.
pub const ID_VALUE: u32 = 0x0100_00ed;
/// DMA command bit: start.
pub const CMD_RUN: u64 = 1;
/// DMA command bit: device buffer -> RAM (else RAM -> device buffer).
pub const CMD_TO_RAM: u64 = 2;
/// DMA command bit: raise interrupt 0x100 when done.
pub const CMD_IRQ: u64 = 4;
/// DMA command bit (ours): repeat the transfer until the guest clears the
/// run bit or a pass fails, on a thread of the device (streaming mode).
pub const CMD_STREAM: u64 = 8;
/// Status bit: factorial being computed (never visible: computed at once).
const STATUS_COMPUTING: u32 = 0x01;
/// Status bit: raise interrupt 0x1 when the factorial is done.
const STATUS_IRQ_FACT: u32 = 0x80;
/// Interrupt status bit for a finished factorial.
const IRQ_FACT: u32 = 0x1;
/// Interrupt status bit for a finished DMA.
const IRQ_DMA: u32 = 0x100;

/// `--dma-test iommu=on|off` (the flag may be repeated); in the API's
/// `VmConfig` (dmavisor's addition) an entry of `dma_test`, `{"iommu": true}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DmaTestConfig {
    /// Behind the vIOMMU (needs `--iommu`).
    #[serde(default)]
    pub iommu: bool,
}

impl DmaTestConfig {
    /// Parses `--dma-test`; an empty value means `iommu=off`.
    pub fn parse(value: &str) -> Result<Self, Error> {
        let opts = parse_options("dma-test", value, &["iommu"])?;
        let iommu = match opts.get("iommu") {
            Some(v) => parse_on_off("dma-test", value, "iommu", v)?,
            None => false,
        };
        Ok(Self { iommu })
    }
}

/// Why a `--dma-test` could not be added.
#[derive(Debug, thiserror::Error)]
pub enum DmaTestSetupError {
    /// Bus 0 has no room for it.
    #[error("dma-test: {0}")]
    Pci(#[source] crate::pci::PciError),
}

impl From<DmaTestSetupError> for Error {
    fn from(e: DmaTestSetupError) -> Self {
        Self::device(e)
    }
}

/// Plugs a DMA test device into `pci`; with `iommu=on` its DMA goes
/// through `iommu` (an error if there is none).
pub fn add_dma_test(
    cfg: &DmaTestConfig,
    pci: &PciRoot,
    mem: &GuestMemoryMmap,
    iommu: Option<&mut IommuPlatform>,
) -> Result<PciAddress, Error> {
    let dev = Arc::new(Mutex::new(DmaTestDevice::new()));
    let addr = pci
        .add_device(dev.clone())
        .map_err(DmaTestSetupError::Pci)?;
    let dma = match (cfg.iommu, iommu) {
        (true, Some(p)) => p.add_endpoint(addr)?,
        (true, None) => {
            return Err(Error::InvalidOption {
                option: "dma-test",
                value: "iommu=on".into(),
                reason: "needs --iommu".into(),
            })
        }
        (false, _) => DmaSpace::identity(mem.clone()),
    };
    dev.lock().unpoisoned().set_dma(dma);
    log::info!(
        "dma-test device at {addr}{}",
        if cfg.iommu { " behind the vIOMMU" } else { "" }
    );
    Ok(addr)
}

/// The DMA test device.
pub struct DmaTestDevice {
    config: PciConfiguration,
    /// The device's DMA space, for the bus-master bit and the stream
    /// thread's own handle.
    dma: Option<DmaSpace>,
    /// The device's way to guest memory for single commands. One per
    /// device: the device's lock serialises its DMAs, so sections never
    /// overlap. `None` past the vIOMMU's reader limit: the device then
    /// refuses every command as with bus mastering off.
    access: Option<ThreadDma>,
    /// The stream thread, started at the first streaming command.
    streamer: Option<DmaStreamer>,
    buffer: Box<[u8; DMA_BUF_SIZE]>,
    liveness: u32,
    factorial: u32,
    status: u32,
    irq_status: u32,
    src: u64,
    dst: u64,
    count: u64,
    cmd: u64,
    error: DmaError,
    bytes: u64,
    faults: u64,
    fault_addr: u64,
}

impl Default for DmaTestDevice {
    fn default() -> Self {
        Self::new()
    }
}

/// From this factor on, the wrapping product is 0 for good: 34! holds the
/// factor 2 thirty-two times (17 + 8 + 4 + 2 + 1), and so does every
/// larger factorial.
const FACTORIAL_ZERO_FROM: u32 = 34;

/// `n!` in wrapping `u32` arithmetic, as edu computes it.
///
/// WHY bounded: the guest writes `n` and this runs in its MMIO write, on
/// the vCPU thread under the device lock. Multiplying `n` times would let
/// one write cost up to 4e9 steps; since the product is 0 from
/// [`FACTORIAL_ZERO_FROM`] on, at most 33 multiplications give the same
/// value.
fn factorial(n: u32) -> u32 {
    if n >= FACTORIAL_ZERO_FROM {
        return 0;
    }
    (1..=n).fold(1u32, |acc, k| acc.wrapping_mul(k))
}

impl DmaTestDevice {
    /// A device with no DMA space yet (every DMA fails with `NotRam` until
    /// [`set_dma`](Self::set_dma) is called, because its endpoint id is only
    /// known once it is plugged into the bus).
    pub fn new() -> Self {
        let mut config = PciConfiguration::new(PciHeader {
            vendor_id: EDU_VENDOR_ID,
            device_id: EDU_DEVICE_ID,
            class: 0x00,
            subclass: 0xff,
            prog_if: 0,
            revision: 0x10,
            subsystem_vendor_id: 0x1af4,
            subsystem_id: 0x1100,
            interrupt_pin: 0,
        });
        // A 1 MiB power-of-two BAR in a fresh config space cannot fail.
        if let Err(e) = config.add_bar(0, BAR0_SIZE, BarKind::Mem32) {
            log::error!("dma-test: BAR0: {e}");
        }
        Self {
            config,
            dma: None,
            access: None,
            streamer: None,
            buffer: Box::new([0; DMA_BUF_SIZE]),
            liveness: 0,
            factorial: 1,
            status: 0,
            irq_status: 0,
            src: 0,
            dst: 0,
            count: 0,
            cmd: 0,
            error: DmaError::None,
            bytes: 0,
            faults: 0,
            fault_addr: 0,
        }
    }

    /// Gives the device its DMA address space.
    pub fn set_dma(&mut self, dma: DmaSpace) {
        dma.set_bus_master(self.config.bus_master_enabled());
        // A failure is logged by the space, which refuses every access.
        self.access = ThreadDma::new(dma.clone()).ok();
        self.dma = Some(dma);
    }

    /// Bytes moved by successful commands.
    pub fn bytes_moved(&self) -> u64 {
        self.bytes
    }

    fn read_reg(&self, offset: u64) -> u64 {
        match offset {
            reg::ID => u64::from(ID_VALUE),
            reg::LIVENESS => u64::from(!self.liveness),
            reg::FACTORIAL => u64::from(self.factorial),
            reg::STATUS => u64::from(self.status),
            reg::IRQ_STATUS => u64::from(self.irq_status),
            reg::DMA_SRC => self.src,
            reg::DMA_DST => self.dst,
            reg::DMA_CNT => self.count,
            reg::DMA_CMD => self.cmd,
            reg::DMA_ERROR => self.error as u64,
            reg::DMA_BYTES => self.bytes,
            reg::DMA_FAULTS => self.faults,
            reg::DMA_FAULT_ADDR => self.fault_addr,
            reg::STREAM_PASSES => self.stream_passes(),
            _ => u64::MAX,
        }
    }

    fn write_reg(&mut self, offset: u64, value: u64) {
        // The 32-bit registers take the access's low half.
        let v32 = (value & 0xffff_ffff) as u32;
        match offset {
            reg::LIVENESS => self.liveness = v32,
            reg::FACTORIAL => {
                self.factorial = factorial(v32);
                self.status &= !STATUS_COMPUTING;
                if self.status & STATUS_IRQ_FACT != 0 {
                    self.irq_status |= IRQ_FACT;
                }
            }
            reg::STATUS => {
                self.status = (self.status & STATUS_COMPUTING) | (v32 & STATUS_IRQ_FACT);
            }
            reg::IRQ_RAISE => self.irq_status |= v32,
            reg::IRQ_ACK => self.irq_status &= !v32,
            reg::DMA_SRC => self.src = value,
            reg::DMA_DST => self.dst = value,
            reg::DMA_CNT => self.count = value,
            reg::DMA_CMD => self.write_command(value),
            _ => debug!("dma-test: write to unknown register {offset:#x} ignored"),
        }
    }

    /// Offset of `[addr, addr + count)` inside the device buffer, if it
    /// lies there entirely.
    fn buffer_offset(addr: u64, count: usize) -> Option<usize> {
        let off = usize::try_from(addr.checked_sub(DMA_BUF_ADDR)?).ok()?;
        (off.checked_add(count)? <= DMA_BUF_SIZE).then_some(off)
    }

    /// A stream was started and its end not yet folded into the registers:
    /// outside a register access the run bit stays set only then (a
    /// single transfer clears it before the MMIO write returns).
    fn streaming(&self) -> bool {
        self.cmd & CMD_RUN != 0
    }

    fn write_command(&mut self, value: u64) {
        if self.streaming() {
            // A stream is running: clearing the run bit asks it to stop
            // (the bit reads as set until it has); anything else waits.
            if value & CMD_RUN == 0 {
                if let Some(s) = &self.streamer {
                    s.stop();
                }
            } else {
                debug!("dma-test: command {value:#x} while streaming ignored");
            }
            return;
        }
        self.cmd = value;
        if value & CMD_RUN == 0 {
            return;
        }
        if value & CMD_STREAM != 0 {
            self.error = self.start_stream();
            if self.error != DmaError::None {
                self.cmd &= !CMD_RUN;
            }
        } else {
            self.run_dma();
        }
    }

    fn run_dma(&mut self) {
        self.error = self.transfer();
        self.cmd &= !CMD_RUN;
        if self.cmd & CMD_IRQ != 0 {
            self.irq_status |= IRQ_DMA;
        }
    }

    fn transfer(&mut self) -> DmaError {
        if !self.config.bus_master_enabled() {
            return DmaError::BusMasterOff;
        }
        let Some((off, count)) = self.device_range() else {
            return DmaError::BadDeviceRange;
        };
        if count == 0 {
            return DmaError::None;
        }
        let to_ram = self.cmd & CMD_TO_RAM != 0;
        let iova = self.guest_address();
        if self.dma.is_none() {
            return DmaError::NotRam;
        }
        let Some(access) = self.access.as_mut() else {
            return DmaError::BusMasterOff;
        };
        let Some(buf) = self.buffer.get_mut(off..off + count) else {
            return DmaError::BadDeviceRange;
        };
        // Translate and copy inside one section: an UNMAP that completes
        // meanwhile waits until the copy is done.
        let copied = copy_guest(&access.access(), buf, iova, to_ram);
        // The vCPU goes back to the guest (or serves an UNMAP itself):
        // a sticky slot must not hold the next sync meanwhile.
        access.park();
        match copied {
            DmaError::None => {
                self.bytes = self.bytes.saturating_add(count as u64);
                DmaError::None
            }
            e => {
                self.note_error(e, iova);
                e
            }
        }
    }

    /// The device-buffer side of the command: (offset in the buffer,
    /// count), if the range lies inside the buffer.
    fn device_range(&self) -> Option<(usize, usize)> {
        let count = usize::try_from(self.count).ok()?;
        let dev_addr = if self.cmd & CMD_TO_RAM != 0 {
            self.src
        } else {
            self.dst
        };
        Some((Self::buffer_offset(dev_addr, count)?, count))
    }

    /// The guest side of the command (an I/O virtual address).
    fn guest_address(&self) -> u64 {
        if self.cmd & CMD_TO_RAM != 0 {
            self.dst
        } else {
            self.src
        }
    }

    fn note_error(&mut self, e: DmaError, iova: u64) {
        if e == DmaError::IommuFault {
            self.faults = self.faults.saturating_add(1);
            self.fault_addr = iova;
        }
    }

    /// Starts streaming the command's transfer on the stream thread (see
    /// [`crate::devices::dma_stream`]); the run bit stays set until the
    /// stream ends.
    fn start_stream(&mut self) -> DmaError {
        if !self.config.bus_master_enabled() {
            return DmaError::BusMasterOff;
        }
        let Some((off, count)) = self.device_range().filter(|(_, c)| *c > 0) else {
            return DmaError::BadDeviceRange;
        };
        let Some(dma) = &self.dma else {
            return DmaError::NotRam;
        };
        if self.streamer.is_none() {
            match DmaStreamer::spawn(dma.clone()) {
                Ok(s) => self.streamer = Some(s),
                Err(e) => {
                    log::warn!("dma-test: cannot start the stream thread: {e}");
                    return DmaError::NotRam;
                }
            }
        }
        let Some(streamer) = &self.streamer else {
            return DmaError::NotRam;
        };
        let data = self
            .buffer
            .get(off..off + count)
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        streamer.start(StreamJob {
            iova: self.guest_address(),
            data,
            to_ram: self.cmd & CMD_TO_RAM != 0,
        });
        DmaError::None
    }

    /// Folds a stream that ended into the registers (run bit, error,
    /// counters). Called before every register access.
    fn poll_stream(&mut self) {
        if !self.streaming() {
            return;
        }
        let Some(outcome) = self.streamer.as_ref().and_then(DmaStreamer::outcome) else {
            return;
        };
        self.bytes = self.bytes.saturating_add(outcome.bytes);
        self.error = outcome.error;
        self.note_error(outcome.error, outcome.iova);
        self.cmd &= !CMD_RUN;
        if self.cmd & CMD_IRQ != 0 {
            self.irq_status |= IRQ_DMA;
        }
    }

    /// Passes completed by the current or the last stream.
    fn stream_passes(&self) -> u64 {
        self.streamer.as_ref().map_or(0, DmaStreamer::passes)
    }
}

impl PciDevice for DmaTestDevice {
    fn config(&self) -> &PciConfiguration {
        &self.config
    }

    /// The VM's teardown: the streaming thread, a DMA consumer, is
    /// stopped and joined (`DmaStreamer`'s drop) before memory goes.
    fn stop(&mut self) {
        self.streamer = None;
    }

    fn config_mut(&mut self) -> &mut PciConfiguration {
        &mut self.config
    }

    fn write_config_register(
        &mut self,
        reg: usize,
        offset: u64,
        data: &[u8],
    ) -> Option<BarReprogram> {
        let moved = self.config.write_reg(reg, offset, data);
        if !self.config.bus_master_enabled() {
            // No DMA without bus mastering: a running stream stops. The
            // stop is asked before the gate closes, so a pass the closed
            // gate cuts short is known to be that stop, not a fault.
            if let Some(s) = self.streamer.as_ref().filter(|_| self.streaming()) {
                s.stop();
            }
        }
        if let Some(dma) = &self.dma {
            dma.set_bus_master(self.config.bus_master_enabled());
        }
        moved
    }

    fn read_bar(&mut self, bar: usize, offset: u64, data: &mut [u8]) {
        if bar != 0 {
            data.fill(0xff);
            return;
        }
        self.poll_stream();
        // Byte by byte: reads have no side effects, and this serves every
        // access size and alignment from the registers' natural widths.
        for (i, d) in data.iter_mut().enumerate() {
            let addr = offset.saturating_add(i as u64);
            let (base, _) = register_of(addr);
            let shift = (addr - base) * 8;
            *d = ((self.read_reg(base) >> shift) & 0xff) as u8;
        }
    }

    fn write_bar(&mut self, bar: usize, offset: u64, data: &[u8]) {
        if bar != 0 || data.is_empty() || data.len() > 8 {
            return;
        }
        self.poll_stream();
        // Split the access at register boundaries; a partial write merges
        // into the register's current value (e.g. two 32-bit halves of a
        // 64-bit address).
        let mut i = 0usize;
        while let Some(rest) = data.get(i..).filter(|r| !r.is_empty()) {
            let addr = offset.saturating_add(i as u64);
            let (base, width) = register_of(addr);
            let start = usize_from_u64(addr - base);
            let n = rest.len().min(width - start);
            let mut bytes = self.read_reg(base).to_le_bytes();
            if matches!(base, reg::LIVENESS) {
                // Reads return the inverse; merge into the stored value.
                bytes = u64::from(self.liveness).to_le_bytes();
            }
            for (j, b) in rest.iter().take(n).enumerate() {
                if let Some(slot) = bytes.get_mut(start + j) {
                    *slot = *b;
                }
            }
            self.write_reg(base, u64::from_le_bytes(bytes));
            i += n;
        }
    }
}

/// The register holding byte `addr`: (its offset, its width). Registers
/// below the DMA block are 32-bit, the DMA block and ours are 64-bit.
fn register_of(addr: u64) -> (u64, usize) {
    if addr < reg::DMA_SRC {
        (addr & !3, 4)
    } else {
        (addr & !7, 8)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use vm_memory::{Bytes, GuestAddress};

    use super::*;
    use crate::dma::iommu::IommuTranslate;
    use crate::dma::test_iommu::{TestIommu, RW};
    use crate::dma::{DmaAccess, DmaFault, DmaTranslate};
    use crate::memory::GuestMemoryMmap;

    fn ram() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x100000)]).unwrap()
    }

    fn device(dma: DmaSpace) -> DmaTestDevice {
        let mut d = DmaTestDevice::new();
        d.set_dma(dma);
        // Memory space + bus master.
        d.write_config_register(1, 0, &[0x6, 0]);
        d
    }

    fn w64(d: &mut DmaTestDevice, off: u64, v: u64) {
        d.write_bar(0, off, &v.to_le_bytes());
    }

    fn r64(d: &mut DmaTestDevice, off: u64) -> u64 {
        let mut b = [0u8; 8];
        d.read_bar(0, off, &mut b);
        u64::from_le_bytes(b)
    }

    fn r32(d: &mut DmaTestDevice, off: u64) -> u32 {
        let mut b = [0u8; 4];
        d.read_bar(0, off, &mut b);
        u32::from_le_bytes(b)
    }

    fn dma(d: &mut DmaTestDevice, src: u64, dst: u64, cnt: u64, to_ram: bool) -> u64 {
        w64(d, reg::DMA_SRC, src);
        w64(d, reg::DMA_DST, dst);
        w64(d, reg::DMA_CNT, cnt);
        w64(
            d,
            reg::DMA_CMD,
            CMD_RUN | if to_ram { CMD_TO_RAM } else { 0 },
        );
        assert_eq!(
            r64(d, reg::DMA_CMD) & CMD_RUN,
            0,
            "run bit cleared when done"
        );
        r64(d, reg::DMA_ERROR)
    }

    /// The bounded factorial equals the plain wrapping product for every
    /// input up to well past the cut, and a write of `u32::MAX` returns at
    /// once (the unbounded loop took seconds).
    #[test]
    fn factorial_is_bounded_and_equals_the_wrapping_product() {
        let mut plain = 1u32;
        for n in 0..=1000u32 {
            if n > 0 {
                plain = plain.wrapping_mul(n);
            }
            assert_eq!(factorial(n), plain, "{n}!");
        }
        assert_eq!(factorial(FACTORIAL_ZERO_FROM - 1), 0x8000_0000);
        assert_eq!(factorial(FACTORIAL_ZERO_FROM), 0);
        let mut d = DmaTestDevice::new();
        let t = std::time::Instant::now();
        d.write_bar(0, reg::FACTORIAL, &u32::MAX.to_le_bytes());
        assert!(t.elapsed() < std::time::Duration::from_millis(100));
        assert_eq!(r32(&mut d, reg::FACTORIAL), 0);
    }

    #[test]
    fn config_parse() {
        assert!(!DmaTestConfig::parse("").unwrap().iommu);
        assert!(DmaTestConfig::parse("iommu=on").unwrap().iommu);
        assert!(!DmaTestConfig::parse("iommu=off").unwrap().iommu);
        assert!(DmaTestConfig::parse("iommu=1").is_err());
        assert!(DmaTestConfig::parse("size=4").is_err());
    }

    #[test]
    fn edu_identity_liveness_factorial_irq() {
        let mut d = DmaTestDevice::new();
        assert_eq!(d.config().read_reg(0), 0x11e8_1234);
        assert_eq!(r32(&mut d, reg::ID), ID_VALUE);
        d.write_bar(0, reg::LIVENESS, &0x1234_5678u32.to_le_bytes());
        assert_eq!(r32(&mut d, reg::LIVENESS), !0x1234_5678);
        d.write_bar(0, reg::STATUS, &0x80u32.to_le_bytes());
        d.write_bar(0, reg::FACTORIAL, &5u32.to_le_bytes());
        assert_eq!(r32(&mut d, reg::FACTORIAL), 120);
        assert_eq!(r32(&mut d, reg::STATUS) & 1, 0);
        assert_eq!(r32(&mut d, reg::IRQ_STATUS), 1);
        d.write_bar(0, reg::IRQ_RAISE, &0x30u32.to_le_bytes());
        assert_eq!(r32(&mut d, reg::IRQ_STATUS), 0x31);
        d.write_bar(0, reg::IRQ_ACK, &0x11u32.to_le_bytes());
        assert_eq!(r32(&mut d, reg::IRQ_STATUS), 0x20);
        // Unknown registers read as all-ones.
        assert_eq!(r32(&mut d, 0x40), u32::MAX);
    }

    #[test]
    fn identity_round_trip_and_byte_counter() {
        let mem = ram();
        let mut d = device(DmaSpace::identity(mem.clone()));
        let pattern: Vec<u8> = (0..2048u32).map(|i| ((i * 7) & 0xff) as u8).collect();
        mem.write_slice(&pattern, GuestAddress(0x8000)).unwrap();
        assert_eq!(dma(&mut d, 0x8000, DMA_BUF_ADDR, 2048, false), 0);
        assert_eq!(dma(&mut d, DMA_BUF_ADDR, 0x20000, 2048, true), 0);
        let mut back = vec![0u8; 2048];
        mem.read_slice(&mut back, GuestAddress(0x20000)).unwrap();
        assert_eq!(back, pattern);
        assert_eq!(r64(&mut d, reg::DMA_BYTES), 4096);
        assert_eq!(d.bytes_moved(), 4096);
        // A full-buffer transfer ending exactly at the buffer end works.
        assert_eq!(dma(&mut d, DMA_BUF_ADDR, 0x30000, 4096, true), 0);
    }

    #[test]
    fn split_32bit_writes_form_64bit_addresses() {
        let mut d = device(DmaSpace::identity(ram()));
        d.write_bar(0, reg::DMA_SRC, &0x9abc_def0u32.to_le_bytes());
        d.write_bar(0, reg::DMA_SRC + 4, &0x1234_5678u32.to_le_bytes());
        assert_eq!(r64(&mut d, reg::DMA_SRC), 0x1234_5678_9abc_def0);
        assert_eq!(r32(&mut d, reg::DMA_SRC + 4), 0x1234_5678);
    }

    #[test]
    fn bad_ranges_and_bus_master_are_errors() {
        let mem = ram();
        let mut d = device(DmaSpace::identity(mem.clone()));
        assert_eq!(
            dma(&mut d, DMA_BUF_ADDR + 4000, 0x1000, 200, true),
            DmaError::BadDeviceRange as u64
        );
        assert_eq!(
            dma(&mut d, 0x1000, DMA_BUF_ADDR, 4097, false),
            DmaError::BadDeviceRange as u64
        );
        assert_eq!(
            dma(&mut d, DMA_BUF_ADDR, 0xff000, 0x2000, true),
            DmaError::BadDeviceRange as u64
        );
        // Past the end of RAM: nothing written, NotRam.
        assert_eq!(
            dma(&mut d, DMA_BUF_ADDR, 0xfff00, 0x200, true),
            DmaError::NotRam as u64
        );
        assert_eq!(
            dma(&mut d, DMA_BUF_ADDR, u64::MAX - 10, 0x200, true),
            DmaError::NotRam as u64
        );
        d.config_mut().write_reg(1, 0, &[0x2, 0]);
        assert_eq!(
            dma(&mut d, DMA_BUF_ADDR, 0x1000, 16, true),
            DmaError::BusMasterOff as u64
        );
        assert_eq!(r64(&mut d, reg::DMA_BYTES), 0);
        // No DMA space at all.
        let mut bare = DmaTestDevice::new();
        bare.config_mut().write_reg(1, 0, &[0x6, 0]);
        assert_eq!(
            dma(&mut bare, DMA_BUF_ADDR, 0x1000, 16, true),
            DmaError::NotRam as u64
        );
    }

    #[test]
    fn iommu_fault_leaves_memory_unchanged_and_is_reported() {
        let iommu = TestIommu::new(0x20);
        let mem = ram();
        let mut d = device(iommu.space(&mem));
        // ATTACH ep to domain 7, MAP IOVA 0x100000..0x100fff -> GPA 0x50000 rw.
        iommu.attach(7);
        iommu.map(7, 0x10_0000, 0x1000, 0x5_0000, RW);

        mem.write_slice(&[0x11; 4096], GuestAddress(0x8000))
            .unwrap();
        // RAM (identity page 0x8000 is not mapped) -> device: refused.
        assert_eq!(
            dma(&mut d, 0x8000, DMA_BUF_ADDR, 64, false),
            DmaError::IommuFault as u64
        );
        assert_eq!(r64(&mut d, reg::DMA_FAULTS), 1);
        assert_eq!(r64(&mut d, reg::DMA_FAULT_ADDR), 0x8000);
        // Mapped IOVA works and lands at the GPA.
        mem.write_slice(&[0x5a; 4096], GuestAddress(0x5_0000))
            .unwrap();
        d.buffer.fill(0xc3);
        assert_eq!(dma(&mut d, DMA_BUF_ADDR, 0x10_0000, 4096, true), 0);
        let mut page = vec![0u8; 4096];
        mem.read_slice(&mut page, GuestAddress(0x5_0000)).unwrap();
        assert!(page.iter().all(|b| *b == 0xc3));
        // A range that runs past the mapping is refused as a whole: the
        // mapped first half is not written either.
        mem.write_slice(&[0x5a; 4096], GuestAddress(0x5_0000))
            .unwrap();
        assert_eq!(
            dma(&mut d, DMA_BUF_ADDR, 0x10_0800, 4096, true),
            DmaError::IommuFault as u64
        );
        mem.read_slice(&mut page, GuestAddress(0x5_0000)).unwrap();
        assert!(page.iter().all(|b| *b == 0x5a), "no partial write");
        assert_eq!(r64(&mut d, reg::DMA_FAULTS), 2);
        assert_eq!(r64(&mut d, reg::DMA_BYTES), 4096);
        // Both refusals produced fault events for the event queue.
        assert!(iommu.dev.pop_fault_event().is_some());
        assert!(iommu.dev.pop_fault_event().is_some());
        assert!(iommu.dev.pop_fault_event().is_none());
    }

    /// Waits (bounded) until the device reports its stream ended; returns
    /// the error register.
    fn wait_stream_end(d: &mut DmaTestDevice) -> u64 {
        for _ in 0..20_000 {
            if r64(d, reg::DMA_CMD) & CMD_RUN == 0 {
                return r64(d, reg::DMA_ERROR);
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        panic!("stream did not end");
    }

    fn start_stream(d: &mut DmaTestDevice, iova: u64, cnt: u64) {
        w64(d, reg::DMA_SRC, DMA_BUF_ADDR);
        w64(d, reg::DMA_DST, iova);
        w64(d, reg::DMA_CNT, cnt);
        w64(d, reg::DMA_CMD, CMD_RUN | CMD_TO_RAM | CMD_STREAM);
    }

    fn wait_passes(d: &mut DmaTestDevice, n: u64) {
        for _ in 0..20_000 {
            if r64(d, reg::STREAM_PASSES) >= n {
                return;
            }
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        panic!("stream made no progress");
    }

    #[test]
    fn stream_repeats_until_stopped() {
        let mem = ram();
        let mut d = device(DmaSpace::identity(mem.clone()));
        d.buffer.fill(0x77);
        start_stream(&mut d, 0x9000, 512);
        wait_passes(&mut d, 3);
        // The guest overwrites the target: the stream writes it again.
        mem.write_slice(&[0u8; 512], GuestAddress(0x9000)).unwrap();
        let seen = r64(&mut d, reg::STREAM_PASSES);
        wait_passes(&mut d, seen + 2);
        assert_eq!(
            r64(&mut d, reg::DMA_CMD) & CMD_RUN,
            CMD_RUN,
            "still streaming"
        );
        w64(&mut d, reg::DMA_CMD, 0);
        assert_eq!(wait_stream_end(&mut d), 0);
        let passes = r64(&mut d, reg::STREAM_PASSES);
        assert_eq!(r64(&mut d, reg::DMA_BYTES), passes * 512);
        let mut back = [0u8; 512];
        mem.read_slice(&mut back, GuestAddress(0x9000)).unwrap();
        assert!(back.iter().all(|b| *b == 0x77));
        // Stopped means stopped: nothing lands any more.
        mem.write_slice(&[0u8; 512], GuestAddress(0x9000)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        mem.read_slice(&mut back, GuestAddress(0x9000)).unwrap();
        assert!(back.iter().all(|b| *b == 0));
        assert_eq!(r64(&mut d, reg::STREAM_PASSES), passes);
        // A bad device range is refused at once, without streaming.
        w64(&mut d, reg::DMA_SRC, DMA_BUF_ADDR + 4000);
        w64(&mut d, reg::DMA_CMD, CMD_RUN | CMD_TO_RAM | CMD_STREAM);
        assert_eq!(r64(&mut d, reg::DMA_CMD) & CMD_RUN, 0);
        assert_eq!(r64(&mut d, reg::DMA_ERROR), DmaError::BadDeviceRange as u64);
    }

    #[test]
    fn clearing_bus_master_stops_a_stream() {
        let mut d = device(DmaSpace::identity(ram()));
        start_stream(&mut d, 0x9000, 64);
        wait_passes(&mut d, 1);
        d.write_config_register(1, 0, &[0x2, 0]);
        assert_eq!(wait_stream_end(&mut d), 0);
        let passes = r64(&mut d, reg::STREAM_PASSES);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(r64(&mut d, reg::STREAM_PASSES), passes);
        w64(&mut d, reg::DMA_CMD, CMD_RUN | CMD_TO_RAM | CMD_STREAM);
        assert_eq!(r64(&mut d, reg::DMA_ERROR), DmaError::BusMasterOff as u64);
    }

    /// A translator whose caller is preempted for 2 ms right after each
    /// translation: the worst case of a device thread that translated and
    /// has not copied yet, made certain instead of rare.
    struct Preempted(IommuTranslate);

    impl DmaTranslate for Preempted {
        fn translate_run(
            &self,
            iova: u64,
            len: u64,
            access: DmaAccess,
        ) -> Result<(u64, u64), DmaFault> {
            let r = self.0.translate_run(iova, len, access);
            if r.is_ok() {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            r
        }
    }

    /// The race the guest test runs, at the library seam: unmap while the
    /// stream writes, then reuse the page; the canary must survive. Every
    /// iteration's UNMAP lands while a pass holds a translation (see
    /// [`Preempted`]); without quiescence nearly every canary is lost.
    #[test]
    fn streamed_dma_never_lands_after_unmap_completes() {
        use virtio_iommu::quiesce::Quiescer;

        const GPA: u64 = 0x5_0000;
        const IOVA: u64 = 0x10_0000;
        let iommu = TestIommu::new(0x20);
        let q = Quiescer::new();
        iommu.dev.add_invalidator(q.clone());
        let mem = ram();
        let t = IommuTranslate::new(iommu.dev.endpoint_dma(iommu.ep).unwrap(), None);
        let slow = Preempted(t);
        let space = DmaSpace::translated(mem.clone(), Arc::new(slow)).with_quiescer(q.clone());
        let mut d = device(space);
        d.buffer.fill(0xd5);
        iommu.attach(7);
        let mut corrupted = 0;
        for _ in 0..50 {
            iommu.map(7, IOVA, 0x1000, GPA, RW);
            start_stream(&mut d, IOVA, 4096);
            wait_passes(&mut d, 1);
            iommu.unmap(7, IOVA, 0x1000);
            mem.write_slice(&[0x3c; 4096], GuestAddress(GPA)).unwrap();
            assert_eq!(wait_stream_end(&mut d), DmaError::IommuFault as u64);
            let mut page = vec![0u8; 4096];
            mem.read_slice(&mut page, GuestAddress(GPA)).unwrap();
            corrupted += usize::from(page.iter().any(|b| *b != 0x3c));
            while iommu.dev.pop_fault_event().is_some() {}
        }
        assert_eq!(corrupted, 0, "canaries overwritten after UNMAP completed");
        assert_eq!(r64(&mut d, reg::DMA_FAULTS), 50);
        assert_eq!(r64(&mut d, reg::DMA_FAULT_ADDR), IOVA);
    }
}
