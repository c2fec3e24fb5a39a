"""bench/drift_probes.py: the within-(config, process) elasticity of real CPU against each speed probe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import drift_probes


def _run(compute: float, copies: float | None, real_factor: float) -> dict:
    """One recorded run of one worker: the DES ran at ``compute`` (and, in the old format,
    ``copies`` for the copies); undrifted its figures are 10 ms of compute and 5 of copies;
    its real CPU is twice that, times ``real_factor``."""
    drift = {"compute": compute, "probes": [{"compute": compute} | ({"copies": copies} if copies else {})]}
    if copies:
        drift["copies"] = copies
    copy = copies or compute
    return {"diagnostics": {
        "drift": drift,
        "runtime_cpu": {"figures": {"w": {"role": "worker", "compute_ms": 10.0 * compute, "transport_ms": 5.0 * copy,
                                          "messages": 2.0, "sharing": 1.0}}},
        "cpu_per_iteration": {"processes": {"w": {"real_ms": 30.0 * real_factor,
                                                  "real_transport_ms": 10.0 * real_factor}}}}}


def test_a_probe_that_tracks_the_runs_has_elasticity_one(tmp_path: Path) -> None:
    """Two configs, three runs each; the real CPU moves exactly with the compute probe
    (elasticity 1, correlation 1, in all and in the copies) and not with the copies probe,
    which moves against it in one config and with it in the other (slope 0)."""
    for name, copies in (("a", (1.0, 1.21, 1.1)), ("b", (1.1, 1.21, 1.0))):
        for k, (f, c) in enumerate(zip((1.0, 1.1, 1.21), copies)):
            d = tmp_path / f"{name}{k}"
            d.mkdir()
            (d / "validation.json").write_text(json.dumps({"name": name, "schedulers": {"equal": _run(f, c, f)}}))
    got = {(role, probe, what): (slope, r, n) for role, probe, what, slope, r, n in
           drift_probes.elasticities(drift_probes.rows([tmp_path]))}
    for what in ("total", "copies"):
        slope, r, n = got[("worker", "compute", what)]
        assert (slope, r, n) == (pytest.approx(1.0), pytest.approx(1.0), 6)
        assert got[("worker", "copies", what)][0] == pytest.approx(0.0, abs=1e-9)


def test_each_run_counts_once_and_the_new_format_divides_by_its_one_factor(tmp_path: Path) -> None:
    """Runs of one factor (two configs, each a worker and a shard, the DES at x1.0, x1.1, x1.21 for everything;
    undrifted figures 10 + 5 ms, real CPU twice that times the factor): elasticity 1 for
    both roles. A suite's list file beside the configs' (the same runs again) and a second
    copy of a config's file add nothing: two configs of 3 runs each, 6 points a role, not 12."""
    def run(f: float) -> dict:
        figs = {d: {"role": role, "compute_ms": 10.0 * f, "transport_ms": 5.0 * f, "messages": 2.0, "sharing": 1.0}
                for d, role in (("w", "worker"), ("ps:0", "ps"))}
        return {"diagnostics": {"drift": {"compute": f, "probes": [{"compute": f}]},
                                "runtime_cpu": {"figures": figs},
                                "cpu_per_iteration": {"processes": {d: {"real_ms": 30.0 * f, "real_transport_ms": 10.0 * f}
                                                                    for d in figs}}}}
    records = [{"name": name, "schedulers": {"equal": run(f)}} for name in "ab" for f in (1.0, 1.1, 1.21)]
    for k, rec in enumerate(records):
        for where in (f"r{k}", f"copy/r{k}"):
            (tmp_path / where).mkdir(parents=True)
            (tmp_path / where / "validation.json").write_text(json.dumps(rec))
    (tmp_path / "validation.json").write_text(json.dumps(records))  # a suite's list of them
    data = drift_probes.rows([tmp_path])
    assert len(data) == 12  # 2 configs x 3 runs x 2 processes
    got = {(role, what): (slope, r, n) for role, probe, what, slope, r, n in drift_probes.elasticities(data)}
    for role in ("worker", "ps"):
        for what in ("total", "copies"):
            assert got[(role, what)] == (pytest.approx(1.0), pytest.approx(1.0), 6)


def test_no_runs_with_probes_or_no_folder_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert drift_probes.main([str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert drift_probes.main([str(tmp_path)]) == 2
    assert "3 runs or more" in capsys.readouterr().err
