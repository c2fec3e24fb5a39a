"""``hetsim plot DIR``: the figures that fit any hetsim output folder.

The folder's kind is told by the file it has (the first that exists decides):

========  ==================  ===================================================
kind      file                figures (PNG and SVG, into DIR/figures by default)
========  ==================  ===================================================
sweep     results.csv         :func:`experiments.plots.plot_sweep`
validate  validation.json     sim_vs_real; gantt_SCHEDULER_sim, gantt_SCHEDULER_real
dag       comparison.csv      comparison (energy, planned frame time against the
          (with plan_frame_   deadline, DES misses); frame_latency; gantt_SCHEDULER
          ms)
compare   comparison.csv      comparison; utilization_heatmap; loss_vs_wall_time;
                              gantt_RUN (compare: RUN = scheduler; demo: MODEL_SCHEDULER)
run       summary.json        gantt; iteration_times; utilization; loss_vs_wall_time;
                              frame_latency (a robotics run)
========  ==================  ===================================================

A figure the folder has no data for is skipped with one line on stdout,
``plot: skipped NAME: REASON`` (a Gantt chart of an analytic run, whose
trace.json has no events, for one). The figures drawn here for ``hetsim dag``
and ``hetsim validate`` as they run (:func:`dag_comparison_figure`,
:func:`validation_figure`) are the same functions.
"""

from __future__ import annotations

import csv
import functools
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from matplotlib.patches import Patch

from experiments import plots
from experiments.figstyle import scheduler_color, scheduler_marker, scheduler_order
from experiments.plots import plt
from hardware_profiles.errors import ConfigError

#: kind -> the file that marks it, in the order they are tried
MARKERS = (("sweep", "results.csv"), ("validate", "validation.json"), ("compare", "comparison.csv"),
           ("run", "summary.json"))
_DPI = 100
Maker = Callable[[], Any]  # a figure, or the reason there is none


def folder_kind(folder: str | Path) -> str | None:
    """'sweep', 'validate', 'dag', 'compare' or 'run' (see the module docstring); None for
    a folder hetsim did not write."""
    d = Path(folder)
    for kind, name in MARKERS:
        if (d / name).is_file():
            if kind == "compare" and "plan_frame_ms" in _header(d / name):
                return "dag"
            return kind
    return None


def plot_dir(folder: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Draw the figures that fit ``folder`` (any hetsim output folder) into ``out_dir``
    (default ``folder/figures``); return the files written.

    Raises:
        ConfigError: ``folder`` is not a folder hetsim wrote.
    """
    d = Path(folder)
    kind = folder_kind(d) if d.is_dir() else None
    if kind is None:
        what = "not a hetsim output folder: it has no " if d.is_dir() else "no such folder; give "
        raise ConfigError(str(d), "", what + "results.csv (sweep), validation.json (validate), "
                          "comparison.csv (compare, demo, dag) or summary.json (simulate, run)")
    if kind == "sweep":
        return plots.plot_sweep(d, out_dir)
    out = Path(out_dir) if out_dir is not None else d / "figures"
    out.mkdir(parents=True, exist_ok=True)
    makers = {"validate": _validate_figures, "dag": _dag_figures, "compare": _compare_figures,
              "run": _run_figures}[kind](d)
    return plots.save_figures(makers, out, "plot")


# ------------------------------------------------------------------ reading
def _header(path: Path) -> list[str]:
    with path.open(newline="") as f:
        return next(csv.reader(f), [])


def _rows(path: Path) -> list[dict[str, Any]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _num(v: Any) -> float:
    try:
        return float(v) if v not in (None, "") else math.nan
    except (TypeError, ValueError):
        return math.nan


def _stem(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in text)


def _gantt(trace: Path, title: str, iterations: int = plots.GANTT_ITERATIONS) -> Any:
    """A run's Gantt figure, or why there is none."""
    if not trace.is_file():
        analytic = (_json(trace.parent / "summary.json") or {}).get("evaluator") == "analytic"
        return f"no {trace.name} in {trace.parent}" + (
            " (the analytic evaluator records no timeline; --evaluator des does)" if analytic else "")
    try:
        return plots.gantt_of(trace, iterations, title)
    except ValueError:
        return (f"{trace} has no timeline events (the analytic evaluator records none; "
                "simulate with --evaluator des for a timeline)")


# ------------------------------------------------------------------ compare, demo
def _compare_figures(d: Path) -> list[tuple[str, Maker]]:
    rows = _rows(d / "comparison.csv")
    evaluators = sorted({r.get("evaluator", "") for r in rows} - {""})
    title = f"{d.resolve().name}" + (f" ({', '.join(evaluators)})" if evaluators else "")
    runs = [(f"{r['model']}_{r['scheduler']}" if r.get("model") else r["scheduler"], r["scheduler"],
             d / r["model"] / r["scheduler"] if r.get("model") else d / r["scheduler"]) for r in rows]
    makers: list[tuple[str, Maker]] = [
        ("comparison", lambda: plots.comparison_figure(rows, title)),
        ("utilization_heatmap", lambda: _utilization_heatmap(runs, title)),
        ("loss_vs_wall_time", lambda: _loss([(s, run) for _, s, run in runs], title)),
    ]
    for label, _sched, run in runs:
        what = label.replace("_", " ", 1)
        makers.append((f"gantt_{_stem(label)}", functools.partial(_gantt, run / "trace.json",
                                                                   f"{title}: timeline of {what}")))
    return makers


def _utilization_heatmap(runs: Sequence[tuple[str, str, Path]], title: str) -> Any:
    labels = [label for label, _, _ in runs]
    names, devices, values = plots.utilization_matrix([run for _, _, run in runs], labels)
    if not names:
        return "no run has a summary.json with utilization"
    fig = plots.utilization_heatmap(names, devices, values, {label: s for label, s, _ in runs})
    note = "; – : device not in the run's plan" if any(math.isnan(v) for v in values.flat) else ""
    plots._suptitle(fig, f"{title}: per-device utilization{note}")
    return fig


def _loss(runs: Sequence[tuple[str, Path]], title: str) -> Any:
    curves = plots.loss_curves([run for _, run in runs])
    if not curves:
        return "no run's iterations.csv has a loss column"
    fig, ax = plt.subplots(figsize=(7.5, 4.4), layout="constrained")
    drawn = [(s, curves[run]) for s, run in runs if run in curves]
    plots.loss_panel(ax, drawn)
    plots._style(ax)
    plots._legend(fig, plots._sched_handles(scheduler_order(s for s, _ in drawn), marker=""), "scheduler")
    plots._suptitle(fig, f"{title}: loss vs wall time")
    return fig


# ------------------------------------------------------------------ one run
def _run_figures(d: Path) -> list[tuple[str, Maker]]:
    summary = _json(d / "summary.json") or {}
    title = f"{summary.get('name', d.resolve().name)} ({summary.get('scheduler', '?')}, " \
            f"{summary.get('evaluator', '?')})"
    frames = (d / "frames.csv").is_file()
    makers: list[tuple[str, Maker]] = [
        ("gantt", lambda: _gantt(d / "trace.json", f"{title}: timeline",
                                 iterations=10**9 if frames else plots.GANTT_ITERATIONS)),
    ]
    if frames:  # a robotics run (one scheduler's folder of hetsim dag)
        deadline = _num(summary.get("deadline_ms"))
        makers.append(("frame_latency", lambda: frame_latency_figure(
            [(str(summary.get("scheduler", "?")), d / "frames.csv", _num(summary.get("plan_frame_ms")))],
            deadline, title)))
        return makers
    makers += [("iteration_times", lambda: iteration_times_figure(d, title)),
               ("utilization", lambda: _utilization_bars(summary, title)),
               ("loss_vs_wall_time", lambda: _loss([(str(summary.get("scheduler", "")), d)], title))]
    return makers


def iteration_times_figure(run: Path, title: str) -> Any:
    """Time of each iteration (ms) of a run folder's iterations.csv, the warm-up iterations
    (config.json's job.warmup_iterations, left out of the throughput) shaded, and the
    mean of the others as a labelled line."""
    path = run / "iterations.csv"
    if not path.is_file():
        return f"no iterations.csv in {run}"
    its = _rows(path)
    times = [1e3 * _num(r.get("time_s")) for r in its]
    if not times or all(math.isnan(t) for t in times):
        return f"{path} has no iteration times"
    cfg = _json(run / "config.json") or {}
    warm = int((cfg.get("job") or {}).get("warmup_iterations", 1) or 0)
    warm = min(warm, len(times) - 1)
    fig, ax = plt.subplots(figsize=(8.0, 4.2), layout="constrained")
    xs = list(range(len(times)))
    ax.plot(xs, times, color="#1F77B4", lw=1.2, marker="o" if len(times) <= 60 else "", ms=3.5)
    if warm:
        ax.axvspan(-0.5, warm - 0.5, color="0.88", zorder=0)
        # beside the shaded span, at the foot of the axes (the y axis starts at 0: no line there)
        ax.annotate("◀ warm-up (not in throughput)", (warm - 0.5, 0.03), xycoords=("data", "axes fraction"),
                    xytext=(3, 0), textcoords="offset points", ha="left", va="bottom", fontsize=8)
    steady = [t for t in times[warm:] if not math.isnan(t)]
    mean = sum(steady) / len(steady)
    ax.axhline(mean, color="black", lw=0.9, ls="--")
    ax.annotate(f"mean after warm-up {plots._num(mean)} ms", (1, mean), xycoords=("axes fraction", "data"),
                xytext=(-4, 3), textcoords="offset points", ha="right", va="bottom", fontsize=8)
    ax.set_xlim(-0.5, len(times) - 0.5)
    ax.set_ylim(0, max(t for t in times if not math.isnan(t)) * 1.15)
    ax.set_xlabel("iteration")
    ax.set_ylabel("iteration time (ms)")
    plots._style(ax)
    plots._suptitle(fig, f"{title}: time per iteration")
    return fig


def _utilization_bars(summary: dict[str, Any], title: str) -> Any:
    util = summary.get("utilization")
    if not isinstance(util, dict) or not util:
        return "summary.json has no utilization"
    devs = [k for k in util if not str(k).startswith("ps:")] + [k for k in util if str(k).startswith("ps:")]
    vals = [_num(util[k]) for k in devs]
    fig, ax = plt.subplots(figsize=(max(5.5, 1.2 + 0.55 * len(devs)), 4.2), layout="constrained")
    colors = ["#9E9E9E" if str(k).startswith("ps:") else "#1F77B4" for k in devs]
    bars = ax.bar(range(len(devs)), [0 if math.isnan(v) else v for v in vals], 0.7, color=colors)
    ax.bar_label(bars, labels=["n/a" if math.isnan(v) else f"{v:.2f}" for v in vals], fontsize=8, padding=2)
    ax.set_xticks(range(len(devs)), devs, rotation=35 if len(devs) > 6 else 0,
                  ha="right" if len(devs) > 6 else "center")
    ax.set_ylim(0, 1.1)
    ax.set_xlabel("device (workers blue, PS shards grey)")
    ax.set_ylabel("utilization (busy time / elapsed)")
    plots._style(ax)
    ax.grid(axis="x", visible=False)
    plots._suptitle(fig, f"{title}: per-device utilization")
    return fig


# ------------------------------------------------------------------ robotics (hetsim dag)
def _dag_figures(d: Path) -> list[tuple[str, Maker]]:
    rows = _rows(d / "comparison.csv")
    cfg = _json(d / "config.json") or {}
    title = f"{cfg.get('name', d.resolve().name)} on {cfg.get('board', '?')}"
    deadline = _num(rows[0].get("deadline_ms")) if rows else math.nan
    makers: list[tuple[str, Maker]] = [
        ("comparison", lambda: dag_comparison_figure(rows, title)),
        ("frame_latency", lambda: frame_latency_figure(
            [(r["scheduler"], d / r["scheduler"] / "frames.csv", _num(r.get("plan_frame_ms"))) for r in rows],
            deadline, title)),
    ]
    for r in rows:
        s = r["scheduler"]
        makers.append((f"gantt_{_stem(s)}", functools.partial(_gantt, d / s / "trace.json",
                                                               f"{title} ({s}): timeline", iterations=10**9)))
    return makers


def _deadline_label(ax: Any, deadline_ms: float, horizontal: bool) -> None:
    """The deadline as a dashed black line, with its label written on it."""
    text = f"deadline {plots._tick(deadline_ms)} ms"
    if horizontal:
        ax.axhline(deadline_ms, color="black", lw=1.0, ls="--", zorder=3)
        ax.annotate(text, (1, deadline_ms), xycoords=("axes fraction", "data"), xytext=(-3, 3),
                    textcoords="offset points", ha="right", va="bottom", fontsize=8)
    else:
        ax.axvline(deadline_ms, color="black", lw=1.0, ls="--", zorder=3)
        ax.annotate(text, (deadline_ms, 0.02), xycoords=("data", "axes fraction"), xytext=(4, 0),
                    textcoords="offset points", ha="left", va="bottom", fontsize=8, rotation=90)


def dag_comparison_figure(rows: Sequence[dict[str, Any]], title: str = "") -> Any:
    """``hetsim dag``'s comparison: per scheduler, the planned energy per frame, the planned
    frame time against the deadline (a labelled line), and the share of frames that miss
    the deadline in the frames DES. Numbers may be given as text (rows of comparison.csv)."""
    names = [str(r["scheduler"]) for r in rows]
    panels = (("plan_energy_mj", "energy per frame, planned (mJ)", 1.0),
              ("plan_frame_ms", "frame time, planned (ms)", 1.0),
              ("des_miss_rate", "frames missing the deadline (DES, %)", 100.0))
    fig, axes = plt.subplots(1, 3, figsize=(max(10.0, 3 * (1.4 + 0.7 * len(rows))), 4.0), layout="constrained")
    xs = range(len(rows))
    for ax, (key, label, scale) in zip(axes, panels):
        ys = [scale * _num(r.get(key)) for r in rows]
        bars = ax.bar(xs, [0 if math.isnan(y) else y for y in ys], 0.7, color=[scheduler_color(n) for n in names])
        ax.bar_label(bars, labels=["n/a" if math.isnan(y) else plots._num(y) for y in ys], fontsize=8, padding=2)
        top = max([y for y in ys if not math.isnan(y)] + [0.0])
        if key == "plan_frame_ms":
            deadline = _num(rows[0].get("deadline_ms")) if rows else math.nan
            if not math.isnan(deadline):
                _deadline_label(ax, deadline, horizontal=True)
                top = max(top, deadline)
        if key == "des_miss_rate":  # the config's tolerance: a bar above it is flagged
            tol = scale * _num(rows[0].get("miss_tolerance")) if rows else math.nan
            if not math.isnan(tol):
                ax.axhline(tol, color="black", lw=0.8, ls=":")
                ax.annotate(f"miss_tolerance {plots._num(tol)}%", (1.0, tol), xycoords=("axes fraction", "data"),
                            xytext=(-2, 3), textcoords="offset points", ha="right", va="bottom", fontsize=8)
                top = max(top, tol)
        ax.set_ylim(0, top * 1.2 or 1.0)
        ax.set_xticks(list(xs), names, rotation=30 if len(rows) > 4 else 0, ha="right" if len(rows) > 4 else "center")
        ax.set_title(label, fontsize=10)
        plots._style(ax)
        ax.grid(axis="x", visible=False)
    if title:
        plots._suptitle(fig, title)
    return fig


def dag_comparison_chart(rows: Sequence[dict[str, Any]], path: Path, title: str = "") -> Path:
    """:func:`dag_comparison_figure` written to ``path``."""
    return plots.save_figure(dag_comparison_figure(rows, title), path, dpi=_DPI)


def frame_latency_figure(runs: Sequence[tuple[str, Path, float]], deadline_ms: float, title: str) -> Any:
    """The share of frames finished within each latency (ms) in the frames DES, one line
    per scheduler (``runs``: scheduler, its frames.csv, its planned frame time in ms),
    with the deadline as a labelled line: where a line crosses it, the frames that miss."""
    curves = []
    for sched, path, planned in runs:
        if path.is_file():
            lat = sorted(1e3 * _num(r.get("latency_s")) for r in _rows(path))
            lat = [v for v in lat if not math.isnan(v)]
            if lat:
                curves.append((sched, lat, planned))
    if not curves:
        return "no frames.csv with frame latencies"
    fig, ax = plt.subplots(figsize=(8.0, 4.6), layout="constrained")
    from matplotlib.lines import Line2D

    handles = []
    for k, (sched, lat, planned) in enumerate(curves):
        n = len(lat)
        ys = [(i + 1) / n for i in range(n)]
        color = scheduler_color(sched)
        ax.step(lat, ys, where="post", color=color, lw=max(1.2, 2.6 - 0.5 * k))
        if not math.isnan(planned):
            ax.plot([planned], [0], marker=scheduler_marker(sched), color=color, ms=9, clip_on=False, zorder=4)
        miss = sum(v > deadline_ms for v in lat) / n if not math.isnan(deadline_ms) else math.nan
        text = sched + ("" if math.isnan(miss) else f": {100 * miss:.1f}% miss")
        text += "" if math.isnan(planned) else f" (planned {plots._num(planned)} ms)"
        handles.append(Line2D([], [], color=color, lw=2, marker=scheduler_marker(sched), label=text))
    if not math.isnan(deadline_ms):
        _deadline_label(ax, deadline_ms, horizontal=False)
    ax.set_ylim(0, 1.02)
    ax.set_xlim(0, None)
    ax.set_xlabel("frame latency, release to finish (DES, ms)")
    ax.set_ylabel("fraction of frames finished within")
    plots._style(ax)
    fig.legend(handles=handles, title="scheduler (marker on the axis: planned frame time)",
               loc="outside lower center", ncols=min(2, len(handles)), frameon=False, fontsize=8)
    plots._suptitle(fig, f"{title}: frame latency in the DES")
    return fig


# ------------------------------------------------------------------ validate
def _validate_figures(d: Path) -> list[tuple[str, Maker]]:
    data = _json(d / "validation.json")
    items = data if isinstance(data, list) else [data] if isinstance(data, dict) else []
    makers: list[tuple[str, Maker]] = [("sim_vs_real", lambda: validation_figure(
        validation_points(items), f"{d.resolve().name}: sim vs real") if items else
        "validation.json has no validation")]
    if len(items) == 1:  # hetsim validate (one config): each scheduler's two timelines
        for sched in (items[0].get("schedulers") or {}):
            for side in ("sim", "real"):
                makers.append((f"gantt_{_stem(sched)}_{side}", functools.partial(
                    _gantt, d / sched / side / "trace.json", f"{items[0].get('name', '')} ({sched}): {side} timeline")))
    return makers


def validation_points(items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The points of :func:`validation_figure` from validation.json entries (one per config):
    config name, scheduler, simulated and real mean iteration time (s), oversubscribed."""
    out = []
    for v in items:
        for sched, run in (v.get("schedulers") or {}).items():
            m = (run.get("metrics") or {}).get("iteration_time_mean_s") or {}
            out.append({"config": v.get("name", "?"), "scheduler": sched, "sim": m.get("sim"),
                        "real": m.get("real"), "oversubscribed": bool((v.get("info") or {}).get("oversubscribed"))})
    return out


def validation_figure(points: Sequence[dict[str, Any]], title: str = "sim vs real") -> Any:
    """Simulated against real mean iteration time (ms, log axes), one marker per (config,
    scheduler) in the scheduler's colour and marker (hollow: more worker threads than cores),
    the y = x line and a ±10% band under them. Up to three points are labelled beside
    themselves, with a leader line, never over the marker; more are numbered, and the
    numbers listed in a panel beside the plot."""
    from matplotlib.lines import Line2D
    pts = [p for p in points if p.get("sim") is not None and p.get("real") is not None
           and p["sim"] > 0 and p["real"] > 0]
    if not pts:
        return "no scheduler has both a simulated and a real mean iteration time"
    numbered = len(pts) > 3
    if numbered:
        fig, (ax, side) = plt.subplots(1, 2, figsize=(10.5, 5.8), width_ratios=(1.0, 0.75), layout="constrained")
    else:
        fig, ax = plt.subplots(figsize=(6.4, 5.6), layout="constrained")
    lo = 1e3 * min(min(p["sim"], p["real"]) for p in pts) / 1.6
    hi = 1e3 * max(max(p["sim"], p["real"]) for p in pts) * 1.6
    ax.fill_between([lo, hi], [lo * 0.9, hi * 0.9], [lo * 1.1, hi * 1.1], color="0.9", zorder=0)
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, zorder=1)
    lines = []
    for i, p in enumerate(pts, 1):
        color, real, sim = scheduler_color(p["scheduler"]), 1e3 * p["real"], 1e3 * p["sim"]
        ax.scatter([real], [sim], s=60, marker=scheduler_marker(p["scheduler"]), zorder=3,
                   facecolors="none" if p["oversubscribed"] else color, edgecolors=color, linewidths=1.6)
        text = f"{p['config']} · {p['scheduler']}: {100 * (sim - real) / real:+.1f}%"
        if numbered:
            ax.annotate(str(i), (real, sim), xytext=(6, -10), textcoords="offset points", fontsize=8, zorder=4)
            lines.append(f"{i:>2}  {text}")
        else:
            ax.annotate(f"{text}\nsim {plots._num(sim)} ms, real {plots._num(real)} ms",
                        (real, sim), xytext=(22, -38 - 28 * (i - 1)), textcoords="offset points",
                        fontsize=8, zorder=4, va="top",
                        arrowprops={"arrowstyle": "-", "color": "0.4", "lw": 0.7, "shrinkB": 6})
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
           xlabel="real mean iteration time (ms)", ylabel="simulated mean iteration time (ms)")
    for axis in (ax.xaxis, ax.yaxis):
        plots._plain_axis(axis, log=True)
    ax.set_aspect("equal")
    plots._style(ax)
    handles = [Patch(color="0.9", label="±10%"), Line2D([], [], color="black", ls="--", lw=0.8, label="y = x")]
    handles += [Line2D([], [], color=scheduler_color(s), marker=scheduler_marker(s), ls="", label=s)
                for s in scheduler_order(p["scheduler"] for p in pts)]
    ax.legend(handles=handles, fontsize=8, loc="upper left", frameon=False)
    if numbered:
        side.axis("off")
        side.text(0.0, 0.5, "\n".join(lines), ha="left", va="center", fontsize=7, family="monospace",
                  transform=side.transAxes)
    note = "; hollow: more worker threads than cores" if any(p["oversubscribed"] for p in pts) else ""
    plots._suptitle(fig, f"{title}\n(error = (sim - real) / real{note})")
    return fig


def validation_chart(points: Sequence[dict[str, Any]], path: Path, title: str = "sim vs real") -> Path | None:
    """:func:`validation_figure` written to ``path`` (nothing written without a point)."""
    fig = validation_figure(points, title)
    if isinstance(fig, str):
        return None
    return plots.save_figure(fig, path, dpi=130)

