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
pub mod net_checks;
pub mod paths;
pub mod qemu;
pub mod runner;
pub mod session;
pub mod vmm;
pub mod vviommu_matrix;

pub use error::HarnessError;

/// Whether the long reference runs of other VMMs (QEMU's vhost-user-net
/// and vfio-pci, with and without its vIOMMU; QEMU's virtio-blk behind
/// its vIOMMU) join their groups' sessions: `DMAVISOR_REFERENCES=1`, set
/// by `make bench-guest` and `make soak`. They compare, they do not test
/// dmavisor, and they were most of `make test`'s time (the vhost_user
/// group alone took 19 minutes of a 35-minute run), so `make test` keeps
/// one short reference per group at most and the figures that need the
/// others are reported when they ran.
pub fn references_enabled() -> bool {
    std::env::var("DMAVISOR_REFERENCES").is_ok_and(|v| v == "1")
}

/// Iterations of the unmap-while-streaming race tests (issue 9):
/// `DMAVISOR_RACE_ITERS` (100..=1,000,000), else 2,000. `make test` keeps
/// the default small because every iteration is vIOMMU traffic, which is
/// what exposes the nested runner's own crashes (issue 16); the issue's
/// 10,000-iteration runs are `DMAVISOR_RACE_ITERS=10000` of the same tests.
pub fn race_iters() -> u64 {
    std::env::var("DMAVISOR_RACE_ITERS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(2_000, |n| n.clamp(100, 1_000_000))
}
