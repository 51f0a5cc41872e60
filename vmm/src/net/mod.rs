//! virtio-net on a TAP back-end (a vhost-user back-end lives in
//! [`crate::vhost_user`]; both are created by [`crate::net_devices`]).
//!
//! - [`config`]: the `--net` option.
//! - [`tap`]: TAP interface setup through ioctls.
//! - [`passed_taps`]: TAP queues a client passed before the VM was built.
//! - [`device`]: the [`VirtioDevice`](crate::virtio::VirtioDevice) (features,
//!   config space, one worker per queue pair).
//! - [`worker`]: the receive/transmit loop of one queue pair.
//! - [`rx`]: the receive buffers a pair holds, and how a frame reaches them.
//! - [`tx`]: transmit chains gathered into frames for the TAP.
//! - [`iov`]: guest buffers as host iovecs for the TAP's `readv`/`writev`.
//! - [`queue`]: a queue as a thread owns it, and the ring steps they share.
//! - [`ctrl`]: the control queue, served by the VMM for both kinds of device.

pub mod config;
pub mod ctrl;
pub mod device;
pub mod iov;
pub mod passed_taps;
pub mod queue;
pub mod rx;
pub mod tap;
pub mod tx;
pub mod worker;

pub use config::NetConfig;
pub use device::{Net, NetError};
