//! The vIOMMU's promise under real parallelism: once a guest's UNMAP or
//! DETACH has completed, no DMA consumer can reach that memory.
//!
//! WHY native: the nested runner's guests run on single-threaded TCG, where
//! two vCPUs never run at once; store-buffer reordering between a device
//! thread and a completing kick, or an IOTLB miss racing an invalidation,
//! only happen where threads really run at the same time. Here guest
//! threads (each on a request queue of its own) MAP, UNMAP, DETACH and
//! reATTACH while every kind of consumer does DMA at once: emulated device
//! threads through the real `DmaSpace` in reader sections, a vhost-user
//! back-end whose IOTLB talks to dmavisor's `BackendIotlb` over real Unix
//! sockets, and an assigned function behind dmavisor's `VfioMirror` over a
//! container that records its calls (`dma_stress/`).
//!
//! `DMAVISOR_STRESS_SECONDS` sets the length (default 60 s, as `make test`
//! runs it); `DMAVISOR_STRESS_SEED` repeats a run's choices. With the
//! `test-mutations` feature, `DMAVISOR_MUTATION` removes one safeguard and
//! the test must then fail with violations counted. One JSON line reports
//! the counts.

mod dma_stress;

use std::sync::atomic::Ordering;

use dma_stress::rig::Rig;
use dma_stress::KINDS;

fn seconds() -> u64 {
    match std::env::var("DMAVISOR_STRESS_SECONDS") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("DMAVISOR_STRESS_SECONDS={v:?} is not a number")),
        Err(_) => 60,
    }
}

fn seed() -> u64 {
    match std::env::var("DMAVISOR_STRESS_SEED") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("DMAVISOR_STRESS_SEED={v:?} is not a number")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(1)),
    }
}

#[test]
fn dma_protection_stress_native() {
    let (secs, seed) = (seconds(), seed());
    let rig = Rig::new();
    let elapsed = rig.run(secs, seed);
    // Straight to the stream, not through the harness's capture: the line
    // belongs in `make test`'s log whether the test passes or not.
    let line = format!("{}\n", rig.report(seed, elapsed));
    if let Err(e) = std::io::Write::write_all(&mut std::io::stdout(), line.as_bytes()) {
        panic!("printing the report: {e}");
    }
    let shared = &rig.shared;
    assert_eq!(
        shared.violations(),
        0,
        "DMA after a completed UNMAP or DETACH"
    );
    assert_eq!(
        shared.bad_status.load(Ordering::Relaxed),
        0,
        "requests failed"
    );
    for k in KINDS {
        assert!(
            shared.kind(k).accesses.load(Ordering::Relaxed) > 0,
            "no {} access at all: the run proved nothing",
            k.name()
        );
    }
    assert!(
        shared.unmaps.load(Ordering::Relaxed) > 0,
        "no UNMAP completed"
    );
    // Fail-closed stops are for consumers that cannot confirm; these all
    // can, so a stop here is a bug (and would hide their accesses).
    assert_eq!(
        rig.stops(),
        (0, 0),
        "a back-end or VFIO function was stopped"
    );
}
