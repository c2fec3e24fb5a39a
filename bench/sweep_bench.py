"""What a sweep costs beyond its evaluations (`python -m bench.sweep_bench`).

The demo config over bandwidth x scheduler x model (80 small analytic points
by default). Measured in one process, after a warm-up pass (profiles, zoo
models and pandas loaded):

* evaluation: the same points validated, planned and evaluated in a plain
  loop (``runner.from_dict``, ``problem_of``, ``plan_for``, ``evaluate``);
* ``run_sweep`` at jobs=1 (in-process) and jobs=2 (process pool) into a fresh
  folder: expansion and point ids, run files, results.csv rows (fsync'ed),
  the progress bookkeeping and the final DataFrame;
* overhead per point = (jobs=1 sweep time - evaluation time) / points.

Each figure is the median of ``--repeat`` runs. Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from experiments import runner
from experiments.cli import DEFAULT_CONFIG
from experiments.sweep import Sweep, load_sweep, run_sweep, sweep_from_dict

BANDWIDTHS_GBPS = (1, 2, 3, 5, 10, 15, 25, 40, 50, 100)
MODELS = ("mlp", "ctr_dnn", "resnet18", "resnet50")


def bench_sweep() -> Sweep:
    return sweep_from_dict({"base": str(DEFAULT_CONFIG), "evaluator": "analytic",
                            "grid": {"cluster.network.bandwidth_gbps": list(BANDWIDTHS_GBPS),
                                     "scheduler.name": ["equal", "proportional"],
                                     "job.model": list(MODELS)}}, "<bench>")


def evaluate_directly(sweep: Sweep) -> float:
    """Seconds to run every point in a plain loop, without any sweep machinery."""
    t0 = time.perf_counter()
    for p in sweep.points():
        loaded = runner.from_dict(p.config, sweep.base_dir, sweep.source)
        problem = runner.problem_of(loaded)
        sched, plan = runner.schedule(loaded, problem)  # as run_point does: online ones rebalance
        runner.evaluate(problem, plan, sweep.evaluator, trace=False, scheduler=sched)
    return time.perf_counter() - t0


def sweep_once(sweep: Sweep, jobs: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        df = run_sweep(sweep, Path(tmp) / "out", jobs=jobs, progress=False)
        wall = time.perf_counter() - t0
    assert df.attrs["sweep"]["ok"] == len(df), "a bench point failed"
    return wall


def measure(sweep: Sweep, repeat: int = 5) -> dict[str, Any]:
    n = len(sweep.points())
    evaluate_directly(sweep)  # warm-up: profiles, zoo models
    sweep_once(sweep, 1)  # warm-up: pandas, tqdm
    t_eval = statistics.median(evaluate_directly(sweep) for _ in range(repeat))
    t_1 = statistics.median(sweep_once(sweep, 1) for _ in range(repeat))
    t_2 = statistics.median(sweep_once(sweep, 2) for _ in range(repeat))
    return {"points": n, "evaluation_s": t_eval, "sweep_jobs1_s": t_1, "sweep_jobs2_s": t_2,
            "evaluation_ms_per_point": 1e3 * t_eval / n,
            "overhead_ms_per_point": 1e3 * (t_1 - t_eval) / n,
            "points_per_s_jobs1": n / t_1, "points_per_s_jobs2": n / t_2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="runs per figure (median)")
    ap.add_argument("--sweep", help="a sweep file to measure instead of the built-in one")
    a = ap.parse_args()
    f = measure(load_sweep(a.sweep) if a.sweep else bench_sweep(), a.repeat)
    print(f"points                          {f['points']}")
    print(f"evaluation alone                {f['evaluation_s']:.3f} s ({f['evaluation_ms_per_point']:.1f} ms/point)")
    print(f"sweep, --jobs 1                 {f['sweep_jobs1_s']:.3f} s ({f['points_per_s_jobs1']:.1f} points/s)")
    print(f"sweep, --jobs 2                 {f['sweep_jobs2_s']:.3f} s ({f['points_per_s_jobs2']:.1f} points/s)")
    print(f"overhead per point beyond evaluation (jobs 1): {f['overhead_ms_per_point']:.2f} ms")


if __name__ == "__main__":
    main()
