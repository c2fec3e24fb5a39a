"""Sweeps: point expansion, dotted paths, ids, error rows, resume, dask, Ctrl-C.

Process tests run the installed `hetsim` console script in a new session so
that a test can stop the whole process group; every output lives under
``tmp_path`` and every cluster binds 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from experiments.cli import main
from experiments.sweep import (
    Sweep,
    load_sweep,
    parse_path,
    point_id,
    run_sweep,
    set_path,
    sweep_from_dict,
)
from hardware_profiles.errors import ConfigError
from sim.result import HEADLINE_KEYS

HETSIM = Path(sys.executable).with_name("hetsim")
REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "experiments" / "configs" / "demo.yaml"
SWEEPS = REPO / "experiments" / "sweeps"

BASE: dict[str, Any] = {
    "name": "small",
    "cluster": {"devices": [{"type": "t4", "count": 1}, {"type": "cpu-8c", "count": 2}]},
    "job": {"model": "mlp", "global_batch": 64, "iterations": 6},
}

# A DES sweep slow enough (about 0.2 s a point) to be stopped half-way.
SLOW = {
    "base": str(DEMO),
    "evaluator": "des",
    "grid": {"job.iterations": [1000], "cluster.network.bandwidth_gbps": [2, 4, 6, 8, 10, 12],
             "scheduler.name": ["equal", "proportional"]},
}


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # default output folders land in tmp_path


def sweep_of(**parts: Any) -> Sweep:
    return sweep_from_dict({"base": json.loads(json.dumps(BASE)), **parts}, "sw.yaml", ".")


def write_sweep(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def rows_by_id(csv_path: Path) -> dict[str, dict[str, str]]:
    with csv_path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    ids = [r["point_id"] for r in rows]
    assert len(ids) == len(set(ids)), "a point appears twice"
    return {r["point_id"]: r for r in rows}


def assert_whole_lines(csv_path: Path) -> None:
    data = csv_path.read_bytes()
    assert data.endswith(b"\n")
    n_cols = len(data.splitlines()[0].split(b","))
    for line in csv.reader(data.decode().splitlines()):
        assert len(line) == n_cols, line


def values(sweep: Sweep, *axes: str) -> list[tuple[Any, ...]]:
    return [tuple(p.values[a] for a in axes) for p in sweep.points()]


# ---------------------------------------------------------------- expansion
def test_grid_is_every_combination_last_axis_fastest() -> None:
    sw = sweep_of(grid={"cluster.network.bandwidth_gbps": [1, 10], "scheduler.name": ["equal", "proportional"]})
    assert values(sw, "cluster.network.bandwidth_gbps", "scheduler.name") == [
        (1, "equal"), (1, "proportional"), (10, "equal"), (10, "proportional")]
    p = sw.points()[1]
    assert p.config["cluster"]["network"] == {"bandwidth_gbps": 1}  # created in the base
    assert p.config["scheduler"] == {"name": "proportional"}
    # setting a point's fields leaves the sweep's own base untouched
    assert sw.base["cluster"] == {"devices": [{"type": "t4", "count": 1}, {"type": "cpu-8c", "count": 2}]}


def test_zip_takes_lists_together_and_unequal_lengths_are_an_error() -> None:
    sw = sweep_of(zip={"name": ["a", "b", "c"], "cluster.devices[1].count": [1, 2, 3]})
    assert values(sw, "name", "cluster.devices[1].count") == [("a", 1), ("b", 2), ("c", 3)]
    with pytest.raises(ConfigError) as e:
        sweep_of(zip={"name": ["a", "b", "c"], "seed": [1, 2]})
    assert (e.value.file, e.value.field) == ("sw.yaml", "zip: seed")
    assert "name: 3, seed: 2" in e.value.message


def test_random_is_seeded_in_bounds_and_typed() -> None:
    axes = {"job.global_batch": {"low": 64, "high": 1024, "log": True, "int": True},
            "cluster.network.latency_us": {"low": 10.0, "high": 20.0},
            "seed": {"low": 0, "high": 3, "int": True},
            "job.sync": {"choices": ["bsp", "asp"]}}
    a = sweep_of(random={"samples": 30, "seed": 7, "axes": axes})
    again = sweep_of(random={"samples": 30, "seed": 7, "axes": axes})
    other = sweep_of(random={"samples": 30, "seed": 8, "axes": axes})
    assert [p.values for p in a.points()] == [p.values for p in again.points()]
    assert [p.point_id for p in a.points()] == [p.point_id for p in again.points()]
    assert [p.values for p in a.points()] != [p.values for p in other.points()]
    pts = a.points()
    assert len(pts) == 30
    for p in pts:
        assert type(p.values["job.global_batch"]) is int and 64 <= p.values["job.global_batch"] <= 1024
        assert type(p.values["cluster.network.latency_us"]) is float
        assert 10.0 <= p.values["cluster.network.latency_us"] <= 20.0
        assert p.values["seed"] in {0, 1, 2, 3}
    assert {p.values["job.sync"] for p in pts} == {"bsp", "asp"}
    assert {p.values["seed"] for p in pts} == {0, 1, 2, 3}


def test_combined_is_grid_times_zip_rows_times_samples() -> None:
    sw = sweep_of(grid={"scheduler.name": ["equal", "proportional"]},
                  zip={"name": ["a", "b", "c"], "seed": [1, 2, 3]},
                  random={"samples": 2, "seed": 0, "axes": {"job.global_batch": {"low": 8, "high": 512, "int": True}}})
    assert sw.axes() == ["scheduler.name", "name", "seed", "job.global_batch"]
    pts = sw.points()
    assert len(pts) == 12
    batches = [p.values["job.global_batch"] for p in pts[:2]]
    assert [(p.values["scheduler.name"], p.values["name"], p.values["seed"], p.values["job.global_batch"])
            for p in pts[:4]] == [("equal", "a", 1, batches[0]), ("equal", "a", 1, batches[1]),
                                  ("equal", "b", 2, batches[0]), ("equal", "b", 2, batches[1])]
    assert pts[6].values["scheduler.name"] == "proportional"


# ---------------------------------------------------------------- dotted paths
def test_parse_and_set_paths() -> None:
    assert parse_path("cluster.devices[1].count") == ("cluster", "devices", 1, "count")
    assert parse_path("cluster.network.overrides.t4:0") == ("cluster", "network", "overrides", "t4:0")
    data: dict[str, Any] = {"cluster": {"devices": [{"type": "t4"}, {"type": "v100"}]}}
    set_path(data, parse_path("cluster.devices[1].count"), 3)
    set_path(data, parse_path("objective.throughput_min"), 50.0)
    assert data == {"cluster": {"devices": [{"type": "t4"}, {"type": "v100", "count": 3}]},
                    "objective": {"throughput_min": 50.0}}
    with pytest.raises(ValueError, match="index 2 out of range: cluster.devices has 2 entries"):
        set_path(data, parse_path("cluster.devices[2].count"), 1)
    with pytest.raises(ValueError, match="not a dotted path"):
        parse_path("cluster..devices")


def test_index_out_of_range_names_the_sweep_file_and_axis() -> None:
    sw = sweep_of(grid={"cluster.devices[5].count": [1]})
    with pytest.raises(ConfigError) as e:
        sw.points()
    assert (e.value.file, e.value.field) == ("sw.yaml", "grid: cluster.devices[5].count")


@pytest.mark.parametrize("section,axis,spec,message", [
    ("grid", "cluster.network.bandwith_gbps", [1], "unknown field 'bandwith_gbps' in cluster.network"),
    ("zip", "cluster.devices.1.count", [1], "cluster.devices is a list: index it as cluster.devices[i]"),
    ("grid", "job.dtype.bits", [1], "job.dtype holds a single value"),
    ("random", "jobs.global_batch", {"low": 1, "high": 2}, "unknown field 'jobs' in the config"),
])
def test_unknown_path_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         section: str, axis: str, spec: Any, message: str) -> None:
    body: dict[str, Any] = {"samples": 2, "axes": {axis: spec}} if section == "random" else {axis: spec}
    path = write_sweep(tmp_path / "bad.yaml", {"base": str(DEMO), section: body})
    rc = main(["sweep", str(path), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    label = "random.axes" if section == "random" else section
    assert len(err.splitlines()) == 1
    assert err.startswith(f"hetsim: error: {path}: {label}: {axis}: ") and message in err


@pytest.mark.parametrize("data,field", [
    ({"base": str(DEMO), "grids": {}}, "grids"),
    ({"grid": {"seed": [1]}}, "base"),
    ({"base": "nope.yaml"}, "base"),
    ({"base": str(DEMO), "evaluator": "exact"}, "evaluator"),
    ({"base": str(DEMO), "grid": {"seed": []}}, "grid: seed"),
    ({"base": str(DEMO), "random": {"samples": 2, "axes": {"job.global_batch": {"low": 0, "high": 9, "log": True}}}},
     "random.axes: job.global_batch"),
    ({"base": str(DEMO), "random": {"samples": 0, "axes": {"seed": {"choices": [1]}}}}, "random.samples"),
])
def test_bad_sweep_files_name_the_field(tmp_path: Path, data: dict[str, Any], field: str) -> None:
    path = write_sweep(tmp_path / "bad.yaml", data)
    with pytest.raises(ConfigError) as e:
        load_sweep(path)
    assert (e.value.file, e.value.field) == (str(path), field)


# ---------------------------------------------------------------- point ids
def test_point_ids_are_stable_short_hashes() -> None:
    sw = sweep_of(grid={"cluster.network.bandwidth_gbps": [1, 10], "scheduler.name": ["equal", "proportional"]})
    ids = [p.point_id for p in sw.points()]
    assert len(set(ids)) == 4 and all(len(i) == 12 and int(i, 16) >= 0 for i in ids)
    assert ids == [p.point_id for p in sweep_of(grid=sw.grid).points()]
    cfg = sw.points()[0].config
    # Pinned: a change here re-runs every resumed sweep, so it must be deliberate.
    assert point_id(cfg, "analytic") == "ec72dc9b6f04"
    assert point_id(cfg, "des") != point_id(cfg, "analytic")
    # The id is of the resolved config: 1 and 1.0 Gbit/s, or a default spelled out, are the same point.
    same = json.loads(json.dumps(cfg))
    same["cluster"]["network"]["bandwidth_gbps"] = 1.0
    same["job"]["sync"] = "bsp"
    assert point_id(same, "analytic") == ids[0]
    assert len(sweep_of(grid={"cluster.network.bandwidth_gbps": [1, 1.0, 2]}).points()) == 2


# ---------------------------------------------------------------- running
def test_invalid_point_is_an_error_row_and_the_rest_succeed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_sweep(tmp_path / "bw.yaml", {
        "base": str(DEMO), "grid": {"cluster.network.bandwidth_gbps": [0, 10], "scheduler.name": ["equal", "nope"]}})
    rc = main(["sweep", str(path), "--jobs", "1", "--quiet"])
    out, err = capsys.readouterr()
    csv_path = tmp_path / "results" / "sweeps" / "bw" / "results.csv"
    # every row is written, then the failed points make the exit status 1, said in one line
    assert rc == 1
    assert err == (f"hetsim: 3 of 4 points failed: status error in {Path('results/sweeps/bw/results.csv')}, "
                   "the reason in its error column; exit status 1 (--allow-failures: 0)\n")
    assert "4 points: 1 ok, 3 error, 0 skipped" in out
    assert f"wrote {Path('results/sweeps/bw/results.csv')} (4 rows)" in out
    rows = rows_by_id(csv_path)
    with csv_path.open() as f:
        assert next(csv.reader(f)) == ["point_id", "cluster.network.bandwidth_gbps", "scheduler.name",
                                       "status", "error", *HEADLINE_KEYS]
    by_values = {(r["cluster.network.bandwidth_gbps"], r["scheduler.name"]): r for r in rows.values()}
    assert by_values["0", "equal"]["status"] == "error"
    assert by_values["0", "equal"]["error"] == "cluster.network.bandwidth_gbps: Input should be greater than 0"
    assert by_values["10", "nope"]["error"].startswith("scheduler.name: unknown scheduler 'nope'; known: ")
    assert by_values["0", "equal"]["throughput_sps"] == ""
    ok = by_values["10", "equal"]
    assert (ok["status"], ok["error"]) == ("ok", "")
    summary = json.loads((csv_path.parent / "runs" / ok["point_id"] / "summary.json").read_text())
    assert float(ok["throughput_sps"]) == summary["throughput_sps"]
    assert {p.name for p in (csv_path.parent / "runs" / ok["point_id"]).iterdir()} == {
        "summary.json", "iterations.csv", "plan.json", "config.json", "point.json"}  # no trace: trace: false
    bad = json.loads((csv_path.parent / "runs" / by_values["0", "equal"]["point_id"] / "point.json").read_text())
    assert bad["status"] == "error" and bad["values"] == {"cluster.network.bandwidth_gbps": 0, "scheduler.name": "equal"}


def test_trace_true_writes_trace_and_jobs_2_equals_jobs_1(tmp_path: Path) -> None:
    sw = sweep_of(evaluator="des", trace=True, grid={"scheduler.name": ["equal", "proportional"], "seed": [0, 1]})
    one = run_sweep(sw, tmp_path / "one", jobs=1, progress=False)
    two = run_sweep(sw, tmp_path / "two", jobs=2, progress=False)
    assert one.attrs["sweep"]["ok"] == two.attrs["sweep"]["ok"] == 4
    assert rows_by_id(tmp_path / "one" / "results.csv") == rows_by_id(tmp_path / "two" / "results.csv")
    trace = json.loads((tmp_path / "one" / "runs" / one["point_id"][0] / "trace.json").read_text())
    assert trace["traceEvents"]
    again = run_sweep(sw, tmp_path / "one", jobs=2, progress=False)
    assert again.attrs["sweep"] | {"wall_s": 0} == {"points": 4, "skipped": 4, "ok": 0, "error": 0,
                                                    "csv": str(tmp_path / "one" / "results.csv"), "wall_s": 0}
    assert len(again) == 4


def test_trailing_partial_line_is_repaired(tmp_path: Path) -> None:
    sw = sweep_of(grid={"cluster.network.bandwidth_gbps": [1, 2, 5, 10]})
    run_sweep(sw, tmp_path / "o", progress=False)
    csv_path = tmp_path / "o" / "results.csv"
    clean = rows_by_id(csv_path)
    data = csv_path.read_bytes()
    cut = data[: data.rstrip(b"\n").rfind(b"\n") + 1 + 20]  # the last row, 20 bytes in
    csv_path.write_bytes(cut)
    df = run_sweep(sw, tmp_path / "o", progress=False)
    assert df.attrs["sweep"]["ok"] == 1 and df.attrs["sweep"]["skipped"] == 3
    assert_whole_lines(csv_path)
    assert rows_by_id(csv_path) == clean
    assert not list((tmp_path / "o").glob("*.tmp"))


def test_other_columns_in_the_table_are_refused(tmp_path: Path) -> None:
    run_sweep(sweep_of(grid={"seed": [0]}), tmp_path / "o", progress=False)
    with pytest.raises(ConfigError, match="columns differ"):
        run_sweep(sweep_of(grid={"seed": [0], "name": ["x"]}), tmp_path / "o", progress=False)


def _start(sweep_file: Path, out: Path, jobs: int) -> subprocess.Popen[str]:
    # SIGINT back to its default in the child: a test run started in the background (bash
    # without job control) ignores it, and the child would inherit that
    return subprocess.Popen([str(HETSIM), "sweep", str(sweep_file), "--jobs", str(jobs), "--out", str(out),
                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_rows(csv_path: Path, n: int, proc: subprocess.Popen[str], timeout_s: float = 60) -> int:
    """Poll until results.csv has at least n rows; return how many it has."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        rows = csv_path.read_bytes().count(b"\n") - 1 if csv_path.exists() else -1
        if rows >= n:
            return rows
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    raise AssertionError(f"no {n} rows in {timeout_s} s")


def test_killed_sweep_resumes_without_duplicates_or_losses(tmp_path: Path) -> None:
    path = write_sweep(tmp_path / "slow.yaml", SLOW)
    n = len(load_sweep(path).points())
    proc = _start(path, tmp_path / "killed", jobs=2)
    try:
        seen = _wait_rows(tmp_path / "killed" / "results.csv", 3, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its workers, mid-point
        proc.communicate()
    assert seen < n
    done = subprocess.run([str(HETSIM), "sweep", str(path), "--jobs", "2", "--out", str(tmp_path / "killed"),
                           "--quiet"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    killed = tmp_path / "killed" / "results.csv"
    assert_whole_lines(killed)
    resumed = rows_by_id(killed)
    skipped = int(done.stdout.split(" skipped")[0].rsplit(" ", 1)[1])
    assert skipped >= seen and len(resumed) == n
    clean = run_sweep(load_sweep(path), tmp_path / "clean", jobs=2, progress=False)
    assert len(clean) == n
    assert resumed == rows_by_id(tmp_path / "clean" / "results.csv")


def test_ctrl_c_exits_130_at_once_and_leaves_no_processes(tmp_path: Path) -> None:
    # Points of several seconds: the sweep must stop its workers, not wait for them.
    path = write_sweep(tmp_path / "slow.yaml", {**SLOW, "grid": {**SLOW["grid"], "job.iterations": [40000]}})
    proc = _start(path, tmp_path / "o", jobs=2)
    children: list[psutil.Process] = []
    try:
        end = time.monotonic() + 60
        while len(children) < 2 and time.monotonic() < end:
            assert proc.poll() is None, proc.communicate()
            children = psutil.Process(proc.pid).children(recursive=True)
            time.sleep(0.05)
        assert len(children) == 2  # the pool's workers
        time.sleep(0.5)  # both busy with a point
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
        stop_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, err
    assert err == (f"hetsim: interrupted: 0 points finished in this run, 12 not run; {tmp_path / 'o' / 'results.csv'} "
                   "is complete up to here: rerun the same command to resume\n")
    assert stop_s < 2.0
    # stopped and reaped before the sweep exited, not merely on their way out
    alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"orphans: {alive}"
    assert_whole_lines(tmp_path / "o" / "results.csv")


def test_dask_backend_gives_the_rows_of_the_local_backend(tmp_path: Path) -> None:
    from dask.distributed import LocalCluster

    sw = load_sweep(SWEEPS / "throughput_prices.yaml")
    local = rows_by_id(Path(run_sweep(sw, tmp_path / "local", jobs=2, progress=False).attrs["sweep"]["csv"]))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster:
        df = run_sweep(sw, tmp_path / "dask", backend="dask", address=cluster.scheduler_address, progress=False)
    assert df.attrs["sweep"]["ok"] == len(local) == 30
    assert rows_by_id(tmp_path / "dask" / "results.csv") == local
    # and without an address: a LocalCluster of `jobs` workers started and closed by the sweep
    own = run_sweep(sweep_of(grid={"seed": [0, 1]}), tmp_path / "own", jobs=2, backend="dask", progress=False)
    assert own.attrs["sweep"]["ok"] == 2


def test_example_sweeps_expand_to_valid_points() -> None:
    from experiments import runner

    for name, n in (("bandwidth_heterogeneity", 56), ("throughput_prices", 30)):
        sw = load_sweep(SWEEPS / f"{name}.yaml")
        pts = sw.points()
        assert len(pts) == n
        for p in pts:
            runner.problem_of(runner.from_dict(p.config, sw.base_dir, sw.source))  # profiles resolve


# ---------------------------------------------------------------- exit status
def test_failed_points_exit_1_after_every_row_and_allow_failures_exits_0(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_sweep(tmp_path / "f.yaml", {"base": str(DEMO), "grid": {"scheduler.name": ["equal", "nope"]}})
    out = tmp_path / "o"
    assert main(["sweep", str(path), "--jobs", "1", "--quiet", "--out", str(out), "--allow-failures"]) == 0
    assert "2 points: 1 ok, 1 error" in capsys.readouterr().out
    assert [r["status"] for r in rows_by_id(out / "results.csv").values()] == ["ok", "error"]
    # resumed: nothing left to run, and the failure from the earlier run still counts
    assert main(["sweep", str(path), "--jobs", "1", "--quiet", "--out", str(out)]) == 1
    o, err = capsys.readouterr()
    assert "0 ok, 0 error, 2 skipped" in o
    assert err.startswith("hetsim: 1 of 2 points failed (1 in an earlier run): status error in ")
    assert len(err.splitlines()) == 1
    # the library reports the failed points of this sweep, wherever they came from
    df = run_sweep(load_sweep(path), out, progress=False)
    assert df.attrs["failed"] == [p.point_id for p in load_sweep(path).points()
                                  if p.values["scheduler.name"] == "nope"]
    ok = write_sweep(tmp_path / "ok.yaml", {"base": str(DEMO), "grid": {"scheduler.name": ["equal"]}})
    assert main(["sweep", str(ok), "--jobs", "1", "--quiet", "--out", str(tmp_path / "ok")]) == 0


# ---------------------------------------------------------------- size bounds
@pytest.mark.parametrize("part,field,message", [
    ({"random": {"samples": 10**9, "axes": {"job.global_batch": {"low": 8, "high": 1024, "int": True}}}},
     "random.samples", "1,000,000,000 points, over the limit of 50,000 points per sweep"),
    ({"grid": {"job.global_batch": list(range(1, 10_001)), "seed": list(range(10_000))}},
     "grid", "10,000 x 10,000 = 100,000,000 points, over the limit of 50,000 points per sweep"),
    ({"grid": {"seed": list(range(300))}, "zip": {"job.global_batch": list(range(1, 301))},
      "random": {"samples": 1000, "axes": {"job.sync": {"choices": ["bsp", "asp"]}}}},
     "random.samples", "300 x 300 zip rows x 1,000 samples = 90,000,000 points"),
])
def test_too_many_points_are_refused_up_front_unless_forced(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], part: dict[str, Any], field: str, message: str) -> None:
    path = write_sweep(tmp_path / "big.yaml", {"base": str(DEMO), **part})
    t0 = time.monotonic()
    rc = main(["sweep", str(path), "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert time.monotonic() - t0 < 5  # counted, not made
    assert rc == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"hetsim: error: {path}: {field}: {message}")
    assert "pass --force" in err and "before the first one runs" in err
    assert not (tmp_path / "o").exists()  # nothing written
    with pytest.raises(ConfigError) as e:
        run_sweep(load_sweep(path), tmp_path / "o2", progress=False)
    assert e.value.field == field and not (tmp_path / "o2").exists()


def test_force_lifts_the_limit_and_the_limit_counts_before_duplicates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from experiments import sweep as sweep_mod

    sw = sweep_of(grid={"seed": [0, 1, 2]}, zip={"job.global_batch": [64, 64]})
    assert sw.size() == 6 and len(sw.points()) == 3  # 6 made, 3 distinct
    with pytest.raises(ConfigError, match="6 points, over the limit of 5"):
        sw.points(limit=5)
    assert len(sw.points(limit=None)) == 3
    small = sweep_of(grid={"seed": [0, 1]})
    monkeypatch.setattr(sweep_mod, "MAX_POINTS", 1)
    with pytest.raises(ConfigError, match="over the limit of 1 points per sweep"):
        run_sweep(small, tmp_path / "o", progress=False)
    assert run_sweep(small, tmp_path / "o", progress=False, force=True).attrs["sweep"]["ok"] == 2


# ---------------------------------------------------------------- kill -9, worker lifetime, the lock
def _gone(pids: list[psutil.Process], timeout_s: float = 10) -> list[psutil.Process]:
    """Wait until none of ``pids`` runs (exited; a zombie counts as exited); those still running."""
    end = time.monotonic() + timeout_s
    while True:
        alive = []
        for p in pids:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.05)


def test_kill_9_of_the_sweep_alone_takes_its_workers_and_the_same_command_resumes(tmp_path: Path) -> None:
    path = write_sweep(tmp_path / "slow.yaml", SLOW)
    n = len(load_sweep(path).points())
    out = tmp_path / "killed"
    proc = _start(path, out, jobs=2)
    workers: list[psutil.Process] = []
    try:
        seen = _wait_rows(out / "results.csv", 3, proc)
        workers = psutil.Process(proc.pid).children(recursive=True)
        assert len(workers) == 2
        os.kill(proc.pid, signal.SIGKILL)  # the sweep only, not its process group
        proc.wait(timeout=10)  # (not communicate: a surviving worker would hold the pipes open)
        # no worker outlives its sweep (by PID): the kernel kills them with their parent
        assert not _gone(workers), "workers outlived their sweep"
    finally:
        for w in [proc.pid, *(w.pid for w in workers)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w, signal.SIGKILL)
        proc.communicate()
    assert seen < n
    assert (out / ".sweep.lock").read_text().split()[0] == str(proc.pid)  # the dead owner, recorded
    done = subprocess.run([str(HETSIM), "sweep", str(path), "--jobs", "2", "--out", str(out), "--quiet"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # the lock was free: no note, no refusal
    assert_whole_lines(out / "results.csv")
    resumed = rows_by_id(out / "results.csv")  # (asserts every point_id appears once)
    skipped = int(done.stdout.split(" skipped")[0].rsplit(" ", 1)[1])
    assert skipped >= seen and len(resumed) == n
    clean = run_sweep(load_sweep(path), tmp_path / "clean", jobs=2, progress=False)
    assert len(clean) == n
    assert resumed == rows_by_id(tmp_path / "clean" / "results.csv")
    assert {d.name for d in (out / "runs").iterdir()} == set(resumed)
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


_HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.write(fd, sys.argv[2].encode())
print("held", flush=True)
time.sleep(120)
"""


def _hold_lock(lock: Path, owner: str) -> subprocess.Popen[str]:
    """A process that holds ``lock`` (flock) with ``owner`` written in it, as processes a
    killed sweep left behind would."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    p = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(lock), owner], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "held\n"
    return p


def test_a_lock_held_for_a_dead_owner_is_taken_over_with_a_note(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)
    out = tmp_path / "o"
    holder = _hold_lock(out / ".sweep.lock", f"{dead_pid} {socket.gethostname()}\n")
    try:
        df = run_sweep(sweep_of(grid={"seed": [0, 1]}), out, progress=False)
        assert df.attrs["sweep"]["ok"] == 2
        err = capsys.readouterr().err
        assert err == (f"hetsim: note: {out / '.sweep.lock'} was held for PID {dead_pid}, which is no longer "
                       "running (processes a killed sweep left behind?); taken over\n")
        # the new lock file names its (finished) owner, and no temporary is left
        assert (out / ".sweep.lock").read_text() == f"{os.getpid()} {socket.gethostname()}\n"
        assert sorted(p.name for p in out.iterdir()) == [".sweep.lock", ".sweep.lock.takeover",
                                                         "results.csv", "runs"]
    finally:
        holder.kill()
        holder.communicate()


def test_a_lock_held_by_a_live_sweep_is_refused_naming_its_pid(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    out = tmp_path / "o"
    holder = _hold_lock(out / ".sweep.lock", "")  # an owner that is alive: the holder itself
    try:
        (out / ".sweep.lock").write_text(f"{holder.pid} {socket.gethostname()}\n")
        path = write_sweep(tmp_path / "s.yaml", {"base": str(DEMO), "grid": {"seed": [0]}})
        rc = main(["sweep", str(path), "--out", str(out), "--quiet"])
        err = capsys.readouterr().err
        assert rc == 2
        assert err == (f"hetsim: error: {out}: --out: another hetsim sweep (PID {holder.pid}) "
                       "is writing this folder\n")
        # a lock whose owner is not recorded (or on another host) is never taken over
        (out / ".sweep.lock").write_text("")
        with pytest.raises(ConfigError) as e:
            run_sweep(sweep_of(grid={"seed": [0]}), out, progress=False)
        assert e.value.message == "another hetsim sweep is writing this folder"
        (out / ".sweep.lock").write_text("1 some-other-host\n")
        with pytest.raises(ConfigError) as e:
            run_sweep(sweep_of(grid={"seed": [0]}), out, progress=False)
        assert e.value.message == "another hetsim sweep (PID 1 on some-other-host) is writing this folder"
    finally:
        holder.kill()
        holder.communicate()
    assert not (out / "results.csv").exists()


_ORPHAN = """
import os, sys, time
from experiments.sweep_pool import die_with_parent
pid = os.fork()
if pid == 0:
    die_with_parent(os.getppid(), use_signal=sys.argv[1] == "signal", interval_s=0.05)
    time.sleep(120)
    os._exit(0)
print(pid, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("how", ["signal", "watch"])
def test_a_process_dies_with_its_parent(how: str) -> None:
    # Linux's parent-death signal, and the portable fallback (a thread watching getppid)
    if how == "signal" and not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux only")
    parent = subprocess.Popen([sys.executable, "-c", _ORPHAN, how], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    assert parent.stdout is not None
    child = psutil.Process(int(parent.stdout.readline()))
    try:
        time.sleep(0.3)
        assert _gone([child], timeout_s=0) == [child]  # alive while its parent is
        parent.kill()
        parent.communicate()
        assert not _gone([child], timeout_s=5)
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
