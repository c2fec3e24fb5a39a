"""`hetsim dag`: a robotics config in, plans + frames DES out, one-line errors on bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from experiments.cli import main

BASE: dict[str, Any] = {
    "name": "t",
    "board": "orin-nano-8",
    "pipeline": {"file": "g.yaml"},
    "frame_rate_hz": 20,
    "deadline_ms": 40,
    "scheduler": {"name": "energy"},
    "des": {"frames": 30, "jitter_cv": 0.1},
    "seed": 3,
}
GRAPH = {"name": "two", "tasks": [{"name": "a", "op": "conv", "flops": 2e9, "bytes": 4e7, "kernels": 20},
                                  {"name": "b", "op": "elementwise", "flops": 1e6, "bytes": 1e6}],
         "edges": [{"src": "a", "dst": "b", "bytes": 1024}]}


def _write(tmp_path: Path, cfg: dict[str, Any], graph: dict[str, Any] | None = GRAPH) -> Path:
    if graph is not None:
        (tmp_path / "g.yaml").write_text(yaml.safe_dump(graph))
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def test_dag_run_writes_every_file_and_is_deterministic(tmp_path: Path) -> None:
    cfg = _write(tmp_path, BASE)
    assert main(["dag", str(cfg), "--schedulers", "heft,energy,milp", "--out", str(tmp_path / "o1")]) == 0
    assert main(["dag", str(cfg), "--schedulers", "heft,energy,milp", "--out", str(tmp_path / "o2")]) == 0
    for s in ("heft", "energy", "milp"):
        d = tmp_path / "o1" / s
        assert {p.name for p in d.iterdir()} == {"plan.json", "summary.json", "frames.csv", "trace.json",
                                                 "gantt.png"}
        a = json.loads((d / "summary.json").read_text())
        b = json.loads((tmp_path / "o2" / s / "summary.json").read_text())
        a.pop("plan_s"), b.pop("plan_s")  # wall-clock planning time
        assert a == b
        assert (d / "frames.csv").read_bytes() == (tmp_path / "o2" / s / "frames.csv").read_bytes()
        assert len((d / "frames.csv").read_text().splitlines()) == 1 + 30
    rows = (tmp_path / "o1" / "comparison.csv").read_text().splitlines()
    assert rows[0].startswith("scheduler,mode,") and len(rows) == 4
    # the exact solver's energy is a lower bound on every plan meeting the deadline
    milp = json.loads((tmp_path / "o1" / "milp" / "summary.json").read_text())
    for s in ("heft", "energy"):
        other = json.loads((tmp_path / "o1" / s / "summary.json").read_text())
        if other["plan_feasible"]:
            assert milp["plan_energy_mj"] <= other["plan_energy_mj"] * (1 + 1e-9)


def test_shipped_robotics_configs_run(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "robotics"
    for cfg in sorted(root.glob("*.yaml")):
        assert main(["dag", str(cfg), "--out", str(tmp_path / cfg.stem)]) == 0, cfg


@pytest.mark.parametrize(("change", "graph", "field"), [
    ({"board": "jetson-tx9"}, GRAPH, "board"),
    ({"modes": ["99w"]}, GRAPH, "modes[0]"),
    ({"frame_rate_hz": 0}, GRAPH, "frame_rate_hz"),
    ({"pipeline": {"name": "nope"}}, GRAPH, "pipeline.name"),
    ({"pipeline": {"name": "perception_slam", "params": {"wings": 2}}}, GRAPH, "pipeline.params"),
    ({"pipeline": {"name": "slam_lite", "file": "g.yaml"}}, GRAPH, "pipeline"),
    ({"colour": "red"}, GRAPH, "colour"),
    ({"scheduler": {"name": "proportional"}}, GRAPH, "scheduler.name"),
    ({}, {**GRAPH, "edges": [{"src": "a", "dst": "zz"}]}, "tasks"),
    ({}, {**GRAPH, "tasks": [{"name": "a", "op": "fft", "flops": 1, "bytes": 1}]}, "tasks"),
    ({}, None, ""),
])
def test_bad_robotics_input_is_one_line_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          change: dict[str, Any], graph: Any, field: str) -> None:
    cfg = _write(tmp_path, {**BASE, **change}, graph)
    assert main(["dag", str(cfg), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("hetsim: error: ")
    assert f": {field}: " in err if field else "g.yaml: file not found" in err


def test_robotics_sweep_runs_points_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path, {**BASE, "des": {"frames": 10}})
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": "c.yaml", "grid": {"deadline_ms": [30, 60],
                                                                "scheduler.name": ["heft", "milp"]}}))
    assert main(["sweep", str(sweep), "--jobs", "1", "--out", str(tmp_path / "sw"), "--quiet"]) == 0
    import pandas as pd

    df = pd.read_csv(tmp_path / "sw" / "results.csv")
    assert list(df.columns[:5]) == ["point_id", "deadline_ms", "scheduler.name", "status", "error"]
    assert (df.status == "ok").all() and len(df) == 4
    assert {"plan_energy_mj", "des_miss_rate", "mode"} <= set(df.columns)
    # the exact solver's energy bounds HEFT's wherever HEFT meets the deadline
    for d, g in df.groupby("deadline_ms"):
        h, m = g[g["scheduler.name"] == "heft"].iloc[0], g[g["scheduler.name"] == "milp"].iloc[0]
        if h.plan_feasible:
            assert m.plan_energy_mj <= h.plan_energy_mj * (1 + 1e-9), d
    run = tmp_path / "sw" / "runs" / df.point_id[0]
    assert {"plan.json", "summary.json", "frames.csv", "config.json", "point.json"} <= {p.name for p in run.iterdir()}
    assert main(["plot", str(tmp_path / "sw")]) == 0
    assert (tmp_path / "sw" / "figures" / "metrics_vs_deadline_ms.png").is_file()


def test_robotics_sweep_refuses_a_training_evaluator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path, BASE)
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"base": "c.yaml", "evaluator": "des", "grid": {"deadline_ms": [30]}}))
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "sw")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ": evaluator: unknown evaluator 'des' for this base config" in err
