"""Fetch DPDK's dpdk-testpmd, a vhost-user-net back-end for tests.

    fetch-testpmd [--force]     prints the path of the testpmd to run

Why: testpmd with the vhost PMD (net_vhost) and the TAP PMD (net_tap) is an
independent vhost-user-net back-end that forwards between a vhost-user
socket and a TAP interface. Bookworm's `dpdk` package (the runtime: EAL,
libraries, PMD plugins) is installed, but dpdk-testpmd itself ships in
`dpdk-dev`, whose dependencies pull in ~170 packages (libdpdk-dev, -dev
headers, every PMD). So this downloads only `dpdk-dev` and the few librte-*
libraries testpmd links that are not installed, at exactly the installed
DPDK version, unpacks them under build/testpmd/root/ (nothing is installed,
nothing on the machine changes) and writes a wrapper that adds those
libraries to the library path. The installed runtime provides the rest,
including the plug-ins EAL loads from its plugin directory by itself (no
`-d` needed): the vhost and TAP PMDs and the ring mempool driver, which
every mbuf pool needs and which `dpdk` only recommends. Packages come from
this machine's apt configuration, or from a private bookworm apt state
(resources/dmavisor_tools/debian_apt.py) when the machine's lists no longer
have the installed version.

What the downloaded packages need beyond DPDK itself (libpcap, the
rdma-core providers behind libmlx5, ...) is read from their own Depends
fields, never guessed from what a machine happens to have: missing ones are
installed with apt-get when this runs as root (resources/install-deps runs
it so), else the error names them.

Running (as root: the TAP PMD needs CAP_NET_ADMIN), e.g.:

    $(resources/fetch-testpmd) --no-pci --no-huge -m 64 --no-shconf \\
        --vdev net_vhost0,iface=/tmp/vhu.sock,client=1,queues=1,iommu-support=1 \\
        --vdev net_tap0,iface=dvtap0 \\
        -- --forward-mode=io --auto-start --stats-period 0 \\
           --total-num-mbufs=8192 --disable-link-check

Keep its stdin open (a pipe): without -i it waits for Enter after starting
forwarding and exits at end of file. It needs two lcores (one main, one
forwarding); on a single CPU map both onto it: --lcores 0@0,1@0.
"""

import glob
import os
import re
import shutil
import subprocess

from . import debian_apt
from .common import BUILD, Error, fetch_main, make_log, read_text, run, write_executable

HOME = os.path.join(BUILD, "testpmd")
WRAPPER = os.path.join(HOME, "dpdk-testpmd")
PACKAGE = "dpdk-dev"
# The installed package whose version the downloaded ones must match.
RUNTIME = "librte-eal23"
# The plug-ins EAL loads at run time that the tests need; they come from the
# installed runtime: the vhost and TAP PMDs, and the ring mempool driver
# (the default mbuf pool ops "ring_mp_mc": without it every pool creation
# fails with "Invalid argument").
PMD_PACKAGES = ["librte-net-vhost23", "librte-net-tap23", "librte-mempool-ring23"]
# Depends of the downloaded packages that are DPDK's own (downloaded and
# unpacked here, or the installed runtime) or headers testpmd does not run
# with (libdpdk-dev pulls ~170 packages).
DPDK_OWN = ("librte-", "libdpdk-", "dpdk")
SUITES = ["bookworm", "bookworm-updates"]
SECURITY = ["bookworm-security"]
SYSTEM_PMD_DIR = "/usr/lib/x86_64-linux-gnu/dpdk"


log = make_log("fetch-testpmd")


def installed_version(pkg):
    res = subprocess.run(["dpkg-query", "-W", "-f=${Status}\t${Version}", pkg],
                         capture_output=True, text=True)
    if res.returncode != 0 or "\t" not in res.stdout:
        return None
    status, ver = res.stdout.split("\t", 1)
    return ver.strip() if status.endswith(" installed") else None


def runtime_version():
    ver = installed_version(RUNTIME)
    missing = [p for p in [RUNTIME] + PMD_PACKAGES if installed_version(p) != ver or ver is None]
    if missing:
        raise Error(f"the DPDK runtime is not (fully) installed: {' '.join(missing)}; "
                    f"install it with: apt-get install dpdk {' '.join(PMD_PACKAGES)}")
    return ver


class Downloader:
    """apt-get download with the machine's apt state, else a private one."""

    def __init__(self, dest):
        self.dest = dest
        self.private = None

    def download(self, pkgs):
        cmd = ["download", "-q"] + pkgs
        res = subprocess.run(["apt-get"] + cmd, capture_output=True, text=True, cwd=self.dest)
        if res.returncode == 0:
            return
        if self.private is None:
            log("the machine's apt lists lack them; trying a private bookworm apt state")
            self.private = debian_apt.private_apt_opts(BUILD, "testpmd", SUITES, SECURITY, log)
        res = subprocess.run(["apt-get"] + self.private + cmd, capture_output=True, text=True,
                             cwd=self.dest)
        if res.returncode != 0:
            raise Error(f"cannot download {' '.join(pkgs)}: {res.stderr.strip()}\n"
                        "(is the installed DPDK runtime older than the archive's? "
                        "then upgrade it: apt-get update && apt-get install --only-upgrade dpdk)")


def package_of(soname):
    """Debian package of a DPDK library: librte_net_ice.so.23 -> librte-net-ice23."""
    m = re.fullmatch(r"lib(rte_[a-z0-9_]+)\.so\.(\d+)", soname)
    if not m:
        return None
    name = m.group(1).replace("_", "-")
    sep = "-" if name[-1].isdigit() else ""
    return f"lib{name}{sep}{m.group(2)}"


def library_path(root):
    libdir = os.path.join(root, "usr/lib/x86_64-linux-gnu")
    return [libdir] + sorted(glob.glob(os.path.join(libdir, "dpdk", "pmds-*")))


def depends_of(deb):
    """Package names of a .deb's Depends (first alternative, no versions)."""
    field = run(["dpkg-deb", "-f", deb, "Depends"]).strip()
    names = []
    for clause in filter(None, (c.strip() for c in field.split(","))):
        first = clause.split("|")[0].strip()
        names.append(re.split(r"[\s(:]", first, maxsplit=1)[0])
    return names


def system_depends(debs):
    """What the .debs in DEBS depend on beyond DPDK: the closure of
    dpdk-testpmd outside DPDK, from package metadata."""
    need = set()
    for deb in debian_apt.debs_in(debs):
        need.update(n for n in depends_of(os.path.join(debs, deb))
                    if not n.startswith(DPDK_OWN))
    return sorted(need)


def install_system(pkgs):
    """Install the packages of PKGS that are not installed (as root or with
    sudo); otherwise fail naming them."""
    missing = [p for p in pkgs if installed_version(p) is None]
    if not missing:
        return
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends"] + missing
    if os.geteuid() != 0:
        if shutil.which("sudo") is None:
            raise Error(f"dpdk-testpmd needs packages that are not installed: {' '.join(missing)}; "
                        f"install them: {' '.join(cmd)}")
        cmd = ["sudo"] + cmd
    log(f"installing what dpdk-testpmd's packages depend on: {' '.join(missing)}")
    res = subprocess.run(cmd, env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise Error(f"cannot install {' '.join(missing)} (needed by dpdk-testpmd): "
                    f"{res.stderr.strip()[-1500:]}")


def missing_libraries(root):
    env = dict(os.environ, LD_LIBRARY_PATH=":".join(library_path(root)))
    out = run(["ldd", os.path.join(root, "usr/bin/dpdk-testpmd")], env=env)
    return sorted({line.split()[0] for line in out.splitlines() if "not found" in line})


def write_wrapper(root, ver):
    path = ":".join(library_path(root))
    script = (
        "#!/bin/sh\n"
        f"# generated by resources/fetch-testpmd: bookworm's dpdk-testpmd ({PACKAGE} {ver})\n"
        "# with the few DPDK libraries it needs beyond the installed runtime.\n"
        f"export LD_LIBRARY_PATH={path}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\n"
        f"exec {root}/usr/bin/dpdk-testpmd \"$@\"\n")
    write_executable(WRAPPER, script)


def smoke_test():
    """Start testpmd without devices or shared files; it exits at end of stdin."""
    cpu = min(os.sched_getaffinity(0))
    cmd = [WRAPPER, "--lcores", f"0@{cpu},1@{cpu}", "--no-pci", "--no-huge", "-m", "32",
           "--no-shconf", "--log-level=lib.eal:warning",
           "--", "--total-num-mbufs=2048", "--disable-link-check"]
    res = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    if res.returncode != 0 or "Bye..." not in res.stdout:
        hint = ""
        if "mbuf pool" in res.stdout + res.stderr:
            hint = ("\n(no mbuf pool: is the ring mempool plug-in installed? "
                    "apt-get install librte-mempool-ring23)")
        raise Error(f"testpmd does not run: {' '.join(cmd)}\n"
                    f"{res.stdout[-2000:]}{res.stderr[-2000:]}{hint}")


def fetch(force):
    ver = runtime_version()
    stamp = os.path.join(HOME, "package")
    if not force and os.path.exists(WRAPPER) and read_text(stamp) == ver:
        return WRAPPER
    if not os.path.isdir(SYSTEM_PMD_DIR):
        raise Error(f"{SYSTEM_PMD_DIR} is missing; install the DPDK runtime: apt-get install dpdk")
    log(f"fetching dpdk-testpmd ({PACKAGE} {ver}) and the libraries it needs")
    debs = os.path.join(HOME, "debs")
    shutil.rmtree(debs, ignore_errors=True)
    os.makedirs(debs)
    root = os.path.join(HOME, "root")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    if os.path.exists(stamp):
        os.remove(stamp)
    dl = Downloader(debs)
    want, seen = [PACKAGE], set()
    for _ in range(10):
        dl.download([f"{p}={ver}" for p in want])
        install_system(system_depends(debs))
        debian_apt.unpack_debs(debs, root)
        seen.update(want)
        missing = missing_libraries(root)
        if not missing:
            break
        want = []
        for soname in missing:
            pkg = package_of(soname)
            if pkg is None:
                raise Error(f"dpdk-testpmd needs {soname}, which is not a DPDK library and "
                            "which no Depends of its packages provided; find its package with "
                            f"`apt-file search {soname}` and install it")
            if pkg in seen:
                raise Error(f"{pkg} did not provide {soname}")
            want.append(pkg)
    else:
        raise Error("the library closure of dpdk-testpmd does not converge")
    shutil.rmtree(debs, ignore_errors=True)
    write_wrapper(root, ver)
    smoke_test()
    log(f"ready: dpdk-testpmd {ver} ({WRAPPER})")
    with open(stamp, "w", encoding="utf-8") as f:
        f.write(ver + "\n")
    return WRAPPER


def main():
    # debian_apt.AptError is an Error; the smoke test may time out
    return fetch_main(__doc__, fetch, log, (subprocess.TimeoutExpired,))
