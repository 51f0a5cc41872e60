#!/usr/bin/env python3
"""Runner side of virtio_console_pty (tests/api.rs): the console as
libvirt's ch driver sets it up for `<console type='pty'>`.

    console-host.py BIN KERNEL INITRD

dmavisor with only --api-socket; a vm.create with both the serial port
and the console on tty is refused (400); vm.create with "console":
{"mode": "Pty"} and "serial": {"mode": "Pty"} (libvirt's `<console>`
and `<serial type='pty'>`), vm.boot; vm.info's config.console.file and
config.serial.file are the ptys, opened as `virsh console` does. The
guest (guest/console-guest.sh) writes a marker on hvc0, which must come
out of the console's pty; the line written into it must come back on
the guest's serial port, read from the serial's pty. Then vm.shutdown
(the console's worker stopped) and vmm.shutdown. Prints "API-REP name HTTP=code body" per request,
"CONSOLE-OBS key=value" for what it saw, the guest's serial output
("SERIAL:" lines), the VMM's log ("VMM:" lines) and "VMM-EXIT rc=N".
"""

import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time

from host_api import print_file, request, wait_vmm

LINE = "PING-7731"


def read_until(fd, needle, seconds):
    """Reads the pty until `needle` shows up; returns everything read."""
    seen = b""
    end = time.time() + seconds
    while needle not in seen and time.time() < end:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                seen += os.read(fd, 4096)
            except OSError:
                time.sleep(0.1)
    return seen


class SerialReader(threading.Thread):
    """Collects what comes out of the serial port's pty."""

    def __init__(self, fd):
        super().__init__(daemon=True)
        self.fd = fd
        self.data = b""
        self.done = False

    def run(self):
        while not self.done:
            ready, _, _ = select.select([self.fd], [], [], 0.2)
            if ready:
                try:
                    self.data += os.read(self.fd, 4096)
                except OSError:
                    time.sleep(0.1)

    def has(self, text):
        return text.encode() in self.data


def main():
    binary, kernel, initrd = sys.argv[1:4]
    work = tempfile.mkdtemp()
    sock = os.path.join(work, "api.sock")
    log = open(os.path.join(work, "vmm.log"), "w")
    vmm = subprocess.Popen([binary, "--api-socket", f"path={sock}", "-v"], stderr=log)
    t0 = time.time()
    while not os.path.exists(sock) and time.time() - t0 < 30:
        time.sleep(0.1)
    body = {
        "payload": {
            "kernel": kernel,
            "initramfs": initrd,
            "cmdline": "console=ttyS0 quiet panic=-1",
        },
        "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
        "memory": {"size": 536870912},
        "serial": {"mode": "Tty"},
        "console": {"mode": "Pty"},
    }
    conflict = dict(body, serial={"mode": "Tty"}, console={"mode": "Tty"})
    request(sock, "create_both_tty", "PUT", "vm.create", conflict)
    body["serial"] = {"mode": "Pty"}
    request(sock, "create", "PUT", "vm.create", body)
    request(sock, "boot", "PUT", "vm.boot")
    _, info = request(sock, "info", "GET", "vm.info")
    try:
        config = json.loads(info)["config"]
        pty, serial_pty = config["console"]["file"], config["serial"]["file"]
    except (ValueError, KeyError, TypeError):
        pty, serial_pty = None, None
    print(f"CONSOLE-OBS pty={pty} serial_pty={serial_pty}", flush=True)
    serial = None
    if serial_pty:
        serial = SerialReader(os.open(serial_pty, os.O_RDWR | os.O_NOCTTY))
        serial.start()
    if pty and serial:
        fd = os.open(pty, os.O_RDWR | os.O_NOCTTY)
        seen = read_until(fd, b"HVC-MARKER-5213", 300)
        print(f"CONSOLE-OBS marker_seen={int(b'HVC-MARKER-5213' in seen)}", flush=True)
        os.write(fd, (LINE + "\n").encode())
        t0 = time.time()
        while not serial.has("GUEST-ECHO") and time.time() - t0 < 60:
            time.sleep(0.2)
        print(f"CONSOLE-OBS echo_waited_s={int(time.time() - t0)}", flush=True)
        os.close(fd)
    request(sock, "shutdown", "PUT", "vm.shutdown")
    request(sock, "info_after_shutdown", "GET", "vm.info")
    request(sock, "vmm_shutdown", "PUT", "vmm.shutdown")
    rc = wait_vmm(vmm, 30)
    log.close()
    if serial:
        serial.done = True
        serial.join()
        for line in serial.data.decode(errors="replace").split("\n"):
            print("SERIAL: " + line.rstrip("\r"))
    print_file(os.path.join(work, "vmm.log"), "VMM: ")
    print(f"VMM-EXIT rc={rc}", flush=True)


if __name__ == "__main__":
    main()
