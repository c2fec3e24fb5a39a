"""hetsim validate: the error arithmetic, the ranking rule, the simulated problem, one-line
errors, and one small end-to-end run (2 workers, a tiny mlp, 6 iterations)."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest

from experiments import cli, runner, validate
from runtime.spec import parse_options
from sim import costmodel
from sim.cluster import Host, Placement
from sim.dynamics import Dynamic
from sim.emulation import TEACHER, CpuScale, RuntimeEmulation, emulated_problem
from sim.result import DeviceUsage, RunResult, Trace
from tests.helpers_eval import dense, model, problem, profile

TINY = """\
name: tiny_validate
seed: 0
cluster:
  devices:
    - {type: this_machine, count: 2}
  ps: {shards: 1, type: this_machine}
  network: {bandwidth_gbps: 13, latency_us: 65}
job:
  model: mlp
  global_batch: 16
  iterations: 6
  warmup_iterations: 2
  sync: bsp
scheduler: {name: equal}
runtime:
  model_kwargs: {in_features: 16, hidden: [32], classes: 4}
  threads: 1
  workers:
    - {affinity: [0]}
    - {slowdown: 2.0}
"""


def _write(tmp_path: Path, text: str = TINY, name: str = "tiny.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ------------------------------------------------------------------ arithmetic
def test_rel_error_exact_and_missing() -> None:
    assert validate.rel_error(1.1, 1.0) == pytest.approx(0.1)
    assert validate.rel_error(0.5, 2.0) == -0.75
    assert validate.rel_error(None, 1.0) is None
    assert validate.rel_error(1.0, None) is None
    assert validate.rel_error(1.0, 0.0) is None
    assert validate.rel_error(float("nan"), 1.0) is None


def _result(evaluator: str, ends: list[float], trace: list[dict[str, object]],
            loss: list[float] | None = None) -> RunResult:
    dev = DeviceUsage("cpu:0", "worker", 0.0, 0.0, 0.0)
    return RunResult("x", evaluator, "equal", 0, ends, [10] * len(ends), [dev], warmup=1,
                     trace=trace, iter_loss=loss)


def test_metrics_and_errors_on_hand_made_runs() -> None:
    # sim: iterations of 1 s; worker computes 0.5 s (fwd 0.2 + bwd 0.3) and transfers 0.2 s
    # (pull 0.1 + push 0.1, two messages of the push overlapping) in each
    ts = Trace()
    for i in range(4):
        t = float(i)
        ts.async_span("network", 0, "cpu:0", "pull c0", t, t + 0.1)
        ts.span("workers", 0, "cpu:0", "fwd", t + 0.1, t + 0.3)
        ts.span("workers", 0, "cpu:0", "bwd", t + 0.3, t + 0.6)
        ts.async_span("network", 0, "cpu:0", "push c0", t + 0.6, t + 0.7)
        ts.async_span("network", 0, "cpu:0", "push c1", t + 0.65, t + 0.7)
    sim = _result("des", [1.0, 2.0, 3.0, 4.0], ts.events)
    # real: a 2 s warm-up, then iterations of 1.5 s: wait 0.2, pull 0.1, [teacher 0.2],
    # compute 0.6, push 0.3; compute counts from the end of the pull (0.8 s)
    tr = Trace()
    starts = [0.0, 2.0, 3.5, 5.0]
    for t in starts:
        tr.span("workers", 0, "cpu:0", "wait", t, t + 0.2)
        tr.span("workers", 0, "cpu:0", "pull", t + 0.2, t + 0.3)
        tr.span("workers", 0, "cpu:0", "compute", t + 0.5, t + 1.1)
        tr.span("workers", 0, "cpu:0", "push", t + 1.1, t + 1.4)
    real = _result("runtime", [2.0, 3.5, 5.0, 6.5], tr.events)
    m = validate.compare(validate.measured_metrics(sim), validate.measured_metrics(real))
    assert m["iteration_time_mean_s"]["sim"] == pytest.approx(1.0)
    assert m["iteration_time_mean_s"]["real"] == pytest.approx(1.5)
    assert m["iteration_time_mean_s"]["rel_error"] == pytest.approx(-1 / 3)
    assert m["iteration_time_p50_s"]["rel_error"] == pytest.approx(-1 / 3)
    assert m["throughput_sps"]["sim"] == pytest.approx(10.0)
    assert m["throughput_sps"]["real"] == pytest.approx(30 / 4.5)
    assert m["throughput_sps"]["rel_error"] == pytest.approx(0.5)
    assert m["compute_s:cpu:0"]["sim"] == pytest.approx(0.5)
    assert m["compute_s:cpu:0"]["real"] == pytest.approx(0.8)
    assert m["compute_s:cpu:0"]["rel_error"] == pytest.approx(-0.375)
    assert m["comm_s:cpu:0"]["sim"] == pytest.approx(0.2)
    assert m["comm_s:cpu:0"]["real"] == pytest.approx(0.4)
    assert m["comm_s:cpu:0"]["rel_error"] == pytest.approx(-0.5)
    assert "time_to_target_s" not in m


@pytest.mark.parametrize(("pipeline", "compute", "comm"), [(False, 0.5, 0.3), (True, 0.6, 0.2)])
def test_the_des_quantize_pass_counts_where_the_runtime_packs(pipeline: bool, compute: float, comm: float) -> None:
    """A DES iteration of fwd 0.2, bwd 0.3, quant 0.1 and transfers of 0.2 s: the runtime
    packs a gradient inside its push (quant is comm) or, pipelined, in its sender thread
    during the backward (quant is compute)."""
    ts = Trace()
    for i in range(3):
        t = float(i)
        ts.async_span("network", 0, "cpu:0", "pull c0", t, t + 0.1)
        ts.span("workers", 0, "cpu:0", "fwd", t + 0.1, t + 0.3)
        ts.span("workers", 0, "cpu:0", "bwd", t + 0.3, t + 0.6)
        ts.span("workers", 0, "cpu:0", "quant", t + 0.6, t + 0.7)
        ts.async_span("network", 0, "cpu:0", "push c0", t + 0.7, t + 0.8)
    m = validate.measured_metrics(_result("des", [1.0, 2.0, 3.0], ts.events), pipeline=pipeline)
    assert m["compute_s:cpu:0"] == pytest.approx(compute) and m["comm_s:cpu:0"] == pytest.approx(comm)


@pytest.mark.parametrize(("means", "chosen"), [([3.0, 1.0, 2.0], 2), ([1.0], 0), ([4.0, 1.0, 3.0, 2.0], 2)])
def test_median_run_compares_the_run_of_median_mean_iteration(means: list[float], chosen: int,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs whose iterations last ``means`` seconds, in that order: the run of the median
    (of an even count, the upper middle: 3.0 of 1, 2, 3, 4) is the one compared."""
    runs = iter([_result("runtime", [m * (i + 1) for i in range(4)], []) for m in means])
    events: list[str] = []

    def run(spec: object) -> object:
        events.append("run")
        return next(runs)

    def probe() -> int:
        events.append("probe")
        return len(events)

    monkeypatch.setattr(validate, "run_local", run)
    got = validate.median_run(None, len(means), probe)  # type: ignore[arg-type]
    assert got.means == pytest.approx(means) and got.wall_s >= 0.0 and got.chosen == chosen
    assert got.result.summary()["iteration_time_s"]["mean"] == pytest.approx(means[chosen])
    # a probe before each run and one after the last: the run compared is bracketed by two
    assert events == ["probe", "run"] * len(means) + ["probe"]
    assert got.probes == [1 + 2 * i for i in range(len(means) + 1)]
    with pytest.raises(validate.ConfigError, match="--repeat: must be at least 1, got 0"):
        validate.median_run(None, 0)  # type: ignore[arg-type]


def test_real_time_to_target_uses_the_trailing_mean() -> None:
    r = _result("runtime", [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], [],
                loss=[1.0, 0.1, 1.0, 0.5, 0.4, 0.3, 0.2])
    # means over full windows of 5 end at iterations 4, 5, 6: 0.6, 0.46, 0.48
    assert validate.real_time_to_target(r, 0.6) == 5.0
    assert validate.real_time_to_target(r, 0.47) == 6.0
    assert validate.real_time_to_target(r, 0.55) == 6.0  # the early 0.1 alone does not count
    assert validate.real_time_to_target(r, 0.1) is None


@pytest.mark.parametrize("sim, real, expected", [
    ({"a": 1.0, "b": 2.0}, {"a": 1.5, "b": 3.0}, True),            # same order
    ({"a": 1.0, "b": 2.0}, {"a": 3.0, "b": 1.5}, False),           # swapped
    ({"a": 1.0, "b": 1.01}, {"a": 3.0, "b": 1.5}, True),           # sim tie (within 5%)
    ({"a": 1.0, "b": 2.0}, {"a": 2.0, "b": 1.96}, True),           # real tie
    ({"a": 1.0, "b": 2.0, "c": 3.0}, {"a": 1.0, "b": 2.0, "c": 1.5}, False),  # b/c swapped
    ({"a": 1.0}, {"a": 2.0}, None),                                # one scheduler
    ({"a": 1.0, "b": 2.0}, {"a": 1.0}, None),                      # one on both sides
])
def test_ranking_preserved(sim: dict[str, float], real: dict[str, float], expected: bool | None) -> None:
    assert validate.ranking_preserved(sim, real) is expected


def test_ranking_tie_tolerance_is_a_parameter() -> None:
    assert validate.ranking_preserved({"a": 1.0, "b": 1.01}, {"a": 3.0, "b": 1.5}, tie_rel=0.0) is False


# --------------------------------------------------- what the DES is given
def test_simulated_problem_has_exact_model_teacher_and_slowdown(tmp_path: Path) -> None:
    from experiments.run import read_config

    path = _write(tmp_path)
    cfg, rt = read_config(path)
    opts = parse_options(rt, str(path))
    loaded = runner.Loaded(cfg, tmp_path, str(path))
    base = runner.problem_of(loaded)
    model = validate.exact_model("mlp", 0, opts.model_kwargs)
    # 16-32-4: two Linear layers and a ReLU, not the zoo's 784-1024-1024-10
    assert model.param_bytes == 4 * (16 * 32 + 32 + 32 * 4 + 4)
    import dataclasses

    problem = dataclasses.replace(base, job=dataclasses.replace(base.job, model=model))
    plan = runner.plan_for(loaded, problem, "equal")
    emu = validate.emulation(problem, plan, opts)
    assert emu.host is None and not emu.serial_messages  # no host given: the ranks compute on their own
    sp = emulated_problem(problem, emu)
    assert sp.job.model.layers[0].name == TEACHER
    assert sp.job.model.layers[1:] == model.layers
    dev = sp.cluster.devices[0]
    f, b = costmodel.layer_times(sp.job.model, dev.type, "fp32", 8)
    sf, sb = costmodel.layer_times(model, problem.cluster.devices[0].type, "fp32", 8)
    assert f[0] == pytest.approx(sf.sum()) and b[0] == 0.0  # the teacher: one forward, no backward
    assert list(f[1:]) == pytest.approx(list(sf)) and list(b[1:]) == pytest.approx(list(sb))
    (ev,) = sp.dynamics  # worker 1's 2x sleep covers the student's compute, not the teacher's
    T, S = sf.sum(), sf.sum() + sb.sum()
    assert ev.worker == 1 and ev.at_s == 0.0
    assert ev.slowdown == pytest.approx((T + 2 * S) / (T + S))


# ------------------------------------------------------------------- errors
def test_unknown_scheduler_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path)
    assert cli.main(["validate", str(path), "--schedulers", "equal,nope", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--schedulers" in err and "'nope'" in err


@pytest.mark.parametrize("old, new, field", [
    ("global_batch: 16", "global_batch: -1", "job.global_batch"),
    ("- {slowdown: 2.0}", "- {slowdown: 0.5}", "runtime.workers[1].slowdown"),
    ("model: mlp", "model: {file: nowhere.yaml}", "nowhere.yaml"),
])
def test_bad_config_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       old: str, new: str, field: str) -> None:
    path = _write(tmp_path, TINY.replace(old, new))
    assert cli.main(["validate", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("hetsim: error:") and field in err
    if "nowhere" not in field:
        assert str(path) in err


# -------------------------------------------------------------- end to end
def test_cpu_per_iteration_by_hand() -> None:
    # 4 iterations in both; the DES ends at 2 s, the real run's longest loop takes 4 s
    def devs() -> list[DeviceUsage]:
        return [DeviceUsage("w:0", "worker", 0.0, 0.0, 0.0), DeviceUsage("ps:0", "ps", 0.0, 0.0, 0.0)]

    sim = RunResult("x", "des", "equal", 0, [0.5, 1.0, 1.5, 2.0], [10] * 4, devs(),
                    extra={"host_cpu_s": {"w:0": 0.8, "w:0 transport": 0.4, "ps:0": 0.2, "ps:0 transport": 0.4}})
    real = RunResult("x", "runtime", "equal", 0, [1.0, 2.0, 3.0, 4.0], [10] * 4, devs(), extra={"runtime": {"cpu": {
        "w:0": {"wall_s": 4.0, "cpu_s": 2.0, "threads_cpu_s": {"python3": 1.6, "gloo_tcp_loop": 0.4},
                "compute_cpu_s": 1.2},
        "ps:0": {"wall_s": 3.9, "cpu_s": 1.2, "threads_cpu_s": None,
                 # the 3 iterations after a warm-up of 1 took 0.6 CPU-s: 200 ms each
                 "window": {"from_iteration": 1, "iterations": 3, "cpu_s": 0.6, "wall_s": 3.0}}}}})
    got = validate.cpu_per_iteration(sim, real)
    assert got is not None
    assert got["processes"] == {
        "w:0": {"role": "worker", "sim_ms": pytest.approx(200.0), "sim_transport_ms": pytest.approx(100.0),
                "real_ms": pytest.approx(500.0), "real_window_ms": None, "real_transport_ms": pytest.approx(100.0),
                "real_compute_ms": pytest.approx(300.0)},
        "ps:0": {"role": "ps", "sim_ms": pytest.approx(50.0), "sim_transport_ms": pytest.approx(100.0),
                 "real_ms": pytest.approx(300.0), "real_window_ms": pytest.approx(200.0),
                 "real_transport_ms": None, "real_compute_ms": None}}
    assert got["sim_total_ms"] == pytest.approx(450.0) and got["real_total_ms"] == pytest.approx(800.0)
    assert got["sim_cores_busy"] == pytest.approx(1.8 / 2.0)  # 1.8 CPU-s over 2 s
    assert got["real_cores_busy"] == pytest.approx(3.2 / 4.0)  # 3.2 CPU-s over the longest loop
    # a rank the DES did not place: listed without simulated CPU, out of both totals
    off = RunResult("x", "des", "equal", 0, [0.5, 1.0, 1.5, 2.0], [10] * 4, devs(),
                    extra={"host_cpu_s": {"w:0": 0.8, "w:0 transport": 0.4}})
    got = validate.cpu_per_iteration(off, real)
    assert got is not None and got["processes"]["ps:0"]["sim_ms"] is None
    assert got["sim_total_ms"] == pytest.approx(300.0) and got["real_total_ms"] == pytest.approx(500.0)
    assert validate.real_cpu_factors(got) == {"w:0": pytest.approx(500.0 / 300.0)}
    # a DES without hosts, or a real run without the figures: nothing to compare
    assert validate.cpu_per_iteration(_result("des", [1.0], []), real) is None
    assert validate.cpu_per_iteration(sim, _result("runtime", [1.0], [])) is None


def test_real_cpu_factors_and_the_rescaled_problem() -> None:
    cpu = {"processes": {"w:0": {"sim_ms": 200.0, "sim_transport_ms": 100.0, "real_ms": 600.0},
                         "ps:0": {"sim_ms": 0.0, "sim_transport_ms": 0.0, "real_ms": 5.0},
                         "w:1": {"sim_ms": None, "sim_transport_ms": None, "real_ms": 7.0}}}
    assert validate.real_cpu_factors(cpu) == {"w:0": 2.0}  # none where the DES gave no CPU or no place
    assert validate.real_cpu_factors(None) == {}
    emu = RuntimeEmulation(host=Host("h", 2), placement=(("cpu:0", Placement(0)), ("cpu:1", Placement(0, 2))))
    scaled = validate.with_cpu_scaled(emu, {"cpu:0": 2.0})
    assert scaled.cpu_scale("cpu:0") == CpuScale(2.0, 1.0)
    assert scaled.cpu_scale("cpu:1") == emu.cpu_scale("cpu:1") == CpuScale(1.0, 1.0)
    assert dataclasses.replace(scaled, cpu_scales=()) == emu  # nothing else changes


def test_compute_scaled_multiplies_each_workers_slowdown_from_t0() -> None:
    # worker cpu:0 has the config's slowdown 1.5 at t = 0, cpu:1 the emulation's 2.0: real
    # compute 2x and 3x the simulated makes them 3.0 and 6.0; scaling cpu:0 alone keeps cpu:1's
    base = problem([profile("cpu", kind="cpu")] * 2, [profile("ps", kind="cpu")], model(dense("fc", 1e3)), 20)
    prob = dataclasses.replace(base, dynamics=(Dynamic(0, 0.0, slowdown=1.5),))
    emu = RuntimeEmulation(slowdowns=(("cpu:1", 2.0),))
    assert validate.with_compute_scaled(prob, emu, {"cpu:0": 2.0, "cpu:1": 3.0}).slowdowns == (
        ("cpu:0", 3.0), ("cpu:1", 6.0))
    assert validate.with_compute_scaled(prob, emu, {"cpu:0": 2.0}).slowdowns == (("cpu:0", 3.0), ("cpu:1", 2.0))
    # as events: the problem's first, then the emulation's at t = 0 (the last one at an instant wins)
    got = emulated_problem(prob, validate.with_compute_scaled(prob, emu, {"cpu:0": 2.0}))
    assert [(d.worker, d.at_s, d.slowdown) for d in got.dynamics] == [(0, 0.0, 1.5), (0, 0.0, 3.0), (1, 0.0, 2.0)]


def test_validate_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import psutil

    path = _write(tmp_path)
    out = tmp_path / "out"
    def ranks() -> set[int]:
        # multiprocessing's resource tracker lives as long as this process does; it is not a rank
        return {p.pid for p in psutil.Process().children(recursive=True)
                if "resource_tracker" not in " ".join(p.cmdline())}

    before = ranks()
    # iterations 6, as the file says, but through --set: the record keeps what the command set
    assert cli.main(["validate", str(path), "--out", str(out), "--set", "job.iterations=6"]) == 0
    left = ranks() - before
    assert not left, f"processes left behind: {left}"
    for f in ("report.md", "validation.csv", "validation.json", "sim_vs_real.png",
              "equal/sim/summary.json", "equal/real/summary.json", "equal/real/trace.json"):
        assert (out / f).is_file(), f
    report = (out / "report.md").read_text()
    assert "| metric | sim | real | error |" in report
    metrics = ["iteration_time_mean_s", "iteration_time_p50_s", "throughput_sps",
               "compute_s:this_machine:0", "compute_s:this_machine:1",
               "comm_s:this_machine:0", "comm_s:this_machine:1"]
    for m in metrics:
        row = next(line for line in report.splitlines() if line.startswith(f"| {m} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 4 and all(c not in ("", "-") for c in cells), row
    rows = list(csv.DictReader((out / "validation.csv").open()))
    assert [r["metric"] for r in rows] == metrics
    assert all(r["sim"] and r["real"] and r["rel_error"] for r in rows)
    for r in rows:
        assert float(r["rel_error"]) == pytest.approx((float(r["sim"]) - float(r["real"])) / float(r["real"]))
    data = json.loads((out / "validation.json").read_text())
    assert data["schema"] == 1 and data["ranking_preserved"] is None
    real = json.loads((out / "equal/real/summary.json").read_text())
    sim = json.loads((out / "equal/sim/summary.json").read_text())
    assert real["evaluator"] == "runtime" and sim["evaluator"] == "des"
    assert real["iterations"] == sim["iterations"] == 6
    # the CPU of every rank over its loop, beside the DES's: one row per process in the report
    cpu = data["schedulers"]["equal"]["diagnostics"]["cpu_per_iteration"]
    assert set(cpu["processes"]) == {"this_machine:0", "this_machine:1", "ps:0"}
    assert all(p["real_ms"] > 0 and p["sim_ms"] > 0 for p in cpu["processes"].values())
    assert all(cpu["processes"][w]["real_compute_ms"] > 0 for w in ("this_machine:0", "this_machine:1"))
    assert "CPU per iteration (ms" in report and "The DES given each rank's real CPU" in report
    assert "Control, no rerun" in report
    # the profile's runtime CPU model (network.runtime_cpu) made the simulated side: scales
    # for every process from the first DES run's figures, the first run kept for comparison
    rc = data["schedulers"]["equal"]["diagnostics"]["runtime_cpu"]
    assert set(rc["models"]) == {"this_machine"}
    assert set(rc["scales"]) == set(rc["figures"]) == {"this_machine:0", "this_machine:1", "ps:0"}
    # BSP with a static plan: the simulated side charges each process what the model predicts
    from calibration.runtime_cpu import Figures, RuntimeCpuModel

    model = RuntimeCpuModel.from_json(rc["models"]["this_machine"])
    for dev, f in rc["figures"].items():
        p = cpu["processes"][dev]
        assert p["sim_ms"] + p["sim_transport_ms"] == pytest.approx(model.predict_ms(Figures(**f)), rel=1e-6), dev
    # each worker pulls and pushes once an iteration (2 message ends), the shard twice that
    assert {d: f["messages"] for d, f in rc["figures"].items()} == {
        "this_machine:0": 2.0, "this_machine:1": 2.0, "ps:0": 4.0}
    # worker 0 is pinned to core 0, the others may run on both cores: each unpinned process is
    # half on core 0 (worker 0: 1 + 0.5 + 0.5) and sees the rest as half of its two cores each
    assert {d: f["sharing"] for d, f in rc["figures"].items()} == {
        "this_machine:0": 2.0, "this_machine:1": 2.0, "ps:0": 2.0}
    assert rc["sim_without_model"]["iteration_time_mean_s"] != sim["iteration_time_s"]["mean"]
    # the simulated side again without the real run, on the run's host: the same figures exactly
    diag = data["schedulers"]["equal"]["diagnostics"]
    again = validate.resimulate(path, "equal", Host("local", diag["host"]["cores"],
                                                    diag["host"]["background_threads"]), {"profile's": model})
    assert again == {"": rc["sim_without_model"]["iteration_time_mean_s"],
                     "profile's": data["schedulers"]["equal"]["metrics"]["iteration_time_mean_s"]["sim"]}
    # rescored (the simulated side again against the recorded real one): every metric as recorded
    recorded = validate.Validation.from_json(data)
    assert validate.rescore(recorded).runs[0].metrics == recorded.runs[0].metrics
    # the --set overrides a run was read with are recorded, shown, and read again by rescore:
    # the same record with the batch doubled simulates longer iterations against the same real ones
    assert data["info"]["overrides"] == [["job.iterations", 6]]
    assert f"## tiny_validate (`{path}` --set job.iterations=6)" in report
    doubled = validate.Validation.from_json({**data, "info": {
        **data["info"], "overrides": [["job.iterations", 6], ["job.global_batch", 32]]}})
    it = "iteration_time_mean_s"
    assert validate.rescore(doubled).runs[0].metrics[it]["sim"] > recorded.runs[0].metrics[it]["sim"]
    # each process's CPU after the warm-up (2 of the 6 iterations): measured from its ticks,
    # no more than over its whole loop
    for dev, got in real["runtime"]["cpu"].items():
        assert got["window"]["from_iteration"] == 2 and got["window"]["iterations"] == 4, dev
        assert 0 < got["window"]["cpu_s"] <= got["cpu_s"], dev
        assert cpu["processes"][dev]["real_window_ms"] == pytest.approx(1e3 * got["window"]["cpu_s"] / 4), dev
        assert "ticks" not in got, dev
    assert "runtime CPU model of the profile" in report
    # the memory probe, a diagnostic: this_machine's profile has copies of 1 M to 64 M values
    mp = data["schedulers"]["equal"]["diagnostics"]["memory_probe"]
    assert mp["elems"] == [1_000_000, 4_000_000, 16_000_000, 64_000_000] and mp["factor"] > 0
    assert "Memory probe (`memory_factor`)" in report
    printed = capsys.readouterr().out
    assert "iteration_time_mean_s" in printed and "equal: CPU per iteration, every process:" in printed
    assert "equal: sim = the DES with the profile's runtime CPU model" in printed
    # the headline: beside the mean iteration time, the median |error| over the 4 per-worker
    # compute and communication metrics, the runtime CPU model named, the error without it
    run = data["schedulers"]["equal"]
    h = run["headline"]
    errs = sorted(abs(m["rel_error"]) for k, m in run["metrics"].items() if k.startswith(("compute_s:", "comm_s:")))
    assert h["components"] == 4 and h["component_median_abs_error"] == pytest.approx((errs[1] + errs[2]) / 2)
    assert h["calibrated_models"] == ["the runtime CPU model of profile this_machine (network.runtime_cpu)"]
    assert h["iteration_time_mean_error_without_calibrated"] == pytest.approx(validate.rel_error(
        rc["sim_without_model"]["iteration_time_mean_s"], run["metrics"]["iteration_time_mean_s"]["real"]))
    assert run["diagnostics"]["profiles"] == {"this_machine": "measured 2026-11-30 on AMD EPYC"}
    assert "equal headline: mean iteration time " in printed and "Headline: mean iteration time " in report


def test_memory_factor_is_the_median_ratio_to_the_profiles_copies() -> None:
    from experiments.runner import from_dict, problem_of

    repo = Path(__file__).resolve().parents[1]
    prob = problem_of(from_dict({
        "name": "m", "profiles": [str(repo / "hardware_profiles" / "measured")],
        "cluster": {"devices": [{"type": "this_machine", "count": 1}], "ps": {"shards": 1, "type": "this_machine"},
                    "network": {"bandwidth_gbps": 10}},
        "job": {"model": "mlp", "global_batch": 8, "iterations": 2}}, repo, "<t>"))
    raw = json.loads((repo / "hardware_profiles/measured/this_machine.json").read_text())["measurement"]["raw"]["bandwidth"]
    then = {b["elems"]: b["t_s"] for b in raw if b["op"] == "copy" and b["elems"] >= 1_000_000}
    # copies now 1.0x, 1.1x, 1.3x and 2.0x the profile's (1 M, 4 M, 16 M, 64 M values): median 1.2
    slow = dict(zip(sorted(then), (1.0, 1.1, 1.3, 2.0)))
    got = validate.memory_factor(prob, probe=lambda n: then[n] * slow[n])
    assert got is not None and got["elems"] == sorted(then)
    assert got["factor"] == pytest.approx(1.2)
    # a profile without copies (a datasheet one): no factor
    sheet = problem_of(from_dict({
        "name": "d", "cluster": {"devices": [{"type": "t4", "count": 1}], "ps": {"shards": 1, "type": "cpu-8c"},
                                 "network": {"bandwidth_gbps": 10}},
        "job": {"model": "mlp", "global_batch": 8, "iterations": 2}}, repo, "<t>"))
    assert validate.memory_factor(sheet, probe=lambda n: 1.0) is None
