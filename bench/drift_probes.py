"""`python -m bench.drift_probes DIR [DIR ...]`: which speed probe tracks the runtime's real CPU.

`hetsim validate --fresh-profile` scales the DES by the speed probes it records around the
real runs (:mod:`calibration.speed_now`; ``diagnostics.drift.probes`` of validation.json).
A probe earns its place if, when it reads a slower machine, the processes of that run
really use more CPU. This reads every validation.json under the DIRs with probes and, per
process, its real CPU (``cpu_per_iteration``: in all, and of its messages' copies) over its
DES figure without the drift (``runtime_cpu.figures`` divided by the drift factor the DES
ran at); then, within each (config, ``--set`` overrides, scheduler, process) seen in 3 runs
or more, the deviations of the logs from their mean: the slope (elasticity) and
correlation of real CPU against each probe's factor (the median over a run's probes). 1
and a high correlation: the probe tracks the runs; 0: it does not. Prints one line per
role, probe and real CPU (in all, or of the copies).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np


def runs(dirs: Iterable[Path]) -> Iterable[tuple[tuple[str, ...], dict]]:
    """``(group, scheduler run)`` of every run with probes in the validation.json files under
    ``dirs``, each run once (a suite's own validation.json lists the runs its configs'
    files hold: it is skipped, and a run met twice is taken once). ``group``: the config,
    its ``--set`` overrides and the scheduler, the runs of which are compared."""
    seen: set[str] = set()
    for d in dirs:
        for f in sorted(d.rglob("validation.json")):
            v = json.loads(f.read_text())
            if not isinstance(v, dict) or not isinstance(v.get("schedulers"), dict):
                continue  # a suite's list of its configs' records
            sets = json.dumps((v.get("info") or {}).get("overrides") or [])
            for name, run in v["schedulers"].items():
                drift = (run.get("diagnostics") or {}).get("drift") or {}
                key = json.dumps([v.get("name"), name, drift.get("probes")], sort_keys=True)
                if drift.get("probes") and key not in seen:
                    seen.add(key)
                    yield (v["name"], sets, name), run


def rows(dirs: Iterable[Path]) -> list[dict]:
    """Per process of every run with probes: its role, each probe's factor and the logs of its
    real CPU over its undrifted DES figure (in all, and of its copies)."""
    out = []
    for group, run in runs(dirs):
        dg = run["diagnostics"]
        probes = dg["drift"]["probes"]
        factors = {k: statistics.median(p[k] for p in probes) for k in probes[0] if isinstance(probes[0][k], float)}
        # the factors the DES ran at: one for everything, or (runs before 2026-12-07 18:30 UTC)
        # compute for the workers' compute and copies for the rest
        comp = dg["drift"]["compute"]
        copy = dg["drift"].get("copies", comp)
        figs = (dg.get("runtime_cpu") or {}).get("figures") or {}
        procs = (dg.get("cpu_per_iteration") or {}).get("processes") or {}
        for dev, f in figs.items():
            p = procs.get(dev) or {}
            transport = f["transport_ms"] / copy
            des = f["compute_ms"] / (copy if f["role"] == "ps" else comp) + transport
            if not p.get("real_ms") or des <= 0:
                continue
            copies = (np.log(p["real_transport_ms"] / transport)
                      if p.get("real_transport_ms") and transport > 0 else None)
            out.append({"group": (*group, dev), "role": f["role"], "factors": factors,
                        "total": float(np.log(p["real_ms"] / des)), "copies": copies})
    return out


def elasticities(data: Sequence[dict], min_runs: int = 3) -> list[tuple[str, str, str, float, float, int]]:
    """``(role, probe, what, slope, correlation, n)``: within-group log deviations of real CPU
    (``what``: total or copies) against each probe's, groups of at least ``min_runs``."""
    groups: dict[tuple, list[dict]] = collections.defaultdict(list)
    for r in data:
        groups[r["group"]].append(r)
    out = []
    for role in sorted({r["role"] for r in data}):
        for probe in sorted({k for r in data for k in r["factors"]}):
            for what in ("total", "copies"):
                xs: list[float] = []
                ys: list[float] = []
                for g in groups.values():
                    g = [r for r in g if r["role"] == role and probe in r["factors"] and r[what] is not None]
                    if len(g) < min_runs:
                        continue
                    x = np.log([r["factors"][probe] for r in g])
                    y = np.array([r[what] for r in g])
                    xs += list(x - x.mean())
                    ys += list(y - y.mean())
                if len(xs) >= 5 and np.std(xs) > 0 and np.std(ys) > 0:
                    slope = float(np.polyfit(xs, ys, 1)[0])
                    out.append((role, probe, what, slope, float(np.corrcoef(xs, ys)[0, 1]), len(xs)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="folders with validation.json files (searched recursively)")
    a = ap.parse_args(argv)
    missing = [d for d in a.dirs if not d.is_dir()]
    if missing:
        print(f"{missing[0]}: no such folder", file=sys.stderr)
        return 2
    data = rows(a.dirs)
    got = elasticities(data)
    if not got:
        print("no (config, process) with probes in 3 runs or more", file=sys.stderr)
        return 2
    print(f"{len(data)} processes of runs with speed probes")
    for role, probe, what, slope, r, n in got:
        print(f"{role:9} real CPU ({what:6}) vs probe {probe:8}: elasticity {slope:+.2f}, correlation {r:+.2f} (n {n})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
