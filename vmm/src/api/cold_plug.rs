//! `vm.add-device`, `vm.add-net`, `vm.add-disk` and `vm.remove-device`
//! on a VM that was created but not booted: they change its configuration,
//! which `vm.boot` then builds, as cloud-hypervisor does. libvirt depends
//! on it: it creates the VM, adds every NIC as passed TAP queues, then
//! boots.
//!
//! WHY the bounds: the configuration lives as long as the VMM and a client
//! can repeat a request; a VM has [`MAX_DEVICES`] PCI slots for these at
//! most, so more could never boot, and ids are what the running VM's
//! hotplug accepts ([`MAX_ID_LEN`] printable characters).

use super::routes::{ApiError, ColdPlug};
use crate::config::VmConfig;
use crate::net::passed_taps;
use crate::pci::root::NUM_SLOTS;
use crate::vfio::hotplug::MAX_ID_LEN;

/// Devices a configuration may list in all (bus 0's slots less the host
/// bridge).
pub const MAX_DEVICES: usize = NUM_SLOTS - 1;

/// The ids the configuration's devices go by.
fn ids(c: &VmConfig) -> impl Iterator<Item = &str> {
    c.net
        .iter()
        .filter_map(|n| n.id.as_deref())
        .chain(c.disks.iter().filter_map(|d| d.id.as_deref()))
        .chain(c.devices.iter().filter_map(|d| d.id.as_deref()))
}

fn check_new(c: &VmConfig, id: Option<&str>) -> Result<(), ApiError> {
    if c.net.len() + c.disks.len() + c.devices.len() >= MAX_DEVICES {
        return Err(ApiError::BadRequest(format!(
            "the VM has {MAX_DEVICES} devices already"
        )));
    }
    if let Some(id) = id {
        if id.is_empty() || id.len() > MAX_ID_LEN || id.chars().any(char::is_control) {
            return Err(ApiError::BadRequest(format!(
                "id must be 1 to {MAX_ID_LEN} printable characters"
            )));
        }
        if ids(c).any(|i| i == id) {
            return Err(ApiError::BadRequest(format!("id {id} is in use")));
        }
    }
    Ok(())
}

/// Applies `change` to the created VM's configuration `c`; on an error `c`
/// is unchanged (and passed TAP queues are closed).
pub fn apply(c: &mut VmConfig, change: ColdPlug) -> Result<(), ApiError> {
    match change {
        ColdPlug::Device(d) => {
            check_new(c, d.id.as_deref())?;
            if c.devices.iter().any(|o| o.path == d.path) {
                return Err(ApiError::BadRequest(format!(
                    "{} is assigned already",
                    d.path.display()
                )));
            }
            c.devices.push(d);
        }
        ColdPlug::Disk(d) => {
            check_new(c, d.id.as_deref())?;
            c.disks.push(d);
        }
        ColdPlug::Net(mut n, fds) => {
            check_new(c, n.id.as_deref())?;
            if !fds.is_empty() {
                if !n.tap.is_empty() || n.ip.is_some() || n.mask.is_some() {
                    return Err(ApiError::BadRequest(
                        "give either tap fds or tap/ip/mask, not both".into(),
                    ));
                }
                n.tap = passed_taps::keep(fds).map_err(|e| ApiError::BadRequest(e.to_string()))?;
            }
            c.net.push(n);
        }
        ColdPlug::Remove(id) => {
            let before = c.net.len() + c.disks.len() + c.devices.len();
            let mut gone = Vec::new();
            c.net.retain(|n| {
                let keep = n.id.as_deref() != Some(&id);
                if !keep {
                    gone.push(n.tap.clone());
                }
                keep
            });
            c.disks.retain(|d| d.id.as_deref() != Some(&id));
            c.devices.retain(|d| d.id.as_deref() != Some(&id));
            if c.net.len() + c.disks.len() + c.devices.len() == before {
                return Err(ApiError::NotCreated(format!("no device {id}")));
            }
            for tap in gone {
                passed_taps::forget(&tap);
            }
        }
    }
    Ok(())
}
