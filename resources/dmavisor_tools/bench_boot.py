"""Boot-time comparison: dmavisor against QEMU with the same guest.

    bench-boot [--suite bookworm|trixie|all] [--runs N]
               [--variants dmavisor,dmavisor-pvh,qemu-q35,qemu-microvm[,qemu-microvm-pvh]]
               [--dmavisor PATH] [--timeout SECONDS] [--jsonl OUT]

Why: boot time is the first cost users see, and QEMU on the same KVM with
the same kernel, initramfs and command line is the obvious yardstick. The
time measured is from starting the VMM process to the guest's userspace
marker (`GUEST-USERSPACE-UP`, printed by tests/integration/guest/boot-info.sh
as the first thing /init runs), plus the total until the VMM exits after the
guest powers off.

The script prepares images and the dmavisor binary on the host, then runs
itself with --inner through resources/run-kvm (directly on a VMX/SVM host,
else in the nested runner, where absolute times are TCG-inflated and only
ratios mean something). One JSON line per boot is printed on stdout, then
one line per ratio, and all lines are also written to --jsonl (default
build/bench/boot-<time>.jsonl).
"""

import argparse
import json
import os
import re
import select
import subprocess
import sys
import time

from .common import BUILD, GUEST, REPO, dmavisor_binary, make_log, parser, timestamp, tool

GUEST_SCRIPT = os.path.join(GUEST, "boot-info.sh")
CMDLINE = "console=ttyS0 quiet panic=-1"
MARKER = b"GUEST-USERSPACE-UP"
ALL_VARIANTS = ("dmavisor", "dmavisor-pvh", "qemu-q35", "qemu-microvm", "qemu-microvm-pvh")
# qemu-microvm-pvh is opt-in: QEMU's PVH path did not boot the bookworm 6.1
# vmlinux to userspace here (it stops after "No config space access function").
DEFAULT_VARIANTS = ("dmavisor", "dmavisor-pvh", "qemu-q35", "qemu-microvm")
# Ratio lines: (numerator, denominator) variant pairs.
RATIOS = (("dmavisor", "qemu-q35"), ("dmavisor", "qemu-microvm"),
          ("dmavisor-pvh", "qemu-microvm"), ("dmavisor-pvh", "qemu-microvm-pvh"))


log = make_log("bench-boot")


def prepare(args):
    """Host side: images, initramfs, dmavisor binary -> plan file."""
    suites = ("bookworm", "trixie") if args.suite == "all" else (args.suite,)
    plan = {"runs": args.runs, "timeout": args.timeout, "cmdline": CMDLINE, "boots": []}
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in ALL_VARIANTS:
            raise SystemExit(f"bench-boot: unknown variant {v!r} "
                             f"(known: {', '.join(ALL_VARIANTS)})")
    dmavisor = None
    if any(v.startswith("dmavisor") for v in variants):
        dmavisor = args.dmavisor or build_dmavisor()
    for suite in suites:
        img = os.path.join(BUILD, "images", suite)
        if not os.path.exists(os.path.join(img, "version")):
            subprocess.run([tool("guest-images"), "fetch", "--suite", suite], check=True)
        initrd = subprocess.run(
            [tool("mkinitramfs"), "--suite", suite, "--script", GUEST_SCRIPT],
            check=True, capture_output=True, text=True).stdout.strip()
        with open(os.path.join(img, "version"), encoding="utf-8") as f:
            kver = f.read().strip()
        for v in variants:
            kernel = os.path.join(img, "vmlinux" if v.endswith("-pvh") else "vmlinuz")
            if not os.path.exists(kernel):
                log(f"skipping {v}/{suite}: {kernel} missing")
                continue
            plan["boots"].append({"variant": v, "suite": suite, "kernel_release": kver,
                                  "kernel": kernel, "initrd": initrd,
                                  "argv": argv_for(v, dmavisor, kernel, initrd)})
    os.makedirs(os.path.join(BUILD, "bench"), exist_ok=True)
    path = os.path.join(BUILD, "bench", f"boot-plan-{os.getpid()}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(plan, f, indent=1)
    return path


def build_dmavisor():
    log("cargo build --release -p vmm --bin dmavisor")
    subprocess.run(["cargo", "build", "--release", "-p", "vmm", "--bin", "dmavisor"],
                   cwd=REPO, check=True)
    return dmavisor_binary()


def argv_for(variant, dmavisor, kernel, initrd):
    if variant.startswith("dmavisor"):
        return [dmavisor, "--kernel", kernel, "--initramfs", initrd, "--cmdline", CMDLINE,
                "--cpus", "boot=2", "--memory", "size=512M", "--serial", "tty"]
    machine = "q35" if variant == "qemu-q35" else "microvm"
    return ["qemu-system-x86_64", "-enable-kvm", "-cpu", "host", "-M", machine, "-smp", "2",
            "-m", "512", "-nographic", "-nodefaults", "-no-user-config", "-no-reboot",
            "-serial", "stdio", "-kernel", kernel, "-initrd", initrd, "-append", CMDLINE]


def time_boot(argv, timeout):
    """Run one boot; returns (to_userspace_s or None, total_s, exit, output)."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
    except OSError as e:
        return None, 0.0, None, f"cannot start: {e}".encode()
    out = bytearray()
    up = None
    fd = proc.stdout.fileno()
    while True:
        left = timeout - (time.monotonic() - start)
        if left <= 0:
            proc.kill()
            proc.wait()
            return up, time.monotonic() - start, None, bytes(out)
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        out += chunk
        if up is None and MARKER in out:
            up = time.monotonic() - start
    rc = proc.wait()
    return up, time.monotonic() - start, rc, bytes(out)


def inner(plan_path, jsonl):
    with open(plan_path, encoding="utf-8") as f:
        plan = json.load(f)
    results = []
    sink = open(jsonl, "a", encoding="utf-8") if jsonl else None

    def emit(obj):
        line = json.dumps(obj, sort_keys=True)
        print(line, flush=True)
        if sink:
            sink.write(line + "\n")
            sink.flush()

    env = os.environ.get("DMAVISOR_IN_RUNNER", "direct")
    # Runs are interleaved (ABAB, not AABB) so that load on a shared machine
    # drifting during the benchmark hits every variant alike.
    for run in range(plan["runs"]):
        for b in plan["boots"]:
            up, total, rc, out = time_boot(b["argv"], plan["timeout"])
            text = out.decode(errors="replace")
            m = re.search(r"cpus=(\d+)\s+online=\S+\s+memtotal_kb=(\d+)", text)
            u = re.search(r"GUEST-USERSPACE-UP uptime=([0-9.]+)", text)
            ok = up is not None and rc == 0 and "GUEST-SCRIPT-EXIT=0" in text
            res = {"bench": "boot", "variant": b["variant"], "suite": b["suite"],
                   "kernel_release": b["kernel_release"], "run": run, "env": env,
                   "to_userspace_s": round(up, 3) if up is not None else None,
                   "total_s": round(total, 3), "exit": rc, "ok": ok,
                   "guest_uptime_at_userspace_s": float(u.group(1)) if u else None,
                   "guest_cpus": int(m.group(1)) if m else None,
                   "guest_memtotal_kb": int(m.group(2)) if m else None}
            emit(res)
            if not ok:
                tail = text[-1500:]
                print(f"bench-boot: {b['variant']}/{b['suite']} failed; output tail:\n{tail}",
                      file=sys.stderr, flush=True)
            results.append(res)
    for suite in sorted({r["suite"] for r in results}):
        for num, den in RATIOS:
            a = [r["to_userspace_s"] for r in results
                 if r["suite"] == suite and r["variant"] == num and r["ok"]]
            b = [r["to_userspace_s"] for r in results
                 if r["suite"] == suite and r["variant"] == den and r["ok"]]
            if a and b:
                # Median for the typical case; min as the least disturbed run.
                ma, mb = sorted(a)[len(a) // 2], sorted(b)[len(b) // 2]
                emit({"bench": "boot-ratio", "suite": suite, "numerator": num, "denominator": den,
                      "numerator_s": ma, "denominator_s": mb, "ratio": round(ma / mb, 3),
                      "min_ratio": round(min(a) / min(b), 3), "runs": len(a), "env": env})
    return 0 if all(r["ok"] for r in results) else 1


def main():
    ap = parser(__doc__)
    ap.add_argument("--suite", default="all", choices=("bookworm", "trixie", "all"))
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                    help=f"comma-separated, from {','.join(ALL_VARIANTS)}")
    ap.add_argument("--dmavisor", help="dmavisor binary (default: cargo build --release)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per boot")
    ap.add_argument("--jsonl", help="also append JSON lines here")
    ap.add_argument("--inner", metavar="PLAN", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        return inner(args.inner, args.jsonl)
    plan = prepare(args)
    jsonl = args.jsonl or os.path.join(BUILD, "bench", f"boot-{timestamp()}.jsonl")
    jsonl = os.path.abspath(jsonl)
    with open(plan, encoding="utf-8") as f:
        boots = len(json.load(f)["boots"])
    total_timeout = 120 + boots * args.runs * (args.timeout + 10)
    # The inner half is this program again, by its command (resources/bench-boot).
    rc = subprocess.run([tool("run-kvm"), "--timeout", str(int(total_timeout)),
                         "--", tool("bench-boot"), "--inner", plan, "--jsonl", jsonl]).returncode
    os.unlink(plan)
    log(f"results in {jsonl}")
    return rc
