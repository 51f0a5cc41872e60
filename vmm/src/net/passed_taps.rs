//! TAP queues a client passed with `SCM_RIGHTS` before the VM they are for
//! was built: libvirt creates a VM (`vm.create`), adds its NICs as tap
//! descriptors (`vm.add-net`) and only then boots it (`vm.boot`), and a
//! VM that is shut down and booted again, or rebuilt on a guest reboot,
//! needs the same queues again.
//!
//! WHY a registry keyed by TAP name instead of descriptors in
//! [`NetConfig`](super::NetConfig): a configuration is cloned, printed by
//! `vm.info` and compared, and a descriptor is none of those things. The
//! configuration names the TAP (the name the kernel gave the queues); the
//! registry owns the queues for as long as a configuration may name them,
//! and every device built from it gets duplicates ([`clones`]), so tearing
//! a device down never closes the queues a later boot needs. A TAP the
//! client created without `IFF_PERSIST` lives exactly as long as these
//! descriptors: [`forget`] (on `vm.delete` or `vm.remove-device`) lets it go.

use std::collections::BTreeMap;
use std::fs::File;
use std::sync::Mutex;

use virtio_iommu::locks::Unpoison;

use super::tap::{Tap, TapError};

/// Bound on the TAPs kept at once: a client cannot grow the registry
/// without limit (a VM has at most a few dozen PCI slots anyway).
pub const MAX_KEPT: usize = 32;

static KEPT: Mutex<BTreeMap<String, Vec<File>>> = Mutex::new(BTreeMap::new());

/// Keeps `queues` (checked to be queues of one TAP, which names them) for
/// later boots; returns the TAP's name, which the configuration records.
pub fn keep(queues: Vec<File>) -> Result<String, TapError> {
    let mut name: Option<String> = None;
    let mut checked = Vec::with_capacity(queues.len());
    for file in queues {
        let tap = Tap::from_file(file)?;
        match &name {
            None => name = Some(tap.name().to_string()),
            Some(n) if n != tap.name() => {
                return Err(TapError::NotUsable("queues of different TAPs"));
            }
            Some(_) => {}
        }
        checked.push(tap.into_file());
    }
    let name = name.ok_or(TapError::NotUsable("no queue passed"))?;
    let mut kept = KEPT.lock().unpoisoned();
    if kept.contains_key(&name) {
        return Err(TapError::NotUsable("its TAP is in use by this VM already"));
    }
    if kept.len() >= MAX_KEPT {
        return Err(TapError::NotUsable("too many passed TAPs kept"));
    }
    kept.insert(name.clone(), checked);
    Ok(name)
}

/// Duplicates of the queues kept for TAP `name`, ready for a device
/// (None: nothing was passed for that name).
pub fn clones(name: &str) -> Option<Result<Vec<Tap>, TapError>> {
    let kept = KEPT.lock().unpoisoned();
    let queues = kept.get(name)?;
    Some(
        queues
            .iter()
            .map(|f| {
                f.try_clone()
                    .map_err(|source| TapError::Dup {
                        name: name.to_string(),
                        source,
                    })
                    .and_then(Tap::from_file)
            })
            .collect(),
    )
}

/// Closes the queues kept for TAP `name` (no-op if none were).
pub fn forget(name: &str) {
    KEPT.lock().unpoisoned().remove(name);
}

/// How many queues are kept for `name` (for the tests and `vm.info`).
pub fn queue_count(name: &str) -> usize {
    KEPT.lock().unpoisoned().get(name).map_or(0, Vec::len)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn exists(name: &str) -> bool {
        Path::new("/sys/class/net").join(name).exists()
    }

    /// libvirt's order: a TAP opened by the client (not persistent: it
    /// lives as long as a descriptor does), passed before the boot; the
    /// registry keeps it alive after the client closed its own copy,
    /// every device gets working duplicates, and forgetting it ends it.
    #[test]
    fn passed_queues_outlive_their_devices_until_forgotten() {
        let client = Tap::open("dmvkeep0", false).expect("open a TAP (root, /dev/net/tun)");
        let name = client.name().to_string();
        let dup = client.into_file();
        let kept = keep(vec![dup]).unwrap();
        assert_eq!(kept, name);
        assert_eq!(queue_count(&name), 1);
        // A second client passing queues of the same TAP is refused.
        let again = clones(&name).unwrap().unwrap();
        let refused = keep(again.into_iter().map(Tap::into_file).collect());
        assert!(
            matches!(refused, Err(TapError::NotUsable(_))),
            "{refused:?}"
        );
        // Two devices in a row (a boot, then a rebuild) each get queues.
        for _ in 0..2 {
            let taps = clones(&name).unwrap().unwrap();
            assert_eq!(taps.len(), 1);
            assert_eq!(taps[0].name(), name);
            drop(taps);
            assert!(exists(&name), "a device's teardown closed the TAP");
        }
        forget(&name);
        assert!(clones(&name).is_none());
        assert!(!exists(&name), "forgetting the queues ends the TAP");
    }

    #[test]
    fn what_is_no_tap_is_not_kept() {
        let f = File::open("/dev/null").unwrap();
        assert!(matches!(keep(vec![f]), Err(TapError::NotUsable(_))));
        assert!(matches!(keep(Vec::new()), Err(TapError::NotUsable(_))));
    }
}
