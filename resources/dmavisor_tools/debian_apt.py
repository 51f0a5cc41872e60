"""Private apt states for Debian suites other than the machine's own.

Why: the project needs packages from suites this bookworm machine does not
have configured (trixie guest kernels, the runner's emulator from
bookworm-backports). Each gets its own apt state under build/apt-<name>/
(sources.list, lists, cache and an empty dpkg status), so nothing on the
machine changes and packages are downloaded, never installed. The source
lines reuse the mirror URIs configured on this machine at run time; no
mirror host name is written into the repository.
"""

import os
import re
import subprocess
import time

from .common import Error, run

SOURCES_DEB822 = "/etc/apt/sources.list.d/debian.sources"
SOURCES_LIST = "/etc/apt/sources.list"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"
# A private apt state older than this is refreshed with `apt-get update`.
LISTS_MAX_AGE = 6 * 3600


class AptError(Error):
    """A failure of a private apt state, with a message meant for the user."""


def configured_mirrors():
    """Return (debian_uri, security_uri or None) from this machine's apt config.

    Reads the deb822 file first, then the classic sources.list.
    """
    main = security = None
    if os.path.exists(SOURCES_DEB822):
        with open(SOURCES_DEB822, encoding="utf-8") as f:
            stanzas = f.read().split("\n\n")
        for st in stanzas:
            fields = {}
            for line in st.splitlines():
                if line.startswith("#") or ":" not in line:
                    continue
                k, v = line.split(":", 1)
                fields[k.strip().lower()] = v.strip()
            uris = fields.get("uris", "").split()
            suites = fields.get("suites", "").split()
            if "deb" not in fields.get("types", "deb").split() or not uris:
                continue
            if any(s.endswith("-security") for s in suites):
                security = security or uris[0]
            elif suites:
                main = main or uris[0]
    if main is None and os.path.exists(SOURCES_LIST):
        with open(SOURCES_LIST, encoding="utf-8") as f:
            for line in f:
                m = re.match(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", line)
                if not m:
                    continue
                if m.group(2).endswith("-security"):
                    security = security or m.group(1)
                else:
                    main = main or m.group(1)
    if main is None:
        raise AptError(f"no Debian mirror found in {SOURCES_DEB822} or {SOURCES_LIST}")
    return main, security


def private_apt_opts(build, name, suites, security_suites, log):
    """apt options selecting build/apt-<name> for SUITES; refresh it if stale.

    SECURITY_SUITES are added only when the machine has a security mirror.
    """
    base = os.path.join(build, f"apt-{name}")
    lists = os.path.join(base, "lists")
    cache = os.path.join(base, "cache")
    os.makedirs(os.path.join(lists, "partial"), exist_ok=True)
    os.makedirs(os.path.join(cache, "archives", "partial"), exist_ok=True)
    status = os.path.join(base, "status")
    if not os.path.exists(status):
        open(status, "w", encoding="utf-8").close()
    main, security = configured_mirrors()
    lines = [f"deb [signed-by={KEYRING}] {main} {s} main" for s in suites]
    if security:
        lines += [f"deb [signed-by={KEYRING}] {security} {s} main" for s in security_suites]
    srclist = os.path.join(base, "sources.list")
    content = "\n".join(lines) + "\n"
    changed = True
    if os.path.exists(srclist):
        with open(srclist, encoding="utf-8") as f:
            changed = f.read() != content
    if changed:
        with open(srclist, "w", encoding="utf-8") as f:
            f.write(content)
    opts = ["-o", f"Dir::Etc::sourcelist={srclist}",
            "-o", "Dir::Etc::sourceparts=-",
            "-o", f"Dir::State::lists={lists}",
            "-o", f"Dir::State::status={status}",
            "-o", f"Dir::Cache={cache}",
            "-o", "Dir::Etc::preferencesparts=-",
            "-o", "APT::Get::List-Cleanup=0"]
    stamp = os.path.join(base, "updated")
    fresh = os.path.exists(stamp) and time.time() - os.path.getmtime(stamp) < LISTS_MAX_AGE
    if changed or not fresh:
        log(f"refreshing private {name} apt lists")
        res = subprocess.run(["apt-get", "update", "-qq"] + opts, capture_output=True, text=True)
        if res.returncode != 0:
            raise AptError(f"apt-get update ({name}) failed: {res.stderr.strip()}")
        open(stamp, "w", encoding="utf-8").close()
    return opts


def candidate_version(policy):
    """The candidate version in `apt-cache policy` output, None if there is none."""
    m = re.search(r"^\s*Candidate:[ \t]*(\S+)", policy, re.M)
    return m.group(1) if m and m.group(1) != "(none)" else None


def debs_in(directory):
    """The .deb files in DIRECTORY, sorted by name."""
    return sorted(d for d in os.listdir(directory) if d.endswith(".deb"))


def unpack_debs(directory, root):
    """Unpack (dpkg-deb -x) every .deb of DIRECTORY into ROOT, deleting each after."""
    for deb in debs_in(directory):
        run(["dpkg-deb", "-x", os.path.join(directory, deb), root])
        os.remove(os.path.join(directory, deb))


def print_mirrors():
    """For shell scripts: this machine's Debian mirror and security mirror
    (an empty line if none), one a line."""
    main, security = configured_mirrors()
    print(main)
    print(security or "")


if __name__ == "__main__":
    # resources/mkrootfs, resources/vvi-edu-trixie:
    # PYTHONPATH=resources python3 -m dmavisor_tools.debian_apt
    print_mirrors()
