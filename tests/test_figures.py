"""Figures a person reads (experiments/figstyle.py, experiments/plot_dirs.py): one fixed
colour per registered scheduler, axis labels with units, ``hetsim plot`` on every kind of
output folder, labelled deadline lines, and the validate plot's label beside its point."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import schedulers
from experiments import plot_dirs, plots, runner
from experiments.cli import main
from experiments.figstyle import (
    SCHEDULER_STYLES,
    field_label,
    metric_label,
    scheduler_color,
    scheduler_marker,
    scheduler_order,
)

DEMO = Path(runner.__file__).parent / "configs" / "demo.yaml"


def pngs_and_svgs(*stems: str) -> set[str]:
    return {f"{s}.{ext}" for s in stems for ext in ("png", "svg")}


def figure_texts(fig: Any) -> list[str]:
    """Every text drawn in a figure (titles, labels, annotations, legend entries)."""
    import matplotlib.text

    return [t.get_text() for t in fig.findobj(matplotlib.text.Text)]


# ---------------------------------------------------------------- colours
def test_every_registered_scheduler_has_its_own_colour_and_marker_pair() -> None:
    # the built-in ones (a plugin a test registered gets a colour of the fallback cycle)
    names = [n for kind in ("training", "dag") for n in schedulers.BUILTIN[kind]]
    assert set(names) == set(SCHEDULER_STYLES)
    assert len({scheduler_color(n) for n in names}) == len(names)  # no two share a colour
    # the pairs the issue found sharing a colour no longer do
    assert scheduler_color("cpu_only") == "#17BECF" and scheduler_color("proportional") == "#FF7F0E"
    assert scheduler_color("genetic") == "#8C564B" and scheduler_color("gpu_only") == "#BCBD22"


def test_colours_are_fixed_by_name_and_variants_get_a_shade_of_their_own() -> None:
    variant = 'energy {"margin": 0.2}'
    assert scheduler_color(variant) == scheduler_color(variant)  # stable (a hash of the name)
    assert scheduler_color(variant) not in {c for c, _ in SCHEDULER_STYLES.values()}
    assert scheduler_marker(variant) != scheduler_marker("energy")
    assert scheduler_color("not-registered") == scheduler_color("not-registered")
    assert scheduler_order(["rl", variant, "zzz", "equal", "energy", "equal"]) == [
        "equal", "rl", "energy", variant, "zzz"]


# ---------------------------------------------------------------- labels
@pytest.mark.parametrize("path,types,label", [
    ("cluster.network.bandwidth_gbps", None, "network bandwidth (Gbit/s)"),
    ("cluster.devices[1].count", {0: "v100", 1: "t4"}, "t4 devices (count)"),
    ("cluster.devices[1].count", None, "devices in group 1 (count)"),
    ("cluster.devices[0].type", None, "device type of group 0"),
    ("cluster.network.overrides.t4", None, "bandwidth of t4 (Gbit/s)"),
    ("job.global_batch", None, "global batch (samples)"),
    ("deadline_ms", None, "frame deadline (ms)"),
    ("des.jitter_cv", None, "execution-time jitter (CV)"),
    ("job.some_new_knob_ms", None, "some new knob (ms) [job.some_new_knob_ms]"),
    ("plain_thing", None, "plain thing"),
])
def test_field_labels_read_as_words_with_units(path: str, types: dict[int, str] | None, label: str) -> None:
    assert field_label(path, types) == label


def test_metric_labels_have_units() -> None:
    assert metric_label("throughput_sps") == "throughput (samples/s)"
    assert metric_label("des_miss_rate") == "deadline misses (DES, fraction)"
    assert metric_label("unknown_metric") == "unknown_metric"


# ---------------------------------------------------------------- hetsim plot on every folder
def _small_config(tmp_path: Path) -> Path:
    """The demo config, 4 iterations."""
    data = yaml.safe_load(DEMO.read_text())
    data["job"]["iterations"] = 4
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    return cfg


def test_plot_a_compare_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _small_config(tmp_path)
    out = tmp_path / "cmp"
    assert main(["compare", str(cfg), "--schedulers", "equal,proportional", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["plot", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "plot: skipped loss_vs_wall_time: no run's iterations.csv has a loss column"
    assert {p.name for p in (out / "figures").iterdir()} == pngs_and_svgs(
        "comparison", "utilization_heatmap", "gantt_equal", "gantt_proportional")
    stems = ["comparison", "utilization_heatmap", "gantt_equal", "gantt_proportional"]
    assert printed[1:] == [f"wrote {out / 'figures' / (s + ext)}" for s in stems for ext in (".png", ".svg")]


def test_plot_a_simulate_folder_des_and_analytic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _small_config(tmp_path)
    for evaluator in ("des", "analytic"):
        out = tmp_path / evaluator
        assert main(["simulate", str(cfg), "--evaluator", evaluator, "--out", str(out)]) == 0
        capsys.readouterr()
        assert main(["plot", str(out), "--out", str(tmp_path / f"fig_{evaluator}")]) == 0
        printed = capsys.readouterr().out
        got = {p.name for p in (tmp_path / f"fig_{evaluator}").iterdir()}
        if evaluator == "des":  # the Gantt chart from trace.json
            assert got == pngs_and_svgs("gantt", "iteration_times", "utilization")
        else:  # no timeline, said in one line, and the rest drawn
            assert got == pngs_and_svgs("iteration_times", "utilization")
            assert (f"plot: skipped gantt: no trace.json in {out} (the analytic evaluator records no "
                    "timeline; --evaluator des does)\n") in printed


def test_plot_a_dag_folder_draws_labelled_deadlines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.test_dag_cli import BASE, _write

    cfg = _write(tmp_path, BASE)
    out = tmp_path / "dag"
    assert main(["dag", str(cfg), "--schedulers", "heft,energy", "--out", str(out)]) == 0
    assert main(["plot", str(out)]) == 0
    assert {p.name for p in (out / "figures").iterdir()} == pngs_and_svgs(
        "comparison", "frame_latency", "gantt_heft", "gantt_energy")
    rows = plot_dirs._rows(out / "comparison.csv")
    fig = plot_dirs.dag_comparison_figure(rows, "t")
    assert "deadline 40 ms" in figure_texts(fig)
    fig = plot_dirs.frame_latency_figure([(r["scheduler"], out / r["scheduler"] / "frames.csv", 5.0) for r in rows],
                                         40.0, "t")
    assert isinstance(fig, plots.plt.Figure) and "deadline 40 ms" in figure_texts(fig)
    plots.plt.close("all")


def _validation(points: list[tuple[str, str, float, float]]) -> list[dict[str, Any]]:
    """validation.json entries: (config, scheduler, sim s, real s)."""
    by: dict[str, dict[str, Any]] = {}
    for config, sched, sim, real in points:
        entry = by.setdefault(config, {"name": config, "info": {"oversubscribed": False}, "schedulers": {}})
        entry["schedulers"][sched] = {"metrics": {"iteration_time_mean_s": {"sim": sim, "real": real}}}
    return list(by.values())


def test_plot_a_validate_folder_and_a_suite_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    one = tmp_path / "one"
    one.mkdir()
    (one / "validation.json").write_text(json.dumps(_validation([("v1", "equal", 0.0299, 0.0286)])[0]))
    assert main(["plot", str(one)]) == 0
    out = capsys.readouterr().out
    assert f"plot: skipped gantt_equal_sim: no trace.json in {one / 'equal' / 'sim'}\n" in out
    assert {p.name for p in (one / "figures").iterdir()} == pngs_and_svgs("sim_vs_real")
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "validation.json").write_text(json.dumps(_validation(
        [(f"v{i}", "equal", 0.01 * i, 0.011 * i) for i in range(1, 6)])))
    assert main(["plot", str(suite)]) == 0
    assert {p.name for p in (suite / "figures").iterdir()} == pngs_and_svgs("sim_vs_real")


def test_plot_refuses_a_folder_hetsim_did_not_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"hetsim: error: {tmp_path}: not a hetsim output folder: it has no results.csv (sweep), "
                   "validation.json (validate), comparison.csv (compare, demo, dag) or summary.json "
                   "(simulate, run)\n")
    assert not (tmp_path / "figures").exists()
    assert main(["plot", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err


# ---------------------------------------------------------------- validate: the label beside its point
def test_the_validate_label_never_covers_its_point() -> None:
    pts = plot_dirs.validation_points(_validation([("v1_mlp_2w_bsp", "equal", 0.0299, 0.0286)]))
    fig = plot_dirs.validation_figure(pts, "t")
    fig.canvas.draw()
    ax = fig.axes[0]
    marker = ax.transData.transform((1e3 * 0.0286, 1e3 * 0.0299))
    anns = [t for t in ax.texts if "v1_mlp_2w_bsp · equal: +4.5%" in t.get_text()]
    assert len(anns) == 1
    import matplotlib.text

    box = matplotlib.text.Text.get_window_extent(anns[0])  # the text's box, not its leader line's
    margin = 8  # the marker's radius in pixels, and then some
    assert not (box.x0 - margin <= marker[0] <= box.x1 + margin and box.y0 - margin <= marker[1] <= box.y1 + margin)
    assert anns[0].get_text() == "v1_mlp_2w_bsp · equal: +4.5%\nsim 29.9 ms, real 28.6 ms"
    plots.plt.close(fig)


def test_a_sweep_figure_draws_the_deadline_as_a_labelled_line(tmp_path: Path) -> None:
    from tests.test_dag_cli import BASE, _write

    _write(tmp_path, {**BASE, "des": {"frames": 10}})
    sw = tmp_path / "s.yaml"
    sw.write_text(yaml.safe_dump({"base": "c.yaml", "grid": {"des.jitter_cv": [0.0, 0.2],
                                                             "scheduler.name": ["heft"]}}))
    assert main(["sweep", str(sw), "--jobs", "1", "--out", str(tmp_path / "sw"), "--quiet"]) == 0
    sweep = plots.load_sweep(tmp_path / "sw")
    assert sweep.deadline_ms == 40.0
    fig = plots._fig_lines(sweep, "des.jitter_cv", list(plots.DAG_METRICS), "t")
    texts = figure_texts(fig)
    assert "deadline 40 ms" in texts and "execution-time jitter (CV)" in texts
    plots.plt.close(fig)
