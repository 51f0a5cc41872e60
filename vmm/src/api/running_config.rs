//! The configuration of a running VM as `vm.info` prints it: what it was
//! booted from, with the devices hotplugged since (and without those
//! removed since), each listed by the id the add call returned, as
//! cloud-hypervisor's running configuration lists them.
//!
//! WHY it matters beyond `vm.info`: a client (libvirt, ch-remote) finds
//! the id to remove a device by here, and a reboot in place rebuilds the
//! VM from exactly this configuration (`super::controller`), so a device
//! hotplugged before the reboot is there after it, under the same id.

use crate::config::VmConfig;
use crate::vfio::hotplug::VirtioConfig;
use crate::vfio::VfioConfig;

/// The running configuration: `booted` with its assigned functions
/// replaced by `assigned` (the hotplug list holds the cold-plugged ones
/// too, and they can be removed) and the hotplugged virtio devices
/// appended, each carrying its id.
pub fn running_config(
    booted: &VmConfig,
    assigned: Vec<VfioConfig>,
    virtio: impl IntoIterator<Item = VirtioConfig>,
) -> VmConfig {
    let mut now = booted.clone();
    now.devices = assigned;
    for cfg in virtio {
        match cfg {
            VirtioConfig::Net(n) => now.net.push(n),
            VirtioConfig::Disk(d) => now.disks.push(d),
        }
    }
    now
}

/// The ids of the NICs and disks `c` builds at boot, which hotplugged
/// devices must not take.
pub fn boot_ids(c: &VmConfig) -> Vec<String> {
    c.net
        .iter()
        .filter_map(|n| n.id.clone())
        .chain(c.disks.iter().filter_map(|d| d.id.clone()))
        .collect()
}

#[cfg(test)]
#[path = "running_config_tests.rs"]
mod tests;
