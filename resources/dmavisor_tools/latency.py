"""Small-I/O latency as a multiplier over no vIOMMU, per VMM (issue 30).

Why: what a vIOMMU costs a request/response is the figure the published
work leaves open (Brucker 2023: 4 KiB latency 7.07x the host's with a
virtio-iommu against 1.23x without). In the nested runner absolute times
are TCG's, and the VMMs differ in their own no-IOMMU speed, so each
VMM's configuration is divided by the SAME VMM's no-vIOMMU baseline; the
multipliers, not the times, are compared between VMMs.

Two figures per configuration:
  rr   sockperf ping-pong's mean round trip over the NIC, divided by the
       no-IOMMU boot's median (same VMM, vCPUs and guest kernel)
  dma  the DMA microbenchmark's time per map+unmap round trip (the
       inverse of its rate; vvi_edu maps and unmaps a 4 KiB buffer, the
       device transfers nothing), divided by its baseline's: the same boot's
       dma-direct measured just before where the run has it, else the
       no-IOMMU boot's
Every run is divided by its baseline's median, so a configuration's range
covers every run of every boot; the baseline's own row shows how far its
runs spread around 1. A VMM's multiplier is called lower or higher than
another's only where stats.compare (Mann-Whitney over >= 6 runs from >= 3
boots each) says so, with its p beside it.

The arithmetic is pure (tests/test_bench_guest.py, class Latency);
bench_guest supplies the records and their baselines.
"""

import statistics

from .stats import boots_of, compare, spread_text, verdict_text

# (workload, label); rr's figure is a time, dma's a rate (inverted here)
FIGURES = (("rr", "request/response (sockperf)"), ("dma", "DMA map+unmap round trip"))
VMM_NAMES = {"dmavisor": "dmavisor", "qemu": "QEMU", "ch": "cloud-hypervisor"}


def multipliers(w, runs, base):
    """Every run of workload w as a multiplier of its baseline's median
    time (above 1: slower than no vIOMMU), each with its round."""
    vals = [e["value"] for e in base if e["value"] > 0]
    if not vals:
        return []
    b = statistics.median(vals)
    out = []
    for e in runs:
        if e["value"] <= 0:
            continue
        # rr is a time; dma a rate, whose time per round trip is 1/rate
        m = e["value"] / b if w == "rr" else b / e["value"]
        out.append({"value": m, "round": e.get("round", 1)})
    return out


def median_multiplier(w, runs, base):
    """The configuration's median over the baseline's median, as times
    (for dma the median rate inverted: with an even number of runs the
    median of the inverted runs would differ from it)."""
    a = [e["value"] for e in runs if e["value"] > 0]
    b = [e["value"] for e in base if e["value"] > 0]
    if not a or not b:
        return None
    ma, mb = statistics.median(a), statistics.median(b)
    return ma / mb if w == "rr" else mb / ma


def summarise(ms, median=None):
    """median (given, else of the multipliers), min, max, runs and boots
    of a list of multipliers."""
    if not ms:
        return None
    v = [m["value"] for m in ms]
    return {"median": statistics.median(v) if median is None else median, "min": min(v),
            "max": max(v), "n": len(v), "boots": boots_of(ms)}


def per_dma_us(runs):
    """The median time of one map+unmap round trip on one vCPU, in us
    (the rate is summed over the benchmark's vCPUs)."""
    v = [(e.get("cpus") or 1) * 1e6 / e["value"] for e in runs if e["value"] > 0]
    return statistics.median(v) if v else None


def rows(records, base_of):
    """One row per configuration: base_of(r, w) -> (baseline runs, what
    they are) gives each record's baseline. Rows carry the multipliers of
    every run (for the comparisons) and their summaries."""
    out = []
    order = list(VMM_NAMES)
    records = sorted(records, key=lambda r: (
        order.index(r["vmm"]) if r["vmm"] in order else len(order), r["vcpus"],
        not r["iommu"].startswith("off"), r["iommu"]))
    for r in records:
        row = {"id": r["id"], "vmm": r["vmm"], "vcpus": r["vcpus"], "iommu": r["iommu"],
               "off": r["iommu"].startswith("off")}
        for w, _ in FIGURES:
            runs = r["workloads"].get(w, [])
            if not runs:
                row[w] = None
                continue
            # the baseline's own row: its runs over their median
            base, what = (runs, "itself") if row["off"] else base_of(r, w)
            ms = multipliers(w, runs, base)
            row[w] = {"ms": ms, "sum": summarise(ms, median_multiplier(w, runs, base)),
                      "base": what,
                      "abs": (statistics.median(e["value"] for e in runs) if w == "rr"
                              else per_dma_us(runs))} if ms else None
        if row["rr"] or row["dma"]:
            out.append(row)
    return out


def ranges(rws):
    """Per (VMM, vCPUs) and figure: the range of every run's multiplier
    over every configuration with a vIOMMU (not the best one's)."""
    out = {}
    for row in rws:
        if row["off"]:
            continue
        for w, _ in FIGURES:
            if row[w]:
                k = (row["vmm"], row["vcpus"], w)
                lo, hi, n = out.get(k, (None, None, 0))
                s = row[w]["sum"]
                out[k] = (s["min"] if lo is None else min(lo, s["min"]),
                          s["max"] if hi is None else max(hi, s["max"]), n + 1)
    return out


def comparisons(rws):
    """dmavisor's multiplier against QEMU's and cloud-hypervisor's for the
    same configuration and figure: ratio of the median multipliers and the
    Mann-Whitney test of the per-run multipliers (lower is better)."""
    by = {(r["vmm"], r["vcpus"], r["iommu"]): r for r in rws}
    out = []
    for row in rws:
        if row["vmm"] != "dmavisor" or row["off"]:
            continue
        for other in ("qemu", "ch"):
            o = by.get((other, row["vcpus"], row["iommu"]))
            if not o:
                continue
            for w, _ in FIGURES:
                if not row[w] or not o[w]:
                    continue
                c = compare(row[w]["ms"], o[w]["ms"], higher_is_better=False)
                out.append({"vcpus": row["vcpus"], "iommu": row["iommu"], "w": w,
                            "other": other, "a": row[w]["sum"], "b": o[w]["sum"],
                            "ratio": row[w]["sum"]["median"] / o[w]["sum"]["median"],
                            "test": c})
    return out


def us(v):
    if v is None:
        return "–"
    return f"{v:,.0f}" if v >= 1000 else f"{v:.3g}"


def x(v):
    if v is None:
        return "–"
    return f"x{v:,.0f}" if v >= 1000 else f"x{v:.3g}"


def sum_text(s):
    return spread_text(s, x)


def comparison_text(c):
    """The comparison as a sentence: "lower"/"higher" only when tested."""
    t = {**c["test"], "verdict": {"faster": "lower", "slower": "higher"}.get(
        c["test"]["verdict"], c["test"]["verdict"])}
    return verdict_text("dmavisor's multiplier", f"{VMM_NAMES[c['other']]}'s", t)


def section(records, base_of):
    """report.md's latency section (Markdown), or "" when the run has no
    latency figure."""
    rws = rows(records, base_of)
    if not rws:
        return ""
    md = ["## Small-I/O latency: multiplier over the same VMM's no-vIOMMU configuration", "",
          "Request/response: sockperf ping-pong's mean round trip over the NIC, each run "
          "over the median of the no-IOMMU boot of the same VMM, vCPUs and guest kernel. "
          "DMA round trip: the DMA microbenchmark's time per 4 KiB map+unmap (1/rate; the "
          "device transfers nothing), each "
          "run over its baseline's median time (the base column). Above x1: slower than "
          "without a vIOMMU. Median (min-max over every run, runs/boots); the `off` rows "
          "are the baselines' own spread. TCG's times, not a host's: the PROJECTION "
          "section projects the latency for a VMX host.", ""]
    hdr = ["VMM", "vCPUs", "configuration", "RR round trip median (us)", "RR multiplier",
           "DMA round trip median (us)", "DMA multiplier", "DMA base"]
    md += ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    for row in rws:
        rr, dma = row["rr"], row["dma"]
        md.append("| " + " | ".join([
            VMM_NAMES.get(row["vmm"], row["vmm"]), str(row["vcpus"]), row["iommu"],
            us(rr["abs"]) if rr else "–", sum_text(rr["sum"]) if rr else "–",
            us(dma["abs"]) if dma else "–",
            sum_text(dma["sum"]) if dma else "–", dma["base"] if dma else "–"]) + " |")
    md += ["", "Range over every configuration with a vIOMMU (every run of each):", ""]
    order = list(VMM_NAMES)
    for (vmm, cpus, w), (lo, hi, n) in sorted(
            ranges(rws).items(), key=lambda kv: (order.index(kv[0][0]) if kv[0][0] in order
                                                 else len(order), kv[0][1], kv[0][2] != "rr")):
        label = dict(FIGURES)[w]
        md.append(f"- {VMM_NAMES.get(vmm, vmm)}, {cpus} vCPU, {label}: {x(lo)}-{x(hi)} "
                  f"over {n} configuration{'s' if n != 1 else ''}")
    comps = comparisons(rws)
    md += ["", "dmavisor's multiplier against the other VMMs' (same configuration and "
           "figure; ratio of the median multipliers, then the Mann-Whitney U test of the "
           "per-run multipliers, lower is better):", ""]
    if not comps:
        md.append("- (no configuration with a vIOMMU ran under two VMMs)")
    for c in comps:
        md.append(f"- {c['vcpus']} vCPU `{c['iommu']}`, {dict(FIGURES)[c['w']]}: "
                  f"dmavisor {x(c['a']['median'])} vs {x(c['b']['median'])}, ratio "
                  f"{x(c['ratio'])}: {comparison_text(c)}")
    tested = [c for c in comps if not c["test"]["why"]]
    if tested:
        found = sum(1 for c in tested if c["test"]["verdict"] != "no significant difference")
        md += ["", f"{len(tested)} of these comparisons tested at p < 0.05: about "
               f"{0.05 * len(tested):.2g} significant results expected by chance alone; "
               f"{found} found."]
    md.append("")
    return "\n".join(md)
