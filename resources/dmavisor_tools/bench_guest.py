"""`make bench-guest`: guest benchmarks across VMMs, vIOMMU drivers and
vCPU counts, in one go, with a report and plots.

    bench-guest [--quick] [--runs N] [--rounds N] [--seed S] [--only PATTERN]
                [--ch PATH] [--cpus 1,2] [--workloads dma,rr] [--out DIR] [--list]
    bench-guest --report DIR      (redo report.md and the plots of a run)
    bench-guest --project DIR ... (a PROJECTION for a VMX host: the runs'
                                   event counts times native costs,
                                   projection.py; report.md has it too)

The matrix (every combination is one configuration):
  VMM      dmavisor, QEMU 7.2 (the reference; the system's
           qemu-system-x86_64 with virtio-iommu-pci and edu), and
           cloud-hypervisor with --ch PATH (no DMA test device there)
  IOMMU    off (no vIOMMU at all: one baseline per guest kernel),
           Linux's in-tree virtio-iommu driver strict and lazy (Debian
           trixie 6.12 guest), the project's vviommu driver with each IOVA
           policy x invalidation mode (Debian bookworm 6.1 guest; policy
           shared is Willmann's reference-counted shared mappings), and
           under dmavisor vviommu in page-table mode (pgt-magazine-* and
           pgt-identity-*, lazy-percpu and strict: MAPs are page-table
           writes, only invalidations are requests; --quick has none,
           --demo pgt-magazine-lazy-percpu only)
  vCPUs    1 and 2 (--cpus)
Workloads in every configuration, each repeated --runs times inside the
guest:
  dma      the vvi_edu DMA microbenchmark (4 KiB dma_map_single + unmap on
           every vCPU; ops/s, and requests per DMA from vviommu's counters,
           which Linux's driver does not have); the 6.12 guests' vvi_edu
           is built in a trixie chroot (resources/vvi-edu-trixie, about a
           minute once), so --quick runs it on 6.1 guests only
  tcp_tx   iperf3, guest to peer, Kbit/s
  tcp_rx   iperf3 -R, peer to guest, Kbit/s
  rr       sockperf ping-pong over TCP, mean round-trip latency in us
The peer (iperf3 -s, sockperf server) runs where the VMM runs, on the host
end of the NIC's TAP; the guest gets copies of the Debian binaries and
their libraries in its initramfs.

Plumbing shared with the integration tests: guest kernels from
resources/guest-images, initramfs from resources/mkinitramfs, guest and
runner scripts in tests/integration/guest/ (bench-guest.sh,
bench-host.sh), and ONE session of resources/run-kvm (directly on a KVM
host, else in the nested runner) running every guest boot as a case in the
@@CASE-BEGIN/@@CASE-END format of tests/integration/src/session.rs.
A vviommu boot runs all its policy x invalidation configurations in turn,
so a whole (VMM, vCPUs) column costs four boots.

Method (issue 30): every round (--rounds) boots the plan in its own order,
shuffled with --seed (drawn at random unless given; printed and recorded),
so that no VMM always meets the same point of the runner's slow spells.
Every run of every round is kept, each with its round (= its boot).

Output (build/bench/<timestamp>/ unless --out): results.jsonl (one JSON
object per configuration, every run's figures of every round, and per boot
the cost probe (`costs`), the NIC's maps and requests (`net_dma`) and the
dma-direct baseline (`dma_direct_runs`)), plan.json, report.md (median,
min-max over all runs, runs and boots, ratio to no IOMMU, requests per
DMA, VMM vs QEMU for the same configuration, the headline with every
configuration of the project's driver and the range over all of them, and
every VMM-to-VMM comparison with its Mann-Whitney p: "faster" or "slower"
only with p < 0.05 over at least 6 runs from 3 boots per side, else "no
significant difference"), PNG plots (throughput.png, latency.png,
dma.png, requests_per_dma.png), session.log.

In the nested runner everything is TCG: compare ratios, not absolutes.

Exit status: 0 when every configuration produced its figures, 1 when some
did not (the report says which), 2 on bad usage.
"""

import fnmatch
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time

from . import latency, projection
from .common import (
    BUILD,
    GUEST,
    REPO,
    dmavisor_binary,
    make_log,
    parser,
    runner_is_direct,
    timestamp,
    tool,
)
from .stats import boots_of, compare, shuffled_rounds, spread_text, value_range, verdict_text

BEGIN, END = "@@CASE-BEGIN", "@@CASE-END"

# shared: Willmann's shared mappings (guest-driver/vviommu_shared.c), the
# seed paper's strategy compared with magazine and identity (issue 30)
POLICIES = ["identity", "kmalloc", "magazine", "global", "persistent", "passthrough", "shared"]
INVALS = ["strict", "lazy-global", "lazy-percpu"]
QUICK_VVI = [("magazine", "lazy-percpu"), ("magazine", "strict")]
# The project's best policy for the demo's headline: the candidates, the
# best of which (DMA ops/s) is shown.
DEMO_VVI = [("magazine", "lazy-percpu"), ("magazine", "strict")]
# vviommu in page-table mode (pgtable=1, docs/page-table.md): dmavisor only,
# QEMU's device does not offer the feature. Labelled pgt-<policy>-<inval>.
# identity (issue 30): the native build's cheapest page-table pair, in the
# full matrix only so that --quick, --demo and `make test` keep their boots.
PGT_VVI = [("magazine", "lazy-percpu"), ("magazine", "strict"),
           ("identity", "lazy-percpu"), ("identity", "strict")]
QUICK_PGT = []
DEMO_PGT = [("magazine", "lazy-percpu")]
DRIVERS_VVI = ("vvi", "pgt")  # the project's driver, either mode
# The policies that protect and are the project's own: the headline's
# "best policy" is one of these (passthrough maps all of RAM, persistent
# keeps mappings after unmap, global is the unscalable baseline).
PROJECT_POLICIES = ("identity", "kmalloc", "magazine", "shared")
KERNEL = {"bookworm": "6.1", "trixie": "6.12"}
WORKLOADS = {  # name: (label, unit, higher is better)
    "dma": ("DMA map+unmap", "ops/s", True),
    "tcp_tx": ("TCP guest->peer (iperf3)", "Kbit/s", True),
    "tcp_rx": ("TCP peer->guest (iperf3 -R)", "Kbit/s", True),
    "rr": ("TCP request/response (sockperf ping-pong)", "us", False),
}
FIELD = {"dma": "ops_per_sec", "tcp_tx": "kbps", "tcp_rx": "kbps", "rr": "lat_us"}


log = make_log("bench-guest")


# ---------------------------------------------------------------- the plan


def config_id(vmm, cpus, iommu):
    return f"{vmm}/{cpus}cpu/{iommu}"


def selected_workloads(args):
    """The workloads every boot runs (--workloads; all by default)."""
    sel = getattr(args, "workloads", None)
    return [w for w in WORKLOADS if not sel or w in sel.split(",")]


def plan_boots(args):
    """The guest boots: each is one runner case and holds one or more
    configurations (guest label -> configuration)."""
    wanted = selected_workloads(args)
    vmms = ["dmavisor", "qemu"] + (["ch"] if args.ch else [])
    if args.demo:
        vmms, cpus_list = ["dmavisor"], [2]
    else:
        cpus_list = [int(c) for c in args.cpus.split(",")]
    if args.quick or args.demo:
        vvi = DEMO_VVI if args.demo else QUICK_VVI
        pgt = DEMO_PGT if args.demo else QUICK_PGT
        linux = ["lazy"]
    else:
        vvi = [(p, i) for i in INVALS for p in POLICIES]
        pgt = PGT_VVI
        linux = ["strict", "lazy"]
    boots = []
    for vmm in vmms:
        for cpus in cpus_list:
            def boot(suite, mode, iommu, configs, vmm=vmm, cpus=cpus):
                # the DMA microbenchmark: not under cloud-hypervisor (no
                # DMA test device), nor on 6.12 guests in quick mode (their
                # vvi_edu build costs a trixie chroot, about a minute)
                dma = (vmm != "ch" and (suite == "bookworm" or not args.quick)
                       and "dma" in wanted)
                return {"vmm": vmm, "cpus": cpus, "suite": suite, "mode": mode,
                        "iommu": iommu, "configs": configs, "dma": dma,
                        "workloads": wanted}
            boots.append(boot("bookworm", "off", "off", {"off": "off-6.1"}))
            labels = {f"vvi-{p}-{i}": f"vvi-{p}-{i}" for p, i in vvi}
            if vmm == "dmavisor":
                labels.update({f"pgt-{p}-{i}": f"pgt-{p}-{i}" for p, i in pgt})
            boots.append(boot("bookworm", "vvi", "on", labels))
            if not args.quick:
                # (quick mode skips this baseline: Linux's rows then have
                # no ratio, but the mode costs a boot less per VMM)
                boots.append(boot("trixie", "off", "off", {"off": "off-6.12"}))
            for mode in linux:
                boots.append(boot("trixie", "linux", "on", {f"linux-{mode}": f"linux-{mode}"}))
    pats = [p for p in args.only.split(",") if p] if args.only else []
    out = []
    for b in boots:
        keep = {lbl: it for lbl, it in b["configs"].items()
                if not pats or any(matches(config_id(b["vmm"], b["cpus"], it), p) for p in pats)}
        if keep:
            b["configs"] = keep
            kind = next(iter(keep.values())) if b["mode"] == "linux" else b["mode"]
            b["name"] = f"{b['vmm']}-{b['cpus']}cpu-{b['suite']}-{kind}"
            out.append(b)
    return interleave_rounds(out, args.rounds, args.seed)


def interleave_rounds(boots, rounds, seed):
    """The plan `rounds` times over, one whole pass after the other, each
    pass in its own seeded order (stats.shuffled_rounds), so that a slow
    spell of the shared machine falls on every VMM rather than on the one
    whose boots it met; figures of every round are kept and pooled."""
    out = shuffled_rounds(boots, rounds, seed)
    if rounds > 1:
        out = [{**b, "name": f"{b['name']}-r{b['round']}"} for b in out]
    return out


def matches(cid, pat):
    if any(c in pat for c in "*?["):
        return fnmatch.fnmatch(cid, pat)
    return pat in cid


def configurations(boots):
    """(id, vmm, cpus, iommu, suite) of every configuration, in plan order."""
    seen = {}
    for b in boots:
        for it in b["configs"].values():
            cid = config_id(b["vmm"], b["cpus"], it)
            seen.setdefault(cid, (cid, b["vmm"], b["cpus"], it, b["suite"]))
    return list(seen.values())


def predict_secs(b, args):
    """A-priori seconds of one boot in the nested runner (TCG, 256 MiB
    guests), refined during the run by how long finished boots took."""
    boot = {"dmavisor": 30, "qemu": 45, "ch": 35}[b["vmm"]] * max(1.0, args.mem / 256)
    net = [w for w in b.get("workloads", WORKLOADS) if w != "dma"]
    per = args.runs * len(net) * (args.secs + 3) + 6
    if b.get("dma"):
        per += args.runs * (2 + (args.dma_ms / 1000 if args.dma_ms else args.iters / 100))
    return boot + per * len(b["configs"])


# ------------------------------------------------------------- preparation


def run(cmd, **kw):
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, **kw)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(map(shlex.quote, cmd))} failed ({res.returncode}):\n"
                           f"{res.stderr[-3000:]}")
    return res.stdout


def guest_binaries():
    """--file arguments for iperf3 and sockperf with their libraries and
    the dynamic loader, at the paths the binaries expect."""
    files = {}
    for name in ("iperf3", "sockperf"):
        path = shutil.which(name)
        if not path:
            raise RuntimeError(f"{name} not found (resources/install-deps installs it)")
        files[path] = f"/usr/bin/{name}"
        for line in run(["ldd", path]).splitlines():
            m = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
            if m:
                files[os.path.realpath(m.group(1))] = m.group(1)
    return [f"{src}:{dest}" for src, dest in sorted(files.items())]


def prepare(boots, args):
    """Images, modules, binaries and one initramfs per guest suite."""
    suites = sorted({b["suite"] for b in boots})
    version = {}
    for s in suites:
        vfile = os.path.join(BUILD, "images", s, "version")
        if not os.path.exists(vfile):
            log(f"fetching the {s} guest kernel")
            run([tool("guest-images"), "fetch", "--suite", s])
        with open(vfile, encoding="utf-8") as f:
            version[s] = f.read().strip()
    tools = guest_binaries()
    initrd = {}
    for s in suites:
        cmd = [tool("mkinitramfs"), "--suite", s,
               "--script", os.path.join(GUEST, "bench-guest.sh"), "--script-timeout", "7200"]
        if s == "bookworm":
            kver = version[s]
            run(["make", "-s", "-C", os.path.join(REPO, "guest-driver"), f"KVER={kver}"])
            netko = os.path.join(BUILD, "images", s, "modules", "kernel", "drivers", "net",
                                 "virtio_net.ko")
            cmd += ["--modules", "virtio_pci failover net_failover",
                    "--file", f"{REPO}/guest-driver/vviommu.ko:/opt/vvi/vviommu.ko",
                    "--file", f"{REPO}/guest-driver/vvi_edu.ko:/opt/vvi/vvi_edu.ko",
                    "--file", f"{netko}:/opt/vvi/virtio_net.ko"]
        else:
            cmd += ["--modules", "virtio_iommu failover net_failover virtio_net"]
            if any(b.get("dma") for b in boots if b["suite"] == s):
                log(f"building vvi_edu for the {s} kernel (resources/vvi-edu-trixie)")
                try:
                    ko = run([tool("vvi-edu-trixie"), version[s]]).strip()
                    cmd += ["--file", f"{ko}:/opt/vvi/vvi_edu.ko"]
                except RuntimeError as e:
                    # e.g. not root: the network figures are still worth having
                    log(f"no DMA microbenchmark on {s} guests: {e}")
                    for b in boots:
                        if b["suite"] == s:
                            b["dma"] = False
        for t in tools:
            cmd += ["--file", t]
        initrd[s] = run(cmd).strip()
    binary = {"qemu": "-", "ch": args.ch or "-"}
    if any(b["vmm"] == "dmavisor" for b in boots):
        binary["dmavisor"] = os.environ.get("DMAVISOR_BIN") or ""
        if not binary["dmavisor"]:
            log("building dmavisor (cargo build --release -p vmm --bin dmavisor)")
            run([os.environ.get("CARGO", "cargo"), "build", "--release", "-q", "-p", "vmm",
                 "--bin", "dmavisor"], cwd=REPO)
            binary["dmavisor"] = dmavisor_binary()
    kernels = {s: os.path.join(BUILD, "images", s, "vmlinuz") for s in suites}
    pvh = {s: os.path.join(BUILD, "images", s, "vmlinux") for s in suites}
    return {"initrd": initrd, "binary": binary, "kernel": kernels, "pvh": pvh,
            "version": version}


def boot_cmdline(b, args):
    parts = ["console=ttyS0", "quiet", "panic=-1", f"bench_mode={b['mode']}",
             f"bench_runs={args.runs}", f"bench_iters={args.iters}", f"bench_secs={args.secs}",
             f"bench_dma_ms={args.dma_ms}"]
    if b.get("workloads") and len(b["workloads"]) < len(WORKLOADS):
        parts.append("bench_workloads=" + ",".join(b["workloads"]))
    if b["mode"] == "vvi":
        if args.vvi_params:
            parts.append("bench_vvi_params=" + ",".join(args.vvi_params.split()))
        # vvi-P-I -> P:I, pgt-P-I -> P:I:pgt (bench-guest.sh)
        parts.append("bench_configs=" + ",".join(
            lbl[4:].replace("-", ":", 1) + (":pgt" if lbl.startswith("pgt-") else "")
            for lbl in b["configs"]))
    else:
        parts.append(f"bench_label={next(iter(b['configs']))}")
    if b["configs"].get("linux-strict"):
        parts.append("iommu.strict=1")
    return " ".join(parts)


def session_script(boots, prep, args):
    """The cases in the format of tests/integration/src/session.rs."""
    lines = ["#!/bin/sh", "# generated by resources/bench-guest"]
    for b in boots:
        kernel = prep["pvh" if b["vmm"] == "ch" else "kernel"][b["suite"]]
        argv = ["sh", os.path.join(GUEST, "bench-host.sh"), b["vmm"], prep["binary"][b["vmm"]],
                kernel, prep["initrd"][b["suite"]], str(b["cpus"]), b["iommu"],
                boot_cmdline(b, args), str(args.mem)]
        t = int(predict_secs(b, args) * 4 + 180)
        lines += [f"echo '{BEGIN} {b['name']}'", "t0=$(date +%s%N)",
                  f"timeout -k 5 {t} {' '.join(shlex.quote(a) for a in argv)} </dev/null 2>&1",
                  "rc=$?", "t1=$(date +%s%N)",
                  f"echo \"{END} {b['name']} rc=$rc ns=$((t1 - t0))\""]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------- run


def fmt_secs(s):
    s = int(s)
    return f"{s // 60}m{s % 60:02d}s"


class Progress:
    """Prints configuration i of n, elapsed time and an estimate of the rest
    (the plan's a-priori durations scaled by how fast finished boots went)."""

    def __init__(self, boots, args):
        self.boots = {b["name"]: b for b in boots}
        self.pred = {b["name"]: predict_secs(b, args) for b in boots}
        self.n = sum(len(b["configs"]) for b in boots)
        self.done_cfg = 0
        self.done_boots = []
        self.done_secs = 0.0
        self.t0 = time.monotonic()
        self.case_t0 = self.t0
        self.current = None

    def remaining(self):
        done_pred = sum(self.pred[n] for n in self.done_boots)
        scale = self.done_secs / done_pred if done_pred else 1.0
        left = sum(p for n, p in self.pred.items() if n not in self.done_boots) * scale
        if self.current:
            left -= min(time.monotonic() - self.case_t0, self.pred[self.current] * scale)
        return max(0.0, left)

    def line(self, what):
        el = time.monotonic() - self.t0
        log(f"[{self.done_cfg}/{self.n} configurations] {what}; elapsed {fmt_secs(el)}, "
            f"about {fmt_secs(self.remaining())} left")

    def feed(self, line):
        if line.startswith(BEGIN):
            self.current = line.split()[1]
            self.case_t0 = time.monotonic()
            self.line(f"boot {self.current} ({', '.join(self.boots[self.current]['configs'])})")
        elif line.startswith(END):
            name = line.split()[1]
            self.done_boots.append(name)
            self.done_secs += time.monotonic() - self.case_t0
            self.current = None
        elif "BENCH-CONFIG-BEGIN" in line and self.current:
            b = self.boots[self.current]
            lbl = line.split("iommu=")[-1].strip()
            cid = config_id(b["vmm"], b["cpus"], b["configs"].get(lbl, lbl))
            log(f"configuration {self.done_cfg + 1} of {self.n}: {cid} "
                f"(elapsed {fmt_secs(time.monotonic() - self.t0)}, "
                f"about {fmt_secs(self.remaining())} left)")
        elif "BENCH-CONFIG-END" in line:
            self.done_cfg += 1


def run_session(boots, prep, args, outdir):
    script = os.path.join(outdir, "session.sh")
    with open(script, "w", encoding="utf-8") as f:
        f.write(session_script(boots, prep, args))
    total = sum(predict_secs(b, args) * 4 + 200 for b in boots) + 300
    prog = Progress(boots, args)
    log(f"{prog.n} configurations in {len(boots)} guest boots, one runner session "
        f"(estimate {fmt_secs(sum(prog.pred.values()) + 60)})")
    cmd = [tool("run-kvm"), "--timeout", str(int(total)),
           "--", "/bin/sh", script]
    out = []
    with open(os.path.join(outdir, "session.log"), "w", encoding="utf-8") as logf, \
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, text=True, errors="replace",
                             cwd=REPO) as p:
        for raw in p.stdout:
            line = raw.replace("\r", "").rstrip("\n")
            out.append(line)
            logf.write(line + "\n")
            logf.flush()
            if args.verbose:
                print(line, file=sys.stderr)
            prog.feed(line)
        rc = p.wait()
    log(f"runner session ended with status {rc} after "
        f"{fmt_secs(time.monotonic() - prog.t0)}")
    return out, time.monotonic() - prog.t0


def kv_fields(text):
    return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", text))


def parse(lines, boots):
    """One record per configuration of the plan, in plan order."""
    by_name = {b["name"]: b for b in boots}
    recs = {}
    for cid, vmm, cpus, iommu, suite in configurations(boots):
        kind = "off" if iommu.startswith("off") else iommu.split("-")[0]
        rec = {"id": cid, "vmm": vmm, "vcpus": cpus, "iommu": iommu,
               "guest": f"debian-{suite}-{KERNEL[suite]}", "driver": kind,
               "workloads": {w: [] for w in WORKLOADS}, "errors": [], "failed_runs": [],
               "case": None}
        if kind in DRIVERS_VVI:
            _, rest = iommu.split("-", 1)
            rec["policy"], rec["invalidation"] = rest.split("-", 1)
        elif kind == "linux":
            rec["invalidation"] = iommu.split("-", 1)[1]
        recs[cid] = rec
    for b in boots:
        for it in b["configs"].values():
            r = recs[config_id(b["vmm"], b["cpus"], it)]
            if "dma" in b:
                r["dma"] = b["dma"]
            if b.get("workloads"):
                # --workloads: the ones the plan ran (not missing figures)
                r["planned_workloads"] = list(b["workloads"])
    case = None
    for line in lines:
        if line.startswith(BEGIN):
            case = by_name.get(line.split()[1])
            continue
        if line.startswith(END):
            f = kv_fields(line)
            if case:
                for it in case["configs"].values():
                    r = recs[config_id(case["vmm"], case["cpus"], it)]
                    boot = {"name": case["name"], "exit": int(f.get("rc", -1)),
                            "secs": round(int(f.get("ns", 0)) / 1e9, 1),
                            "round": case.get("round", 1)}
                    # every boot of the configuration, in the order they ran
                    r.setdefault("cases", []).append(boot)
                    # with several rounds, a failed boot's case is the one kept
                    if r["case"] is None or r["case"]["exit"] == 0:
                        r["case"] = boot
            case = None
            continue
        if not case:
            continue
        i = line.find("BENCH")
        if i < 0:
            continue
        body = line[i:]
        words = body.split()
        f = kv_fields(body)
        if words[0] == "BENCH-INFO" and f.get("dma_direct"):
            # the DMA rate without vviommu right before a configuration
            # (iommu= names it), or, in runs from before 2026-11-26
            # afternoon, once at the start of the boot for all of them
            lbl = f.get("iommu")
            targets = ([case["configs"][lbl]] if lbl in case["configs"]
                       else case["configs"].values())
            for it in targets:
                r = recs[config_id(case["vmm"], case["cpus"], it)]
                r.setdefault("dma_direct_same_boot", []).append(float(f["dma_direct"]))
                # with its round, so that a ratio pairs it with its own boot
                r.setdefault("dma_direct_runs", []).append(
                    {"round": case.get("round", 1), "value": float(f["dma_direct"])})
            continue
        lbl = f.get("iommu")
        if lbl not in case["configs"]:
            continue
        r = recs[config_id(case["vmm"], case["cpus"], case["configs"][lbl])]
        if words[0] == "BENCH" and len(words) > 1 and words[1] in WORKLOADS:
            w = words[1]
            try:
                val = float(f.get(FIELD[w], ""))
            except ValueError:
                r["failed_runs"].append(f"{w} run {f.get('run')}: no figure"
                                        + (f" ({f['why']})" if f.get("why") else ""))
                continue
            if w == "dma" and (int(f.get("errors", "0") or 0) or val <= 0):
                r["failed_runs"].append(f"dma run {f.get('run')}: errors={f.get('errors')}")
                continue
            entry = {"run": int(f.get("run", 0)), "value": val, "round": case.get("round", 1)}
            if w == "dma":
                entry.update(maps=int(f.get("maps", 0)), requests=int(f.get("requests", 0)),
                             cpus=int(f.get("cpus", 0) or 0),
                             alloc_slow=int(f.get("alloc_slow", 0) or 0),
                             flushes=int(f.get("flushes", 0) or 0),
                             flush_ns=int(f.get("flush_ns", 0) or 0),
                             flush_wait_ns=int(f.get("flush_wait_ns", 0) or 0))
            if w in ("tcp_tx", "tcp_rx") and f.get("irq_in", "").isdigit():
                # the NIC's interrupts during the run (bench-guest.sh with_irqs)
                entry.update(irq_in=int(f["irq_in"]), irq_out=int(f.get("irq_out", "0") or 0))
            r["workloads"][w].append(entry)
        elif words[0] == "BENCH-ERROR":
            r["errors"].append(f"guest: {f.get('what')}")
        elif words[0] == "BENCH-COSTS":
            # vviommu's cost probe: ns per piece of a map + unmap, one
            # entry per boot (every round's, not only the last one's)
            costs = {k: int(v) for k, v in f.items() if k.endswith("_ns") and v.isdigit()}
            if costs:
                r.setdefault("costs", []).append({"round": case.get("round", 1), **costs})
        elif words[0] == "BENCH-NETSTATS":
            # the NIC's maps and requests during the TCP runs, per boot
            r.setdefault("net_dma", []).append(
                {"round": case.get("round", 1), "maps": int(f.get("maps", 0) or 0),
                 "requests": int(f.get("requests", 0) or 0)})
    for r in recs.values():
        expected = expected_workloads(r)
        missing = [w for w in expected if len(r["workloads"][w]) == 0]
        r["expected_workloads"] = expected
        r["status"] = "ok" if not missing and not r["errors"] else "incomplete"
        if missing:
            r["errors"].append("no figures for " + ",".join(missing))
        dma = r["workloads"]["dma"]
        maps = sum(e["maps"] for e in dma)
        r["requests_per_dma"] = (round(sum(e["requests"] for e in dma) / maps, 4)
                                 if maps else None)
    return list(recs.values())


def expected_workloads(r):
    """Workloads a configuration must have figures for: the DMA
    microbenchmark where its boot ran it (plan_boots), the network ones
    everywhere. Runs from before the 6.12 DMA figures have no "dma" key:
    there only 6.1 guests outside cloud-hypervisor ran it."""
    dma = r.get("dma", r["guest"].endswith("-6.1") and r["vmm"] != "ch")
    net = [w for w in r.get("planned_workloads", WORKLOADS) if w != "dma"]
    return (["dma"] if dma else []) + net


# ------------------------------------------------------------------ report


def summary(entries):
    vals = [e["value"] for e in entries]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def baseline_of(r, recs):
    """The no-IOMMU configuration of the same VMM, vCPUs and guest kernel."""
    off = "off-" + r["guest"].rsplit("-", 1)[1]
    return recs.get(config_id(r["vmm"], r["vcpus"], off))


def num(v, unit=""):
    if v is None:
        return "–"
    if abs(v) >= 100:
        s = f"{v:,.0f}"
    elif abs(v) >= 10:
        s = f"{v:.1f}"
    else:
        s = f"{v:.2f}"
    return s + (f" {unit}" if unit else "")


def rnum(v):
    """A ratio with 3 significant digits (DMA ratios under TCG reach 0.003)."""
    return "–" if v is None else f"{v:.3g}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def med(r, w):
    s = summary(r["workloads"][w]) if r else None
    return s["median"] if s else None


def runs_of(r, w):
    return r["workloads"].get(w, []) if r else []


def base_runs(r, w, recs):
    """The baseline runs a configuration's workload w is divided by, and
    what they are: for the DMA microbenchmark the same boot's dma-direct
    rate measured right before the configuration (bench-guest.sh) where
    the run has it, else the no-IOMMU boot of the same VMM, vCPUs and
    guest kernel (another boot: the runner's speed differs between boots,
    issue 30)."""
    if w == "dma" and r.get("dma_direct_runs"):
        return r["dma_direct_runs"], "dma-direct, same boot"
    return runs_of(baseline_of(r, recs), w), "no-IOMMU boot"


def ratio_summary(r, w, recs):
    """r over its baseline (base_runs), as claims.py and the READMEs quote
    it: the ratio of the medians, and the range of every run over the
    baseline's median; runs, boots and the DMA runs' flushes."""
    rs = runs_of(r, w)
    bs, what = base_runs(r, w, recs)
    if not rs or not bs:
        return None
    base = statistics.median(e["value"] for e in bs)
    if not base:
        return None
    vals = [e["value"] / base for e in rs]
    return {"median": statistics.median(e["value"] for e in rs) / base,
            "min": min(vals), "max": max(vals), "n": len(vals), "boots": boots_of(rs),
            "base": what, "flushes": sum(e.get("flushes", 0) for e in rs)}


def project_config(r):
    """The project's driver with one of its own protecting policies."""
    return r["driver"] in DRIVERS_VVI and r.get("policy") in PROJECT_POLICIES


def headline(records):
    """The cost of protection per (VMM, vCPUs): EVERY configuration of the
    project's driver with one of its own policies, and Linux's in-tree
    driver, as ratios to their baseline with the range over all runs (not
    the best configuration of a group, issue 30), and the comparison with
    QEMU's same configuration tested across boots (stats.compare)."""
    recs = {r["id"]: r for r in records}
    out = []
    groups = sorted({(r["vmm"], r["vcpus"]) for r in records},
                    key=lambda g: (["dmavisor", "qemu", "ch"].index(g[0]), g[1]))
    for vmm, cpus in groups:
        rows = [r for r in records if r["vmm"] == vmm and r["vcpus"] == cpus]
        cands = [r for r in rows if project_config(r)] + [
            r for r in rows if r["driver"] == "linux"]
        for r in cands:
            line = {"vmm": vmm, "vcpus": cpus, "iommu": r["iommu"],
                    "project": project_config(r),
                    "requests_per_dma": r.get("requests_per_dma")}
            for w in WORKLOADS:
                line[w] = ratio_summary(r, w, recs)
            q = recs.get(config_id("qemu", cpus, r["iommu"]))
            if vmm != "qemu" and q:
                for w in ("dma", "tcp_rx"):
                    if runs_of(r, w) and runs_of(q, w):
                        line[f"vs_qemu_{w}"] = {
                            "ratio": ratio(med(r, w), med(q, w)),
                            "test": compare(runs_of(r, w), runs_of(q, w), WORKLOADS[w][2])}
            out.append(line)
    return out


def group_ranges(lines):
    """Per (VMM, vCPUs), the range of every run's ratio over all of the
    project's configurations: the figure to quote for "the project's
    driver keeps x-y%"."""
    out = []
    for key in dict.fromkeys((h["vmm"], h["vcpus"]) for h in lines):
        mine = [h for h in lines if (h["vmm"], h["vcpus"]) == key and h["project"]]
        if not mine:
            continue
        g = {"vmm": key[0], "vcpus": key[1], "configs": len(mine)}
        for w in ("dma", "tcp_rx", "tcp_tx", "rr"):
            g[w] = value_range([h[w]["min"] for h in mine if h[w]]
                               + [h[w]["max"] for h in mine if h[w]])
        out.append(g)
    return out


def pct(v):
    """A ratio as a percentage: two significant digits, never exponents."""
    if v is None:
        return "–"
    p = 100 * v
    return f"{p:.0f}%" if p >= 10 else f"{p:.2g}%"


def swing_text(records):
    """How far the runs of one configuration differ in this run."""
    sw = []
    for r in records:
        for entries in r["workloads"].values():
            v = [e["value"] for e in entries if e["value"] > 0]
            if len(v) > 1:
                sw.append(max(v) / min(v))
    if not sw:
        return "Every configuration has one run per workload: no spread to show."
    return (f"The runs of one configuration and workload differ by up to x{max(sw):.3g} "
            f"(max/min; median x{statistics.median(sw):.2g}) in this run.")


def ratio_text(s):
    """A ratio summary: median (min-max over every run, runs/boots)."""
    return spread_text(s, pct)


def headline_text(records):
    lines = []
    hl = headline(records)
    for h in hl:
        s = f"{h['vmm']:<8} {h['vcpus']} vCPU  {h['iommu']:<26}"
        if h["dma"]:
            s += f" DMA {ratio_text(h['dma'])} of {h['dma']['base']}"
            if h["dma"]["flushes"]:
                s += f", {h['dma']['flushes']} flushes in its runs"
            s += ";"
        if h["tcp_rx"] or h["tcp_tx"]:
            s += (f" TCP peer->guest {ratio_text(h['tcp_rx'])}, guest->peer "
                  f"{ratio_text(h['tcp_tx'])} of the no-IOMMU boot")
            if h["rr"]:
                s += ";"
        if h["rr"]:
            s += f" request/response time {ratio_text(h['rr'])} of the no-IOMMU boot's"
        if h.get("requests_per_dma") is not None:
            s += f"; {h['requests_per_dma']:.4f} requests/DMA"
        for w, k in (("dma", "DMA"), ("tcp_rx", "TCP peer->guest")):
            v = h.get(f"vs_qemu_{w}")
            if v:
                s += f"\n    {k} vs QEMU x{v['ratio']:.2f}: " + verdict_text(
                    h["vmm"], "QEMU", v["test"])
        lines.append(s)
    for g in group_ranges(hl):
        rng = ", ".join(f"{k} {pct(g[w][0])}-{pct(g[w][1])}"
                        for w, k in (("dma", "DMA"), ("tcp_rx", "TCP peer->guest"),
                                     ("tcp_tx", "guest->peer"),
                                     ("rr", "request/response time")) if g[w])
        lines.append(f"{g['vmm']:<8} {g['vcpus']} vCPU  all {g['configs']} project "
                     f"configurations, every run: {rng}")
    return "\n".join(lines)


def comparisons(records):
    """Every VMM-to-VMM comparison of one configuration and workload
    (dmavisor and cloud-hypervisor against QEMU, dmavisor against
    cloud-hypervisor), as a sentence with its Mann-Whitney p."""
    recs = {r["id"]: r for r in records}
    out = []
    for r in records:
        others = []
        if r["vmm"] != "qemu":
            others.append(recs.get(config_id("qemu", r["vcpus"], r["iommu"])))
        if r["vmm"] == "dmavisor":
            others.append(recs.get(config_id("ch", r["vcpus"], r["iommu"])))
        for o in others:
            if not o:
                continue
            for w, (title, _, higher) in WORKLOADS.items():
                a, b = runs_of(r, w), runs_of(o, w)
                if a and b:
                    c = compare(a, b, higher)
                    out.append((r["id"], o["id"], w, ratio(med(r, w), med(o, w)),
                                verdict_text(f"`{r['id']}`", f"`{o['id']}`", c) + f", {title}"))
    return out


def dma_amount(meta):
    """How long each DMA microbenchmark run was, as the report says it."""
    if meta.get("dma_ms"):
        return f"{meta['dma_ms']} ms"
    return f"{meta['iters']} iterations"


def report(outdir, records, meta):
    recs = {r["id"]: r for r in records}
    md = [f"# Guest benchmark {meta['started']}", "",
          f"Command: `{meta['command']}`  ",
          (f"Runner: {meta['runner']}; {meta['runs']} run(s) per workload; iperf3/sockperf "
           f"{meta['secs']} s per run; DMA microbenchmark {dma_amount(meta)} per vCPU; "
           f"session {fmt_secs(meta['session_secs'])}.  "),
          f"Guests: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}.", "",
          ("In the nested runner (TCG) absolute figures mean little: read the ratios. "
           "Ratio to no IOMMU compares with the `off` configuration of the same VMM, vCPU "
           "count and guest kernel (for latency, above 1 is slower). *vs QEMU* divides a "
           "configuration's median by QEMU's for the same IOMMU configuration and vCPUs. "
           "Under TCG an idle vCPU is slow to wake, so a busier guest can answer sooner: "
           "read the latency ratios with that in mind."), "",
          ((f"Boot order: shuffled per round, seed {meta['seed']}. " if "seed" in meta else
            "Boot order: the plan's, the same every round (a run from before the shuffled "
            "order). ") +
           "Ranges are over every run of a configuration (a run divided by its baseline's "
           f"median in the same boot where there is one). {swing_text(records)} A "
           "configuration is called faster or "
           "slower than another only where a two-sided Mann-Whitney U test over at least "
           "6 runs from at least 3 boots on each side gives p < 0.05 (section "
           "*Comparisons across boots*); the ratios in the tables are not findings."), "",
          "## Headline: the cost of protection", "", "```", headline_text(records), "```", ""]
    bad = [r for r in records if r["status"] != "ok"]
    if bad:
        md += ["## Incomplete configurations", ""]
        md += [f"- `{r['id']}`: {'; '.join(r['errors'])}" for r in bad]
        md.append("")
    failed = [r for r in records if r.get("failed_runs")]
    if failed:
        md += ["## Runs without a figure (left out of the statistics)", ""]
        md += [f"- `{r['id']}`: {'; '.join(r['failed_runs'])}" for r in failed]
        md.append("")
    md += [latency.section(records, lambda r, w: base_runs(r, w, recs)), ""]
    for w, (title, unit, _) in WORKLOADS.items():
        if not any(w in r["expected_workloads"] for r in records):
            continue  # not run (--workloads)
        md += [f"## {title} ({unit})", ""]
        hdr = ["configuration", "VMM", "vCPUs", "IOMMU", f"median {unit}", "min–max", "runs",
               "boots", "ratio to no IOMMU", "vs QEMU (same config)"]
        if w == "dma":
            hdr += ["requests per DMA", "ratio to dma-direct (same boot, just before)"]
        md += ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
        for r in records:
            if w not in r["expected_workloads"]:
                continue
            s = summary(r["workloads"][w])
            base = baseline_of(r, recs)
            q = recs.get(config_id("qemu", r["vcpus"], r["iommu"]))
            vs = ratio(med(r, w), med(q, w)) if r["vmm"] != "qemu" and q else None
            row = [f"`{r['id']}`", r["vmm"], str(r["vcpus"]), r["iommu"],
                   num(s["median"]) if s else "–",
                   f"{num(s['min'])}–{num(s['max'])}" if s else "–",
                   str(s["n"]) if s else "0",
                   str(boots_of(r["workloads"][w])),
                   rnum(ratio(med(r, w), med(base, w))),
                   rnum(vs)]
            if w == "dma":
                same = ratio_summary(r, w, recs) if r.get("dma_direct_runs") else None
                if not same and r.get("dma_direct_same_boot") and med(r, w):
                    # runs from before the baseline carried its round
                    same = {"median": ratio(med(r, w),
                                            statistics.median(r["dma_direct_same_boot"]))}
                row += [num(r.get("requests_per_dma")),
                        rnum(same["median"]) if same else "–"]
            md.append("| " + " | ".join(row) + " |")
        md.append("")
    md += ["## Comparisons across boots", "",
           "Same configuration, two VMMs: ratio of medians, then the Mann-Whitney U test.", ""]
    comps = comparisons(records)
    md += [f"- x{rnum(rat)}: {text}" for _, _, _, rat, text in comps] or [
        "- (no configuration ran under two VMMs)"]
    tested = [t for *_, t in comps if "too few to test" not in t]
    if tested:
        found = sum(1 for t in tested if "no significant difference" not in t)
        # each test has a 5% chance of a false "faster" or "slower"
        md += ["", f"{len(tested)} comparisons tested at p < 0.05: about "
               f"{0.05 * len(tested):.2g} significant results are expected by chance alone; "
               f"{found} found. A single significant cell among many is no finding until "
               "a second run repeats it."]
    md.append("")
    md += [projection_section(records), ""]
    md += ["## Plots", ""]
    for name, alt in (("throughput", "throughput"), ("latency", "latency"),
                      ("dma", "DMA microbenchmark"), ("requests_per_dma", "requests per DMA")):
        if plotted(records, name):
            md += [f"![{alt}]({name}.png)", ""]
    with open(os.path.join(outdir, "report.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(md))


def projection_inputs(alloc_path=None, host_path=None):
    """The cost model's inputs: (costs, sources, allocator figures, where
    those come from), from the committed benchmark files by default."""
    paths = projection.default_paths(REPO)
    paths["alloc"] = alloc_path or paths["alloc"]
    paths["host"] = host_path or paths["host"]
    paths["host_label"] = os.path.relpath(paths["host"], REPO)
    costs, sources = projection.load_costs(paths)
    alloc = projection.load_guest_alloc(paths["alloc"])
    src = (f"the vviommu core built in user space, ns per map+unmap pair for the "
           f"configuration's policy, invalidation, mode and vCPUs as threads: "
           f"{os.path.relpath(paths['alloc'], REPO)} (no device time; on-CPU ns where "
           "the file has them; files from 2026-11-27 05:10 UTC on are the pinned build, "
           "interrupt-off sections as pushf/popf, older ones a mutex, dearer than "
           "cli/sti); where it has no figure, the runner's cost probe scaled by "
           "native/runner dma-direct")
    return costs, sources, alloc, src


def projection_text(dirs, alloc_path=None, host_path=None):
    runs = [(os.path.relpath(os.path.abspath(d), REPO), load_run(d)[0]) for d in dirs]
    costs, sources, alloc, src = projection_inputs(alloc_path, host_path)
    return projection.section(runs, costs, sources, alloc, src)[0]


def projection_section(records):
    """report.md's projection, or why there is none (the native benchmark
    files missing must not cost a report)."""
    try:
        costs, sources, alloc, src = projection_inputs()
    except (OSError, ValueError) as e:
        return f"## PROJECTION\n\n(no projection: {e})\n"
    return projection.section([("this run", records)], costs, sources, alloc, src)[0]


def plotted(records, name):
    """Whether the run has figures for plot `name` (--workloads may leave
    some out: no empty plot is drawn or linked)."""
    need = {"throughput": ("tcp_tx", "tcp_rx"), "latency": ("rr",),
            "dma": ("dma",), "requests_per_dma": ("dma",)}[name]
    return any(w in r["expected_workloads"] for r in records for w in need)


def plots(outdir, records):
    # Debian's python3-matplotlib (hence /usr/bin/python3), needed only here
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r["vmm"], r["vcpus"]) for r in records},
                    key=lambda g: (["dmavisor", "qemu", "ch"].index(g[0]), g[1]))

    def figure(name, series, ylabel, title, pick=None, log_scale=True):
        fig, axes = plt.subplots(len(groups), 1, squeeze=False,
                                 figsize=(max(8, 0.55 * max(1, len(records) / len(groups)) + 4),
                                          3.2 * len(groups)))
        for ax, (vmm, cpus) in zip(axes[:, 0], groups, strict=True):
            rows = [r for r in records if r["vmm"] == vmm and r["vcpus"] == cpus
                    and (pick is None or pick(r))]
            width = 0.8 / len(series)
            positive = False
            for k, (w, lbl) in enumerate(series):
                xs, ys, lo, hi = [], [], [], []
                for i, r in enumerate(rows):
                    s = summary(r["workloads"][w]) if w in r["workloads"] else None
                    if w == "requests_per_dma":
                        s = ({"median": r["requests_per_dma"], "min": r["requests_per_dma"],
                              "max": r["requests_per_dma"]}
                             if r.get("requests_per_dma") is not None else None)
                    if not s:
                        continue
                    xs.append(i + (k - (len(series) - 1) / 2) * width)
                    ys.append(s["median"])
                    lo.append(s["median"] - s["min"])
                    hi.append(s["max"] - s["median"])
                positive |= any(y > 0 for y in ys)
                ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=lbl)
            ax.set_xticks(range(len(rows)))
            ax.set_xticklabels([r["iommu"] for r in rows], rotation=35, ha="right", fontsize=8)
            ax.set_ylabel(ylabel)
            if log_scale and positive:
                # configurations differ by orders of magnitude under TCG
                # (a run without figures, e.g. --iters 0, keeps a linear axis)
                ax.set_yscale("log")
            ax.set_title(f"{title}: {vmm}, {cpus} vCPU", fontsize=10)
            if len(series) > 1:
                ax.legend(fontsize=8)
            ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(outdir, name), dpi=90)
        plt.close(fig)

    if plotted(records, "throughput"):
        figure("throughput.png", [("tcp_tx", "guest->peer"), ("tcp_rx", "peer->guest")],
               "Kbit/s (median, min-max)", "iperf3 TCP throughput")
    figure("latency.png", [("rr", "sockperf ping-pong")], "us (median, min-max)",
           "TCP request/response latency")
    figure("dma.png", [("dma", "map+unmap")], "ops/s (median, min-max)",
           "DMA microbenchmark", pick=lambda r: "dma" in r["expected_workloads"])
    figure("requests_per_dma.png", [("requests_per_dma", "requests/DMA")],
           "virtio-iommu requests per DMA", "Requests per DMA",
           pick=lambda r: r["driver"] in DRIVERS_VVI and "dma" in r["expected_workloads"],
           log_scale=False)


def write_outputs(outdir, records, meta):
    with open(os.path.join(outdir, "results.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in records)
    with open(os.path.join(outdir, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
    report(outdir, records, meta)
    plots(outdir, records)


def load_run(outdir):
    """(records, meta) of a finished or stopped run: the raw session parsed
    again (the parser may have improved since, e.g. every round's cost
    probe), else its results.jsonl."""
    try:
        with open(os.path.join(outdir, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
    except OSError:
        # a run that was stopped: what its session log holds
        meta = {"started": "?", "command": "(stopped run)", "runner": "?", "runs": "?",
                "secs": "?", "iters": "?", "session_secs": 0, "versions": {}}
    try:
        with open(os.path.join(outdir, "plan.json"), encoding="utf-8") as f:
            boots = [{**b, "configs": {("off" if it.startswith("off") else it): it
                                       for it in b["configs"]}}
                     for b in json.load(f)["boots"]]
        with open(os.path.join(outdir, "session.log"), encoding="utf-8") as f:
            records = parse(f.read().splitlines(), boots)
    except (OSError, KeyError, ValueError):
        with open(os.path.join(outdir, "results.jsonl"), encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
    return records, meta


# -------------------------------------------------------------------- main


def main():
    ap = parser(__doc__)
    ap.add_argument("--quick", action="store_true",
                    help="1 vCPU; no IOMMU (6.1 guest only), vviommu magazine with "
                         "lazy-percpu and strict, Linux lazy; 1 run, 1 s transfers, 200 DMA "
                         "iterations (three boots per VMM)")
    ap.add_argument("--runs", type=int, help="repetitions of every workload (default 3, quick 1)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="boot the whole plan N times over, interleaved, and pool the "
                         "figures (ratios between VMMs then resist slow spells of the host)")
    ap.add_argument("--seed", type=int, default=None,
                    help="seed of the boot order, shuffled anew every round (default: "
                         "drawn at random; printed, and kept in plan.json and meta.json)")
    ap.add_argument("--only", default="", help="comma-separated configuration patterns: "
                    "globs (dmavisor/2cpu/vvi-*) or substrings (linux)")
    ap.add_argument("--ch", metavar="PATH", help="also run cloud-hypervisor (its binary)")
    ap.add_argument("--cpus", default=None, help="vCPU counts (default 1,2; quick 1)")
    ap.add_argument("--secs", type=int, help="seconds per iperf3/sockperf run (default 3, quick 1)")
    ap.add_argument("--workloads", default="",
                    help="comma-separated subset of " + ",".join(WORKLOADS) + " (default "
                         "all; e.g. dma,rr for a latency run without bulk transfers)")
    ap.add_argument("--iters", type=int,
                    help="DMA microbenchmark iterations per vCPU (default 2000, quick 200)")
    ap.add_argument("--dma-ms", type=int, default=0, metavar="MS",
                    help="run the DMA microbenchmark for MS ms per vCPU instead of --iters "
                         "iterations (long runs average out timer ticks and runner jitter)")
    ap.add_argument("--vvi-params", default="", metavar="'NAME=VALUE ...'",
                    help="more vviommu module parameters for every vviommu configuration, "
                         "e.g. 'pgt_fq_size=8192' (A/B of a driver tunable in one run)")
    ap.add_argument("--mem", type=int, default=256,
                    help="guest memory in MiB (default 256: in the nested runner a guest's "
                         "boot time grows with its memory)")
    ap.add_argument("--out", help="output directory (default build/bench/<timestamp>)")
    ap.add_argument("--list", action="store_true", help="print the configurations and exit")
    ap.add_argument("--demo", action="store_true",
                    help="the headline of `make demo`: dmavisor, 2 vCPUs, no IOMMU, the "
                         "project's magazine policy (MAP and page-table mode), Linux lazy; "
                         "3 runs, DMA runs of 200 ms (long enough for page-table flushes), "
                         "DMA against the same boot's dma-direct; prints the headline")
    ap.add_argument("--report", metavar="DIR", help="redo report.md and plots of DIR")
    ap.add_argument("--project", metavar="DIR", action="append", default=[],
                    help="print the PROJECTION for a VMX host of the run(s) in DIR (repeat "
                         "for several): each configuration's event counts times native "
                         "costs, beside the runner's measured ratios (projection.py)")
    ap.add_argument("--alloc-bench", metavar="FILE",
                    help="the guest allocator's native figures for --project (default: "
                         "docs/results/2026-11-26-guest-allocator-native/bench.txt)")
    ap.add_argument("--host-bench", metavar="FILE",
                    help="`make bench-host` output for --project (default: "
                         "docs/results/2026-11-26-host-slow-spots/after.txt)")
    ap.add_argument("--claims", action="store_true",
                    help="recompute every figure the READMEs quote from the committed run "
                         "folders in docs/results/ and print them as Markdown "
                         "(resources/dmavisor_tools/claims.py; docs/results/claims.md)")
    ap.add_argument("-v", "--verbose", action="store_true", help="stream the session output")
    args = ap.parse_args()
    if args.claims:
        from .claims import main as claims_main
        return claims_main()
    if args.project:
        print(projection_text(args.project, args.alloc_bench, args.host_bench))
        return 0
    if args.report:
        records, meta = load_run(args.report)
        write_outputs(args.report, records, meta)
        print(headline_text(records))
        return 0
    # the demo's DMA runs last 200 ms: a run of a few hundred iterations
    # ends before the first 4096-entry page-table flush (issue 30)
    if args.demo and not args.dma_ms:
        args.dma_ms = 200
    args.runs = args.runs or (1 if args.quick else 3)
    args.secs = args.secs or (1 if args.quick else 2 if args.demo else 3)
    args.iters = args.iters if args.iters is not None else (
        200 if args.quick else 500 if args.demo else 2000)
    args.cpus = args.cpus or ("1" if args.quick else "1,2")
    if args.runs < 1 or args.secs < 1 or not re.fullmatch(r"\d+(,\d+)*", args.cpus):
        ap.error("--runs and --secs must be positive, --cpus a list like 1,2")
    if args.rounds < 1:
        ap.error("--rounds must be positive")
    if args.workloads and not set(args.workloads.split(",")) <= set(WORKLOADS):
        ap.error(f"--workloads takes a subset of {','.join(WORKLOADS)}")
    if not re.fullmatch(r"(\s*[a-z_]+=[A-Za-z0-9_.-]+)*\s*", args.vvi_params):
        ap.error("--vvi-params takes NAME=VALUE words")
    if not 0 <= args.dma_ms <= 60000:
        ap.error("--dma-ms must be 0..60000 (vvi_edu's limit)")
    if args.ch and not os.access(args.ch, os.X_OK):
        ap.error(f"--ch {args.ch}: not an executable")
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little")
    boots = plan_boots(args)
    if not boots:
        ap.error(f"--only {args.only}: no configuration matches")
    confs = configurations(boots)
    if args.list:
        for b in boots:
            print(f"boot {b['name']} (~{fmt_secs(predict_secs(b, args))} in the nested runner)")
            for it in b["configs"].values():
                print(f"  {config_id(b['vmm'], b['cpus'], it)}")
        print(f"{len(confs)} configurations in {len(boots)} boots, about "
              f"{fmt_secs(sum(predict_secs(b, args) for b in boots) + 60)} in the nested runner")
        return 0
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    outdir = args.out or os.path.join(BUILD, "bench", timestamp())
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "plan.json"), "w", encoding="utf-8") as f:
        json.dump({"configurations": [c[0] for c in confs], "seed": args.seed,
                   "boots": [{**b, "configs": list(b["configs"].values())} for b in boots]},
                  f, indent=1)
    try:
        prep = prepare(boots, args)
    except RuntimeError as e:
        log(f"error: {e}")
        return 1
    log(f"boot order seed {args.seed} (--seed {args.seed} repeats this order)")
    lines, secs = run_session(boots, prep, args, outdir)
    records = parse(lines, boots)
    runner = "direct (hardware KVM)" if runner_is_direct() else "nested runner (TCG)"
    meta = {"started": started, "command": " ".join(map(shlex.quote, sys.argv)),
            "runner": runner, "runs": args.runs, "secs": args.secs, "iters": args.iters,
            "dma_ms": args.dma_ms, "vvi_params": args.vvi_params, "seed": args.seed,
            "session_secs": round(secs), "versions": {
                f"debian-{s}": v for s, v in prep["version"].items()},
            "configurations": [c[0] for c in confs]}
    write_outputs(outdir, records, meta)
    bad = [r["id"] for r in records if r["status"] != "ok"]
    print()
    print(f"Cost of protection ({args.runs} runs per workload per boot, {args.rounds} "
          f"round(s); DMA {dma_amount(vars(args))} per run and vCPU; median (min-max over "
          "every run) of the baseline named on each line):")
    print(headline_text(records))
    print(f"\nreport: {os.path.join(outdir, 'report.md')}")
    if bad:
        log(f"{len(bad)} of {len(records)} configurations incomplete: {', '.join(bad)}")
        return 1
    return 0
