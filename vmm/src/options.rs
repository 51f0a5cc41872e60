//! The `key=value,...` syntax every flag shares (`--memory size=1G,thp=off`,
//! `--iommu queues=2`, `--net tap=..`), and its `on|off` values.
//!
//! WHY a leaf: each device module parses its own flag (`net/config.rs`,
//! `block/config.rs`, ...) and `config.rs` collects those flags into the
//! VM's configuration. If the shared parser lived in `config.rs`, every
//! device would import the module that imports it. This one imports only
//! the error type, so any module can use it.

use std::collections::BTreeMap;

use crate::error::{Error, OptionReason};

/// Splits `key=value,...` into a map, refusing unknown or repeated keys.
pub fn parse_options(
    option: &'static str,
    value: &str,
    known: &[&str],
) -> Result<BTreeMap<String, String>, Error> {
    let bad = |reason: OptionReason| Error::InvalidOption {
        option,
        value: value.to_string(),
        reason,
    };
    let mut map = BTreeMap::new();
    for part in value.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| bad(format!("'{part}' is not key=value").into()))?;
        if !known.contains(&k) {
            return Err(bad(format!(
                "unknown key '{k}' (known: {})",
                known.join(", ")
            )
            .into()));
        }
        if map.insert(k.to_string(), v.to_string()).is_some() {
            return Err(bad(format!("key '{k}' given twice").into()));
        }
    }
    Ok(map)
}

/// Parses an `on|off` value of `key` in option `option`.
pub fn parse_on_off(option: &'static str, value: &str, key: &str, v: &str) -> Result<bool, Error> {
    match v {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(Error::InvalidOption {
            option,
            value: value.to_string(),
            reason: format!("{key} must be on or off, not '{other}'").into(),
        }),
    }
}
