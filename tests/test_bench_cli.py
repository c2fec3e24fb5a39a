"""`hetsim bench`: the ratio is the median of its repeats, and a bad --repeat is one line."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.cli import main

REPO = Path(__file__).resolve().parents[1]


def test_bench_quick_reports_the_median_of_its_ratio_pairs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--quick", "--repeat", "3", "--json"]) == 0
    f = json.loads(capsys.readouterr().out)
    runs = f["ratio_runs"]
    assert len(runs) == 3 and all(r > 0 for r in runs)
    # the headline is the middle pair, and its figures are that pair's own
    assert f["ratio"] == statistics.median(runs)
    assert f["ratio"] == f["des_events_per_s"] / f["simpy_events_per_s"]
    assert f["des_event_rate_run"]["events_per_s"] == f["des_events_per_s"]
    assert f["des_event_rate_run"]["workers"] == 16 and f["targets"]["ratio>=0.3"] == (f["ratio"] >= 0.3)


def test_bench_takes_the_lower_middle_pair_of_an_even_count(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--quick", "--repeat", "2", "--json"]) == 0
    f = json.loads(capsys.readouterr().out)
    assert len(f["ratio_runs"]) == 2 and f["ratio"] == min(f["ratio_runs"])
    # the reference run is a pair of its own
    ref = f["des_event_rate_run_no_contention"]
    assert ref["sharing"] == "none"
    assert f["ratio_no_contention"] == ref["events_per_s"] / f["simpy_events_per_s_no_contention"]


def test_bench_refuses_a_repeat_below_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--repeat", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "hetsim: error: <command line>: --repeat: must be at least 1"


def test_a_reader_that_goes_away_gets_no_traceback() -> None:
    # `hetsim bench --quick | head -1`: the reader closes the pipe after one line
    proc = subprocess.Popen([sys.executable, "-m", "experiments.cli", "bench", "--quick"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"ratio, 1 time(s)")
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert err == ""


def test_a_reader_gone_before_the_last_buffered_write_gets_no_traceback() -> None:
    # `hetsim plan CONFIG | true` with stdout block-buffered (no PYTHONUNBUFFERED): the
    # plan is written at the end, into a buffer that is flushed before main returns
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.Popen([sys.executable, "-m", "experiments.cli", "plan", "experiments/configs/demo.yaml"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the command writes anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141
    assert err == ""
