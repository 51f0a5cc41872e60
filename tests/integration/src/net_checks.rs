//! Checks shared by the guest network tests (`guest/net-guest.sh` with a
//! peer from `guest/net-peer.py`, started by `guest/net-host.sh`): every
//! transfer complete, checksums equal on both ends, the driver rebound,
//! and the throughputs.

use crate::markers::{guest_script_exit, json_field, marker_line, peer_result, token_value};
use crate::session::CaseResult;

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    token_value(line, key).unwrap_or_else(|| panic!("no {key}= in '{line}'"))
}

fn json<'a>(json: &'a str, key: &str) -> &'a str {
    json_field(json, key).unwrap_or_else(|| panic!("no {key} in {json}"))
}

fn peer<'a>(out: &'a str, dir: &str) -> &'a str {
    peer_result(out, dir).unwrap_or_else(|| panic!("no peer result for {dir}"))
}

/// Throughputs (guest->host MB/s measured by the host peer, host->guest
/// MB/s measured in the guest) of case `name`, after checking that the VMM
/// and the guest script exited 0, the guest pinged the host, `size` bytes
/// went each way with equal MD5s, and traffic flowed again after the
/// driver was unbound and bound (a device reset). Prints one JSON line
/// tagged `bench`.
pub fn check_transfers(name: &str, r: &CaseResult, size: u64, bench: &str) -> (f64, f64) {
    let out = &r.output;
    eprintln!("{}", r.summary(name));
    let context = r.tail(60);
    for l in out.lines().filter(|l| l.contains("virtio")) {
        eprintln!("  {name}: {l}");
    }
    assert_eq!(r.exit, Some(0), "{name} script failed:\n{context}");
    assert!(
        out.contains("VMM-EXIT rc=0"),
        "{name}: VMM did not exit 0:\n{context}"
    );
    assert_eq!(guest_script_exit(out), Some(0), "{name}:\n{context}");
    let iface = marker_line(out, "GUEST-NET-IFACE").unwrap_or_else(|| panic!("{context}"));
    assert_eq!(field(iface, "driver"), "virtio_net", "{iface}");
    let ping = marker_line(out, "GUEST-PING").unwrap_or_else(|| panic!("{context}"));
    let received: u32 = field(ping, "received").parse().unwrap_or(0);
    assert!(received >= 1, "{name}: no ping reply: {ping}");

    let g2h = check_guest_to_host(name, out, size, &context);

    let rx = marker_line(out, "GUEST-RX").unwrap_or_else(|| panic!("{context}"));
    let host_tx = peer(out, "host_to_guest");
    assert_eq!(field(rx, "rc"), "0", "{rx}");
    assert_eq!(field(rx, "bytes"), size.to_string(), "{rx}");
    assert_eq!(
        field(rx, "md5"),
        json(host_tx, "md5"),
        "{name}: host->guest data corrupted"
    );

    // Reset and re-activation (driver unbound and bound again).
    let rebind = marker_line(out, "GUEST-REBIND").unwrap_or_else(|| panic!("{context}"));
    assert_eq!(
        field(rebind, "ok"),
        "1",
        "{name}: no traffic after rebind: {rebind}"
    );

    let mb = size as f64 / 1e6;
    let t0: f64 = field(rx, "t0").parse().unwrap_or(0.0);
    let t1: f64 = field(rx, "t1").parse().unwrap_or(0.0);
    let h2g_secs = t1 - t0;
    let h2g = if h2g_secs > 0.0 { mb / h2g_secs } else { 0.0 };
    println!(
        "{{\"bench\": \"{bench}\", \"vmm\": \"{}\", \"guest_to_host_MBps\": {g2h:.3}, \"host_to_guest_MBps\": {h2g:.3}, \"bytes\": {size}}}",
        name.trim_start_matches("net_")
    );
    (g2h, h2g)
}

/// The guest's transfer to the host in case `name`: `size` bytes sent
/// (`GUEST-TX`) and received by the peer with the same MD5. Returns the
/// throughput the peer measured, in MB/s (0 when it gave no duration).
pub fn check_guest_to_host(name: &str, out: &str, size: u64, context: &str) -> f64 {
    let tx = marker_line(out, "GUEST-TX").unwrap_or_else(|| panic!("{context}"));
    let host_rx = peer(out, "guest_to_host");
    assert_eq!(field(tx, "bytes"), size.to_string(), "{tx}");
    assert_eq!(json(host_rx, "bytes"), size.to_string(), "{host_rx}");
    assert_eq!(
        json(host_rx, "md5"),
        field(tx, "md5"),
        "{name}: guest->host data corrupted"
    );
    let secs: f64 = json(host_rx, "secs").parse().unwrap_or(0.0);
    if secs > 0.0 {
        size as f64 / 1e6 / secs
    } else {
        0.0
    }
}

/// MB/s of the peer's `size`-byte transfer in direction `dir`
/// (`guest_to_host` or `host_to_guest`), when it reported a duration.
pub fn peer_mbps(out: &str, dir: &str, size: u64) -> Option<f64> {
    peer_result(out, dir)
        .and_then(|j| json_field(j, "secs"))
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .map(|secs| size as f64 / 1e6 / secs)
}
