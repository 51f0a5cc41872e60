"""Soak: repeat the guest cases most prone to crashes and stalls, count them.

    soak [--runs N] [--cases dmavisor-strict,qemu-strict,...] [--size BYTES]
         [--variant NAME[/CASE+CASE...]:VAR=VALUE[,VAR=VALUE...]]...

Why: a crash that hits one run in ten is invisible to a single `make test`.
This runs N rounds; each round runs every chosen case once (interleaved, so
a slow drift of the machine hits every configuration alike), each case in
its own runner session (a runner that dies takes only that run with it).
It prints one JSON line per run and, at the end, runs, passes, crashes and
stalls per case. Exit status 0 only if every run passed.

Cases: {vmm}-{mode} with vmm dmavisor or qemu and mode off, lazy, strict:
the vIOMMU virtio-net case of tests/viommu.rs (SIZE bytes each way,
trixie 6.12 guest, in-tree virtio-iommu driver); and dmavisor-matrix, the
own-VMM guest-driver matrix of tests/guest_driver_own_vmm.rs (bookworm 6.1
guest, vviommu with every policy and invalidation mode, TCP and DMA test
device; its QEMU counterpart runs under TCG, not on the runner's KVM, so
it has no control here). Runner settings come from
the environment as for resources/run-kvm (DMAVISOR_RUNNER_TCG, ...), so the
same soak can compare runner configurations.
"""

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time

from .common import GUEST, REPO, dmavisor_binary, parser, timestamp, tool

CASE_RE = re.compile(r"^(dmavisor|qemu)-(off|lazy|strict|matrix)$")
CASE_TIMEOUT = 900


def initramfs(out_dir):
    """The guest image of the vIOMMU net cases (same as tests/viommu.rs)."""
    path = os.path.join(out_dir, "viommu-net.cpio.gz")
    subprocess.run(
        [tool("mkinitramfs"), "--suite", "trixie",
         "--modules", "virtio_iommu virtio_net",
         "--file", f"{GUEST}/net-guest.sh:/net-guest.sh",
         "--script", f"{GUEST}/viommu-net-guest.sh", "--script-timeout", str(CASE_TIMEOUT - 60),
         "-o", path], check=True, stdout=subprocess.DEVNULL)
    return path


def crash_seen(out):
    """The crash every case can show: a guest triple fault (dmavisor's
    line) or a runner whose kernel died (run-kvm's line); None if neither."""
    if "guest triple fault" in out:
        return "guest triple fault"
    if "no exit status from L2" in out:
        return "runner kernel died"
    return None


def classify(out, rc, size):
    """(verdict, detail) of one run's combined output and exit status."""
    crash = crash_seen(out)
    if crash:
        return "crash", crash
    if "Kernel panic" in out or "Oops" in out:
        return "crash", "kernel oops or panic (guest's or runner's)"
    if len(re.findall(r"Linux version \d", out)) > 1:
        return "crash", "guest rebooted"
    if rc == 124:
        return "stall", "runner time-out or watchdog"
    if "GUEST-SCRIPT-EXIT" not in out and "VMM-EXIT" in out and "STALL" not in out:
        # QEMU runs with -no-reboot: a guest reset or triple fault ends it.
        return "crash", "guest ended before its script did"
    if "PEER-STALL" in out or "GUEST-STALL" in out:
        return "stall", next(line for line in out.splitlines() if "STALL" in line).strip()
    results = [json.loads(line.split(" ", 1)[1]) for line in out.splitlines()
               if line.startswith("PEER-RESULT ")]
    ok_bytes = [r.get("bytes") == size for r in results]
    if len(results) != 2 or not all(ok_bytes):
        return "fail", f"{len(results)} transfers complete"
    guest_md5 = {tag: m.group(1) for tag, m in
                 ((t, re.search(rf"^{t} .*md5=(\w+)", out, re.M)) for t in ("GUEST-TX", "GUEST-RX"))
                 if m}
    want = {"guest_to_host": "GUEST-TX", "host_to_guest": "GUEST-RX"}
    if any(guest_md5.get(want.get(r.get("dir"), "")) != r.get("md5") for r in results):
        return "fail", "content differs (md5)"
    if "GUEST-SCRIPT-EXIT=0" not in out or "VMM-EXIT rc=0" not in out:
        return "fail", "guest script or VMM exit status not 0"
    return "pass", ""


def parse_variant(text):
    """NAME[/CASE+CASE]:VAR=VALUE[,VAR=VALUE...] -> (NAME, {VAR: VALUE}, cases or None)."""
    name, _, assigns = text.partition(":")
    name, _, only = name.partition("/")
    env = {}
    for a in filter(None, assigns.split(",")):
        var, eq, val = a.partition("=")
        if not eq or not var.startswith("DMAVISOR_"):
            raise ValueError(f"--variant {text!r}: expected DMAVISOR_VAR=VALUE pairs")
        env[var] = val
    if not name:
        raise ValueError(f"--variant {text!r}: no name")
    return name, env, (only.split("+") if only else None)


def classify_matrix(out, rc):
    """(verdict, detail) of one own-VMM guest-driver matrix run."""
    crash = crash_seen(out)
    if crash:
        return "crash", crash
    if rc == 124 or "VVI-STALL" in out:
        return "stall", "watchdog or time-out" if rc == 124 else "VVI-STALL"
    if rc != 0 or "VVI-DONE" not in out or "GUEST-SCRIPT-EXIT=0" not in out:
        return "fail", f"exit {rc}"
    return "pass", ""


def run_case(case, variant, bin_path, kernel, initrd, size, log_dir, index):
    vmm, mode = CASE_RE.match(case).groups()
    vname, venv, _ = variant
    bin_path = venv.get("DMAVISOR_BIN", bin_path)
    if mode == "matrix":
        cmd = [os.path.join(REPO, "guest-driver", "tests", "run-dmavisor.sh"), "matrix"]
    else:
        cmd = [tool("run-kvm"), "--timeout", str(CASE_TIMEOUT), "--",
               "sh", f"{GUEST}/viommu-net-host.sh", vmm, mode, bin_path, kernel, initrd, str(size)]
    t0 = time.monotonic()
    env = dict(os.environ, DMAVISOR_RUNNER_KEEP="1", VVI_IOMMU_OPTS="queues=2")
    env.update(venv)
    env["DMAVISOR_BIN"] = bin_path
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                         text=True, errors="replace", check=False)
    secs = time.monotonic() - t0
    log = os.path.join(log_dir, f"{index:03d}-{vname}-{case}.log")
    with open(log, "w", encoding="utf-8") as f:
        f.write(res.stdout)
    if mode == "matrix":
        verdict, detail = classify_matrix(res.stdout, res.returncode)
    else:
        verdict, detail = classify(res.stdout, res.returncode, size)
    return {"soak": case, "variant": vname, "run": index, "verdict": verdict, "detail": detail,
            "rc": res.returncode, "secs": round(secs, 1), "log": log, "env": venv}


def main():
    ap = parser(__doc__)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--cases", default="dmavisor-strict,dmavisor-lazy,qemu-strict,qemu-lazy")
    ap.add_argument("--size", type=int, default=8 << 20, help="bytes each way (default 8 MiB)")
    ap.add_argument("--out", default=os.path.join(REPO, "build", "soak", timestamp()))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="runs at once (each its own runner, which keeps one host CPU busy "
                    "under the default single-threaded TCG; default: host CPUs)")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME:DMAVISOR_VAR=VALUE,...: run every case under this environment too")
    args = ap.parse_args()
    try:
        variants = [parse_variant(v) for v in args.variant] or [("default", {}, None)]
    except ValueError as e:
        ap.error(str(e))
    cases = [c for c in args.cases.split(",") if c]
    bad = [c for c in cases if not CASE_RE.match(c)]
    if any(c == "qemu-matrix" for c in cases):
        bad.append("qemu-matrix")
    if bad or not cases or args.runs < 1 or args.jobs < 1:
        ap.error(f"bad --cases {bad or cases} or --runs {args.runs}")
    os.makedirs(args.out, exist_ok=True)
    bin_path = dmavisor_binary()
    kernel = os.path.join(REPO, "build", "images", "trixie", "vmlinuz")
    initrd = initramfs(args.out)
    combos = [(v, c) for v in variants for c in cases if v[2] is None or c in v[2]]
    tally = {(v[0], c): {"runs": 0, "pass": 0, "crash": 0, "stall": 0, "fail": 0}
             for v, c in combos}
    start = time.monotonic()
    total = args.runs * len(combos)
    order = [(r * len(combos) + i + 1, v, c)
             for r in range(args.runs) for i, (v, c) in enumerate(combos)]
    done = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_case, c, v, bin_path, kernel, initrd, args.size, args.out, n)
                   for n, v, c in order]
        for fut in concurrent.futures.as_completed(futures):
            rec = fut.result()
            done += 1
            t = tally[(rec["variant"], rec["soak"])]
            t["runs"] += 1
            t[rec["verdict"]] += 1
            print(json.dumps(rec), flush=True)
            el = time.monotonic() - start
            print(f"soak: {done}/{total} (run {rec['run']}) {rec['variant']} {rec['soak']}: "
                  f"{rec['verdict']} {rec['detail']} ({rec['secs']} s; "
                  f"elapsed {el / 60:.1f} min, "
                  f"about {el / done * (total - done) / 60:.0f} min left)",
                  file=sys.stderr, flush=True)
    print(f"\n{'variant':<16}{'case':<18}{'runs':>6}{'pass':>6}{'crash':>7}{'stall':>7}"
          f"{'fail':>6}")
    for (v, c), t in tally.items():
        print(f"{v:<16}{c:<18}{t['runs']:>6}{t['pass']:>6}{t['crash']:>7}{t['stall']:>7}"
              f"{t['fail']:>6}")
    for (v, c), t in tally.items():
        print(json.dumps({"soak_summary": c, "variant": v, **t}))
    return 0 if all(t["pass"] == t["runs"] for t in tally.values()) else 1
