//! Helpers shared by the guest-booting integration tests.
//!
//! Why a library: every test that boots a guest needs the same steps —
//! find the checkout, make sure the Debian guest kernels are unpacked,
//! build a small initramfs around a guest script, build the release
//! `dmavisor` once, and run a shell script where a hardware KVM exists
//! (directly, or inside the nested-virt runner `resources/run-kvm`). Nested
//! boots are slow, so tests are expected to batch several guest boots into
//! one runner session and parse the results with [`markers`].

pub mod error;
pub mod images;
pub mod markers;
pub mod paths;
pub mod qemu;
pub mod runner;
pub mod session;
pub mod vmm;
pub mod vviommu_matrix;

pub use error::HarnessError;
