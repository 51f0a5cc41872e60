//! virtio-net and virtio-blk devices made while the guest runs
//! (`vm.add-net`, `vm.add-disk`): built as `--net` and `--disk` build
//! them at boot, then handed to the VM's hotplug list
//! ([`VfioHotplug::add_virtio`]), which plugs them into a free slot over
//! ACPI PCI hotplug, behind the vIOMMU when asked, and removes them when
//! the guest ejects them.
//!
//! WHY a module of its own: it sits above `net`, `block` and `vfio`
//! (whose hotplug list keeps every hotplugged function), so none of those
//! needs to know the others.
//!
//! A NIC comes on a TAP named in its configuration (created if missing,
//! as `--net tap=` does) or on TAP queues the client opened and passed
//! with `SCM_RIGHTS` on the request (`ch-remote add-net fd=[..]`,
//! libvirt): one per queue pair; then `tap` names the interface they
//! belong to, for `vm.info`, and the queues are kept
//! ([`passed_taps`]) until the NIC is removed or the VM deleted, so a
//! rebuilt VM gets them again. vhost-user devices cannot be hotplugged.

use std::fs::File;

use crate::block::{Block, DiskConfig, DiskImage};
use crate::net::passed_taps;
use crate::net::{Net, NetConfig};
use crate::pci::PciAddress;
use crate::vfio::hotplug::{HotplugError, VfioHotplug, VirtioConfig};

/// Adds a virtio-net device described by `cfg` (its TAP opened by name,
/// or the passed `fds`, one per queue pair) as `id` (or `_net<N>`).
pub fn add_net(
    hotplug: &VfioHotplug,
    id: Option<String>,
    mut cfg: NetConfig,
    fds: Vec<File>,
) -> Result<(String, PciAddress), HotplugError> {
    if cfg.vhost_user_socket.is_some() {
        return Err(HotplugError::Refused(
            "vm.add-net: vhost-user devices cannot be hotplugged".into(),
        ));
    }
    let net = if fds.is_empty() {
        Net::new(&cfg).map_err(|e| HotplugError::Refused(format!("vm.add-net: {e}")))?
    } else {
        if !cfg.tap.is_empty() || cfg.ip.is_some() || cfg.mask.is_some() {
            return Err(HotplugError::Refused(
                "vm.add-net: give either tap fds or tap/ip/mask, not both".into(),
            ));
        }
        // Kept by name, so that a reboot in place or a boot after
        // vm.shutdown builds the NIC on the same queues.
        cfg.tap = passed_taps::keep(fds)
            .map_err(|e| HotplugError::Refused(format!("vm.add-net: {e}")))?;
        match Net::new(&cfg) {
            Ok(net) => net,
            Err(e) => {
                passed_taps::forget(&cfg.tap);
                return Err(HotplugError::Refused(format!("vm.add-net: {e}")));
            }
        }
    };
    if cfg.tap.is_empty() {
        net.tap_name().clone_into(&mut cfg.tap);
    }
    hotplug.add_virtio(id, VirtioConfig::Net(cfg), Box::new(net))
}

/// Adds a virtio-blk device on the raw image `cfg` names, as `cfg.id`
/// (or `_disk<N>`, chosen before the image is opened: the id is the
/// disk's serial, the same after a reboot rebuilt it from `vm.info`).
pub fn add_disk(
    hotplug: &VfioHotplug,
    mut cfg: DiskConfig,
) -> Result<(String, PciAddress), HotplugError> {
    if cfg.id.is_none() {
        cfg.id = Some(hotplug.free_id("disk")?);
    }
    let image = DiskImage::open(&cfg.path, cfg.readonly, cfg.id.as_deref())
        .map_err(|e| HotplugError::Refused(format!("vm.add-disk: {e}")))?;
    let num_queues = u16::try_from(cfg.num_queues).unwrap_or(1);
    let block = Block::new(image, cfg.name(), num_queues, cfg.queue_size);
    hotplug.add_virtio(cfg.id.clone(), VirtioConfig::Disk(cfg), Box::new(block))
}
