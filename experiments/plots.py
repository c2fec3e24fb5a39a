"""Figures. One colour per scheduler, the same in every figure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

_PALETTE = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
_KNOWN = ["equal", "proportional", "lbbsp", "hps", "greedy", "genetic", "exact", "rl"]

# (row key, y-axis label with unit) of comparison_chart, top to bottom
_COMPARISON_METRICS = (("throughput_sps", "throughput (samples/s)"), ("cost_usd", "cost of the run (USD)"))


def scheduler_color(name: str) -> str:
    """A stable colour per scheduler name across every figure."""
    if name in _KNOWN:
        return _PALETTE[_KNOWN.index(name) % len(_PALETTE)]
    return _PALETTE[sum(map(ord, name)) % len(_PALETTE)]


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


def comparison_chart(rows: Sequence[dict[str, Any]], path: Path, title: str = "") -> None:
    """Throughput (samples/s, top) and cost (USD, bottom) per scheduler, one column per model.

    Each model's panels have their own y-axis: throughputs of different models
    differ by orders of magnitude, and a shared axis would flatten the small
    bars. Rows without a ``model`` key form a single column.
    """
    models = list(dict.fromkeys(r.get("model", "") for r in rows)) or [""]
    scheds = list(dict.fromkeys(r["scheduler"] for r in rows))
    n_rows, n_cols = len(_COMPARISON_METRICS), len(models)
    width = max(4.2, 1.2 + n_cols * max(2.6, 0.75 * len(scheds) + 1.0))
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(width, 6.2), squeeze=False, layout="constrained")
    xs = range(len(scheds))
    for c, model in enumerate(models):
        for r, (key, label) in enumerate(_COMPARISON_METRICS):
            ax = axes[r][c]
            by_sched = {row["scheduler"]: _value(row, key) for row in rows if row.get("model", "") == model}
            ys = [by_sched.get(s, math.nan) for s in scheds]
            bars = ax.bar(xs, [0.0 if math.isnan(y) else y for y in ys], 0.7,
                          color=[scheduler_color(s) for s in scheds])
            ax.bar_label(bars, labels=["n/a" if math.isnan(y) else _num(y) for y in ys], fontsize=8,
                         padding=2)
            ax.set_ylim(0, max([y for y in ys if not math.isnan(y)] + [0.0]) * 1.18 or 1.0)
            _plain_ticks(ax)
            ax.set_xticks(list(xs), scheds, rotation=30 if len(scheds) > 3 else 0,
                          ha="right" if len(scheds) > 3 else "center", fontsize=8)
            ax.grid(axis="y", alpha=0.3)
            ax.set_axisbelow(True)
            ax.spines[["top", "right"]].set_visible(False)
            if c == 0:
                ax.set_ylabel(label)
            if r == 0 and model:
                ax.set_title(model, fontweight="bold")
    handles = [Patch(color=scheduler_color(s), label=s) for s in scheds]
    fig.legend(handles=handles, title="scheduler", loc="outside lower center", ncols=min(len(scheds), 8),
               frameon=False)
    if title:
        fig.suptitle(title + ("\n(each model on its own scale)" if n_cols > 1 else ""))
    fig.savefig(path, dpi=110)
    plt.close(fig)
