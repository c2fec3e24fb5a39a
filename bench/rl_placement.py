"""The `rl` placement policy against the exact optimum: random instances and real models.

Two suites, each instance scored against the exact solver's proven optimum
(instances with no feasible placement, or where exact is not proven within
its time limit, are skipped and counted):

* **random**: held-out random chains of 4-24 layers (seeds from 2e9 up:
  never drawn in training, whose seeds lie below
  schedulers.rl.masked_env.TRAIN_SEED_LIMIT = 1e9);
* **real**: the fixed real-model suite of
  :func:`schedulers.rl.workloads.suite`: the zoo's models at their real depth
  x 4 inventories of 2-8 types drawn from the shipped profiles x floors at
  0.2, 0.5 and 0.8 of the highest feasible throughput (seeds from 3e9 up);
* **families** (not run by default): held-out real-model instances of the
  generated model families only (:func:`schedulers.rl.workloads.real_instance`
  with no zoo model, seeds from 3.1e9 up): models, inventories and floors
  the policy never saw.

Then rl (deterministic decode and best of k samples), greedy, genetic and
genetic given rl's planning time (``genetic@rl``: per instance, its
generations scaled so that it takes the CPU time rl_k{max} took) plan, and
each cost's gap ``cost / optimum - 1`` is recorded (inf when the scheduler
fails). Prints the gap distribution, planning time (wall and CPU ms), how
often rl repaired its placement or fell back to another scheduler, and how
many plans miss the floor (must be 0).

    .venv/bin/python bench/rl_placement.py [--suite random,real] [--quick] [--n 200]
        [--samples 0,16] [--policy FILE] [--no-refine] [--csv FILE] [--json]
    .venv/bin/python bench/rl_placement.py --tradeoff [--fine-tune 2000,10000] [--tradeoff-n 14]

``--tradeoff``: planning time against gap on the first instance of each
(model, inventory) of the real suite at floor 0.5: the shipped policy
deterministic and best of k for k in 0, 4, 16, 64, and the shipped policy
fine-tuned on the instance for N PPO steps (HeterPS trains per model) then
best of 16; fine-tuning CPU seconds are counted in its planning time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from schedulers.exact import solve  # noqa: E402
from schedulers.placement import Genetic, Greedy, PlacementScheduler  # noqa: E402
from schedulers.rl.scheduler import DEFAULT_POLICY, RL, load_policy  # noqa: E402
from schedulers.rl.workloads import real_instance, suite  # noqa: E402
from sim.instances import random_problem  # noqa: E402
from sim.placement import PlacementInfeasible, PlacementSpace  # noqa: E402
from sim.problem import Problem  # noqa: E402

HELD_OUT_SEED = 2_000_000_000
FAMILIES_SEED = 3_100_000_000
SUITES = ("random", "real", "families")
GENETIC_GENERATIONS = 150


def problems(kind: str, n: int) -> Iterator[Problem]:
    if kind == "random":
        for seed in range(HELD_OUT_SEED, HELD_OUT_SEED + n):
            yield random_problem(seed)
    elif kind == "families":
        made, seed = 0, FAMILIES_SEED
        while made < n:
            got = real_instance(seed, zoo_share=0.0)
            seed += 1
            if got is not None:
                made += 1
                yield got[0]
    else:
        yield from suite()[:n]


def optimum(prob: Problem, exact_limit_s: float) -> tuple[float | None, str | None, float]:
    """(proven optimum or None, why skipped, exact's seconds)."""
    t = time.perf_counter()
    ex = solve(PlacementSpace(prob), time_limit_s=exact_limit_s)
    secs = time.perf_counter() - t
    if not np.isfinite(ex.cost_usd) and ex.proven:
        return None, "infeasible", secs
    if not ex.proven:
        return None, "not_proven", secs
    return ex.cost_usd, None, secs


def timed_plan(sch: PlacementScheduler, prob: Problem) -> tuple[float, dict[str, Any], float, float]:
    """(cost or inf, the plan's rl info, wall s, CPU s); the plan's throughput is checked
    against the floor (a plan below it counts as a failure and is reported)."""
    t, c = time.perf_counter(), time.process_time()
    try:
        plan = sch.plan(prob)
        pred = plan.options["placement"]["predicted"]
        cost = float(pred["cost_usd"])
        info = dict(plan.options.get("rl") or {})
        tmin = prob.objective.throughput_min or 0.0
        if not pred["feasible"] or pred["throughput_sps"] < tmin * (1 - 1e-9):
            info["below_floor"] = True
            cost = np.inf
    except PlacementInfeasible:
        cost, info = np.inf, {}
    return cost, info, time.perf_counter() - t, time.process_time() - c


def run(kind: str, n: int, samples: list[int], policy: str, exact_limit_s: float = 30.0,
        progress: bool = True, polish: bool = False, refine: bool = True) -> tuple[list[dict], dict]:
    from tqdm import tqdm

    load_policy(policy)                               # load outside the timings
    scheds: dict[str, PlacementScheduler] = {f"rl_k{k}": RL(policy, samples=k, refine=refine) for k in samples}
    if polish:
        scheds.update({f"rl_k{k}+polish": RL(policy, samples=k, polish=True, refine=refine) for k in samples})
    scheds.update(greedy=Greedy(), genetic=Genetic())
    top = f"rl_k{max(samples)}" if samples else None
    rows, skipped = [], {"infeasible": 0, "not_proven": 0}
    for prob in tqdm(list(problems(kind, n)), desc=kind, disable=not progress):
        opt, why, ex_s = optimum(prob, exact_limit_s)
        if why:
            skipped[why] += 1
            continue
        space = PlacementSpace(prob)
        row: dict[str, Any] = {"problem": prob.name, "layers": space.L, "types": space.K, "optimum_usd": opt,
                               "exact_s": ex_s}
        for name, sch in scheds.items():
            cost, info, wall, cpu = timed_plan(sch, prob)
            record(row, name, cost, opt, wall, cpu, info)
        if top:                                       # genetic given rl's CPU time on this instance
            g = max(1, round(GENETIC_GENERATIONS * row[f"{top}_cpu_s"] / max(row["genetic_cpu_s"], 1e-9)))
            cost, info, wall, cpu = timed_plan(Genetic(generations=g), prob)
            record(row, "genetic@rl", cost, opt, wall, cpu, info)
        rows.append(row)
    return rows, skipped


def record(row: dict[str, Any], name: str, cost: float, opt: float, wall: float, cpu: float,
           info: dict[str, Any]) -> None:
    row[f"{name}_s"], row[f"{name}_cpu_s"] = wall, cpu
    row[f"{name}_gap"] = cost / opt - 1.0
    row[f"{name}_below_floor"] = bool(info.get("below_floor"))
    if name.startswith("rl"):
        row[f"{name}_fallback"] = info.get("fallback")
        row[f"{name}_repaired"] = bool(info.get("repaired"))
        if info.get("fallback"):                      # the policy's own placement failed
            row[f"{name}_gap"] = np.inf
            row[f"{name}_gap_with_fallback"] = cost / opt - 1.0


def summary(rows: list[dict], names: list[str]) -> dict[str, dict]:
    out = {}
    for name in names:
        g = np.array([r[f"{name}_gap"] for r in rows])
        fin = np.isfinite(g)
        gf = np.where(fin, g, np.nan)
        ms = np.array([r[f"{name}_s"] for r in rows]) * 1e3
        cpu = np.array([r[f"{name}_cpu_s"] for r in rows]) * 1e3
        out[name] = {
            "n": int(g.size), "failed": int((~fin).sum()),
            "mean_gap": float(np.nanmean(gf)) if fin.any() else None,
            "median_gap": float(np.nanmedian(gf)) if fin.any() else None,
            "p90_gap": float(np.quantile(np.where(fin, g, np.inf), 0.9)),
            "max_gap": float(np.max(g)),
            "share_optimal": float(np.mean(g <= 1e-6)),
            "share_within_5pct": float(np.mean(g <= 0.05)),
            "plan_ms_mean": float(ms.mean()), "plan_ms_p90": float(np.quantile(ms, 0.9)),
            "plan_ms_max": float(ms.max()), "plan_cpu_ms_mean": float(cpu.mean()),
            "below_floor": int(sum(1 for r in rows if r[f"{name}_below_floor"])),
        }
        if name.startswith("rl"):
            out[name]["fallbacks"] = int(sum(1 for r in rows if r.get(f"{name}_fallback")))
            out[name]["repaired"] = int(sum(1 for r in rows if r.get(f"{name}_repaired")))
    return out


def print_summary(title: str, summ: dict[str, dict]) -> None:
    print(title)
    cols = ["scheduler", "mean", "median", "p90", "max", "optimal", "<=5%", "failed", "repaired", "fallbacks",
            "<floor", "ms mean", "ms p90", "cpu ms"]
    print("  ".join(f"{c:>13}" if i == 0 else f"{c:>9}" for i, c in enumerate(cols)))
    pct = lambda x: "-" if x is None else ("inf" if not np.isfinite(x) else f"{100 * x:.2f}%")  # noqa: E731
    for name, s in summ.items():
        vals = [name, pct(s["mean_gap"]), pct(s["median_gap"]), pct(s["p90_gap"]), pct(s["max_gap"]),
                f"{100 * s['share_optimal']:.0f}%", f"{100 * s['share_within_5pct']:.0f}%", str(s["failed"]),
                str(s.get("repaired", "-")), str(s.get("fallbacks", "-")), str(s["below_floor"]),
                f"{s['plan_ms_mean']:.1f}", f"{s['plan_ms_p90']:.1f}", f"{s['plan_cpu_ms_mean']:.1f}"]
        print("  ".join(f"{v:>13}" if i == 0 else f"{v:>9}" for i, v in enumerate(vals)))


def tradeoff(policy: str, steps: list[int], n: int, exact_limit_s: float, progress: bool) -> list[dict]:
    """Planning time against gap (module docstring's ``--tradeoff``), one row per method."""
    import tempfile

    from tqdm import tqdm

    from schedulers.rl.train import TrainConfig, train

    load_policy(policy)
    chosen = [p for p in suite(floors=(0.5,))][:n]
    methods: dict[str, list[tuple[float, float]]] = {}
    for prob in tqdm(chosen, desc="tradeoff", disable=not progress):
        opt, why, _ = optimum(prob, exact_limit_s)
        if why:
            continue
        for k in (0, 4, 16, 64):
            cost, _, _, cpu = timed_plan(RL(policy, samples=k), prob)
            methods.setdefault(f"shipped, best of {k + 1}", []).append((cost / opt - 1, cpu))
        for st in steps:
            with tempfile.TemporaryDirectory() as d:
                c0 = time.process_time()
                cfg = TrainConfig(timesteps=st, n_envs=4, n_steps=128, batch_size=128, n_epochs=4, bc_instances=0,
                                  learning_rate=3e-5, seed=0)
                train(Path(d) / "ft.zip", cfg, problem=prob, init=policy, progress=False)
                tune = time.process_time() - c0
                load_policy.cache_clear()
                cost, _, _, cpu = timed_plan(RL(str(Path(d) / "ft.zip"), samples=16), prob)
                load_policy.cache_clear()
                load_policy(policy)
            methods.setdefault(f"fine-tuned {st} steps, best of 17", []).append((cost / opt - 1, tune + cpu))
        cost, _, _, cpu = timed_plan(Genetic(), prob)
        methods.setdefault("genetic (150 generations)", []).append((cost / opt - 1, cpu))
    out = []
    for name, v in methods.items():
        g = np.array([x for x, _ in v])
        fin = np.isfinite(g)
        out.append({"method": name, "n": len(v), "mean_gap": float(g[fin].mean()) if fin.any() else None,
                    "failed": int((~fin).sum()), "cpu_s_mean": float(np.mean([t for _, t in v]))})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default="random,real",
                    help="comma-separated: random, real, families (default random,real)")
    ap.add_argument("--quick", action="store_true", help="30 random instances, 21 real ones (a smoke run)")
    ap.add_argument("--n", type=int, default=200, help="held-out random instances (default 200)")
    ap.add_argument("--n-families", type=int, default=60, help="held-out family instances (default 60)")
    ap.add_argument("--samples", default="0,16", help="rl best-of-k values, comma-separated (0: deterministic)")
    ap.add_argument("--policy", default=str(DEFAULT_POLICY))
    ap.add_argument("--exact-limit", type=float, default=30.0, help="exact solver's time limit (s)")
    ap.add_argument("--no-refine", action="store_true", help="rl without its layer-level boundary refinement")
    ap.add_argument("--polish", action="store_true",
                    help="also rl with polish=True (greedy's merge moves after the policy: not RL alone)")
    ap.add_argument("--tradeoff", action="store_true", help="planning time against gap (module docstring)")
    ap.add_argument("--fine-tune", default="2000,10000", help="--tradeoff: fine-tuning PPO steps")
    ap.add_argument("--tradeoff-n", type=int, default=28, help="--tradeoff: instances (default 28)")
    ap.add_argument("--csv", help="write the per-instance rows here (suite name before the suffix)")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    if a.tradeoff:
        rows = tradeoff(a.policy, [int(x) for x in a.fine_tune.split(",") if x], a.tradeoff_n, a.exact_limit,
                        not a.json)
        if a.json:
            print(json.dumps(rows, indent=2))
        else:
            print(f"{'method':>36}  {'n':>3}  {'mean gap':>8}  {'failed':>6}  {'CPU s':>7}")
            for r in rows:
                gap = "-" if r["mean_gap"] is None else f"{100 * r['mean_gap']:.2f}%"
                print(f"{r['method']:>36}  {r['n']:>3}  {gap:>8}  {r['failed']:>6}  {r['cpu_s_mean']:>7.3f}")
        return 0
    samples = [int(x) for x in a.samples.split(",") if x != ""]
    names = [f"rl_k{k}" for k in samples] + ([f"rl_k{k}+polish" for k in samples] if a.polish else []) + \
        ["greedy", "genetic"] + (["genetic@rl"] if samples else [])
    report: dict[str, Any] = {"policy": a.policy, "refine": not a.no_refine}
    for kind in [s for s in a.suite.split(",") if s]:
        if kind not in SUITES:
            ap.error(f"--suite: unknown suite {kind!r} ({', '.join(SUITES)})")
        n = {"random": 30, "real": 21, "families": 20}[kind] if a.quick else \
            {"random": a.n, "real": 10**6, "families": a.n_families}[kind]
        rows, skipped = run(kind, n, samples, a.policy, a.exact_limit, progress=not a.json, polish=a.polish,
                            refine=not a.no_refine)
        summ = summary(rows, names)
        report[kind] = {"scored": len(rows), "skipped": skipped, "summary": summ}
        if a.csv:
            import pandas as pd

            path = Path(a.csv)
            pd.DataFrame(rows).to_csv(path.with_name(f"{path.stem}_{kind}{path.suffix}"), index=False)
        if not a.json:
            what = {"random": f"{n} held-out random instances (seeds {HELD_OUT_SEED}..)",
                    "real": "the real-model suite (zoo models x 4 inventories x floors 0.2, 0.5, 0.8)",
                    "families": f"{n} held-out real-model instances of the generated families (seeds "
                                f"{FAMILIES_SEED}..)"}[kind]
            print_summary(f"\n{what}; scored {len(rows)}; skipped: {skipped['infeasible']} with no feasible "
                          f"placement, {skipped['not_proven']} where exact was not proven in {a.exact_limit:g} s",
                          summ)
    if a.json:
        print(json.dumps(report, indent=2))
    else:
        print("gap = cost / exact optimum - 1 over instances the scheduler solved (mean, median); p90, max and "
              "the shares count failures as inf. rl failures are fallbacks (plans from greedy/genetic); "
              "repaired: no episode met the floor and greedy's merge repair of the deterministic one did; "
              "<floor: plans below throughput_min (must be 0).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
