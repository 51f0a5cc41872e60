//! virtio-iommu device library.

#![deny(missing_docs)]

pub mod barrier;
pub mod baseline;
pub mod counters;
pub mod device;
pub(crate) mod domain;
pub(crate) mod endpoint;
pub mod events;
pub mod invalidation;
pub mod locks;
pub mod magazine;
pub mod mapping;
pub mod mutation;
pub mod node;
pub mod pgtable;
pub mod quiesce;
pub mod space;
pub mod table;
pub mod translate;
pub mod wire;
