"""The guest benchmark's statistics (dmavisor_tools.stats): the
Mann-Whitney U test against values worked out by hand and by brute force,
the verdicts it allows, and the seeded boot order."""

import itertools
import math
import random
import unittest

from dmavisor_tools import stats


def brute_p(x, y):
    """Two-sided p by enumerating every split of the pooled sample."""
    pooled = list(x) + list(y)
    u_obs = stats._u_statistic(x, y)
    lo = hi = total = 0
    for idx in itertools.combinations(range(len(pooled)), len(x)):
        xs = [pooled[i] for i in idx]
        ys = [pooled[i] for i in range(len(pooled)) if i not in idx]
        u = stats._u_statistic(xs, ys)
        total += 1
        lo += u <= u_obs
        hi += u >= u_obs
    return min(1.0, 2 * min(lo, hi) / total)


def runs(values, boots):
    """Run entries spread round-robin over `boots` rounds."""
    return [{"value": v, "round": 1 + i % boots} for i, v in enumerate(values)]


class MannWhitney(unittest.TestCase):
    def test_complete_separation_has_the_smallest_exact_p(self):
        # one split of C(n1+n2, n1) at each extreme, two-sided
        for n in (3, 5, 6):
            x, y = list(range(n)), list(range(n, 2 * n))
            u, p, method = stats.mann_whitney_u(x, y)
            self.assertEqual(u, 0.0)
            self.assertEqual(method, "exact")
            self.assertAlmostEqual(p, 2 / math.comb(2 * n, n))

    def test_swapping_the_samples_mirrors_u_and_keeps_p(self):
        x, y = [3.1, 7.5, 2.2, 9.0, 4.4], [5.5, 8.1, 1.0, 6.6, 10.2, 0.5]
        u1, p1, _ = stats.mann_whitney_u(x, y)
        u2, p2, _ = stats.mann_whitney_u(y, x)
        self.assertEqual(u1 + u2, len(x) * len(y))
        self.assertAlmostEqual(p1, p2)

    def test_exact_distribution_matches_enumeration(self):
        rng = random.Random(7)
        for _ in range(20):
            n1, n2 = rng.randint(1, 6), rng.randint(1, 6)
            vals = rng.sample(range(1000), n1 + n2)  # no ties
            x, y = vals[:n1], vals[n1:]
            _, p, method = stats.mann_whitney_u(x, y)
            self.assertEqual(method, "exact")
            self.assertAlmostEqual(p, brute_p(x, y), msg=f"{x} {y}")

    def test_ties_are_counted_half_and_tested_exactly_when_small(self):
        x, y = [1, 2, 3, 4, 5, 6], [1, 8, 9, 10, 11, 12]
        u, p, method = stats.mann_whitney_u(x, y)
        self.assertEqual(u, 5.5)
        self.assertEqual(method, "exact")
        self.assertAlmostEqual(p, brute_p(x, y))
        self.assertLess(p, 0.05)

    def test_normal_approximation_for_large_tied_samples(self):
        x = [1] * 12 + [2] * 12
        y = [2] * 12 + [3] * 12
        u, p, method = stats.mann_whitney_u(x, y)
        self.assertEqual(method, "normal")
        # every x=1 is below every y (0); x=2 ties y=2 (12*12 halves = 72)
        # and is below y=3 (0)
        self.assertEqual(u, 72.0)
        self.assertLess(p, 1e-4)
        _, p_same, _ = stats.mann_whitney_u(x, list(x))
        self.assertGreater(p_same, 0.9)

    def test_normal_approximation_is_close_to_exact_without_ties(self):
        rng = random.Random(3)
        vals = rng.sample(range(10_000), 30)
        x, y = vals[:15], [v + 1500 for v in vals[15:]]
        _, p_exact, method = stats.mann_whitney_u(x, y)
        self.assertEqual(method, "exact")
        # the same samples with one tie added go the normal way
        x2 = x[:-1] + [x[0]]
        _, p_normal, method2 = stats.mann_whitney_u(x2, y)
        self.assertEqual(method2, "normal")  # C(30, 15) is above EXACT_LIMIT
        self.assertLess(abs(p_exact - p_normal), 0.1)

    def test_empty_sample_is_an_error(self):
        with self.assertRaises(ValueError):
            stats.mann_whitney_u([], [1.0])


class Verdicts(unittest.TestCase):
    def test_faster_needs_six_runs_from_three_boots(self):
        fast = runs([10, 11, 12, 13, 14, 15], 3)
        slow = runs([1, 2, 3, 4, 5, 6], 3)
        c = stats.compare(fast, slow, higher_is_better=True)
        self.assertEqual(c["verdict"], "faster")
        self.assertLess(c["p"], 0.05)
        self.assertEqual((c["boots_a"], c["boots_b"]), (3, 3))
        text = stats.verdict_text("A", "B", c)
        self.assertIn("A is faster than B", text)
        self.assertIn(f"p = {c['p']:.3g}", text)

    def test_lower_is_better_turns_the_verdict(self):
        c = stats.compare(runs([10, 11, 12, 13, 14, 15], 3), runs([1, 2, 3, 4, 5, 6], 3),
                          higher_is_better=False)
        self.assertEqual(c["verdict"], "slower")

    def test_two_boots_are_not_enough_whatever_p(self):
        c = stats.compare(runs([10, 11, 12, 13, 14, 15], 2), runs([1, 2, 3, 4, 5, 6], 2))
        self.assertLess(c["p"], 0.05)
        self.assertEqual(c["verdict"], "no significant difference")
        self.assertIn("2 boots", c["why"])
        self.assertIn("no significant difference", stats.verdict_text("A", "B", c))

    def test_five_runs_are_not_enough(self):
        c = stats.compare(runs([10, 11, 12, 13, 14], 5), runs([1, 2, 3, 4, 5], 5))
        self.assertEqual(c["verdict"], "no significant difference")
        self.assertIn("5 runs", c["why"])

    def test_overlapping_samples_are_no_significant_difference(self):
        c = stats.compare(runs([1, 5, 9, 3, 7, 11], 3), runs([2, 6, 10, 4, 8, 12], 3))
        self.assertGreater(c["p"], 0.05)
        self.assertEqual(c["verdict"], "no significant difference")
        self.assertIsNone(c["why"])

    def test_runs_without_round_count_as_one_boot(self):
        self.assertEqual(stats.boots_of([{"value": 1}, {"value": 2}]), 1)
        self.assertEqual(stats.boots_of(runs([1, 2, 3, 4], 3)), 3)

    def test_value_range(self):
        self.assertEqual(stats.value_range([0.3, None, 0.1, 0.7]), (0.1, 0.7))
        self.assertIsNone(stats.value_range([None]))


class Shuffle(unittest.TestCase):
    plan = [{"name": n} for n in "abcdefgh"]

    def test_every_round_is_the_whole_plan_tagged_with_its_round(self):
        out = stats.shuffled_rounds(self.plan, 4, seed=11)
        self.assertEqual(len(out), 4 * len(self.plan))
        for k in range(4):
            part = out[k * 8:(k + 1) * 8]
            self.assertEqual(sorted(b["name"] for b in part), list("abcdefgh"))
            self.assertEqual({b["round"] for b in part}, {k + 1})

    def test_same_seed_same_order_other_seed_other_order(self):
        names = [b["name"] for b in stats.shuffled_rounds(self.plan, 3, seed=5)]
        again = [b["name"] for b in stats.shuffled_rounds(self.plan, 3, seed=5)]
        self.assertEqual(names, again)
        other = [b["name"] for b in stats.shuffled_rounds(self.plan, 3, seed=6)]
        self.assertNotEqual(names, other)

    def test_rounds_are_not_all_in_one_order(self):
        out = [b["name"] for b in stats.shuffled_rounds(self.plan, 5, seed=1)]
        orders = {tuple(out[k * 8:(k + 1) * 8]) for k in range(5)}
        self.assertGreater(len(orders), 1)
        self.assertNotEqual(orders, {tuple("abcdefgh")})

    def test_the_plan_is_not_modified(self):
        before = [dict(b) for b in self.plan]
        stats.shuffled_rounds(self.plan, 2, seed=3)
        self.assertEqual(self.plan, before)


if __name__ == "__main__":
    unittest.main()
