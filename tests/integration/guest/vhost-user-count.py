#!/usr/bin/env python3
"""A counting relay between a vhost-user front-end (the VMM) and its
back-end, run next to both in the runner (guest/net-host.sh).

Why: the closing figure of issue 11 compares the device-IOTLB traffic of
dmavisor and QEMU on the same back-end. QEMU has no counter for it, and a
VMM's own counter is the thing under test; a relay that both VMMs talk
through counts the same messages the same way for both.

The relay listens on --listen (the VMM connects there as it would to the
back-end), connects to the back-end's socket --backend for each front-end
connection, and forwards every message both ways with its file
descriptors. The back-end channel (SET_BACKEND_REQ_FD) is relayed too: the
back-end gets one end of a new socket pair and the relay forwards between
the other end and the VMM's descriptor, so IOTLB misses pass through it.

Counted: IOTLB_MSG requests of the front-end (UPDATE, INVALIDATE, and the
bytes invalidated) and of the back-end (MISS, ACCESS_FAIL). At the end of
each connection it prints one line, `VU-COUNT {json}`.

Only the control path passes here: kicks, calls and guest memory are file
descriptors the two ends share directly.

Fault injection: --delay-invalidate-ack MS holds the back-end's
acknowledgement of every INVALIDATE for MS milliseconds (a slow back-end),
counted as `delayed_acks`; the VMM must hold the guest's UNMAP that long.
"""

import argparse
import array
import json
import os
import socket
import struct
import sys
import threading
import time
from collections import deque

HEADER = struct.Struct("<III")
REPLY_FLAG = 0x4
NEED_REPLY_FLAG = 0x8
# Front-end requests.
SET_BACKEND_REQ_FD = 21
IOTLB_MSG = 22
# Back-end requests.
BACKEND_IOTLB_MSG = 1
# struct vhost_iotlb_msg: iova, size, uaddr, perm, type.
IOTLB = struct.Struct("<QQQBB")
IOTLB_MISS, IOTLB_UPDATE, IOTLB_INVALIDATE, IOTLB_ACCESS_FAIL = 1, 2, 3, 4
MAX_FDS = 16
MAX_PAYLOAD = 1 << 20


class Counts:
    """One connection's tallies; the relay threads add under a lock."""

    def __init__(self, ack_delay):
        self.lock = threading.Lock()
        # The kinds of the IOTLB messages awaiting their acknowledgement,
        # oldest first (the main socket answers in order).
        self.awaiting = deque()
        self.ack_delay = ack_delay
        self.values = {
            "delayed_acks": 0,
            "messages": 0,
            "iotlb_updates": 0,
            "iotlb_invalidations": 0,
            "invalidated_bytes": 0,
            "iotlb_misses": 0,
            "iotlb_access_fails": 0,
        }

    def add(self, key, n=1):
        with self.lock:
            self.values[key] += n


def recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def recv_message(sock):
    """One message: (header bytes, payload bytes, fds), or None at EOF."""
    fds = array.array("i")
    msg, anc, _flags, _addr = sock.recvmsg(HEADER.size, socket.CMSG_LEN(MAX_FDS * fds.itemsize))
    if not msg:
        return None
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % fds.itemsize
            fds.frombytes(data[:usable])
    if len(msg) < HEADER.size:
        rest = recv_exact(sock, HEADER.size - len(msg))
        if rest is None:
            return None
        msg += rest
    _req, _flags, size = HEADER.unpack(msg)
    if size > MAX_PAYLOAD:
        raise ValueError(f"payload of {size} bytes")
    payload = recv_exact(sock, size) if size else b""
    if payload is None:
        return None
    return msg, payload, list(fds)


def send_message(sock, header, payload, fds):
    anc = []
    if fds:
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
    data = header + payload
    sent = sock.sendmsg([data], anc)
    if sent < len(data):
        sock.sendall(data[sent:])


def count_iotlb(counts, payload, from_backend):
    if len(payload) < IOTLB.size:
        return
    _iova, size, _uaddr, _perm, kind = IOTLB.unpack_from(payload)
    if from_backend:
        if kind == IOTLB_MISS:
            counts.add("iotlb_misses")
        elif kind == IOTLB_ACCESS_FAIL:
            counts.add("iotlb_access_fails")
    elif kind == IOTLB_UPDATE:
        counts.add("iotlb_updates")
    elif kind == IOTLB_INVALIDATE:
        counts.add("iotlb_invalidations")
        counts.add("invalidated_bytes", size)


def relay(src, dst, counts, role, threads):
    """Forwards src -> dst until either end closes. role: 'front' (main
    socket, VMM to back-end), 'back' (main socket, replies), 'bchan-req'
    (back-end channel, back-end requests), 'bchan-reply'."""
    try:
        while True:
            m = recv_message(src)
            if m is None:
                break
            header, payload, fds = m
            req, flags, _size = HEADER.unpack(header)
            is_reply = flags & REPLY_FLAG
            counts.add("messages")
            if role == "front" and not is_reply and req == IOTLB_MSG:
                count_iotlb(counts, payload, from_backend=False)
                if flags & NEED_REPLY_FLAG and len(payload) >= IOTLB.size:
                    with counts.lock:
                        counts.awaiting.append(IOTLB.unpack_from(payload)[4])
            if role == "back" and is_reply and req == IOTLB_MSG:
                with counts.lock:
                    kind = counts.awaiting.popleft() if counts.awaiting else None
                if kind == IOTLB_INVALIDATE and counts.ack_delay > 0:
                    time.sleep(counts.ack_delay / 1000)
                    counts.add("delayed_acks")
            if role == "bchan-req" and not is_reply and req == BACKEND_IOTLB_MSG:
                count_iotlb(counts, payload, from_backend=True)
            if role == "front" and not is_reply and req == SET_BACKEND_REQ_FD and fds:
                vmm_end = socket.socket(fileno=fds[0])
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
                send_message(dst, header, payload, [theirs.fileno()])
                theirs.close()
                for s, d, r in ((ours, vmm_end, "bchan-req"), (vmm_end, ours, "bchan-reply")):
                    t = threading.Thread(target=relay, args=(s, d, counts, r, threads), daemon=True)
                    threads.append(t)
                    t.start()
                continue
            send_message(dst, header, payload, fds)
            for fd in fds:
                os.close(fd)
    except (OSError, ValueError) as e:
        print(f"VU-COUNT-NOTE {role}: {e}", file=sys.stderr, flush=True)
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(listen, backend, once, ack_delay):
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.exists(listen):
        os.unlink(listen)
    srv.bind(listen)
    srv.listen(1)
    print("VU-COUNT-READY", flush=True)
    while True:
        front, _ = srv.accept()
        back = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        back.connect(backend)
        counts = Counts(ack_delay)
        threads = []
        for s, d, r in ((front, back, "front"), (back, front, "back")):
            t = threading.Thread(target=relay, args=(s, d, counts, r, threads), daemon=True)
            threads.append(t)
            t.start()
        # The list grows when the back-end channel starts: join until the
        # last thread is done.
        while any(t.is_alive() for t in threads):
            for t in list(threads):
                t.join()
        print("VU-COUNT " + json.dumps(counts.values), flush=True)
        if once:
            break


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", required=True, help="socket the VMM connects to")
    ap.add_argument("--backend", required=True, help="the back-end's listening socket")
    ap.add_argument("--once", action="store_true", help="end after the first connection")
    ap.add_argument("--delay-invalidate-ack", type=int, default=0, metavar="MS",
                    help="hold the back-end's acknowledgement of each INVALIDATE this long")
    args = ap.parse_args()
    serve(args.listen, args.backend, args.once, args.delay_invalidate_ack)


if __name__ == "__main__":
    main()
