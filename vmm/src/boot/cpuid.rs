//! Per-vCPU CPUID: what KVM supports, with a topology that matches the
//! MADT (one core per vCPU, APIC id = vCPU index) and the hypervisor bit.
//!
//! Why patch: KVM_GET_SUPPORTED_CPUID describes the host, not the VM. Linux
//! derives package/core numbering from leaves 1, 0xb/0x1f and AMD's
//! 0x8000_0008; if they disagree with the MADT it mis-numbers CPUs.

use kvm_bindings::{kvm_cpuid_entry2, KVM_CPUID_FLAG_SIGNIFCANT_INDEX};

const LEAF_FEATURES: u32 = 0x1;
const LEAF_CACHE_PARAMS: u32 = 0x4;
const LEAF_EXT_TOPOLOGY: u32 = 0xb;
const LEAF_XSAVE: u32 = 0xd;
/// CPUID.1:ECX XSAVE support.
const ECX_XSAVE: u32 = 1 << 26;
const LEAF_EXT_TOPOLOGY_V2: u32 = 0x1f;
const LEAF_EXT_FEATURES: u32 = 0x8000_0001;
const LEAF_ADDR_SIZES: u32 = 0x8000_0008;
const LEAF_AMD_EXT_APIC_ID: u32 = 0x8000_001e;

const ECX_TSC_DEADLINE: u32 = 1 << 24;
const ECX_HYPERVISOR: u32 = 1 << 31;
const EDX_HTT: u32 = 1 << 28;
/// AMD topology extensions (leaf 0x8000_001e); hidden so Linux uses leaf 0xb.
const ECX_TOPOEXT: u32 = 1 << 22;

/// Level types of leaf 0xb/0x1f.
const LEVEL_SMT: u32 = 1;
const LEVEL_CORE: u32 = 2;

/// Bits needed to number `n` cores.
fn core_shift(n: u8) -> u32 {
    let n = u32::from(n.max(1));
    32 - (n - 1).leading_zeros()
}

/// The extended topology subleaves for one vCPU.
fn topology_entries(function: u32, apic_id: u8, num_vcpus: u8) -> Vec<kvm_cpuid_entry2> {
    let id = u32::from(apic_id);
    let entry = |index: u32, eax: u32, ebx: u32, ecx: u32| kvm_cpuid_entry2 {
        function,
        index,
        flags: KVM_CPUID_FLAG_SIGNIFCANT_INDEX,
        eax,
        ebx,
        ecx,
        edx: id,
        ..Default::default()
    };
    vec![
        // One thread per core.
        entry(0, 0, 1, LEVEL_SMT << 8),
        // All vCPUs are cores of one package.
        entry(
            1,
            core_shift(num_vcpus),
            u32::from(num_vcpus),
            (LEVEL_CORE << 8) | 1,
        ),
        // Terminating (invalid) level.
        entry(2, 0, 0, 2),
    ]
}

/// Rewrites `entries` (from KVM_GET_SUPPORTED_CPUID) for vCPU `apic_id` of
/// `num_vcpus`. `tsc_deadline` advertises the TSC-deadline timer KVM
/// emulates, which spares Linux a timer calibration at boot.
pub fn patch_cpuid(
    entries: &[kvm_cpuid_entry2],
    apic_id: u8,
    num_vcpus: u8,
    tsc_deadline: bool,
) -> Vec<kvm_cpuid_entry2> {
    let max_basic = entries
        .iter()
        .find(|e| e.function == 0)
        .map(|e| e.eax)
        .unwrap_or(0);
    let had_v2 = entries.iter().any(|e| e.function == LEAF_EXT_TOPOLOGY_V2);
    let mut out: Vec<kvm_cpuid_entry2> = entries
        .iter()
        .filter(|e| e.function != LEAF_EXT_TOPOLOGY && e.function != LEAF_EXT_TOPOLOGY_V2)
        .copied()
        .collect();
    let n = u32::from(num_vcpus);
    for e in out.iter_mut() {
        match e.function {
            LEAF_FEATURES => {
                e.ebx = (e.ebx & 0x0000_ffff) | (u32::from(apic_id) << 24) | ((n & 0xff) << 16);
                if n > 1 {
                    e.edx |= EDX_HTT;
                } else {
                    e.edx &= !EDX_HTT;
                }
                e.ecx |= ECX_HYPERVISOR;
                if tsc_deadline {
                    e.ecx |= ECX_TSC_DEADLINE;
                }
            }
            LEAF_CACHE_PARAMS if e.eax & 0x1f != 0 => {
                let level = (e.eax >> 5) & 0x7;
                let sharing = if level == 3 { n - 1 } else { 0 };
                e.eax = (e.eax & 0x3fff) | ((n - 1) << 26) | ((sharing & 0xfff) << 14);
            }
            LEAF_EXT_FEATURES => e.ecx &= !ECX_TOPOEXT,
            LEAF_ADDR_SIZES => {
                e.ecx = (e.ecx & !0xf0ff) | (core_shift(num_vcpus) << 12) | ((n - 1) & 0xff);
            }
            _ => {}
        }
    }
    out.retain(|e| e.function != LEAF_AMD_EXT_APIC_ID);
    if max_basic >= LEAF_EXT_TOPOLOGY {
        out.extend(topology_entries(LEAF_EXT_TOPOLOGY, apic_id, num_vcpus));
    }
    if had_v2 && max_basic >= LEAF_EXT_TOPOLOGY_V2 {
        out.extend(topology_entries(LEAF_EXT_TOPOLOGY_V2, apic_id, num_vcpus));
    }
    out
}

/// The XCR0 value with every user state component KVM supports, if the
/// vCPU has XSAVE at all.
///
/// Why set XCR0 before boot: Linux enables exactly these components, and KVM
/// sizes CPUID.0xD:EBX from the XCR0 it knows. Under nested virtualization
/// that does not intercept XSETBV, KVM never learns the guest's XCR0 and
/// Linux warns about an inconsistent XSAVE size; starting from the final
/// value avoids that and changes nothing where XSETBV is intercepted.
pub fn initial_xcr0(entries: &[kvm_cpuid_entry2]) -> Option<u64> {
    let has_xsave = entries
        .iter()
        .any(|e| e.function == LEAF_FEATURES && e.ecx & ECX_XSAVE != 0);
    let leaf = entries
        .iter()
        .find(|e| e.function == LEAF_XSAVE && e.index == 0)?;
    let mask = u64::from(leaf.eax) | (u64::from(leaf.edx) << 32);
    // x87 must always be set; SSE is needed with anything beyond it.
    (has_xsave && mask & 0x3 == 0x3).then_some(mask)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(function: u32, index: u32, eax: u32, ebx: u32, ecx: u32, edx: u32) -> kvm_cpuid_entry2 {
        kvm_cpuid_entry2 {
            function,
            index,
            eax,
            ebx,
            ecx,
            edx,
            ..Default::default()
        }
    }

    fn host() -> Vec<kvm_cpuid_entry2> {
        vec![
            leaf(0, 0, 0x1f, 0, 0, 0),
            leaf(1, 0, 0x800f12, 0x0f10_0800, 0x7ed8_320b, 0x178b_fbff),
            leaf(4, 0, 0x0000_4163, 0, 0, 0),
            leaf(0xd, 0, 7, 0x240, 0x340, 0),
            leaf(0xd, 1, 0xf, 0x240, 0, 0),
            leaf(0xb, 0, 1, 2, 0x100, 7),
            leaf(0x1f, 0, 1, 2, 0x100, 7),
            leaf(0x8000_0001, 0, 0, 0, 0x35c2_33ff, 0),
            leaf(0x8000_0008, 0, 0x3030, 0, 0x0000_700f, 0),
            leaf(0x8000_001e, 0, 3, 0x100, 0, 0),
        ]
    }

    fn find(v: &[kvm_cpuid_entry2], f: u32, i: u32) -> kvm_cpuid_entry2 {
        *v.iter().find(|e| e.function == f && e.index == i).unwrap()
    }

    #[test]
    fn leaf1_carries_apic_id_count_and_hypervisor_bit() {
        let v = patch_cpuid(&host(), 3, 4, true);
        let l1 = find(&v, 1, 0);
        assert_eq!(l1.ebx >> 24, 3);
        assert_eq!((l1.ebx >> 16) & 0xff, 4);
        assert_eq!(l1.ebx & 0xffff, 0x0800);
        assert_ne!(l1.ecx & ECX_HYPERVISOR, 0);
        assert_ne!(l1.ecx & ECX_TSC_DEADLINE, 0);
        assert_ne!(l1.edx & EDX_HTT, 0);
        let single = find(&patch_cpuid(&host(), 0, 1, false), 1, 0);
        assert_eq!(single.edx & EDX_HTT, 0);
        assert_eq!(single.ecx & ECX_TSC_DEADLINE, 0);
    }

    #[test]
    fn extended_topology_matches_vcpu_count() {
        let v = patch_cpuid(&host(), 2, 3, false);
        for f in [0xb, 0x1f] {
            let smt = find(&v, f, 0);
            let core = find(&v, f, 1);
            let end = find(&v, f, 2);
            assert_eq!(smt.ebx, 1);
            assert_eq!((smt.ecx >> 8) & 0xff, LEVEL_SMT);
            assert_eq!(core.eax, 2, "3 cores need 2 bits");
            assert_eq!(core.ebx, 3);
            assert_eq!((core.ecx >> 8) & 0xff, LEVEL_CORE);
            assert_eq!((end.ecx >> 8) & 0xff, 0);
            assert!([smt, core, end].iter().all(|e| e.edx == 2));
            assert!([smt, core, end]
                .iter()
                .all(|e| e.flags & KVM_CPUID_FLAG_SIGNIFCANT_INDEX != 0));
        }
        assert_eq!(v.iter().filter(|e| e.function == 0xb).count(), 3);
    }

    #[test]
    fn amd_leaves_describe_one_package() {
        let v = patch_cpuid(&host(), 1, 2, false);
        let sizes = find(&v, 0x8000_0008, 0);
        assert_eq!(sizes.ecx & 0xff, 1);
        assert_eq!((sizes.ecx >> 12) & 0xf, 1);
        assert_eq!(sizes.eax, 0x3030);
        assert_eq!(find(&v, 0x8000_0001, 0).ecx & ECX_TOPOEXT, 0);
        assert!(!v.iter().any(|e| e.function == 0x8000_001e));
        let cache = find(&v, 4, 0);
        assert_eq!(cache.eax >> 26, 1);
    }

    #[test]
    fn initial_xcr0_from_leaf_0xd() {
        let mut h = host();
        h.push(leaf(0xd, 0, 7, 0x240, 0x340, 0));
        h[1].ecx &= !ECX_XSAVE;
        assert_eq!(initial_xcr0(&h), None, "no XSAVE bit in leaf 1");
        h[1].ecx |= ECX_XSAVE;
        assert_eq!(initial_xcr0(&h), Some(7));
        h.retain(|e| e.function != 0xd);
        assert_eq!(initial_xcr0(&h), None);
    }

    #[test]
    fn core_shift_values() {
        assert_eq!(core_shift(1), 0);
        assert_eq!(core_shift(2), 1);
        assert_eq!(core_shift(4), 2);
        assert_eq!(core_shift(5), 3);
        assert_eq!(core_shift(64), 6);
    }

    #[test]
    fn no_topology_leaf_when_max_leaf_is_low() {
        let mut h = host();
        h[0].eax = 0xa;
        let v = patch_cpuid(&h, 0, 2, false);
        assert!(!v.iter().any(|e| e.function == 0xb || e.function == 0x1f));
    }
}
