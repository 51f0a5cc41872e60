"""bench-guest's plan and parser (issue 30's method): shuffled rounds,
every round's figures kept, every project configuration in the headline
with its range, and VMM comparisons only with a test across boots."""

import os
import tempfile
import unittest
from types import SimpleNamespace

from dmavisor_tools import bench_guest as bg
from dmavisor_tools import latency


def args(**kw):
    base = {"ch": None, "demo": False, "quick": True, "cpus": "1", "only": "", "rounds": 1,
            "seed": 1}
    base.update(kw)
    return SimpleNamespace(**base)


def session(boots, figures):
    """Session lines as bench-host.sh/bench-guest.sh print them.
    figures(boot, label) -> list of BENCH... lines without the prefix."""
    lines = []
    for b in boots:
        lines.append(f"{bg.BEGIN} {b['name']}")
        for lbl in b["configs"]:
            lines += [f"[guest] {line.format(lbl=lbl)}" for line in figures(b, lbl)]
        lines.append(f"{bg.END} {b['name']} rc=0 ns=1000000000")
    return lines


class Plan(unittest.TestCase):
    def test_rounds_are_shuffled_named_and_reproducible(self):
        one = bg.plan_boots(args(rounds=1))
        plan = bg.plan_boots(args(rounds=4, seed=9))
        self.assertEqual(len(plan), 4 * len(one))
        names = {b["name"] for b in one}
        for k in range(1, 5):
            part = [b for b in plan if b["round"] == k]
            self.assertEqual({b["name"] for b in part}, {f"{n}-r{k}" for n in names})
        again = bg.plan_boots(args(rounds=4, seed=9))
        self.assertEqual([b["name"] for b in plan], [b["name"] for b in again])
        orders = {tuple(b["name"].rsplit("-r", 1)[0] for b in plan if b["round"] == k)
                  for k in range(1, 5)}
        self.assertGreater(len(orders), 1, "every round booted in the same order")

    def test_a_single_round_keeps_the_names_and_is_tagged(self):
        plan = bg.plan_boots(args(rounds=1))
        self.assertTrue(all(b["round"] == 1 and not b["name"].endswith("-r1") for b in plan))


def figures(b, lbl):
    """DMA, network, cost probe and NIC statistics, scaled by the round
    so that every round's figures can be told apart."""
    k = b["round"]
    out = []
    for run in (1, 2):
        out += [f"BENCH dma iommu={{lbl}} run={run} ops_per_sec={1000 * k + run} errors=0 "
                "cpus=1 maps=100 requests=1 flushes=2",
                f"BENCH tcp_tx iommu={{lbl}} run={run} kbps={100 * k + run}",
                f"BENCH tcp_rx iommu={{lbl}} run={run} kbps={200 * k + run}",
                f"BENCH rr iommu={{lbl}} run={run} lat_us={10 * k + run}"]
    if b["mode"] == "vvi":
        out = [f"BENCH-INFO iommu={{lbl}} dma_direct={10000 * k}"] + out
        out += [f"BENCH-COSTS iommu={{lbl}} map_unmap_ns={1000 + k}",
                f"BENCH-NETSTATS iommu={{lbl}} maps={50 * k} requests={k}"]
    return out


class Parse(unittest.TestCase):
    def setUp(self):
        self.boots = bg.plan_boots(args(rounds=3, seed=4))
        self.records = bg.parse(session(self.boots, figures), self.boots)
        self.by_id = {r["id"]: r for r in self.records}

    def test_every_round_keeps_its_runs_costs_and_nic_figures(self):
        r = self.by_id["dmavisor/1cpu/vvi-magazine-lazy-percpu"]
        self.assertEqual(r["status"], "ok", r["errors"])
        for w in bg.WORKLOADS:
            self.assertEqual(sorted(e["round"] for e in r["workloads"][w]), [1, 1, 2, 2, 3, 3])
        self.assertEqual(sorted((c["round"], c["map_unmap_ns"]) for c in r["costs"]),
                         [(1, 1001), (2, 1002), (3, 1003)])
        self.assertEqual(sorted((n["round"], n["maps"]) for n in r["net_dma"]),
                         [(1, 50), (2, 100), (3, 150)])
        self.assertEqual(sorted((d["round"], d["value"]) for d in r["dma_direct_runs"]),
                         [(1, 10000.0), (2, 20000.0), (3, 30000.0)])
        self.assertEqual([c["round"] for c in r["cases"]], [1, 2, 3])

    def test_dma_ratio_is_over_the_same_boots_dma_direct(self):
        r = self.by_id["dmavisor/1cpu/vvi-magazine-lazy-percpu"]
        s = bg.ratio_summary(r, "dma", self.by_id)
        self.assertEqual(s["base"], "dma-direct, same boot")
        self.assertEqual((s["n"], s["boots"], s["flushes"]), (6, 3, 12))
        # dma-direct 10,000 / 20,000 / 30,000 in rounds 1-3: median 20,000;
        # the runs 1001-3002 (median 2001.5)
        self.assertAlmostEqual(s["median"], 2001.5 / 20000)
        self.assertAlmostEqual(s["min"], 1001 / 20000)
        self.assertAlmostEqual(s["max"], 3002 / 20000)
        # the no-IOMMU boot is the baseline where there is no dma-direct
        off = bg.ratio_summary(r, "tcp_rx", self.by_id)
        self.assertEqual(off["base"], "no-IOMMU boot")
        self.assertAlmostEqual(off["median"], 1.0)

    def test_headline_lists_every_project_configuration_and_their_range(self):
        hl = bg.headline(self.records)
        dmavisor = {h["iommu"] for h in hl if h["vmm"] == "dmavisor" and h["project"]}
        self.assertEqual(dmavisor, {f"vvi-{p}-{i}" for p, i in bg.QUICK_VVI})
        text = bg.headline_text(self.records)
        self.assertIn("all 2 project configurations, every run: DMA", text)
        self.assertIn("6 runs/3 boots", text)

    def test_vmm_comparisons_carry_a_p_value(self):
        comps = bg.comparisons(self.records)
        self.assertTrue(comps)
        for _, _, _, _, text in comps:
            self.assertIn("Mann-Whitney p = ", text)
            # identical figures under both VMMs: never a ranking
            self.assertIn("no significant difference", text)


class Workloads(unittest.TestCase):
    """--workloads: a latency run skips the bulk transfers; the guest is
    told so, and the configurations are complete without them."""

    def test_selected_workloads_reach_the_guest_and_the_status(self):
        boots = bg.plan_boots(args(workloads="dma,rr"))
        line = bg.boot_cmdline(boots[0], SimpleNamespace(
            runs=2, iters=0, secs=1, dma_ms=200, vvi_params=""))
        self.assertIn("bench_workloads=dma,rr", line)

        def latency_only(b, lbl):
            return [f for f in figures(b, lbl) if " tcp_" not in f]

        records = bg.parse(session(boots, latency_only), boots)
        for r in records:
            self.assertEqual(r["status"], "ok", (r["id"], r["errors"]))
            self.assertNotIn("tcp_rx", r["expected_workloads"])
        # the same figures without the selection: the TCP runs are missing
        full = bg.plan_boots(args())
        self.assertNotIn("bench_workloads", bg.boot_cmdline(full[0], SimpleNamespace(
            runs=2, iters=0, secs=1, dma_ms=200, vvi_params="")))
        incomplete = bg.parse(session(full, latency_only), full)
        self.assertTrue(all(r["status"] == "incomplete" for r in incomplete))

    def test_shared_policy_is_planned(self):
        ids = [c[0] for c in bg.configurations(bg.plan_boots(args(quick=False, cpus="1")))]
        self.assertIn("dmavisor/1cpu/vvi-shared-strict", ids)
        self.assertIn("qemu/1cpu/vvi-shared-strict", ids)

    def test_identity_page_table_pairs_are_in_the_full_matrix_only(self):
        """issue 30: pgt-identity-* are measured by the full matrix (and
        --only), under dmavisor only; --quick and --demo (make test, make
        demo) keep the boots and configurations they had."""
        def ids(**kw):
            return [c[0] for c in bg.configurations(bg.plan_boots(args(**kw)))]
        full = ids(quick=False, cpus="1")
        for inv in ("lazy-percpu", "strict"):
            self.assertIn(f"dmavisor/1cpu/pgt-identity-{inv}", full)
            self.assertNotIn(f"qemu/1cpu/pgt-identity-{inv}", full)
        vvi = {"mode": "vvi", "configs": {"pgt-identity-strict": "pgt-identity-strict"}}
        self.assertIn("bench_configs=identity:strict:pgt", bg.boot_cmdline(
            vvi, SimpleNamespace(runs=1, iters=0, secs=1, dma_ms=200, vvi_params="")))
        quick = ids()
        self.assertFalse([c for c in quick if "/pgt-" in c], quick)
        # three boots per VMM, eight configurations: as before issue 30's pair
        self.assertEqual((len(bg.plan_boots(args())), len(quick)), (6, 8))
        demo = ids(demo=True, quick=False)
        self.assertEqual([c for c in demo if "/pgt-" in c],
                         ["dmavisor/2cpu/pgt-magazine-lazy-percpu"])
        only = ids(quick=False, cpus="1", only="dmavisor/*/pgt-identity-*")
        self.assertEqual(sorted(only), ["dmavisor/1cpu/pgt-identity-lazy-percpu",
                                        "dmavisor/1cpu/pgt-identity-strict"])


class Latency(unittest.TestCase):
    """The small-I/O latency section (latency.py): multipliers over the
    same VMM's no-vIOMMU baseline, every run's range, and VMM-vs-VMM
    comparisons of the multipliers with their p."""

    def test_every_run_is_a_multiplier_of_its_baselines_median_time(self):
        base = [{"value": 5.0, "round": 1}, {"value": 5.0, "round": 2},
                {"value": 15.0, "round": 3}]
        rr = latency.multipliers("rr", [{"value": 10.0, "round": 1},
                                        {"value": 20.0, "round": 2}], base)
        self.assertEqual([(m["value"], m["round"]) for m in rr], [(2.0, 1), (4.0, 2)])
        # a rate: the time per round trip is its inverse
        dma = latency.multipliers("dma", [{"value": 100.0, "round": 1},
                                          {"value": 0.0, "round": 1},
                                          {"value": 50.0, "round": 3}],
                                  [{"value": 1000.0, "round": 1}])
        self.assertEqual([(m["value"], m["round"]) for m in dma], [(10.0, 1), (20.0, 3)])
        self.assertEqual(latency.multipliers("rr", base, []), [])

    def test_a_rates_median_multiplier_inverts_the_median_rate(self):
        runs = [{"value": 100.0, "round": 1}, {"value": 300.0, "round": 2}]
        base = [{"value": 1000.0, "round": 1}]
        # 1000 / median(100, 300) = 5, not median(10, 3.33) = 6.67
        self.assertAlmostEqual(latency.median_multiplier("dma", runs, base), 5.0)
        s = latency.summarise(latency.multipliers("dma", runs, base), 5.0)
        self.assertEqual((s["median"], s["n"], s["boots"]), (5.0, 2, 2))
        self.assertAlmostEqual(s["min"], 1000 / 300)
        self.assertAlmostEqual(s["max"], 10.0)

    def setUp(self):
        # dmavisor's protected round trips take 3x its no-IOMMU ones,
        # QEMU's and cloud-hypervisor's 1.5x; DMA 100x and 50x
        def fig(b, lbl):
            slow = (3.0 if b["vmm"] == "dmavisor" else 1.5) if lbl != "off" else 1.0
            out = []
            for run in (1, 2):
                jitter = 0.01 * (b["round"] * 2 + run)
                out.append(f"BENCH rr iommu={{lbl}} run={run} lat_us={100 * slow + jitter}")
                if b["vmm"] != "ch":
                    dslow = (100.0 if b["vmm"] == "dmavisor" else 50.0) if lbl != "off" else 1.0
                    out.append(f"BENCH dma iommu={{lbl}} run={run} "
                               f"ops_per_sec={1e6 / dslow + jitter} errors=0 cpus=1 maps=10 "
                               "requests=10 flushes=0")
            if b["mode"] == "vvi":
                out = ["BENCH-INFO iommu={lbl} dma_direct=1000000"] + out
            return out

        self.boots = bg.plan_boots(args(ch="/bin/true", rounds=3, seed=2, workloads="dma,rr"))
        self.records = bg.parse(session(self.boots, fig), self.boots)
        self.recs = {r["id"]: r for r in self.records}

    def base_of(self, r, w):
        return bg.base_runs(r, w, self.recs)

    def test_rows_divide_by_the_same_vmms_baseline(self):
        rows = {r["id"]: r for r in latency.rows(self.records, self.base_of)}
        d = rows["dmavisor/1cpu/vvi-magazine-strict"]
        self.assertAlmostEqual(d["rr"]["sum"]["median"], 3.0, places=2)
        self.assertEqual((d["rr"]["sum"]["n"], d["rr"]["sum"]["boots"]), (6, 3))
        self.assertAlmostEqual(d["dma"]["sum"]["median"], 100.0, places=2)
        self.assertEqual(d["dma"]["base"], "dma-direct, same boot")
        self.assertAlmostEqual(rows["qemu/1cpu/vvi-magazine-strict"]["rr"]["sum"]["median"],
                               1.5, places=3)
        off = rows["dmavisor/1cpu/off-6.1"]
        self.assertEqual(off["rr"]["base"], "itself")
        self.assertAlmostEqual(off["rr"]["sum"]["median"], 1.0, places=3)
        self.assertIsNone(rows["ch/1cpu/vvi-magazine-strict"]["dma"])

    def test_section_prints_ranges_and_every_comparison_with_its_p(self):
        text = latency.section(self.records, self.base_of)
        self.assertIn("| dmavisor | 1 | vvi-magazine-strict |", text)
        self.assertIn("x3 (x3-x3, 6 runs/3 boots)", text)
        for other in ("QEMU", "cloud-hypervisor"):
            self.assertIn(f"dmavisor's multiplier is higher than {other}'s "
                          "(Mann-Whitney p = 0.00216, 6 runs/3 boots vs 6 runs/3 boots)", text)
        # no DMA figure under cloud-hypervisor: no DMA comparison with it
        self.assertNotIn("DMA map+unmap round trip: dmavisor x100 vs – ", text)
        # rr of the two vviommu configurations (quick mode has no 6.12
        # baseline: Linux lazy has no multiplier, hence no comparison)
        self.assertEqual(text.count("vs cloud-hypervisor's") + text.count(
            "than cloud-hypervisor's"), 2)
        self.assertNotIn("linux-lazy", text)
        self.assertIn("- dmavisor, 1 vCPU, request/response (sockperf): x3-x3 over 2 "
                      "configurations", text)
        # report.md carries it, and no empty TCP sections (not run)
        with tempfile.TemporaryDirectory() as d:
            bg.report(d, self.records, {
                "started": "t", "command": "c", "runner": "r", "runs": 2, "secs": 1,
                "iters": 0, "dma_ms": 200, "session_secs": 1, "versions": {}, "seed": 2})
            with open(os.path.join(d, "report.md"), encoding="utf-8") as f:
                md = f.read()
        self.assertIn(text, md)
        self.assertNotIn("## TCP guest->peer", md)
        self.assertIn("## TCP request/response", md)

    def test_comparisons_are_not_verdicts_without_enough_boots(self):
        one = [b for b in self.boots if b["round"] == 1]
        recs = bg.parse(session(one, lambda b, lbl: [
            f"BENCH rr iommu={{lbl}} run=1 lat_us={300 if b['vmm'] == 'dmavisor' else 100}"]),
            one)
        by = {r["id"]: r for r in recs}
        comps = latency.comparisons(latency.rows(recs, lambda r, w: bg.base_runs(r, w, by)))
        self.assertTrue(comps)
        for c in comps:
            self.assertEqual(c["test"]["verdict"], "no significant difference")
            self.assertIn("too few to test", latency.comparison_text(c))


if __name__ == "__main__":
    unittest.main()
