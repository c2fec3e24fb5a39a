"""experiments/reproduce_hps.py on a tiny grid: one model (mlp), the cpu cluster, 10 Gbit/s, no
load, one seed, a target BSP reaches in 5 iterations; every method once, in-process."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from experiments import reproduce_hps as rh
from experiments import runner
from sim.convergence import fit_path

K = 5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reproduce_hps")
    rh.run(out, models=("mlp",), clusters=("cpu",), bandwidths=(10.0,), loads=("none",), seeds=1,
           iterations=K, jobs=1, progress=False)
    return out


def _rows(out: Path) -> list[dict[str, str]]:
    with open(out / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_one_row_per_method_with_the_expected_columns(tiny: Path) -> None:
    rows = _rows(tiny)
    assert [r["method"] for r in rows] == list(rh.METHODS)
    assert {"model", "cluster", "bandwidth_gbps", "load", "seed", "method", "target_loss",
            "time_to_target_s", "iterations", "elapsed_s", "initial_shares"} <= set(rows[0])
    assert {(r["model"], r["cluster"], r["bandwidth_gbps"], r["load"], r["seed"]) for r in rows} == {
        ("mlp", "cpu", "10.0", "none", "0")}
    assert [(r["sync"], r["pipeline"], r["quantization"]) for r in rows] == [
        ("bsp", "False", "none"), ("asp", "False", "none"), ("ssp", "False", "none"),
        ("bsp", "False", "none"), ("bsp", "False", "none"), ("bsp", "True", "adaptive"),
        ("bsp", "False", "adaptive"), ("bsp", "True", "none"), ("bsp", "True", "adaptive")]
    assert [r["status_aware"] for r in rows if r["scheduler"] == "hps"] == ["True", "True", "True", "False"]


def test_target_is_derived_from_the_fit(tiny: Path) -> None:
    # mlp's fit: closing half the gap needs far more than 5 BSP iterations of 256 samples, so the
    # target is the loss after 4.5 iterations: n = 4.5 x 256 / (1 + 256 / B_crit) effective
    # samples, L = L_inf + a n^-alpha.
    m = json.loads(fit_path("mlp").read_text())["model"]
    n = 4.5 * 256 / (1 + 256 / m["critical_batch"])
    want = m["L_inf"] + m["a"] * n ** -m["alpha"]
    assert [float(r["target_loss"]) for r in _rows(tiny)] == pytest.approx([want] * len(rh.METHODS), rel=1e-12)
    assert rh.bsp_iterations("mlp", K) == K


def test_every_method_reaches_the_target_and_bsp_needs_exactly_k(tiny: Path) -> None:
    rows = {r["method"]: r for r in _rows(tiny)}
    for r in rows.values():
        assert r["time_to_target_s"] != "" and float(r["time_to_target_s"]) > 0
    # full-precision BSP adds the same effective samples per iteration whatever the split, so it
    # reaches the target at the end of iteration K, which ends the run
    for meth in ("bsp-equal", "proportional", "lbbsp", "hps-no-quant"):
        assert int(rows[meth]["iterations"]) == K
        assert float(rows[meth]["time_to_target_s"]) == float(rows[meth]["elapsed_s"])
    # and equal-split BSP takes as long as a plain K-iteration run of the same config
    d = rh.config_of(rh.Case("mlp", "cpu", 10.0, "none", 0, "bsp-equal", K))
    d["job"].pop("target_loss")
    d["job"]["iterations"] = K
    plain, _ = runner.run_one(runner.from_dict(d, rh.CONFIG_DIR, "test"), "des", trace=False)
    assert float(rows["bsp-equal"]["time_to_target_s"]) == pytest.approx(plain.elapsed_s, rel=1e-9)
    assert rows["bsp-equal"]["initial_shares"] == "64 64 64 64"
    assert rows["hps-no-status"]["rebalances"] == "0"


def test_report_speedups_and_figures(tiny: Path) -> None:
    rows = {r["method"]: float(r["time_to_target_s"]) for r in _rows(tiny)}
    report = (tiny / "report.md").read_text()
    sp = rows["bsp-equal"] / rows["hps"]
    assert f"| mlp | cpu | 10 | none | {sp:.2f}x |" in report
    assert "1.4x-3.5x" in report and "Missing" not in report
    for fig in ("ttt_bars_none.png", "loss_vs_time.png", "utilization.png"):
        assert 0 < (tiny / fig).stat().st_size < rh.MAX_FIGURE_BYTES, fig
    assert not (tiny / "ttt_bars_load.png").exists()  # no loaded cases in this grid


def test_models_without_a_fit_are_reported_missing(tmp_path: Path) -> None:
    have, missing = rh.available_models(["mlp", "no_such_model"])
    assert (have, missing) == (["mlp"], ["no_such_model"])
    assert math.isfinite(rh.target_loss("mlp", K))


@pytest.mark.parametrize(("speedups", "words"), [
    ((1.0, 1.3), "that span lies wholly below the paper's 1.4x-3.5x"),
    ((3.6, 20.0), "that span lies wholly above the paper's 1.4x-3.5x"),
    ((1.35, 4.19), "the paper's 1.4x-3.5x lies inside that span"),
    ((1.5, 3.0), "that span lies inside the paper's 1.4x-3.5x"),
    ((1.2, 2.0), "that span overlaps the paper's 1.4x-3.5x (below it at one end)"),
    ((2.0, 5.0), "that span overlaps the paper's 1.4x-3.5x (above it at one end)"),
])
def test_span_against_the_paper_is_worded_from_the_numbers(speedups: tuple[float, float], words: str) -> None:
    import pandas as pd

    assert rh._span_vs_paper(pd.Series([*speedups, math.inf])) == words
    rows = pd.DataFrame({"bsp-equal": [*speedups, 2.0]})
    assert rh._in_paper(rows) == f"{1 + sum(1.4 <= v <= 3.5 for v in speedups)} of 3 cases within 1.4x-3.5x"
