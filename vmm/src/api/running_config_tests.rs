//! The running configuration's bookkeeping without KVM: devices added
//! the way the hotplug list adds them (an id chosen by
//! `vfio::hotplug_ids`, written into the configuration), listed by
//! `vm.info`, read back by a reboot, and gone once removed.

use serde_json::Value;

use super::*;
use crate::api::vm_config;
use crate::block::DiskConfig;
use crate::net::NetConfig;
use crate::vfio::hotplug::HotplugError;
use crate::vfio::hotplug_ids::choose;

/// What `vm.info` lists under `section`: each entry's id (or null).
fn ids(info: &Value, section: &str) -> Vec<Value> {
    info[section]
        .as_array()
        .map(|a| a.iter().map(|e| e["id"].clone()).collect())
        .unwrap_or_default()
}

/// The hotplug list's steps for one virtio device: an id chosen among
/// those in use (listed or reserved at boot), written into its config.
fn add(
    list: &mut Vec<VirtioConfig>,
    reserved: &[String],
    given: Option<&str>,
    mut cfg: VirtioConfig,
) -> Result<String, HotplugError> {
    let in_use = |id: &str| {
        reserved.iter().any(|r| r == id)
            || list.iter().any(|c| match c {
                VirtioConfig::Net(n) => n.id.as_deref() == Some(id),
                VirtioConfig::Disk(d) => d.id.as_deref() == Some(id),
            })
    };
    let id = choose(given.map(str::to_string), cfg.kind(), in_use)?;
    cfg.set_id(&id);
    list.push(cfg);
    Ok(id)
}

fn net(tap: &str) -> VirtioConfig {
    VirtioConfig::Net(NetConfig::parse(&format!("tap={tap}")).expect("net"))
}

fn disk(path: &str) -> VirtioConfig {
    VirtioConfig::Disk(DiskConfig::parse(&format!("path={path}")).expect("disk"))
}

#[test]
fn hotplugged_devices_are_listed_by_id_until_removed() {
    let booted = vm_config::parse(
        br#"{"payload": {"kernel": "/k"},
             "net": [{"tap": "boot", "id": "boot0"}], "disks": [{"path": "/root.img"}]}"#,
    )
    .expect("valid");
    let reserved = boot_ids(&booted);
    assert_eq!(reserved, ["boot0"]);
    let mut list = Vec::new();
    // vm.add-net with an id, without one, vm.add-disk without one.
    assert_eq!(
        add(&mut list, &reserved, Some("hpnet1"), net("hp1")).unwrap(),
        "hpnet1"
    );
    assert_eq!(
        add(&mut list, &reserved, None, net("hp2")).unwrap(),
        "_net0"
    );
    assert_eq!(
        add(&mut list, &reserved, None, disk("/d.img")).unwrap(),
        "_disk0"
    );
    // A boot-time device's id, or a hotplugged one's, is refused.
    for taken in ["boot0", "_net0"] {
        assert!(matches!(
            add(&mut list, &reserved, Some(taken), disk("/e.img")),
            Err(HotplugError::DuplicateId(_))
        ));
    }
    // vm.add-device: the id the add returned (its name) is listed.
    let mut dev = VfioConfig::parse("path=/sys/bus/pci/devices/0000:01:00.0").expect("device");
    dev.id = Some(dev.name());

    let info = vm_config::to_json(&running_config(&booted, vec![dev], list.clone()));
    assert_eq!(ids(&info, "net"), ["boot0", "hpnet1", "_net0"], "{info}");
    assert_eq!(
        ids(&info, "disks"),
        [Value::Null, "_disk0".into()],
        "{info}"
    );
    assert_eq!(ids(&info, "devices"), ["0000:01:00.0"], "{info}");
    assert_eq!(info["net"][2]["tap"], "hp2", "{info}");

    // A reboot rebuilds from vm.info: the same devices, the same ids,
    // and the hotplugged ones are reserved in the rebuilt VM.
    let rebuilt = vm_config::parse(info.to_string().as_bytes()).expect("parses back");
    assert_eq!(vm_config::to_json(&rebuilt), info);
    assert_eq!(boot_ids(&rebuilt), ["boot0", "hpnet1", "_net0", "_disk0"]);

    // vm.remove-device of _net0, ejected: the list drops it.
    list.retain(|c| !matches!(c, VirtioConfig::Net(n) if n.id.as_deref() == Some("_net0")));
    let info = vm_config::to_json(&running_config(&booted, Vec::new(), list.clone()));
    assert_eq!(ids(&info, "net"), ["boot0", "hpnet1"], "{info}");
    assert_eq!(
        ids(&info, "disks"),
        [Value::Null, "_disk0".into()],
        "{info}"
    );
    assert_eq!(ids(&info, "devices"), Vec::<Value>::new(), "{info}");
    // Its id is free again.
    assert_eq!(
        add(&mut list, &reserved, None, net("hp3")).unwrap(),
        "_net0"
    );
}
