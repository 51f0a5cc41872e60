//! virtio-iommu device library.

pub mod events;
pub mod wire;
