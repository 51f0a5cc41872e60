#!/usr/bin/env python3
"""Host-side peer of the virtio-net TAP test, run next to the VMM.

Port 5001: accepts one connection and reads exactly --size bytes (the guest
sends them with busybox nc), then closes so the sender ends. Port 5002:
answers one HTTP GET with --size random bytes (busybox wget in the guest).
Prints one JSON line per direction with the byte count, the MD5 and the
time between the first and last byte as seen here. Python rather than nc:
busybox nc lost data as a receiver in this environment.
"""

import argparse
import hashlib
import json
import os
import socket
import sys
import threading
import time


def listener(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(1)
    return s


def receive(sock, size, results, stall):
    conn, _ = sock.accept()
    # A transfer that stops for `stall` seconds will not resume: say so, so
    # the host script can end the VM now instead of at the time-out.
    conn.settimeout(stall)
    h = hashlib.md5()
    got = 0
    first = None
    while got < size:
        try:
            chunk = conn.recv(min(1 << 20, size - got))
        except TimeoutError:
            print(f"PEER-STALL guest_to_host: nothing for {stall:.0f} s after {got} bytes",
                  flush=True)
            break
        if not chunk:
            break
        if first is None:
            first = time.monotonic()
        h.update(chunk)
        got += len(chunk)
    last = time.monotonic()
    conn.close()
    secs = (last - first) if first is not None else 0.0
    results["g2h"] = {"dir": "guest_to_host", "bytes": got, "md5": h.hexdigest(),
                      "secs": round(secs, 3)}


def serve(sock, data, results, stall):
    conn, _ = sock.accept()
    conn.settimeout(stall)
    req = b""
    head = (b"HTTP/1.0 200 OK\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Length: %d\r\n\r\n" % len(data))
    try:
        while b"\r\n\r\n" not in req and len(req) < 65536:
            chunk = conn.recv(4096)
            if not chunk:
                break
            req += chunk
        t0 = time.monotonic()
        conn.sendall(head + data)
    except TimeoutError:
        print(f"PEER-STALL host_to_guest: no progress for {stall:.0f} s", flush=True)
        conn.close()
        return
    conn.shutdown(socket.SHUT_WR)
    # Wait for the client to close so the timing covers delivery.
    conn.settimeout(60)
    try:
        while conn.recv(4096):
            pass
    except OSError:
        pass
    t1 = time.monotonic()
    conn.close()
    results["h2g"] = {"dir": "host_to_guest", "bytes": len(data),
                      "md5": hashlib.md5(data).hexdigest(), "secs": round(t1 - t0, 3)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=8 << 20)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--label", default="")
    ap.add_argument("--stall", type=float, default=180,
                    help="seconds without data that end the transfer")
    args = ap.parse_args()
    results = {}
    data = os.urandom(args.size)
    rs, ss = listener(5001), listener(5002)
    print("PEER-READY", flush=True)
    threads = [
        threading.Thread(target=receive, args=(rs, args.size, results, args.stall), daemon=True),
        threading.Thread(target=serve, args=(ss, data, results, args.stall), daemon=True),
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + args.timeout
    for t in threads:
        t.join(max(0, deadline - time.monotonic()))
    for key in ("g2h", "h2g"):
        r = results.get(key, {"dir": key, "bytes": 0, "md5": "", "secs": 0})
        r["vmm"] = args.label
        print("PEER-RESULT " + json.dumps(r, sort_keys=True), flush=True)
    return 0 if len(results) == 2 else 1


if __name__ == "__main__":
    sys.exit(main())
