#!/usr/bin/env python3
"""Runner side of serial_and_console_socket (tests/api.rs): the serial
port and the virtio-console in Socket mode, as cloud-hypervisor spells it
on its command line and as libvirt's ch driver asks for
`<serial type='unix'>`.

    socket-host.py BIN KERNEL INITRD [iommu]

First, dmavisor with --serial socket=PATH on a path that exists must
refuse to start, naming it, and leave the file alone. Then dmavisor
with --serial socket=S --console socket=C --api-socket: the runner
connects to both sockets as soon as they appear; the guest
(guest/console-guest.sh) writes a marker on hvc0, which must come out of
the console's socket; the line written into it must come back on the
serial port, read from the serial's socket. vm.info shows both modes
and paths; vm.shutdown removes both socket files while the VMM serves
on (looked for up to 30 s: the teardown follows the answer);
vmm.shutdown. Prints "API-REP name HTTP=code body" per request,
"SOCKET-OBS key=value" for what it saw, the guest's serial output
("SERIAL:" lines), the VMM's log ("VMM:" lines) and "VMM-EXIT rc=N".
With "iommu" (console_socket_behind_viommu): --iommu, and the console
with iommu=on.
"""

import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time

from host_api import print_file, request, wait_vmm

LINE = "PING-4417"
MARKER = b"HVC-MARKER-5213"


def connect(path, seconds):
    """Connects to the UNIX socket at `path` once it exists."""
    end = time.time() + seconds
    while time.time() < end:
        if os.path.exists(path):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(path)
                return s
            except OSError:
                s.close()
        time.sleep(0.05)
    return None


class Reader(threading.Thread):
    """Collects what comes out of a socket."""

    def __init__(self, sock):
        super().__init__(daemon=True)
        self.sock = sock
        self.data = b""
        self.done = False

    def run(self):
        while not self.done:
            ready, _, _ = select.select([self.sock], [], [], 0.2)
            if ready:
                try:
                    chunk = self.sock.recv(4096)
                except OSError:
                    return
                if not chunk:
                    return
                self.data += chunk

    def has(self, text):
        return text in self.data


def refuses_an_existing_path(binary, kernel, initrd, work):
    """The VMM must not start on a path that exists, nor touch it."""
    taken = os.path.join(work, "taken")
    with open(taken, "w") as f:
        f.write("keep me\n")
    r = subprocess.run(
        [binary, "--kernel", kernel, "--initramfs", initrd, "--serial", f"socket={taken}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    said = " ".join(r.stderr.split())
    print(f"SOCKET-OBS exists_rc={r.returncode} exists_said={said}", flush=True)
    with open(taken) as f:
        print(f"SOCKET-OBS exists_kept={int(f.read() == 'keep me' + chr(10))}", flush=True)


def main():
    binary, kernel, initrd = sys.argv[1:4]
    behind = sys.argv[4:5] == ["iommu"]
    work = tempfile.mkdtemp()
    refuses_an_existing_path(binary, kernel, initrd, work)
    api = os.path.join(work, "api.sock")
    serial_path = os.path.join(work, "serial.sock")
    console_path = os.path.join(work, "console.sock")
    log = open(os.path.join(work, "vmm.log"), "w")
    vmm = subprocess.Popen(
        [
            binary,
            "--api-socket",
            f"path={api}",
            "--kernel",
            kernel,
            "--initramfs",
            initrd,
            "--cmdline",
            "console=ttyS0 quiet panic=-1",
            "--memory",
            "size=512M",
            "--serial",
            f"socket={serial_path}",
            "--console",
            f"socket={console_path}" + (",iommu=on" if behind else ""),
            "-v",
        ]
        + (["--iommu"] if behind else []),
        stdin=subprocess.DEVNULL,
        stderr=log,
    )
    serial_sock = connect(serial_path, 60)
    console_sock = connect(console_path, 60)
    print(
        f"SOCKET-OBS serial_connected={int(serial_sock is not None)} "
        f"console_connected={int(console_sock is not None)}",
        flush=True,
    )
    serial = None
    if serial_sock:
        serial = Reader(serial_sock)
        serial.start()
    if serial and console_sock:
        console = Reader(console_sock)
        console.start()
        t0 = time.time()
        while not console.has(MARKER) and time.time() - t0 < 300:
            time.sleep(0.2)
        print(f"SOCKET-OBS marker_seen={int(console.has(MARKER))}", flush=True)
        console_sock.sendall((LINE + "\n").encode())
        t0 = time.time()
        while not serial.has(b"GUEST-ECHO") and time.time() - t0 < 60:
            time.sleep(0.2)
        print(f"SOCKET-OBS echo_waited_s={int(time.time() - t0)}", flush=True)
    request(api, "info", "GET", "vm.info")
    request(api, "shutdown", "PUT", "vm.shutdown")
    # The VMM's main thread tears the VM down after the answer.
    t0 = time.time()
    while time.time() - t0 < 30 and (os.path.exists(serial_path) or os.path.exists(console_path)):
        time.sleep(0.1)
    gone = int(not os.path.exists(serial_path) and not os.path.exists(console_path))
    print(f"SOCKET-OBS removed_after_shutdown={gone} waited_s={time.time() - t0:.1f}", flush=True)
    request(api, "info_after_shutdown", "GET", "vm.info")
    request(api, "vmm_shutdown", "PUT", "vmm.shutdown")
    rc = wait_vmm(vmm, 30)
    log.close()
    left = int(os.path.exists(serial_path) or os.path.exists(console_path))
    print(f"SOCKET-OBS left_after_exit={left}", flush=True)
    if serial:
        serial.done = True
        serial.join()
        for line in serial.data.decode(errors="replace").split("\n"):
            print("SERIAL: " + line.rstrip("\r"))
    print_file(os.path.join(work, "vmm.log"), "VMM: ")
    print(f"VMM-EXIT rc={rc}", flush=True)


if __name__ == "__main__":
    main()
