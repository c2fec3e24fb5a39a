"""job.compute_noise: each worker's compute per iteration drawn around its modelled time (DES).

Hand-computed cases on the one-layer cluster of tests/test_hosts.py (alone a worker
computes fwd 0.1 s and bwd 0.9 s; transfers ~1e-15 s), with the factors the
documented stream gives.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from sim import analytic, des
from sim.des.engine import NOISE_STREAM, noise_factors
from tests.helpers_eval import dense, model, plan, problem, profile, time_limit

CPU = profile("cpu", kind="cpu", nic=1e18)
PS = profile("ps", kind="cpu", mem_bw=1e20, nic=1e18)
LAYER = model(dense("fc", 1e3, fwd_flops=1e10, bwd_flops=9e10))
REPO = Path(__file__).resolve().parents[1]


def _noisy(n: int, rel: float, iterations: int = 5, **kw: object):  # type: ignore[no-untyped-def]
    import dataclasses

    prob = problem([CPU] * n, [PS], LAYER, 10 * n, iterations=iterations, warmup=0, **kw)  # type: ignore[arg-type]
    return dataclasses.replace(prob, job=dataclasses.replace(prob.job, compute_noise=(rel,) * n))


def _run(prob):  # type: ignore[no-untyped-def]
    with time_limit(60):
        return des.simulate(prob, plan(prob, [10] * len(prob.cluster.devices)))


def test_factors_have_the_asked_spread_and_a_median_of_one() -> None:
    xs = np.fromiter(noise_factors(0, 0, 0.2), float, count=200_000)
    q1, med, q3 = np.percentile(xs, [25, 50, 75])
    assert med == pytest.approx(1.0, abs=0.005)
    assert (q3 - q1) / med == pytest.approx(0.2, abs=0.005)
    # the documented stream, nothing else
    sigma = math.asinh(0.1) / 0.6744897501960817
    rng = np.random.default_rng(np.random.SeedSequence(0, spawn_key=(NOISE_STREAM, 0)))
    assert xs[:256].tolist() == np.exp(sigma * rng.standard_normal(256)).tolist()


def test_one_worker_computes_its_time_times_each_iterations_factor() -> None:
    r = _run(_noisy(1, 0.3))
    k = list(np.fromiter(noise_factors(0, 0, 0.3), float, count=5))
    assert r.iteration_times() == pytest.approx([1.0 * f for f in k], rel=1e-9, abs=1e-12)


def test_bsp_waits_for_the_slower_draw() -> None:
    r = _run(_noisy(2, 0.3))
    k0 = np.fromiter(noise_factors(0, 0, 0.3), float, count=5)
    k1 = np.fromiter(noise_factors(0, 1, 0.3), float, count=5)
    assert r.iteration_times() == pytest.approx(np.maximum(k0, k1).tolist(), rel=1e-9, abs=1e-12)


def test_no_noise_gives_the_same_bytes_as_before_and_a_seed_fixes_the_draws() -> None:
    base = problem([CPU] * 2, [PS], LAYER, 20, iterations=5, warmup=0)
    assert _run(_noisy(2, 0.0)).summary() == _run(base).summary()
    a, b = _run(_noisy(2, 0.2)), _run(_noisy(2, 0.2))
    assert json.dumps(a.summary(), sort_keys=True) == json.dumps(b.summary(), sort_keys=True)
    assert not np.allclose(a.iteration_times(), _run(base).iteration_times())


def test_analytic_ignores_it_and_says_so() -> None:
    r = analytic.evaluate(_noisy(2, 0.2), plan(_noisy(2, 0.2), [10, 10]))
    assert "job.compute_noise" in r.extra["note"]


def test_config_field_and_profile_spread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from experiments import cli
    from experiments.runner import from_dict, problem_of

    base = {"name": "n", "profiles": [str(REPO / "hardware_profiles" / "measured")],
            "cluster": {"devices": [{"type": "this_machine", "count": 2}], "ps": {"shards": 1, "type": "this_machine"},
                        "network": {"bandwidth_gbps": 10}},
            "job": {"model": "mlp", "global_batch": 16, "iterations": 3}}
    # 'profile': each device's measured spread.iteration_median
    spread = json.loads((REPO / "hardware_profiles/measured/this_machine.json").read_text())["measurement"]["spread"]
    got = problem_of(from_dict({**base, "job": {**base["job"], "compute_noise": "profile"}}, tmp_path, "<t>"))
    assert got.job.compute_noise == (spread["iteration_median"],) * 2
    assert problem_of(from_dict(base, tmp_path, "<t>")).job.compute_noise == ()
    # a datasheet profile has no spread: one line, exit 2
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: n\ncluster:\n  devices: [{type: t4, count: 1}]\n  ps: {shards: 1, type: cpu-8c}\n"
                   "  network: {bandwidth_gbps: 10}\njob: {model: mlp, global_batch: 8, iterations: 2, "
                   "compute_noise: profile}\n")
    assert cli.main(["simulate", str(cfg), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "job.compute_noise" in err[0] and "'t4'" in err[0], err
    cfg.write_text(cfg.read_text().replace("compute_noise: profile", "compute_noise: -0.1"))
    assert cli.main(["simulate", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "job.compute_noise" in capsys.readouterr().err
