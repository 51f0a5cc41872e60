//! Getting a vCPU to the kernel's first instruction: kernel loading
//! (bzImage via the 64-bit Linux boot protocol, ELF vmlinux via PVH), boot
//! data (zero page or `hvm_start_info`), CPUID, MSRs and register state.

pub mod bzimage;
pub mod cpuid;
pub mod kernel;
pub mod msrs;
pub mod pvh;
pub mod regs;
pub mod reset_vector;

pub use kernel::{load_kernel, BootProtocol, LoadedKernel};
