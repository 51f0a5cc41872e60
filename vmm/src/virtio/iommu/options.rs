//! `--iommu [impl=scalable|baseline][,bypass=on|off][,queues=N][,requests=auto|inline|thread]`
//! and the `iommu=on|off`
//! key shared by the devices that can sit behind it.

use serde::{Deserialize, Serialize};
use virtio_iommu::mapping::SpaceImpl;

use crate::error::{Error, OptionReason};
use crate::options::{parse_on_off, parse_options};

/// Host choices for the virtio-iommu device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IommuOptions {
    /// Domain-table implementation (the project's scalable one, or the
    /// locked baseline kept for comparison).
    pub space_impl: SpaceImpl,
    /// Initial `bypass` config field: unattached endpoints DMA untranslated
    /// (on) or are blocked (off, the default: nothing reaches memory before
    /// the guest driver attached the endpoint).
    pub bypass: bool,
    /// Request queues offered behind the project's multi-queue feature
    /// (1 = the standard single-queue device).
    pub queues: u16,
    /// Who serves the request queues: the vCPU that kicked (inline), one
    /// thread per queue woken through an ioeventfd, or (the default) the
    /// one that suits the number of queues the driver uses.
    pub requests: RequestServing,
}

/// Who serves a request queue when the driver kicks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestServing {
    /// Decided when the driver starts the device: inline if it uses one
    /// request queue (the standard device, as Linux's in-tree driver
    /// negotiates it), threads if it uses several.
    ///
    /// Why inline for one queue: a driver that spins on its request with
    /// interrupts off (Linux's `viommu_sync_req`) keeps its CPU busy, and
    /// the scheduler tends to wake the queue's thread on the kicking
    /// vCPU's own CPU (the waker's), where it waits for that vCPU's time
    /// slice to end. In the nested runner (2026-11-26) that cost about a
    /// timer tick per request: with Linux's driver, strict, 1 vCPU,
    /// map+unmap ran at 124/s served by a thread and at 831/s inline, TCP
    /// into the guest at 0.6 and 6.6 Mbit/s (medians of two runs each, two
    /// sessions). Why threads for several: they serve the queues in
    /// parallel, while inline serving holds the transport's lock.
    Auto,
    /// The kicking vCPU's thread, before it re-enters the guest: a strict
    /// guest that spins on its UNMAP with interrupts off finds the answer
    /// on its first look (no thread wake-up on the critical path). The
    /// device's queues share the transport's lock.
    Inline,
    /// A thread per request queue, woken by an ioeventfd: queues are served
    /// in parallel, and the vCPU returns to the guest at once.
    Thread,
}

impl RequestServing {
    /// Whether the driver's `queues_in_use` request queues are served
    /// inline.
    pub fn inline_for(self, queues_in_use: u16) -> bool {
        match self {
            RequestServing::Auto => queues_in_use <= 1,
            RequestServing::Inline => true,
            RequestServing::Thread => false,
        }
    }

    /// The `requests=` word for this choice.
    pub fn name(self) -> &'static str {
        match self {
            RequestServing::Auto => "auto",
            RequestServing::Inline => "inline",
            RequestServing::Thread => "thread",
        }
    }
}

/// Most request queues `queues=` accepts.
pub const MAX_REQUEST_QUEUES: u16 = 64;

impl Default for IommuOptions {
    fn default() -> Self {
        Self {
            space_impl: SpaceImpl::Scalable,
            bypass: false,
            queues: 1,
            requests: RequestServing::Auto,
        }
    }
}

/// The vIOMMU's options as `vm.create` takes them and `vm.info` prints
/// them (`iommu_config`, dmavisor's addition to cloud-hypervisor's
/// `VmConfig`, whose `iommu: true` alone means the defaults). `--iommu`
/// fills the same struct, checked by [`IommuOptions::from_spec`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IommuSpec {
    /// `scalable` or `baseline`.
    #[serde(default, rename = "impl")]
    pub space_impl: Option<String>,
    /// Unattached endpoints bypass translation.
    #[serde(default)]
    pub bypass: bool,
    /// Request queues.
    #[serde(default)]
    pub queues: Option<u64>,
    /// `auto`, `thread` or `inline`.
    #[serde(default)]
    pub requests: Option<String>,
}

/// Why an [`IommuSpec`] is refused.
#[derive(Debug, thiserror::Error)]
pub enum IommuSpecError {
    /// `impl` names no implementation.
    #[error(transparent)]
    SpaceImpl(#[from] virtio_iommu::mapping::UnknownSpaceImpl),
    /// `queues` out of range.
    #[error("queues must be 1..={MAX_REQUEST_QUEUES}, not '{queues}'")]
    Queues {
        /// The number given.
        queues: u64,
    },
    /// `requests` is not `auto`, `inline` or `thread`.
    #[error("requests must be auto, inline or thread, not '{requests}'")]
    Requests {
        /// The text given.
        requests: String,
    },
}

impl IommuOptions {
    /// Parses `--iommu`; an empty value means the defaults.
    pub fn parse(value: &str) -> Result<Self, Error> {
        let opts = parse_options("iommu", value, &["impl", "bypass", "queues", "requests"])?;
        let bad = |reason: OptionReason| Error::InvalidOption {
            option: "iommu",
            value: value.to_string(),
            reason,
        };
        let bypass = match opts.get("bypass") {
            Some(b) => parse_on_off("iommu", value, "bypass", b)?,
            None => false,
        };
        let queues = match opts.get("queues") {
            Some(q) => Some(q.parse::<u64>().map_err(|_| {
                bad(format!("queues must be 1..={MAX_REQUEST_QUEUES}, not '{q}'").into())
            })?),
            None => None,
        };
        let spec = IommuSpec {
            space_impl: opts.get("impl").cloned(),
            bypass,
            queues,
            requests: opts.get("requests").cloned(),
        };
        Self::from_spec(&spec).map_err(|e| bad(e.into()))
    }

    /// Checks vIOMMU options from the command line or the API.
    pub fn from_spec(spec: &IommuSpec) -> Result<Self, IommuSpecError> {
        let mut o = Self {
            bypass: spec.bypass,
            ..Self::default()
        };
        if let Some(i) = &spec.space_impl {
            o.space_impl = i.parse()?;
        }
        if let Some(q) = spec.queues {
            o.queues = u16::try_from(q)
                .ok()
                .filter(|n| (1..=MAX_REQUEST_QUEUES).contains(n))
                .ok_or(IommuSpecError::Queues { queues: q })?;
        }
        if let Some(r) = &spec.requests {
            o.requests = match r.as_str() {
                "auto" => RequestServing::Auto,
                "inline" => RequestServing::Inline,
                "thread" => RequestServing::Thread,
                other => {
                    return Err(IommuSpecError::Requests {
                        requests: other.into(),
                    })
                }
            };
        }
        Ok(o)
    }

    /// The description [`IommuOptions::from_spec`] turns back into `self`.
    pub fn to_spec(&self) -> IommuSpec {
        IommuSpec {
            space_impl: Some(self.space_impl.to_string()),
            bypass: self.bypass,
            queues: Some(self.queues.into()),
            requests: Some(self.requests.name().into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_impl_and_bypass() {
        assert_eq!(IommuOptions::parse("").unwrap(), IommuOptions::default());
        let o = IommuOptions::parse("impl=baseline,bypass=on").unwrap();
        assert_eq!(o.space_impl, SpaceImpl::Baseline);
        assert!(o.bypass);
        assert_eq!(
            IommuOptions::parse("impl=scalable").unwrap().space_impl,
            SpaceImpl::Scalable
        );
        assert!(IommuOptions::parse("impl=fast").is_err());
        assert!(IommuOptions::parse("bypass=yes").is_err());
        assert_eq!(IommuOptions::parse("queues=4").unwrap().queues, 4);
        assert!(IommuOptions::parse("queues=0").is_err());
        assert!(IommuOptions::parse("queues=65").is_err());
        assert!(IommuOptions::parse("cache=1").is_err());
        assert_eq!(
            IommuOptions::parse("requests=inline").unwrap().requests,
            RequestServing::Inline
        );
        assert_eq!(
            IommuOptions::parse("queues=4").unwrap().requests,
            RequestServing::Auto
        );
        assert_eq!(
            IommuOptions::parse("requests=thread").unwrap().requests,
            RequestServing::Thread
        );
        // auto: inline for a driver on one queue, threads for several
        assert!(RequestServing::Auto.inline_for(1));
        assert!(!RequestServing::Auto.inline_for(4));
        assert!(RequestServing::Inline.inline_for(4));
        assert!(!RequestServing::Thread.inline_for(1));
        assert!(IommuOptions::parse("requests=vcpu").is_err());
    }
}
