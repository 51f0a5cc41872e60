#!/usr/bin/env python3
"""Both ends of a vhost-user connection, for the counting relay's test.

    vhost-user-count-driver.py BACKEND_SOCKET RELAY_SOCKET

tests/tools.rs::vhost_user_count_relays_descriptors_and_counts_iotlb_messages
runs guest/vhost-user-count.py between the two ends: a back-end listening on
BACKEND_SOCKET and a front-end connecting to the relay on RELAY_SOCKET. The
front-end hands over a pipe (an fd-carrying request) and the back-end
channel, sends two IOTLB UPDATEs and one INVALIDATE of 8 KiB; the back-end
writes through the pipe it received, sends one MISS on the back-end channel,
and the front-end reads it. Every IOTLB message asks for an acknowledgement;
the relay holds the INVALIDATE's for 300 ms. Prints what each end saw as
one "DRIVER {...}" line.
"""

import array
import os
import socket
import struct
import sys
import threading
import time

HEADER = struct.Struct("<III")
# vhost-user requests used here.
SET_OWNER_WITH_FD = 5  # any request that carries an fd will do
SET_BACKEND_REQ_FD = 21
IOTLB_MSG = 22
# IOTLB message types (vhost_iotlb_msg.type).
IOTLB_MISS, IOTLB_UPDATE, IOTLB_INVALIDATE = 1, 2, 3


def send(s, req, flags, payload=b"", fds=()):
    anc = []
    if fds:
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
    s.sendmsg([HEADER.pack(req, flags, len(payload)) + payload], anc)


def recv(s):
    fds = array.array("i")
    msg, anc, _, _ = s.recvmsg(HEADER.size, socket.CMSG_LEN(64))
    for _level, _kind, data in anc:
        fds.frombytes(data[: len(data) - len(data) % 4])
    req, flags, size = HEADER.unpack(msg)
    body = b""
    while len(body) < size:
        body += s.recv(size - len(body))
    return req, flags, body, list(fds)


def iotlb(iova, size, kind):
    # iova, size, uaddr, perm (read-write), type.
    return struct.pack("<QQQBB", iova, size, 0, 3, kind)


def backend(srv, seen):
    c, _ = srv.accept()
    _req, _flags, _body, fds = recv(c)
    os.write(fds[0], b"through-the-relay")
    _req, _flags, _body, chan = recv(c)
    b = socket.socket(fileno=chan[0])
    kinds = []
    for _ in range(3):
        kinds.append(recv(c)[2][25])
        send(c, IOTLB_MSG, 5, struct.pack("<Q", 0))
    seen["backend_iotlb_kinds"] = kinds
    send(b, 1, 1, iotlb(0x1000, 0x1000, IOTLB_MISS))
    c.close()
    b.close()


def main():
    backend_path, relay_path = sys.argv[1], sys.argv[2]
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(backend_path)
    srv.listen(1)
    seen = {}
    t = threading.Thread(target=backend, args=(srv, seen))
    t.start()
    for _ in range(100):
        if os.path.exists(relay_path):
            break
        time.sleep(0.05)
    f = socket.socket(socket.AF_UNIX)
    f.connect(relay_path)
    rd, wr = os.pipe()
    send(f, SET_OWNER_WITH_FD, 1, struct.pack("<Q", 0), [wr])
    mine, theirs = socket.socketpair()
    send(f, SET_BACKEND_REQ_FD, 1, struct.pack("<Q", 0), [theirs.fileno()])
    waits = []
    for msg in (
        iotlb(0x1000, 0x1000, IOTLB_UPDATE),
        iotlb(0x3000, 0x1000, IOTLB_UPDATE),
        iotlb(0x1000, 0x2000, IOTLB_INVALIDATE),
    ):
        t0 = time.monotonic()
        send(f, IOTLB_MSG, 9, msg)
        assert recv(f)[0] == IOTLB_MSG
        waits.append(time.monotonic() - t0)
    seen["slow_acks"] = [w >= 0.3 for w in waits]
    req, _flags, body, _ = recv(mine)
    seen["frontend_got"] = [req, body[25]]
    seen["pipe"] = os.read(rd, 64).decode()
    t.join()
    f.close()
    print("DRIVER", seen, flush=True)


if __name__ == "__main__":
    main()
