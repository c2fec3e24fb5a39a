"""Reproduce H-PS (seed paper 001): time to a target loss on a container-like heterogeneous cluster.

    python -m experiments.reproduce_hps [--quick] [--seeds N] [--jobs N] [--out results/reproduce_hps]

The experiment, top to bottom:

* **Cluster.** ``cpu``: four CPU workers of 1, 2, 4 and 8 vCPUs (containers;
  ``cpu-1c`` and ``cpu-4c`` are scaled estimates in ``experiments/configs/hps/profiles/``),
  ``mixed``: the same four plus one T4 GPU. One PS shard on ``cpu-16c``; every
  NIC at 1 or 10 Gbit/s.
* **Models.** resnet18, vgg16 and ctr_dnn, each only if it has a convergence fit in
  ``sim/convergence_fits/`` (time to target needs one); missing ones are listed
  in the report.
* **Target.** Derived from the model's fit, not hand-picked:
  ``L_inf + GAP_FRACTION x (L0 - L_inf)`` (L0: the first loss the fit's torch
  runs measured), unless full-precision BSP at the model's global batch would
  need more than ``K`` iterations for it (``K`` = ``TARGET_ITERATIONS``, the
  run-time budget); then the loss that BSP reaches after ``K - 1/2``
  iterations. Every method of a model faces the same loss.
* **Load.** ``none``, or background load drawn from the run's seed: a log-space
  random walk of every worker's slowdown (1x to 4x, one step every 2 tau) plus
  a co-located job on the two fastest workers (3x for half of every 30 tau,
  random phase), where tau is the modelled iteration time of the
  ``proportional`` split without load (analytic evaluator), so the load varies
  on the same time scale for every model. Seeds change only the load, so the
  no-load cases run once.
* **Methods.** Equal-split BSP, ASP and SSP (staleness 3), ``proportional``,
  ``lbbsp`` (all without pipelining or quantization), H-PS (``hps`` +
  ``pipeline: true`` + ``quantization: adaptive``) and three ablations of it:
  no pipelining, no quantization, no status awareness (``status_aware: false``).
* **Evaluator.** The DES, ``trace: false``.

Outputs in ``--out``: ``results.csv`` (one row per run), ``report.md`` and the
PNG figures it shows. Runs go to a process pool (``--jobs``, default 2).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from experiments import runner
from hardware_profiles import load_profile
from hardware_profiles.fileio import atomic_write, prepare_out
from sim import analytic, zoo
from sim.convergence import FITS_DIR, load_for, model_tensor_elems
from sim.costmodel import max_batch_in_memory
from sim.problem import initial_free_memory_bytes

CONFIG_DIR = Path(__file__).with_name("configs") / "hps"
PROFILES = "profiles"  # relative to CONFIG_DIR
MODELS = ("resnet18", "vgg16", "ctr_dnn")
GLOBAL_BATCH = {"resnet18": 128, "vgg16": 64, "ctr_dnn": 1024, "mlp": 256}
CPU_WORKERS = ("cpu-1c", "cpu-2c", "cpu-4c", "cpu-8c")
CLUSTERS = {"cpu": CPU_WORKERS, "mixed": (*CPU_WORKERS, "t4")}
BANDWIDTHS_GBPS = (1.0, 10.0)
LOADS = ("none", "load")
PS_TYPE = "cpu-16c"
SSP_STALENESS = 3
#: the target closes this fraction of the gap from the first measured loss to L_inf ...
GAP_FRACTION = 0.5
#: ... unless equal-split BSP would need more global iterations than this (full run / --quick)
TARGET_ITERATIONS = 150
QUICK_TARGET_ITERATIONS = 20

#: method -> (scheduler, scheduler params, sync, pipeline, quantization)
METHODS: dict[str, tuple[str, dict[str, Any], str, bool, str]] = {
    "bsp-equal": ("equal", {}, "bsp", False, "none"),
    "asp-equal": ("equal", {}, "asp", False, "none"),
    "ssp-equal": ("equal", {}, "ssp", False, "none"),
    "proportional": ("proportional", {}, "bsp", False, "none"),
    "lbbsp": ("lbbsp", {}, "bsp", False, "none"),
    "hps": ("hps", {}, "bsp", True, "adaptive"),
    "hps-no-pipeline": ("hps", {}, "bsp", False, "adaptive"),
    "hps-no-quant": ("hps", {}, "bsp", True, "none"),
    "hps-no-status": ("hps", {"status_aware": False}, "bsp", True, "adaptive"),
}
BASELINES = ("bsp-equal", "asp-equal", "ssp-equal", "proportional", "lbbsp")
ABLATIONS = ("hps-no-pipeline", "hps-no-quant", "hps-no-status")
COLORS = dict(zip(METHODS, ["#8C8C8C", "#DD8452", "#C9A227", "#4C72B0", "#55A868", "#C44E52",
                            "#8172B3", "#DA8BC3", "#937860"]))
MAX_FIGURE_BYTES = 300_000
#: H-PS's reported speed-up range over its baselines (seed paper 001's abstract)
PAPER_SPEEDUP = (1.4, 3.5)


@dataclass(frozen=True)
class Case:
    """One run: a point of the grid."""

    model: str
    cluster: str
    bandwidth_gbps: float
    load: str
    seed: int
    method: str
    target_iterations: int

    @property
    def group(self) -> tuple[str, str, float, str]:
        return (self.model, self.cluster, self.bandwidth_gbps, self.load)


# ----------------------------------------------------------------------------- configs
def target_loss(model: str, iterations: int) -> float:
    """``L_inf + GAP_FRACTION x (L0 - L_inf)``, or, if full-precision BSP at the model's global
    batch needs more than ``iterations`` global iterations for that, the loss it reaches after
    ``iterations - 1/2`` (so it needs exactly ``iterations``)."""
    fit = load_for(model)
    if fit is None:
        raise ValueError(f"no convergence fit for {model!r}")
    m, B = fit.model, GLOBAL_BATCH[model]
    by_gap = m.L_inf + GAP_FRACTION * (initial_loss(model) - m.L_inf)
    by_budget = float(m.loss((iterations - 0.5) * B * m.discount(B)))
    return max(by_gap, by_budget)


def bsp_iterations(model: str, iterations: int) -> int:
    """Global iterations full-precision BSP needs for :func:`target_loss`."""
    fit = load_for(model)
    assert fit is not None
    B = GLOBAL_BATCH[model]
    need = fit.model.effective_to_target(target_loss(model, iterations)) / (B * fit.model.discount(B))
    return max(1, math.ceil(need * (1 - 1e-9)))


def initial_loss(model: str) -> float:
    """The first measured loss of the fit's curves (the start of the gap the target closes)."""
    fit = load_for(model)
    assert fit is not None
    return float(max(c.loss[0] for c in fit.curves))


def _base(case: Case) -> dict[str, Any]:
    return {
        "name": f"{case.model}__{case.cluster}__{case.bandwidth_gbps:g}gbps__{case.load}__{case.seed}",
        "seed": case.seed,
        "profiles": [PROFILES],
        "cluster": {
            "devices": [{"type": t} for t in CLUSTERS[case.cluster]],
            "ps": {"shards": 1, "type": PS_TYPE},
            "network": {"bandwidth_gbps": case.bandwidth_gbps},
        },
        "job": {"model": case.model, "global_batch": GLOBAL_BATCH[case.model]},
    }


def tau_s(case: Case) -> float:
    """The load's time unit: the analytic iteration time of ``proportional`` (BSP, no load)."""
    d = _base(case)
    d["job"]["iterations"] = 3
    d["scheduler"] = {"name": "proportional"}
    loaded = runner.from_dict(d, CONFIG_DIR, "tau")
    problem = runner.problem_of(loaded)
    _, plan = runner.schedule(loaded, problem)
    return float(analytic.evaluate(problem, plan).summary()["iteration_time_s"]["mean"])


def load_dynamics(case: Case, tau: float) -> list[dict[str, Any]]:
    """Background load in units of ``tau``, long enough for any method's run."""
    n = len(CLUSTERS[case.cluster])
    until = 50.0 * case.target_iterations * tau
    return [
        {"pattern": "random_walk", "workers": "all", "every_s": 2.0 * tau, "until_s": until,
         "slowdown": {"min": 1.0, "max": 4.0, "start": 1.0, "sigma": 0.5}},
        {"pattern": "periodic", "workers": [n - 2, n - 1], "period_s": 30.0 * tau, "duty": 0.5,
         "random_phase": True, "until_s": until, "slowdown": 3.0},
    ]


def config_of(case: Case, tau: float | None = None) -> dict[str, Any]:
    """The config mapping of one run (``tau``: the load's time unit, needed with load)."""
    sched, params, sync, pipeline, quant = METHODS[case.method]
    d = _base(case)
    d["job"].update({"target_loss": target_loss(case.model, case.target_iterations), "sync": sync,
                     "staleness": SSP_STALENESS if sync == "ssp" else 0,
                     "pipeline": pipeline, "quantization": quant})
    d["scheduler"] = {"name": sched, "params": dict(params)}
    if case.load != "none":
        assert tau is not None
        d["dynamics"] = load_dynamics(case, tau)
    return d


# ----------------------------------------------------------------------------- one run
def run_case(case: Case, tau: float | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Plan and simulate one case: (results.csv row, detail for the figures)."""
    loaded = runner.from_dict(config_of(case, tau), CONFIG_DIR, f"reproduce_hps:{case.method}")
    problem = runner.problem_of(loaded)
    sched, plan = runner.schedule(loaded, problem)
    free = initial_free_memory_bytes(problem)
    over = False  # an initial share larger than the worker's memory holds (the DES does not OOM)
    for r in plan.replicas:
        dev = problem.cluster.device(r.device)
        cap = max_batch_in_memory(problem.job.model, problem.job.dtype, free[dev.id], 1)
        over |= cap is not None and r.batch > cap
    res = runner.evaluate(problem, plan, "des", trace=False, scheduler=sched)
    s = res.summary()
    bits = res.extra.get("quant_bits")
    sched_name, params, sync, pipeline, quant = METHODS[case.method]
    row = {
        **asdict(case),
        "scheduler": sched_name,
        "status_aware": params.get("status_aware", True) if sched_name == "hps" else "",
        "sync": sync,
        "staleness": problem.job.staleness,
        "pipeline": pipeline,
        "quantization": quant,
        "global_batch": problem.job.global_batch,
        "target_loss": problem.job.target_loss,
        "tau_s": tau if tau is not None else "",
        "time_to_target_s": res.time_to_target_s,
        "iterations": s["iterations"],
        "elapsed_s": s["elapsed_s"],
        "throughput_sps": s["throughput_sps"],
        "iteration_time_mean_s": s["iteration_time_s"]["mean"],
        "rebalances": res.extra.get("rebalances", ""),
        "staleness_mean": res.extra.get("staleness", {}).get("mean", 0.0),
        "final_bits": bits[-1][1] if bits else 32 if quant == "none" else "",
        "initial_shares": " ".join(str(r.batch) for r in plan.replicas),
        "initial_over_memory": over,
    }
    detail = {
        "iter_end_s": list(res.iter_end_s),
        "iter_loss": list(res.iter_loss or []),
        "workers": {d.id: (d.compute_s, d.comm_s, d.wait_s) for d in res.devices if d.role == "worker"},
        "elapsed_s": res.elapsed_s,
    }
    return row, detail


def _run_task(args: tuple[Case, float | None]) -> tuple[Case, dict[str, Any], dict[str, Any]]:
    case, tau = args
    row, detail = run_case(case, tau)
    return case, row, detail


# ----------------------------------------------------------------------------- the grid
def cases(models: Sequence[str], clusters: Sequence[str], bandwidths: Sequence[float],
          loads: Sequence[str], seeds: int, methods: Sequence[str], iterations: int) -> list[Case]:
    """Every run of the grid; without load one run (seed 0), since seeds vary only the load."""
    out: list[Case] = []
    for m in models:
        for c in clusters:
            for bw in bandwidths:
                for ld in loads:
                    for s in range(seeds if ld != "none" else 1):
                        out.extend(Case(m, c, bw, ld, s, meth, iterations) for meth in methods)
    return out


def run_all(todo: Sequence[Case], jobs: int = 2, progress: bool = True
            ) -> tuple[pd.DataFrame, dict[Case, dict[str, Any]]]:
    """Run ``todo`` (in a pool of ``jobs`` processes; 1: in this process)."""
    from tqdm import tqdm

    taus: dict[tuple[str, str, float], float] = {}
    for c in todo:
        key = (c.model, c.cluster, c.bandwidth_gbps)
        if c.load != "none" and key not in taus:
            taus[key] = tau_s(c)
    tasks = [(c, taus.get((c.model, c.cluster, c.bandwidth_gbps)) if c.load != "none" else None)
             for c in todo]
    rows: dict[Case, dict[str, Any]] = {}
    details: dict[Case, dict[str, Any]] = {}
    with tqdm(total=len(tasks), desc="reproduce_hps", unit="run", disable=not progress) as bar:
        if jobs <= 1:
            for t in tasks:
                case, row, det = _run_task(t)
                rows[case], details[case] = row, det
                bar.update()
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                futures = [pool.submit(_run_task, t) for t in tasks]
                for f in as_completed(futures):
                    case, row, det = f.result()
                    rows[case], details[case] = row, det
                    bar.update()
    table = pd.DataFrame([rows[c] for c in todo])  # grid order, whatever order they finished in
    return table, details


# ----------------------------------------------------------------------------- statistics
def _key_cols() -> list[str]:
    return ["model", "cluster", "bandwidth_gbps", "load"]


def ttt_stats(table: pd.DataFrame) -> pd.DataFrame:
    """Mean, std and count of the time to target per group and method (unreached runs: NaN)."""
    t = table.assign(ttt=pd.to_numeric(table["time_to_target_s"], errors="coerce"))
    g = t.groupby([*_key_cols(), "method"], sort=False)["ttt"]
    return g.agg(["mean", "std", "count", "size"]).reset_index()


def speedups(stats: pd.DataFrame) -> pd.DataFrame:
    """Per group: mean time to target of each method / hps' (> 1: hps is faster)."""
    wide = stats.pivot_table(index=_key_cols(), columns="method", values="mean", sort=False)
    return wide.div(wide["hps"], axis=0)


# ----------------------------------------------------------------------------- figures
def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    from experiments.plots import save_figure

    plt = _plt()
    for dpi in (90, 70, 50):
        save_figure(fig, path, dpi=dpi, close=False)
        if path.stat().st_size < MAX_FIGURE_BYTES:
            break
    plt.close(fig)
    return path


def fig_ttt_bars(table: pd.DataFrame, load: str, path: Path) -> Path | None:
    """Bars of mean time to target per method (error bar: std over seeds, dots: seeds), one
    panel per model x cluster x bandwidth."""
    plt = _plt()
    t = table[table["load"] == load]
    t = t.assign(ttt=pd.to_numeric(t["time_to_target_s"], errors="coerce"))
    if t.empty:
        return None
    models = list(dict.fromkeys(t["model"]))
    cols = list(dict.fromkeys(zip(t["cluster"], t["bandwidth_gbps"])))
    methods = [m for m in METHODS if m in set(t["method"])]
    fig, axes = plt.subplots(len(models), len(cols), figsize=(3.3 * len(cols), 2.7 * len(models)),
                             squeeze=False, constrained_layout=True)
    x = np.arange(len(methods))
    for i, m in enumerate(models):
        for j, (cl, bw) in enumerate(cols):
            ax = axes[i][j]
            sub = t[(t["model"] == m) & (t["cluster"] == cl) & (t["bandwidth_gbps"] == bw)]
            for k, meth in enumerate(methods):
                v = sub[sub["method"] == meth]["ttt"].dropna().to_numpy()
                if v.size == 0:
                    ax.text(k, 0, "n/r", ha="center", va="bottom", fontsize=6, rotation=90)
                    continue
                ax.bar(k, v.mean(), color=COLORS[meth], yerr=v.std(ddof=1) if v.size > 1 else None,
                       capsize=2, error_kw={"lw": 0.8})
                ax.scatter(np.full(v.size, k) + np.linspace(-0.2, 0.2, v.size), v, s=5, color="black",
                           zorder=3, linewidths=0)
            ax.set_title(f"{m}, {cl}, {bw:g} Gbit/s", fontsize=8)
            ax.set_xticks(x, methods, rotation=70, fontsize=6)
            ax.tick_params(axis="y", labelsize=6)
            if j == 0:
                ax.set_ylabel("time to target (s)", fontsize=7)
            ax.spines[["top", "right"]].set_visible(False)
    what = "with background load (bars: mean, whiskers: std, dots: seeds)" if load != "none" \
        else "without background load (one run each)"
    fig.suptitle(f"Simulated time to the target loss, {what}", fontsize=9)
    return _save(fig, path)


def fig_loss(table: pd.DataFrame, details: dict[Case, dict[str, Any]], group: tuple[Any, ...],
             seed: int, path: Path) -> Path | None:
    """Modelled loss vs simulated wall time of every method in one case."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 3.8), constrained_layout=True)
    target = None
    for c, det in details.items():
        if c.group != group or c.seed != seed or not det["iter_loss"]:
            continue
        ax.plot(det["iter_end_s"][: len(det["iter_loss"])], det["iter_loss"], color=COLORS[c.method],
                label=c.method, lw=1.6 if c.method == "hps" else 1.0)
        target = target_loss(c.model, c.target_iterations)
    if target is None:
        plt.close(fig)
        return None
    ax.axhline(target, color="black", ls=":", lw=0.8, label="target")
    top = initial_loss(group[0])  # the power law runs off to infinity in the first updates
    ax.set_ylim(target - 0.1 * (top - target), top + 0.1 * (top - target))
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("modelled training loss")
    ax.set_title(_title(group, seed), fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    ax.spines[["top", "right"]].set_visible(False)
    return _save(fig, path)


def fig_utilization(details: dict[Case, dict[str, Any]], group: tuple[Any, ...], seed: int,
                    path: Path) -> Path | None:
    """Per worker: compute, own communication and waiting as fractions of the run, per method."""
    plt = _plt()
    runs = [(c, d) for c, d in details.items() if c.group == group and c.seed == seed]
    runs.sort(key=lambda cd: list(METHODS).index(cd[0].method))
    if not runs:
        return None
    n = len(runs)
    ncol = 3
    nrow = math.ceil(n / ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(9.6, 2.4 * nrow), squeeze=False, sharey=True,
                             constrained_layout=True)
    for ax, (c, d) in zip(axes.flat, runs):
        ws = [f"{t}:0" for t in CLUSTERS[c.cluster]]  # every worker; one left out of the plan idles
        T = d["elapsed_s"] or 1.0
        parts = np.array([d["workers"].get(w, (0.0, 0.0, 0.0)) for w in ws]) / T
        for k, w in enumerate(ws):
            if w not in d["workers"]:
                ax.text(k, 0.02, "share 0", ha="center", va="bottom", rotation=90, fontsize=6)
        bottom = np.zeros(len(ws))
        for k, (lab, col) in enumerate((("compute", "#4C72B0"), ("own transfers", "#DD8452"),
                                        ("waiting", "#BBBBBB"))):
            ax.bar(range(len(ws)), parts[:, k], bottom=bottom, color=col, label=lab)
            bottom += parts[:, k]
        ax.set_xticks(range(len(ws)), [w.split(":")[0] for w in ws], fontsize=7)
        ax.set_title(c.method, fontsize=8)
        ax.set_ylim(0, 1.05)
        ax.spines[["top", "right"]].set_visible(False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    axes[0][0].set_ylabel("fraction of the run")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=7)
    fig.suptitle(f"Per-worker time split (fractions of each run), {_title(group, seed)}", fontsize=9)
    return _save(fig, path)


# ----------------------------------------------------------------------------- report
def _title(group: tuple[Any, ...], seed: int) -> str:
    m, cl, bw, ld = group
    return f"{m}, {cl}, {bw:g} Gbit/s, {'with' if ld != 'none' else 'without'} load, seed {seed}"


def _fmt(x: float) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def _ms(mean: float, std: float, count: int, size: int) -> str:
    if count == 0:
        return "not reached"
    s = _fmt(mean) if count == 1 or not math.isfinite(std) else f"{_fmt(mean)} ± {_fmt(std)}"
    return s + (f" ({size - count} n/r)" if count < size else "")


def _group_label(g: tuple[Any, ...]) -> str:
    m, cl, bw, ld = g
    return f"{m} | {cl} | {bw:g} | {ld}"


def representative(table: pd.DataFrame) -> tuple[tuple[Any, ...], int]:
    """The case the loss and utilization figures show: the first model, cpu, 1 Gbit/s,
    with load, seed 0 (or the first group there is)."""
    groups = list(dict.fromkeys(tuple(r) for r in table[_key_cols()].itertuples(index=False)))
    for g in groups:
        if g[1] == "cpu" and g[2] == 1.0 and g[3] != "none":
            return g, 0
    return groups[0], 0


def write_report(table: pd.DataFrame, details: dict[Case, dict[str, Any]], out: Path,
                 meta: dict[str, Any]) -> Path:
    """report.md and its figures from the results table."""
    stats = ttt_stats(table)
    sp = speedups(stats)
    figs = {}
    for ld in LOADS:
        p = fig_ttt_bars(table, ld, out / f"ttt_bars_{ld}.png")
        if p is not None:
            figs[f"bars_{ld}"] = p
    group, seed = representative(table)
    for name, fn in (("loss", lambda p: fig_loss(table, details, group, seed, p)),
                     ("util", lambda p: fig_utilization(details, group, seed, p))):
        p = fn(out / f"{'loss_vs_time' if name == 'loss' else 'utilization'}.png")
        if p is not None:
            figs[name] = p

    L: list[str] = []
    L += ["# Reproducing H-PS in hetsim", ""]
    L += [f"Generated by `python -m experiments.reproduce_hps {meta['argv']}` "
          f"({meta['runs']} DES runs in {meta['wall_s']:.0f} s wall on {meta['jobs']} processes). "
          "Every number below is a simulated time from datasheet (and scaled) profiles and a "
          "convergence model fitted to small torch runs; nothing here was measured on real hardware.", ""]
    if meta["missing"]:
        L += [f"**Missing:** no usable convergence fit in `sim/convergence_fits/` for "
              f"{', '.join(meta['missing'])}, so {'it is' if len(meta['missing']) == 1 else 'they are'} "
              "not in this report (time to target needs a fit)."]
        unusable = [m for m in meta["missing"] if (FITS_DIR / "unusable" / f"{m}.json").is_file()]
        if unusable:
            L[-1] += (f" A fit of {', '.join(unusable)} exists only in `sim/convergence_fits/unusable/`: "
                      "experiments/fit_convergence.py puts a fit there when the small torch runs stayed on a "
                      "plateau (exponent alpha below its MIN_ALPHA), so no time to target uses it.")
        L += [""]

    L += ["## Setup", ""]
    L += ["| | |", "|---|---|"]
    L += [f"| workers, `cpu` | {', '.join(CLUSTERS['cpu'])} (1, 2, 4, 8 vCPUs; `cpu-1c`, `cpu-4c` scaled "
          "from `cpu-2c`, see `experiments/configs/hps/profiles/`) |"]
    L += [f"| workers, `mixed` | {', '.join(CLUSTERS['mixed'])} |"]
    L += [f"| parameter server | 1 shard on `{PS_TYPE}` |"]
    L += [f"| network | every NIC at {' or '.join(f'{b:g}' for b in meta['bandwidths'])} Gbit/s, "
          "50 µs latency, fair sharing |"]
    L += ["| load `none` | no status changes (one run per case: the DES is deterministic) |"]
    L += ["| load `load` | every worker's slowdown a random walk in log space, 1x..4x, start 1x, "
          "sigma 0.5 per step, a step every 2 tau; the two fastest workers also 3x slower for half of "
          "every 30 tau (random phase); tau = modelled iteration time of `proportional` without load; "
          f"seeds 0..{meta['seeds'] - 1} |"]
    L += [f"| target | L_inf + {GAP_FRACTION:g} x (first measured loss - L_inf) from the model's fit, or, "
          f"where full-precision BSP would need more than {meta['K']} global iterations for that, the loss "
          f"it reaches after {meta['K']} - 1/2; a run stops at the target (or at 100x BSP's iterations) |"]
    L += ["| evaluator | DES (`sim/des`), modelled loss from `sim/convergence.py` |", ""]
    L += ["| model | parameters (MB) | global batch | fitted L_inf | first measured loss | target loss | "
          "gap closed | BSP iterations to target | critical batch | staleness penalty | quant penalty |",
          "|---" * 11 + "|"]
    for m in meta["models"]:
        fit = load_for(m)
        assert fit is not None
        cm, L0, tgt = fit.model, initial_loss(m), target_loss(m, meta["K"])
        mb = sum(ly.param_bytes for ly in zoo.get(m).layers) / 1e6
        L += [f"| {m} | {mb:.0f} | {GLOBAL_BATCH[m]} | {cm.L_inf:.3g} | {L0:.4g} | {tgt:.4g} | "
              f"{(L0 - tgt) / (L0 - cm.L_inf):.0%} | {bsp_iterations(m, meta['K'])} | {cm.critical_batch:.3g} | "
              f"{cm.staleness_penalty:.3g} | {cm.quant_penalty:.3g} |"]
    L += ["", "| method | scheduler | sync | pipelining | quantization | status-aware |",
          "|---|---|---|---|---|---|"]
    for meth, (sched, params, sync, pipe, quant) in METHODS.items():
        st = ("no" if params.get("status_aware") is False else "yes") if sched == "hps" \
            else ("yes" if sched == "lbbsp" else "no")
        L += [f"| {meth} | {sched} | {sync}{f' ({SSP_STALENESS})' if sync == 'ssp' else ''} | "
              f"{'yes' if pipe else 'no'} | {quant} | {st} |"]
    L += ["", "H-PS's method is the `hps` row: status-aware allocation + pipelining + adaptive "
          "quantization.", ""]

    L += ["## Time to target (simulated seconds, mean ± std over seeds)", ""]
    methods = [m for m in METHODS if m in set(table["method"])]
    L += ["| model \\| cluster \\| Gbit/s \\| load | " + " | ".join(methods) + " |",
          "|---" * (len(methods) + 1) + "|"]
    for g, sub in stats.groupby(_key_cols(), sort=False):
        cells = {r.method: _ms(r.mean, r.std, int(r.count), int(r.size)) for r in sub.itertuples()}
        L += [f"| {_group_label(g)} | " + " | ".join(cells.get(m, "-") for m in methods) + " |"]
    L += ["", "## Speed-up of hps (time to target of the method / hps')", ""]
    L += ["| model \\| cluster \\| Gbit/s \\| load | " + " | ".join(m for m in methods if m != "hps") + " |",
          "|---" * len(methods) + "|"]
    for g, r in sp.iterrows():
        L += [f"| {_group_label(g)} | " + " | ".join(f"{r[m]:.2f}x" if math.isfinite(r[m]) else "-"
                                                    for m in methods if m != "hps") + " |"]
    L += ["", "Summary over the cases above (geometric mean, min..max):", "",
          "| method | vs hps: geometric mean | min | max | cases where hps is slower |",
          "|---|---|---|---|---|"]
    for m in methods:
        if m == "hps":
            continue
        v = sp[m].replace([np.inf, -np.inf], np.nan).dropna()
        if v.empty:
            continue
        L += [f"| {m} | {math.exp(np.log(v).mean()):.2f}x | {v.min():.2f}x | {v.max():.2f}x | "
              f"{int((v < 1).sum())} of {v.size} |"]
    L += [""]
    over = table[table["initial_over_memory"].astype(bool)]
    if not over.empty:
        kinds = sorted({f"{r.model}/{r.cluster}/{r.method}" for r in over.itertuples()})
        L += [f"Memory: in {len(kinds)} model/cluster/method combinations the initial split gives a worker "
              f"more samples than its memory holds ({', '.join(kinds)}). hetsim does not model running "
              "out of memory, so these runs are timed as if it fitted; on real containers they would fail "
              "or swap. hps caps every share by free memory and never does this.", ""]

    L += ["## Figures", ""]
    if "bars_load" in figs:
        L += ["Time to target with background load, over seeds:", "", "![time to target, load](ttt_bars_load.png)",
              ""]
    if "bars_none" in figs:
        L += ["Without load:", "", "![time to target, no load](ttt_bars_none.png)", ""]
    if "loss" in figs:
        L += [f"Modelled loss against simulated time, {_group_label(group)}, seed {seed}:", "",
              "![loss vs time](loss_vs_time.png)", ""]
    if "util" in figs:
        L += [f"Per-worker utilization (compute, own transfers, waiting on others), "
              f"{_group_label(group)}, seed {seed}:", "", "![utilization](utilization.png)", ""]

    L += ["## Where this lands relative to H-PS's 1.4x-3.5x claim, and why", ""]
    L += verdict_section(table, sp, meta["models"])
    L += ["### The numbers behind it", ""]
    L += mechanism_section(table, sp)
    L += efficiency_section(table, meta["models"])
    path = out / "report.md"
    atomic_write(path, "\n".join(L).rstrip() + "\n")
    return path


def _gm(v: pd.Series) -> float:
    v = v.replace([np.inf, -np.inf], np.nan).dropna()
    return math.exp(float(np.log(v).mean())) if len(v) else math.nan


def _sel(sp: pd.DataFrame, **where: Any) -> pd.DataFrame:
    idx = sp.reset_index()
    for k, v in where.items():
        idx = idx[idx[k] == v]
    return idx


def _range(v: pd.Series) -> str:
    v = v.replace([np.inf, -np.inf], np.nan).dropna()
    if v.empty:
        return "-"
    return f"{v.min():.2f}x..{v.max():.2f}x (geometric mean {_gm(v):.2f}x, {len(v)} cases)"


def mechanism_section(table: pd.DataFrame, sp: pd.DataFrame) -> list[str]:
    """The closing section: where the speed-ups land against the paper's, and what each
    mechanism is worth by regime, from the measured speed-ups."""
    L: list[str] = []
    idx = sp.reset_index()
    clusters = list(dict.fromkeys(idx["cluster"]))
    L += ["Speed-up of hps (time to target of the baseline / hps'), by cluster, over models, "
          "bandwidths and load:", "", "| baseline | " + " | ".join(clusters) + " |",
          "|---" * (len(clusters) + 1) + "|"]
    for m in BASELINES:
        if m in sp:
            L += [f"| {m} | " + " | ".join(_range(_sel(sp, cluster=c)[m]) for c in clusters) + " |"]
    L += [""]
    base = [m for m in BASELINES if m in sp]
    L += ["Against the paper's range, case by case (below 1.4x / within 1.4x-3.5x / above 3.5x):", "",
          "| baseline | " + " | ".join(clusters) + " |", "|---" * (len(clusters) + 1) + "|"]
    for m in base:
        cells = []
        for c in clusters:
            v = _sel(sp, cluster=c)[m].replace([np.inf, -np.inf], np.nan).dropna()
            cells.append(f"{int((v < 1.4).sum())} / {int(((v >= 1.4) & (v <= 3.5)).sum())} / {int((v > 3.5).sum())}")
        L += [f"| {m} | " + " | ".join(cells) + " |"]
    L += [""]
    lost = idx[base].lt(1.0)
    if lost.to_numpy().any():
        models = list(dict.fromkeys(idx["model"]))
        L += ["Cases where hps is slower than the baseline (of the cases per model):", "",
              "| baseline | " + " | ".join(models) + " |", "|---" * (len(models) + 1) + "|"]
        for m in base:
            if lost[m].any():
                L += [f"| {m} | " + " | ".join(f"{int(lost[m][idx['model'] == mo].sum())} of "
                                               f"{int((idx['model'] == mo).sum())}" for mo in models) + " |"]
        L += [""]
    else:
        L += ["hps reaches the target first in every comparison.", ""]

    L += ["What each mechanism is worth, by regime (geometric mean over the cases in the regime of the "
          "method's time to target / hps'; for an ablation, > 1 means the mechanism it removes helps):", ""]
    dims = [("bandwidth_gbps", "Gbit/s"), ("cluster", "cluster"), ("load", "load"), ("model", "model")]
    cols = [m for m in (*ABLATIONS, *BASELINES) if m in sp]
    L += ["| regime | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for dim, lab in dims:
        for val in dict.fromkeys(idx[dim]):
            sub = idx[idx[dim] == val]
            name = f"{val:g}" if isinstance(val, float) else str(val)
            L += [f"| {lab} = {name} | " + " | ".join(f"{_gm(sub[c]):.2f}x" for c in cols) + " |"]
    L += [""]
    return L


def _worth(model: str, table: pd.DataFrame, method: str) -> tuple[float, float]:
    """(BSP's per-sample worth at the global batch, ``method``'s at B/4 and its measured staleness)."""
    fit = load_for(model)
    assert fit is not None
    cm, B = fit.model, GLOBAL_BATCH[model]
    rows = table[(table["model"] == model) & (table["cluster"] == "cpu") & (table["method"] == method)]
    st = float(pd.to_numeric(rows["staleness_mean"], errors="coerce").mean())
    return cm.discount(B), cm.discount(B / len(CLUSTERS["cpu"]), st if math.isfinite(st) else 0.0)


def _rng(v: pd.Series) -> str:
    v = v.replace([np.inf, -np.inf], np.nan).dropna()
    return "-" if v.empty else (f"{v.min():.2f}x" if len(v) == 1 else f"{v.min():.2f}x..{v.max():.2f}x")


def _in_paper(rows: pd.DataFrame) -> str:
    """'k of n cases within 1.4x-3.5x' for equal-split BSP's speed-ups in ``rows``."""
    v = rows["bsp-equal"].replace([np.inf, -np.inf], np.nan).dropna()
    inside = int(((v >= PAPER_SPEEDUP[0]) & (v <= PAPER_SPEEDUP[1])).sum())
    return f"{inside} of {len(v)} cases within {PAPER_SPEEDUP[0]:g}x-{PAPER_SPEEDUP[1]:g}x"


def _span_vs_paper(v: pd.Series) -> str:
    """Where the span of speed-ups ``v`` lies relative to the paper's range, in words."""
    v = v.replace([np.inf, -np.inf], np.nan).dropna()
    lo, hi = float(v.min()), float(v.max())
    plo, phi = PAPER_SPEEDUP
    paper = f"the paper's {plo:g}x-{phi:g}x"
    if hi < plo:
        return f"that span lies wholly below {paper}"
    if lo > phi:
        return f"that span lies wholly above {paper}"
    if lo <= plo and hi >= phi:
        return f"{paper} lies inside that span"
    if lo >= plo and hi <= phi:
        return f"that span lies inside {paper}"
    return f"that span overlaps {paper} ({'below' if lo < plo else 'above'} it at one end)"


def _instances(models: Sequence[str]) -> str:
    """The small instances the fits describe, from each fit's meta (experiments/fit_convergence.py)."""
    out: list[str] = []
    for m in models:
        fit = load_for(m)
        sizes = fit.meta.get("sizes", {}) if fit is not None else {}
        if "width" in sizes:
            out.append(f"{m} at 1/{round(1 / sizes['width'])} width on {sizes['size']}x{sizes['size']} inputs")
        elif sizes:
            out.append(f"{m} with " + ", ".join(f"{k} {v}" for k, v in sizes.items()))
    return "; ".join(out)


def verdict_section(table: pd.DataFrame, sp: pd.DataFrame, models: Sequence[str]) -> list[str]:
    """The plain answer, with the measured numbers it rests on."""
    idx = sp.reset_index()
    L: list[str] = []

    def r(col: str, **where: Any) -> str:
        return _rng(_sel(sp, **where)[col]) if col in sp else "-"

    def gm(col: str, **where: Any) -> str:
        return f"{_gm(_sel(sp, **where)[col]):.2f}x" if col in sp else "-"

    if "bsp-equal" in sp:
        cpu = _sel(sp, cluster="cpu")
        per_model = "; ".join(f"{m} {r('bsp-equal', cluster='cpu', model=m)}, {_in_paper(cpu[cpu['model'] == m])}"
                              for m in models)
        L += [f"**Against equal-split BSP**, the closest analogue of the paper's baseline, hps reaches the target "
              f"{r('bsp-equal', cluster='cpu')} sooner on the CPU-only container cluster ({per_model}); "
              f"{_span_vs_paper(cpu['bsp-equal'])}. The mechanism is the one the paper names: with workers of "
              f"1, 2, 4 and 8 vCPUs the equal split waits for the 1-vCPU worker at every barrier. Were compute all "
              f"that counted, the ratio would be {compute_bound('cpu'):.2f}x; the transfers to the single PS shard, "
              "which every split pays alike, pull it down (most for ctr_dnn at 1 Gbit/s, whose workers then spend "
              "most of the run on their own transfers of embedding rows), and pipelining can push it past the "
              f"compute-only ratio (up to {_sel(sp, cluster='cpu')['bsp-equal'].max():.2f}x). With a T4 in the cluster (`mixed`: a compute-only ratio of "
              f"{compute_bound('mixed'):.1f}x) the lead reaches {r('bsp-equal', cluster='mixed')}, above the "
              "paper's range where compute dominates: the paper's container cluster had no such device.", ""]
    if "asp-equal" in sp:
        lost = int((idx["asp-equal"] < 1).sum())
        worth = "; ".join("{}: {:.3g} per ASP sample vs {:.3g} per BSP sample".format(
            m, *reversed(_worth(m, table, "asp-equal"))) for m in models)
        L += [f"**Against ASP**, the claim does not reproduce: hps is slower in {lost} of {len(idx)} cases "
              f"(ASP's time / hps': {r('asp-equal')}). Two things in hetsim favour ASP. (1) An ASP worker never "
              "waits at a barrier, so even with the equal split every worker runs at its own speed and the "
              "cluster's throughput is the sum of the workers' rates: the balance hps reaches by re-splitting, "
              "without the barrier waits that background load adds to every BSP method (the utilization figure: "
              f"no waiting under ASP; ASP's lead is largest with load, {gm('asp-equal', load='load')} against "
              f"{gm('asp-equal', load='none')} without). (2) The convergence fits make a stale ASP sample "
              f"worth about as much as a BSP one or more ({worth}): the fitted staleness penalties are mild, and "
              "ASP's updates are one worker's share, which the batch discount credits (ctr_dnn's global batch "
              "of 1024 is far above its fitted critical batch). If staleness hurts the full-size models more than "
              "these small fitted runs show, the comparison moves toward hps; hetsim cannot say by how much "
              "without fits of stale runs at full size.", ""]
    if "ssp-equal" in sp:
        ssp = "; ".join(f"{m} {r('ssp-equal', model=m)}" for m in models)
        L += [f"**Against SSP(3)** (SSP's time / hps'): {ssp}. "
              "With the equal split the staleness bound ties the fast workers to the slowest, so SSP runs about "
              "as slowly as BSP and pays staleness on top, unless (ctr_dnn) the smaller per-worker updates are "
              "worth much more per sample than the global batch, as for ASP.", ""]
    if "proportional" in sp:
        L += [f"**Against the heterogeneity-aware baselines** (not in the paper): proportional "
              f"{r('proportional')} (geometric mean {gm('proportional')}), lbbsp {r('lbbsp')} (geometric mean "
              f"{gm('lbbsp')}). Most of hps' lead over equal splits is the allocation, which these two share; "
              "what is left is pipelining and quantization.", ""]
    L += ["**Mechanism by mechanism** (the ablations):", ""]
    if "hps-no-pipeline" in sp:
        L += [f"- *Pipelining*, the larger of the two job options: {gm('hps-no-pipeline', bandwidth_gbps=1.0)} at 1 Gbit/s, "
              f"{gm('hps-no-pipeline', bandwidth_gbps=10.0)} at 10 Gbit/s (range {r('hps-no-pipeline')}). It "
              "hides transfers behind compute, so it pays where the two are of similar size; at 10 Gbit/s "
              "on the CPU cluster resnet18's transfers are already small next to its compute "
              f"({r('hps-no-pipeline', model='resnet18', cluster='cpu', bandwidth_gbps=10.0)})."]
    if "hps-no-quant" in sp:
        L += [f"- *Adaptive quantization* is worth {gm('hps-no-quant', bandwidth_gbps=1.0)} at 1 Gbit/s and "
              f"{gm('hps-no-quant', bandwidth_gbps=10.0)} at 10 Gbit/s (range {r('hps-no-quant')}); it helps "
              f"most where a fast device is held back by the network (mixed, 1 Gbit/s: "
              f"{r('hps-no-quant', cluster='mixed', bandwidth_gbps=1.0)}). On the CPU cluster pipelining already "
              "hides resnet18's transfers, so there is little left to cut; coarse gradients also cost samples "
              "where the fit has a quantization penalty (2-bit / 32-bit per-sample worth in the table below), "
              "and the policy refines to 32 bits as the loss flattens (every hps run here ended at "
              f"{'/'.join(sorted({str(b) for b in table[table['method'] == 'hps']['final_bits']}))} bits)."]
    if "hps-no-status" in sp:
        L += [f"- *Status awareness* is worth about nothing without load ({gm('hps-no-status', load='none')}; "
              "the DES computes at the modelled rates, so observing them adds little) and "
              f"{gm('hps-no-status', load='load')} with it (range {r('hps-no-status', load='load')}). The "
              "random-walk part of the load changes every 2 tau, faster than hps' rebalance period "
              "(5 iterations, smoothed rates), so the rates it acts on are partly out of date; the slow "
              "co-located job is what it can follow. H-PS's own load pattern is not given in its abstract; we "
              "expect a slower-changing load to favour status awareness more (not run here)."]
    L += ["", "**What limits this reproduction**: uncalibrated datasheet profiles (and two scaled ones) "
          "instead of measured containers; a convergence model fitted to small instances of the architectures "
          f"({_instances(models)}), not the full-size models; no out-of-memory failures in the "
          "simulator; the paper's baseline implementations and load are unknown. The numbers are a statement "
          "about hetsim's model of H-PS, not a measurement of H-PS.", ""]
    return L


def compute_bound(cluster: str) -> float:
    """Equal-split BSP's iteration time over a speed-proportional split's when compute alone
    counts and speed is fp32 peak: sum(peak) / (workers x min(peak))."""
    peaks = [load_profile(t, [CONFIG_DIR / PROFILES]).peak_flops["fp32"] for t in CLUSTERS[cluster]]
    return sum(peaks) / (len(peaks) * min(peaks))


def efficiency_section(table: pd.DataFrame, models: Sequence[str]) -> list[str]:
    """What one sample is worth under each method, from the fits (sim/convergence.py discounts):
    the statistical side of time to target, which the paper's wall-clock comparison folds in."""
    L = ["What one sample is worth (the convergence model's discount, 1 = an ideal small-batch, "
         "fresh, full-precision sample): BSP updates carry the whole global batch; ASP/SSP updates carry "
         "one worker's share (equal split: B / workers) at the mean staleness the DES measured (cpu "
         "cluster); hps' adaptive quantization starts at 2 bits and refines as the loss flattens.", "",
         "| model | BSP, batch B | ASP, B/4 at measured staleness | SSP(3), B/4 at measured staleness | "
         "2-bit / 32-bit | 8-bit / 32-bit |", "|---|---|---|---|---|---|"]
    cpu = table[table["cluster"] == "cpu"]
    n = len(CLUSTERS["cpu"])
    for m in models:
        fit = load_for(m)
        assert fit is not None
        cm, B = fit.model, GLOBAL_BATCH[m]
        d = model_tensor_elems(zoo.get(m))
        cells = [f"{cm.discount(B):.3g}"]
        for meth in ("asp-equal", "ssp-equal"):
            st = pd.to_numeric(cpu[(cpu["model"] == m) & (cpu["method"] == meth)]["staleness_mean"],
                               errors="coerce").mean()
            cells.append(f"{cm.discount(B / n, st):.3g} (staleness {st:.2g})" if math.isfinite(st) else "-")
        cells += [f"{cm.discount(B, 0, b, d) / cm.discount(B):.3g}" for b in (2, 8)]
        L += [f"| {m} | " + " | ".join(cells) + " |"]
    bounds = ", ".join(f"{c}: {compute_bound(c):.2f}x" for c in CLUSTERS)
    L += ["", f"For scale: if compute alone counted and speed were fp32 peak, equal-split BSP would take "
          f"this many times as long per iteration as a speed-proportional split ({bounds}). "
          "Communication to the one PS shard, which every split shares alike, pulls the real ratio down; "
          "memory-bound layers at small shares change it too.", ""]
    return L


# ----------------------------------------------------------------------------- main
def available_models(models: Sequence[str]) -> tuple[list[str], list[str]]:
    """(models with a convergence fit, models without one)."""
    have = [m for m in models if load_for(m) is not None]
    return have, [m for m in models if m not in have]


def run(out: str | Path, models: Sequence[str] = MODELS, clusters: Sequence[str] = tuple(CLUSTERS),
        bandwidths: Sequence[float] = BANDWIDTHS_GBPS, loads: Sequence[str] = LOADS, seeds: int = 5,
        methods: Sequence[str] = tuple(METHODS), iterations: int = TARGET_ITERATIONS, jobs: int = 2,
        progress: bool = True, argv: str = "") -> pd.DataFrame:
    """Run the grid and write results.csv, report.md and the figures into ``out``."""
    out_dir = prepare_out(out)
    have, missing = available_models(models)
    if not have:
        raise SystemExit(f"reproduce_hps: no convergence fit for any of {', '.join(models)}")
    todo = cases(have, clusters, bandwidths, loads, seeds, methods, iterations)
    t0 = time.perf_counter()
    table, details = run_all(todo, jobs=jobs, progress=progress)
    wall = time.perf_counter() - t0
    atomic_write(out_dir / "results.csv", table.to_csv(index=False))
    meta = {"argv": argv, "runs": len(todo), "wall_s": wall, "jobs": jobs, "missing": missing,
            "models": have, "bandwidths": bandwidths, "seeds": seeds, "K": iterations}
    write_report(table, details, out_dir, meta)
    table.attrs["wall_s"] = wall
    return table


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.reproduce_hps", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"one seed, a target BSP reaches in at most {QUICK_TARGET_ITERATIONS} iterations")
    ap.add_argument("--seeds", type=int, default=None, help="seeds of the loaded cases (default 5; --quick: 1)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="processes (default 2)")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated zoo models")
    ap.add_argument("--out", default="results/reproduce_hps")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    a = ap.parse_args(argv)
    args = " ".join(argv if argv is not None else sys.argv[1:])
    models = [m for m in a.models.split(",") if m]
    unknown = [m for m in models if m not in GLOBAL_BATCH]
    if unknown:
        ap.error(f"no global batch set for {', '.join(unknown)}; known: {', '.join(GLOBAL_BATCH)}")
    seeds = a.seeds if a.seeds is not None else (1 if a.quick else 5)
    if seeds < 1:
        ap.error("--seeds must be >= 1")
    iterations = QUICK_TARGET_ITERATIONS if a.quick else TARGET_ITERATIONS
    table = run(a.out, models=models, seeds=seeds, iterations=iterations, jobs=max(1, a.jobs),
                progress=not a.quiet, argv=args)
    print(f"wrote {a.out}/: results.csv ({len(table)} runs, {table.attrs['wall_s']:.0f} s), report.md, figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
