//! vCPU creation, boot configuration and the exit-handling loop.
//!
//! Each vCPU runs on its own thread and dispatches port and MMIO exits
//! straight to the buses; nothing is shared between vCPUs but those buses.

use std::sync::Arc;

use kvm_bindings::{kvm_cpuid_entry2, kvm_xcrs, CpuId, Msrs};
use kvm_ioctls::{VcpuExit, VcpuFd, VmFd};
use log::{debug, error, info, trace, warn};

use crate::boot::cpuid::{initial_xcr0, patch_cpuid};
use crate::boot::msrs::boot_msrs;
use crate::boot::regs::{boot_fpu, boot_regs, setup_sregs, EntryMode};
use crate::devices::bus::Bus;
use crate::error::{kvm_err, Error};
use crate::exit::{ExitEvent, ExitSender, Failure};
use crate::memory::GuestMemoryMmap;
use crate::vcpu_control::VcpuControl;
use crate::width::usize_from_u64;

/// Local APIC register offsets and delivery modes for the LINT pins.
const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_EXTINT: u32 = 0x7;
const APIC_MODE_NMI: u32 = 0x4;

/// KVM_SYSTEM_EVENT_* types.
const SYSTEM_EVENT_SHUTDOWN: u32 = 1;
const SYSTEM_EVENT_RESET: u32 = 2;
const SYSTEM_EVENT_CRASH: u32 = 3;

/// Where and how the boot vCPU starts.
pub struct BootEntry<'a> {
    /// Guest memory (GDT and page tables are written into it).
    pub mem: &'a GuestMemoryMmap,
    /// Entry mode.
    pub mode: EntryMode,
    /// Entry point.
    pub entry: u64,
    /// Zero page or PVH start info address.
    pub boot_data: u64,
}

/// One virtual CPU.
pub struct Vcpu {
    fd: VcpuFd,
    index: u8,
    pio: Arc<Bus>,
    mmio: Arc<Bus>,
    exit: ExitSender,
    control: Arc<VcpuControl>,
}

fn lapic_reg(regs: &[libc::c_char], offset: usize) -> u32 {
    let mut b = [0u8; 4];
    for (i, byte) in b.iter_mut().enumerate() {
        *byte = regs.get(offset + i).map_or(0, |c| c.to_ne_bytes()[0]);
    }
    u32::from_le_bytes(b)
}

fn set_lapic_reg(regs: &mut [libc::c_char], offset: usize, value: u32) {
    for (i, byte) in value.to_le_bytes().iter().enumerate() {
        if let Some(r) = regs.get_mut(offset + i) {
            *r = libc::c_char::from_ne_bytes([*byte]);
        }
    }
}

/// The port, access size and data of the current KVM_EXIT_IO.
///
/// Why not kvm-ioctls' slice alone: string I/O (`rep ins/outs`) delivers
/// `count` accesses of `size` bytes in one exit, and the slice does not say
/// which; each element must reach the device as its own access.
fn io_exit_data(fd: &mut VcpuFd) -> (u16, usize, &mut [u8]) {
    let run = fd.get_kvm_run();
    // SAFETY: only called right after KVM_RUN returned KVM_EXIT_IO, so `io`
    // is the union member KVM filled in.
    let io = unsafe { run.__bindgen_anon_1.io };
    let size = usize::from(io.size);
    let len = size * io.count as usize;
    let base = run as *mut kvm_bindings::kvm_run as *mut u8;
    // SAFETY: KVM places the data `data_offset` bytes into the kvm_run
    // mapping, which is mapped for the vCPU's lifetime (kvm-ioctls derives
    // its IoIn/IoOut slices the same way).
    let data =
        unsafe { std::slice::from_raw_parts_mut(base.add(usize_from_u64(io.data_offset)), len) };
    (io.port, size, data)
}

/// Dispatches one or more `size`-byte port reads; absent ports read all-ones.
fn pio_in(bus: &Bus, vcpu: u8, port: u16, size: usize, data: &mut [u8]) {
    for chunk in data.chunks_mut(size.max(1)) {
        if !bus.read(u64::from(port), chunk) {
            trace!("vCPU {vcpu}: unhandled in {port:#x}");
            chunk.fill(0xff);
        }
    }
}

/// Dispatches one or more `size`-byte port writes.
fn pio_out(bus: &Bus, vcpu: u8, port: u16, size: usize, data: &[u8]) {
    for chunk in data.chunks(size.max(1)) {
        if !bus.write(u64::from(port), chunk) {
            trace!("vCPU {vcpu}: unhandled out {port:#x} {chunk:?}");
        }
    }
}

fn set_delivery_mode(reg: u32, mode: u32) -> u32 {
    (reg & !0x700) | (mode << 8)
}

impl Vcpu {
    /// Creates vCPU `index` (its APIC id is the same number); it parks
    /// whenever `control` pauses the VM.
    pub fn new(
        vm: &VmFd,
        index: u8,
        pio: Arc<Bus>,
        mmio: Arc<Bus>,
        exit: ExitSender,
        control: Arc<VcpuControl>,
    ) -> Result<Self, Error> {
        let fd = vm
            .create_vcpu(u64::from(index))
            .map_err(kvm_err("KVM_CREATE_VCPU"))?;
        Ok(Self {
            fd,
            index,
            pio,
            mmio,
            exit,
            control,
        })
    }

    /// Sets CPUID, MSRs, FPU and LAPIC LINT pins; for the boot vCPU also the
    /// entry registers. Other vCPUs wait for INIT/SIPI in the in-kernel LAPIC.
    pub fn configure(
        &self,
        supported_cpuid: &[kvm_cpuid_entry2],
        num_vcpus: u8,
        tsc_deadline: bool,
        boot: Option<BootEntry<'_>>,
    ) -> Result<(), Error> {
        let entries = patch_cpuid(supported_cpuid, self.index, num_vcpus, tsc_deadline);
        let cpuid = CpuId::from_entries(&entries).map_err(|source| Error::KvmList {
            what: "CPUID entries",
            source,
        })?;
        self.fd
            .set_cpuid2(&cpuid)
            .map_err(kvm_err("KVM_SET_CPUID2"))?;
        if let Some(xcr0) = initial_xcr0(&entries) {
            let mut xcrs = kvm_xcrs {
                nr_xcrs: 1,
                ..Default::default()
            };
            xcrs.xcrs[0].value = xcr0;
            if let Err(e) = self.fd.set_xcrs(&xcrs) {
                debug!("vCPU {}: KVM_SET_XCRS({xcr0:#x}): {e}", self.index);
            }
        }

        let wanted = boot_msrs();
        let msrs = Msrs::from_entries(&wanted).map_err(|source| Error::KvmList {
            what: "MSRs",
            source,
        })?;
        let set = self.fd.set_msrs(&msrs).map_err(kvm_err("KVM_SET_MSRS"))?;
        if set != wanted.len() {
            let failed = wanted.get(set).map(|m| m.index).unwrap_or(0);
            warn!(
                "vCPU {}: KVM accepted {set} of {} boot MSRs (first refused: {failed:#x})",
                self.index,
                wanted.len()
            );
        }

        self.fd
            .set_fpu(&boot_fpu())
            .map_err(kvm_err("KVM_SET_FPU"))?;

        let mut lapic = self.fd.get_lapic().map_err(kvm_err("KVM_GET_LAPIC"))?;
        let lvt0 = lapic_reg(&lapic.regs, APIC_LVT0);
        set_lapic_reg(
            &mut lapic.regs,
            APIC_LVT0,
            set_delivery_mode(lvt0, APIC_MODE_EXTINT),
        );
        let lvt1 = lapic_reg(&lapic.regs, APIC_LVT1);
        set_lapic_reg(
            &mut lapic.regs,
            APIC_LVT1,
            set_delivery_mode(lvt1, APIC_MODE_NMI),
        );
        self.fd
            .set_lapic(&lapic)
            .map_err(kvm_err("KVM_SET_LAPIC"))?;

        if let Some(boot) = boot {
            let mut sregs = self.fd.get_sregs().map_err(kvm_err("KVM_GET_SREGS"))?;
            setup_sregs(boot.mem, &mut sregs, boot.mode)?;
            self.fd
                .set_sregs(&sregs)
                .map_err(kvm_err("KVM_SET_SREGS"))?;
            self.fd
                .set_regs(&boot_regs(boot.mode, boot.entry, boot.boot_data))
                .map_err(kvm_err("KVM_SET_REGS"))?;
        }
        Ok(())
    }

    /// The vCPU's index (and APIC id).
    pub fn index(&self) -> u8 {
        self.index
    }

    /// The registers that tell where and why a guest died, on one line
    /// (for triple faults, which otherwise leave nothing to go on). On AMD
    /// KVM re-initialises the vCPU before reporting the shutdown, so there
    /// this shows reset state; on Intel it shows the faulting state.
    /// `exception=` is the last exception KVM itself queued, which may be
    /// long before the fault (e.g. the #GP of a refused MSR write at boot).
    fn state_summary(&self) -> String {
        let mut out = String::new();
        match self.fd.get_regs() {
            Ok(r) => out.push_str(&format!(
                "rip={:#x} rsp={:#x} rflags={:#x}",
                r.rip, r.rsp, r.rflags
            )),
            Err(e) => out.push_str(&format!("regs unavailable ({e})")),
        }
        match self.fd.get_sregs() {
            Ok(s) => out.push_str(&format!(
                " cr0={:#x} cr2={:#x} cr3={:#x} cr4={:#x} efer={:#x} idt={:#x}/{:#x} cs={:#x}",
                s.cr0, s.cr2, s.cr3, s.cr4, s.efer, s.idt.base, s.idt.limit, s.cs.selector
            )),
            Err(e) => out.push_str(&format!(" sregs unavailable ({e})")),
        }
        if let Ok(ev) = self.fd.get_vcpu_events() {
            out.push_str(&format!(
                " exception={}/{} nmi_pending={}",
                ev.exception.injected, ev.exception.nr, ev.nmi.pending
            ));
        }
        out
    }

    fn finish(&self, event: ExitEvent) {
        let _ = self.exit.send(event);
    }

    /// Runs the vCPU until the guest stops it or an error occurs; the reason
    /// is sent to the exit channel.
    pub fn run(mut self) {
        let index = self.index;
        // Held until the thread ends, however it ends: a pause must not
        // wait for a vCPU that will never park.
        let _running = self.control.running_guard();
        loop {
            // A pause kicks the thread out of KVM_RUN (EINTR); it parks
            // here. A teardown kicks it out the same way and ends it here.
            if !self.control.checkpoint() {
                debug!("vCPU {index}: stopped for the VM's teardown");
                return;
            }
            match self.fd.run() {
                Ok(VcpuExit::IoIn(..)) => {
                    let (port, size, data) = io_exit_data(&mut self.fd);
                    pio_in(&self.pio, index, port, size, data);
                }
                Ok(VcpuExit::IoOut(..)) => {
                    let (port, size, data) = io_exit_data(&mut self.fd);
                    pio_out(&self.pio, index, port, size, data);
                }
                Ok(VcpuExit::MmioRead(addr, data)) => {
                    if !self.mmio.read(addr, data) {
                        debug!("vCPU {index}: unhandled MMIO read {addr:#x}");
                        data.fill(0xff);
                    }
                }
                Ok(VcpuExit::MmioWrite(addr, data)) => {
                    if !self.mmio.write(addr, data) {
                        debug!("vCPU {index}: unhandled MMIO write {addr:#x}");
                    }
                }
                Ok(VcpuExit::Hlt) => {
                    // The in-kernel LAPIC handles HLT; seeing it means the
                    // guest halted with interrupts off for good.
                    info!("vCPU {index}: halted");
                    return;
                }
                Ok(VcpuExit::Shutdown) => {
                    error!("vCPU {index}: triple fault; {}", self.state_summary());
                    return self.finish(ExitEvent::TripleFault { vcpu: index });
                }
                Ok(VcpuExit::SystemEvent(kind, data)) => {
                    let event = match kind {
                        SYSTEM_EVENT_SHUTDOWN => ExitEvent::PowerOff,
                        SYSTEM_EVENT_RESET => ExitEvent::Reset,
                        SYSTEM_EVENT_CRASH => ExitEvent::Error(Failure::GuestCrash { vcpu: index }),
                        other => ExitEvent::Error(Failure::UnknownSystemEvent {
                            kind: other,
                            data: data.to_vec(),
                            vcpu: index,
                        }),
                    };
                    return self.finish(event);
                }
                Ok(VcpuExit::FailEntry(reason, cpu)) => {
                    return self.finish(ExitEvent::Error(Failure::FailEntry {
                        vcpu: index,
                        reason,
                        cpu,
                    }));
                }
                Ok(VcpuExit::InternalError) => {
                    // SAFETY: after KVM_EXIT_INTERNAL_ERROR the `internal`
                    // member of the exit union is the one KVM filled in.
                    let suberror =
                        unsafe { self.fd.get_kvm_run().__bindgen_anon_1.internal.suberror };
                    return self.finish(ExitEvent::Error(Failure::KvmInternal {
                        vcpu: index,
                        suberror,
                    }));
                }
                Ok(VcpuExit::Intr) | Ok(VcpuExit::IrqWindowOpen) => {}
                Ok(other) => {
                    warn!("vCPU {index}: ignoring exit {other:?}");
                }
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {}
                Err(e) => {
                    error!("vCPU {index}: KVM_RUN failed: {e}");
                    return self.finish(ExitEvent::Error(Failure::KvmRun {
                        vcpu: index,
                        source: e,
                    }));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::bus::BusDevice;

    struct Fifo {
        next: u8,
        written: Vec<Vec<u8>>,
    }

    impl BusDevice for Fifo {
        fn read(&mut self, _base: u64, _offset: u64, data: &mut [u8]) {
            data.fill(self.next);
            self.next += 1;
        }
        fn write(&mut self, _base: u64, _offset: u64, data: &[u8]) {
            self.written.push(data.to_vec());
        }
    }

    #[test]
    fn string_io_is_split_into_accesses() {
        let bus = Bus::new();
        let dev = Arc::new(std::sync::Mutex::new(Fifo {
            next: 1,
            written: Vec::new(),
        }));
        bus.insert(0x3f8, 8, dev.clone()).unwrap();
        let mut data = [0u8; 4];
        pio_in(&bus, 0, 0x3f8, 1, &mut data);
        assert_eq!(data, [1, 2, 3, 4], "rep insb: four 1-byte reads");
        pio_out(&bus, 0, 0x3f8, 2, &[1, 2, 3, 4]);
        assert_eq!(dev.lock().unwrap().written, vec![vec![1, 2], vec![3, 4]]);
        let mut absent = [0u8; 2];
        pio_in(&bus, 0, 0x80, 1, &mut absent);
        assert_eq!(absent, [0xff, 0xff]);
    }

    #[test]
    fn lapic_register_helpers() {
        let mut regs = [0 as libc::c_char; 1024];
        set_lapic_reg(&mut regs, APIC_LVT0, 0x0001_0700);
        assert_eq!(lapic_reg(&regs, APIC_LVT0), 0x0001_0700);
        assert_eq!(set_delivery_mode(0x0001_0000, APIC_MODE_NMI), 0x0001_0400);
        assert_eq!(set_delivery_mode(0x0000_0700, APIC_MODE_NMI), 0x0000_0400);
        // Out-of-range offsets are ignored, not a panic.
        set_lapic_reg(&mut regs, 1022, 0xffff_ffff);
        assert_eq!(lapic_reg(&regs, 1022), 0x0000_ffff);
    }
}
