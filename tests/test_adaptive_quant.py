"""job.quantization: adaptive — the bit width follows the modelled loss (DES and analytic)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from experiments import runner
from experiments.cli import main
from hardware_profiles.errors import ConfigError
from sim import analytic, des
from sim.convergence import load_for
from sim.result import RunResult

# window 3, three levels: r >= 0.2 -> 4 bits, r <= 0.05 -> 32 bits, in between 8 bits
HAND = {"window": 3, "coarse_threshold": 0.2, "fine_threshold": 0.05, "levels": [4, 8, 32]}


def _cfg(quant: Any, params: dict[str, Any] | None = None, iterations: int = 40, sync: str = "bsp",
         model: str = "mlp", **job: Any) -> dict[str, Any]:
    j: dict[str, Any] = {"model": model, "global_batch": 64, "iterations": iterations,
                         "quantization": quant, "sync": sync, **job}
    if params is not None:
        j["quantization_params"] = params
    return {"name": "aq", "cluster": {"devices": [{"type": "t4", "count": 2}],
                                      "network": {"bandwidth_gbps": 1, "sharing": "none"}}, "job": j}


def _load(cfg: dict[str, Any]) -> tuple[Any, Any]:
    loaded = runner.from_dict(cfg, Path("."), "c.yaml")
    p = runner.problem_of(loaded)
    return p, runner.plan_for(loaded, p)


def _des(cfg: dict[str, Any]) -> RunResult:
    return des.simulate(*_load(cfg), trace=False)


def _hand_changes(n_iter: int) -> list[list[int]]:
    """The expected (iteration, bits) changes from the fit by hand: BSP on 64 samples at
    staleness 0, loss L_k = L(k * e) after k iterations, r_k = (L_{k-2} - L_k) / L_{k-2}."""
    fit = load_for("mlp")
    assert fit is not None
    m = fit.model
    e = 64 / (1 + 64 / m.critical_batch)  # the quantization discount of the fit is ~1e-22
    L = [m.loss(k * e) for k in range(1, n_iter + 1)]
    out, cur = [[0, 4]], 4
    for k in range(3, n_iter + 1):
        r = (L[k - 3] - L[k - 1]) / L[k - 3]
        want = 32 if r <= 0.05 else 8 if r < 0.2 else 4
        if want > cur:
            out.append([k, want])
            cur = want
    return out


def test_des_starts_coarse_and_refines_as_the_loss_flattens() -> None:
    r = _des(_cfg("adaptive", HAND))
    assert r.extra["quant_bits"] == _hand_changes(40) == [[0, 4], [6, 8], [18, 32]]
    defaults = _des(_cfg("adaptive", None, iterations=300)).extra["quant_bits"]  # Adaptive's defaults
    bits = [b for _, b in defaults]
    assert bits[0] == 2 and bits[-1] == 32 and bits == sorted(bits) and len(set(bits)) == len(bits)
    its = [k for k, _ in defaults]
    assert its == sorted(its)


def test_asp_refines_monotonically_to_full_precision() -> None:
    r = _des(_cfg("adaptive", HAND, iterations=60, sync="asp"))
    ch = r.extra["quant_bits"]
    assert ch[0] == [0, 4] and ch[-1][1] == 32
    assert [b for _, b in ch] == sorted(b for _, b in ch)


def test_iteration_times_follow_the_width() -> None:
    r = _des(_cfg("adaptive", HAND))
    fixed = {b: _des(_cfg(b, iterations=5)).iteration_times()[-1] for b in (4, 8, 32)}
    assert fixed[4] < fixed[8] < fixed[32]  # push bytes (and quantize passes) differ
    t = r.iteration_times()
    for k in range(40):
        want = fixed[4] if k < 6 else fixed[8] if k < 18 else fixed[32]
        assert t[k] == pytest.approx(want, rel=1e-9), k


def test_every_observes_the_loss_every_n_iterations() -> None:
    r = _des(_cfg("adaptive", {**HAND, "every": 4}, iterations=200))
    assert all(k % 4 == 0 for k, _ in r.extra["quant_bits"])
    assert r.extra["quant_bits"][1][0] > 6  # the window now spans 12 iterations: coarse for longer
    assert [b for _, b in r.extra["quant_bits"]] == [4, 8, 32]


def test_deterministic_and_loss_column() -> None:
    a, b = _des(_cfg("adaptive", HAND)), _des(_cfg("adaptive", HAND))
    assert a.summary_json() == b.summary_json() and a.iterations_csv() == b.iterations_csv()
    rows = list(csv.reader(io.StringIO(a.iterations_csv())))
    assert rows[0] == ["iteration", "start_s", "end_s", "time_s", "samples", "loss"]
    loss = [float(row[5]) for row in rows[1:]]
    assert len(loss) == 40 and all(x > y for x, y in zip(loss, loss[1:]))
    # no convergence model (fixed width, no target): the five columns only
    assert _des(_cfg(8, iterations=3)).iterations_csv().splitlines()[0] == "iteration,start_s,end_s,time_s,samples"


def test_analytic_follows_the_same_schedule_as_the_des() -> None:
    p, pl = _load(_cfg("adaptive", HAND))
    a, d = analytic.evaluate(p, pl), des.simulate(p, pl, trace=False)
    assert a.extra["quant_bits"] == d.extra["quant_bits"]
    assert a.elapsed_s == pytest.approx(d.elapsed_s, rel=1e-3)
    assert a.iter_loss == pytest.approx(d.iter_loss, rel=1e-9)


def test_adaptive_with_target_loss() -> None:
    r = _des(_cfg("adaptive", HAND, iterations=None, target_loss=0.9))
    assert r.time_to_target_s is not None and "target_not_reached" not in r.extra
    assert r.iter_loss is not None and r.iter_loss[-1] <= 0.9 < r.iter_loss[-2]


def test_simulate_cli_writes_quant_bits_and_loss(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_cfg("adaptive", HAND, iterations=20)))
    out = tmp_path / "out"
    assert main(["simulate", str(path), "--evaluator", "des", "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["quant_bits"] == [[0, 4], [6, 8], [18, 32]]
    assert (out / "iterations.csv").read_text().splitlines()[0].endswith(",samples,loss")
    assert json.loads((out / "config.json").read_text())["job"]["quantization_params"]["every"] == 1


@pytest.mark.parametrize("sync", ["bsp", "asp"])
def test_adaptive_together_with_online_rebalancing(sync: str) -> None:
    cfg = _cfg("adaptive", HAND, sync=sync)
    cfg["cluster"]["devices"] = [{"type": "t4", "count": 1}, {"type": "cpu-8c", "count": 2}]
    cfg["scheduler"] = {"name": "hps", "params": {"rebalance_every": 2}}
    loaded = runner.from_dict(cfg, Path("."), "c.yaml")
    p = runner.problem_of(loaded)
    sched, pl = runner.schedule(loaded, p)
    r = des.simulate(p, pl, trace=False, scheduler=sched)
    assert sum(r.extra["final_shares"].values()) == 64 and len(r.iter_end_s) == 40
    ch = r.extra["quant_bits"]
    assert ch[0] == [0, 4] and [b for _, b in ch] == sorted(b for _, b in ch)


@pytest.mark.parametrize(("cfg", "field", "text"), [
    (_cfg("adaptive", {"window": 3, "speed": 1}), "job.quantization_params.speed", "unknown field"),
    (_cfg("adaptive", None, model="resnet50"), "job.quantization", "no convergence fit for model 'resnet50'"),
    (_cfg(8, {"window": 3}), "job.quantization_params", "only with quantization: adaptive"),
    (_cfg("adaptive", {"coarse_threshold": 0.01, "fine_threshold": 0.1}), "job.quantization_params",
     "must be below"),
    (_cfg("adaptive", {"levels": [8, 4]}), "job.quantization_params", "strictly ascending"),
])
def test_config_errors_name_the_field(cfg: dict[str, Any], field: str, text: str) -> None:
    with pytest.raises(ConfigError) as e:
        _load(cfg)
    msg = str(e.value)
    assert "\n" not in msg and text in msg
    assert f"{field}:" in msg or msg.split(": ")[1] == field
