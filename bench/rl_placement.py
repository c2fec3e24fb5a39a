"""The `rl` placement policy against the exact optimum on held-out random instances.

For each instance (seeds from 2e9 up: never drawn in training, whose seeds lie
below schedulers.rl.masked_env.TRAIN_SEED_LIMIT = 1e9) the exact solver gives the
proven optimum; instances with no feasible placement, or where exact is not
proven within its time limit, are skipped and counted. Then rl (deterministic
decode and best of k samples), greedy and genetic plan, and each cost's gap
``cost / optimum - 1`` is recorded (inf when the scheduler fails). Prints the
gap distribution and the plan time per scheduler.

    .venv/bin/python bench/rl_placement.py [--quick] [--n 200] [--samples 0,16]
        [--policy FILE] [--csv FILE] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from schedulers.exact import solve  # noqa: E402
from schedulers.placement import Genetic, Greedy  # noqa: E402
from schedulers.rl.scheduler import DEFAULT_POLICY, RL, load_policy  # noqa: E402
from sim.instances import random_problem  # noqa: E402
from sim.placement import PlacementInfeasible, PlacementSpace  # noqa: E402

HELD_OUT_SEED = 2_000_000_000


def run(n: int, samples: list[int], policy: str, exact_limit_s: float = 30.0,
        progress: bool = True, polish: bool = False) -> tuple[list[dict], dict]:
    from tqdm import tqdm

    load_policy(policy)                               # load outside the timings
    scheds = {f"rl_k{k}": RL(policy, samples=k) for k in samples}
    if polish:
        scheds.update({f"rl_k{k}+polish": RL(policy, samples=k, polish=True) for k in samples})
    scheds.update(greedy=Greedy(), genetic=Genetic())
    rows, skipped = [], {"infeasible": 0, "not_proven": 0}
    for seed in tqdm(range(HELD_OUT_SEED, HELD_OUT_SEED + n), desc="instances", disable=not progress):
        prob = random_problem(seed)
        space = PlacementSpace(prob)
        t = time.perf_counter()
        ex = solve(space, time_limit_s=exact_limit_s)
        ex_s = time.perf_counter() - t
        if not np.isfinite(ex.cost_usd) and ex.proven:
            skipped["infeasible"] += 1
            continue
        if not ex.proven:
            skipped["not_proven"] += 1
            continue
        row = {"seed": seed, "layers": space.L, "types": space.K, "optimum_usd": ex.cost_usd,
               "exact_s": ex_s}
        for name, sch in scheds.items():
            t = time.perf_counter()
            try:
                plan = sch.plan(prob)
                cost = float(plan.options["placement"]["predicted"]["cost_usd"])
                fb = (plan.options.get("rl") or {}).get("fallback")
            except PlacementInfeasible:
                cost, fb = np.inf, None
            row[f"{name}_s"] = time.perf_counter() - t
            row[f"{name}_gap"] = cost / ex.cost_usd - 1.0
            if name.startswith("rl"):
                row[f"{name}_fallback"] = fb
                if fb:                                # the policy's own placement failed
                    row[f"{name}_gap"] = np.inf
                    row[f"{name}_gap_with_fallback"] = cost / ex.cost_usd - 1.0
        rows.append(row)
    return rows, skipped


def summary(rows: list[dict], names: list[str]) -> dict[str, dict]:
    out = {}
    for name in names:
        g = np.array([r[f"{name}_gap"] for r in rows])
        fin = np.isfinite(g)
        gf = np.where(fin, g, np.nan)
        ms = np.array([r[f"{name}_s"] for r in rows]) * 1e3
        out[name] = {
            "n": int(g.size), "failed": int((~fin).sum()),
            "mean_gap": float(np.nanmean(gf)) if fin.any() else None,
            "median_gap": float(np.nanmedian(gf)) if fin.any() else None,
            "p90_gap": float(np.quantile(np.where(fin, g, np.inf), 0.9)),
            "max_gap": float(np.max(g)),
            "share_optimal": float(np.mean(g <= 1e-6)),
            "share_within_5pct": float(np.mean(g <= 0.05)),
            "plan_ms_mean": float(ms.mean()), "plan_ms_p90": float(np.quantile(ms, 0.9)),
            "plan_ms_max": float(ms.max()),
        }
        if name.startswith("rl"):
            out[name]["fallbacks"] = int(sum(1 for r in rows if r.get(f"{name}_fallback")))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="30 instances (a smoke run)")
    ap.add_argument("--n", type=int, default=200, help="held-out instances (default 200)")
    ap.add_argument("--samples", default="0,16", help="rl best-of-k values, comma-separated (0: deterministic)")
    ap.add_argument("--policy", default=str(DEFAULT_POLICY))
    ap.add_argument("--exact-limit", type=float, default=30.0, help="exact solver's time limit (s)")
    ap.add_argument("--polish", action="store_true",
                    help="also rl with polish=True (greedy's merge moves after the policy: not RL alone)")
    ap.add_argument("--csv", help="write the per-instance rows here")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    n = 30 if a.quick else a.n
    samples = [int(x) for x in a.samples.split(",") if x != ""]
    rows, skipped = run(n, samples, a.policy, a.exact_limit, progress=not a.json, polish=a.polish)
    names = [f"rl_k{k}" for k in samples] + ([f"rl_k{k}+polish" for k in samples] if a.polish else []) + \
        ["greedy", "genetic"]
    summ = summary(rows, names)
    if a.csv:
        import pandas as pd

        pd.DataFrame(rows).to_csv(a.csv, index=False)
    if a.json:
        print(json.dumps({"instances": n, "skipped": skipped, "policy": a.policy, "summary": summ}, indent=2))
        return 0
    print(f"{n} held-out instances (seeds {HELD_OUT_SEED}..{HELD_OUT_SEED + n - 1}); scored {len(rows)}; "
          f"skipped: {skipped['infeasible']} with no feasible placement, {skipped['not_proven']} "
          f"where exact was not proven in {a.exact_limit:g} s")
    cols = ["scheduler", "mean", "median", "p90", "max", "optimal", "<=5%", "failed", "fallbacks",
            "ms mean", "ms p90", "ms max"]
    print("  ".join(f"{c:>13}" if i == 0 else f"{c:>9}" for i, c in enumerate(cols)))
    pct = lambda x: "-" if x is None else ("inf" if not np.isfinite(x) else f"{100 * x:.2f}%")  # noqa: E731
    for name, s in summ.items():
        vals = [name, pct(s["mean_gap"]), pct(s["median_gap"]), pct(s["p90_gap"]), pct(s["max_gap"]),
                f"{100 * s['share_optimal']:.0f}%", f"{100 * s['share_within_5pct']:.0f}%", str(s["failed"]),
                str(s.get("fallbacks", "-")), f"{s['plan_ms_mean']:.1f}", f"{s['plan_ms_p90']:.1f}",
                f"{s['plan_ms_max']:.1f}"]
        print("  ".join(f"{v:>13}" if i == 0 else f"{v:>9}" for i, v in enumerate(vals)))
    print("gap = cost / exact optimum - 1 over instances the scheduler solved (mean, median); p90, max and "
          "the shares count failures as inf. rl failures are fallbacks (plans from greedy/genetic).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
