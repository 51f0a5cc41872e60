"""Fetch and lay out Debian guest kernels for dmavisor tests.

Why: the tests boot stock Debian kernels (bookworm 6.1 without an in-tree
virtio-iommu driver, trixie 6.12 with one). Versions move with security
updates, so the current version is resolved at run time from apt, the
generic `linux-image-<ver>-amd64` package is downloaded (never installed)
and unpacked into a cache under build/images/<suite>/:

    vmlinuz    the bzImage as shipped
    vmlinux    the ELF kernel extracted from the bzImage (for PVH boot)
    modules/   lib/modules/<kver> of the package
    version    kernel release string (e.g. 6.1.0-56-amd64)
    config     the kernel's build configuration
    package    "<package name> <package version>" (cache key)

Trixie is reached through a private apt state under build/apt-trixie whose
source lines reuse the mirror URIs configured on this machine, so no mirror
host name is ever written into the repository.

Subcommands:
    fetch [--suite bookworm|trixie|all] [--force]
    headers          apt-get install linux-headers of the bookworm version
    version --suite  print the resolved kernel release
    extract-vmlinux BZIMAGE OUT
"""

import lzma
import os
import re
import shutil
import struct
import subprocess
import tempfile
import zlib

from . import debian_apt
from .common import BUILD, Error, make_log, parser, run

SUITES = ("bookworm", "trixie")

log = make_log("guest-images")


def trixie_apt_opts():
    """apt options selecting the private trixie state; refresh it if stale."""
    return debian_apt.private_apt_opts(
        BUILD, "trixie", ["trixie", "trixie-updates"], ["trixie-security"], log)


def apt_opts(suite):
    if suite == "bookworm":
        return []
    if suite == "trixie":
        return trixie_apt_opts()
    raise Error(f"unknown suite {suite!r} (expected one of {', '.join(SUITES)})")


def resolve_version(suite, opts):
    """Kernel release (e.g. 6.1.0-56-amd64) the metapackage currently points at."""
    out = run(["apt-cache"] + opts + ["depends", "linux-image-amd64"])
    for m in re.finditer(r"Depends:\s*linux-image-(\S+-amd64)\b", out):
        return m.group(1)
    raise Error(f"cannot resolve the {suite} kernel version from:\n{out}")


def package_version(pkg, opts):
    ver = debian_apt.candidate_version(run(["apt-cache"] + opts + ["policy", pkg]))
    if ver is None:
        raise Error(f"package {pkg} has no candidate version")
    return ver


# ------------------------------------------------------------ vmlinux extract


def extract_vmlinux(bzimage_path, out_path):
    """Decompress the ELF kernel embedded in a bzImage.

    The boot protocol header (>= 2.08) gives payload_offset/payload_length
    relative to the protected-mode code, which starts after the setup
    sectors. The payload ends with the little-endian uncompressed size
    (kbuild's size_append); the result is checked against it.
    """
    with open(bzimage_path, "rb") as f:
        data = f.read()
    if len(data) < 0x250 or data[0x202:0x206] != b"HdrS":
        raise Error(f"{bzimage_path}: not a bzImage (no HdrS header)")
    (version,) = struct.unpack_from("<H", data, 0x206)
    if version < 0x208:
        raise Error(f"{bzimage_path}: boot protocol {version:#x} has no payload fields")
    setup_sects = data[0x1F1] or 4
    pm_start = (setup_sects + 1) * 512
    off, length = struct.unpack_from("<II", data, 0x248)
    payload = data[pm_start + off: pm_start + off + length]
    if len(payload) != length or length < 8:
        raise Error(f"{bzimage_path}: payload out of bounds")
    (expect,) = struct.unpack("<I", payload[-4:])
    if payload.startswith(b"\xfd7zXZ\x00"):
        dec = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        raw = dec.decompress(payload)
    elif payload.startswith(b"\x28\xb5\x2f\xfd"):
        res = subprocess.run(["zstd", "-dc", "-q"], input=payload[:-4], capture_output=True)
        if res.returncode != 0:
            raise Error(f"zstd failed: {res.stderr.decode(errors='replace').strip()}")
        raw = res.stdout
    elif payload.startswith(b"\x1f\x8b"):
        raw = zlib.decompressobj(wbits=31).decompress(payload)
    else:
        raise Error(f"{bzimage_path}: unsupported payload compression {payload[:6].hex()}")
    if not raw.startswith(b"\x7fELF"):
        raise Error(f"{bzimage_path}: decompressed payload is not an ELF file")
    if len(raw) != expect:
        raise Error(f"{bzimage_path}: decompressed {len(raw)} bytes, header says {expect}")
    tmp = out_path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(raw)
    os.replace(tmp, out_path)
    return len(raw)


# ---------------------------------------------------------------------- fetch


def refresh_lists(suite):
    """Re-read the package lists: a security update may have replaced the
    version the lists name, and the old .deb then 404s."""
    if suite == "trixie":
        stamp = os.path.join(BUILD, "apt-trixie", "updated")
        if os.path.exists(stamp):
            os.unlink(stamp)
        return
    if os.geteuid() != 0:
        raise Error("the apt lists look stale; run `apt-get update` as root and retry")
    log("refreshing the system apt lists")
    run(["apt-get", "update", "-qq"])


def fetch(suite, force=False, retried=False):
    try:
        return fetch_once(suite, force)
    except Error as e:
        if retried or "apt-get" not in str(e) or "download" not in str(e):
            raise
        log(f"{suite}: download failed, refreshing lists and retrying: {e}")
        refresh_lists(suite)
        return fetch(suite, force, retried=True)


def fetch_once(suite, force):
    opts = apt_opts(suite)
    kver = resolve_version(suite, opts)
    pkg = f"linux-image-{kver}"
    pver = package_version(pkg, opts)
    dest = os.path.join(BUILD, "images", suite)
    stamp = os.path.join(dest, "package")
    key = f"{pkg} {pver}\n"
    if not force and os.path.exists(stamp):
        with open(stamp, encoding="utf-8") as f:
            if f.read() == key:
                log(f"{suite}: {kver} ({pver}) already in {dest}")
                return dest
    dl = os.path.join(BUILD, "downloads", suite)
    os.makedirs(dl, exist_ok=True)
    debs = [n for n in os.listdir(dl) if n.startswith(f"{pkg}_") and n.endswith(".deb")
            and f"_{pver.replace(':', '%3a')}_" in n]
    if not debs:
        log(f"{suite}: downloading {pkg} {pver}")
        run(["apt-get"] + opts + ["download", "-q", f"{pkg}={pver}"], cwd=dl)
        debs = [n for n in os.listdir(dl) if n.startswith(f"{pkg}_") and n.endswith(".deb")]
    if not debs:
        raise Error(f"apt-get download produced no {pkg}*.deb in {dl}")
    deb = os.path.join(dl, sorted(debs)[-1])
    os.makedirs(os.path.join(BUILD, "images"), exist_ok=True)
    work = tempfile.mkdtemp(prefix=f".{suite}-", dir=os.path.join(BUILD, "images"))
    try:
        unpack = os.path.join(work, "root")
        log(f"{suite}: unpacking {os.path.basename(deb)}")
        run(["dpkg-deb", "-x", deb, unpack])
        out = os.path.join(work, "out")
        os.makedirs(out)
        vmlinuz = os.path.join(unpack, "boot", f"vmlinuz-{kver}")
        config = os.path.join(unpack, "boot", f"config-{kver}")
        moddir = None
        for cand in ("lib/modules", "usr/lib/modules"):
            p = os.path.join(unpack, cand, kver)
            if os.path.isdir(p):
                moddir = p
        if not os.path.exists(vmlinuz) or moddir is None:
            raise Error(f"{deb}: no boot/vmlinuz-{kver} or modules/{kver}")
        shutil.copy(vmlinuz, os.path.join(out, "vmlinuz"))
        if os.path.exists(config):
            shutil.copy(config, os.path.join(out, "config"))
        # Debian ships a one-line placeholder System.map; use it only if real.
        sysmap = os.path.join(unpack, "boot", f"System.map-{kver}")
        if os.path.exists(sysmap) and os.path.getsize(sysmap) < 4096:
            sysmap = ""
        # Debian generates modules.dep at install time; do it here with the
        # package's own System.map so symbol versions are checked.
        depbase = os.path.join(work, "dep")
        os.makedirs(os.path.join(depbase, "lib", "modules"))
        os.rename(moddir, os.path.join(depbase, "lib", "modules", kver))
        depmod = ["depmod", "-b", depbase]
        if sysmap and os.path.exists(sysmap):
            depmod += ["-F", sysmap]
        run(depmod + [kver])
        os.rename(os.path.join(depbase, "lib", "modules", kver), os.path.join(out, "modules"))
        if not os.path.exists(os.path.join(out, "modules", "modules.dep")):
            raise Error(f"{deb}: depmod produced no modules.dep")
        try:
            size = extract_vmlinux(os.path.join(out, "vmlinuz"), os.path.join(out, "vmlinux"))
            log(f"{suite}: extracted vmlinux ({size} bytes)")
        except Error as e:
            log(f"{suite}: WARNING no vmlinux: {e}")
        with open(os.path.join(out, "version"), "w", encoding="utf-8") as f:
            f.write(kver + "\n")
        with open(os.path.join(out, "package"), "w", encoding="utf-8") as f:
            f.write(key)
        if os.path.exists(dest):
            old = dest + ".old"
            shutil.rmtree(old, ignore_errors=True)
            os.rename(dest, old)
            shutil.rmtree(old, ignore_errors=True)
        os.rename(out, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # Keep only the current package in the download cache.
    for n in os.listdir(dl):
        if n.endswith(".deb") and os.path.join(dl, n) != deb:
            os.unlink(os.path.join(dl, n))
    log(f"{suite}: {kver} ready in {dest}")
    return dest


def headers():
    """Install linux-headers for the bookworm guest kernel (for out-of-tree modules)."""
    kver = resolve_version("bookworm", [])
    pkg = f"linux-headers-{kver}"
    if os.path.isdir(f"/usr/src/{pkg}"):
        log(f"{pkg} already installed")
        return
    if os.geteuid() != 0:
        raise Error(f"{pkg} is not installed; run as root: apt-get install -y {pkg}")
    log(f"installing {pkg}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    res = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", pkg],
                         env=env)
    if res.returncode != 0:
        raise Error(f"apt-get install {pkg} failed ({res.returncode})")


def main():
    ap = parser(__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="download and lay out guest kernels")
    f.add_argument("--suite", default="all", choices=SUITES + ("all",))
    f.add_argument("--force", action="store_true", help="re-unpack even when cached")
    sub.add_parser("headers", help="apt-get install the bookworm guest kernel headers")
    v = sub.add_parser("version", help="print the resolved kernel release")
    v.add_argument("--suite", default="bookworm", choices=SUITES)
    x = sub.add_parser("extract-vmlinux", help="extract the ELF kernel from a bzImage")
    x.add_argument("bzimage")
    x.add_argument("out")
    args = ap.parse_args()
    try:
        if args.cmd == "fetch":
            for s in SUITES if args.suite == "all" else (args.suite,):
                fetch(s, args.force)
        elif args.cmd == "headers":
            headers()
        elif args.cmd == "version":
            print(resolve_version(args.suite, apt_opts(args.suite)))
        elif args.cmd == "extract-vmlinux":
            print(extract_vmlinux(args.bzimage, args.out))
    except Error as e:
        log(f"error: {e}")
        return 1
    return 0
