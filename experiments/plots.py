"""Figures. One colour per scheduler, the same in every figure."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

_PALETTE = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
_KNOWN = ["equal", "proportional", "lbbsp", "hps", "greedy", "genetic", "exact", "rl"]


def scheduler_color(name: str) -> str:
    """A stable colour per scheduler name across every figure."""
    if name in _KNOWN:
        return _PALETTE[_KNOWN.index(name) % len(_PALETTE)]
    return _PALETTE[sum(map(ord, name)) % len(_PALETTE)]


def comparison_chart(rows: Sequence[dict[str, Any]], path: Path, title: str = "") -> None:
    """Two panels: throughput (samples/s) and cost (USD) per scheduler, grouped by model."""
    groups = sorted({r.get("model", "") for r in rows}, key=[r.get("model", "") for r in rows].index)
    scheds = sorted({r["scheduler"] for r in rows}, key=[r["scheduler"] for r in rows].index)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / max(len(scheds), 1)
    for ax, key, label in ((axes[0], "throughput_sps", "throughput (samples/s)"),
                           (axes[1], "cost_usd", "cost of the run (USD)")):
        for i, s in enumerate(scheds):
            xs, ys = [], []
            for g, m in enumerate(groups):
                for r in rows:
                    if r["scheduler"] == s and r.get("model", "") == m:
                        xs.append(g + (i - (len(scheds) - 1) / 2) * width)
                        ys.append(r[key])
            bars = ax.bar(xs, ys, width, label=s, color=scheduler_color(s))
            ax.bar_label(bars, fmt="%.3g", fontsize=8)
        ax.set_xticks(range(len(groups)), [g or "run" for g in groups])
        ax.set_ylabel(label)
        ax.set_title(label.split(" (")[0])
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(title="scheduler")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
