"""Checkpoint and resume of the real runtime (runtime/checkpoint.py, `hetsim run --resume`).

The case: BSP, 2 PS shards, 2 workers, a tiny mlp, K = 12 iterations,
checkpoints every 4. A run killed anywhere and resumed must end with exactly
the parameters of the uninterrupted run (BSP with fixed shares and data seeded
by (seed, worker, iteration) is deterministic), and its iterations.csv must
hold each iteration once with the uninterrupted run's losses.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from experiments import run as entry
from experiments.cli import main
from hardware_profiles.errors import ConfigError
from runtime import checkpoint, task
from runtime.launch import RuntimeFailure, run_local
from tests.test_runtime import HETSIM, ROOT, config, descendants, psutil

K, EVERY = 12, 4
CLUSTER = {"devices": [{"type": "this_machine", "count": 2}], "ps": {"shards": 2, "type": "this_machine"},
           "network": {"bandwidth_gbps": 13, "latency_us": 65}}


def ck_config(tmp: Path, **runtime: Any) -> Path:
    # a generous failure timeout: a worker slow on the loaded machine must not be declared failed,
    # which would change the arithmetic
    return config(tmp, name="ck", cluster=CLUSTER, job={"iterations": K, "failure_timeout_s": 20.0},
                  runtime={"checkpoint_every": EVERY, **runtime})


def hetsim_run(cfg: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HETSIM, "run", str(cfg), "--out", str(out), *extra], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)


def final_params(out: Path) -> list[torch.Tensor]:
    m = checkpoint.read_manifest(str(out / "checkpoint"))
    assert m.version == K
    return [checkpoint.load_shard(m, k)["flat"] for k in range(2)]


def rows(out: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO((out / "iterations.csv").read_text())))


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run's output folder (config ck.yaml next to it)."""
    tmp = tmp_path_factory.mktemp("reference")
    out = tmp / "out"
    proc = hetsim_run(ck_config(tmp), out)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def assert_same_as_reference(out: Path, reference: Path) -> None:
    for mine, ref in zip(final_params(out), final_params(reference), strict=True):
        assert torch.equal(mine, ref)  # no applied update lost, none applied twice
    got, want = rows(out), rows(reference)
    assert [r["iteration"] for r in got] == [str(i) for i in range(K)]  # each iteration exactly once
    assert [r["loss"] for r in got] == [r["loss"] for r in want]
    assert [r["samples"] for r in got] == ["32"] * K
    ends = [float(r["end_s"]) for r in got]
    assert ends == sorted(ends)


# ---------------------------------------------------------------- no processes
def test_the_manifest_names_only_a_complete_version(tmp_path: Path) -> None:
    d = str(tmp_path)
    files = dict([checkpoint.save_shard(d, k, 4, torch.full((3,), float(k)), 0.1, 0.0) for k in range(2)])
    files.update([checkpoint.save_coordinator(d, 4, {"x": 1})])
    checkpoint.write_manifest(d, 4, files, {"seed": 0})
    # a checkpoint of version 8 cut short: files written, no manifest naming them
    checkpoint.save_shard(d, 0, 8, torch.zeros(3), 0.1, 0.0)
    m = checkpoint.read_manifest(d)
    assert m.version == 4 and sorted(m.files) == ["coordinator.v4.pkl", "shard-0.v4.pt", "shard-1.v4.pt"]
    assert torch.equal(checkpoint.load_shard(m, 1)["flat"], torch.ones(3))
    (tmp_path / "shard-1.v4.pt").write_bytes(b"changed")
    with pytest.raises(ConfigError, match=r"manifest.json: files.shard-1.v4.pt: missing or changed"):
        checkpoint.read_manifest(d)


def test_a_workers_data_depends_on_the_iteration_not_on_what_came_before() -> None:
    a = task.iteration_generators(0, 1, 5)[0]
    b = task.iteration_generators(0, 1, 5)[0]
    assert torch.equal(torch.randn(4, generator=a), torch.randn(4, generator=b))
    other = [task.iteration_generators(0, w, t)[0] for w, t in ((0, 5), (1, 6))]
    first = torch.randn(4, generator=task.iteration_generators(0, 1, 5)[0])
    assert all(not torch.equal(first, torch.randn(4, generator=g)) for g in other)


# ---------------------------------------------------------------------- runs
def test_resume_after_a_crash_mid_checkpoint_loses_no_update(tmp_path: Path, reference: Path) -> None:
    out = tmp_path / "out"
    # rank 0 dies right after committing iteration 7 and saving its part of checkpoint 8,
    # before shard 1's part of it is reported: checkpoint 8 is cut short
    prep = entry.prepare(ck_config(tmp_path, crash_after_iteration=7))
    entry.attach_checkpoints(prep, out, resume=False)
    with pytest.raises(RuntimeFailure, match="rank 0"):
        run_local(prep.spec, wall_timeout_s=120)
    assert descendants() == []
    folder = out / "checkpoint"
    assert json.loads((folder / "manifest.json").read_text())["version"] == 4
    assert {"shard-0.v8.pt", "coordinator.v8.pkl", "shard-0.v4.pt", "shard-1.v4.pt"} <= {
        p.name for p in folder.iterdir()}
    proc = hetsim_run(ck_config(tmp_path), out, "--resume")  # the same config, without the crash
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["iterations"] == K and summary["failures"] == []
    assert [r["from_iteration"] for r in summary["resumed"]] == [4]
    assert_same_as_reference(out, reference)
    trace = json.loads((out / "trace.json").read_text())["traceEvents"]
    # shard 0 wrote checkpoints 8 and 12 in the resumed run (4's span is not in the file it times)
    assert sum(e.get("name") == "checkpoint" for e in trace) == 2
    # the final checkpoint, and no other version left behind
    assert sorted(p.name for p in folder.iterdir()) == [
        "coordinator.v12.pkl", "manifest.json", "shard-0.v12.pt", "shard-1.v12.pt"]


@pytest.mark.skipif(psutil is None, reason="needs psutil to list the run's processes")
def test_resume_after_the_whole_process_group_is_killed(tmp_path: Path, reference: Path) -> None:
    out = tmp_path / "out"
    # workers sleep 100x their compute time (emulation only: the arithmetic is the same),
    # so the run is still going when the first checkpoint appears
    cfg = ck_config(tmp_path, workers=[{"slowdown": 100.0}, {"slowdown": 100.0}])
    proc = subprocess.Popen([*HETSIM, "run", str(cfg), "--out", str(out)], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    manifest = out / "checkpoint" / "manifest.json"
    try:
        deadline = time.monotonic() + 120
        while not manifest.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert manifest.exists(), proc.stderr.read() if proc.poll() is not None else "no checkpoint in 120 s"
        kids = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGKILL)  # launcher and every rank at once: nobody cleans up
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        assert proc.stderr is not None
        proc.stderr.close()
    _, alive = psutil.wait_procs(kids, timeout=10)
    assert alive == []
    version = json.loads(manifest.read_text())["version"]
    assert version in (4, 8)
    done = hetsim_run(cfg, out, "--resume")
    assert done.returncode == 0, done.stderr[-2000:]
    assert [r["from_iteration"] for r in json.loads((out / "summary.json").read_text())["resumed"]] == [version]
    assert_same_as_reference(out, reference)


def test_an_online_schedulers_state_is_resumed_too(tmp_path: Path) -> None:
    out = tmp_path / "out"
    kw: dict[str, Any] = {"job": {"iterations": 6, "failure_timeout_s": 20.0},
                          "scheduler": {"name": "hps", "params": {"rebalance_every": 2}}}
    crash = config(tmp_path, name="hps", runtime={"checkpoint_every": 2, "crash_after_iteration": 2}, **kw)
    proc = hetsim_run(crash, out)
    assert proc.returncode == 1
    assert f"--resume continues from the checkpoint of iteration 2 in {out / 'checkpoint'}" in proc.stderr
    proc = hetsim_run(config(tmp_path, name="hps", runtime={"checkpoint_every": 2}, **kw), out, "--resume")
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [r["from_iteration"] for r in summary["resumed"]] == [2]
    assert [r["iteration"] for r in rows(out)] == [str(i) for i in range(6)]
    assert len(summary["runtime"]["shares"]) == 6  # the first shares, then one per iteration but the last
    final = checkpoint.read_manifest(str(out / "checkpoint"))
    # rebalance ran after iterations 0 .. 4: twice before the crash, three times after it, on one object
    assert final.version == 6 and checkpoint.load_coordinator(final)["scheduler"].calls == 5


# --------------------------------------------------------------- bad resumes
def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hetsim: error: ")
    return err


def test_resume_with_another_config_names_the_field(tmp_path: Path, reference: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    raw = yaml.safe_load((reference.parent / "ck.yaml").read_text())
    raw["runtime"]["lr"] = 0.3
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(raw))
    err = one_line_error(capsys, ["run", str(other), "--out", str(reference), "--resume"])
    assert f"{other}: runtime.lr: 0.3 differs from the checkpoint's 0.2" in err
    assert str(reference / "checkpoint" / "manifest.json") in err
    # the same config: the checkpoint is the last iteration, nothing to resume
    err = one_line_error(capsys, ["run", str(reference.parent / "ck.yaml"), "--out", str(reference), "--resume"])
    assert "job.iterations: 12, and the checkpoint" in err and "nothing left to run" in err


def test_resume_without_a_checkpoint_and_checkpoints_outside_bsp(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cfg = ck_config(tmp_path)
    err = one_line_error(capsys, ["run", str(cfg), "--out", str(tmp_path / "empty"), "--resume"])
    assert f"{tmp_path / 'empty' / 'checkpoint' / 'manifest.json'}: no checkpoint to resume from" in err
    asp = config(tmp_path, name="asp", job={"sync": "asp"}, runtime={"checkpoint_every": 2})
    err = one_line_error(capsys, ["run", str(asp), "--out", str(tmp_path / "asp")])
    assert f"{asp}: runtime.checkpoint_every: checkpoints are built for job.sync: bsp only" in err
    assert descendants() == []
