"""The cost model's arithmetic (projection.py): each formula against a
hand computation, the loaders against the committed files' formats, and
a section built from a small run."""

import os
import tempfile
import unittest

from dmavisor_tools import projection as pj

COSTS = {"direct_ns": 40.0, "exit_ns": 1000.0, "device_pair_ns": 80.0,
         "invalidate_batch_ns": 50000.0, "translate_ns": 10.0, "base_latency_ns": 20000.0}


class Arithmetic(unittest.TestCase):
    def test_protected_cost_adds_the_requests_share(self):
        self.assertEqual(pj.protected_ns(200.0, 0.5, 1040.0), 720.0)
        self.assertEqual(pj.protected_ns(200.0, 0.0, 1040.0), 200.0)

    def test_dma_ratio_is_the_inverse_cost_ratio(self):
        self.assertAlmostEqual(pj.dma_rate_ratio(40.0, 400.0), 0.1)
        self.assertIsNone(pj.dma_rate_ratio(40.0, 0.0))

    def test_latency_adds_two_pairs_and_two_translations(self):
        # 20 us + 2 x (400 - 40) + 2 x 10 = 20,740 ns
        self.assertAlmostEqual(pj.latency_ratio(20000.0, 40.0, 400.0, 10.0), 20740.0 / 20000.0)
        self.assertAlmostEqual(pj.latency_ratio(20000.0, 40.0, 40.0, 0.0), 1.0)
        self.assertIsNone(pj.latency_ratio(0.0, 40.0, 400.0, 10.0))

    def test_request_cost_depends_on_the_mode(self):
        # page-table mode: the request is an exit; the INVALIDATE's work is
        # per entry, one per DMA (50 us / 4096 entries)
        self.assertEqual(pj.request_ns("pgt", COSTS), 1000.0)
        self.assertAlmostEqual(pj.per_dma_device_ns("pgt", COSTS), 50000.0 / 4096)
        # MAP mode: a MAP or an UNMAP, half the bench-host pair
        self.assertEqual(pj.request_ns("map", COSTS), 1040.0)
        self.assertEqual(pj.per_dma_device_ns("map", COSTS), 0.0)

    def test_project_pgt_by_hand(self):
        p = pj.project({"mode": "pgt", "requests_per_dma": 0.0003, "guest_ns": 100.0}, COSTS)
        prot = 100.0 + 0.0003 * 1000.0 + 50000.0 / 4096  # 112.51
        self.assertAlmostEqual(p["protected_ns"], prot)
        self.assertAlmostEqual(p["dma"], 40.0 / prot)
        self.assertAlmostEqual(p["latency"], (20000.0 + 2 * (prot - 40.0) + 20.0) / 20000.0)
        self.assertEqual(p["guest_kind"], "native (user-space build)")

    def test_strict_map_mode_pays_two_exits_per_dma(self):
        p = pj.project({"mode": "map", "requests_per_dma": 2.0, "guest_ns": 100.0}, COSTS)
        self.assertAlmostEqual(p["protected_ns"], 100.0 + 2 * 1040.0)
        self.assertLess(p["dma"], 0.02)
        self.assertGreater(p["latency"], 1.2)

    def test_passthrough_is_dma_direct(self):
        p = pj.project({"mode": "direct", "requests_per_dma": None}, COSTS)
        self.assertEqual((p["dma"], p["latency"]), (1.0, 1.0))

    def test_fallback_scales_the_runner_probe(self):
        # runner: map+unmap 2000 ns, dma-direct 500 ns; natively 40 ns -> 160
        self.assertAlmostEqual(pj.scaled_guest_ns(2000.0, 500.0, 40.0), 160.0)
        p = pj.project({"mode": "pgt", "requests_per_dma": 0.0, "guest_ns": None,
                        "runner_map_unmap_ns": 2000.0, "runner_direct_ns": 500.0}, COSTS)
        self.assertAlmostEqual(p["protected_ns"], 160.0 + 50000.0 / 4096)
        self.assertEqual(p["guest_kind"], "runner probe, scaled")

    def test_no_figure_gives_no_projection(self):
        p = pj.project({"mode": "map", "requests_per_dma": 1.0, "guest_ns": None}, COSTS)
        self.assertIsNone(p["dma"])
        self.assertIsNone(pj.meets(p))

    def test_guest_budget(self):
        # 40 / 0.9 = 44.44 ns in all; the device's share 50000/4096 = 12.21
        # and 0.0003 exits of 1000 ns leave 31.93 ns to the guest
        cfg = {"mode": "pgt", "requests_per_dma": 0.0003}
        self.assertAlmostEqual(pj.guest_budget_ns(cfg, COSTS),
                               40.0 / 0.9 - 0.3 - 50000.0 / 4096)
        # strict MAP mode: two exits per DMA, far over budget
        self.assertLess(pj.guest_budget_ns({"mode": "map", "requests_per_dma": 2.0}, COSTS), 0)

    def test_goals(self):
        self.assertTrue(pj.meets({"dma": 0.9, "latency": 1.3}))
        self.assertFalse(pj.meets({"dma": 0.89, "latency": 1.0}))
        self.assertFalse(pj.meets({"dma": 1.0, "latency": 1.31}))

    def test_sensitivity_finds_the_dominant_input(self):
        cfg = {"mode": "pgt", "requests_per_dma": 0.0003, "guest_ns": 400.0}
        sens = pj.sensitivity(cfg, COSTS)
        (d_hi, _), (d_lo, _) = sens["guest_ns"]
        rest = 0.0003 * 1000.0 + 50000.0 / 4096
        self.assertAlmostEqual(d_hi, 40.0 / (800.0 + rest))
        self.assertAlmostEqual(d_lo, 40.0 / (200.0 + rest))
        # the guest's cost, not the rare INVALIDATE, decides the DMA rate
        self.assertEqual(pj.dominant(sens), "guest_ns")
        # in strict MAP mode the exits do
        strict = {"mode": "map", "requests_per_dma": 2.0, "guest_ns": 100.0}
        self.assertEqual(pj.dominant(pj.sensitivity(strict, COSTS)), "exit_ns")


class Loaders(unittest.TestCase):
    def write(self, text):
        fd, path = tempfile.mkstemp()
        with os.fdopen(fd, "w") as f:
            f.write(text)
        self.addCleanup(os.unlink, path)
        return path

    def test_guest_alloc_lines(self):
        path = self.write(
            "# uptime before: x\n{\"machine_cores\":2}\n"
            "{\"policy\":\"magazine\",\"invalidation\":\"lazy-percpu\",\"mode\":\"pgtable\","
            "\"threads\":2,\"ns_per_map_unmap\":673.8,\"requests_per_pair\":0.0002}\n"
            "magazine     lazy-percpu  pgtable       561.4      673.8\n"
            "{\"policy\":\"magazine\",\"invalidation\":\"lazy-percpu\",\"mode\":\"pgtable\","
            "\"threads\":2,\"ns_per_map_unmap\":401.5}\n"
            "{\"policy\":\"magazine\",\"invalidation\":\"lazy-percpu\",\"mode\":\"pgtable\","
            "\"threads\":2,\"ns_per_map_unmap\":900.0}\n")
        # several runs in one file: the best of each row
        self.assertEqual(pj.load_guest_alloc(path),
                         {("magazine", "lazy-percpu", "pgtable", 2): 401.5})

    def test_guest_alloc_prefers_on_cpu_time(self):
        path = self.write(
            "{\"policy\":\"identity\",\"invalidation\":\"lazy-percpu\",\"mode\":\"pgtable\","
            "\"threads\":1,\"ns_per_map_unmap\":40.0,\"cpu_ns_per_map_unmap\":27.5}\n"
            "{\"policy\":\"identity\",\"invalidation\":\"lazy-percpu\",\"mode\":\"pgtable\","
            "\"threads\":1,\"ns_per_map_unmap\":30.0,\"cpu_ns_per_map_unmap\":29.0}\n")
        # on-CPU where given, and the best of the runs by that figure
        self.assertEqual(pj.load_guest_alloc(path),
                         {("identity", "lazy-percpu", "pgtable", 1): 27.5})

    def test_bench_host_rows(self):
        row = ('{{"bench":"host-map","impl":"{i}","consumer":"sim","workload":"{w}",'
               '"threads":1,"ns_per_op":99.0,"cpu_ns_per_op":{v}}}\n')
        path = self.write(row.format(i="scalable", w="map_unmap", v=70.7)
                          + row.format(i="baseline", w="map_unmap", v=149.3)
                          + row.format(i="scalable", w="translate_under_churn", v=8.5)
                          + row.format(i="scalable", w="invalidate_sparse", v=57380.0)
                          # a second run in the same file: the best of each row
                          + row.format(i="scalable", w="map_unmap", v=71.9)
                          + row.format(i="scalable", w="translate_under_churn", v=8.1))
        self.assertEqual(pj.load_bench_host(path), {
            "device_pair_ns": 70.7, "translate_ns": 8.1, "invalidate_batch_ns": 57380.0})
        short = self.write(row.format(i="scalable", w="map_unmap", v=70.7))
        with self.assertRaises(ValueError):
            pj.load_bench_host(short)


def record(cid, driver, policy=None, inval=None, rpd=None, dma=(), rr=(), costs=None):
    vmm, cpus, iommu = cid.split("/")
    r = {"id": cid, "vmm": vmm, "vcpus": int(cpus[0]), "iommu": iommu, "driver": driver,
         "guest": "debian-bookworm-6.1", "expected_workloads": ["dma", "tcp_tx", "tcp_rx", "rr"],
         "requests_per_dma": rpd,
         "workloads": {"dma": [{"value": v, "round": 1} for v in dma],
                       "rr": [{"value": v, "round": 1} for v in rr], "tcp_tx": [], "tcp_rx": []}}
    if policy:
        r["policy"], r["invalidation"] = policy, inval
    if costs:
        r["costs"] = costs
    return r


class Section(unittest.TestCase):
    def test_a_run_projected(self):
        recs = [record("dmavisor/1cpu/off-6.1", "off", dma=[2e6], rr=[4000.0]),
                record("dmavisor/1cpu/pgt-magazine-lazy-percpu", "pgt", "magazine",
                       "lazy-percpu", rpd=0.0003, dma=[2e5], rr=[5000.0],
                       costs=[{"map_unmap_ns": 2000, "round": 1}]),
                record("dmavisor/1cpu/vvi-magazine-strict", "vvi", "magazine", "strict",
                       rpd=2.0, dma=[2e3], rr=[8000.0]),
                record("qemu/1cpu/vvi-magazine-strict", "vvi", "magazine", "strict",
                       rpd=2.0, dma=[2e3], rr=[8000.0])]
        alloc = {("magazine", "lazy-percpu", "pgtable", 1): 36.0}
        md, best = pj.section([("run", recs)], COSTS, {"direct_ns": "x"}, alloc, "test")
        self.assertIn("PROJECTION", md)
        self.assertEqual(best[1]["id"], "dmavisor/1cpu/pgt-magazine-lazy-percpu")
        # 36 + 0.0003 x 1000 + 50000/4096 = 48.5 ns: 40/48.5 = 0.82 -> misses
        prot = 36.0 + 0.0003 * 1000.0 + 50000.0 / 4096
        self.assertAlmostEqual(best[2]["dma"], 40.0 / prot)
        self.assertIn("does NOT meet the DMA-rate goal", md)
        # measured ratios beside it: DMA 0.1 of the no-IOMMU boot, RR 1.25
        self.assertIn("| 0.1 (no-IOMMU boot) | 1.25 |", md)
        # the strict MAP configuration has no native guest figure and no
        # probe: no projection rather than an invented one
        strict = [line for line in md.splitlines() if "vvi-magazine-strict" in line][0]
        self.assertIn("no figure", strict)
        # QEMU's device is not the one bench-host measured
        self.assertNotIn("qemu/", md)
        # the probe-scaled second estimate: 2000 ns in the runner, whose
        # dma-direct is 1e9/2e6 = 500 ns, natively 40 -> 160 ns guest
        pgt = [line for line in md.splitlines() if "pgt-magazine" in line][0]
        prot = 160.0 + 0.0003 * 1000.0 + 50000.0 / 4096
        self.assertIn(f"{40.0 / prot:.3g} / ", pgt)
        self.assertIn("(guest 160 ns)", pgt)

    def test_requests_from_the_runs_and_runs_without_a_flush(self):
        off = record("dmavisor/2cpu/off-6.1", "off", dma=[2e6])
        flushed = record("dmavisor/2cpu/pgt-magazine-lazy-percpu", "pgt", "magazine",
                         "lazy-percpu", rpd=0.0003, dma=[2e5, 3e5])
        flushed["workloads"]["dma"][0].update(maps=3000, requests=1)
        flushed["workloads"]["dma"][1].update(maps=1000, requests=0)
        never = record("dmavisor/1cpu/pgt-magazine-lazy-percpu", "pgt", "magazine",
                       "lazy-percpu", rpd=0.0, dma=[2e5])
        never["workloads"]["dma"][0].update(maps=1000, requests=0)
        recs = {r["id"]: r for r in (off, flushed, never)}
        alloc = {("magazine", "lazy-percpu", "pgtable", 1): 10.0,
                 ("magazine", "lazy-percpu", "pgtable", 2): 36.0}
        # 1 request in 4000 maps, not the rounded 0.0003
        self.assertEqual(pj.config_inputs(flushed, recs, alloc)["requests_per_dma"], 1 / 4000)
        md, best = pj.section([("run", list(recs.values()))], COSTS, {}, alloc, "test")
        # the 1-vCPU run is cheaper but never flushed: not the best
        self.assertEqual(best[1]["id"], flushed["id"])
        self.assertIn("0 (no flush in its runs)", md)


if __name__ == "__main__":
    unittest.main()
