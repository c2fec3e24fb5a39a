"""Energy gap of `rl-dag`, `energy` and `heft` to the exact optimum (`milp`) on held-out DAGs.

    .venv/bin/python bench/rl_dag.py [--seeds 8] [--samples 8] [--policy FILE] [--json OUT]
        [--first-seed S]

Instances: random graphs of 7-10 tasks (sim.instances.random_graph) with seeds
from 2e9 up (never drawn in training, whose seeds lie below
schedulers.rl.masked_env.TRAIN_SEED_LIMIT = 1e9), on agx-orin-32,
orin-nano-8 and agx-xavier, deadline 1.0 / 1.5 / 2.0 x HEFT's makespan in the
board's fastest mode, period 1.5 x the deadline; every power mode allowed.
Gap = energy per frame / milp's - 1, over the instances where both meet
deadline and period; a miss is an instance milp schedules feasibly and the
scheduler does not. `energy` falls back to the MILP on graphs of up to 12
tasks when neither heuristic meets the deadline (column ``exact``). Design
choices are checked with ``--first-seed`` below 1e9 (the same construction on
training seeds), never on the held-out seeds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hardware_profiles.board import load_board  # noqa: E402
from schedulers.dag import heft_schedule, make_dag  # noqa: E402
from sim.dag import DagProblem, dag_costs  # noqa: E402
from sim.instances import random_graph  # noqa: E402

HELD_OUT_SEED = 2_000_000_000

BOARDS = ("agx-orin-32", "orin-nano-8", "agx-xavier")
FACTORS = (1.0, 1.5, 2.0)
TASKS = (7, 8, 9, 10)


def problem(seed: int, board: str, factor: float, n_tasks: int) -> DagProblem:
    b = load_board(board)
    g = random_graph(seed, n_tasks)
    c0 = dag_costs(DagProblem(g, b, 1.0, 1.0), next(iter(b.power_modes)))
    hm = heft_schedule(c0).makespan_s(c0)
    return DagProblem(g, b, period_s=1.5 * factor * hm, deadline_s=factor * hm)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=8, help="instances per board and deadline factor")
    ap.add_argument("--samples", type=int, default=8, help="rl-dag's sampled episodes per mode")
    ap.add_argument("--policy", default=None, help="rl-dag policy file (default: the shipped one)")
    ap.add_argument("--json", default=None, help="also write the per-instance rows here")
    ap.add_argument("--first-seed", type=int, default=HELD_OUT_SEED,
                    help="seed of the first instance (below 1e9: a validation set drawn from training seeds)")
    a = ap.parse_args()
    rl_params = {"samples": a.samples, **({"policy": a.policy} if a.policy else {})}
    scheds = {"rl-dag": make_dag("rl-dag", rl_params),
              "rl-dag k=0": make_dag("rl-dag", {**rl_params, "samples": 0}),
              "energy": make_dag("energy"), "heft": make_dag("heft"), "milp": make_dag("milp")}
    make_dag("rl-dag", rl_params).plan(problem(a.first_seed - 1, BOARDS[0], 1.0, 7))   # load torch and the policy

    rows = []
    k = 0
    for board in BOARDS:
        for factor in FACTORS:
            for _ in range(a.seeds):
                seed = a.first_seed + k
                n = TASKS[k % len(TASKS)]
                k += 1
                pr = problem(seed, board, factor, n)
                row: dict = {"seed": seed, "board": board, "factor": factor, "tasks": n}
                for name, s in scheds.items():
                    t0 = time.perf_counter()
                    p = s.plan(pr)
                    dt = time.perf_counter() - t0
                    c = dag_costs(pr, p.mode)
                    p.check(c)
                    row[name] = {"energy_j": p.energy_j(c), "feasible": p.feasible(c), "ms": 1e3 * dt,
                                 "mode": p.mode, "used_exact": bool(getattr(s, "used_exact", False))}
                rows.append(row)

    print(f"{len(rows)} instances (seeds {a.first_seed}..{a.first_seed + k - 1}), "
          f"milp feasible on {sum(r['milp']['feasible'] for r in rows)}")
    print(f"{'scheduler':12s} {'n':>3s} {'mean':>7s} {'median':>7s} {'p90':>7s} {'max':>7s} {'misses':>6s} "
          f"{'ms/plan':>8s} {'exact':>5s}   (energy gap to milp, %; exact: plans from energy's MILP fallback)")
    for name in scheds:
        ok = [r for r in rows if r["milp"]["feasible"]]
        gaps = np.array([r[name]["energy_j"] / r["milp"]["energy_j"] - 1 for r in ok if r[name]["feasible"]]) * 100
        misses = sum(not r[name]["feasible"] for r in ok)
        ms = np.mean([r[name]["ms"] for r in rows])
        exact = sum(r[name]["used_exact"] for r in rows)
        print(f"{name:12s} {len(gaps):3d} {gaps.mean():7.2f} {np.median(gaps):7.2f} {np.percentile(gaps, 90):7.2f} "
              f"{gaps.max():7.2f} {misses:6d} {ms:8.1f} {exact:5d}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
