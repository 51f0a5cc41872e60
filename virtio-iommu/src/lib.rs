//! virtio-iommu device library.

pub mod baseline;
pub mod counters;
pub mod device;
pub mod events;
pub mod invalidation;
pub mod magazine;
pub mod mapping;
pub mod quiesce;
pub mod table;
pub mod translate;
pub mod wire;
