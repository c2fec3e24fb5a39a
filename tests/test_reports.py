"""Reports a user can trust (issue 39): every evaluator's throughput window and the plan's
update semantics in comparison tables.

* A pipeline DES run too short for its plan's fill and in-flight depth reports the
  steady-state model's throughput, says so in summary.json (``throughput_window``)
  and warns on stderr; a long enough one measures a window without fill and drain.
* Comparison rows carry the plan kind, the sync mode and the staleness bound, and
  ``compare`` warns once when it ranks plans of different staleness.
* DAG schedulers plan with the frames DES's load and jitter priced in; ``hetsim dag``
  flags a plan whose DES miss rate exceeds the config's tolerance.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from experiments.cli import main
from experiments.plots import _updates_label
from experiments.runner import staleness_warning, update_columns
from sim.config import JobConfig, PeriodicPattern
from sim.dag import dag_costs, planning_costs
from sim.dag_config import load_dag_config
from sim.des.frames import FrameOptions, planning_scale
from sim.des.pipeline import (
    WINDOW_FILLS,
    min_steady_iterations,
    simulate_pipeline,
    steady_window,
)
from sim.evaluate import evaluate
from sim.multistage import default_in_flight, pipeline_model, staleness_bound
from sim.plan import Plan, Replica, Stage
from sim.result import DeviceUsage, RunResult
from tests.test_multistage import hand_case, placed_case, random_plans


def _with_iterations(prob: Any, n: int) -> Any:
    return dataclasses.replace(prob, job=dataclasses.replace(prob.job, iterations=n))


# ---------------------------------------------------------------------------------------
# RunResult: the window
# ---------------------------------------------------------------------------------------
def _result(ends: list[float], warmup: int, drain: int = 0) -> RunResult:
    return RunResult("x", "des", "s", 0, ends, [10] * len(ends),
                     [DeviceUsage("w", "worker", 1.0, 1.0, 2.0)], warmup=warmup, drain=drain)


def test_the_window_leaves_out_fill_and_drain() -> None:
    # iteration times 5 (fill), 1, 1, 1, 0.5, 0.5 (drain): iterations 1-3 span 3 s
    r = _result([5.0, 6.0, 7.0, 8.0, 8.5, 9.0], warmup=1, drain=2)
    assert r.throughput_sps == pytest.approx(30 / 3.0, rel=1e-12)
    s = r.summary()
    assert s["throughput_window"] == {"kind": "steady", "from_iteration": 1, "to_iteration": 3}
    assert s["iteration_time_s"] == {"mean": 1.0, "p50": 1.0, "p95": 1.0}


def test_a_window_of_every_iteration_is_the_whole_run() -> None:
    r = _result([1.0, 2.0], warmup=0)
    assert r.throughput_window() == {"kind": "whole_run", "from_iteration": 0, "to_iteration": 1}
    # a warm-up as long as the run cannot be left out: the whole run too
    assert _result([1.0], warmup=1).throughput_window()["kind"] == "whole_run"


# ---------------------------------------------------------------------------------------
# The pipeline DES: a short run reports the model, a long one measures
# ---------------------------------------------------------------------------------------
def test_steady_window_bounds() -> None:
    # in flight [4, 1], first waiting pull at 8, fill 2 periods: the window holds 32
    # iterations, ends 4 before the run's end, starts at max(9, n // 2)
    assert min_steady_iterations([4, 1], [8, 7], 2.0) == 2 * (32 + 4) - 1 == 71
    assert steady_window(71, [4, 1], [8, 7], 2.0) == (35, 67)
    assert steady_window(70, [4, 1], [8, 7], 2.0) is None
    # a long warm-up moves the start and the length needed
    assert min_steady_iterations([4, 1], [8, 7], 2.0, warmup=60) == 96
    assert steady_window(96, [4, 1], [8, 7], 2.0, warmup=60) == (60, 92)
    assert steady_window(95, [4, 1], [8, 7], 2.0, warmup=60) is None
    assert WINDOW_FILLS == 16


def test_a_short_pipeline_run_reports_the_models_steady_state() -> None:
    prob, plan = hand_case(True, iterations=20)
    model = pipeline_model(prob, plan)
    d = simulate_pipeline(prob, plan, trace=False)
    w = d.summary()["throughput_window"]
    assert w["kind"] == "model_steady_state"
    assert w["from_iteration"] is None and w["to_iteration"] is None
    assert d.throughput_sps == model.throughput_sps
    assert d.summary()["iteration_time_s"]["mean"] == model.period_s
    need = w["min_iterations"]
    assert need > 20
    assert w["note"] == (f"hand: 20 iterations are too few to measure this pipeline's steady state (its "
                         f"fill takes {d.iter_end_s[0] / model.period_s:.3g} steady periods, "
                         f"{max(d.extra['in_flight'])} iterations in flight); throughput is the "
                         f"steady-state model's; run at least {need} iterations to measure it")
    # that many iterations measure a window, one fewer do not
    assert simulate_pipeline(_with_iterations(prob, need - 1), plan, trace=False).model_steady is not None
    long = simulate_pipeline(_with_iterations(prob, need), plan, trace=False)
    lw = long.throughput_window()
    assert lw["kind"] == "steady"
    first, stop = steady_window(need, long.extra["in_flight"], long.extra["staleness_bound"],
                                long.iter_end_s[0] / model.period_s)
    assert (lw["from_iteration"], lw["to_iteration"]) == (first, stop - 1)
    assert long.throughput_sps == pytest.approx(model.throughput_sps, rel=0.01)


@pytest.mark.parametrize("seed", [137, 147, 46])
def test_a_measured_window_agrees_with_the_model_within_1_percent(seed: int) -> None:
    # The random plans whose window at the shortest measured length strayed most from
    # the model (a long post-fill transient): 137 by 0.91%, 147 by 0.81%, 46 by 0.3%.
    for prob, plan in random_plans(seed):
        m = pipeline_model(prob, plan)
        short = simulate_pipeline(_with_iterations(prob, 30), plan, trace=False)
        need = short.throughput_window()["min_iterations"]
        d = simulate_pipeline(_with_iterations(prob, need), plan, trace=False)
        assert d.throughput_window()["kind"] == "steady"
        assert d.throughput_sps == pytest.approx(m.throughput_sps, rel=0.01), (seed, plan.scheduler)


def test_the_analytic_placement_window_leaves_out_the_fill() -> None:
    prob, plan = hand_case(True, iterations=10)
    a = evaluate(prob, plan, "analytic")
    assert a.throughput_window() == {"kind": "steady", "from_iteration": 1, "to_iteration": 9}
    m = pipeline_model(prob, plan)
    assert a.extra["in_flight"] == default_in_flight(m)
    assert a.extra["staleness_bound"] == staleness_bound(m, default_in_flight(m))
    one = evaluate(_with_iterations(prob, 1), plan, "analytic")
    assert one.throughput_window()["kind"] == "model_steady_state"
    assert one.throughput_sps == m.throughput_sps


# ---------------------------------------------------------------------------------------
# The user's journey (issue 39): 2 A100 + 4 T4 + 8 cpu-8c, resnet50, global batch 512
# ---------------------------------------------------------------------------------------
USER: dict[str, Any] = {
    "name": "user", "seed": 0,
    "cluster": {"devices": [{"type": "a100", "count": 2}, {"type": "t4", "count": 4},
                            {"type": "cpu-8c", "count": 8}],
                "ps": {"shards": 2, "type": "cpu-16c"}, "network": {"bandwidth_gbps": 10, "latency_us": 50}},
    "job": {"model": "resnet50", "global_batch": 512, "iterations": 20, "sync": "bsp", "pipeline": False},
    "objective": {"minimize": "time"}, "scheduler": {"name": "genetic"},
}


def _compare(tmp_path: Path, capsys: pytest.CaptureFixture[str], evaluator: str, iterations: int,
             schedulers: str = "genetic") -> tuple[list[dict[str, str]], dict[str, Any], str]:
    cfg = tmp_path / f"user{iterations}.yaml"
    cfg.write_text(yaml.safe_dump({**USER, "job": {**USER["job"], "iterations": iterations}}))
    out = tmp_path / f"{evaluator}{iterations}"
    assert main(["compare", str(cfg), "--evaluator", evaluator, "--schedulers", schedulers,
                 "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "comparison.csv").open()))
    summary = json.loads((out / "genetic" / "summary.json").read_text())
    return rows, summary, capsys.readouterr().err


def test_the_journey_short_and_long_des_agree_with_the_analytic(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    _, analytic, _ = _compare(tmp_path, capsys, "analytic", 20)
    _, short, err = _compare(tmp_path, capsys, "des", 20)
    want = analytic["throughput_sps"]
    assert analytic["throughput_window"] == {"kind": "steady", "from_iteration": 1, "to_iteration": 19}
    # 20 iterations of a pipeline with 17 in flight: the model's steady state, and one warning
    assert short["throughput_window"]["kind"] == "model_steady_state"
    assert short["throughput_sps"] == pytest.approx(want, rel=1e-12)
    need = short["throughput_window"]["min_iterations"]
    warnings = [ln for ln in err.splitlines() if "too few to measure" in ln]
    assert len(warnings) == 1 and warnings[0].startswith("hetsim: warning: genetic: 20 iterations")
    assert f"run at least {need} iterations" in warnings[0]
    # a run of that length measures iterations [first, stop) without fill and drain
    _, long, err = _compare(tmp_path, capsys, "des", need)
    assert long["throughput_window"]["kind"] == "steady"
    assert long["throughput_window"]["from_iteration"] == need // 2
    assert long["throughput_window"]["to_iteration"] == need - 1 - long["in_flight"][0]
    assert long["throughput_sps"] == pytest.approx(want, rel=1e-3)
    assert "too few to measure" not in err


# ---------------------------------------------------------------------------------------
# Apples and oranges: kind, sync, staleness in comparison tables
# ---------------------------------------------------------------------------------------
def _job(**kw: Any) -> JobConfig:
    return JobConfig(model="resnet18", global_batch=64, **kw)


def test_update_columns_per_plan_kind() -> None:
    dp = Plan((Stage(0, 1, (Replica("a", 32), Replica("b", 32))),), ("ps:0",), "equal")
    r = _result([1.0, 2.0, 3.0], warmup=1)
    assert update_columns(r, dp, _job()) == {"plan_kind": "data_parallel", "sync": "bsp",
                                             "staleness_bound": 0, "throughput_window": "steady"}
    assert update_columns(r, dp, _job(sync="ssp", staleness=3))["staleness_bound"] == 3
    asp = update_columns(r, dp, _job(sync="asp"))
    assert asp["sync"] == "asp" and asp["staleness_bound"] == math.inf
    # a placement plan pipelines whatever job.sync says: bounded staleness, the largest lag
    prob, plan = hand_case(True, iterations=5)
    d = simulate_pipeline(prob, plan, trace=False)
    cols = update_columns(d, plan, _job(sync="bsp"))
    assert cols == {"plan_kind": "placement", "sync": "ssp", "staleness_bound": max(d.extra["staleness_bound"]),
                    "throughput_window": "model_steady_state"}
    assert _updates_label({"scheduler": "x", **cols}) == f"placement, ssp \u2264 {cols['staleness_bound']}"
    assert _updates_label({"scheduler": "x", "plan_kind": "data_parallel", "sync": "bsp",
                           "staleness_bound": 0}) == "data-parallel, bsp"
    assert _updates_label({"scheduler": "x"}) == ""


def test_staleness_warning_only_for_different_bounds() -> None:
    same = [{"scheduler": "equal", "staleness_bound": 0}, {"scheduler": "hps", "staleness_bound": 0}]
    assert staleness_warning(same) is None
    mixed = [*same, {"scheduler": "genetic", "staleness_bound": 21}, {"scheduler": "rl", "staleness_bound": 5}]
    assert staleness_warning(mixed) == (
        "these plans train with different staleness bounds (0: equal, hps; 21: genetic; 5: rl): a stale "
        "update may be worth less than a fresh one, so their throughputs do not compare one to one")


def test_compare_carries_the_columns_and_warns_once_for_two_staleness_bounds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # exact places the model on one fast replica and four slow ones (tests/test_multistage.py's
    # CLI case): a pipeline; equal is synchronous data-parallel
    placed_case(tmp_path, iterations=10)
    out = tmp_path / "cmp"
    assert main(["compare", str(tmp_path / "c.yaml"), "--evaluator", "analytic", "--schedulers", "equal,exact",
                 "--out", str(out)]) == 0
    cap = capsys.readouterr()
    rows = {r["scheduler"]: r for r in csv.DictReader((out / "comparison.csv").open())}
    assert rows["equal"]["plan_kind"] == "data_parallel" and rows["equal"]["sync"] == "bsp"
    assert rows["equal"]["staleness_bound"] == "0"
    lag = json.loads((out / "exact" / "summary.json").read_text())["staleness_bound"]
    assert rows["exact"]["plan_kind"] == "placement" and rows["exact"]["sync"] == "ssp"
    assert rows["exact"]["staleness_bound"] == str(max(lag)) and max(lag) > 0
    assert rows["exact"]["throughput_window"] == rows["equal"]["throughput_window"] == "steady"
    warned = [ln for ln in cap.err.splitlines() if "different staleness bounds" in ln]
    assert warned == [f"hetsim: warning: these plans train with different staleness bounds (0: equal; "
                      f"{max(lag)}: exact): a stale update may be worth less than a fresh one, so their "
                      "throughputs do not compare one to one"]
    header = next(ln for ln in cap.out.splitlines() if ln.startswith("scheduler"))
    assert header.split()[:5] == ["scheduler", "evaluator", "plan_kind", "sync", "staleness_bound"]
    # a column every row has alike is said once above the table instead
    assert header.split()[-1] == "energy_j"
    assert cap.out.splitlines()[0] == "all plans: throughput window steady"
    # one staleness: no warning, and the shared columns in the line above the table
    assert main(["compare", str(tmp_path / "c.yaml"), "--evaluator", "analytic", "--schedulers", "equal",
                 "--out", str(tmp_path / "one")]) == 0
    cap = capsys.readouterr()
    assert "staleness" not in cap.err
    assert cap.out.splitlines()[0] == ("all plans: data_parallel, sync bsp, staleness bound 0, "
                                       "throughput window steady")


# ---------------------------------------------------------------------------------------
# Robotics: DAG schedulers plan with the frames DES's load and jitter (issue 39 item 2)
# ---------------------------------------------------------------------------------------
ORIN = Path(__file__).resolve().parent.parent / "experiments" / "configs" / "robotics" / "orin_slam.yaml"


def test_planning_scale_covers_load_and_jitter_at_the_tolerance() -> None:
    load = PeriodicPattern(pattern="periodic", workers="all", period_s=1.0, duty=0.2, until_s=30,
                           slowdown=1.5, random_phase=True)
    # jitter cv 0.1 at a 1% tolerance: the 99th percentile of a mean-1 log-normal
    jit = planning_scale(FrameOptions(frames=600, jitter_cv=0.1), 3, 1 / 30)
    assert jit == pytest.approx((1.2549317193674263,) * 3, rel=1e-12)
    # loaded 20% of the time: more than 1% of it, so the slowdown counts; at 25%, it does not
    opts = FrameOptions(frames=600, load=(load,), miss_tolerance=0.01)
    assert planning_scale(opts, 3, 1 / 30) == (1.5, 1.5, 1.5)
    assert planning_scale(dataclasses.replace(opts, miss_tolerance=0.25), 3, 1 / 30) == (1.0, 1.0, 1.0)
    assert planning_scale(FrameOptions(frames=600), 2, 1 / 30) == (1.0, 1.0)


def test_planning_costs_scale_only_what_schedulers_see() -> None:
    _, problem, _ = load_dag_config(ORIN)
    assert problem.time_scale == pytest.approx((1.5 * 1.2549317193674263,) * len(problem.board.units))
    nominal = dag_costs(problem, "40w")
    priced = planning_costs(problem, "40w")
    assert np.array_equal(priced.time_s, nominal.time_s * np.asarray(problem.time_scale))
    plain = dataclasses.replace(problem, time_scale=())
    assert np.array_equal(dag_costs(plain, "40w").time_s, nominal.time_s)
    assert np.array_equal(planning_costs(plain, "40w").time_s, nominal.time_s)
    with pytest.raises(ValueError, match="one finite factor >= 1 per board unit"):
        dataclasses.replace(problem, time_scale=(1.0,))
    with pytest.raises(ValueError, match="one finite factor >= 1 per board unit"):
        dataclasses.replace(problem, time_scale=(0.5,) * len(problem.board.units))


def _orin(tmp_path: Path, capsys: pytest.CaptureFixture[str],
          **over: Any) -> tuple[dict[str, dict[str, str]], list[str]]:
    data = yaml.safe_load(ORIN.read_text())
    cfg = tmp_path / "orin.yaml"
    cfg.write_text(yaml.safe_dump({**data, **over}))
    out = tmp_path / f"o{len(over)}"
    assert main(["dag", str(cfg), "--schedulers", "heft,energy,milp", "--out", str(out)]) == 0
    rows = {r["scheduler"]: r for r in csv.DictReader((out / "comparison.csv").open())}
    for s, r in rows.items():  # plan.json is the plan as run: nominal times
        plan = json.loads((out / s / "plan.json").read_text())
        assert 1e3 * plan["makespan_s"] == pytest.approx(float(r["plan_frame_ms"]), rel=1e-12)
    return rows, [ln for ln in capsys.readouterr().err.splitlines() if "misses" in ln]


def test_orin_slam_plans_without_the_des_effects_miss_and_are_flagged(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows, warned = _orin(tmp_path, capsys, plan_with_des_effects=False)
    for s in ("energy", "milp"):
        r = rows[s]
        assert (r["mode"], r["plan_feasible"], r["des_miss_ok"]) == ("15w", "True", "False")
        assert float(r["plan_frame_ms"]) == float(r["plan_effects_ms"]) == pytest.approx(21.5517, abs=1e-4)
        assert float(r["des_miss_rate"]) == pytest.approx(287 / 600, abs=1e-12)
    assert rows["heft"]["des_miss_ok"] == "True" and float(rows["heft"]["des_miss_rate"]) == 0.0
    assert warned == [f"hetsim: warning: {s}: the frames DES misses 47.8% of frames, over the config's "
                      "miss_tolerance 1.0% (planned frame 21.55 ms, planned with nominal times; deadline 25 ms)"
                      for s in ("energy", "milp")]


def test_orin_slam_plans_with_the_des_effects_meet_the_tolerance(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows, warned = _orin(tmp_path, capsys)
    assert warned == []
    assert {s: r["mode"] for s, r in rows.items()} == {"heft": "40w", "energy": "40w", "milp": "30w"}
    for r in rows.values():
        assert r["plan_feasible"] == r["des_miss_ok"] == "True"
        assert float(r["des_miss_rate"]) <= float(r["miss_tolerance"]) == 0.01
        # planned with times 1.5 (load) x 1.255 (jitter) the nominal, within the deadline
        assert float(r["plan_frame_ms"]) < float(r["plan_effects_ms"]) <= 25.0
    assert float(rows["energy"]["des_miss_rate"]) == 0.0
    assert float(rows["energy"]["plan_energy_mj"]) < float(rows["heft"]["plan_energy_mj"])


def test_miss_tolerance_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump({**yaml.safe_load(ORIN.read_text()), "miss_tolerance": 1.5}))
    assert main(["dag", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(cfg) in err and "miss_tolerance" in err
