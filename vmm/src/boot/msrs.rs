//! Model-specific registers set before the first instruction.
//!
//! Why: Linux expects firmware to have enabled MTRRs with write-back as the
//! default memory type; with MTRRs off it maps RAM uncached and boots very
//! slowly. The syscall MSRs and TSC start from a clean zero.

use kvm_bindings::kvm_msr_entry;

const MSR_IA32_TSC: u32 = 0x10;
const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;

const MISC_ENABLE_FAST_STRING: u64 = 1;
const MTRR_ENABLE: u64 = 1 << 11;
const MTRR_MEM_TYPE_WB: u64 = 6;

/// The boot MSR values for every vCPU.
pub fn boot_msrs() -> Vec<kvm_msr_entry> {
    [
        (MSR_IA32_SYSENTER_CS, 0),
        (MSR_IA32_SYSENTER_ESP, 0),
        (MSR_IA32_SYSENTER_EIP, 0),
        (MSR_STAR, 0),
        (MSR_CSTAR, 0),
        (MSR_KERNEL_GS_BASE, 0),
        (MSR_SYSCALL_MASK, 0),
        (MSR_LSTAR, 0),
        (MSR_IA32_TSC, 0),
        (MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        (MSR_MTRR_DEF_TYPE, MTRR_ENABLE | MTRR_MEM_TYPE_WB),
    ]
    .into_iter()
    .map(|(index, data)| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtrrs_default_to_write_back() {
        let msrs = boot_msrs();
        let def = msrs.iter().find(|m| m.index == MSR_MTRR_DEF_TYPE).unwrap();
        assert_eq!(def.data, 0x806);
        let mut idx: Vec<u32> = msrs.iter().map(|m| m.index).collect();
        idx.sort();
        idx.dedup();
        assert_eq!(idx.len(), msrs.len(), "no MSR listed twice");
    }
}
