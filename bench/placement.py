"""Placement (Problem B) benchmarks: model speed and the exact solver on 60 layers x 8 types.

    python -m bench.placement [--instances N] [--time-limit S] [--quick]

1. The vectorised placement model: placements scored per second (random
   per-layer assignments on a 60-layer, 8-type instance).
2. ``exact`` on random 60-layer x 8-type instances (sim/instances.py, seeds
   1000...): wall and CPU time, whether optimality was proven, and the gap of
   the rest (target: proven in < 10 s).
3. Where the inventory binds, the least rate at the lowest threshold by the
   DP with inventory state against the MILP (scipy.optimize.milp / HiGHS):
   same value, and the time of each.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np

from schedulers.exact import dp_min_rate, inventory_dp, milp_min_rate, solve, usage
from sim.instances import random_problem
from sim.placement import PlacementSpace


def model_speed(seed: int = 1000, plans: int = 20_000, repeats: int = 7) -> float:
    """Placements scored per second: the median of ``repeats`` timed calls (single calls
    vary by about 4x here, with the first touch of the large temporary arrays)."""
    space = PlacementSpace(random_problem(seed, n_layers=60, n_types=8))
    A = np.random.default_rng(0).integers(0, space.K, (plans, space.L))
    space.evaluate(A[:100])
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        space.evaluate(A)
        times.append(time.perf_counter() - t0)
    return plans / float(np.median(times))


def exact_runs(n: int, time_limit: float) -> list[dict[str, float]]:
    """``exact`` per seed: wall seconds (what its time limit counts) and this process's CPU
    seconds (what a loaded machine inflates least; HiGHS's threads count in it too)."""
    rows = []
    for seed in range(1000, 1000 + n):
        space = PlacementSpace(random_problem(seed, n_layers=60, n_types=8))
        cpu0 = time.process_time()
        r = solve(space, time_limit_s=time_limit)
        cpu = time.process_time() - cpu0
        rows.append({"seed": seed, "seconds": r.seconds, "cpu_s": cpu, "proven": float(r.proven), "gap": r.gap,
                     "feasible": float(r.assignment is not None), "rc_dp": r.rc_dp_solves, "milp": r.milp_solves})
        print(f"  seed {seed}: wall {r.seconds:6.2f} s  cpu {cpu:6.2f} s  proven={r.proven!s:5}  gap={r.gap:.3g}  "
              f"feasible={r.assignment is not None!s:5}  rc_dp={r.rc_dp_solves} milp={r.milp_solves}", flush=True)
    return rows


def dp_vs_milp(n: int, milp_limit: float) -> list[tuple[int, float, float, float, float]]:
    out: list[tuple[int, float, float, float, float]] = []
    seed = 1000
    while len(out) < n and seed < 1200:
        space = PlacementSpace(random_problem(seed, n_layers=60, n_types=8))
        seed += 1
        allowed = space.n > 0
        _, a = dp_min_rate(space, allowed)
        if a is None or (usage(space, a) <= space.counts).all():
            continue
        t0 = time.perf_counter()
        r_dp, _, _, _ = inventory_dp(space, allowed, a)
        t_dp = time.perf_counter() - t0
        t0 = time.perf_counter()
        r_milp, _ = milp_min_rate(space, allowed, None, milp_limit)
        t_milp = time.perf_counter() - t0
        out.append((seed - 1, r_dp, t_dp, r_milp, t_milp))
        print(f"  seed {seed - 1}: DP {r_dp:.6g} $/h in {t_dp:.3f} s; MILP {r_milp:.6g} $/h in {t_milp:.2f} s",
              flush=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.placement", description=__doc__.split("\n")[0])
    ap.add_argument("--instances", type=int, default=20)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--quick", action="store_true", help="5 instances, 2 DP-vs-MILP cases")
    args = ap.parse_args(argv)
    n = 5 if args.quick else args.instances
    print(f"placement model: {model_speed():,.0f} placements/s scored (60 layers x 8 types)")
    print(f"exact on {n} random 60-layer x 8-type instances (time limit {args.time_limit:g} s):")
    rows = exact_runs(n, args.time_limit)
    proven = np.array([r["proven"] for r in rows], dtype=bool)
    gaps = np.array([r["gap"] for r in rows])
    for key, label in (("seconds", "wall"), ("cpu_s", "cpu")):
        secs = np.array([r[key] for r in rows])
        print(f"  {label} time: median {np.median(secs):.2f} s, p90 {np.percentile(secs, 90):.2f} s, "
              f"max {secs.max():.2f} s; under 10 s: {(secs < 10).sum()}/{n}")
    print(f"  proven optimal: {proven.sum()}/{n}; gap of the others: "
          + (", ".join(f"{g:.3g}" for g in gaps[~proven]) or "-"))
    print("DP with inventory state vs MILP where the inventory binds:")
    cases = dp_vs_milp(2 if args.quick else 5, 60.0)
    if cases:
        same = sum(abs(d - m) <= 1e-6 * max(abs(m), 1e-12) for _, d, _, m, _ in cases)
        print(f"  equal least rate in {same}/{len(cases)}; DP median {np.median([c[2] for c in cases]):.3f} s, "
              f"MILP median {np.median([c[4] for c in cases]):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
