//! virtio-iommu device library.

pub mod wire;
