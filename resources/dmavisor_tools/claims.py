"""`resources/bench-guest --claims`: every figure that README.md,
docs/page-table.md and docs/results/*/README.md quote from a guest
benchmark, recomputed from the committed run folders.

Why (issue 30): the published figures had drifted from the data: ranges
quoted from the best configuration of each group, figures of runs never
committed, and "faster" where a test across boots finds nothing. Each
claim below names its run folder and the configurations it covers (ALL of
them that match, not the best of a group), and prints the figure the docs
quote, so a reader can rerun it and a changed parser shows up as a
changed number. Comparisons between VMMs print their Mann-Whitney p
(stats.compare); no run committed so far has the 3 boots per
configuration that a "faster" needs.

Runs are read as `bench-guest --report` reads them (the session log
parsed again, so that every round's cost probe and NIC figures count).
"""

import fnmatch
import os
import re
import statistics

from .bench_guest import WORKLOADS, base_runs, load_run, med, runs_of
from .common import REPO
from .stats import MIN_BOOTS, compare

RESULTS = os.path.join(REPO, "docs", "results")


def pct(v):
    p = 100 * v
    return f"{p:.3g}%"


def rng(vals, fmt=lambda v: f"{v:.3g}"):
    vals = [v for v in vals if v is not None]
    if not vals:
        return "–"
    lo, hi = min(vals), max(vals)
    return fmt(lo) if lo == hi else f"{fmt(lo)}-{fmt(hi)}"


class Run:
    """One committed run folder, loaded once."""

    _cache = {}

    def __init__(self, folder):
        self.folder = folder
        self.records, self.meta = load_run(os.path.join(RESULTS, folder))
        self.by_id = {r["id"]: r for r in self.records}
        with open(os.path.join(RESULTS, folder, "session.log"), encoding="utf-8",
                  errors="replace") as f:
            self.session = f.read()

    @classmethod
    def get(cls, folder):
        if folder not in cls._cache:
            cls._cache[folder] = Run(folder)
        return cls._cache[folder]

    def select(self, pattern):
        pats = pattern.split("|")
        return [r for r in self.records if any(fnmatch.fnmatch(r["id"], p) for p in pats)]


def ratio_to_base(run, pattern, w):
    """Per configuration: median over the baseline's median (base_runs:
    same-boot dma-direct for DMA where measured, else the no-IOMMU boot),
    and every run over the baseline's median."""
    meds, every = [], []
    for r in run.select(pattern):
        bs, _ = base_runs(r, w, run.by_id)
        rs = runs_of(r, w)
        if not rs or not bs:
            continue
        b = statistics.median(e["value"] for e in bs)
        meds.append(med(r, w) / b)
        every += [e["value"] / b for e in rs]
    return meds, every


def untestable(c):
    """Why a comparison has no verdict: too few boots, else too few runs
    (a run without a figure leaves 5 of 6)."""
    if min(c["boots_a"], c["boots_b"]) < MIN_BOOTS:
        return f"untestable ({c['boots_a']}/{c['boots_b']} boots)"
    return f"untestable ({c['n_a']}/{c['n_b']} runs)"


def c_ratio(folder, pattern, workloads, fmt=pct):
    run = Run.get(folder)
    meds, every, n = [], [], 0
    for w in workloads.split(","):
        m, e = ratio_to_base(run, pattern, w)
        meds += m
        every += e
        n = max(n, len(m))
    return (f"medians {rng(meds, fmt)} over {len(meds)} (configuration, workload) cells; "
            f"every run {rng(every, fmt)}")


def c_vs(folder, pattern, other, workloads):
    """Pattern's configurations against the same configuration under
    `other` (qemu or ch): ratio of medians and the U test per cell."""
    run = Run.get(folder)
    ratios, ps, verdicts = [], [], []
    for r in run.select(pattern):
        o = run.by_id.get(r["id"].replace(r["vmm"] + "/", other + "/", 1))
        if not o:
            continue
        for w in workloads.split(","):
            a, b = runs_of(r, w), runs_of(o, w)
            if not a or not b:
                continue
            ratios.append(med(r, w) / med(o, w))
            c = compare(a, b, WORKLOADS[w][2])
            ps.append(c["p"])
            verdicts.append(c["verdict"] if not c["why"] else untestable(c))
    kinds = ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(verdicts))
    return (f"x{rng(ratios, lambda v: f'{v:.2f}')} over {len(ratios)} cells; "
            f"Mann-Whitney p {rng(ps, lambda v: f'{v:.2g}')}; {kinds}")


def c_between(folder, pat_a, pat_b, w):
    """Configuration a over configuration b of the same VMM and vCPUs:
    ratio of medians per pair, and the U test."""
    run = Run.get(folder)
    ratios, ps, verdicts = [], [], []
    for a in run.select(pat_a):
        for b in run.select(pat_b):
            if (a["vmm"], a["vcpus"]) == (b["vmm"], b["vcpus"]) and runs_of(a, w) \
                    and runs_of(b, w):
                ratios.append(med(a, w) / med(b, w))
                c = compare(runs_of(a, w), runs_of(b, w), WORKLOADS[w][2])
                ps.append(c["p"])
                verdicts.append(c["verdict"] if not c["why"] else untestable(c))
    kinds = ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(verdicts))
    return (f"x{rng(ratios, lambda v: f'{v:.3g}')} over {len(ratios)} pairs; "
            f"Mann-Whitney p {rng(ps, lambda v: f'{v:.2g}')}; {kinds}")


def c_values(folder, pattern, w, scale=1.0, unit=""):
    """Every run's figure (e.g. Kbit/s / 1000 = Mbit/s)."""
    run = Run.get(folder)
    vals = [e["value"] / scale for r in run.select(pattern) for e in runs_of(r, w)]
    meds = [med(r, w) / scale for r in run.select(pattern) if runs_of(r, w)]
    f = (lambda v: f"{v:,.0f}{unit}") if max(vals, default=0) >= 100 else (
        lambda v: f"{v:.3g}{unit}")
    return f"every run {rng(vals, f)}; medians {rng(meds, f)}"


def lat_rows(run):
    """latency.py's rows of a run: every run's multiplier over the same
    VMM's no-vIOMMU baseline."""
    from . import latency
    return latency.rows(run.records, lambda r, w: base_runs(r, w, run.by_id))


def c_lat(folder, pattern, w):
    """Small-I/O latency multipliers (latency.py) of every configuration
    the pattern matches: their medians and every run."""
    run = Run.get(folder)
    ids = {r["id"] for r in run.select(pattern)}
    meds, every = [], []
    for row in lat_rows(run):
        if row["id"] in ids and row[w]:
            meds.append(row[w]["sum"]["median"])
            every += [m["value"] for m in row[w]["ms"]]
    def f(v):
        return f"{v:,.0f}" if v >= 1000 else f"{v:.3g}"
    return (f"medians x{rng(meds, f)} over {len(meds)} configuration"
            f"{'s' if len(meds) != 1 else ''}; "
            f"every run x{rng(every, f)}")


def c_lat_vs(folder, pattern, other, w):
    """dmavisor's latency multipliers against `other`'s (qemu or ch),
    same configuration: ratio of the median multipliers and the U test of
    the per-run multipliers (latency.comparisons; "lower" is better)."""
    from . import latency
    run = Run.get(folder)
    ids = {r["iommu"] for r in run.select(pattern) if r["vmm"] == "dmavisor"}
    ratios, ps, verdicts = [], [], []
    for c in latency.comparisons(lat_rows(run)):
        if c["other"] == other and c["w"] == w and c["iommu"] in ids:
            ratios.append(c["ratio"])
            t = c["test"]
            ps.append(t["p"])
            verdicts.append({"faster": "lower", "slower": "higher"}.get(
                t["verdict"], t["verdict"]) if not t["why"] else untestable(t))
    kinds = ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(verdicts))
    return (f"x{rng(ratios, lambda v: f'{v:.2f}')} over {len(ratios)} configurations; "
            f"Mann-Whitney p {rng(ps, lambda v: f'{v:.2g}')}; {kinds}")


def c_swing(folder):
    """How far the runs of one configuration and workload differ: max/min
    over its runs, the median and the largest over every such cell."""
    run = Run.get(folder)
    sw = []
    for r in run.records:
        for entries in r["workloads"].values():
            v = [e["value"] for e in entries if e["value"] > 0]
            if len(v) > 1:
                sw.append(max(v) / min(v))
    if not sw:
        return "–"
    return (f"max/min of one configuration's runs: median x{statistics.median(sw):.2g}, "
            f"largest x{max(sw):.3g}, over {len(sw)} (configuration, workload) cells")


def c_first_later(folder, pattern, field, scale=1.0):
    """A DMA run field (e.g. alloc_slow), in the first run of each boot
    and in the later ones."""
    run = Run.get(folder)
    first, later = [], []
    for r in run.select(pattern):
        for e in runs_of(r, "dma"):
            (first if e.get("run") == 1 else later).append(e.get(field, 0) / scale)
    f = (lambda v: f"{v:.0f}") if scale == 1.0 else (lambda v: f"{v:.1f}")
    return f"first run of each boot {rng(first, f)}; later runs {rng(later, f)}"


def c_irq_per_mb(folder, pattern, w):
    """The NIC's interrupts (irq_in + irq_out) per MB moved in a TCP run
    (MB = Kbit/s x the run's seconds / 8000)."""
    run = Run.get(folder)
    secs = run.meta.get("secs")
    vals = [(e["irq_in"] + e.get("irq_out", 0)) / (e["value"] * secs / 8000)
            for r in run.select(pattern) for e in runs_of(r, w)
            if "irq_in" in e and e["value"] and isinstance(secs, int)]
    return rng(vals, lambda v: f"{v:.1f}") + f" interrupts per MB over {len(vals)} runs"


def c_rpd(folder, pattern):
    run = Run.get(folder)
    return rng([r.get("requests_per_dma") for r in run.select(pattern)],
               lambda v: f"{v:.4g}") + " requests per DMA"


def c_net_rpm(folder, pattern):
    """The NIC's requests per map during the TCP runs, per boot."""
    run = Run.get(folder)
    vals = []
    for r in run.select(pattern):
        nd = r.get("net_dma") or []
        for n in nd if isinstance(nd, list) else [nd]:
            if n.get("maps"):
                vals.append(n["requests"] / n["maps"])
    return rng(vals, lambda v: f"{v:.2g}") + f" requests per map over {len(vals)} boots"


def c_costs(folder, pattern, key):
    run = Run.get(folder)
    vals = []
    for r in run.select(pattern):
        cs = r.get("costs") or []
        vals += [c[key] for c in (cs if isinstance(cs, list) else [cs]) if key in c]
    return rng(vals, lambda v: f"{v:.0f}") + f" ns over {len(vals)} boots"


def c_direct_ns(folder, pattern):
    """dma-direct's map + unmap (benchmark loop included): 1e9 / rate."""
    run = Run.get(folder)
    vals = [1e9 / d["value"] for r in run.select(pattern)
            for d in r.get("dma_direct_runs") or [] if d["value"]]
    return rng(vals, lambda v: f"{v:.0f}") + f" ns over {len(vals)} runs"


def c_flushes(folder, pattern):
    """Flushes per DMA run and the ms of sending and waiting per flush."""
    run = Run.get(folder)
    n, ms = [], []
    for r in run.select(pattern):
        for e in runs_of(r, "dma"):
            if e.get("flushes"):
                n.append(e["flushes"])
                ms.append(e.get("flush_wait_ns", 0) / e["flushes"] / 1e6)
    return (f"{rng(n, lambda v: f'{v:.0f}')} flushes per run, "
            f"{rng(ms, lambda v: f'{v:.2g}')} ms of sending and waiting each")


def c_invalidate(folder):
    """The VMM's exit reports: INVALIDATE requests and the time they took."""
    run = Run.get(folder)
    rows = [(int(n), int(us), int(bus)) for n, us, bus in re.findall(
        r"(\d+) INVALIDATE requests \(\d+ failed, INVALIDATEs took (\d+) us\); "
        r"\d+ invalidation batches \((\d+) us\)", run.session) if int(n)]
    each = [us / n / 1000 for n, us, _ in rows]
    return (f"{len(rows)} boots with INVALIDATEs: {rng([n for n, _, _ in rows], str)} requests "
            f"in {rng([us / 1000 for _, us, _ in rows], lambda v: f'{v:.0f}')} ms; "
            f"{rng(each, lambda v: f'{v:.2g}')} ms each; all their invalidation batches "
            f"(UNMAPs included) {rng([b / 1e6 for _, _, b in rows], lambda v: f'{v:.2f}')} s "
            "per boot")


M, P, N, C, A = ("2026-11-26-matrix", "2026-11-26-peers", "2026-11-26-net-dma",
                 "2026-11-26-closing", "2026-11-26-closing/dma-adjacent")
Q = "2026-11-26-quick-rounds"
ID_LAZY = "*/vvi-identity-lazy-*"
STRICT = "|".join(f"*/vvi-{p}-strict" for p in ("identity", "kmalloc", "magazine", "global"))
PGT_LAZY = "dmavisor/*/pgt-magazine-lazy-percpu"
NET = "tcp_tx,tcp_rx"
# (key the docs cite, folder, what, function, arguments)
CLAIMS = [
    ("matrix.identity-lazy.dma", M, "DMA, vviommu identity lazy (both modes), every VMM and "
     "vCPU count, of no IOMMU", c_ratio, (M, ID_LAZY, "dma")),
    ("matrix.identity-lazy.rpd", M, "requests per DMA, same configurations", c_rpd,
     (M, ID_LAZY)),
    ("matrix.linux.dma", M, "DMA, Linux's driver strict and lazy, of no IOMMU", c_ratio,
     (M, "*/linux-*", "dma")),
    ("matrix.strict.dma", M, "DMA, every protecting vviommu policy strict (identity, kmalloc, "
     "magazine, global), of no IOMMU", c_ratio, (M, STRICT, "dma")),
    ("matrix.strict.tcp", M, "TCP both ways, the same configurations", c_ratio,
     (M, STRICT, NET)),
    ("matrix.strict.rpd", M, "requests per DMA, the same configurations", c_rpd, (M, STRICT)),
    ("matrix.project.vs-qemu.dma", M, "DMA, dmavisor / QEMU, every vviommu configuration of "
     "the project's policies (identity, kmalloc, magazine)", c_vs,
     (M, "dmavisor/*/vvi-identity-*|dmavisor/*/vvi-kmalloc-*|dmavisor/*/vvi-magazine-*",
      "qemu", "dma")),
    ("matrix.linux.vs-qemu.dma", M, "DMA, Linux's driver, dmavisor / QEMU", c_vs,
     (M, "dmavisor/*/linux-*", "qemu", "dma")),
    ("matrix.linux.vs-qemu.tcp_rx", M, "TCP peer->guest, Linux's driver, dmavisor / QEMU",
     c_vs, (M, "dmavisor/*/linux-*", "qemu", "tcp_rx")),
    ("matrix.off.vs-qemu.tcp_tx", M, "TCP guest->peer, no IOMMU (both kernels), dmavisor / "
     "QEMU", c_vs, (M, "dmavisor/*/off-*", "qemu", "tcp_tx")),
    ("matrix.off.vs-qemu.tcp_rx", M, "TCP peer->guest, no IOMMU, dmavisor / QEMU", c_vs,
     (M, "dmavisor/*/off-*", "qemu", "tcp_rx")),
    ("matrix.off.vs-qemu.dma", M, "DMA, no IOMMU, dmavisor / QEMU", c_vs,
     (M, "dmavisor/*/off-*", "qemu", "dma")),
    ("matrix.off-6.1.dma.runs", M, "DMA runs, no IOMMU, dmavisor 1 vCPU 6.1, ops/s", c_values,
     (M, "dmavisor/1cpu/off-6.1", "dma")),
    ("matrix.passthrough.dma", M, "DMA, every passthrough row (every VMM and vCPU count), "
     "of no IOMMU", c_ratio, (M, "*/vvi-passthrough-*", "dma")),
    ("matrix.passthrough-dmavisor-1cpu.dma", M, "DMA, dmavisor's three 1-vCPU passthrough "
     "rows, of no IOMMU", c_ratio, (M, "dmavisor/1cpu/vvi-passthrough-*", "dma")),
    ("matrix.linux.tcp_tx", M, "TCP guest->peer, Linux's driver, of no IOMMU", c_ratio,
     (M, "*/linux-*", "tcp_tx")),
    ("peers.pgt.tcp", P, "TCP both ways, page-table mode (lazy-percpu and strict), of no "
     "IOMMU", c_ratio, (P, "dmavisor/*/pgt-*", NET)),
    ("peers.pgt-lazy.tcp", P, "TCP both ways, page-table lazy-percpu only", c_ratio,
     (P, PGT_LAZY, NET)),
    ("peers.pgt-lazy.dma", P, "DMA, page-table lazy-percpu (500-iteration runs)", c_ratio,
     (P, PGT_LAZY, "dma")),
    ("peers.pgt-strict.dma", P, "DMA, page-table strict", c_ratio,
     (P, "dmavisor/*/pgt-magazine-strict", "dma")),
    ("peers.map-mode.dma", P, "DMA, vviommu magazine lazy-percpu (MAP mode)", c_ratio,
     (P, "dmavisor/*/vvi-magazine-lazy-percpu", "dma")),
    ("peers.linux-dmavisor.dma", P, "DMA, Linux's driver on dmavisor, of no IOMMU", c_ratio,
     (P, "dmavisor/*/linux-*", "dma")),
    ("peers.linux-qemu.dma", P, "DMA, Linux's driver on QEMU, of no IOMMU", c_ratio,
     (P, "qemu/*/linux-*", "dma")),
    ("peers.linux.tcp_tx", P, "TCP guest->peer, Linux's driver (every VMM), of no IOMMU",
     c_ratio, (P, "*/linux-*", "tcp_tx")),
    ("peers.linux.vs-qemu", P, "Linux's driver, dmavisor / QEMU, DMA and TCP both ways",
     c_vs, (P, "dmavisor/*/linux-*", "qemu", "dma,tcp_rx,tcp_tx")),
    ("peers.ch-linux.tcp_rx", P, "TCP peer->guest, cloud-hypervisor with Linux's driver, of "
     "its no IOMMU", c_ratio, (P, "ch/*/linux-*", "tcp_rx")),
    ("peers.ch-linux.vs-qemu.tcp_rx", P, "TCP peer->guest, Linux's driver, cloud-hypervisor / "
     "QEMU", c_vs, (P, "ch/*/linux-*", "qemu", "tcp_rx")),
    ("peers.ch-off-1cpu.tcp_rx.runs", P, "TCP peer->guest runs, cloud-hypervisor 1 vCPU, no "
     "IOMMU, Mbit/s", c_values, (P, "ch/1cpu/off-*", "tcp_rx", 1000)),
    ("peers.off.vs-qemu", P, "no IOMMU, dmavisor / QEMU, TCP both ways", c_vs,
     (P, "dmavisor/*/off-*", "qemu", NET)),
    ("peers.off.vs-ch", P, "no IOMMU, dmavisor / cloud-hypervisor, TCP both ways", c_vs,
     (P, "dmavisor/*/off-*", "ch", NET)),
    ("net-dma.off.vs-ch", N, "no IOMMU (6.12), dmavisor / cloud-hypervisor, TCP both ways",
     c_vs, (N, "dmavisor/*/off-6.12", "ch", NET)),
    ("net-dma.off.vs-qemu", N, "no IOMMU (6.12), dmavisor / QEMU, TCP both ways", c_vs,
     (N, "dmavisor/*/off-6.12", "qemu", NET)),
    ("net-dma.off.vs-qemu.rr", N, "no IOMMU (6.12), ping-pong latency, dmavisor's time / "
     "QEMU's (above 1: dmavisor slower)", c_vs,
     (N, "dmavisor/*/off-6.12", "qemu", "rr")),
    ("net-dma.off.vs-qemu.dma", N, "DMA, no IOMMU (6.12), dmavisor / QEMU", c_vs,
     (N, "dmavisor/*/off-6.12", "qemu", "dma")),
    ("net-dma.off.tx.runs", N, "TCP guest->peer runs, dmavisor 1 vCPU 6.12, Mbit/s",
     c_values, (N, "dmavisor/1cpu/off-6.12", "tcp_tx", 1000)),
    ("net-dma.ch-off.tx.runs", N, "TCP guest->peer runs, cloud-hypervisor 2 vCPUs, Mbit/s",
     c_values, (N, "ch/2cpu/off-6.12", "tcp_tx", 1000)),
    ("net-dma.pgt.dma", N, "DMA, page-table lazy-percpu, of the same boot's dma-direct",
     c_ratio, (N, PGT_LAZY, "dma")),
    ("net-dma.passthrough.dma", N, "DMA, passthrough, of the same boot's dma-direct",
     c_ratio, (N, "dmavisor/*/vvi-passthrough-lazy-percpu", "dma")),
    ("net-dma.pgt.rpd", N, "requests per DMA, page-table lazy-percpu", c_rpd, (N, PGT_LAZY)),
    ("net-dma.map-mode.rpd", N, "requests per DMA, MAP mode (vvi-magazine-lazy-percpu)", c_rpd,
     (N, "dmavisor/*/vvi-magazine-lazy-percpu")),
    ("net-dma.pgt.vs-map.dma", N, "DMA, page-table mode over MAP mode (magazine lazy-percpu)",
     c_between, (N, PGT_LAZY, "dmavisor/*/vvi-magazine-lazy-percpu", "dma")),
    ("net-dma.linux.tcp_tx", N, "TCP guest->peer, Linux's driver (dmavisor and QEMU), of no "
     "IOMMU", c_ratio, (N, "*/linux-*", "tcp_tx")),
    ("net-dma.pgt.alloc_slow", N, "IOVAs from the rbtree (alloc_slow) per DMA run, "
     "page-table lazy-percpu", c_first_later, (N, PGT_LAZY, "alloc_slow")),
    ("net-dma.pgt.batches", N, "4096-entry flush batches per 200 ms DMA run (maps / 4096), "
     "page-table lazy-percpu", c_first_later, (N, PGT_LAZY, "maps", 4096.0)),
    ("net-dma.through.tcp", N, "TCP both ways through every vIOMMU configuration of the run "
     "(page-table, passthrough, Linux lazy), of the no-IOMMU boot", c_ratio,
     (N, PGT_LAZY + "|dmavisor/*/vvi-passthrough-lazy-percpu|*/linux-lazy", NET)),
    ("net-dma.pgt.tcp", N, "TCP both ways, page-table lazy-percpu, of the no-IOMMU boot",
     c_ratio, (N, PGT_LAZY, NET)),
    ("closing.off.vs-qemu", C, "no IOMMU (6.12), dmavisor / QEMU, TCP both ways", c_vs,
     (C, "dmavisor/*/off-6.12", "qemu", NET)),
    ("closing.off.vs-ch", C, "no IOMMU (6.12), dmavisor / cloud-hypervisor, TCP both ways",
     c_vs, (C, "dmavisor/*/off-6.12", "ch", NET)),
    ("closing.off.vs-qemu.rr", C, "no IOMMU (6.12), ping-pong latency, dmavisor's time / "
     "QEMU's (above 1: dmavisor slower)", c_vs,
     (C, "dmavisor/*/off-6.12", "qemu", "rr")),
    ("closing.2cpu.tx.runs", C, "TCP guest->peer runs, 2 vCPUs, no IOMMU (6.12), every VMM, "
     "Mbit/s", c_values, (C, "*/2cpu/off-6.12", "tcp_tx", 1000)),
    ("closing.irq.dmavisor", C, "the NIC's interrupts per MB, 1 vCPU, guest->peer, no IOMMU "
     "(6.12), dmavisor", c_irq_per_mb, (C, "dmavisor/1cpu/off-6.12", "tcp_tx")),
    ("closing.irq.qemu", C, "the same, QEMU", c_irq_per_mb, (C, "qemu/1cpu/off-6.12", "tcp_tx")),
    ("closing.irq.ch", C, "the same, cloud-hypervisor", c_irq_per_mb,
     (C, "ch/1cpu/off-6.12", "tcp_tx")),
    ("closing.passthrough.dma", C, "DMA, passthrough, of the dma-direct rate at the boot's "
     "start", c_ratio, (C, "dmavisor/*/vvi-passthrough-lazy-percpu", "dma")),
    ("closing.pgt.dma", C, "DMA, page-table lazy-percpu, of the dma-direct rate at the "
     "boot's start", c_ratio, (C, PGT_LAZY, "dma")),
    ("closing.pgt.tcp", C, "TCP both ways, page-table lazy-percpu, of the no-IOMMU boot",
     c_ratio, (C, PGT_LAZY, NET)),
    ("closing.linux.tcp", C, "TCP both ways, Linux's driver lazy (dmavisor and QEMU)",
     c_ratio, (C, "*/linux-lazy", NET)),
    ("closing.map-mode.dma", C, "DMA, vviommu magazine lazy-percpu (MAP mode)", c_ratio,
     (C, "dmavisor/*/vvi-magazine-lazy-percpu", "dma")),
    ("closing.pgt.net-rpm", C, "the NIC's requests per map, page-table lazy-percpu", c_net_rpm,
     (C, PGT_LAZY)),
    ("closing.map-mode.net-rpm", C, "the NIC's requests per map, MAP mode (vvi-magazine-"
     "lazy-percpu)", c_net_rpm, (C, "dmavisor/*/vvi-magazine-lazy-percpu")),
    ("closing.invalidate", C, "the device's INVALIDATEs (VMM exit reports)", c_invalidate,
     (C,)),
    ("adjacent.pgt.dma", A, "DMA, page-table lazy-percpu, of dma-direct just before", c_ratio,
     (A, PGT_LAZY, "dma")),
    ("adjacent.passthrough.dma", A, "DMA, passthrough, of dma-direct just before", c_ratio,
     (A, "dmavisor/*/vvi-passthrough-lazy-percpu", "dma")),
    ("adjacent.pgt.flushes", A, "flushes per 200 ms DMA run, page-table lazy-percpu",
     c_flushes, (A, PGT_LAZY)),
    ("adjacent.direct.ns", A, "dma-direct's map + unmap, loop included", c_direct_ns,
     (A, "dmavisor/*")),
]
for _f in (M, P, N, C, A):
    CLAIMS.append((_f.replace("2026-11-26-", "").replace("closing/dma-", "") + ".swing", _f,
                   "spread of single runs", c_swing, (_f,)))
CLAIMS += [
    ("quick.vs-qemu", Q, "every configuration, dmavisor / QEMU, every workload (latency: "
     "dmavisor's time / QEMU's)", c_vs, (Q, "dmavisor/*", "qemu", "dma,tcp_tx,tcp_rx,rr")),
    ("quick.vs-qemu.rr", Q, "ping-pong latency, dmavisor's time / QEMU's", c_vs,
     (Q, "dmavisor/*", "qemu", "rr")),
    ("quick.vvi-lazy.dma", Q, "DMA, vviommu magazine lazy-percpu (MAP mode, 200 iterations), "
     "of the same boot's dma-direct, both VMMs", c_ratio, (Q, "*/vvi-*-lazy-percpu", "dma")),
    ("quick.vvi-strict.dma", Q, "DMA, vviommu magazine strict, the same", c_ratio,
     (Q, "*/vvi-*-strict", "dma")),
    ("quick.vvi-lazy.rpd", Q, "requests per DMA, lazy-percpu", c_rpd, (Q, "*/vvi-*-lazy-percpu")),
    ("quick.vvi-strict.rpd", Q, "requests per DMA, strict", c_rpd, (Q, "*/vvi-*-strict")),
    ("quick.swing", Q, "spread of single runs", c_swing, (Q,)),
]
L = "2026-11-27-latency-peers"
PROTECTED = "{v}/*/linux-*|{v}/*/vvi-*|{v}/*/pgt-*"
for _v, _name in (("dmavisor", "dmavisor"), ("qemu", "QEMU"), ("ch", "cloud-hypervisor")):
    CLAIMS.append((f"lat.rr.{_v}", L, f"request/response (sockperf) multiplier over {_name}'s "
                   "no-vIOMMU boot, every vIOMMU configuration", c_lat,
                   (L, PROTECTED.format(v=_v), "rr")))
    if _v != "ch":
        CLAIMS.append((f"lat.dma.{_v}", L, f"DMA map+unmap round-trip multiplier, {_name}, "
                       "every vIOMMU configuration (over the same boot's dma-direct for "
                       "vviommu, the no-IOMMU boot's for Linux's driver)", c_lat,
                       (L, PROTECTED.format(v=_v), "dma")))
CLAIMS += [
    ("lat.rr.vs-qemu", L, "request/response multiplier, dmavisor's / QEMU's, every "
     "configuration both ran", c_lat_vs, (L, "dmavisor/*", "qemu", "rr")),
    ("lat.rr.vs-ch", L, "request/response multiplier, dmavisor's / cloud-hypervisor's",
     c_lat_vs, (L, "dmavisor/*", "ch", "rr")),
    ("lat.dma.vs-qemu", L, "DMA round-trip multiplier, dmavisor's / QEMU's", c_lat_vs,
     (L, "dmavisor/*", "qemu", "dma")),
    ("lat.linux.rr", L, "request/response multiplier, Linux's driver lazy and strict, every "
     "VMM", c_lat, (L, "*/linux-*", "rr")),
    ("lat.pgt.rr", L, "request/response multiplier, page-table lazy-percpu", c_lat,
     (L, PGT_LAZY, "rr")),
    ("lat.pgt.dma", L, "DMA round-trip multiplier, page-table lazy-percpu", c_lat,
     (L, PGT_LAZY, "dma")),
    ("lat.shared.rr", L, "request/response multiplier, vviommu shared strict, every VMM",
     c_lat, (L, "*/vvi-shared-strict", "rr")),
    ("lat.shared.dma", L, "DMA round-trip multiplier, vviommu shared strict (dmavisor, QEMU)",
     c_lat, (L, "*/vvi-shared-strict", "dma")),
    ("lat.shared.vs-magazine.dma", L, "DMA rate, shared strict / magazine strict, same VMM "
     "(same boots)", c_between, (L, "*/vvi-shared-strict", "*/vvi-magazine-strict", "dma")),
    ("lat.shared.vs-identity.dma", L, "DMA rate, shared strict / identity strict, same VMM",
     c_between, (L, "*/vvi-shared-strict", "*/vvi-identity-strict", "dma")),
    ("lat.shared.vs-magazine-lazy.dma", L, "DMA rate, shared strict / magazine lazy-percpu, "
     "same VMM", c_between, (L, "*/vvi-shared-strict", "*/vvi-magazine-lazy-percpu", "dma")),
    ("lat.shared.vs-magazine.rr", L, "request/response time, shared strict / magazine "
     "strict, same VMM", c_between,
     (L, "*/vvi-shared-strict", "*/vvi-magazine-strict", "rr")),
    ("lat.shared.net-rpm", L, "the NIC's requests per map during the sockperf runs, "
     "vviommu shared strict, every VMM", c_net_rpm, (L, "*/vvi-shared-strict")),
    ("lat.magazine-strict.net-rpm", L, "the same, vviommu magazine strict", c_net_rpm,
     (L, "*/vvi-magazine-strict")),
    ("lat.swing", L, "spread of single runs", c_swing, (L,)),
]
COSTS = [("irq_save_restore_ns", "an interrupt-off section"),
         ("spin_lock_irqsave_ns", "a spin lock with interrupts off"),
         ("magazine_alloc_free_ns", "a magazine alloc + free"),
         ("pt_write_clear_ns", "a leaf write + clear"),
         ("map_unmap_ns", "the whole vvi_map + vvi_unmap with its flushes")]
for _f in (C, A):
    for _k, _what in COSTS:
        CLAIMS.append((f"{'closing' if _f == C else 'adjacent'}.pgt.costs.{_k[:-3]}", _f,
                       f"cost probe, page-table lazy-percpu: {_what}", c_costs,
                       (_f, PGT_LAZY, _k)))


HEADER = """# The figures the READMEs quote, recomputed from the committed runs

Generated by `resources/bench-guest --claims > docs/results/claims.md`
(resources/dmavisor_tools/claims.py); `make unit` checks that this file is
what the command prints. Every figure covers ALL configurations its
pattern matches in the named run folder, not the best of a group:
"medians" is the range of the configurations' medians over their
baseline's median, "every run" the range of every single run over it.
Comparisons between VMMs give the ratio of medians and a two-sided
Mann-Whitney U test per (configuration, workload) cell: a cell is
testable only with at least 6 runs from at least 3 boots on each side.
Only 2026-11-26-quick-rounds and 2026-11-27-latency-peers have that many
boots; in the others every cell is "untestable", whatever its ratio.
"""


def render():
    """The claims as the Markdown of docs/results/claims.md."""
    out = [HEADER, "| key | run folder (docs/results/) | what | figure |", "|---|---|---|---|"]
    for key, folder, what, fn, fargs in CLAIMS:
        out.append(f"| {key} | {folder} | {what} | {fn(*fargs)} |")
    return "\n".join(out) + "\n"


def main(dirs=None):
    """Print every claim: key, run folder, what, figure."""
    del dirs  # the claims name their folders
    print(render(), end="")
    return 0
