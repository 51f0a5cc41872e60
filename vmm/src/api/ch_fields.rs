//! The fields of cloud-hypervisor's `VmConfig` (and of the `NetConfig`,
//! `DiskConfig`, `DeviceConfig` the hotplug endpoints take) that dmavisor
//! does not implement, with the value each has when unused.
//!
//! WHY: management stacks send whole configurations. Kata's clh driver
//! sets `watchdog: false`, `pvpanic: false`, `landlock_enable: false`,
//! `cpus.topology`, ...; ch-remote's `add-device` sends
//! `x_exclude_mmap_bars: []`; a configuration cloud-hypervisor prints in
//! `vm.info` carries every field. A field at its unused value asks for
//! nothing, so it is accepted and dropped before the typed parse; any
//! other value asks for a feature dmavisor lacks, which is a 400 that
//! names the field and the value. Fields in none of these lists stay
//! refused by the typed parse (`deny_unknown_fields`).
//!
//! The lists follow cloud-hypervisor's OpenAPI description (the
//! `cloud-hypervisor-client` 0.6.0 models) and its `vm_config.rs`
//! defaults; fields dmavisor implements are in its own spec structs, not
//! here.

use serde_json::{Map, Value};

/// What a field must hold to be dropped as unused.
#[derive(Clone, Copy, Debug)]
pub enum Unused {
    /// Absent in effect: `null`, `[]` or `{}`.
    Empty,
    /// This boolean (or `null`).
    Bool(bool),
    /// This number (or `null`).
    Int(i64),
    /// One of these strings (or `null`).
    Str(&'static [&'static str]),
    /// An object whose fields are each unused by these rules (or `null`).
    Object(&'static [(&'static str, Unused)]),
}

const PCI_COMMON: [(&str, Unused); 3] = [
    ("id", Unused::Empty),
    ("pci_segment", Unused::Int(0)),
    ("pci_device_id", Unused::Empty),
];

const RNG: &[(&str, Unused)] = &[
    ("src", Unused::Str(&["/dev/urandom"])),
    ("iommu", Unused::Bool(false)),
    PCI_COMMON[0],
    PCI_COMMON[1],
    PCI_COMMON[2],
];

const DEBUG_CONSOLE: &[(&str, Unused)] = &[
    ("mode", Unused::Str(&["Off"])),
    ("file", Unused::Empty),
    // Port 0xe9, cloud-hypervisor's default.
    ("iobase", Unused::Int(0xe9)),
];

const PLATFORM: &[(&str, Unused)] = &[
    ("num_pci_segments", Unused::Int(1)),
    ("iommu_segments", Unused::Empty),
    ("iommu_address_width_bits", Unused::Int(64)),
    ("serial_number", Unused::Empty),
    ("uuid", Unused::Empty),
    ("oem_strings", Unused::Empty),
    ("tdx", Unused::Bool(false)),
    ("sev_snp", Unused::Bool(false)),
    ("iommufd", Unused::Bool(false)),
    ("vfio_p2p_dma", Unused::Bool(true)),
    ("mmio32_aperture_weight", Unused::Int(1)),
    ("mmio64_aperture_weight", Unused::Int(1)),
];

/// `VmConfig`'s own fields.
const VM: &[(&str, Unused)] = &[
    ("rate_limit_groups", Unused::Empty),
    ("rng", Unused::Object(RNG)),
    ("balloon", Unused::Empty),
    ("fs", Unused::Empty),
    ("generic-vhost-user", Unused::Empty),
    ("pmem", Unused::Empty),
    ("debug_console", Unused::Object(DEBUG_CONSOLE)),
    ("user_devices", Unused::Empty),
    ("vdpa", Unused::Empty),
    ("vsock", Unused::Empty),
    ("numa", Unused::Empty),
    ("watchdog", Unused::Bool(false)),
    ("pvpanic", Unused::Bool(false)),
    ("pci_segments", Unused::Empty),
    ("platform", Unused::Object(PLATFORM)),
    ("tpm", Unused::Empty),
    ("landlock_enable", Unused::Bool(false)),
    ("landlock_rules", Unused::Empty),
    ("sgx_epc", Unused::Empty),
    ("ivshmem", Unused::Empty),
];

const CPUS: &[(&str, Unused)] = &[
    ("topology", Unused::Empty),
    ("kvm_hyperv", Unused::Bool(false)),
    ("max_phys_bits", Unused::Int(46)),
    ("nested", Unused::Bool(true)),
    ("affinity", Unused::Empty),
    ("features", Unused::Object(&[("amx", Unused::Bool(false))])),
    ("core_scheduling", Unused::Str(&["Vm"])),
    ("profile", Unused::Str(&["Host"])),
];

const MEMORY: &[(&str, Unused)] = &[
    ("hotplug_size", Unused::Empty),
    ("hotplugged_size", Unused::Empty),
    ("mergeable", Unused::Bool(false)),
    ("hotplug_method", Unused::Str(&["Acpi"])),
    ("hugepages", Unused::Bool(false)),
    ("hugepage_size", Unused::Empty),
    ("prefault", Unused::Bool(false)),
    ("reserve", Unused::Bool(false)),
    ("zones", Unused::Empty),
];

const PAYLOAD: &[(&str, Unused)] = &[
    ("firmware", Unused::Empty),
    ("igvm", Unused::Empty),
    ("host_data", Unused::Empty),
];

/// `NetConfig` (in `VmConfig.net` and `vm.add-net`).
/// (`id` is dmavisor's too: `NetSpec::id`.)
pub const NET: &[(&str, Unused)] = &[
    ("host_mac", Unused::Empty),
    ("mtu", Unused::Empty),
    PCI_COMMON[1],
    PCI_COMMON[2],
    ("rate_limiter_config", Unused::Empty),
    ("offload_tso", Unused::Bool(true)),
    ("offload_ufo", Unused::Bool(true)),
    ("offload_csum", Unused::Bool(true)),
];

/// `DiskConfig` (in `VmConfig.disks` and `vm.add-disk`).
pub const DISK: &[(&str, Unused)] = &[
    PCI_COMMON[2],
    ("rate_limit_group", Unused::Empty),
    ("rate_limiter_config", Unused::Empty),
    ("serial", Unused::Empty),
    ("queue_affinity", Unused::Empty),
    ("backing_files", Unused::Bool(false)),
    ("sparse", Unused::Bool(true)),
    // dmavisor's images are raw: autodetection finds nothing else.
    ("image_type", Unused::Str(&["Unknown", "Raw"])),
    ("lock_granularity", Unused::Str(&["ByteRange"])),
    ("disable_io_uring", Unused::Bool(false)),
    ("disable_aio", Unused::Bool(false)),
];

/// `DeviceConfig` (in `VmConfig.devices` and `vm.add-device`).
pub const DEVICE: &[(&str, Unused)] = &[
    PCI_COMMON[2],
    ("x_nv_gpudirect_clique", Unused::Empty),
    ("x_exclude_mmap_bars", Unused::Empty),
];

/// `serial` and `console`: the PCI placement of the virtio-console.
/// (`socket` and `iommu` are dmavisor's too: `ConsoleSpec`.)
const CONSOLE: &[(&str, Unused)] = &[PCI_COMMON[0], PCI_COMMON[1], PCI_COMMON[2]];

/// A field set to something dmavisor cannot do.
#[derive(Debug, thiserror::Error)]
#[error("{field}={value} is not supported by dmavisor")]
pub struct Unsupported {
    /// Where, e.g. `memory.hugepages` or `net[0].mtu`.
    pub field: String,
    /// What it was set to (JSON).
    pub value: String,
}

fn is_unused(value: &Value, rule: Unused) -> bool {
    match (rule, value) {
        (_, Value::Null) => true,
        (Unused::Empty, Value::Array(a)) => a.is_empty(),
        (Unused::Empty, Value::Object(o)) => o.is_empty(),
        (Unused::Bool(b), Value::Bool(v)) => *v == b,
        (Unused::Int(n), Value::Number(v)) => v.as_i64() == Some(n),
        (Unused::Str(ok), Value::String(s)) => ok.contains(&s.as_str()),
        (Unused::Object(rules), Value::Object(o)) => o.iter().all(|(k, v)| {
            rules
                .iter()
                .find(|(name, _)| *name == k)
                .is_some_and(|(_, r)| is_unused(v, *r))
        }),
        _ => false,
    }
}

/// Drops the fields of `obj` that `rules` name and that hold their unused
/// value; the first that does not is the error (`at` prefixes its name).
pub fn drop_unused(
    obj: &mut Map<String, Value>,
    rules: &[(&str, Unused)],
    at: &str,
) -> Result<(), Unsupported> {
    for (name, rule) in rules {
        let Some(value) = obj.get_mut(*name) else {
            continue;
        };
        // Name the field inside an object (`platform.tdx`), not the object.
        if let (Unused::Object(inner), Value::Object(o)) = (rule, &mut *value) {
            let at = format!("{at}{name}.");
            drop_unused(o, inner, &at)?;
            if let Some((k, v)) = o.iter().next() {
                return Err(Unsupported {
                    field: format!("{at}{k}"),
                    value: v.to_string(),
                });
            }
        }
        if !is_unused(value, *rule) {
            return Err(Unsupported {
                field: format!("{at}{name}"),
                value: value.to_string(),
            });
        }
        obj.remove(*name);
    }
    Ok(())
}

/// [`drop_unused`] on `obj[key]` if it is an object.
fn section(
    obj: &mut Map<String, Value>,
    key: &str,
    rules: &[(&str, Unused)],
) -> Result<(), Unsupported> {
    match obj.get_mut(key) {
        Some(Value::Object(o)) => drop_unused(o, rules, &format!("{key}.")),
        _ => Ok(()),
    }
}

/// [`drop_unused`] on each object of the list `obj[key]`.
fn each(
    obj: &mut Map<String, Value>,
    key: &str,
    rules: &[(&str, Unused)],
) -> Result<(), Unsupported> {
    if let Some(Value::Array(list)) = obj.get_mut(key) {
        for (i, item) in list.iter_mut().enumerate() {
            if let Value::Object(o) = item {
                drop_unused(o, rules, &format!("{key}[{i}]."))?;
            }
        }
    }
    Ok(())
}

/// A hotplug body (`NetConfig`, `DiskConfig`, `DeviceConfig`) as `T`,
/// once the fields of `rules` at their unused values are dropped; the
/// error names the field or says what the typed parse refused.
pub fn parse_section<T: serde::de::DeserializeOwned>(
    body: &[u8],
    rules: &[(&str, Unused)],
) -> Result<T, String> {
    let mut v: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if let Value::Object(o) = &mut v {
        drop_unused(o, rules, "").map_err(|e| e.to_string())?;
    }
    serde_json::from_value(v).map_err(|e| e.to_string())
}

/// Drops every unused cloud-hypervisor field of a `VmConfig` body.
pub fn drop_unused_vm(body: &mut Value) -> Result<(), Unsupported> {
    let Value::Object(obj) = body else {
        return Ok(());
    };
    drop_unused(obj, VM, "")?;
    section(obj, "cpus", CPUS)?;
    section(obj, "memory", MEMORY)?;
    section(obj, "payload", PAYLOAD)?;
    section(obj, "serial", CONSOLE)?;
    section(obj, "console", CONSOLE)?;
    each(obj, "net", NET)?;
    each(obj, "disks", DISK)?;
    each(obj, "devices", DEVICE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::config::DiskSpec;
    use crate::vfio::config::DeviceSpec;
    use serde_json::json;

    #[test]
    fn unused_values_are_dropped_and_others_named() {
        let mut v = json!({
            "watchdog": false, "pvpanic": null, "fs": [], "landlock_enable": false,
            "rng": {"src": "/dev/urandom", "iommu": false},
            "cpus": {"boot_vcpus": 1, "max_phys_bits": 46, "features": {"amx": false}},
            "memory": {"size": 1, "hugepages": false, "hotplug_method": "Acpi"},
            "net": [{"tap": "t", "offload_tso": true}],
            "devices": [{"path": "/p", "x_exclude_mmap_bars": []}],
        });
        drop_unused_vm(&mut v).expect("all unused");
        assert_eq!(
            v,
            json!({
                "cpus": {"boot_vcpus": 1},
                "memory": {"size": 1},
                "net": [{"tap": "t"}],
                "devices": [{"path": "/p"}],
            })
        );
        for (body, says) in [
            (json!({"watchdog": true}), "watchdog=true"),
            (
                json!({"rng": {"src": "/dev/random"}}),
                "rng.src=\"/dev/random\"",
            ),
            (json!({"platform": {"tdx": true}}), "platform.tdx=true"),
            (
                json!({"console": {"mode": "Pty", "pci_segment": 1}}),
                "console.pci_segment=1",
            ),
            (
                json!({"memory": {"size": 1, "hugepages": true}}),
                "memory.hugepages=true",
            ),
            (
                json!({"cpus": {"topology": {"threads_per_core": 2}}}),
                "cpus.topology=",
            ),
            (json!({"net": [{}, {"mtu": 9000}]}), "net[1].mtu=9000"),
            (
                json!({"devices": [{"x_exclude_mmap_bars": [0]}]}),
                "devices[0].x_exclude_mmap_bars=[0]",
            ),
            (
                json!({"disks": [{"image_type": "Qcow2"}]}),
                "disks[0].image_type=\"Qcow2\"",
            ),
        ] {
            let mut b = body.clone();
            let e = drop_unused_vm(&mut b).expect_err(&body.to_string());
            let text = e.to_string();
            assert!(text.contains(says), "{text}");
            assert!(text.ends_with("is not supported by dmavisor"), "{text}");
        }
    }

    #[test]
    fn hotplug_bodies_drop_unused_fields() {
        let spec: DeviceSpec = parse_section(
            br#"{"path": "/sys/bus/pci/devices/0000:00:03.0", "x_exclude_mmap_bars": [],
                 "pci_segment": 0}"#,
            DEVICE,
        )
        .expect("ch-remote's add-device body");
        assert_eq!(spec.id, None);
        let e =
            parse_section::<DeviceSpec>(br#"{"path": "/p", "x_exclude_mmap_bars": [1]}"#, DEVICE)
                .expect_err("a BAR left unmapped");
        assert!(
            e.contains("x_exclude_mmap_bars=[1] is not supported"),
            "{e}"
        );
        let e =
            parse_section::<DiskSpec>(br#"{"path": "/d", "wat": 1}"#, DISK).expect_err("unknown");
        assert!(e.contains("unknown field"), "{e}");
    }
}
