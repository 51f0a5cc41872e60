//! Fuzzes the virtio PCI common configuration as a hostile driver writes
//! and reads it: every width at every offset (straddling fields, past the
//! end), feature selects beyond the two words, queue selects beyond the
//! queues, status bits in any order, reset at any time.
//!
//! Input: [offered features (8 bytes)][queue count][MSI-X entries][ops of
//! 12 bytes: kind, offset, len, pad, value (8 bytes)].
//!
//! Invariants beyond "no panic": the device starts (Activate) only with
//! FEATURES_OK and DRIVER_OK set, VERSION_1 negotiated and the driver's
//! features a subset of those offered, at most once per reset; once
//! FEATURES_OK is accepted the negotiated features never change, and once
//! started queue addresses, sizes and enables do not either; a queue's
//! size stays a power of two no larger than its maximum; vectors are
//! below the table size or NO_VECTOR; an absent queue reads as size 0,
//! disabled, NO_VECTOR; read-only fields (feature words, queue count,
//! generation) ignore writes; reset comes exactly from writing status 0.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vmm::virtio::common_cfg::{
    CommonCfgAction, CommonConfig, COMMON_CFG_SIZE, VIRTIO_MSI_NO_VECTOR,
};
use vmm::virtio::status::{DRIVER_OK, FEATURES_OK};
use vmm::virtio::{feature, VIRTIO_F_VERSION_1};

const DEVICE_FEATURE_SELECT: u64 = 0x00;
const DEVICE_FEATURE: u64 = 0x04;
const NUM_QUEUES: u64 = 0x12;
const DEVICE_STATUS: u64 = 0x14;
const CONFIG_GENERATION: u64 = 0x15;
const QUEUE_SELECT: u64 = 0x16;
const QUEUE_SIZE: u64 = 0x18;
const QUEUE_MSIX_VECTOR: u64 = 0x1a;
const QUEUE_ENABLE: u64 = 0x1c;

fn read(c: &CommonConfig, off: u64, len: usize) -> u64 {
    let mut b = [0u8; 8];
    c.read(off, &mut b[..len], false);
    u64::from_le_bytes(b)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 10 {
        return;
    }
    let mut offered = [0u8; 8];
    offered.copy_from_slice(&data[..8]);
    let offered = u64::from_le_bytes(offered) | feature(VIRTIO_F_VERSION_1);
    let nq = usize::from(data[8] % 9);
    let msix = u16::from(data[9] % 9);
    let maxes: Vec<u16> = (0..nq).map(|i| 1u16 << (i % 16).min(15)).collect();
    let mut c = CommonConfig::new(offered, &maxes, msix);
    let mut started = false;
    for op in data[10..].chunks_exact(12) {
        let mut v = [0u8; 8];
        v.copy_from_slice(&op[4..12]);
        let value = u64::from_le_bytes(v);
        let len = [1usize, 2, 4, 8][usize::from(op[2] & 3)];
        let offset = u64::from(op[1]) % (COMMON_CFG_SIZE + 8);
        let before = c.clone();
        let generation = read(&c, CONFIG_GENERATION, 1);
        if op[0] & 1 == 0 {
            let mut got = [0u8; 8];
            c.read(offset, &mut got[..len], op[0] & 2 != 0);
            if offset + len as u64 > COMMON_CFG_SIZE {
                assert!(
                    got.iter().all(|b| *b == 0),
                    "read past the end at {offset:#x}"
                );
            }
            continue;
        }
        let action = c.write(offset, &value.to_le_bytes()[..len]);
        let was_ok = before.status() & FEATURES_OK != 0;
        let was_running = before.status() & DRIVER_OK != 0 && started;
        match action {
            CommonCfgAction::Reset => {
                assert!(
                    offset == DEVICE_STATUS && len == 1 && value & 0xff == 0,
                    "reset from a write at {offset:#x}"
                );
                assert_eq!(c.status(), 0);
                assert_eq!(c.driver_features(), 0);
                assert!(c.queues().iter().all(|q| !q.ready));
                started = false;
            }
            CommonCfgAction::Activate => {
                assert!(!started, "activated twice without a reset");
                let s = c.status();
                assert!(
                    s & FEATURES_OK != 0 && s & DRIVER_OK != 0,
                    "activated with status {s:#x}"
                );
                assert_eq!(
                    c.driver_features() & !c.device_features(),
                    0,
                    "negotiated a feature not offered"
                );
                assert_ne!(
                    c.driver_features() & feature(VIRTIO_F_VERSION_1),
                    0,
                    "activated without VERSION_1"
                );
                started = true;
            }
            CommonCfgAction::None | CommonCfgAction::VectorsChanged => {}
        }
        if action != CommonCfgAction::Reset {
            if c.status() & FEATURES_OK != 0 {
                assert_eq!(
                    c.driver_features() & !c.device_features(),
                    0,
                    "FEATURES_OK over features not offered"
                );
            }
            if was_ok {
                assert_eq!(
                    c.driver_features(),
                    before.driver_features(),
                    "features changed after FEATURES_OK"
                );
                assert_ne!(
                    c.status() & FEATURES_OK,
                    0,
                    "FEATURES_OK cleared without a reset"
                );
            }
            if was_running {
                for (a, b) in c.queues().iter().zip(before.queues()) {
                    assert_eq!(
                        (a.size, a.ready, a.desc, a.driver, a.device),
                        (b.size, b.ready, b.desc, b.driver, b.device),
                        "queue changed while the device runs"
                    );
                }
            }
            for (a, b) in c.queues().iter().zip(before.queues()) {
                if b.ready {
                    assert_eq!(
                        (a.size, a.desc, a.driver, a.device),
                        (b.size, b.desc, b.driver, b.device),
                        "enabled queue reconfigured"
                    );
                }
            }
        }
        assert_eq!(c.device_features(), offered);
        assert_eq!(read(&c, NUM_QUEUES, 2), nq as u64);
        assert_eq!(
            read(&c, CONFIG_GENERATION, 1),
            generation,
            "generation moved by a driver write"
        );
        for q in c.queues() {
            assert!(
                q.size.is_power_of_two() && q.size <= q.max_size,
                "queue size {}",
                q.size
            );
            assert!(q.msix_vector < msix || q.msix_vector == VIRTIO_MSI_NO_VECTOR);
        }
        assert!(c.msix_config() < msix || c.msix_config() == VIRTIO_MSI_NO_VECTOR);
        let sel = read(&c, QUEUE_SELECT, 2) as usize;
        if sel >= nq {
            assert_eq!(read(&c, QUEUE_SIZE, 2), 0);
            assert_eq!(read(&c, QUEUE_ENABLE, 2), 0);
            assert_eq!(
                read(&c, QUEUE_MSIX_VECTOR, 2),
                u64::from(VIRTIO_MSI_NO_VECTOR)
            );
        }
        let word = match read(&c, DEVICE_FEATURE_SELECT, 4) {
            0 => offered & 0xffff_ffff,
            1 => offered >> 32,
            _ => 0,
        };
        assert_eq!(read(&c, DEVICE_FEATURE, 4), word);
    }
});
