//! The virtio-pci common configuration structure (virtio 1.2, 4.1.4.3):
//! feature negotiation, device status and per-queue registers.
//!
//! WHY separate from the PCI device: it is pure state with the spec's rules
//! (which writes are accepted when), so it is unit-tested without KVM. The
//! transport acts on the [`CommonCfgAction`] a write returns.

use super::status::{DEVICE_NEEDS_RESET, DRIVER_OK, FEATURES_OK};
use super::{feature, VIRTIO_F_VERSION_1};
use crate::width::usize_from_u64;

/// "No MSI-X vector" (virtio 1.2, 4.1.5.1.2).
pub const VIRTIO_MSI_NO_VECTOR: u16 = 0xffff;
/// Size of the structure (up to and including `queue_device`).
pub const COMMON_CFG_SIZE: u64 = 0x38;

const DEVICE_FEATURE_SELECT: u64 = 0x00;
const DEVICE_FEATURE: u64 = 0x04;
const DRIVER_FEATURE_SELECT: u64 = 0x08;
const DRIVER_FEATURE: u64 = 0x0c;
const MSIX_CONFIG: u64 = 0x10;
const NUM_QUEUES: u64 = 0x12;
const DEVICE_STATUS: u64 = 0x14;
const CONFIG_GENERATION: u64 = 0x15;
const QUEUE_SELECT: u64 = 0x16;
const QUEUE_SIZE: u64 = 0x18;
const QUEUE_MSIX_VECTOR: u64 = 0x1a;
const QUEUE_ENABLE: u64 = 0x1c;
const QUEUE_NOTIFY_OFF: u64 = 0x1e;
const QUEUE_DESC: u64 = 0x20;
const QUEUE_DRIVER: u64 = 0x28;
const QUEUE_DEVICE: u64 = 0x30;

/// (start, length) of every field.
const FIELDS: [(u64, usize); 16] = [
    (DEVICE_FEATURE_SELECT, 4),
    (DEVICE_FEATURE, 4),
    (DRIVER_FEATURE_SELECT, 4),
    (DRIVER_FEATURE, 4),
    (MSIX_CONFIG, 2),
    (NUM_QUEUES, 2),
    (DEVICE_STATUS, 1),
    (CONFIG_GENERATION, 1),
    (QUEUE_SELECT, 2),
    (QUEUE_SIZE, 2),
    (QUEUE_MSIX_VECTOR, 2),
    (QUEUE_ENABLE, 2),
    (QUEUE_NOTIFY_OFF, 2),
    (QUEUE_DESC, 8),
    (QUEUE_DRIVER, 8),
    (QUEUE_DEVICE, 8),
];

/// Driver-visible registers of one queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueRegs {
    /// Largest size the device supports.
    pub max_size: u16,
    /// Size chosen by the driver (a power of two <= `max_size`).
    pub size: u16,
    /// `queue_enable`.
    pub ready: bool,
    /// Descriptor table address.
    pub desc: u64,
    /// Driver (avail) ring address.
    pub driver: u64,
    /// Device (used) ring address.
    pub device: u64,
    /// MSI-X vector for used-buffer notifications.
    pub msix_vector: u16,
}

impl QueueRegs {
    fn new(max_size: u16) -> Self {
        Self {
            max_size,
            size: max_size,
            ready: false,
            desc: 0,
            driver: 0,
            device: 0,
            msix_vector: VIRTIO_MSI_NO_VECTOR,
        }
    }
}

/// What the transport must do after a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommonCfgAction {
    /// Nothing beyond the register update.
    None,
    /// The driver wrote 0 to the status: reset the device.
    Reset,
    /// The driver set DRIVER_OK after FEATURES_OK: start the device.
    Activate,
    /// A vector assignment changed.
    VectorsChanged,
}

/// The common configuration state of one function.
#[derive(Clone, Debug)]
pub struct CommonConfig {
    device_features: u64,
    driver_features: u64,
    device_feature_select: u32,
    driver_feature_select: u32,
    msix_config: u16,
    status: u8,
    config_generation: u8,
    queue_select: u16,
    queues: Vec<QueueRegs>,
    msix_entries: u16,
}

impl CommonConfig {
    /// State for a device offering `device_features` with queues of the
    /// given maximum sizes and `msix_entries` MSI-X table entries.
    pub fn new(device_features: u64, queue_max_sizes: &[u16], msix_entries: u16) -> Self {
        Self {
            device_features,
            driver_features: 0,
            device_feature_select: 0,
            driver_feature_select: 0,
            msix_config: VIRTIO_MSI_NO_VECTOR,
            status: 0,
            config_generation: 0,
            queue_select: 0,
            queues: queue_max_sizes.iter().map(|m| QueueRegs::new(*m)).collect(),
            msix_entries,
        }
    }

    /// Device status as last accepted.
    pub fn status(&self) -> u8 {
        self.status
    }

    /// Features the driver accepted (valid once FEATURES_OK is set).
    pub fn driver_features(&self) -> u64 {
        self.driver_features
    }

    /// Features offered.
    pub fn device_features(&self) -> u64 {
        self.device_features
    }

    /// Registers of every queue.
    pub fn queues(&self) -> &[QueueRegs] {
        &self.queues
    }

    /// MSI-X vector for configuration changes.
    pub fn msix_config(&self) -> u16 {
        self.msix_config
    }

    /// Bumps the configuration generation (device config changed).
    pub fn bump_generation(&mut self) {
        self.config_generation = self.config_generation.wrapping_add(1);
    }

    /// Back to the reset state (keeps the generation counter).
    pub fn reset(&mut self) {
        let generation = self.config_generation;
        let sizes: Vec<u16> = self.queues.iter().map(|q| q.max_size).collect();
        *self = Self::new(self.device_features, &sizes, self.msix_entries);
        self.config_generation = generation;
    }

    fn selected(&self) -> Option<&QueueRegs> {
        self.queues.get(usize::from(self.queue_select))
    }

    fn selected_mut(&mut self) -> Option<&mut QueueRegs> {
        // Queue registers are frozen once the device runs.
        if self.status & DRIVER_OK != 0 {
            return None;
        }
        self.queues.get_mut(usize::from(self.queue_select))
    }

    fn valid_vector(&self, v: u16) -> u16 {
        if v < self.msix_entries {
            v
        } else {
            VIRTIO_MSI_NO_VECTOR
        }
    }

    fn get(&self, field: u64, needs_reset: bool) -> u64 {
        let q = self.selected();
        match field {
            DEVICE_FEATURE_SELECT => u64::from(self.device_feature_select),
            DEVICE_FEATURE => match self.device_feature_select {
                0 => self.device_features & 0xffff_ffff,
                1 => self.device_features >> 32,
                _ => 0,
            },
            DRIVER_FEATURE_SELECT => u64::from(self.driver_feature_select),
            DRIVER_FEATURE => match self.driver_feature_select {
                0 => self.driver_features & 0xffff_ffff,
                1 => self.driver_features >> 32,
                _ => 0,
            },
            MSIX_CONFIG => u64::from(self.msix_config),
            NUM_QUEUES => self.queues.len() as u64,
            DEVICE_STATUS => {
                let extra = if needs_reset { DEVICE_NEEDS_RESET } else { 0 };
                u64::from(self.status | extra)
            }
            CONFIG_GENERATION => u64::from(self.config_generation),
            QUEUE_SELECT => u64::from(self.queue_select),
            // An absent queue reads as size 0: "not available".
            QUEUE_SIZE => q.map_or(0, |q| u64::from(q.size)),
            QUEUE_MSIX_VECTOR => q.map_or(u64::from(VIRTIO_MSI_NO_VECTOR), |q| {
                u64::from(q.msix_vector)
            }),
            QUEUE_ENABLE => q.map_or(0, |q| u64::from(q.ready)),
            QUEUE_NOTIFY_OFF => q.map_or(0, |_| u64::from(self.queue_select)),
            QUEUE_DESC => q.map_or(0, |q| q.desc),
            QUEUE_DRIVER => q.map_or(0, |q| q.driver),
            QUEUE_DEVICE => q.map_or(0, |q| q.device),
            _ => 0,
        }
    }

    /// `value` is the field's bytes (`write` masked it to the field's
    /// width); the masks below take the field's own type from it.
    fn set(&mut self, field: u64, value: u64) -> CommonCfgAction {
        let (v8, v16, v32) = (
            (value & 0xff) as u8,
            (value & 0xffff) as u16,
            (value & 0xffff_ffff) as u32,
        );
        match field {
            DEVICE_FEATURE_SELECT => self.device_feature_select = v32,
            DRIVER_FEATURE_SELECT => self.driver_feature_select = v32,
            // Features are frozen once FEATURES_OK was accepted.
            DRIVER_FEATURE if self.status & FEATURES_OK == 0 => {
                let v = value & 0xffff_ffff;
                match self.driver_feature_select {
                    0 => self.driver_features = (self.driver_features & !0xffff_ffff) | v,
                    1 => self.driver_features = (self.driver_features & 0xffff_ffff) | (v << 32),
                    _ => {}
                }
            }
            MSIX_CONFIG => {
                self.msix_config = self.valid_vector(v16);
                return CommonCfgAction::VectorsChanged;
            }
            DEVICE_STATUS => return self.set_status(v8),
            QUEUE_SELECT => self.queue_select = v16,
            QUEUE_SIZE => {
                let v = v16;
                if let Some(q) = self.selected_mut() {
                    if !q.ready && v.is_power_of_two() && v <= q.max_size {
                        q.size = v;
                    }
                }
            }
            QUEUE_MSIX_VECTOR => {
                let v = self.valid_vector(v16);
                if let Some(q) = self.queues.get_mut(usize::from(self.queue_select)) {
                    q.msix_vector = v;
                    return CommonCfgAction::VectorsChanged;
                }
            }
            // Only 1 may be written (a queue is disabled by reset).
            QUEUE_ENABLE if value == 1 => {
                if let Some(q) = self.selected_mut() {
                    q.ready = true;
                }
            }
            QUEUE_DESC | QUEUE_DRIVER | QUEUE_DEVICE => {
                if let Some(q) = self.selected_mut() {
                    if !q.ready {
                        match field {
                            QUEUE_DESC => q.desc = value,
                            QUEUE_DRIVER => q.driver = value,
                            _ => q.device = value,
                        }
                    }
                }
            }
            // Read-only fields.
            _ => {}
        }
        CommonCfgAction::None
    }

    fn features_acceptable(&self) -> bool {
        self.driver_features & !self.device_features == 0
            && self.driver_features & feature(VIRTIO_F_VERSION_1) != 0
    }

    fn set_status(&mut self, value: u8) -> CommonCfgAction {
        if value == 0 {
            self.reset();
            return CommonCfgAction::Reset;
        }
        let old = self.status;
        let mut new = value & !DEVICE_NEEDS_RESET;
        if new & FEATURES_OK != 0 && old & FEATURES_OK == 0 && !self.features_acceptable() {
            // The driver reads the status back and sees it was refused.
            new &= !FEATURES_OK;
        }
        if old & FEATURES_OK != 0 {
            // Bits are only cleared by a reset.
            new |= old;
        }
        self.status = new;
        if new & DRIVER_OK != 0 && old & DRIVER_OK == 0 && new & FEATURES_OK != 0 {
            return CommonCfgAction::Activate;
        }
        CommonCfgAction::None
    }

    fn field_at(offset: u64, len: usize) -> Option<(u64, usize)> {
        FIELDS
            .iter()
            .copied()
            .find(|(start, flen)| offset >= *start && offset + len as u64 <= *start + *flen as u64)
    }

    /// Guest read of `data.len()` bytes at `offset`. Accesses that do not
    /// fall inside one field read as 0.
    pub fn read(&self, offset: u64, data: &mut [u8], needs_reset: bool) {
        data.fill(0);
        let Some((start, _)) = Self::field_at(offset, data.len()) else {
            return;
        };
        let bytes = self.get(start, needs_reset).to_le_bytes();
        let shift = usize_from_u64(offset - start);
        if let Some(src) = bytes.get(shift..shift + data.len()) {
            data.copy_from_slice(src);
        }
    }

    /// Guest write of `data` at `offset`.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> CommonCfgAction {
        let Some((start, flen)) = Self::field_at(offset, data.len()) else {
            return CommonCfgAction::None;
        };
        let mut bytes = self.get(start, false).to_le_bytes();
        let shift = usize_from_u64(offset - start);
        let Some(dst) = bytes.get_mut(shift..shift + data.len()) else {
            return CommonCfgAction::None;
        };
        dst.copy_from_slice(data);
        let mut value = u64::from_le_bytes(bytes);
        if flen < 8 {
            value &= (1u64 << (flen * 8)) - 1;
        }
        self.set(start, value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::virtio::status::{ACKNOWLEDGE, DRIVER};

    const OFFERED: u64 = (1 << 32) | (1 << 5) | (1 << 29);

    fn cfg() -> CommonConfig {
        CommonConfig::new(OFFERED, &[256, 256], 3)
    }

    fn r32(c: &CommonConfig, off: u64) -> u32 {
        let mut d = [0u8; 4];
        c.read(off, &mut d, false);
        u32::from_le_bytes(d)
    }

    fn r16(c: &CommonConfig, off: u64) -> u16 {
        let mut d = [0u8; 2];
        c.read(off, &mut d, false);
        u16::from_le_bytes(d)
    }

    fn r8(c: &CommonConfig, off: u64) -> u8 {
        let mut d = [0u8; 1];
        c.read(off, &mut d, false);
        d[0]
    }

    fn negotiate(c: &mut CommonConfig, features: u64) -> CommonCfgAction {
        c.write(DEVICE_STATUS, &[ACKNOWLEDGE | DRIVER]);
        c.write(DRIVER_FEATURE_SELECT, &0u32.to_le_bytes());
        c.write(
            DRIVER_FEATURE,
            &((features & 0xffff_ffff) as u32).to_le_bytes(),
        );
        c.write(DRIVER_FEATURE_SELECT, &1u32.to_le_bytes());
        c.write(DRIVER_FEATURE, &((features >> 32) as u32).to_le_bytes());
        c.write(DEVICE_STATUS, &[ACKNOWLEDGE | DRIVER | FEATURES_OK])
    }

    #[test]
    fn device_features_by_select() {
        let mut c = cfg();
        assert_eq!(r32(&c, DEVICE_FEATURE), (OFFERED & 0xffff_ffff) as u32);
        c.write(DEVICE_FEATURE_SELECT, &1u32.to_le_bytes());
        assert_eq!(r32(&c, DEVICE_FEATURE), 1);
        c.write(DEVICE_FEATURE_SELECT, &7u32.to_le_bytes());
        assert_eq!(r32(&c, DEVICE_FEATURE), 0);
        assert_eq!(r16(&c, NUM_QUEUES), 2);
        // Read-only fields ignore writes.
        c.write(NUM_QUEUES, &9u16.to_le_bytes());
        assert_eq!(r16(&c, NUM_QUEUES), 2);
    }

    #[test]
    fn features_ok_needs_version_1_and_a_subset() {
        let mut c = cfg();
        negotiate(&mut c, 1 << 5);
        assert_eq!(r8(&c, DEVICE_STATUS) & FEATURES_OK, 0, "no VERSION_1");
        c.write(DEVICE_STATUS, &[0]);
        negotiate(&mut c, (1 << 32) | (1 << 6));
        assert_eq!(r8(&c, DEVICE_STATUS) & FEATURES_OK, 0, "not offered");
        c.write(DEVICE_STATUS, &[0]);
        negotiate(&mut c, (1 << 32) | (1 << 29));
        assert_ne!(r8(&c, DEVICE_STATUS) & FEATURES_OK, 0);
        assert_eq!(c.driver_features(), (1 << 32) | (1 << 29));
        // Frozen afterwards.
        c.write(DRIVER_FEATURE_SELECT, &0u32.to_le_bytes());
        c.write(DRIVER_FEATURE, &0u32.to_le_bytes());
        assert_eq!(c.driver_features(), (1 << 32) | (1 << 29));
    }

    #[test]
    fn driver_ok_activates_only_after_features_ok() {
        let mut c = cfg();
        c.write(DEVICE_STATUS, &[ACKNOWLEDGE | DRIVER]);
        assert_eq!(
            c.write(DEVICE_STATUS, &[ACKNOWLEDGE | DRIVER | DRIVER_OK]),
            CommonCfgAction::None
        );
        c.write(DEVICE_STATUS, &[0]);
        negotiate(&mut c, 1 << 32);
        assert_eq!(
            c.write(
                DEVICE_STATUS,
                &[ACKNOWLEDGE | DRIVER | FEATURES_OK | DRIVER_OK]
            ),
            CommonCfgAction::Activate
        );
        // The device-set bit shows up when the transport says so.
        let mut d = [0u8];
        c.read(DEVICE_STATUS, &mut d, true);
        assert_ne!(d[0] & DEVICE_NEEDS_RESET, 0);
        assert_eq!(c.write(DEVICE_STATUS, &[0]), CommonCfgAction::Reset);
        assert_eq!(r8(&c, DEVICE_STATUS), 0);
    }

    #[test]
    fn queue_registers_and_out_of_range_select() {
        let mut c = cfg();
        c.write(QUEUE_SELECT, &1u16.to_le_bytes());
        assert_eq!(r16(&c, QUEUE_SIZE), 256);
        c.write(QUEUE_SIZE, &64u16.to_le_bytes());
        assert_eq!(r16(&c, QUEUE_SIZE), 64);
        // Not a power of two / too big: ignored.
        c.write(QUEUE_SIZE, &100u16.to_le_bytes());
        c.write(QUEUE_SIZE, &512u16.to_le_bytes());
        assert_eq!(r16(&c, QUEUE_SIZE), 64);
        // 64-bit address written as two halves.
        c.write(QUEUE_DESC, &0x1234_5000u32.to_le_bytes());
        c.write(QUEUE_DESC + 4, &0x1u32.to_le_bytes());
        let mut d = [0u8; 8];
        c.read(QUEUE_DESC, &mut d, false);
        assert_eq!(u64::from_le_bytes(d), 0x1_1234_5000);
        assert_eq!(r16(&c, QUEUE_NOTIFY_OFF), 1);
        c.write(QUEUE_MSIX_VECTOR, &2u16.to_le_bytes());
        assert_eq!(r16(&c, QUEUE_MSIX_VECTOR), 2);
        // Vector beyond the MSI-X table: refused with NO_VECTOR.
        c.write(QUEUE_MSIX_VECTOR, &3u16.to_le_bytes());
        assert_eq!(r16(&c, QUEUE_MSIX_VECTOR), VIRTIO_MSI_NO_VECTOR);
        c.write(QUEUE_ENABLE, &1u16.to_le_bytes());
        assert_eq!(r16(&c, QUEUE_ENABLE), 1);
        // Enabled: addresses frozen.
        c.write(QUEUE_DESC, &0u32.to_le_bytes());
        assert_eq!(c.queues()[1].desc, 0x1_1234_5000);
        // Out-of-range queue: size 0, writes dropped, no panic.
        c.write(QUEUE_SELECT, &5u16.to_le_bytes());
        assert_eq!(r16(&c, QUEUE_SIZE), 0);
        assert_eq!(r16(&c, QUEUE_MSIX_VECTOR), VIRTIO_MSI_NO_VECTOR);
        c.write(QUEUE_SIZE, &16u16.to_le_bytes());
        c.write(QUEUE_ENABLE, &1u16.to_le_bytes());
        c.write(QUEUE_DESC, &0x5000u32.to_le_bytes());
        assert_eq!(r16(&c, QUEUE_ENABLE), 0);
        // Unaligned / straddling accesses are harmless.
        c.write(0x13, &[1, 2]);
        c.write(0x100, &[1]);
        let mut big = [0xffu8; 4];
        c.read(0x36, &mut big, false);
        assert_eq!(big, [0; 4]);
        // Reset restores queue state.
        c.write(DEVICE_STATUS, &[0]);
        assert_eq!(c.queues()[1], QueueRegs::new(256));
    }
}
