//! The ids hotplugged functions go by: the one the client gave, or one
//! made up as cloud-hypervisor makes them (`_net0`, `_disk1`, ...), the
//! first of its kind that no device of the VM uses.
//!
//! WHY the id is written into the function's configuration as soon as it
//! is chosen: `vm.info` lists the configuration, and a client removes a
//! device by the id the add call returned; a reboot in place rebuilds the
//! VM from that listing, so the id (and a disk's serial, which is its id)
//! stays the same across reboots. WHY ids of boot-time devices are
//! reserved: a device added after a reboot must not take the id of one
//! that was hotplugged before it and is now part of the configuration.

use super::hotplug::{HotplugError, MAX_ID_LEN};

/// How many made-up ids of one kind are tried (a VM has 31 slots).
const MAX_TRIES: u32 = 1024;

/// Checks an id a client gave: 1 to [`MAX_ID_LEN`] printable characters.
pub fn check_id(id: &str) -> Result<(), HotplugError> {
    if id.is_empty() || id.len() > MAX_ID_LEN || id.chars().any(char::is_control) {
        return Err(HotplugError::BadId);
    }
    Ok(())
}

/// The first `_<kind><N>` for which `taken` is false.
pub fn made_up(kind: &str, taken: impl Fn(&str) -> bool) -> Result<String, HotplugError> {
    (0..MAX_TRIES)
        .map(|n| format!("_{kind}{n}"))
        .find(|c| !taken(c))
        .ok_or_else(|| HotplugError::Refused(format!("no free id for a {kind} device")))
}

/// The id a new function of `kind` gets: `given` if it is valid and not
/// `taken`, else a made-up one.
pub fn choose(
    given: Option<String>,
    kind: &str,
    taken: impl Fn(&str) -> bool,
) -> Result<String, HotplugError> {
    match given {
        Some(id) => {
            check_id(&id)?;
            if taken(&id) {
                return Err(HotplugError::DuplicateId(id));
            }
            Ok(id)
        }
        None => made_up(kind, taken),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_ids_are_checked_and_made_up_ones_skip_those_in_use() {
        let used = ["_net0", "_net2", "nic"];
        let taken = |id: &str| used.contains(&id);
        assert_eq!(choose(None, "net", taken).unwrap(), "_net1");
        assert_eq!(choose(None, "disk", taken).unwrap(), "_disk0");
        assert_eq!(choose(Some("a".into()), "net", taken).unwrap(), "a");
        assert!(matches!(
            choose(Some("nic".into()), "net", taken),
            Err(HotplugError::DuplicateId(_))
        ));
        for bad in [String::new(), "x".repeat(MAX_ID_LEN + 1), "a\nb".into()] {
            assert!(matches!(
                choose(Some(bad), "net", taken),
                Err(HotplugError::BadId)
            ));
        }
        assert!(matches!(
            made_up("net", |_| true),
            Err(HotplugError::Refused(_))
        ));
    }
}
