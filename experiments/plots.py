"""Figures. One colour per scheduler, the same in every figure, and axis labels with
units (:mod:`experiments.figstyle`); every figure file is written atomically."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from experiments.columns import DAG_HEADLINE, FIXED_COLUMNS  # noqa: E402
from experiments.figstyle import (  # noqa: E402
    field_label,
    metric_label,
    scheduler_color,
    scheduler_marker,
    scheduler_order,
)
from hardware_profiles.fileio import atomic_write  # noqa: E402
from sim.result import HEADLINE_KEYS  # noqa: E402

# row keys of comparison_chart, top to bottom (labels: figstyle.METRIC_LABELS)
_COMPARISON_METRICS = ("throughput_sps", "cost_usd")


def markdown_table(df: Any) -> str:
    """A GitHub markdown table of a DataFrame (numbers to 4 significant digits)."""
    def cell(v: Any) -> str:
        if isinstance(v, float | np.floating):
            return "-" if not np.isfinite(v) else f"{v:.4g}"
        return "-" if v is None else str(v)

    head = "| " + " | ".join(map(str, df.columns)) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def save_figure(fig: Any, path: str | Path, dpi: float | None = None, close: bool = True) -> Path:
    """Write ``fig`` to ``path`` (the format from its suffix) atomically: rendered in
    memory, then written through :func:`hardware_profiles.fileio.atomic_write`, so a
    reader never sees half a figure. Closes the figure unless ``close`` is false."""
    import io

    p = Path(path)
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=p.suffix.lstrip(".") or "png", dpi=dpi)
    finally:
        if close:
            plt.close(fig)
    atomic_write(p, buf.getvalue())
    return p


def _num(x: float) -> str:
    """A bar label: three significant digits, plain decimals (28,872 / 591 / 0.0921 / 0.0000978)."""
    if x == 0 or not math.isfinite(x):
        return "0" if x == 0 else str(x)
    decimals = max(0, 2 - math.floor(math.log10(abs(x))))
    return f"{x:,.{decimals}f}"


def _plain_ticks(ax: Any) -> None:
    """Plain-decimal y tick labels with as many decimals as the tick step needs (no 1e-05)."""
    ticks = ax.get_yticks()
    step = float(ticks[1] - ticks[0]) if len(ticks) > 1 else 1.0
    decimals = next((d for d in range(13) if abs(round(step, d) - step) <= 1e-9 * step), 12)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x:,.{decimals}f}"))


def _value(row: dict[str, Any], key: str) -> float:
    v = row.get(key)
    try:
        return float(v) if v not in (None, "") else math.nan
    except (TypeError, ValueError):
        return math.nan


def _updates_label(row: dict[str, Any]) -> str:
    """A plan's kind, sync mode and staleness bound as a tick's second line
    ("placement, ssp <= 21"; '' for a row without them)."""
    if "plan_kind" not in row:
        return ""
    bound = row.get("staleness_bound")
    sync = str(row.get("sync", ""))
    if sync == "ssp":
        sync += f" \u2264 {bound}"
    return f"{str(row['plan_kind']).replace('_', '-')}, {sync}"


def comparison_chart(rows: Sequence[dict[str, Any]], path: Path, title: str = "") -> None:
    """:func:`comparison_figure` written to ``path``."""
    save_figure(comparison_figure(rows, title), path, dpi=110)


def comparison_figure(rows: Sequence[dict[str, Any]], title: str = "") -> Any:
    """Throughput (samples/s, top) and cost (USD, bottom) per scheduler, one column per model.

    Each model's panels have their own y-axis: throughputs of different models
    differ by orders of magnitude, and a shared axis would flatten the small
    bars. Rows without a ``model`` key form a single column. Numbers may be given
    as text (rows read from comparison.csv). A row with the
    plan's kind, sync mode and staleness bound (experiments.runner.update_columns)
    shows them under the scheduler's name.
    """
    models = list(dict.fromkeys(r.get("model", "") for r in rows)) or [""]
    scheds = list(dict.fromkeys(r["scheduler"] for r in rows))
    updates = {r["scheduler"]: _updates_label(r) for r in rows}
    ticks = [f"{s}\n{updates[s]}" if updates[s] else s for s in scheds]
    n_rows, n_cols = len(_COMPARISON_METRICS), len(models)
    width = max(4.2, 1.2 + n_cols * max(2.6, 0.75 * len(scheds) + 1.0))
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(width, 6.2), squeeze=False, layout="constrained")
    xs = range(len(scheds))
    for c, model in enumerate(models):
        for r, key in enumerate(_COMPARISON_METRICS):
            ax = axes[r][c]
            by_sched = {row["scheduler"]: _value(row, key) for row in rows if row.get("model", "") == model}
            ys = [by_sched.get(s, math.nan) for s in scheds]
            bars = ax.bar(xs, [0.0 if math.isnan(y) else y for y in ys], 0.7,
                          color=[scheduler_color(s) for s in scheds])
            ax.bar_label(bars, labels=["n/a" if math.isnan(y) else _num(y) for y in ys], fontsize=8,
                         padding=2)
            ax.set_ylim(0, max([y for y in ys if not math.isnan(y)] + [0.0]) * 1.18 or 1.0)
            _plain_ticks(ax)
            ax.set_xticks(list(xs), ticks, rotation=30 if len(scheds) > 3 else 0,
                          ha="right" if len(scheds) > 3 else "center", fontsize=8)
            ax.grid(axis="y", alpha=0.3)
            ax.set_axisbelow(True)
            ax.spines[["top", "right"]].set_visible(False)
            if c == 0:
                ax.set_ylabel(metric_label(key))
            if r == 0 and model:
                ax.set_title(model, fontweight="bold")
    handles = [Patch(color=scheduler_color(s), label=s) for s in scheds]
    # as many columns as fit the figure's width (an entry takes about 1.4 inches)
    fig.legend(handles=handles, title="scheduler", loc="outside lower center",
               ncols=max(1, min(len(scheds), int(width / 1.4))), frameon=False)
    if title:
        fig.suptitle(title + ("\n(each model on its own scale)" if n_cols > 1 else ""))
    return fig


# ======================================================================= sweeps
#
# plot_sweep reads a sweep folder (DIR/results.csv plus DIR/runs/POINT_ID/) and
# draws whichever of the figures below its data supports. Every helper that
# decides *what* to draw (pareto_front, utilization_matrix, gantt_bars,
# loss_curves, load_sweep) is separate from the drawing, so tests can check it.

STATUS_OK = "ok"
SCHED = "_scheduler"  # column added by load_sweep: the scheduler of each point
SEED = "seed"
THROUGHPUT_MIN = "objective.throughput_min"
HEADLINE = HEADLINE_KEYS
_NOT_SWEPT = {*FIXED_COLUMNS, *HEADLINE, *DAG_HEADLINE}
#: metrics of a robotics (DAG) sweep drawn against each numeric swept field
DAG_METRICS = ("plan_energy_mj", "des_miss_rate", "plan_frame_ms")
_DPI = 100
# more runs than this in the heat map / loss plot: show a representative subset
MAX_ROWS = 12
MAX_LOSS_RUNS = 24
GANTT_ITERATIONS = 3


def _fmt_value(v: Any) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def pareto_front(throughput: Sequence[float], cost: Sequence[float]) -> list[int]:
    """Indices of the points no other point beats: max throughput, min cost.

    Point j dominates point i when it has at least i's throughput at no more
    than i's cost and is strictly better on one of the two. Points with equal
    (throughput, cost) do not dominate each other, so exact duplicates on the
    front are all returned. NaN points are never on the front. Sorted by cost,
    then by throughput (both ascending), so the result traces the front left
    to right.
    """
    pts = [(float(t), float(c), i) for i, (t, c) in enumerate(zip(throughput, cost))
           if not (math.isnan(float(t)) or math.isnan(float(c)))]
    # cheapest first; among equal cost, highest throughput first
    pts.sort(key=lambda p: (p[1], -p[0]))
    front: list[tuple[float, float, int]] = []
    best = -math.inf  # highest throughput seen at a strictly lower cost, or at equal cost
    for t, c, i in pts:
        if t > best:
            front.append((t, c, i))
            best = t
        elif t == best and front and front[-1][0] == t and front[-1][1] == c:
            front.append((t, c, i))  # an exact duplicate of a front point
    front.sort(key=lambda p: (p[1], p[0], p[2]))
    return [i for _, _, i in front]


# ------------------------------------------------------------------ sweep data
class Sweep:
    """A sweep folder's results.csv, split into what the figures need.

    Attributes:
        dir: the sweep folder.
        ok: the rows with status ok, plus a ``_scheduler`` column.
        n_error: rows with another status (left out of every figure).
        swept: the swept columns, by dotted name, in results.csv order.
        numeric: swept numeric columns with more than one value, except ``seed``
            and ``scheduler.name`` (x axes of the line plots).
        facets: swept non-numeric columns other than ``scheduler.name``
            (e.g. ``job.model``): one panel per combination.
    """

    def __init__(self, sweep_dir: Path) -> None:
        self.dir = Path(sweep_dir)
        df = pd.read_csv(self.dir / "results.csv", dtype={"point_id": str, "status": str, "error": str},
                         keep_default_na=True)
        self.swept = [c for c in df.columns if c not in _NOT_SWEPT]
        if "status" in df.columns:
            ok_mask = df["status"].fillna("").str.strip() == STATUS_OK
        else:
            ok_mask = pd.Series(True, index=df.index)
        self.n_error = int((~ok_mask).sum())
        ok = df[ok_mask].copy()
        self.kind = "dag" if "plan_energy_mj" in df.columns else "training"
        for m in (*HEADLINE, *DAG_HEADLINE):
            if m in ok.columns and m not in ("scheduler", "mode"):
                ok[m] = pd.to_numeric(ok[m], errors="coerce")
        if "scheduler.name" in ok.columns:
            ok[SCHED] = ok["scheduler.name"].astype(str)
            if "scheduler.params" in ok.columns:  # one scheduler under several parameter sets
                params = ok["scheduler.params"].fillna("").astype(str)
                ok[SCHED] = [n if p in ("", "{}") else f"{n} {p}" for n, p in zip(ok[SCHED], params)]
        else:
            ok[SCHED] = [self._scheduler_of(pid) for pid in ok["point_id"]]
        self.ok = ok.reset_index(drop=True)
        self.numeric: list[str] = []
        self.facets: list[str] = []
        for c in self.swept:
            if c in (SEED, "scheduler.name", "scheduler.params"):
                continue
            col = ok[c]
            if pd.api.types.is_bool_dtype(col) or not pd.api.types.is_numeric_dtype(col):
                if col.astype(str).nunique() > 1:
                    self.facets.append(c)
                    self.ok[c] = col.astype(str)
            elif col.dropna().nunique() > 1:
                self.numeric.append(c)
        self.facets = self._shortest_labels(self.facets)
        self.schedulers = scheduler_order(self.ok[SCHED])
        self.device_types = self._device_types()
        self.deadline_ms = self._deadline_ms()

    def _shortest_labels(self, facets: list[str]) -> list[str]:
        """Of facet columns that determine each other (a zip of a label and a long
        value, e.g. ``name`` with ``cluster.devices``), keep the one with the
        shortest text, so panel titles stay readable."""
        keep: list[str] = []
        for c in facets:
            twin = next((k for k in keep
                         if self.ok.groupby(k)[c].nunique().max() == 1
                         and self.ok.groupby(c)[k].nunique().max() == 1), None)
            if twin is None:
                keep.append(c)
            elif self.ok[c].str.len().mean() < self.ok[twin].str.len().mean():
                keep[keep.index(twin)] = c
        return keep

    def run_dir(self, point_id: str) -> Path:
        return self.dir / "runs" / str(point_id)

    def _device_types(self) -> dict[int, str]:
        """Device group index -> type, from a run's config.json, where every point has the
        same (no swept ``cluster.devices`` or group type); for axis labels."""
        if any(c == "cluster.devices" or (c.startswith("cluster.devices[") and c.endswith("].type"))
               for c in self.swept) or self.ok.empty:
            return {}
        try:
            cfg = json.loads((self.run_dir(self.ok["point_id"].iloc[0]) / "config.json").read_text())
            return {i: str(d["type"]) for i, d in enumerate(cfg["cluster"]["devices"])}
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    def _deadline_ms(self) -> float | None:
        """A robotics sweep's frame deadline (ms) when every point has the same one (not
        swept, nor the frame rate it defaults from), from a run's config.json; else None."""
        if self.kind != "dag" or self.ok.empty or {"deadline_ms", "frame_rate_hz"} & set(self.swept):
            return None
        try:
            cfg = json.loads((self.run_dir(self.ok["point_id"].iloc[0]) / "config.json").read_text())
            return float(cfg["deadline_ms"] if cfg.get("deadline_ms") is not None else 1e3 / cfg["frame_rate_hz"])
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
            return None

    def label(self, field: str) -> str:
        """The axis label, with its unit, of a swept field (:func:`figstyle.field_label`)."""
        return field_label(field, self.device_types)

    def _scheduler_of(self, point_id: str) -> str:
        """The scheduler of a point from its summary.json, else its config.json."""
        run = self.run_dir(point_id)
        for name, get in (("summary.json", lambda d: d["scheduler"]),
                          ("config.json", lambda d: d["scheduler"]["name"])):
            try:
                return str(get(json.loads((run / name).read_text())))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        return "unknown"

    def facet_groups(self, df: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
        """(panel title, rows) per combination of the facet columns; one untitled group without any."""
        if not self.facets:
            return [("", df)]
        out = []
        for key, g in df.groupby(self.facets, sort=True):
            key = key if isinstance(key, tuple) else (key,)
            title = " · ".join(str(k) for k in key)
            out.append((title if len(title) <= 48 else title[:45] + "...", g))
        return out

    def representative(self, df: pd.DataFrame, keep: Sequence[str] = (),
                       one_seed: bool = False) -> tuple[pd.DataFrame, str]:
        """Rows at the median value of every numeric swept field not in ``keep``
        (the lower median, so an actual swept value), and at the lowest seed when
        ``one_seed``; with a description such as ``bandwidth_gbps=10``."""
        parts = []
        for c in self.numeric:
            if c in keep:
                continue
            vals = sorted(df[c].dropna().unique())
            if len(vals) > 1:
                med = vals[(len(vals) - 1) // 2]
                df = df[df[c] == med]
                parts.append(f"{c.rsplit('.', 1)[-1]}={_fmt_value(med)}")
        if one_seed and SEED in df.columns and df[SEED].nunique() > 1:
            s = df[SEED].min()
            df = df[df[SEED] == s]
            parts.append(f"seed={_fmt_value(s)}")
        return df, ", ".join(parts)


def load_sweep(sweep_dir: str | Path) -> Sweep:
    """Read ``sweep_dir/results.csv``; see ``Sweep``."""
    return Sweep(Path(sweep_dir))


def _mean_sd(df: pd.DataFrame, by: list[str], y: str) -> pd.DataFrame:
    """Mean, sample standard deviation (0 for one value) and count of ``y`` per group."""
    g = df.dropna(subset=[y]).groupby(by, sort=True)[y]
    out = g.agg(["mean", "std", "count"]).reset_index()
    out["std"] = out["std"].fillna(0.0)
    return out


# ---------------------------------------------------------------- figure helpers
def _title(sweep: Sweep, what: str, detail: str = "") -> str:
    t = f"{sweep.dir.resolve().name}: {what}"
    notes = [detail] if detail else []
    if sweep.n_error:
        notes.append(f"{sweep.n_error} error point{'s' if sweep.n_error != 1 else ''} excluded")
    return t + ("\n" + "; ".join(notes) if notes else "")


def _suptitle(fig: Any, text: str) -> None:
    """A figure title, each line wrapped to the figure's width."""
    import textwrap

    width = max(40, int(fig.get_figwidth() * 10))
    lines = [w for line in text.split("\n") for w in (textwrap.wrap(line, width) or [""])]
    fig.suptitle("\n".join(lines))


def _style(ax: Any) -> None:
    ax.grid(alpha=0.3)
    ax.set_axisbelow(True)
    ax.spines[["top", "right"]].set_visible(False)


def _spread(values: Any) -> float:
    v = [float(x) for x in values if x is not None and math.isfinite(float(x)) and float(x) > 0]
    return max(v) / min(v) if v else 1.0


def _plain_log_ticks(axis: Any) -> None:
    axis.set_major_formatter(FuncFormatter(lambda x, _pos: _fmt_value(float(f"{x:.6g}"))))


def _sched_handles(scheds: Sequence[str], marker: str | None = None) -> list[Any]:
    """Legend entries: each scheduler's colour, and its marker unless ``marker`` is given."""
    from matplotlib.lines import Line2D

    return [Line2D([], [], color=scheduler_color(s), marker=scheduler_marker(s) if marker is None else marker,
                   linestyle="-", label=s) for s in scheds]


def _layered(k: int) -> dict[str, float]:
    """Line width and marker size of the k-th scheduler drawn: each a little thinner than
    the one before, so that a line drawn over an identical one leaves it visible."""
    return {"lw": max(1.2, 3.0 - 0.6 * k), "ms": max(4.0, 9.0 - 1.5 * k)}


def _reference(ax: Any, xs: Any, ys: Any, label: str) -> None:
    """A dashed black reference line through (xs, ys), its label written on it at the right."""
    ax.plot(xs, ys, color="black", lw=1.0, ls="--", zorder=1.5)
    ax.annotate(label, (xs[-1], ys[-1]), xytext=(-4, 4), textcoords="offset points", ha="right",
                va="bottom", fontsize=8, color="black")


def _tick(x: float) -> str:
    """A tick label: plain decimals, 3 significant digits, no trailing zeros (0.015, 1,000)."""
    s = _num(x)
    return s.rstrip("0").rstrip(".") if "." in s else s


def _legend(fig: Any, handles: list[Any], title: str) -> None:
    """The legend right of the panels, vertically centred (clear of the suptitle)."""
    fig.legend(handles=handles, title=title, loc="outside right center", frameon=False)


def _plain_axis(axis: Any, log: bool = False) -> None:
    """Plain decimal tick labels with 3 significant digits and at most 6 ticks (no 1e-05
    offset); on a log axis, ticks at 1, 2 and 5 times each power of ten (a span shorter
    than a decade would otherwise show one labelled tick, or none)."""
    from matplotlib.ticker import LogLocator, MaxNLocator

    if log:
        axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    else:
        axis.set_major_locator(MaxNLocator(nbins=5))
    axis.set_major_formatter(FuncFormatter(lambda x, _pos: _tick(x)))
    if log:
        axis.set_minor_formatter(FuncFormatter(lambda *_: ""))


def save_png_svg(fig: Any, out_dir: Path, stem: str) -> list[Path]:
    """Write ``fig`` as ``out_dir/stem.png`` and ``.svg`` (atomically); close it."""
    paths = [out_dir / f"{stem}.png", out_dir / f"{stem}.svg"]
    save_figure(fig, paths[0], dpi=_DPI, close=False)
    save_figure(fig, paths[1])
    return paths


def _panels(n: int, n_rows: int = 1, w: float = 5.2, h: float = 3.8) -> tuple[Any, Any]:
    fig, axes = plt.subplots(n_rows, n, figsize=(max(6.4, 0.8 + n * w), 1.3 + n_rows * h),
                             squeeze=False, layout="constrained")
    return fig, axes


# ----------------------------------------------------------------- 1. Pareto
def _fig_throughput_vs_cost(sweep: Sweep) -> Any:
    df = sweep.ok.dropna(subset=["throughput_sps", "cost_usd"])
    if df.empty:
        return "no ok row has both throughput_sps and cost_usd"
    groups = sweep.facet_groups(df)
    fig, axes = _panels(len(groups))
    for ax, (name, g) in zip(axes[0], groups):
        for s in sweep.schedulers:
            gs = g[g[SCHED] == s]
            if not gs.empty:
                ax.scatter(gs["cost_usd"], gs["throughput_sps"], s=36, color=scheduler_color(s),
                           alpha=0.85, zorder=3, label=s)
        idx = pareto_front(g["throughput_sps"].tolist(), g["cost_usd"].tolist())
        fr = g.iloc[idx]
        ax.step(fr["cost_usd"], fr["throughput_sps"], where="post", color="black", lw=1.2,
                ls="--", zorder=2)
        ax.scatter(fr["cost_usd"], fr["throughput_sps"], s=110, facecolors="none",
                   edgecolors="black", linewidths=1.4, zorder=4)
        for axis, col in ((ax.xaxis, "cost_usd"), (ax.yaxis, "throughput_sps")):
            log = _spread(g[col]) > 30
            if log:
                (ax.set_xscale if axis is ax.xaxis else ax.set_yscale)("log")
            _plain_axis(axis, log)
        _annotate_front(ax, fr, [c for c in sweep.numeric])
        ax.set_xlabel(metric_label("cost_usd"))
        ax.set_ylabel(metric_label("throughput_sps"))
        if name:
            ax.set_title(name, fontweight="bold")
        _style(ax)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=scheduler_color(s), marker="o", ls="none", label=s)
               for s in sweep.schedulers]
    handles.append(Line2D([], [], color="black", ls="--", marker="o", mfc="none", ms=9,
                          label="Pareto front\n(max throughput,\nmin cost)"))
    _legend(fig, handles, "scheduler")
    _suptitle(fig, _title(sweep, "throughput vs cost of every run",
                        "upper left is better; one dot per point"))
    return fig


def _annotate_front(ax: Any, front: pd.DataFrame, fields: Sequence[str]) -> None:
    """Label each distinct front point with its swept numeric values (``a=1/2`` when
    several points share the spot); none when there are more than 8 spots."""
    if not fields:
        return
    spots = list(front.groupby(["cost_usd", "throughput_sps"], sort=False))
    if len(spots) > 8:
        return
    ax.get_xlim(), ax.get_ylim()  # settle the autoscaled limits before converting
    to_axes = ax.transData + ax.transAxes.inverted()
    for (c, t), g in spots:
        label = ", ".join(f"{f.rsplit('.', 1)[-1]}=" + "/".join(_fmt_value(v) for v in dict.fromkeys(g[f]))
                          for f in fields)
        right = to_axes.transform((c, t))[0] > 0.6  # near the right edge: write to the left
        ax.annotate(label, (c, t), xytext=(-8 if right else 8, -6), textcoords="offset points",
                    fontsize=8, va="top", ha="right" if right else "left", color="#333333")


# ------------------------------------------------- 2 and 7. metric vs swept field
def _fig_lines(sweep: Sweep, x: str, metrics: Sequence[str], what: str) -> Any:
    df = sweep.ok.copy()
    df[x] = pd.to_numeric(df[x], errors="coerce")
    n_nan = int(df[x].isna().sum())
    df = df.dropna(subset=[x])
    df, fixed = sweep.representative(df, keep=[x])
    metrics = [m for m in metrics if m in df.columns and df[m].notna().any()]
    if df.empty or not metrics:
        return f"no ok row has a value for {x} and {', '.join(metrics) or 'the metrics'}"
    groups = sweep.facet_groups(df)
    fig, axes = _panels(len(groups), len(metrics), h=3.0 if len(metrics) > 1 else 3.8)
    seeds = 1
    for c, (name, g) in enumerate(groups):
        xs_all = sorted(g[x].unique())
        for r, m in enumerate(metrics):
            ax = axes[r][c]
            for k, s in enumerate(sweep.schedulers):
                gs = g[g[SCHED] == s]
                if gs.empty:
                    continue
                a = _mean_sd(gs, [x], m)
                if a.empty:
                    continue
                seeds = max(seeds, int(a["count"].max()))
                yerr = a["std"] if (a["count"] > 1).any() else None
                ax.errorbar(a[x], a["mean"], yerr=yerr, color=scheduler_color(s), marker=scheduler_marker(s),
                            capsize=3, label=s, **_layered(k))
            if m == "plan_frame_ms" and x == "deadline_ms":
                _reference(ax, xs_all, xs_all, "deadline")
            elif m == "plan_frame_ms" and sweep.deadline_ms is not None:
                _reference(ax, [xs_all[0], xs_all[-1]], [sweep.deadline_ms] * 2,
                           f"deadline {_fmt_value(sweep.deadline_ms)} ms")
            if _spread(xs_all) >= 20:
                ax.set_xscale("log")
                _plain_log_ticks(ax.xaxis)
                ax.xaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
            if len(xs_all) <= 8:
                ax.set_xticks(xs_all, [_fmt_value(float(v)) for v in xs_all])
            log = _spread(g[m]) > 30
            if log:
                ax.set_yscale("log")
            _plain_axis(ax.yaxis, log)
            ax.set_ylabel(metric_label(m))
            if r == len(metrics) - 1:
                ax.set_xlabel(sweep.label(x))
            if r == 0 and name:
                ax.set_title(name, fontweight="bold")
            _style(ax)
    notes = []
    if seeds > 1:
        notes.append(f"mean over up to {seeds} seeds, error bars ±1 sd")
    if fixed:
        notes.append(f"at {fixed}")
    if n_nan:
        notes.append(f"{n_nan} run{'s' if n_nan != 1 else ''} without a value of {x.rsplit('.', 1)[-1]} left out")
    _legend(fig, _sched_handles(sweep.schedulers), "scheduler")
    _suptitle(fig, _title(sweep, what, "; ".join(notes)))
    return fig


# -------------------------------------------------------- 3. time to target
def _fig_time_to_target(sweep: Sweep) -> Any:
    df = sweep.ok.dropna(subset=["time_to_target_s"]) if "time_to_target_s" in sweep.ok else sweep.ok[:0]
    if df.empty:
        return "time_to_target_s is empty in every ok row"
    df, fixed = sweep.representative(df)
    groups = sweep.facet_groups(df)
    fig, axes = _panels(len(groups), w=max(3.2, 0.8 * len(sweep.schedulers) + 1.4))
    seeds = 1
    for ax, (name, g) in zip(axes[0], groups):
        a = _mean_sd(g, [SCHED], "time_to_target_s").set_index(SCHED)
        scheds = [s for s in sweep.schedulers if s in a.index]
        seeds = max(seeds, int(a["count"].max()))
        means = [a.loc[s, "mean"] for s in scheds]
        errs = [a.loc[s, "std"] for s in scheds] if (a["count"] > 1).any() else None
        bars = ax.bar(range(len(scheds)), means, 0.7, yerr=errs, capsize=4,
                      color=[scheduler_color(s) for s in scheds])
        ax.bar_label(bars, labels=[_num(v) for v in means], fontsize=8, padding=2,
                     label_type="center")
        ax.set_xticks(range(len(scheds)), scheds, rotation=30 if len(scheds) > 3 else 0,
                      ha="right" if len(scheds) > 3 else "center")
        ax.set_ylabel(metric_label("time_to_target_s"))
        ax.set_xlabel("scheduler")
        if name:
            ax.set_title(name, fontweight="bold")
        _style(ax)
        ax.grid(axis="x", visible=False)
    notes = [f"mean over up to {seeds} seeds, error bars ±1 sd"] if seeds > 1 else []
    if fixed:
        notes.append(f"at {fixed}")
    _legend(fig, [Patch(color=scheduler_color(s), label=s) for s in sweep.schedulers], "scheduler")
    _suptitle(fig, _title(sweep, "time to target loss", "; ".join(notes)))
    return fig


# -------------------------------------------------------- 4. loss vs wall time
def loss_curves(run_dirs: Sequence[Path]) -> dict[Path, pd.DataFrame]:
    """Per run folder whose iterations.csv has a ``loss`` column: its
    (``time_s``: simulated wall time at the end of each iteration, ``loss``)
    rows. ``end_s`` is the wall time; without it, the running sum of ``time_s``."""
    out: dict[Path, pd.DataFrame] = {}
    for d in run_dirs:
        p = Path(d) / "iterations.csv"
        try:
            with p.open() as f:
                header = f.readline().strip().split(",")
        except OSError:
            continue
        if "loss" not in header:
            continue
        it = pd.read_csv(p)
        if "end_s" in it.columns:
            t = it["end_s"]
        elif "time_s" in it.columns:
            t = it["time_s"].cumsum()
        else:
            continue
        curve = pd.DataFrame({"time_s": pd.to_numeric(t, errors="coerce"),
                              "loss": pd.to_numeric(it["loss"], errors="coerce")}).dropna()
        if not curve.empty:
            out[Path(d)] = curve
    return out


def loss_panel(ax: Any, curves: Sequence[tuple[str, pd.DataFrame]]) -> None:
    """One line per (scheduler, :func:`loss_curves` curve), in the scheduler's colour."""
    losses = []
    for sched, c in curves:
        losses.extend(c["loss"].tolist())
        ax.plot(c["time_s"], c["loss"], color=scheduler_color(sched), lw=1.4, alpha=0.8 if len(curves) > 4 else 1.0)
    if _spread(losses) > 20:
        ax.set_yscale("log")
    ax.set_xlabel("simulated wall time (s)")
    ax.set_ylabel("training loss")


def _fig_loss(sweep: Sweep) -> Any:
    curves = loss_curves([sweep.run_dir(p) for p in sweep.ok["point_id"]])
    if not curves:
        return "no run's iterations.csv has a loss column"
    df = sweep.ok[[sweep.run_dir(p) in curves for p in sweep.ok["point_id"]]]
    detail = "one line per run"
    if len(df) > MAX_LOSS_RUNS:
        df, fixed = sweep.representative(df)
        detail += f" at {fixed}" if fixed else ""
    groups = sweep.facet_groups(df)
    fig, axes = _panels(len(groups))
    for ax, (name, g) in zip(axes[0], groups):
        loss_panel(ax, [(row[SCHED], curves[sweep.run_dir(row["point_id"])]) for _, row in g.iterrows()])
        if name:
            ax.set_title(name, fontweight="bold")
        _style(ax)
    scheds = [s for s in sweep.schedulers if s in set(df[SCHED])]
    _legend(fig, _sched_handles(scheds, marker=""), "scheduler")
    _suptitle(fig, _title(sweep, "loss vs wall time", detail))
    return fig


# --------------------------------------------------- 5. utilization heat map
def utilization_matrix(run_dirs: Sequence[Path], labels: Sequence[str] | None = None
                       ) -> tuple[list[str], list[str], np.ndarray]:
    """(row labels, device ids, values): ``utilization`` of each run's summary.json.

    One row per run folder (label: ``labels[i]``, default the folder name), one
    column per device id in order of first appearance, workers before PS
    shards (``ps:*``). A device a run does not use (not in its plan) is NaN.
    Runs without a readable summary.json or without ``utilization`` are left out.
    """
    rows: list[tuple[str, dict[str, float]]] = []
    for i, d in enumerate(run_dirs):
        try:
            util = json.loads((Path(d) / "summary.json").read_text())["utilization"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if not isinstance(util, dict) or not util:
            continue
        rows.append((labels[i] if labels is not None else Path(d).name, util))
    devices = list(dict.fromkeys(k for _, u in rows for k in u))
    devices = [k for k in devices if not k.startswith("ps:")] + [k for k in devices if k.startswith("ps:")]
    values = np.full((len(rows), len(devices)), np.nan)
    for r, (_, u) in enumerate(rows):
        for c, dev in enumerate(devices):
            if dev in u and u[dev] is not None:
                values[r, c] = float(u[dev])
    return [lab for lab, _ in rows], devices, values


def _fig_utilization(sweep: Sweep) -> Any:
    df = sweep.ok
    detail = "one row per run"
    if len(df) > MAX_ROWS:
        df, fixed = sweep.representative(df, one_seed=True)
        # still too many (e.g. many categorical values): first run per scheduler and panel
        df = df.groupby([*sweep.facets, SCHED], sort=False).head(1)
        detail = "one run per scheduler" + (f" at {fixed}" if fixed else "")
    order = {s: i for i, s in enumerate(sweep.schedulers)}
    facet_order = [{v: i for i, v in enumerate(dict.fromkeys(sweep.ok[f]))} for f in sweep.facets]
    df = df.assign(_o=df[SCHED].map(order),
                   **{f"_f{i}": df[f].map(o) for i, (f, o) in enumerate(zip(sweep.facets, facet_order))})
    df = df.sort_values([*(f"_f{i}" for i in range(len(sweep.facets))), "_o"], kind="stable")
    labels = []
    for _, row in df.iterrows():
        parts = [str(row[f]) for f in sweep.facets] + [row[SCHED]]
        if len(sweep.ok) <= MAX_ROWS:
            parts = [str(row["point_id"])] + parts + [
                f"{c.rsplit('.', 1)[-1]}={_fmt_value(row[c])}" for c in sweep.numeric]
            if SEED in df.columns and sweep.ok[SEED].nunique() > 1:
                parts.append(f"seed={_fmt_value(row[SEED])}")
        labels.append(" · ".join(parts))
    names, devices, values = utilization_matrix([sweep.run_dir(p) for p in df["point_id"]], labels)
    if not names:
        return "no run has a summary.json with utilization"
    fig = utilization_heatmap(names, devices, values, dict(zip(labels, df[SCHED])))
    note = detail + ("; – : device not in the run's plan" if np.isnan(values).any() else "")
    _suptitle(fig, _title(sweep, "per-device utilization", note))
    return fig


def utilization_heatmap(names: Sequence[str], devices: Sequence[str], values: np.ndarray,
                        scheds: dict[str, str]) -> Any:
    """The heat map of :func:`utilization_matrix`'s output: one row per run (its label in
    its scheduler's colour, ``scheds``: label -> scheduler), one column per device."""
    fig, ax = plt.subplots(figsize=(max(6.4, 2.6 + 0.75 * len(devices) + 0.06 * max(map(len, names))),
                                    max(3.8, 1.9 + 0.42 * len(names))), layout="constrained")
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#dddddd")
    im = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
    if values.size <= 400:
        for (r, c), v in np.ndenumerate(values):
            ax.text(c, r, "–" if math.isnan(v) else f"{v:.2f}", ha="center", va="center", fontsize=8,
                    color="black" if math.isnan(v) or v > 0.6 else "white")
    ax.set_xticks(range(len(devices)), devices, rotation=35 if len(devices) > 5 else 0,
                  ha="right" if len(devices) > 5 else "center")
    ax.set_yticks(range(len(names)), names)
    for lab in ax.get_yticklabels():
        lab.set_color(scheduler_color(scheds.get(lab.get_text(), "")))
        lab.set_fontweight("bold")
    ax.set_xlabel("device (workers, then PS shards)")
    ax.set_ylabel("run (label colour: scheduler)")
    ax.set_xticks(np.arange(len(devices) + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(len(names) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", lw=1.5)
    ax.tick_params(which="minor", length=0)
    fig.colorbar(im, ax=ax, label="utilization (busy time / elapsed)", shrink=0.9)
    return fig


# ------------------------------------------------------------------- 6. Gantt
_GANTT_COLORS = {
    "fwd": "#9ecae1", "bwd": "#2171b5",
    "pull": "#fd8d3c", "push": "#a63603",
    "agg": "#74c476", "agg+apply": "#238b45", "apply": "#00441b",
}
_GANTT_OTHER = "#969696"


class GanttBar:
    """One bar: ``row`` (a device id), ``kind`` (compute | network | ps),
    ``category`` (fwd, bwd, pull, push, agg, ...), start and duration in ms;
    ``tid`` is the trace thread (the worker or shard index), which orders the rows."""

    __slots__ = ("row", "kind", "category", "name", "start_ms", "dur_ms", "tid")

    def __init__(self, row: str, kind: str, name: str, start_ms: float, dur_ms: float,
                 tid: int = 0) -> None:
        self.row, self.kind, self.name, self.tid = row, kind, name, tid
        self.category = name.split(" ", 1)[0]
        self.start_ms, self.dur_ms = start_ms, dur_ms

    def __repr__(self) -> str:
        return f"GanttBar({self.row!r}, {self.kind!r}, {self.name!r}, {self.start_ms:g}, {self.dur_ms:g})"


def gantt_bars(events: Sequence[dict[str, Any]], until_ms: float | None = None) -> list[GanttBar]:
    """The bars of a hetsim Chrome trace: one per complete event ('X') on the
    workers and ps tracks, one per async 'b'/'e' pair on the network track (on
    its worker's row). Bars that start at or after ``until_ms`` are dropped,
    and those that run past it are cut there."""
    procs: dict[Any, str] = {}
    threads: dict[tuple[Any, Any], str] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            procs[e.get("pid")] = str(e.get("args", {}).get("name"))
        elif e.get("ph") == "M" and e.get("name") == "thread_name":
            threads[(e.get("pid"), e.get("tid"))] = str(e.get("args", {}).get("name"))
    default_procs: dict[Any, str] = {0: "workers", 1: "network", 2: "ps"}

    def where(e: dict[str, Any]) -> tuple[str, str, int]:
        pid, tid = e.get("pid"), e.get("tid")
        proc = procs.get(pid, default_procs.get(pid, str(pid)))
        return proc, threads.get((pid, tid), f"{proc} {tid}"), int(tid or 0)

    bars: list[GanttBar] = []
    open_: dict[tuple[Any, Any, Any], float] = {}
    for e in events:
        ph = e.get("ph")
        if ph == "X":
            proc, row, tid = where(e)
            kind = "ps" if proc == "ps" else "compute"
            bars.append(GanttBar(row, kind, str(e.get("name", "")), float(e["ts"]) / 1e3,
                                 float(e.get("dur", 0.0)) / 1e3, tid))
        elif ph == "b":
            open_[(e.get("cat"), e.get("id"), e.get("pid"))] = float(e["ts"])
        elif ph == "e":
            t0 = open_.pop((e.get("cat"), e.get("id"), e.get("pid")), None)
            if t0 is not None:
                _, row, tid = where(e)
                bars.append(GanttBar(row, "network", str(e.get("name", "")), t0 / 1e3,
                                     (float(e["ts"]) - t0) / 1e3, tid))
    if until_ms is not None:
        bars = [b for b in bars if b.start_ms < until_ms]
        for b in bars:
            b.dur_ms = min(b.dur_ms, until_ms - b.start_ms)
    return bars


def _gantt_window(trace_path: Path, events: Sequence[dict[str, Any]],
                  iterations: int) -> tuple[float | None, int | None]:
    """(end of the first ``iterations`` iterations in ms or None for all, total iterations)."""
    it_csv = trace_path.parent / "iterations.csv"
    if it_csv.exists():
        try:
            ends = pd.read_csv(it_csv)["end_s"].tolist()
        except (OSError, ValueError, KeyError):
            ends = []
        if ends:
            return (float(ends[iterations - 1]) * 1e3 if len(ends) > iterations else None), len(ends)
    # no iterations.csv: count the forward passes of the first worker
    first = min((e.get("tid", 0) for e in events if e.get("ph") == "X" and e.get("pid") == 0), default=None)
    starts = sorted(float(e["ts"]) for e in events if e.get("ph") == "X" and e.get("pid") == 0
                    and e.get("tid") == first and str(e.get("name")) in ("fwd", "fwd g0"))
    if len(starts) > iterations:
        return starts[iterations] / 1e3, len(starts)
    return None, (len(starts) or None)


def gantt_figure(events: Sequence[dict[str, Any]], title: str = "",
                 until_ms: float | None = None) -> Any:
    """A Gantt chart of a trace's events: one row per worker (compute bars;
    network messages as thin bars under them), then one per PS shard."""
    from matplotlib.lines import Line2D

    bars = gantt_bars(events, until_ms)
    if not bars:
        raise ValueError("the trace has no timeline events (the analytic evaluator records none)")
    # rows in trace-thread order (the inventory order of workers, then shards)
    workers = list(dict.fromkeys(b.row for b in sorted(bars, key=lambda b: b.tid) if b.kind != "ps"))
    shards = list(dict.fromkeys(b.row for b in sorted(bars, key=lambda b: b.tid) if b.kind == "ps"))
    rows = workers + shards
    y = {r: i for i, r in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(11, 1.9 + 0.48 * len(rows)), layout="constrained")
    # (y offset, height) within a row band of height 1 (row i spans i-0.5 .. i+0.5; y grows down)
    geometry = {"compute": (-0.38, 0.5), "ps": (-0.3, 0.6), "network": (0.16, 0.2)}
    # Events the training DES does not name (robotics tasks) get a colour each, in order
    # of appearance; unnamed transfers stay grey.
    extra = [b.category for b in bars if b.kind == "compute" and b.category not in _GANTT_COLORS]
    tab = plt.get_cmap("tab20")
    colors: dict[str, Any] = {**{c: tab(k % 20) for k, c in enumerate(dict.fromkeys(extra))}, **_GANTT_COLORS}
    cats: dict[str, None] = {}
    for (row, kind, cat), group in _group_bars(bars).items():
        off, h = geometry[kind]
        color = colors.get(cat, _GANTT_OTHER) if kind != "network" or cat in _GANTT_COLORS else _GANTT_OTHER
        coll = ax.broken_barh([(b.start_ms, b.dur_ms) for b in group], (y[row] + off, h),
                              facecolors=color,
                              # an edge in the face colour keeps sub-pixel bars (1 ms shard work
                              # on a 1 s axis) visible
                              edgecolor=color, linewidth=0.6)
        coll.set_gid(f"{kind}:{cat}")
        if kind != "network" or cat in _GANTT_COLORS:
            cats[cat] = None
    if shards and workers:
        ax.axhline(len(workers) - 0.5, color="black", lw=0.8)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(0, until_ms if until_ms is not None else max(b.start_ms + b.dur_ms for b in bars))
    ax.set_xlabel("simulated time (ms)")
    ax.set_ylabel("device (workers, then PS shards)" if shards else "device")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    ax.spines[["top", "right"]].set_visible(False)
    labels = {"fwd": "forward", "bwd": "backward", "pull": "pull (network, thin)",
              "push": "push (network, thin)", "agg": "PS aggregate", "agg+apply": "PS aggregate+apply",
              "apply": "PS apply"}
    order = [c for c in _GANTT_COLORS if c in cats] + sorted(c for c in cats if c not in _GANTT_COLORS)
    handles = [Line2D([], [], color=colors.get(c, _GANTT_OTHER), lw=4 if c in ("pull", "push") else 9,
                      label=labels.get(c, c)) for c in order]
    _legend(fig, handles, "event")
    if title:
        _suptitle(fig, title)
    return fig


def _group_bars(bars: Sequence[GanttBar]) -> dict[tuple[str, str, str], list[GanttBar]]:
    out: dict[tuple[str, str, str], list[GanttBar]] = {}
    for b in bars:
        out.setdefault((b.row, b.kind, b.category), []).append(b)
    return out


def gantt_of(trace_path: str | Path, iterations: int, title: str) -> Any:
    """The Gantt figure of a trace.json (see :func:`gantt`); ValueError when it has no events."""
    events = json.loads(Path(trace_path).read_text()).get("traceEvents", [])
    until, total = _gantt_window(Path(trace_path), events, iterations)
    span = (f"first {iterations} of {total} iterations" if until is not None
            else f"all {total} iterations" if total else "whole run")
    return gantt_figure(events, f"{title}\n{span}; time axis in ms" if title else span, until)


def gantt(trace_path: str | Path, out_path: str | Path, iterations: int = GANTT_ITERATIONS,
          title: str | None = None) -> Path:
    """Draw a run's trace.json as a Gantt chart into ``out_path`` (.png, .svg, ...).

    Shows the first ``iterations`` iterations when the run has more (their end
    comes from iterations.csv next to the trace, else from the first worker's
    forward passes). Raises ValueError when the trace has no timeline events.
    """
    trace_path, out_path = Path(trace_path), Path(out_path)
    fig = gantt_of(trace_path, iterations, title if title is not None else f"Gantt chart of {trace_path}")
    return save_figure(fig, out_path, dpi=_DPI)


def _fig_gantt(sweep: Sweep) -> Any:
    cands = sweep.ok.sort_values("throughput_sps", ascending=False, na_position="last")
    for _, row in cands.iterrows():
        p = sweep.run_dir(row["point_id"]) / "trace.json"
        try:
            if p.stat().st_size < 200:  # an empty event list (analytic) is ~50 bytes
                continue
            return gantt_of(p, GANTT_ITERATIONS, f"{sweep.dir.resolve().name}: timeline of point {row['point_id']} "
                              f"({row[SCHED]}), the fastest run with a trace")
        except (OSError, ValueError):
            continue
    return "no run has a trace.json with events"


# ------------------------------------------------- calibration accuracy (bench)
#: op classes of the calibration figure, in legend order, with their colours
_OP_COLOURS = dict(zip(("gemm", "conv", "attention", "elementwise", "embedding"),
                       ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3")))


def calibration_figure(rows: Sequence[dict[str, Any]], out_path: str | Path, title: str = "",
                       layer_target: float = 0.15, iter_target: float = 0.10) -> Path:
    """The leave-one-model-out figure of ``bench.calibration_accuracy``: every held-out
    pass, predicted against measured (log-log; the diagonal and the per-layer target's
    band), and per row the median |per-layer error| and |iteration error| against their
    targets (a row missing either in red). ``rows``: :func:`calibration.accuracy.loo_rows`.
    Writes ``out_path`` (PNG) and returns it."""
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(1, 2, figsize=(13.0, 6.4), layout="constrained",
                             gridspec_kw={"width_ratios": [1.15, 1.0]})
    ax = axes[0]
    lo, hi = math.inf, 0.0
    n = 0
    for op, colour in _OP_COLOURS.items():
        for phase, marker in (("fwd", "o"), ("bwd", "^")):
            pts = [(p["meas_s"], p["pred_s"]) for r in rows for p in r["passes"]
                   if p["op"] == op and p["phase"] == phase and p["pred_s"] > 0]
            if not pts:
                continue
            x, y = (1e6 * np.array(v) for v in zip(*pts, strict=True))
            ax.scatter(x, y, s=9, marker=marker, color=colour, alpha=0.55, linewidths=0)
            lo, hi, n = min(lo, x.min(), y.min()), max(hi, x.max(), y.max()), n + len(pts)
    if n:
        line = np.array([lo / 1.5, hi * 1.5])
        ax.plot(line, line, color="black", lw=0.8)
        for f in (1 + layer_target, 1 - layer_target):
            ax.plot(line, f * line, color="black", lw=0.6, ls="--")
    ax.set(xscale="log", yscale="log", xlabel="measured (us)", ylabel="predicted (us)",
           title=f"{n} layer passes, each of a held-out model\n(dashed: \u00b1{layer_target:.0%})")
    _style(ax)
    handles = [Line2D([], [], color=c, marker="o", ls="", label=op) for op, c in _OP_COLOURS.items()]
    handles += [Line2D([], [], color="grey", marker=m, ls="", label=ph)
                for ph, m in (("forward", "o"), ("backward", "^"))]
    ax.legend(handles=handles, frameon=False, fontsize=8, loc="upper left")

    ax = axes[1]
    labels = [f"{r['model']} @ {r['batch']}" for r in rows][::-1]
    layer = [100 * r["layer_median_abs_err"] for r in rows][::-1]
    whole = [100 * abs(r["iter_err"]) for r in rows][::-1]
    miss = [r["layer_median_abs_err"] > layer_target or abs(r["iter_err"]) > iter_target
            for r in rows][::-1]
    yy = np.arange(len(rows))
    ax.barh(yy + 0.2, layer, height=0.4, color=["#C44E52" if m else "#4C72B0" for m in miss],
            label="median |per-layer error|")
    ax.barh(yy - 0.2, whole, height=0.4, color=["#E8A0A2" if m else "#A6BDDB" for m in miss],
            label="|iteration error|")
    ax.axvline(100 * layer_target, color="black", lw=0.8, ls="--")
    ax.axvline(100 * iter_target, color="black", lw=0.8, ls=":")
    ax.set_yticks(yy, labels, fontsize=8)
    ax.set(xlabel="error (%)", title=f"per held-out row\n(red: misses a target; dashed "
                                     f"{layer_target:.0%}, dotted {iter_target:.0%})")
    ax.legend(frameon=False, fontsize=8, loc="lower right")
    _style(ax)
    if title:
        _suptitle(fig, title)
    return save_figure(fig, out_path, dpi=_DPI)


# --------------------------------------------------------------- plot_sweep
def _short_label(label: str) -> str:
    """An axis label without its unit, for a title ("network bandwidth (Gbit/s)" -> "network bandwidth")."""
    return label.split(" (", 1)[0]


def _stem(field: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in field)


def _plot_dag_sweep(sweep: Sweep, out: Path) -> list[Path]:
    """A robotics sweep: energy per frame, DES deadline misses and frame time against
    each numeric swept field (one line per scheduler, panels per other swept field)."""
    written: list[Path] = []
    if not sweep.numeric:
        print("plot_sweep: skipped metrics_vs_FIELD: no numeric swept column with several values")
    for f in sweep.numeric:
        fig = _fig_lines(sweep, f, list(DAG_METRICS),
                         f"energy, deadline misses and frame time vs {_short_label(sweep.label(f))}")
        if isinstance(fig, str):
            print(f"plot_sweep: skipped metrics_vs_{_stem(f)}: {fig}")
            continue
        written += save_png_svg(fig, out, f"metrics_vs_{_stem(f)}")
    return written


def plot_sweep(sweep_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Draw the figures a sweep folder's data supports; return the files written.

    Reads ``sweep_dir/results.csv`` and ``sweep_dir/runs/POINT_ID/``; writes
    PNG and SVG of each figure into ``out_dir`` (default ``sweep_dir/figures``):

    - ``throughput_vs_cost``: one dot per point, colour per scheduler, the
      Pareto front (max throughput, min cost) as a step line with its points
      outlined;
    - ``cost_vs_throughput_min``: cost against ``objective.throughput_min``
      when that column is swept;
    - ``time_to_target``: bars per scheduler when ``time_to_target_s`` has values;
    - ``loss_vs_wall_time``: when runs' iterations.csv carry a ``loss`` column;
    - ``utilization_heatmap``: per-device utilization, one row per run (a
      representative run per scheduler when there are more than MAX_ROWS);
    - ``gantt``: the timeline of the fastest run that has a trace.json with events;
    - ``metrics_vs_FIELD``: throughput and cost (and time to target when known)
      against each numeric swept field except ``seed`` and
      ``objective.throughput_min`` (dots in FIELD become ``_``).

    Line and bar plots average over seeds (error bars: ±1 sample sd) and hold
    the other numeric swept fields at their median value (said in the title);
    non-numeric swept fields other than ``scheduler.name`` (e.g. ``job.model``)
    get one panel each. Rows whose status is not ``ok`` are left out and
    counted in every title. A figure without data is skipped with one line
    on stdout: ``plot_sweep: skipped NAME: REASON``.
    """
    sweep = load_sweep(sweep_dir)
    out = Path(out_dir) if out_dir is not None else sweep.dir / "figures"
    out.mkdir(parents=True, exist_ok=True)
    if sweep.n_error:
        print(f"plot_sweep: {sweep.n_error} error point{'s' if sweep.n_error != 1 else ''} "
              "excluded from the figures")
    if sweep.ok.empty:
        print("plot_sweep: skipped every figure: no ok row in results.csv")
        return []
    if sweep.kind == "dag":
        return _plot_dag_sweep(sweep, out)
    figures: list[tuple[str, Any]] = [("throughput_vs_cost", lambda: _fig_throughput_vs_cost(sweep))]
    if THROUGHPUT_MIN in sweep.numeric:
        figures.append(("cost_vs_throughput_min", lambda: _fig_lines(
            sweep, THROUGHPUT_MIN, ["cost_usd"], f"cost vs the throughput floor ({THROUGHPUT_MIN})")))
    else:
        figures.append(("cost_vs_throughput_min",
                        lambda: f"{THROUGHPUT_MIN} is not a swept numeric column with several values"))
    figures += [("time_to_target", lambda: _fig_time_to_target(sweep)),
                ("loss_vs_wall_time", lambda: _fig_loss(sweep)),
                ("utilization_heatmap", lambda: _fig_utilization(sweep)),
                ("gantt", lambda: _fig_gantt(sweep))]
    fields = [c for c in sweep.numeric if c != THROUGHPUT_MIN]
    metrics = ["throughput_sps", "cost_usd", "time_to_target_s"]
    for f in fields:
        figures.append((f"metrics_vs_{_stem(f)}", lambda f=f: _fig_lines(
            sweep, f, metrics, f"throughput and cost vs {_short_label(sweep.label(f))}")))
    if not fields:
        figures.append(("metrics_vs_FIELD", lambda: "no numeric swept column with several values "
                        f"besides {SEED} and {THROUGHPUT_MIN}"))
    return save_figures(figures, out, "plot_sweep")


def save_figures(makers: Sequence[tuple[str, Any]], out_dir: Path, who: str) -> list[Path]:
    """Make each (stem, maker) figure and write it as ``out_dir/stem.png`` and ``.svg``; a
    maker that returns text (why there is no figure) is skipped with one line on stdout,
    ``WHO: skipped STEM: TEXT``. Returns the files written."""
    written: list[Path] = []
    for name, make in makers:
        fig = make()
        if isinstance(fig, str):
            print(f"{who}: skipped {name}: {fig}")
            continue
        written += save_png_svg(fig, out_dir, name)
    return written
