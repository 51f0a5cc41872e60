"""A PROJECTION of what a real VMX host would see, from the nested
runner's event counts and native costs (issue 30's cost model).

Why: the nested runner (QEMU TCG running our VMM on KVM) makes every
guest memory access and interrupt toggle cost several times dma-direct's
whole path, so its ratio to no IOMMU mostly measures TCG, not the design.
What does carry over from the runner is how OFTEN things happen (requests,
flushes per DMA); how LONG each takes must come from native figures:

  guest side   the vviommu core built in user space (guest-driver/userspace
               `make bench`: ns per map+unmap pair per policy, mode and
               thread count), or, where it has no figure, the runner's own
               cost probe scaled by native/runner dma-direct
  device side  `make bench-host` (host-map-bench): a request's table work,
               an INVALIDATE of a 4096-entry batch, a translation
  exits        published KVM figures, each with its source (COSTS)
  baseline     dma-direct's map+unmap: a native measurement of our own
               imitation of it (said so; COSTS)

Per DMA (one map + unmap pair):
  protected_ns = guest_ns + requests/DMA x (exit + the request's device work)
                 [+ in page-table mode one entry's share of an INVALIDATE]
DMA-rate ratio  = direct_ns / protected_ns        (the microbenchmark does
                                                   nothing but map+unmap)
Small-I/O latency (request/response: one pair per direction, each buffer
translated once by the device):
  latency_ns = base + 2 x (protected_ns - direct_ns) + 2 x translate_ns
  ratio      = latency_ns / base

Everything but the loaders is pure arithmetic, tested in
tests/test_projection.py.
"""

import json
import os
import statistics

# Input costs that are not read from a committed benchmark file: value,
# unit, and where it comes from. A figure that is our own estimate says so.
COSTS = {
    "direct_ns": {
        "value": 8.6, "unit": "ns per map+unmap pair",
        "source": "an IMITATION, not the kernel: our own user-space code doing what Linux 6.1's "
                  "dma_map_page_attrs/dma_unmap_page_attrs do for a coherent x86 device with "
                  "no dma_map_ops (direction and mask checks, page to address, forced-bounce "
                  "flag, dma_capable, coherence and DMA-debug tests, the swiotlb range check "
                  "on unmap), both calls out of line, the user-space guest benchmark's loop; "
                  "8.55-8.75 ns on-CPU in 6 runs on this VM, "
                  "docs/results/2026-11-27-projection-3/direct-imitation.{c,txt}. The kernel "
                  "does a few more loads and compares (virt_to_page, static-key tests), so "
                  "this errs low, i.e. against the protected configurations. It replaces the "
                  "round 30 ns estimate of the earlier projections, which had no basis."},
    "exit_ns": {
        "value": 1500.0, "unit": "ns per request (kick exit to the VMM and back)",
        "source": "dmavisor serves a single request queue inline on the kicking vCPU "
                  "(vmm/src/virtio/iommu/options.rs RequestServing::Auto), so a request "
                  "costs one exit to user space and re-entry. Floor: a KVM_RUN round trip "
                  "with VMRUN measured at 2528-2576 cycles (~1 us at 2.5 GHz), "
                  "https://lkml.iu.edu/hypermail/linux/kernel/2012.2/00527.html; plus "
                  "MMIO decode and the VMM's dispatch: 1-2 us is the usual range for an "
                  "MMIO/PIO exit to user space; 1.5 us taken, sensitivity at 2x."},
    "base_latency_ns": {
        "value": 29000.0, "unit": "ns per request/response without an IOMMU",
        "source": "Peleg et al., Utilizing the IOMMU Scalably (USENIX ATC 2015), "
                  "/work/shared/seeds/000: netperf TCP RR, one instance, no IOMMU, 29 us "
                  "(bare metal, 10 Gb/s NIC; a VM's is longer, which would make the "
                  "ratio smaller: 29 us is the conservative choice)."},
}

# Published hardware-IOMMU figures quoted beside the projection (not used
# in its arithmetic): what a real VT-d costs for the same operations.
REFERENCE = [
    ("VT-d I/O page-table update", "991 cycles (2.66 GHz: 373 ns)",
     "Willmann et al., Protection strategies for direct access to virtualized I/O "
     "devices (USENIX ATC 2008), Table 2, /work/shared/seeds/002"),
    ("VT-d IOTLB flush", "1217 cycles (458 ns)", "same, Table 2"),
    ("VT-d update + flush", "2213 cycles (832 ns)", "same, Table 2"),
    ("IOMMU designs vs no IOMMU, TCP RR, 1 core", "93-95% of the throughput; latency "
     "on par (EiovaR within 1.2 us of 29 us)",
     "Peleg et al. (ATC 2015), Section 7, /work/shared/seeds/000"),
]

GOAL_DMA = 0.9
GOAL_LATENCY = 1.3


# ------------------------------------------------------------- arithmetic


def protected_ns(guest_ns, requests_per_dma, request_ns):
    """Native cost of one protected map+unmap pair: the guest's own work
    plus its share of the requests it sends (each an exit and the device's
    work for it)."""
    return guest_ns + requests_per_dma * request_ns


def dma_rate_ratio(direct_ns, prot_ns):
    """The microbenchmark's rate with protection over dma-direct's: the
    inverse ratio of the per-pair costs."""
    if not prot_ns or prot_ns <= 0:
        return None
    return direct_ns / prot_ns


def latency_ratio(base_ns, direct_ns, prot_ns, translate_ns, pairs=2):
    """A request/response with `pairs` map+unmap pairs (one per direction)
    over the same without an IOMMU: the protection adds its extra cost per
    pair and one translation per buffer by the device."""
    if not base_ns or base_ns <= 0:
        return None
    extra = pairs * (prot_ns - direct_ns) + pairs * translate_ns
    return (base_ns + extra) / base_ns


def scaled_guest_ns(runner_map_unmap_ns, runner_direct_ns, direct_ns):
    """The fallback guest cost: the runner's cost probe of a whole
    vvi_map + vvi_unmap scaled by how much faster dma-direct is natively
    than in the runner (assumes TCG slows both paths alike, which it does
    not: the probe's interrupt toggles are dearer under TCG)."""
    if not runner_direct_ns or runner_map_unmap_ns is None:
        return None
    return runner_map_unmap_ns * direct_ns / runner_direct_ns


# Entries in bench-host's invalidate_sparse batch: an INVALIDATE's cost
# follows the live entries it removes (invalidate_cost_follows_live_entries),
# so one DMA's share is the batch's cost over its entries, however many
# DMAs a flush batches.
INVALIDATE_BATCH_ENTRIES = 4096


def request_ns(mode, costs):
    """One request's cost: the exit, plus in MAP mode a MAP or UNMAP's
    table work (half a map+unmap pair of bench-host). In page-table mode
    the requests are INVALIDATEs, whose work is charged per entry
    (per_dma_device_ns), not per request."""
    return costs["exit_ns"] + (0.0 if mode == "pgt" else costs["device_pair_ns"] / 2)


def per_dma_device_ns(mode, costs):
    """Device work every protected DMA causes apart from its requests: in
    page-table mode, removing its one entry within some INVALIDATE."""
    return costs["invalidate_batch_ns"] / INVALIDATE_BATCH_ENTRIES if mode == "pgt" else 0.0


def project(cfg, costs):
    """The projection of one configuration.

    cfg: mode ("pgt", "map" or "direct"), requests_per_dma, guest_ns (the
    native guest cost, or None), runner figures for the fallback.
    costs: direct_ns, exit_ns, device_pair_ns, invalidate_batch_ns,
    translate_ns, base_latency_ns.
    Returns guest_ns used and its kind, protected_ns, dma and latency
    ratios (None where an input is missing)."""
    d = costs["direct_ns"]
    if cfg["mode"] == "direct":
        # passthrough: the driver hands the device dma-direct's addresses
        return {"guest_ns": d, "guest_kind": "dma-direct", "protected_ns": d,
                "dma": 1.0, "latency": 1.0}
    g, kind = cfg.get("guest_ns"), "native (user-space build)"
    if g is None:
        g = scaled_guest_ns(cfg.get("runner_map_unmap_ns"), cfg.get("runner_direct_ns"), d)
        kind = "runner probe, scaled"
    if g is None or cfg.get("requests_per_dma") is None:
        return {"guest_ns": None, "guest_kind": "no figure", "protected_ns": None,
                "dma": None, "latency": None}
    p = protected_ns(g, cfg["requests_per_dma"], request_ns(cfg["mode"], costs)) \
        + per_dma_device_ns(cfg["mode"], costs)
    return {"guest_ns": g, "guest_kind": kind, "protected_ns": p,
            "dma": dma_rate_ratio(d, p),
            "latency": latency_ratio(costs["base_latency_ns"], d, p, costs["translate_ns"])}


SENSITIVE = ("guest_ns", "direct_ns", "exit_ns", "invalidate_batch_ns", "device_pair_ns",
             "translate_ns", "base_latency_ns")


def sensitivity(cfg, costs, factor=2.0):
    """The projection of cfg with each input cost multiplied and divided
    by `factor` in turn: {input: (dma, latency) at x factor, at / factor}.
    The input whose change moves the ratios most dominates."""
    out = {}
    for k in SENSITIVE:
        row = []
        for f in (factor, 1 / factor):
            c, g = dict(costs), dict(cfg)
            if k == "guest_ns":
                if g.get("guest_ns") is None:
                    continue
                g["guest_ns"] = g["guest_ns"] * f
            else:
                c[k] = c[k] * f
            p = project(g, c)
            row.append((p["dma"], p["latency"]))
        if len(row) == 2:
            out[k] = tuple(row)
    return out


# The costs of the protected path (the baseline's, direct_ns and
# base_latency_ns, are in the sensitivity table but are not "the
# protection's cost").
PATH_COSTS = ("guest_ns", "exit_ns", "invalidate_batch_ns", "device_pair_ns", "translate_ns")


def dominant(sens):
    """The protected path's input whose x2 and /2 move the DMA-rate ratio
    the most (ties: latency)."""
    def swing(k):
        (d_hi, l_hi), (d_lo, l_lo) = sens[k]
        return (abs((d_hi or 0) - (d_lo or 0)), abs((l_hi or 0) - (l_lo or 0)))
    keys = [k for k in PATH_COSTS if k in sens]
    return max(keys, key=swing) if keys else None


def guest_budget_ns(cfg, costs, goal=GOAL_DMA):
    """The largest guest cost per pair that would still meet the DMA-rate
    goal with cfg's requests and the device's share: direct/goal minus
    the rest. Negative: no guest code, however fast, meets it."""
    rest = protected_ns(0.0, cfg["requests_per_dma"] or 0.0, request_ns(cfg["mode"], costs)) \
        + per_dma_device_ns(cfg["mode"], costs)
    return costs["direct_ns"] / goal - rest


def meets(p):
    """Whether a projection meets issue 30's goals."""
    if p["dma"] is None or p["latency"] is None:
        return None
    return p["dma"] >= GOAL_DMA and p["latency"] <= GOAL_LATENCY


# --------------------------------------------------------------- loaders


def load_guest_alloc(path):
    """`make -C guest-driver userspace-bench` output (JSON lines among
    other lines): {(policy, invalidation, mode, threads): ns per
    map+unmap}, mode "map" or "pgtable". A file of several runs gives the
    best (lowest) of each row, as bench-host does: on a busy machine the
    other runs' excess is other processes' time, not the driver's. The
    on-CPU figure (cpu_ns_per_map_unmap) where the line has one, as
    load_bench_host takes bench-host's: wall time on a shared machine
    includes waiting for a core; older files have only the wall figure."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                o = json.loads(line)
            except ValueError:
                continue
            if "policy" in o and "ns_per_map_unmap" in o:
                key = (o["policy"], o["invalidation"], o["mode"], int(o["threads"]))
                v = float(o.get("cpu_ns_per_map_unmap", o["ns_per_map_unmap"]))
                out[key] = min(v, out.get(key, v))
    return out


def load_bench_host(path):
    """`make bench-host` output: the scalable table's figures the model
    needs, on-CPU ns (cpu_ns_per_op, less inflated by a loaded machine
    than the wall figure), 1 thread, the simulated consumer. A file of
    several runs gives the best of each row, as load_guest_alloc does."""
    rows = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                o = json.loads(line)
            except ValueError:
                continue
            if o.get("bench") == "host-map" and o.get("impl") == "scalable" \
                    and o.get("consumer") == "sim" and o.get("threads") == 1:
                v = float(o["cpu_ns_per_op"])
                rows[o["workload"]] = min(v, rows.get(o["workload"], v))
    need = {"device_pair_ns": "map_unmap", "translate_ns": "translate_under_churn",
            "invalidate_batch_ns": "invalidate_sparse"}
    missing = [w for w in need.values() if w not in rows]
    if missing:
        raise ValueError(f"{path}: no scalable/sim/1-thread row for {', '.join(missing)}")
    return {k: rows[w] for k, w in need.items()}


def mode_of(r):
    if r.get("driver") == "pgt":
        return "pgt"
    if r.get("policy") == "passthrough":
        return "direct"
    return "map" if r.get("driver") == "vvi" else None


def runner_direct_ns(r, recs):
    """The runner's dma-direct ns per pair for r: the same boot's
    dma-direct rate where recorded, else the no-IOMMU boot's."""
    vals = [e["value"] for e in r.get("dma_direct_runs") or []]
    if not vals:
        off = "off-" + r["guest"].rsplit("-", 1)[1]
        base = recs.get(f"{r['vmm']}/{r['vcpus']}cpu/{off}")
        vals = [e["value"] for e in (base or {}).get("workloads", {}).get("dma", [])]
    return 1e9 / statistics.median(vals) if vals else None


def probe_map_unmap_ns(r):
    """The median of the cost probe's whole map+unmap over the boots
    (older runs keep one dict, newer one per round)."""
    c = r.get("costs")
    probes = c if isinstance(c, list) else [c] if c else []
    vals = [p["map_unmap_ns"] for p in probes if p.get("map_unmap_ns")]
    return statistics.median(vals) if vals else None


def config_inputs(r, recs, alloc):
    """The model's inputs for one record of results.jsonl."""
    mode = mode_of(r)
    if mode is None or "dma" not in r.get("expected_workloads", ["dma"]):
        return None
    bench_mode = "pgtable" if mode == "pgt" else "map"
    g = alloc.get((r.get("policy"), r.get("invalidation"), bench_mode, int(r["vcpus"])))
    runs = r["workloads"].get("dma", [])
    maps = sum(e.get("maps", 0) for e in runs)
    # unrounded (results.jsonl keeps 4 decimals: 0.0003 is 0.00025-0.00035)
    rpd = sum(e.get("requests", 0) for e in runs) / maps if maps else r.get("requests_per_dma")
    return {"mode": mode, "requests_per_dma": rpd, "guest_ns": g,
            "runner_map_unmap_ns": probe_map_unmap_ns(r),
            "runner_direct_ns": runner_direct_ns(r, recs)}


def measured(r, recs):
    """The runner's measured ratios beside the projection: DMA over its
    baseline (bench_guest.ratio_summary), request/response latency over
    the no-IOMMU boot."""
    from .bench_guest import baseline_of, med, ratio, ratio_summary
    s = ratio_summary(r, "dma", recs)
    return {"dma": s["median"] if s else None, "dma_base": s["base"] if s else None,
            "latency": ratio(med(r, "rr"), med(baseline_of(r, recs), "rr"))}


def default_paths(repo):
    inputs = os.path.join(repo, "docs/results/2026-11-27-projection-3")
    return {"alloc": os.path.join(inputs, "alloc-bench-3-runs.jsonl"),
            "host": os.path.join(inputs, "host-bench-3-runs.jsonl")}


def load_costs(paths):
    """Every input cost with its value and source."""
    costs = {k: v["value"] for k, v in COSTS.items()}
    sources = {k: f"{v['value']:g} {v['unit']}: {v['source']}" for k, v in COSTS.items()}
    host = load_bench_host(paths["host"])
    costs.update(host)
    rel = paths.get("host_label", paths["host"])
    sources["device_pair_ns"] = (f"{host['device_pair_ns']:g} ns on-CPU per MAP+UNMAP pair "
                                 f"(half per request): `make bench-host`, scalable, sim, "
                                 f"1 thread, {rel}")
    sources["invalidate_batch_ns"] = (f"{host['invalidate_batch_ns']:g} ns per INVALIDATE of "
                                      f"a 4096-entry batch over a sparse span: same file, "
                                      "invalidate_sparse")
    sources["translate_ns"] = (f"{host['translate_ns']:g} ns on-CPU per translation under "
                               "churn: same file, translate_under_churn")
    return costs, sources


# ---------------------------------------------------------------- report


def fmt(v, nd=3):
    return "–" if v is None else f"{v:.{nd}g}"


def probe_scaled_text(cfg, costs):
    """The same projection with the runner's cost probe, scaled, as the
    guest cost: a second estimate of the guest's work beside the user-space
    build's (the two disagree; the table shows both)."""
    if cfg["mode"] == "direct" or cfg.get("runner_map_unmap_ns") is None:
        return "–"
    p = project({**cfg, "guest_ns": None}, costs)
    return f"{fmt(p['dma'])} / {fmt(p['latency'])} (guest {fmt(p['guest_ns'], 3)} ns)"


def section(runs, costs, sources, alloc, alloc_source):
    """The projection as Markdown: runs is [(label, records)]; alloc the
    guest allocator's native figures (load_guest_alloc), alloc_source
    where they come from. Returns (markdown, best page-table row)."""
    md = ["## PROJECTION: what a VMX host would see (not a measurement)", "",
          "Per configuration: the runner's event counts (requests per DMA) times native "
          "costs, against dma-direct's native cost. The runner's measured ratios stand "
          "beside it; they are TCG's, not a host's. Goals (issue 30): projected DMA rate "
          f">= {GOAL_DMA}x and small-I/O latency <= {GOAL_LATENCY}x no IOMMU for the best "
          "page-table configuration. Only dmavisor's configurations: the device and exit "
          "costs are its own.", ""]
    hdr = ["run", "configuration", "requests/DMA", "guest ns (kind)", "protected ns/pair",
           "measured DMA ratio (base)", "measured RR latency ratio",
           "PROJECTED DMA ratio", "PROJECTED latency ratio", "goals",
           "PROJECTED DMA / latency with the probe-scaled guest cost"]
    md += ["| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
    best = None
    for label, records in runs:
        recs = {r["id"]: r for r in records}
        for r in records:
            # the device and exit costs are dmavisor's (bench-host, inline
            # request serving): other VMMs' configurations are not projected
            cfg = config_inputs(r, recs, alloc) if r["vmm"] == "dmavisor" else None
            if cfg is None:
                continue
            p = project(cfg, costs)
            m = measured(r, recs)
            ok = meets(p)
            rpd = fmt(cfg["requests_per_dma"], 3)
            if cfg["mode"] == "pgt" and not cfg["requests_per_dma"]:
                rpd += " (no flush in its runs)"
            md.append("| " + " | ".join([
                label, f"`{r['id']}`", rpd,
                f"{fmt(p['guest_ns'], 4)} ({p['guest_kind']})", fmt(p["protected_ns"], 4),
                f"{fmt(m['dma'])} ({m['dma_base'] or '–'})", fmt(m["latency"]),
                fmt(p["dma"]), fmt(p["latency"]),
                "–" if ok is None else "meets" if ok else "misses",
                probe_scaled_text(cfg, costs)]) + " |")
            # a page-table run without a single request never flushed: its
            # requests/DMA of 0 understates, it cannot be the best
            if cfg["mode"] == "pgt" and p["dma"] is not None and cfg["requests_per_dma"] \
                    and (best is None or p["dma"] > best[2]["dma"]):
                best = (label, r, p, cfg)
    md.append("")
    if best:
        label, r, p, cfg = best
        sens = sensitivity(cfg, costs)
        dom = dominant(sens)
        md += [f"Best page-table configuration (projected DMA ratio): `{r['id']}` of {label}: "
               f"DMA {fmt(p['dma'])}x (goal >= {GOAL_DMA}), latency {fmt(p['latency'])}x "
               f"(goal <= {GOAL_LATENCY}): "
               + ("meets both goals." if meets(p) else "does NOT meet "
                  + " and ".join(g for g, bad in (
                      ("the DMA-rate goal", p["dma"] < GOAL_DMA),
                      ("the latency goal", p["latency"] > GOAL_LATENCY)) if bad) + "."), "",
               f"The DMA-rate goal leaves the guest {fmt(guest_budget_ns(cfg, costs), 3)} ns "
               f"per map+unmap pair with this configuration's requests and device share "
               f"(dma-direct's {fmt(costs['direct_ns'], 3)} ns / {GOAL_DMA} minus the "
               "rest)" + ("; negative: no guest code meets it." if guest_budget_ns(cfg, costs)
                          < 0 else "."), "",
               "Sensitivity of that configuration (each input x2 and /2 in turn):", "",
               "| input | DMA ratio x2 | DMA ratio /2 | latency x2 | latency /2 |",
               "|---|---|---|---|---|"]
        for k, ((dh, lh), (dl, ll)) in sens.items():
            md.append(f"| {k} | {fmt(dh)} | {fmt(dl)} | {fmt(lh)} | {fmt(ll)} |")
        md += ["", f"Dominant input: `{dom}`.", ""]
    md += ["### Input costs and their sources", "",
           f"- guest_ns: {alloc_source}"]
    md += [f"- {k}: {v}" for k, v in sources.items()]
    md += ["", "### Published hardware-IOMMU figures (for comparison, not in the arithmetic)",
           ""]
    md += [f"- {what}: {val} ({src})" for what, val, src in REFERENCE]
    md.append("")
    return "\n".join(md), best
