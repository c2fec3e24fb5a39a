"""Sweep figures (experiments/plots.py): which files plot_sweep writes and skips,
and the pure helpers behind the figures (Pareto front, utilization matrix,
Gantt bars, loss curves) on hand-made inputs.

Sample sweep folders are built here with the real library (runner.run_one on
the demo config), laid out as the sweep engine writes them:
DIR/results.csv plus DIR/runs/POINT_ID/{summary.json, iterations.csv, ...}.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from experiments import plots, runner
from experiments.plots import (
    gantt,
    gantt_bars,
    gantt_figure,
    load_sweep,
    loss_curves,
    pareto_front,
    plot_sweep,
    utilization_matrix,
)
from sim.result import HEADLINE_KEYS

DEMO = Path(runner.__file__).parent / "configs" / "demo.yaml"
BW = "cluster.network.bandwidth_gbps"


def _set(d: dict[str, Any], dotted: str, value: Any) -> None:
    *head, last = dotted.split(".")
    for k in head:
        d = d.setdefault(k, {})
    d[last] = value


def build_sweep(root: Path, points: list[dict[str, Any]], evaluator: str = "des",
                hidden: list[dict[str, Any]] | None = None, iterations: int = 4) -> Path:
    """A sweep folder: one run per point (swept fields: the point's keys; ``hidden``:
    config overrides that are not results.csv columns). A point with ``"_error"``
    becomes an error row with no run folder."""
    base = runner.load(DEMO).config.model_dump(mode="json")
    base["job"]["iterations"] = iterations
    rows = []
    for i, swept in enumerate(points):
        pid = f"p{i:02d}"
        swept = dict(swept)
        error = swept.pop("_error", None)
        row: dict[str, Any] = {"point_id": pid, **swept}
        if error:
            rows.append({**row, "status": "error", "error": error})
            continue
        data = json.loads(json.dumps(base))
        for k, v in {**swept, **((hidden or [{}] * len(points))[i])}.items():
            _set(data, k, v)
        loaded = runner.from_dict(data, DEMO.parent, str(DEMO))
        result, _ = runner.run_one(loaded, evaluator, None, out=root / "runs" / pid)
        rows.append({**row, "status": "ok", "error": "", **result.headline()})
    df = pd.DataFrame(rows)
    swept_cols = [c for c in df.columns if c not in ("point_id", "status", "error", *HEADLINE_KEYS)]
    df = df.reindex(columns=["point_id", *swept_cols, "status", "error", *HEADLINE_KEYS])
    root.mkdir(parents=True, exist_ok=True)
    df.to_csv(root / "results.csv", index=False)
    return root


def pngs_and_svgs(*stems: str) -> set[str]:
    return {f"{s}.{ext}" for s in stems for ext in ("png", "svg")}


@pytest.fixture(scope="module")
def bw_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bandwidth x scheduler x seed on the DES (with traces), plus one error row."""
    points: list[dict[str, Any]] = [
        {BW: bw, "scheduler.name": s, "seed": seed}
        for bw in (1, 10) for s in ("equal", "proportional") for seed in (0, 1)
    ]
    points.append({BW: 5, "scheduler.name": "equal", "seed": 0, "_error": "boom"})
    return build_sweep(tmp_path_factory.mktemp("sweep") / "bw", points)


# ------------------------------------------------------------------ plot_sweep
def test_plot_sweep_writes_supported_figures_and_skips_the_rest(
        bw_sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    written = plot_sweep(bw_sweep)
    out = capsys.readouterr().out.splitlines()
    assert {p.name for p in written} == pngs_and_svgs(
        "throughput_vs_cost", "utilization_heatmap", "gantt", "metrics_vs_cluster_network_bandwidth_gbps")
    assert all(p.parent == bw_sweep / "figures" and p.stat().st_size > 0 for p in written)
    assert out == [
        "plot_sweep: 1 error point excluded from the figures",
        "plot_sweep: skipped cost_vs_throughput_min: objective.throughput_min is not a swept "
        "numeric column with several values",
        "plot_sweep: skipped time_to_target: time_to_target_s is empty in every ok row",
        "plot_sweep: skipped loss_vs_wall_time: no run's iterations.csv has a loss column",
    ]


def test_plot_sweep_with_time_to_target_and_loss(bw_sweep: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    sweep = shutil.copytree(bw_sweep, tmp_path / "ttt")
    df = pd.read_csv(sweep / "results.csv", dtype={"point_id": str, "error": str})
    df["time_to_target_s"] = df["elapsed_s"] * 10
    df.to_csv(sweep / "results.csv", index=False)
    for run in (sweep / "runs").iterdir():
        it = pd.read_csv(run / "iterations.csv")
        it["loss"] = 2.0 / (1 + it["iteration"])
        it.to_csv(run / "iterations.csv", index=False)
    out_dir = tmp_path / "figs"
    written = plot_sweep(sweep, out_dir)
    assert {p.name for p in written} == pngs_and_svgs(
        "throughput_vs_cost", "time_to_target", "loss_vs_wall_time", "utilization_heatmap", "gantt",
        "metrics_vs_cluster_network_bandwidth_gbps")
    assert {p.parent for p in written} == {out_dir}
    assert "skipped" not in capsys.readouterr().out.replace("skipped cost_vs_throughput_min", "")


def test_plot_sweep_scheduler_from_run_files_and_throughput_min(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # scheduler.name is not a column: it comes from summary.json (config.json as fallback);
    # analytic runs have an empty trace, so there is no Gantt chart.
    points = [{"objective.throughput_min": tm, "seed": 0} for tm in (100, 200, 400) for _ in range(2)]
    hidden = [{"scheduler.name": s} for _ in range(3) for s in ("equal", "proportional")]
    sweep = build_sweep(tmp_path / "tm", points, evaluator="analytic", hidden=hidden)
    (sweep / "runs" / "p01" / "summary.json").unlink()  # -> config.json
    loaded = load_sweep(sweep)
    assert loaded.ok[plots.SCHED].tolist() == ["equal", "proportional"] * 3
    assert loaded.numeric == ["objective.throughput_min"] and loaded.facets == []
    written = plot_sweep(sweep)
    out = capsys.readouterr().out
    assert {p.name for p in written} == pngs_and_svgs(
        "throughput_vs_cost", "cost_vs_throughput_min", "utilization_heatmap")
    assert "plot_sweep: skipped gantt: no run has a trace.json with events" in out
    assert ("plot_sweep: skipped metrics_vs_FIELD: no numeric swept column with several values "
            "besides seed and objective.throughput_min") in out


def test_error_rows_are_left_out(bw_sweep: Path, tmp_path: Path) -> None:
    sweep = shutil.copytree(bw_sweep, tmp_path / "err")
    df = pd.read_csv(sweep / "results.csv", dtype={"point_id": str, "error": str})
    # an error row with (bogus) metrics must not show up anywhere
    df.loc[df["status"] == "error", ["throughput_sps", "cost_usd"]] = [1e9, 1e-9]
    df.to_csv(sweep / "results.csv", index=False)
    s = load_sweep(sweep)
    assert s.n_error == 1
    assert s.ok["point_id"].tolist() == [f"p{i:02d}" for i in range(8)]
    fig = plots._fig_throughput_vs_cost(s)
    ax = fig.axes[0]
    ys = np.concatenate([c.get_offsets()[:, 1] for c in ax.collections])
    assert 1e9 not in ys and len(ys) == 8 + len(pareto_front(s.ok["throughput_sps"], s.ok["cost_usd"]))
    assert "1 error point excluded" in fig._suptitle.get_text()
    plots.plt.close(fig)


def test_all_rows_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tmp_path.joinpath("results.csv").write_text(
        "point_id,seed,status,error," + ",".join(HEADLINE_KEYS) + "\n"
        "a,0,error,bad config," + "," * (len(HEADLINE_KEYS) - 1) + "\n")
    assert plot_sweep(tmp_path) == []
    assert capsys.readouterr().out.splitlines() == [
        "plot_sweep: 1 error point excluded from the figures",
        "plot_sweep: skipped every figure: no ok row in results.csv",
    ]


# ----------------------------------------------------------------- pareto_front
def test_pareto_front_hand_made() -> None:
    thr = [10, 20, 20, 5, 30, 30, 25, math.nan, 30]
    cost = [1, 2, 3, 1, 5, 5, 6, 0.1, 7]
    # 0: (10, 1) front: cheapest with the most throughput at cost 1 (3 has less at the same cost)
    # 1: (20, 2) front; 2: (20, 3) dominated by 1 (same throughput, dearer)
    # 4 and 5: (30, 5) exact duplicates, both on the front; 6: (25, 6) and 8: (30, 7) dominated
    # 7: NaN throughput never on the front
    assert pareto_front(thr, cost) == [0, 1, 4, 5]
    assert pareto_front([], []) == []
    assert pareto_front([1.0], [1.0]) == [0]
    # equal throughput, different cost: only the cheaper; equal cost, different throughput: the higher
    assert pareto_front([5, 5, 7], [2, 1, 1]) == [2]
    # a strict trade-off: every point is on the front, sorted by cost
    assert pareto_front([3, 1, 2], [30, 10, 20]) == [1, 2, 0]


# ------------------------------------------------------------ utilization_matrix
def test_utilization_matrix_exact_values(tmp_path: Path) -> None:
    runs = []
    for name, util in (("a", {"v100:0": 0.5, "t4:0": 0.25, "ps:0": 0.125}),
                       ("b", {"ps:0": 0.75, "cpu-8c:0": 1.0, "v100:0": 0.0}),
                       ("c", None)):
        d = tmp_path / name
        d.mkdir()
        if util is not None:
            (d / "summary.json").write_text(json.dumps({"schema": 1, "utilization": util}))
        runs.append(d)
    labels, devices, values = utilization_matrix(runs, ["run a", "run b", "run c"])
    assert labels == ["run a", "run b"]  # c has no summary.json
    assert devices == ["v100:0", "t4:0", "cpu-8c:0", "ps:0"]  # workers first, then shards
    np.testing.assert_array_equal(values, [[0.5, 0.25, np.nan, 0.125], [0.0, np.nan, 1.0, 0.75]])
    assert utilization_matrix(runs[:1])[0] == ["a"]


# ------------------------------------------------------------------------ Gantt
def _trace() -> list[dict[str, Any]]:
    ev: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "workers"}},
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "network"}},
        {"name": "process_name", "ph": "M", "pid": 2, "tid": 0, "args": {"name": "ps"}},
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": 1, "args": {"name": "cpu-8c:0"}},
        {"name": "thread_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "v100:0"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "v100:0"}},
        {"name": "thread_name", "ph": "M", "pid": 2, "tid": 0, "args": {"name": "ps:0"}},
    ]
    for it in range(2):  # two iterations of 10 ms
        t = it * 10_000.0
        for tid in (0, 1):
            ev.append({"name": "fwd", "ph": "X", "pid": 0, "tid": tid, "ts": t + 1000, "dur": 2000})
            ev.append({"name": "bwd", "ph": "X", "pid": 0, "tid": tid, "ts": t + 3000, "dur": 4000})
        ev.append({"name": "pull c0", "cat": "network", "pid": 1, "tid": 0, "id": 2 * it + 1, "ph": "b", "ts": t})
        ev.append({"name": "push c0", "cat": "network", "pid": 1, "tid": 0, "id": 2 * it + 2, "ph": "b",
                   "ts": t + 7000})
        ev.append({"name": "pull c0", "cat": "network", "pid": 1, "tid": 0, "id": 2 * it + 1, "ph": "e",
                   "ts": t + 1000})
        ev.append({"name": "push c0", "cat": "network", "pid": 1, "tid": 0, "id": 2 * it + 2, "ph": "e",
                   "ts": t + 8500})
        ev.append({"name": "agg+apply c0", "ph": "X", "pid": 2, "tid": 0, "ts": t + 8500, "dur": 500})
    return ev


def test_gantt_bars_one_per_event() -> None:
    bars = gantt_bars(_trace())
    kinds = [b.kind for b in bars]
    assert kinds.count("compute") == 8 and kinds.count("network") == 4 and kinds.count("ps") == 2
    push = [b for b in bars if b.category == "push"]
    assert [(b.row, b.start_ms, b.dur_ms) for b in push] == [("v100:0", 7.0, 1.5), ("v100:0", 17.0, 1.5)]
    assert {b.row for b in bars if b.kind == "compute"} == {"v100:0", "cpu-8c:0"}
    # a window: bars starting at or after 8 ms are dropped, longer ones cut at it
    cut = gantt_bars(_trace(), until_ms=8.0)
    assert len(cut) == 4 + 2  # fwd, bwd of both workers; pull; push (7-8.5 ms) cut to 1 ms
    assert [b.dur_ms for b in cut if b.category == "push"] == [1.0]


def test_gantt_figure_draws_one_bar_per_event() -> None:
    fig = gantt_figure(_trace(), "test")
    ax = fig.axes[0]
    n = {}
    for c in ax.collections:
        kind = c.get_gid().split(":")[0]
        n[kind] = n.get(kind, 0) + len(c.get_paths())
    assert n == {"compute": 8, "network": 4, "ps": 1 * 2}
    # rows follow the trace threads: v100:0 (tid 0) before cpu-8c:0 (tid 1), then the shard
    assert [t.get_text() for t in ax.get_yticklabels()] == ["v100:0", "cpu-8c:0", "ps:0"]
    assert ax.get_xlabel() == "simulated time (ms)"
    plots.plt.close(fig)
    with pytest.raises(ValueError, match="no timeline events"):
        gantt_figure([{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "workers"}}])


def test_gantt_on_a_file_shows_the_first_iterations(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"traceEvents": _trace(), "displayTimeUnit": "ms"}))
    out = gantt(trace, tmp_path / "g.png", iterations=1)
    assert out.stat().st_size > 0
    # no iterations.csv: the window ends where the first worker's second fwd starts (11 ms)
    events = json.loads(trace.read_text())["traceEvents"]
    assert plots._gantt_window(trace, events, 1) == (11.0, 2)
    # with an iterations.csv next to the trace, its end_s decides
    (tmp_path / "iterations.csv").write_text(
        "iteration,start_s,end_s,time_s,samples\n0,0.0,0.0095,0.0095,8\n1,0.0095,0.019,0.0095,8\n")
    assert plots._gantt_window(trace, events, 1) == (9.5, 2)
    assert plots._gantt_window(trace, events, 2) == (None, 2)
    gantt(trace, tmp_path / "g.svg")
    assert (tmp_path / "g.svg").read_text().lstrip().startswith("<?xml")


def test_gantt_on_a_real_run(bw_sweep: Path, tmp_path: Path) -> None:
    run = bw_sweep / "runs" / "p02"
    events = json.loads((run / "trace.json").read_text())["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    pairs = [e for e in events if e["ph"] == "b"]
    assert len(gantt_bars(events)) == len(complete) + len(pairs)
    assert gantt(run / "trace.json", tmp_path / "run.png").exists()


# ------------------------------------------------------------------- loss curve
def test_loss_curves_from_iterations_csv(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d in (a, b, c):
        d.mkdir()
    (a / "iterations.csv").write_text(
        "iteration,start_s,end_s,time_s,samples,loss\n0,0,1.5,1.5,8,2.0\n1,1.5,3.0,1.5,8,1.0\n")
    (b / "iterations.csv").write_text("iteration,time_s,loss\n0,2,4\n1,3,3\n")  # no end_s: sum of time_s
    (c / "iterations.csv").write_text("iteration,start_s,end_s,time_s,samples\n0,0,1,1,8\n")
    curves = loss_curves([a, b, c, tmp_path / "missing"])
    assert set(curves) == {a, b}
    assert curves[a].to_dict("list") == {"time_s": [1.5, 3.0], "loss": [2.0, 1.0]}
    assert curves[b].to_dict("list") == {"time_s": [2, 5], "loss": [4, 3]}


def test_loss_figure_plots_one_line_per_run(tmp_path: Path) -> None:
    rows = []
    for i, (sched, seed) in enumerate([("equal", 0), ("proportional", 0), ("proportional", 1)]):
        run = tmp_path / "runs" / f"r{i}"
        run.mkdir(parents=True)
        (run / "iterations.csv").write_text(
            "iteration,start_s,end_s,time_s,samples,loss\n0,0,1,1,8,3\n1,1,2,1,8,2\n2,2,3,1,8,1.5\n")
        rows.append({"point_id": f"r{i}", "scheduler.name": sched, "seed": seed, "status": "ok",
                     "error": "", "throughput_sps": 10.0 + i, "cost_usd": 1.0})
    pd.DataFrame(rows).to_csv(tmp_path / "results.csv", index=False)
    fig = plots._fig_loss(load_sweep(tmp_path))
    ax = fig.axes[0]
    assert len(ax.lines) == 3
    assert [tuple(ln.get_ydata()) for ln in ax.lines] == [(3, 2, 1.5)] * 3
    assert {ln.get_color() for ln in ax.lines} == {plots.scheduler_color("equal"),
                                                   plots.scheduler_color("proportional")}
    assert ax.get_xlabel() == "simulated wall time (s)"
    plots.plt.close(fig)
