"""Helpers the programs of resources/ share (paths, logging, commands).

Why: the programs (run-kvm, test-lanes, bench-guest, ...) each used to
carry their own copies of these; one module keeps them from drifting
apart. Standard library only: the programs run on the host, inside the
nested runner and under Debian's /usr/bin/python3 alike.
"""

import argparse
import os
import subprocess
import sys
import time

# The checkout (this file is resources/dmavisor_tools/common.py) and the
# build directory (DMAVISOR_BUILD_DIR, default build/ of the checkout).
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("DMAVISOR_BUILD_DIR", os.path.join(REPO, "build"))
# The guest and host scripts of the integration tests.
GUEST = os.path.join(REPO, "tests", "integration", "guest")


class Error(Exception):
    """A failure with a message meant for the user (no traceback)."""


def tool(name):
    """Path of one of the commands in resources/ (mkinitramfs, run-kvm, ...)."""
    return os.path.join(REPO, "resources", name)


def make_log(prog):
    """A log(msg) that prints `PROG: msg` on stderr at once."""

    def log(msg):
        print(f"{prog}: {msg}", file=sys.stderr, flush=True)

    return log


def parser(doc):
    """An argument parser whose --help shows DOC (a module docstring) as written."""
    return argparse.ArgumentParser(description=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def fetch_main(doc, fetch, log, errors=()):
    """main() of the fetch-* commands: `[--force]`, prints the path that
    fetch(force) returns; 1 with a message on Error or one of ERRORS."""
    ap = parser(doc)
    ap.add_argument("--force", action="store_true", help="fetch again even if cached")
    args = ap.parse_args()
    try:
        print(fetch(args.force))
    except (Error, *errors) as e:
        log(f"error: {e}")
        return 1
    return 0


def run(cmd, **kw):
    """Run a command, raising Error with its stderr when it fails; its stdout."""
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        raise Error(f"command failed ({res.returncode}): {' '.join(cmd)}\n{res.stderr.strip()}")
    return res.stdout


def read_text(path):
    """A small text file's content without surrounding white space, None if unreadable."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def write_executable(path, text):
    """Replace PATH atomically with an executable file holding TEXT."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o755)
    os.replace(tmp, path)


def timestamp():
    """The local time as the programs name their output directories: 20261126-064214."""
    return time.strftime("%Y%m%d-%H%M%S")


def dmavisor_binary():
    """The release dmavisor binary under CARGO_TARGET_DIR (a relative one is
    taken from the checkout, where cargo runs), default target/."""
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
    return os.path.join(REPO, target, "release", "dmavisor")


def kvm_module_loaded():
    """Whether this machine's kernel has a hardware KVM (kvm_intel or kvm_amd)."""
    return any(os.path.exists(f"/sys/module/{m}") for m in ("kvm_intel", "kvm_amd"))


def runner_is_direct():
    """Whether resources/run-kvm runs commands directly on this machine's
    KVM (else in the nested runner), as far as can be told without opening
    /dev/kvm: DMAVISOR_RUNNER=direct|nested, else a hardware KVM module."""
    forced = os.environ.get("DMAVISOR_RUNNER", "")
    return forced == "direct" or (kvm_module_loaded() and forced != "nested")
