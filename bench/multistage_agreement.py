"""Multi-stage plans: DES vs analytic steady-state throughput, and DES speed.

    .venv/bin/python bench/multistage_agreement.py [N] [--layers LO HI] [--random K]

Over N random placement instances (sim.instances.random_problem), evaluates
the plans of the greedy and exact schedulers plus K random per-layer type
assignments provisioned by PlacementSpace.to_plan (where feasible), keeps the
multi-stage ones, and prints the relative error of the DES's steady-state
throughput (extra["steady_throughput_sps"]) against the analytic one
(max, p95, median), and the DES's events per second.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from hardware_profiles.errors import HetsimError
from schedulers import make
from sim.des import kernel
from sim.des.pipeline import PipelineSim, default_in_flight
from sim.instances import random_problem
from sim.multistage import evaluate_analytic, pipeline_model
from sim.placement import PlacementSpace
from sim.plan import Plan
from sim.problem import Problem


def plans_of(problem: Problem, n_random: int, rng: np.random.Generator) -> list[Plan]:
    out = []
    for name in ("greedy", "exact"):
        try:
            out.append(make(name).plan(problem))
        except HetsimError:
            pass
    space = PlacementSpace(problem)
    for _ in range(n_random):
        # a few stages: change type at random points
        L = space.L
        cuts = sorted(rng.choice(np.arange(1, L), size=min(L - 1, int(rng.integers(1, 4))), replace=False))
        a = np.empty(L, dtype=int)
        for lo, hi in zip([0, *cuts], [*cuts, L]):
            a[lo:hi] = rng.integers(space.K)
        try:
            out.append(space.to_plan(a, "random"))
        except HetsimError:
            pass
    return [p for p in out if len(p.stages) > 1]


def run_case(problem: Problem, plan: Plan) -> tuple[float, int, float]:
    """(relative error, DES events, DES wall seconds)."""
    w0 = default_in_flight(pipeline_model(problem, plan))[0]
    iters = 4 * w0 + 200
    p = dataclasses.replace(problem, job=dataclasses.replace(problem.job, iterations=iters))
    ana = evaluate_analytic(p, plan).throughput_sps
    t0 = time.perf_counter()
    sim = PipelineSim(p, plan, trace=False)
    res = sim.run()
    wall = time.perf_counter() - t0
    events = kernel.scheduled_events(sim.env)
    return res.extra["steady_throughput_sps"] / ana - 1.0, events, wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", type=int, nargs="?", default=40, help="random instances")
    ap.add_argument("--layers", type=int, nargs=2, default=(3, 8))
    ap.add_argument("--random", type=int, default=3, help="random assignments per instance")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    errs, events, wall = [], 0, 0.0
    worst = (0.0, "")
    for seed in range(args.n):
        prob = random_problem(seed, n_layers=tuple(args.layers))
        for plan in plans_of(prob, args.random, rng):
            e, ev, w = run_case(prob, plan)
            errs.append(e)
            events += ev
            wall += w
            if abs(e) > abs(worst[0]):
                worst = (e, f"seed {seed} {plan.scheduler} stages "
                            f"{[(s.device_type, len(s.replicas)) for s in plan.stages]} pipeline={prob.job.pipeline}")
    a = np.abs(np.array(errs))
    print(f"{len(errs)} multi-stage plans from {args.n} instances (layers {args.layers[0]}-{args.layers[1]})")
    print(f"|DES/analytic - 1|: max {a.max():.3e}  p95 {np.percentile(a, 95):.3e}  median {np.median(a):.3e}  "
          f"share <= 1%: {np.mean(a <= 0.01):.3f}")
    print(f"worst: {worst[0]:+.4f} ({worst[1]})")
    print(f"DES: {events} events in {wall:.2f} s = {events / wall:,.0f} events/s")


if __name__ == "__main__":
    main()
