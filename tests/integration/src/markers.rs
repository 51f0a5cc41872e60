//! Parsing the `KEY=value` markers guests and scripts print.
//!
//! Why markers: guest output arrives through a serial console (with `\r\n`
//! line ends and kernel messages mixed in), so tests look for explicit
//! `KEY=value` tokens instead of matching whole lines.

/// Exit status line printed by the initramfs init after the guest script.
pub const GUEST_SCRIPT_EXIT: &str = "GUEST-SCRIPT-EXIT";

/// Value of the last `KEY=value` token in `text` (value ends at whitespace).
pub fn marker_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().rev().find_map(|line| token_value(line, key))
}

/// Value of `key` among the whitespace-separated `k=v` tokens of one line.
pub fn token_value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().rev().find_map(|tok| {
        tok.split_once('=')
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| v)
    })
}

/// Last marker value parsed as an integer.
pub fn marker_int(text: &str, key: &str) -> Option<i64> {
    marker_value(text, key).and_then(|v| v.parse().ok())
}

/// The guest script's exit status as reported by the guest init.
pub fn guest_script_exit(text: &str) -> Option<i64> {
    marker_int(text, GUEST_SCRIPT_EXIT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_last_marker_with_crlf_and_noise() {
        let text = "[ 1.0] boot\r\nGUEST-SCRIPT-EXIT=3\r\nfoo\r\nGUEST-INFO cpus=2 memtotal_kb=468164\r\nGUEST-SCRIPT-EXIT=0\r\n[ 2.0] reboot: Power down\r\n";
        assert_eq!(guest_script_exit(text), Some(0));
        assert_eq!(marker_int(text, "cpus"), Some(2));
        assert_eq!(marker_int(text, "memtotal_kb"), Some(468164));
        assert_eq!(marker_value(text, "absent"), None);
    }

    #[test]
    fn rejects_non_numeric_and_prefix_keys() {
        let text = "XGUEST-SCRIPT-EXIT=1\nGUEST-SCRIPT-EXIT=abc\n";
        assert_eq!(guest_script_exit(text), None);
        assert_eq!(marker_value(text, "GUEST-SCRIPT-EXIT"), Some("abc"));
    }
}
