//! vhost-user front-ends: devices whose data path runs in another process.
//!
//! - [`client`]: the protocol's framing, file descriptors and replies.
//! - [`net`]: virtio-net on a vhost-user-net back-end.
//! - [`iotlb`]: the back-end's device IOTLB behind the vIOMMU.
//! - [`calls`]: the thread that turns the back-end's calls into the
//!   transport's interrupts and notices a back-end that went away.
//! - [`ctrl`]: the control queue of a multi-queue device, served here.
//! - [`writer`]: the front-end channel's writing half, shared with the
//!   miss thread so an UPDATE never waits for someone's reply.
//! - [`order`]: UPDATEs against INVALIDATEs (a stale UPDATE is dropped).
//! - [`stop`]: stopping a back-end that failed an invalidation.

#[cfg(test)]
mod bus_master_tests;
pub mod calls;
pub mod client;
pub mod ctrl;
pub mod iotlb;
pub mod net;
pub mod order;
#[cfg(test)]
mod reconnect_tests;
pub mod stop;
pub mod writer;

pub use net::{VhostUserNet, VhostUserNetError};
