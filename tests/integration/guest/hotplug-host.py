#!/usr/bin/env python3
"""Runner side of the virtio hotplug test (tests/hotplug.rs).

    hotplug-host.py BIN KERNEL INITRD

Boots dmavisor with a vIOMMU and an API socket, no NIC and no disk; the
guest (guest/hotplug-guest.sh) says when it waits for devices. Round 1:
vm.add-disk of a raw image with a known pattern and vm.add-net of a TAP
this script opened itself (/dev/net/tun) and passes with SCM_RIGHTS, as
ch-remote and libvirt do; neither behind the vIOMMU. Round 2: the same
image and a TAP named in the NetConfig (dmavisor creates it), both with
"iommu": true. After each round the guest's done marker triggers
vm.remove-device of both, and the guest reports them gone. Every request
and reply is an "HP-API name code body" line; vm.info's disks and net
after each step are "HP-INFO" lines (net by TAP and by id); what the host's TCP sink received
from the guest (the image's first MiB, read by the guest from the
hotplugged disk and sent over the hotplugged NIC) is "HOST-RX" lines; the
guest's serial output is "SERIAL:" lines, the VMM's log "VMM:" lines.
"""

import fcntl
import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

TUNSETIFF = 0x400454CA
IFF_TAP = 0x0002
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000
MIB = 1 << 20
PORT = 5003
# Round 1's TAP (opened here) and round 2's (made by dmavisor).
NET1 = ("dmvhp1", "192.168.250.1")
NET2 = ("dmvhp2", "192.168.251.1")


def say(line):
    print(line, flush=True)


def make_image(path):
    """An 8 MiB raw image of numbered lines; the md5 of its first MiB."""
    with open(path, "wb") as f:
        for i in range(8 * MIB // 32):
            f.write(b"dmavisor hotplug line %011d\n" % i)
    with open(path, "rb") as f:
        return hashlib.md5(f.read(MIB)).hexdigest()


def open_tap(name, addr):
    """A TAP queue as libvirt opens one (virtio-net header, no packet
    info), its host end configured with ip(8)."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH22x", name.encode(), flags))
    subprocess.run(["ip", "addr", "add", addr + "/24", "dev", name], check=True)
    subprocess.run(["ip", "link", "set", name, "up"], check=True)
    return fd


def api(sock_path, method, name, body=None, fds=()):
    """One request on a fresh connection; the descriptors ride on the
    request's first bytes. Returns (status, body text)."""
    data = body.encode() if body is not None else b""
    head = f"{method} /api/v1/{name} HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n"
    if data:
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    raw = head.encode() + b"\r\n" + data
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(120)
    try:
        s.connect(sock_path)
        if fds:
            socket.send_fds(s, [raw], list(fds))
        else:
            s.sendall(raw)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(4096)
            if not chunk:
                return 0, "connection closed"
            buf += chunk
        head, rest = buf.split(b"\r\n\r\n", 1)
        status = int(head.split(b"\r\n")[0].split(b" ")[1])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v.strip())
        while len(rest) < length:
            chunk = s.recv(4096)
            if not chunk:
                break
            rest += chunk
        return status, rest[:length].decode(errors="replace")
    finally:
        s.close()


def call(sock_path, label, method, name, body=None, fds=()):
    code, text = api(sock_path, method, name, body, fds)
    say(f"HP-API {label} {code} {text}")
    return code, text


def info_devices(sock_path, label):
    """vm.info's disks and net, as ids, paths and TAP names."""
    code, text = api(sock_path, "GET", "vm.info")
    try:
        cfg = json.loads(text)["config"]
    except (ValueError, KeyError):
        say(f"HP-INFO {label} code={code} unreadable {text}")
        return "", ""
    disks = ",".join(str(d.get("id") or d.get("path")) for d in cfg.get("disks") or [])
    nets = ",".join(str(n.get("tap")) for n in cfg.get("net") or [])
    net_ids = ",".join(str(n.get("id")) for n in cfg.get("net") or [])
    say(f"HP-INFO {label} disks=[{disks}] net=[{nets}] net_ids=[{net_ids}]")
    return disks, nets + "," + net_ids


def sink(listener):
    """Reads exactly 1 MiB per connection and reports its md5."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        got = b""
        conn.settimeout(300)
        try:
            while len(got) < MIB:
                chunk = conn.recv(MIB - len(got))
                if not chunk:
                    break
                got += chunk
        except OSError:
            pass
        conn.close()
        say(f"HOST-RX bytes={len(got)} md5={hashlib.md5(got).hexdigest()}")


def pump(stream, prefix, marks):
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\r\n")
        say(prefix + line)
        if prefix == "SERIAL: ":
            marks.append(line)


def wait_mark(marks, text, proc, limit=900):
    """Until the guest printed a line containing `text` (or the VMM ended)."""
    start = time.monotonic()
    while time.monotonic() - start < limit:
        if any(text in m for m in list(marks)):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.5)
    return False


def wait_gone(sock_path, label, ids):
    """The VMM tears a device down when the guest's _EJ0 ran, just after
    the guest saw it go: poll vm.info (bounded) until none is listed."""
    for _ in range(40):
        disks, nets = info_devices(sock_path, label + "_poll")
        if not any(i in disks + nets for i in ids):
            break
        time.sleep(0.5)
    info_devices(sock_path, label)


def main():
    bin_path, kernel, initrd = sys.argv[1:4]
    work = tempfile.mkdtemp()
    img = os.path.join(work, "disk.raw")
    head_md5 = make_image(img)
    say(f"HOST-IMG md5_head={head_md5}")
    sock_path = os.path.join(work, "api.sock")
    tap_fd = open_tap(*NET1)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", PORT))
    listener.listen(4)
    threading.Thread(target=sink, args=(listener,), daemon=True).start()

    cmdline = "console=ttyS0 quiet panic=-1 iommu.strict=1"
    proc = subprocess.Popen(
        [bin_path, "--kernel", kernel, "--initramfs", initrd, "--cmdline", cmdline,
         "--cpus", "boot=2", "--memory", "size=512M", "--serial", "tty", "--iommu",
         "--api-socket", f"path={sock_path}", "-v"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    marks = []
    readers = [threading.Thread(target=pump, args=(proc.stdout, "SERIAL: ", marks)),
               threading.Thread(target=pump, args=(proc.stderr, "VMM: ", marks))]
    for t in readers:
        t.start()

    rounds = [
        # (round, iommu, disk id, net id, NetConfig body, fds)
        (1, False, "hpdisk1", "hpnet1",
         {"id": "hpnet1", "mac": "52:54:00:00:01:01", "fds": [tap_fd]}, [tap_fd]),
        (2, True, "hpdisk2", "hpnet2",
         {"id": "hpnet2", "mac": "52:54:00:00:02:01", "tap": NET2[0], "ip": NET2[1],
          "mask": "255.255.255.0", "iommu": True}, []),
    ]
    for rnd, iommu, disk_id, net_id, net_cfg, fds in rounds:
        if not wait_mark(marks, f"GUEST-HP-WAIT round={rnd}", proc):
            say(f"HOST-ERROR round {rnd}: the guest never waited for devices")
            break
        disk = json.dumps({"path": img, "id": disk_id, "iommu": iommu, "readonly": True})
        call(sock_path, f"add_disk{rnd}", "PUT", "vm.add-disk", disk)
        call(sock_path, f"add_net{rnd}", "PUT", "vm.add-net", json.dumps(net_cfg), fds)
        if rnd == 1:
            # Refusals change nothing: an id in use, a descriptor that is
            # no TAP (a pipe), and a round-2-only device behind no slot.
            call(sock_path, "add_disk_dup", "PUT", "vm.add-disk", disk)
            r, w = os.pipe()
            call(sock_path, "add_net_pipe", "PUT", "vm.add-net", json.dumps({"id": "bad"}), [r])
            os.close(r)
            os.close(w)
        info_devices(sock_path, f"present{rnd}")
        if not wait_mark(marks, f"GUEST-HP-DONE round={rnd}", proc):
            say(f"HOST-ERROR round {rnd}: the guest never finished")
            break
        call(sock_path, f"remove_disk{rnd}", "PUT", "vm.remove-device", json.dumps({"id": disk_id}))
        call(sock_path, f"remove_net{rnd}", "PUT", "vm.remove-device", json.dumps({"id": net_id}))
        if not wait_mark(marks, f"GUEST-HP-GONE round={rnd}", proc):
            say(f"HOST-ERROR round {rnd}: the guest never saw the devices go")
            break
        wait_gone(sock_path, f"gone{rnd}", [disk_id, net_id])

    # The guest powers off when its script ends. A VMM that keeps serving
    # its API after its VM ended (as cloud-hypervisor's does) is ended
    # with vmm.shutdown.
    try:
        rc = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        call(sock_path, "vmm_shutdown", "PUT", "vmm.shutdown")
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            say("HOST-ERROR the VMM did not exit; stopping it")
            proc.kill()
            rc = proc.wait()
    for t in readers:
        t.join(timeout=10)
    os.close(tap_fd)
    listener.close()
    say(f"VMM-EXIT rc={rc}")


if __name__ == "__main__":
    main()
