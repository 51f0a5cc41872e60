//! virtio-iommu device library.

pub mod events;
pub mod wire;
pub mod baseline;
pub mod invalidation;
pub mod magazine;
pub mod mapping;
pub mod table;
