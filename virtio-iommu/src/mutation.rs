//! Test-only removal of one DMA-protection safeguard at a time.
//!
//! WHY: a stress test that never sees a violation proves nothing unless it
//! is known to see one when a safeguard is missing. With the cargo feature
//! `test-mutations` (never in a release build: see the `compile_error!`
//! below), the environment variable `DMAVISOR_MUTATION` names one
//! safeguard to switch off; the stress and race tests then must report
//! losses. Without the feature [`active`] is a constant `false` and the
//! compiler removes every check.

/// A safeguard the tests can switch off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// Device threads translate and copy with no read section, so a
    /// completed UNMAP does not wait for a copy in flight.
    NoSections,
    /// IOTLB misses are answered without serialising against
    /// invalidations (a stale UPDATE may follow an acknowledged
    /// INVALIDATE).
    NoIotlbSerialisation,
    /// A completed UNMAP does not wait for its consumers' confirmation.
    NoConsumerWait,
    /// The quiescer's sync skips its barrier (membarrier, or the fence it
    /// falls back to), so a device thread's section can go unseen.
    NoMembarrier,
}

impl Mutation {
    /// The spelling in `DMAVISOR_MUTATION`.
    pub const fn name(self) -> &'static str {
        match self {
            Mutation::NoSections => "no-sections",
            Mutation::NoIotlbSerialisation => "no-iotlb-serialisation",
            Mutation::NoConsumerWait => "no-consumer-wait",
            Mutation::NoMembarrier => "no-membarrier",
        }
    }
}

#[cfg(all(feature = "test-mutations", not(debug_assertions)))]
compile_error!("the test-mutations feature removes DMA protection; never build it in release");

/// Whether `m` is switched off in this process (`DMAVISOR_MUTATION`, read
/// once). Always `false` without the `test-mutations` feature.
#[cfg(feature = "test-mutations")]
pub fn active(m: Mutation) -> bool {
    use std::sync::OnceLock;
    static CHOSEN: OnceLock<Option<String>> = OnceLock::new();
    CHOSEN
        .get_or_init(|| std::env::var("DMAVISOR_MUTATION").ok())
        .as_deref()
        == Some(m.name())
}

/// Whether `m` is switched off in this process: never, without the
/// `test-mutations` feature.
#[cfg(not(feature = "test-mutations"))]
#[inline(always)]
pub const fn active(_m: Mutation) -> bool {
    false
}
