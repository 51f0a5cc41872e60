"""Statistics of the guest benchmark: the Mann-Whitney U test, ranges, and
the seeded boot order of `bench-guest --rounds`.

Why: in the nested runner single runs of one configuration swing 2.5-50x
between boots, so a ratio of two medians says nothing on its own. A
sentence "A is faster than B" is only written when a rank test across
boots says so: the Mann-Whitney U test needs no assumption about the
runner's distribution (it is far from normal: collapses, slow spells),
and runs of one boot are not independent, so it is only trusted with
runs from several boots (MIN_RUNS, MIN_BOOTS). Debian's python3 has no
scipy, and the test is a few lines, so it lives here.

Everything here is pure (no I/O) so that tests/test_stats.py can check it.
"""

import math
import random

# A comparison is tested only with at least this many runs from at least
# this many boots on each side (issue 30).
MIN_RUNS = 6
MIN_BOOTS = 3
ALPHA = 0.05
# Up to this many ways of splitting the pooled sample the exact null
# distribution is enumerated (with ties); above it, the normal
# approximation (6+6 runs: 924, 9+9: 48,620).
EXACT_LIMIT = 200_000


def _u_statistic(x, y):
    """U of x: pairs (a in x, b in y) with a > b, ties counting one half."""
    u = 0.0
    for a in x:
        for b in y:
            u += 1.0 if a > b else 0.5 if a == b else 0.0
    return u


def _exact_counts_no_ties(n1, n2):
    """How many of the C(n1+n2, n1) rank splits give each U (0..n1*n2),
    by the recurrence c(n1, n2, u) = c(n1-1, n2, u-n2) + c(n1, n2-1, u)."""
    # table[j][u]: splits of (i, j) for the current i
    prev = [[1] for _ in range(n2 + 1)]  # i = 0: only U = 0
    for i in range(1, n1 + 1):
        cur = [[1]]  # j = 0: only U = 0
        for j in range(1, n2 + 1):
            size = i * j + 1
            row = [0] * size
            a = prev[j]  # (i-1, j): the largest value is in x -> U += j
            for u, c in enumerate(a):
                row[u + j] += c
            b = cur[j - 1]  # (i, j-1): the largest value is in y
            for u, c in enumerate(b):
                row[u] += c
            cur.append(row)
        prev = cur
    return prev[n2]


def _exact_p_ties(x, y, u_obs):
    """Two-sided p by enumerating every split of the pooled sample (ties
    kept as they are)."""
    from itertools import combinations

    pooled = list(x) + list(y)
    n, n1 = len(pooled), len(x)
    lo = hi = total = 0
    for idx in combinations(range(n), n1):
        chosen = set(idx)
        xs = [pooled[i] for i in idx]
        ys = [pooled[i] for i in range(n) if i not in chosen]
        u = _u_statistic(xs, ys)
        total += 1
        if u <= u_obs + 1e-9:
            lo += 1
        if u >= u_obs - 1e-9:
            hi += 1
    return min(1.0, 2 * min(lo, hi) / total)


def mann_whitney_u(x, y):
    """The two-sided Mann-Whitney U test of x against y.

    Returns (U of x, p, method) with method "exact" or "normal". Exact
    without ties from the U distribution; with ties exact by enumeration
    while C(n1+n2, n1) <= EXACT_LIMIT; otherwise the normal approximation
    with tie and continuity corrections."""
    x, y = list(x), list(y)
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("Mann-Whitney U needs two non-empty samples")
    u = _u_statistic(x, y)
    pooled = x + y
    ties = len(set(pooled)) < len(pooled)
    if not ties:
        counts = _exact_counts_no_ties(n1, n2)
        total = sum(counts)
        k = int(round(u))
        lo = sum(counts[: k + 1])
        hi = sum(counts[k:])
        return u, min(1.0, 2 * min(lo, hi) / total), "exact"
    if math.comb(n1 + n2, n1) <= EXACT_LIMIT:
        return u, _exact_p_ties(x, y, u), "exact"
    n = n1 + n2
    mean = n1 * n2 / 2
    tie_sum = 0
    for v in set(pooled):
        t = pooled.count(v)
        tie_sum += t ** 3 - t
    var = n1 * n2 / 12 * ((n + 1) - tie_sum / (n * (n - 1)))
    if var <= 0:
        return u, 1.0, "normal"
    z = (abs(u - mean) - 0.5) / math.sqrt(var)
    p = math.erfc(max(z, 0.0) / math.sqrt(2))
    return u, min(1.0, p), "normal"


def boots_of(entries):
    """Distinct boots behind a configuration's runs: a run's boot is its
    round (one boot per configuration per round; runs from before rounds
    were recorded count as round 1)."""
    return len({e.get("round", 1) for e in entries})


def compare(a, b, higher_is_better=True):
    """Is configuration a faster than b? a and b are run entries
    ({"value", "round"}). Returns a dict: n and boots per side, U, p,
    method, and verdict "faster", "slower" or "no significant difference"
    (with why when the samples are too small to test)."""
    va = [e["value"] for e in a]
    vb = [e["value"] for e in b]
    out = {"n_a": len(va), "n_b": len(vb), "boots_a": boots_of(a), "boots_b": boots_of(b),
           "u": None, "p": None, "method": None, "verdict": "no significant difference",
           "why": None}
    if not va or not vb:
        out["why"] = "no runs"
        return out
    out["u"], out["p"], out["method"] = mann_whitney_u(va, vb)
    small = [f"{n} runs" for n in (out["n_a"], out["n_b"]) if n < MIN_RUNS]
    small += [f"{k} boot{'s' if k != 1 else ''}" for k in (out["boots_a"], out["boots_b"])
              if k < MIN_BOOTS]
    if small:
        out["why"] = (f"too few to test ({', '.join(dict.fromkeys(small))}; "
                      f"needs {MIN_RUNS} runs from {MIN_BOOTS} boots each)")
        return out
    if out["p"] < ALPHA:
        a_higher = out["u"] > out["n_a"] * out["n_b"] / 2
        out["verdict"] = "faster" if a_higher == higher_is_better else "slower"
    return out


def verdict_text(name_a, name_b, c):
    """One sentence with its p-value beside it."""
    p = "–" if c["p"] is None else f"{c['p']:.3g}"
    def side(n, k):
        return f"{n} runs/{k} boot" + ("s" if k != 1 else "")

    tail = (f"Mann-Whitney p = {p}, {side(c['n_a'], c['boots_a'])} vs "
            f"{side(c['n_b'], c['boots_b'])}")
    if c["verdict"] == "no significant difference":
        why = f"; {c['why']}" if c["why"] else ""
        return f"{name_a} vs {name_b}: no significant difference ({tail}{why})"
    return f"{name_a} is {c['verdict']} than {name_b} ({tail})"


def spread_text(s, fmt):
    """A summary ({median, min, max, n, boots}) as "median (min-max, runs/
    boots)", each figure written by `fmt`; "–" for none."""
    if not s:
        return "–"
    boots = f"{s['boots']} boot" + ("s" if s["boots"] != 1 else "")
    return f"{fmt(s['median'])} ({fmt(s['min'])}-{fmt(s['max'])}, {s['n']} runs/{boots})"


def value_range(values):
    """(min, max) of the values, or None."""
    values = [v for v in values if v is not None]
    return (min(values), max(values)) if values else None


def shuffled_rounds(boots, rounds, seed):
    """The plan `rounds` times over, each round in its own order drawn
    from random.Random(seed): a fixed order (dmavisor, QEMU,
    cloud-hypervisor every round) puts each VMM at the same point of the
    runner's slow spells every time. The same seed gives the same order,
    so a run can be repeated. Every boot is tagged with its round."""
    rng = random.Random(seed)
    out = []
    for k in range(1, rounds + 1):
        order = list(boots)
        rng.shuffle(order)
        out += [{**b, "round": k} for b in order]
    return out
