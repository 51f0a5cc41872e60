#!/usr/bin/env python3
"""Runner side of api_events (tests/api.rs): dmavisor started the way
libvirt's ch driver starts cloud-hypervisor.

    events-host.py BIN KERNEL INITRD

The script makes a FIFO and a listening Unix socket itself, starts
dmavisor with `--api-socket fd=N --event-monitor path=FIFO` (the socket
inherited, nothing else), and only then opens the FIFO for reading, as
libvirt does. Through the API: vm.create (serial to a file), vm.boot;
once the guest (guest/api-guest.sh) is up, vm.pause, vm.resume,
vm.shutdown, vmm.shutdown. Prints "API-REP name HTTP=code body" per
request, "EVENT source event properties" per JSON object read from the
FIFO (split on balanced braces as libvirt does), "EVENT-BAD text" for
anything that is not a well-formed event, the guest's serial output
("SERIAL:" lines), the VMM's log ("VMM:" lines) and "VMM-EXIT rc=N".
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

from host_api import print_file, request, wait_vmm


def read_events(fifo, out):
    """Reads the FIFO until every writer is gone; appends each event."""
    with open(fifo, "rb", buffering=0) as f:
        pending = b""
        while True:
            chunk = f.read(4096)
            if not chunk:
                return
            pending += chunk
            depth, start, used = 0, None, 0
            for i, b in enumerate(pending):
                if b == ord("{"):
                    if depth == 0:
                        start = i
                    depth += 1
                elif b == ord("}") and depth > 0:
                    depth -= 1
                    if depth == 0:
                        text = pending[start : i + 1].decode(errors="replace")
                        used = i + 1
                        try:
                            ev = json.loads(text)
                            ts = ev["timestamp"]
                            assert isinstance(ts["secs"], int) and isinstance(ts["nanos"], int)
                            assert "properties" in ev
                            props = json.dumps(ev["properties"], sort_keys=True)
                            line = f"EVENT {ev['source']} {ev['event']} {props}"
                        except (ValueError, KeyError, TypeError, AssertionError):
                            line = "EVENT-BAD " + text.replace("\n", " ")
                        out.append(line)
                        print(line, flush=True)
            pending = pending[used:]


def wait_serial(path, marker, seconds, vm):
    t0 = time.time()
    while time.time() - t0 < seconds and vm.poll() is None:
        try:
            with open(path, errors="replace") as f:
                if marker in f.read():
                    break
        except FileNotFoundError:
            pass
        time.sleep(0.2)
    print(f"API-OBS wait_for marker={marker} waited_s={int(time.time() - t0)}", flush=True)


def main():
    binary, kernel, initrd = sys.argv[1:4]
    d = tempfile.mkdtemp()
    fifo = os.path.join(d, "events.fifo")
    os.mkfifo(fifo, 0o600)
    sock_path = os.path.join(d, "api.sock")
    serial = os.path.join(d, "serial.log")
    log = open(os.path.join(d, "vmm.log"), "wb")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(8)
    fd = listener.fileno()
    vm = subprocess.Popen(
        [binary, "--api-socket", f"fd={fd}", "--event-monitor", f"path={fifo}", "-v"],
        pass_fds=(fd,),
        stderr=log,
    )
    listener.close()
    # libvirt opens the FIFO only now, and blocks until a writer has it.
    events = []
    reader = threading.Thread(target=read_events, args=(fifo, events), daemon=True)
    reader.start()
    request(sock_path, "ping", "GET", "vmm.ping")
    body = {
        "payload": {
            "kernel": kernel,
            "initramfs": initrd,
            "cmdline": "console=ttyS0 quiet panic=-1",
        },
        "cpus": {"boot_vcpus": 2, "max_vcpus": 2},
        "memory": {"size": 536870912},
        "serial": {"mode": "File", "file": serial},
        "console": {"mode": "Off"},
    }
    request(sock_path, "create", "PUT", "vm.create", body)
    request(sock_path, "boot", "PUT", "vm.boot")
    wait_serial(serial, "GUEST-UP", 180, vm)
    request(sock_path, "pause", "PUT", "vm.pause")
    time.sleep(1)
    request(sock_path, "resume", "PUT", "vm.resume")
    request(sock_path, "shutdown", "PUT", "vm.shutdown")
    request(sock_path, "vmm_shutdown", "PUT", "vmm.shutdown")
    rc = wait_vmm(vm, 60)
    print(f"VMM-EXIT rc={rc}", flush=True)
    reader.join(timeout=10)
    print(f"API-OBS events={len(events)} reader_done={int(not reader.is_alive())}", flush=True)
    log.close()
    print_file(serial, "SERIAL: ")
    print_file(os.path.join(d, "vmm.log"), "VMM: ")


if __name__ == "__main__":
    main()
