//! `--net tap=NAME,mac=..,ip=..,mask=..,num_queues=..,queue_size=..,iommu=on|off`
//! and `--net vhost_user=on,socket=PATH,vhost_mode=client|server,mac=..,
//! num_queues=..,queue_size=..,iommu=on|off` (cloud-hypervisor's syntax for
//! the supported subset).

use std::net::Ipv4Addr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{Error, OptionReason};
use crate::options::parse_options;

/// Largest number of queue pairs accepted.
pub const MAX_QUEUE_PAIRS: usize = 16;

/// One virtio-net device on a TAP back-end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetConfig {
    /// TAP interface name (created if missing; empty: the kernel picks).
    pub tap: String,
    /// Guest MAC address.
    pub mac: [u8; 6],
    /// Host-side IPv4 address of the TAP.
    pub ip: Option<Ipv4Addr>,
    /// Host-side netmask of the TAP.
    pub mask: Option<Ipv4Addr>,
    /// Number of virtqueues for data: 2 per queue pair.
    pub num_queues: usize,
    /// Size of each virtqueue.
    pub queue_size: u16,
    /// The device sits behind the virtual IOMMU.
    pub iommu: bool,
    /// `vhost_user=on,socket=PATH`: the data path is a vhost-user back-end
    /// listening on PATH instead of a TAP served by the VMM.
    pub vhost_user_socket: Option<PathBuf>,
    /// `vhost_mode=server`: dmavisor listens on the socket and the
    /// back-end connects (DPDK's `client=1`); by default dmavisor connects.
    pub vhost_server: bool,
    /// The name `vm.remove-device` knows it by (cloud-hypervisor's `id`).
    pub id: Option<String>,
}

fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for b in mac.iter_mut() {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some(mac)
}

/// One entry of `net` in cloud-hypervisor's `VmConfig`: what the API's
/// `vm.create` takes and `vm.info` prints. `--net` fills the same struct,
/// so both are checked by [`NetConfig::from_spec`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetSpec {
    /// TAP name (empty or absent: the kernel picks).
    #[serde(default)]
    pub tap: Option<String>,
    /// Guest MAC, `12:34:56:78:9a:bc`.
    #[serde(default)]
    pub mac: Option<String>,
    /// Host-side IPv4 address.
    #[serde(default)]
    pub ip: Option<String>,
    /// Host-side netmask.
    #[serde(default)]
    pub mask: Option<String>,
    /// Data virtqueues (2 per pair).
    #[serde(default)]
    pub num_queues: Option<u64>,
    /// Size of each virtqueue.
    #[serde(default)]
    pub queue_size: Option<u64>,
    /// Behind the vIOMMU.
    #[serde(default)]
    pub iommu: bool,
    /// A vhost-user back-end serves the data path.
    #[serde(default)]
    pub vhost_user: bool,
    /// The back-end's socket.
    #[serde(default)]
    pub vhost_socket: Option<PathBuf>,
    /// `Client` (dmavisor connects, the default) or `Server`.
    #[serde(default)]
    pub vhost_mode: Option<String>,
    /// The device's name for `vm.remove-device`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// Why a [`NetSpec`] is refused.
#[derive(Debug, thiserror::Error)]
pub enum NetSpecError {
    /// The TAP name does not fit IFNAMSIZ.
    #[error("tap name '{tap}' is longer than 15 bytes")]
    TapName {
        /// The name given.
        tap: String,
    },
    /// `mac` does not parse.
    #[error("'{mac}' is not a MAC address")]
    Mac {
        /// The text given.
        mac: String,
    },
    /// The MAC address has the group bit set.
    #[error("the MAC address is a multicast address")]
    Multicast,
    /// `ip` or `mask` does not parse.
    #[error("{key} '{text}' is not an IPv4 address")]
    Ipv4 {
        /// `ip` or `mask`.
        key: &'static str,
        /// The text given.
        text: String,
    },
    /// `num_queues` odd or out of range.
    #[error("num_queues must be an even number between 2 and {}", 2 * MAX_QUEUE_PAIRS)]
    NumQueues,
    /// `queue_size` not a power of two in range.
    #[error("queue_size must be a power of two up to 32768")]
    QueueSize,
    /// `vhost_mode` server on a TAP device.
    #[error("vhost_mode server needs vhost_user")]
    ServerWithoutVhostUser,
    /// `vhost_mode` neither client nor server.
    #[error("vhost_mode must be client or server, not '{mode}'")]
    VhostMode {
        /// The text given.
        mode: String,
    },
    /// vhost-user without a socket.
    #[error("vhost_user needs a socket path")]
    NoSocket,
    /// A TAP setting on a vhost-user device.
    #[error("{key} belongs to a TAP, not to vhost_user")]
    TapKeyWithVhostUser {
        /// `tap`, `ip` or `mask`.
        key: &'static str,
    },
    /// A socket on a TAP device.
    #[error("a vhost-user socket needs vhost_user on")]
    SocketWithoutVhostUser,
}

impl NetConfig {
    /// Parses and validates one `--net` value.
    pub fn parse(value: &str) -> Result<Self, Error> {
        let opts = parse_options(
            "net",
            value,
            &[
                "tap",
                "mac",
                "ip",
                "mask",
                "num_queues",
                "queue_size",
                "iommu",
                "vhost_user",
                "socket",
                "vhost_mode",
            ],
        )?;
        let bad = |reason: OptionReason| Error::InvalidOption {
            option: "net",
            value: value.to_string(),
            reason,
        };
        let number = |key: &str| -> Result<Option<u64>, Error> {
            opts.get(key)
                .map(|t| {
                    t.parse::<u64>()
                        .map_err(|_| bad(format!("{key} '{t}' is not a number").into()))
                })
                .transpose()
        };
        let iommu = match opts.get("iommu").map(String::as_str) {
            None | Some("off") => false,
            Some("on") => true,
            Some(o) => return Err(bad(format!("iommu must be on or off, not '{o}'").into())),
        };
        let vhost_user = match opts.get("vhost_user").map(String::as_str) {
            None | Some("off") | Some("false") => false,
            Some("on") | Some("true") => true,
            Some(o) => {
                return Err(bad(
                    format!("vhost_user must be on or off, not '{o}'").into()
                ))
            }
        };
        let spec = NetSpec {
            tap: opts.get("tap").cloned(),
            mac: opts.get("mac").cloned(),
            ip: opts.get("ip").cloned(),
            mask: opts.get("mask").cloned(),
            num_queues: number("num_queues")?,
            queue_size: number("queue_size")?,
            iommu,
            vhost_user,
            vhost_socket: opts.get("socket").map(PathBuf::from),
            vhost_mode: opts.get("vhost_mode").cloned(),
            id: None,
        };
        Self::from_spec(&spec).map_err(|e| bad(e.into()))
    }

    /// Checks a network device description from the command line or the API.
    pub fn from_spec(spec: &NetSpec) -> Result<Self, NetSpecError> {
        let tap = spec.tap.clone().unwrap_or_default();
        if tap.len() >= 16 {
            return Err(NetSpecError::TapName { tap });
        }
        let mac = match &spec.mac {
            Some(m) => parse_mac(m).ok_or_else(|| NetSpecError::Mac { mac: m.clone() })?,
            // Locally administered, fixed so guest-side tests are stable.
            None => [0x52, 0x54, 0x00, 0x12, 0x34, 0x56],
        };
        if mac[0] & 1 != 0 {
            return Err(NetSpecError::Multicast);
        }
        let ipv4 =
            |key: &'static str, v: &Option<String>| -> Result<Option<Ipv4Addr>, NetSpecError> {
                v.as_ref()
                    .map(|t| {
                        t.parse::<Ipv4Addr>().map_err(|_| NetSpecError::Ipv4 {
                            key,
                            text: t.clone(),
                        })
                    })
                    .transpose()
            };
        let ip = ipv4("ip", &spec.ip)?;
        let mask = ipv4("mask", &spec.mask)?;
        let num_queues = usize::try_from(spec.num_queues.unwrap_or(2))
            .ok()
            .filter(|&n| n >= 2 && n & 1 == 0 && n / 2 <= MAX_QUEUE_PAIRS)
            .ok_or(NetSpecError::NumQueues)?;
        let queue_size = u16::try_from(spec.queue_size.unwrap_or(256))
            .ok()
            .filter(|q| q.is_power_of_two() && (2..=32768).contains(q))
            .ok_or(NetSpecError::QueueSize)?;
        let vhost_server = match spec.vhost_mode.as_deref() {
            None | Some("client") | Some("Client") => false,
            Some("server") | Some("Server") if spec.vhost_user => true,
            Some("server") | Some("Server") => return Err(NetSpecError::ServerWithoutVhostUser),
            Some(m) => return Err(NetSpecError::VhostMode { mode: m.into() }),
        };
        let vhost_user_socket = if spec.vhost_user {
            let socket = spec
                .vhost_socket
                .as_ref()
                .filter(|s| !s.as_os_str().is_empty())
                .ok_or(NetSpecError::NoSocket)?;
            let tap_keys = [
                ("tap", !tap.is_empty()),
                ("ip", ip.is_some()),
                ("mask", mask.is_some()),
            ];
            if let Some((k, _)) = tap_keys.iter().find(|(_, given)| *given) {
                return Err(NetSpecError::TapKeyWithVhostUser { key: k });
            }
            Some(socket.clone())
        } else {
            if spec.vhost_socket.is_some() {
                return Err(NetSpecError::SocketWithoutVhostUser);
            }
            None
        };
        Ok(Self {
            tap,
            mac,
            ip,
            mask,
            num_queues,
            queue_size,
            iommu: spec.iommu,
            vhost_user_socket,
            vhost_server,
            id: spec.id.clone(),
        })
    }

    /// The description [`NetConfig::from_spec`] turns back into `self`.
    pub fn to_spec(&self) -> NetSpec {
        NetSpec {
            tap: Some(self.tap.clone()),
            mac: Some(self.mac.map(|b| format!("{b:02x}")).join(":")),
            ip: self.ip.map(|a| a.to_string()),
            mask: self.mask.map(|a| a.to_string()),
            num_queues: Some(self.num_queues as u64),
            queue_size: Some(self.queue_size.into()),
            iommu: self.iommu,
            vhost_user: self.vhost_user_socket.is_some(),
            vhost_socket: self.vhost_user_socket.clone(),
            vhost_mode: Some(
                if self.vhost_server {
                    "Server"
                } else {
                    "Client"
                }
                .into(),
            ),
            id: self.id.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_and_default() {
        let c = NetConfig::parse(
            "tap=dmv0,mac=12:34:56:78:9a:bc,ip=192.168.249.1,mask=255.255.255.0,num_queues=4,iommu=on",
        )
        .unwrap();
        assert_eq!(c.tap, "dmv0");
        assert_eq!(c.mac, [0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc]);
        assert_eq!(c.ip, Some(Ipv4Addr::new(192, 168, 249, 1)));
        assert_eq!(c.mask, Some(Ipv4Addr::new(255, 255, 255, 0)));
        assert_eq!(c.num_queues, 4);
        assert!(c.iommu);
        let d = NetConfig::parse("tap=x").unwrap();
        assert_eq!(d.num_queues, 2);
        assert_eq!(d.queue_size, 256);
        assert!(!d.iommu);
    }

    #[test]
    fn rejects_bad_values() {
        for v in [
            "mac=12:34:56",
            "mac=13:00:00:00:00:00",
            "ip=1.2.3",
            "num_queues=3",
            "num_queues=0",
            "num_queues=64",
            "queue_size=100",
            "iommu=yes",
            "tap=0123456789abcdef",
            "vhost=on",
            "vhost_user=on",
            "vhost_user=on,socket=",
            "vhost_user=on,socket=/s,tap=t",
            "vhost_user=on,socket=/s,vhost_mode=listen",
            "vhost_user=on,socket=/s,num_queues=5",
            "vhost_user=maybe,socket=/s",
            "socket=/s",
        ] {
            assert!(NetConfig::parse(v).is_err(), "{v}");
        }
    }

    #[test]
    fn vhost_user_as_cloud_hypervisor_spells_it() {
        for v in [
            "vhost_user=true,socket=/run/vu.sock",
            "vhost_user=on,socket=/run/vu.sock,vhost_mode=client,queue_size=512",
        ] {
            let c = NetConfig::parse(v).unwrap();
            assert_eq!(
                c.vhost_user_socket,
                Some(PathBuf::from("/run/vu.sock")),
                "{v}"
            );
            assert_eq!(c.num_queues, 2);
        }
        let mq = NetConfig::parse("vhost_user=on,socket=/s,num_queues=4").unwrap();
        assert_eq!(mq.num_queues, 4);
        assert!(!mq.vhost_server);
        let server = NetConfig::parse("vhost_user=on,socket=/s,vhost_mode=server").unwrap();
        assert!(server.vhost_server);
        assert_eq!(NetConfig::parse("tap=t").unwrap().vhost_user_socket, None);
    }
}
