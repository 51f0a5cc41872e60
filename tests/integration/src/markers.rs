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

/// What dmavisor prints when a guest vCPU triple-faults (vmm/src/exit.rs).
pub const VMM_TRIPLE_FAULT: &str = "guest triple fault";

/// What run-kvm prints when the nested runner's own kernel died (its
/// console tail follows).
pub const RUNNER_DIED: &str = "no exit status from L2";

/// The rest of the first line of `text` containing `key`, trimmed. The key
/// may stand anywhere in the line: firmware escape sequences or console
/// noise can precede it on the serial console.
pub fn marker_line<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.find(key).map(|i| l[i + key.len()..].trim()))
}

/// Prefix of the JSON lines `guest/net-peer.py` prints, one per direction.
pub const PEER_RESULT: &str = "PEER-RESULT ";

/// A string or number field of a `PEER-RESULT {...}` JSON line. Enough for
/// the flat objects net-peer.py writes (`json.dumps`, `": "` separators), not
/// a JSON parser.
pub fn json_field<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("\"{key}\": ");
    let rest = json.get(json.find(&pat)? + pat.len()..)?;
    let end = rest.find([',', '}']).unwrap_or(rest.len());
    Some(rest.get(..end)?.trim().trim_matches('"'))
}

/// The JSON of the first `PEER-RESULT` line whose `dir` is `dir`
/// (`guest_to_host` or `host_to_guest`).
pub fn peer_result<'a>(text: &'a str, dir: &str) -> Option<&'a str> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix(PEER_RESULT))
        .find(|j| json_field(j, "dir") == Some(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NET_OUTPUT: &str = "\x1b[0mGUEST-TX bytes=8388608 md5=abc rc=0 t0=1.5 t1=2.5\r\n\
        GUEST-TX bytes=1 md5=later\r\n\
        PEER-RESULT {\"bytes\": 0, \"dir\": \"host_to_guest\", \"md5\": \"\", \"secs\": 0}\r\n\
          PEER-RESULT {\"bytes\": 8388608, \"dir\": \"guest_to_host\", \"md5\": \"abc\", \"secs\": 1.25}\r\n";

    #[test]
    fn marker_line_takes_the_first_line_behind_noise() {
        let tx = marker_line(NET_OUTPUT, "GUEST-TX").unwrap();
        assert_eq!(tx, "bytes=8388608 md5=abc rc=0 t0=1.5 t1=2.5");
        assert_eq!(token_value(tx, "md5"), Some("abc"));
        assert_eq!(marker_line(NET_OUTPUT, "GUEST-RX"), None);
    }

    #[test]
    fn peer_results_by_direction() {
        let g2h = peer_result(NET_OUTPUT, "guest_to_host").unwrap();
        assert_eq!(json_field(g2h, "bytes"), Some("8388608"));
        assert_eq!(json_field(g2h, "md5"), Some("abc"));
        assert_eq!(json_field(g2h, "secs"), Some("1.25"));
        let h2g = peer_result(NET_OUTPUT, "host_to_guest").unwrap();
        assert_eq!(json_field(h2g, "md5"), Some(""));
        assert_eq!(json_field(h2g, "absent"), None);
        assert_eq!(peer_result(NET_OUTPUT, "sideways"), None);
        assert_eq!(
            peer_result("PEER-RESULT {\"bytes\": 1}", "guest_to_host"),
            None
        );
    }

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
