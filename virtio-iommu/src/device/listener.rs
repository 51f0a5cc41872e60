//! Endpoint attachment notifications for DMA consumers that cache per
//! endpoint.
//!
//! WHY: `mapping::Invalidator` is keyed by domain, which covers UNMAP and
//! domain teardown. When an endpoint moves out of a domain that lives on
//! (other endpoints remain), nothing is unmapped, yet a consumer serving that
//! endpoint (a vhost-user IOTLB, a VFIO container following its device) must
//! drop what it cached from the old domain before the ATTACH/DETACH completes
//! (see docs/multiqueue.md, "Device requirements"). This hook tells it.

/// Told about every change of an endpoint's domain.
pub trait EndpointListener: Send + Sync {
    /// `endpoint` left domain `from` (None: was unattached) and is now in
    /// `to` (None: unattached, i.e. bypass or blocked per the `bypass`
    /// field). Called synchronously while the request that caused it is
    /// being handled, before its completion can be published, with the
    /// device's topology lock held: the listener must not send requests to
    /// the device or call its attach/detach/reset paths.
    fn endpoint_moved(&self, endpoint: u32, from: Option<u32>, to: Option<u32>);
}
