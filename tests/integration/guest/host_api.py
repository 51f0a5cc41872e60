"""What the runner-side API scripts share (console-host.py, events-host.py,
socket-host.py): one request on dmavisor's API socket, printed as the
test reads it, and ending the VMM with a bounded wait.

WHY a module beside them: the runner runs each script in place from the
checkout (the session script calls `python3 <checkout>/tests/integration/
guest/NAME.py`, the checkout being the runner's 9p root), so Python finds
this file next to the script; one copy means one HTTP reader to get right.
"""

import json
import socket
import subprocess


def request(sock_path, name, method, path, body=None):
    """One HTTP/1.1 request on the API socket; prints
    "API-REP name HTTP=code body" and returns (code, body)."""
    data = b"" if body is None else json.dumps(body).encode()
    head = (
        f"{method} /api/v1/{path} HTTP/1.1\r\nHost: localhost\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(sock_path)
    s.sendall(head + data)
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = s.recv(4096)
        if not chunk:
            break
        reply += chunk
    header, _, rest = reply.partition(b"\r\n\r\n")
    lines = header.decode(errors="replace").split("\r\n")
    parts = lines[0].split(" ")
    code = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    length = 0
    for line in lines[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == "content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = s.recv(4096)
        if not chunk:
            break
        rest += chunk
    s.close()
    text = rest.decode(errors="replace").replace("\n", " ")
    print(f"API-REP {name} HTTP={code} {text}", flush=True)
    return code, text


def wait_vmm(vmm, seconds):
    """Waits for the VMM to end after vmm.shutdown; one that outlives
    `seconds` is named with an "API-EXIT-TIMEOUT" line and killed.
    Returns its exit status."""
    try:
        return vmm.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        print(
            f"API-EXIT-TIMEOUT the VMM still runs {seconds} s after vmm.shutdown",
            flush=True,
        )
        vmm.kill()
        return vmm.wait()


def print_file(path, prefix):
    """Prints each line of the file at `path` after `prefix`; nothing if
    it cannot be read."""
    try:
        with open(path, errors="replace") as f:
            for line in f:
                print(prefix + line.rstrip("\n"))
    except OSError:
        pass
