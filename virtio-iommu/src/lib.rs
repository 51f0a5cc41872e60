//! virtio-iommu device library.
