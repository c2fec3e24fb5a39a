"""bench.cold_call: one row per size and op, in order, its ratio its own cold over warm;
bad arguments are one line and exit 2."""

from __future__ import annotations

import json

import pytest

from calibration import cold_call


def test_rows_cover_every_size_and_op_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    assert cold_call.main(["--moved-mb", "1,2", "--reps", "3", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    ops = ["relu", "linear", "embedding"]
    assert [(r["moved_bytes"], r["op"]) for r in rows] == [(1 << 20, o) for o in ops] + [(2 << 20, o) for o in ops]
    for r in rows:
        assert r["cold_s"] > 0 and r["warm_s"] > 0
        assert r["ratio"] == r["cold_s"] / r["warm_s"]


def test_the_table_names_each_op_once_per_size(capsys: pytest.CaptureFixture[str]) -> None:
    assert cold_call.main(["--moved-mb", "0.5,1", "--reps", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["moved", "MiB", "op", "cold", "us", "warm", "us", "cold/warm"]
    ops = ["relu", "linear", "embedding"]
    assert [line.split()[:2] for line in out[1:7]] == [[mb, o] for mb in ("0.5", "1") for o in ops]
    assert out[7].startswith("(cold: the call right after streaming")


@pytest.mark.parametrize(("args", "message"), [
    (["--moved-mb", "x"], "error: --moved-mb: not a list of numbers: 'x'"),
    (["--moved-mb", "0"], "error: --moved-mb: give one or more finite sizes above 0"),
    (["--moved-mb", ","], "error: --moved-mb: give one or more finite sizes above 0"),
    (["--moved-mb", "nan"], "error: --moved-mb: give one or more finite sizes above 0"),
    (["--moved-mb", "2,inf"], "error: --moved-mb: give one or more finite sizes above 0"),
    (["--reps", "0"], "error: --reps: must be a whole number of at least 1, got '0'"),
    (["--reps", "1.5"], "error: --reps: must be a whole number of at least 1, got '1.5'"),
])
def test_bad_arguments_are_one_line(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cold_call.main(args) == 2
    captured = capsys.readouterr()
    assert captured.err.strip() == message and captured.out == ""


def test_a_size_the_machine_cannot_hold_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert cold_call.main(["--moved-mb", "1e12", "--reps", "1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: --moved-mb: cannot stream 1e+12 MiB here: ")
