"""The `hetsim` command as a user meets it: files in, files out, one-line errors.

Most tests call ``experiments.cli.main([...])`` in-process (fast); a few run
the installed console script in a subprocess to prove the real entry point
exits 2 without a traceback. Every file and output lives under ``tmp_path``.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from experiments.cli import main
from hardware_profiles.errors import ConfigError
from sim.config import Config
from sim.plan import Plan, Replica, Stage, check_plan, load_plan
from sim.problem import build_problem
from sim.result import HEADLINE_KEYS

HETSIM = Path(sys.executable).with_name("hetsim")
RUN_FILES = {"summary.json", "iterations.csv", "trace.json", "plan.json", "config.json"}
SUMMARY_KEYS = {
    "schema", "name", "evaluator", "scheduler", "seed", "throughput_sps", "throughput_window",
    "iteration_time_s",
    "iterations", "elapsed_s", "time_to_target_s", "cost_usd", "energy_j", "utilization",
    # documented extras: per-worker time split and the failures that happened
    "workers", "failures",
}

BASE: dict[str, Any] = {
    "name": "small",
    "cluster": {
        "devices": [{"type": "t4", "count": 1}, {"type": "cpu-8c", "count": 2}],
        "network": {"bandwidth_gbps": 10},
    },
    "job": {"model": "mlp", "global_batch": 64, "iterations": 6},
}


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Any default output folder (results/...) lands in tmp_path, never in the repo.
    monkeypatch.chdir(tmp_path)


def write_config(path: Path, data: dict[str, Any] | None = None,
                 edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    d = json.loads(json.dumps(BASE if data is None else data))  # deep copy
    if edit is not None:
        edit(d)
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, err: str, file: str | Path, field: str) -> str:
    """Exit 2; stderr is exactly one line naming ``file`` and ``field``; no traceback."""
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    where = f"{file}: {field}: " if field else f"{file}: "
    assert lines[0].startswith(f"hetsim: error: {where}"), lines[0]
    return lines[0]


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as f:
        r = csv.DictReader(f)
        return list(r.fieldnames or []), list(r)


def files_in(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


# ----------------------------------------------------------------------------------------
# Bad input: exit 2, one line naming file and field, no traceback.
# Each case writes what it needs into tmp_path and returns (argv, file, field).
# ----------------------------------------------------------------------------------------
Case = Callable[[Path], tuple[list[str], "str | Path", str]]


def _edit_case(edit: Callable[[dict[str, Any]], None], field: str) -> Case:
    def make(tmp: Path) -> tuple[list[str], str | Path, str]:
        cfg = write_config(tmp / "c.yaml", edit=edit)
        return ["simulate", str(cfg), "--out", str(tmp / "out")], cfg, field
    return make


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for p in parents:
            d = d.setdefault(p, {})
        d[last] = value
    return edit


def _unknown_device(d: dict[str, Any]) -> None:
    d["cluster"]["devices"][0]["type"] = "no-such-gpu"


def _malformed_yaml(tmp: Path) -> tuple[list[str], str | Path, str]:
    cfg = tmp / "c.yaml"
    # line 6 maps a value to a value: "mapping values are not allowed here"
    cfg.write_text("name: t\nseed: 0\ncluster: {devices: [{type: t4}]}\njob:\n"
                   "  model: mlp\n  global_batch: 8: 9\n")
    return ["simulate", str(cfg), "--out", str(tmp / "out")], cfg, "line 6"


def _missing_config(tmp: Path) -> tuple[list[str], str | Path, str]:
    cfg = tmp / "does-not-exist.yaml"
    return ["simulate", str(cfg), "--out", str(tmp / "out")], cfg, ""


def _model_file_bad_layer(tmp: Path) -> tuple[list[str], str | Path, str]:
    (tmp / "m.yaml").write_text(
        "name: tiny\nlayers:\n"
        "  - {name: fc0, op: gemm, fwd_flops: 1.0e6, bwd_flops: 2.0e6, param_bytes: 4.0e6, activation_bytes: 1024}\n"
        "  - {name: fc1, op: gemm, fwd_flops: lots, bwd_flops: 2.0e6, param_bytes: 4.0e6, activation_bytes: 40}\n"
    )
    cfg = write_config(tmp / "c.yaml", edit=_set("job.model", {"file": "m.yaml"}))
    # model paths are relative to the config file; the error names the model file
    return ["simulate", str(cfg), "--out", str(tmp / "out")], (tmp / "m.yaml").resolve(), "layers[1].fwd_flops"


def _profile_bad_field(tmp: Path) -> tuple[list[str], str | Path, str]:
    (tmp / "p").mkdir()
    prof = dict(MY_GPU)
    prof["power_w"] = {"idle": -5, "active": 300}
    (tmp / "p" / "my-gpu.json").write_text(json.dumps(prof))

    def edit(d: dict[str, Any]) -> None:
        d["profiles"] = ["p/"]
        d["cluster"]["devices"][0]["type"] = "my-gpu"

    cfg = write_config(tmp / "c.yaml", edit=edit)
    return ["simulate", str(cfg), "--out", str(tmp / "out")], (tmp / "p" / "my-gpu.json").resolve(), "power_w.idle"


def _out_under_file(tmp: Path) -> tuple[list[str], str | Path, str]:
    cfg = write_config(tmp / "c.yaml")
    (tmp / "a-file").write_text("I am a file\n")
    out = tmp / "a-file" / "out"
    return ["simulate", str(cfg), "--out", str(out)], out, "--out"


def _plan_out_under_file(tmp: Path) -> tuple[list[str], str | Path, str]:
    cfg = write_config(tmp / "c.yaml")
    (tmp / "a-file").write_text("I am a file\n")
    return ["plan", str(cfg), "--out", str(tmp / "a-file" / "p.json")], tmp / "a-file", "--out"


def _compare_out_under_file(tmp: Path) -> tuple[list[str], str | Path, str]:
    cfg = write_config(tmp / "c.yaml")
    (tmp / "a-file").write_text("I am a file\n")
    out = tmp / "a-file" / "cmp"
    return ["compare", str(cfg), "--schedulers", "equal", "--out", str(out)], out, "--out"


def _demo_out_under_file(tmp: Path) -> tuple[list[str], str | Path, str]:
    (tmp / "a-file").write_text("I am a file\n")
    out = tmp / "a-file" / "demo"
    return ["demo", "--quiet", "--out", str(out)], out, "--out"


def _plan_cmd_unknown_scheduler(tmp: Path) -> tuple[list[str], str | Path, str]:
    cfg = write_config(tmp / "c.yaml")
    return ["plan", str(cfg), "--scheduler", "no-such-scheduler"], cfg, "scheduler.name"


ERROR_CASES: dict[str, Case] = {
    "unknown device type": _edit_case(_unknown_device, "cluster.devices[0].type"),
    "unknown model": _edit_case(_set("job.model", "no-such-model"), "job.model"),
    "zero batch": _edit_case(_set("job.global_batch", 0), "job.global_batch"),
    "negative batch": _edit_case(_set("job.global_batch", -32), "job.global_batch"),
    "zero bandwidth": _edit_case(_set("cluster.network.bandwidth_gbps", 0), "cluster.network.bandwidth_gbps"),
    "malformed yaml": _malformed_yaml,
    "missing config file": _missing_config,
    "unknown top-level field": _edit_case(_set("foo", 1), "foo"),
    "unknown nested field": _edit_case(_set("job.foo", 1), "job.foo"),
    "unknown scheduler": _edit_case(_set("scheduler", {"name": "no-such-scheduler"}), "scheduler.name"),
    "unknown scheduler param": _edit_case(
        _set("scheduler", {"name": "proportional", "params": {"zap": 3}}), "scheduler.params.zap"),
    "dynamics on a nonexistent worker": _edit_case(
        _set("dynamics", [{"worker": 3, "at_s": 0.1, "slowdown": 2.0}]), "dynamics[0].worker"),
    "model file with a bad layer field": _model_file_bad_layer,
    "user profile with a bad field": _profile_bad_field,
    "unwritable --out (simulate)": _out_under_file,
    "unwritable --out (plan)": _plan_out_under_file,
    "unwritable --out (compare)": _compare_out_under_file,
    "unwritable --out (demo)": _demo_out_under_file,
    "plan --scheduler unknown": _plan_cmd_unknown_scheduler,
}


@pytest.mark.parametrize("case", list(ERROR_CASES), ids=list(ERROR_CASES))
def test_bad_input_is_one_line_exit_2(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv, file, field = ERROR_CASES[case](tmp_path)
    rc, out, err = cli(capsys, *argv)
    line = assert_one_line_error(rc, err, file, field)
    if case == "missing config file":
        assert line.endswith("file not found")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_compare_unknown_scheduler_names_the_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path / "c.yaml")
    rc, _, err = cli(capsys, "compare", str(cfg), "--schedulers", "equal,nope", "--out", str(tmp_path / "o"))
    assert rc == 2 and "Traceback" not in err
    assert err.splitlines() == [err.strip()]
    assert "--schedulers" in err and "'nope'" in err


@pytest.mark.parametrize("case", ["unknown device type", "missing config file"])
def test_console_script_exits_2_without_traceback(case: str, tmp_path: Path) -> None:
    argv, file, field = ERROR_CASES[case](tmp_path)
    p = subprocess.run([str(HETSIM), *argv], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert p.stdout == ""
    assert_one_line_error(p.returncode, p.stderr, file, field)


def test_non_utf8_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(b"name: \xff\xfe\n")
    try:
        rc, _, err = cli(capsys, "simulate", str(cfg), "--out", str(tmp_path / "o"))
    except UnicodeDecodeError:
        pytest.fail("UnicodeDecodeError escaped")
    assert_one_line_error(rc, err, cfg, "")


def test_non_utf8_model_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.yaml").write_bytes(b"name: \xff\xfe\n")
    cfg = write_config(tmp_path / "c.yaml", edit=_set("job.model", {"file": "m.yaml"}))
    try:
        rc, _, err = cli(capsys, "simulate", str(cfg), "--out", str(tmp_path / "o"))
    except UnicodeDecodeError:
        pytest.fail("UnicodeDecodeError escaped")
    assert_one_line_error(rc, err, (tmp_path / "m.yaml").resolve(), "")


def test_bad_option_value_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path / "c.yaml")
    with pytest.raises(SystemExit) as e:
        main(["simulate", str(cfg), "--evaluator", "exact", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert len(err.splitlines()) == 1, err


# --- a plan whose shares do not sum to the global batch ------------------------------------
# No CLI command takes a plan file yet (`hetsim run PLAN_OR_CONFIG` is planned), so this is
# checked where the CLI will check it: sim.plan.load_plan + check_plan.
def test_plan_shares_not_summing_to_batch(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "c.yaml")
    problem = build_problem(Config.model_validate(yaml.safe_load(cfg.read_text())), tmp_path, str(cfg))
    n_layers = len(problem.job.model.layers)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps({
        "schema": 1, "scheduler": "by-hand",
        "stages": [{"layers": [0, n_layers], "device_type": None,
                    "replicas": [{"device": "t4:0", "batch": 40}, {"device": "cpu-8c:0", "batch": 20}]}],
        "ps_shards": ["ps:0"], "options": {},
    }))
    plan = load_plan(plan_file)
    with pytest.raises(ConfigError) as e:
        check_plan(plan, problem, source=str(plan_file))
    assert e.value.file == str(plan_file)
    assert e.value.field == "stages[0].replicas"
    assert "60" in e.value.message and "64" in e.value.message
    assert "\n" not in str(e.value)
    # the same plan with shares that do sum is accepted
    ok = Plan((Stage(0, n_layers, (Replica("t4:0", 44), Replica("cpu-8c:0", 20))),), ("ps:0",), "by-hand")
    check_plan(ok, problem)


def test_simulate_with_a_hand_written_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path / "c.yaml")
    rc, out, _ = cli(capsys, "plan", str(cfg), "--scheduler", "equal", "--out", str(tmp_path / "p.json"))
    assert rc == 0
    plan = json.loads((tmp_path / "p.json").read_text())
    reps = plan["stages"][0]["replicas"]
    # move one sample from the first replica to the second: still sums to the batch
    reps[0]["batch"] -= 1
    reps[1]["batch"] += 1
    (tmp_path / "p.json").write_text(json.dumps(plan))
    rc, _, err = cli(capsys, "simulate", str(cfg), "--plan", str(tmp_path / "p.json"), "--out", str(tmp_path / "o"))
    assert rc == 0, err
    used = json.loads((tmp_path / "o" / "plan.json").read_text())
    assert [r["batch"] for r in used["stages"][0]["replicas"]] == [r["batch"] for r in reps]
    # a plan whose shares do not sum to the global batch: one line naming the plan file
    reps[0]["batch"] += 5
    (tmp_path / "bad.json").write_text(json.dumps(plan))
    rc, _, err = cli(capsys, "simulate", str(cfg), "--plan", str(tmp_path / "bad.json"), "--out", str(tmp_path / "o2"))
    assert_one_line_error(rc, err, tmp_path / "bad.json", "stages[0].replicas")
    rc, _, err = cli(capsys, "simulate", str(cfg), "--plan", str(tmp_path / "p.json"), "--scheduler", "equal")
    assert_one_line_error(rc, err, "<command line>", "--plan")


# ----------------------------------------------------------------------------------------
# simulate: the five files, the summary schema, the resolved config, determinism
# ----------------------------------------------------------------------------------------
def _check_run_folder(d: Path, evaluator: str, batch: int, iterations: int) -> dict[str, Any]:
    # the analytic evaluator has no timeline to show: no trace.json
    assert files_in(d) == (RUN_FILES if evaluator == "des" else RUN_FILES - {"trace.json"})
    s = json.loads((d / "summary.json").read_text())
    assert set(s) == SUMMARY_KEYS
    assert s["schema"] == 1 and s["evaluator"] == evaluator
    assert set(s["iteration_time_s"]) == {"mean", "p50", "p95"}
    assert 0 < s["iteration_time_s"]["p50"] <= s["iteration_time_s"]["p95"] * (1 + 1e-12)
    assert s["iterations"] == iterations
    assert s["throughput_sps"] > 0 and s["elapsed_s"] > 0 and s["cost_usd"] > 0 and s["energy_j"] > 0
    assert s["time_to_target_s"] is None
    assert "ps:0" in s["utilization"]
    assert all(0.0 <= u <= 1.0 for u in s["utilization"].values())
    cols, rows = read_csv(d / "iterations.csv")
    assert cols == ["iteration", "start_s", "end_s", "time_s", "samples"]
    assert len(rows) == iterations
    assert all(int(r["samples"]) == batch for r in rows)
    assert float(rows[-1]["end_s"]) == pytest.approx(s["elapsed_s"])
    if evaluator == "des":
        trace = json.loads((d / "trace.json").read_text())
        spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
        assert spans and all({"name", "pid", "tid", "ts", "dur"} <= set(e) for e in spans)
    plan = json.loads((d / "plan.json").read_text())
    assert plan["schema"] == 2
    assert plan["kind"] == ("placement" if "placement" in plan["options"] else "data_parallel")
    assert sum(r["batch"] for r in plan["stages"][0]["replicas"]) == batch
    return s


@pytest.mark.parametrize("evaluator", ["des", "analytic"])
def test_simulate_writes_the_five_files(evaluator: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path / "c.yaml")
    rc, out, err = cli(capsys, "simulate", str(cfg), "--evaluator", evaluator, "--out", str(tmp_path / "o"))
    assert rc == 0, err
    assert "throughput_sps" in out
    s = _check_run_folder(tmp_path / "o", evaluator, 64, 6)
    assert s["name"] == "small" and s["scheduler"] == "proportional" and s["seed"] == 0
    assert set(s["workers"]) <= {"t4:0", "cpu-8c:0", "cpu-8c:1"} and s["workers"]
    assert s["failures"] == []
    # the files said written are those there: no trace.json without a timeline (analytic)
    trace = "trace.json, " if evaluator == "des" else ""
    assert out.splitlines()[-1] == f"wrote {tmp_path / 'o'}/ (summary.json, iterations.csv, {trace}plan.json, config.json)"

    # config.json: the resolved config, every default filled in
    c = json.loads((tmp_path / "o" / "config.json").read_text())
    assert Config.model_validate(c) == Config.model_validate(BASE)
    assert c["seed"] == 0 and c["profiles"] == [] and c["dynamics"] == []
    assert c["cluster"]["ps"] == {"shards": 1, "type": "cpu-16c"}
    assert c["cluster"]["network"] == {"bandwidth_gbps": 10.0, "latency_us": 50.0,
                                       "sharing": "fair", "overrides": {}}
    assert c["cluster"]["devices"] == [{"type": "t4", "count": 1}, {"type": "cpu-8c", "count": 2}]
    assert c["job"] == {
        "model": "mlp", "global_batch": 64, "dtype": "fp32", "iterations": 6, "samples": None,
        "target_loss": None, "sync": "bsp", "staleness": 0, "pipeline": False,
        "quantization": "none", "failure_timeout_s": 5.0, "warmup_iterations": 1,
    }
    assert c["objective"] == {"minimize": "time", "throughput_min": None, "deadline_s": None,
                              "budget_usd": None}
    assert c["scheduler"] == {"name": "proportional", "params": {}}


@pytest.mark.parametrize("evaluator", ["des", "analytic"])
def test_same_config_twice_is_byte_identical(evaluator: str, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    def edit(d: dict[str, Any]) -> None:  # contention, a shard per two workers, and a slowdown
        d["seed"] = 7
        d["cluster"]["ps"] = {"shards": 2}
        d["dynamics"] = [{"worker": 1, "at_s": 0.02, "slowdown": 1.5}]

    cfg = write_config(tmp_path / "c.yaml", edit=edit)
    for out in ("a", "b"):
        rc, _, err = cli(capsys, "simulate", str(cfg), "--evaluator", evaluator, "--out", str(tmp_path / out))
        assert rc == 0, err
    for name in ("summary.json", "iterations.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_an_analytic_run_over_a_des_run_leaves_no_stale_trace(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path / "c.yaml")
    assert cli(capsys, "simulate", str(cfg), "--evaluator", "des", "--out", str(tmp_path / "o"))[0] == 0
    assert (tmp_path / "o" / "trace.json").is_file()
    assert cli(capsys, "simulate", str(cfg), "--evaluator", "analytic", "--out", str(tmp_path / "o"))[0] == 0
    assert files_in(tmp_path / "o") == RUN_FILES - {"trace.json"}


def test_scheduler_override_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path / "c.yaml")
    rc, _, err = cli(capsys, "simulate", str(cfg), "--scheduler", "equal", "--out", str(tmp_path / "o"))
    assert rc == 0, err
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["scheduler"] == "equal"


# ----------------------------------------------------------------------------------------
# plan, compare, demo
# ----------------------------------------------------------------------------------------
def test_plan_writes_a_valid_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path / "c.yaml", edit=_set("job.global_batch", 65))
    out = tmp_path / "plans" / "p.json"  # the parent folder is created
    rc, _, err = cli(capsys, "plan", str(cfg), "--scheduler", "equal", "--out", str(out))
    assert rc == 0, err
    plan = load_plan(out)
    assert plan.scheduler == "equal"
    shares = [r.batch for r in plan.replicas]
    assert sum(shares) == 65 and max(shares) - min(shares) <= 1 and len(shares) == 3
    problem = build_problem(Config.model_validate(yaml.safe_load(cfg.read_text())), tmp_path, str(cfg))
    check_plan(plan, problem)

    rc, text, _ = cli(capsys, "plan", str(cfg))  # no --out: the JSON on stdout
    assert rc == 0
    assert sum(r["batch"] for r in json.loads(text)["stages"][0]["replicas"]) == 65


def test_compare_writes_table_plot_and_folders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path / "c.yaml")
    d = tmp_path / "cmp"
    rc, out, err = cli(capsys, "compare", str(cfg), "--schedulers", "equal,proportional", "--out", str(d))
    assert rc == 0, err
    assert {"comparison.csv", "comparison.png", "equal", "proportional"} <= files_in(d)
    assert (d / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cols, rows = read_csv(d / "comparison.csv")
    assert cols[0] == "scheduler"
    assert set(HEADLINE_KEYS) <= set(cols)
    assert [r["scheduler"] for r in rows] == ["equal", "proportional"]
    for r in rows:
        s = _check_run_folder(d / r["scheduler"], "des", 64, 6)
        assert s["scheduler"] == r["scheduler"]
        assert float(r["throughput_sps"]) == s["throughput_sps"]
        assert float(r["cost_usd"]) == s["cost_usd"]
        assert r["time_to_target_s"] == ""  # None is an empty cell


def test_demo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "demo"
    rc, out, err = cli(capsys, "demo", "--out", str(d), "--quiet")
    assert rc == 0, err
    assert err == ""  # --quiet: no progress bar
    assert {"comparison.csv", "comparison.png", "trace.json"} <= files_in(d)
    assert (d / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((d / "trace.json").read_text())["traceEvents"]
    cols, rows = read_csv(d / "comparison.csv")
    assert len(rows) == 4
    assert {"model", "scheduler", "throughput_sps", "cost_usd"} <= set(cols)
    for r in rows:
        _check_run_folder(d / r["model"] / r["scheduler"], "des", 256, 30)
    assert len([ln for ln in out.splitlines() if ln.startswith(("resnet18", "ctr_dnn"))]) == 4


# ----------------------------------------------------------------------------------------
# A new user's own hardware and model, in the documented formats
# ----------------------------------------------------------------------------------------
MY_GPU: dict[str, Any] = {  # hardware_profiles/README.md, "Minimal example"
    "schema": 1, "name": "my-gpu", "kind": "gpu",
    "peak_flops": {"fp32": 20e12, "bf16": 160e12},
    "mem_bw_Bps": 1e12, "memory_bytes": 48e9, "launch_overhead_s": 5e-6,
    "efficiency": {"gemm": 0.7, "conv": {"flops": [1e6, 1e9], "eff": [0.2, 0.6]}},
    "nic_bw_Bps": 3.125e9, "price_per_hour": 1.5,
    "power_w": {"idle": 30, "active": 300},
    "source": {"kind": "datasheet", "note": "vendor sheet, my cloud's price", "date": "2026-11-30"},
}

MY_CPU_JSON = """{"schema": 1, "name": "my-cpu", "kind": "cpu",
 "peak_flops": {"fp32": 1.0e12},
 "mem_bw_Bps": 50e9, "memory_bytes": 64e9, "launch_overhead_s": 1e-6,
 "nic_bw_Bps": 1.25e9, "price_per_hour": 0.4,
 "power_w": {"idle": 20, "active": 90},
 "source": {"kind": "datasheet", "note": "my workstation, guessed", "date": "2026-11-30"}}
"""

# ARCHITECTURE.md, "Layer-list model file", plus a head layer
TINY_MODEL_YAML = """name: tiny
layers:
  - {name: emb, op: embedding, fwd_flops: 0, bwd_flops: 0,
     param_bytes: 4.0e8, activation_bytes: 512,
     sparse: {rows_per_sample: 26, row_bytes: 64}}
  - {name: fc1, op: gemm, fwd_flops: 1.0e6, bwd_flops: 2.0e6,
     param_bytes: 2.0e6, activation_bytes: 1024}
  - {name: head, op: gemm, fwd_flops: 2.0e4, bwd_flops: 4.0e4,
     param_bytes: 4.0e4, activation_bytes: 40}
"""

USER_CONFIG_YAML = """# my first experiment
name: mine
seed: 1
profiles: [my_profiles/]
cluster:
  devices:
    - {type: my-gpu, count: 2}
    - {type: my-cpu, count: 2}
    - {type: t4, count: 1}
  ps: {shards: 2, type: my-cpu}
  network: {bandwidth_gbps: 25, latency_us: 20}
job:
  model: {file: models/tiny.yaml}
  global_batch: 512
  iterations: 12
objective: {minimize: cost}
scheduler: {name: proportional, params: {rounds: 3}}
"""


def test_user_profiles_and_model_file_simulate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proj = tmp_path / "project"
    (proj / "my_profiles").mkdir(parents=True)
    (proj / "models").mkdir()
    (proj / "my_profiles" / "my-gpu.json").write_text(json.dumps(MY_GPU, indent=1))
    (proj / "my_profiles" / "my-cpu.json").write_text(MY_CPU_JSON)
    (proj / "models" / "tiny.yaml").write_text(TINY_MODEL_YAML)
    (proj / "exp.yaml").write_text(USER_CONFIG_YAML)

    results = {}
    for evaluator in ("des", "analytic"):
        out = tmp_path / "res" / evaluator
        # run from elsewhere: paths in the config are relative to the config file
        rc, _, err = cli(capsys, "simulate", str(proj / "exp.yaml"), "--evaluator", evaluator, "--out", str(out))
        assert rc == 0, err
        s = _check_run_folder(out, evaluator, 512, 12)
        assert s["name"] == "mine" and s["seed"] == 1
        assert {"ps:0", "ps:1"} <= set(s["utilization"])
        plan = json.loads((out / "plan.json").read_text())
        devices = {r["device"] for r in plan["stages"][0]["replicas"]}
        assert {"my-gpu:0", "my-gpu:1"} <= devices
        assert plan["stages"][0]["layers"] == [0, 3]
        results[evaluator] = s
    # same plan, same model: the two evaluators tell the same story
    assert results["analytic"]["throughput_sps"] == pytest.approx(results["des"]["throughput_sps"], rel=0.1)


def test_compare_by_default_skips_schedulers_that_cannot_plan(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # The demo config minimises time over a 60-layer model: bruteforce (3 ** 60 placements)
    # and exact (cost only) cannot plan it; every other registered scheduler can.
    demo = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "demo.yaml"
    assert main(["compare", str(demo), "--evaluator", "analytic", "--out", str(tmp_path / "c")]) == 0
    err = capsys.readouterr().err
    skipped = sorted(line.split(":")[1].strip().split()[-1] for line in err.splitlines()
                     if line.startswith("hetsim: skipped"))
    assert skipped == ["bruteforce", "exact"]
    with (tmp_path / "c" / "comparison.csv").open() as f:
        ran = {r["scheduler"] for r in csv.DictReader(f)}
    import schedulers

    assert ran == set(schedulers.names()) - {"bruteforce", "exact"}
    # asked for by name, the same error ends the command
    assert main(["compare", str(demo), "--schedulers", "bruteforce", "--out", str(tmp_path / "d")]) == 2
