//! Host-side configuration of an [`IommuDevice`](super::IommuDevice) and its
//! validation.
//!
//! WHY validated up front: every value here ends up in the config space or in
//! a limit the guest pushes against; rejecting a nonsensical configuration at
//! construction keeps the request path free of "impossible" cases.

use thiserror::Error;

use crate::mapping::{SpaceImpl, IOVA_MAX, PAGE_SIZE};
use crate::wire::{ResvMem, PAGE_TABLE_FMT_PROP_SIZE, RESV_MEM_PROP_SIZE, RESV_MEM_T_MSI};

/// Start of the x86 MSI doorbell window (LAPIC interrupt address range).
pub const X86_MSI_START: u64 = 0xfee0_0000;
/// Inclusive end of the x86 MSI doorbell window.
pub const X86_MSI_END: u64 = 0xfeef_ffff;

/// Default page sizes: the table's 4 KiB granule, every larger power of two
/// as an efficiency hint (2 MiB mappings use large entries).
pub const DEFAULT_PAGE_SIZE_MASK: u64 = !(PAGE_SIZE - 1);
/// Default PROBE property buffer size (room for 21 RESV_MEM properties).
pub const DEFAULT_PROBE_SIZE: u32 = 512;

/// Bounds on everything a guest can make the device allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Live domains at once (ATTACH creating one more => S_NOMEM).
    pub max_domains: u32,
    /// Endpoints the host may register.
    pub max_endpoints: u32,
    /// Mappings per domain (MAP beyond => S_NOMEM).
    pub max_mappings_per_domain: u64,
    /// Table memory per domain in bytes (MAP beyond => S_NOMEM).
    pub max_table_bytes_per_domain: u64,
}

impl Default for DeviceLimits {
    fn default() -> Self {
        Self {
            max_domains: 1024,
            max_endpoints: 4096,
            max_mappings_per_domain: 1 << 20,
            max_table_bytes_per_domain: 256 << 20,
        }
    }
}

/// Everything the host decides about the device.
#[derive(Debug, Clone)]
pub struct IommuConfig {
    /// Supported page sizes; the lowest set bit is the mapping granule.
    pub page_size_mask: u64,
    /// Inclusive IOVA range the device translates.
    pub input_start: u64,
    /// Last IOVA the device translates (inclusive).
    pub input_end: u64,
    /// Inclusive range of valid domain IDs.
    pub domain_start: u32,
    /// Last valid domain ID (inclusive).
    pub domain_end: u32,
    /// Bytes of PROBE properties; 0 means PROBE is not offered.
    pub probe_size: u32,
    /// Report the x86 MSI window 0xfee00000-0xfeefffff as an MSI region and
    /// refuse MAPs over it.
    pub x86_msi_window: bool,
    /// Reserved regions reported for every endpoint (and refused for MAP).
    pub reserved: Vec<ResvMem>,
    /// Initial value of the `bypass` config field (unattached endpoints
    /// translate by identity when set). Kept across device reset, restored
    /// only by [`IommuDevice::system_reset`](super::IommuDevice::system_reset).
    pub bypass: bool,
    /// Bounds on the state a guest can make the device keep.
    pub limits: DeviceLimits,
    /// Which domain-table implementation backs MAP/UNMAP.
    pub space_impl: SpaceImpl,
    /// Request queues offered when the multi-queue feature is negotiated;
    /// 1 means the standard single-queue device.
    pub num_request_queues: u16,
    /// Offer the project page-table feature (docs/page-table.md); walks
    /// need guest memory, given with
    /// [`IommuDevice::set_table_memory`](super::IommuDevice::set_table_memory).
    pub page_table: bool,
    /// Pending fault events kept for the event queue.
    pub fault_queue_capacity: usize,
    /// Fault log lines per second.
    pub fault_logs_per_sec: u32,
}

impl Default for IommuConfig {
    fn default() -> Self {
        Self {
            page_size_mask: DEFAULT_PAGE_SIZE_MASK,
            input_start: 0,
            input_end: IOVA_MAX,
            domain_start: 0,
            domain_end: u32::MAX,
            probe_size: DEFAULT_PROBE_SIZE,
            x86_msi_window: true,
            reserved: Vec::new(),
            bypass: false,
            limits: DeviceLimits::default(),
            space_impl: SpaceImpl::Scalable,
            num_request_queues: 1,
            page_table: false,
            fault_queue_capacity: crate::events::DEFAULT_FAULT_QUEUE_CAPACITY,
            fault_logs_per_sec: crate::events::DEFAULT_FAULT_LOGS_PER_SEC,
        }
    }
}

/// Host-side configuration mistakes (never caused by the guest).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// No page size offered.
    #[error("page_size_mask must have at least one bit set")]
    EmptyPageSizeMask,
    /// The granule is below what the domain table can map.
    #[error("granule {0:#x} is smaller than the table's page size")]
    GranuleTooSmall(u64),
    /// The IOVA range is empty or outside the domain table's.
    #[error("input range {0:#x}-{1:#x} is empty or exceeds the table's IOVA space")]
    InputRange(u64, u64),
    /// The first domain ID is above the last.
    #[error("domain range start {0} > end {1}")]
    DomainRange(u32, u32),
    /// A reserved region ends before it starts.
    #[error("reserved region {0:#x}-{1:#x} has start > end")]
    BadReservedRegion(u64, u64),
    /// The reserved regions' properties do not fit in `probe_size`.
    #[error("probe_size {have} cannot hold the {need} bytes of properties")]
    ProbeTooSmall {
        /// Bytes the properties take.
        need: usize,
        /// `probe_size`.
        have: u32,
    },
    /// No request queue.
    #[error("num_request_queues must be at least 1")]
    NoQueues,
    /// One of the [`DeviceLimits`] is zero.
    #[error("a limit is zero")]
    ZeroLimit,
}

impl IommuConfig {
    /// The mapping granule: the lowest page size offered.
    pub fn granule(&self) -> u64 {
        // Callers only see validated configs where the mask is non-zero.
        1u64 << self.page_size_mask.trailing_zeros().min(63)
    }

    /// Regions reported for every endpoint, MSI window first.
    pub fn global_resv(&self) -> Vec<ResvMem> {
        let mut v = Vec::with_capacity(self.reserved.len().saturating_add(1));
        if self.x86_msi_window {
            v.push(ResvMem {
                subtype: RESV_MEM_T_MSI,
                start: X86_MSI_START,
                end: X86_MSI_END,
            });
        }
        v.extend_from_slice(&self.reserved);
        v
    }

    /// Checks a region list (global or per endpoint).
    pub fn check_regions(&self, regions: &[ResvMem]) -> Result<(), ConfigError> {
        for r in regions {
            if r.start > r.end {
                return Err(ConfigError::BadReservedRegion(r.start, r.end));
            }
        }
        Ok(())
    }

    /// Checks that `extra` per-endpoint regions plus the global ones fit in
    /// probe_size (when PROBE is offered).
    pub fn check_probe_fits(&self, extra: usize) -> Result<(), ConfigError> {
        if self.probe_size == 0 {
            return Ok(());
        }
        let n = self.global_resv().len().saturating_add(extra);
        let fmt = if self.page_table {
            PAGE_TABLE_FMT_PROP_SIZE
        } else {
            0
        };
        let need = n.saturating_mul(RESV_MEM_PROP_SIZE).saturating_add(fmt);
        if need > self.probe_size as usize {
            return Err(ConfigError::ProbeTooSmall {
                need,
                have: self.probe_size,
            });
        }
        Ok(())
    }

    /// Checks the configuration before a device is built from it.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.page_size_mask == 0 {
            return Err(ConfigError::EmptyPageSizeMask);
        }
        if self.granule() < PAGE_SIZE {
            return Err(ConfigError::GranuleTooSmall(self.granule()));
        }
        if self.input_start > self.input_end || self.input_end > IOVA_MAX {
            return Err(ConfigError::InputRange(self.input_start, self.input_end));
        }
        if self.domain_start > self.domain_end {
            return Err(ConfigError::DomainRange(self.domain_start, self.domain_end));
        }
        if self.num_request_queues == 0 {
            return Err(ConfigError::NoQueues);
        }
        let l = &self.limits;
        if l.max_domains == 0
            || l.max_endpoints == 0
            || l.max_mappings_per_domain == 0
            || l.max_table_bytes_per_domain == 0
        {
            return Err(ConfigError::ZeroLimit);
        }
        self.check_regions(&self.reserved)?;
        self.check_probe_fits(0)
    }
}
