"""Glue: the layers' own times in a profile's raw runs, the glue fit (the ``glue`` correction) and
how the cost model and the accuracy bench use them. Every expected figure is worked by hand."""

from __future__ import annotations

from typing import Any

import pytest

import calibration.accuracy as bench_mod
from calibration.accuracy import loo_rows
from calibration.calibrate import fit_glue, glue_rows, points_from_raw, predict_layers
from hardware_profiles.schema import LayerTable, Measurement
from sim import zoo
from sim.costmodel import glue_time_s, iteration_compute_s, layer_time_s
from sim.workload import Layer, Model
from tests.helpers_profiles import bare_profile

# the zoo's mlp: 784 -> 1024 -> ReLU -> 1024 -> ReLU -> 10; output bytes per sample of its
# five layers: 4096, 4096, 4096, 4096, 40 (sum 16424)
MLP_OUT = 16424.0


def test_mlp_output_bytes_as_assumed() -> None:
    assert sum(ly.activation_bytes for ly in zoo.get("mlp").layers) == MLP_OUT


def test_glue_is_priced_per_layer_pass_and_not_on_tables() -> None:
    relu = Layer("relu", "elementwise", 0.0, 0.0, 0.0, 1e3)
    plain = bare_profile()
    dev = bare_profile(corrections={"glue": {"fwd": [1e-5, 1e-9], "bwd": [2e-5, 0.0]}})
    # forward on 2 samples: 1 launch + (2e3 + 2e3) B / 1e9 B/s, plus glue 1e-5 + 1e-9 * 2e3
    assert layer_time_s(relu, "fwd", 2, plain, "fp32", 1e3) == pytest.approx(1e-6 + 4e-6)
    assert layer_time_s(relu, "fwd", 2, dev, "fp32", 1e3) == pytest.approx(1e-6 + 4e-6 + 1e-5 + 2e-6)
    assert glue_time_s(relu, "fwd", 2, dev, "fp32") == pytest.approx(1.2e-5)
    # backward: 2 launches + (2e3 + 4e3) B / 1e9, plus 2e-5
    assert layer_time_s(relu, "bwd", 2, dev, "fp32", 1e3) == pytest.approx(2e-6 + 6e-6 + 2e-5)
    # half precision halves the output bytes the glue reads
    assert glue_time_s(relu, "fwd", 2, dev, "bf16") == pytest.approx(1e-5 + 1e-6)
    assert glue_time_s(relu, "fwd", 0, dev, "fp32") == 0.0
    assert glue_time_s(relu, "fwd", 2, plain, "fp32") == 0.0
    # a measured table holds the glue already: none is added
    tab = bare_profile(corrections={"glue": {"fwd": [1e-5, 1e-9], "bwd": [2e-5, 0.0]}},
                layers={relu.signature: LayerTable(batch=[1, 4], fwd_s=[1e-3, 4e-3], bwd_s=[2e-3, 8e-3])})
    assert glue_time_s(relu, "fwd", 2, tab, "fp32") == 0.0
    assert layer_time_s(relu, "fwd", 2, tab, "fp32", 1e3) == pytest.approx(2e-3)
    # a model's iteration: each of its two layers carries the glue of both passes
    m = Model("m", (relu, Layer("relu2", "elementwise", 0.0, 0.0, 0.0, 1e3)), input_bytes=1e3)
    assert iteration_compute_s(m, dev, "fp32", 2) == pytest.approx(
        iteration_compute_s(m, plain, "fp32", 2) + 2 * (1.2e-5 + 2e-5))
    with pytest.raises(ValueError):
        bare_profile(corrections={"glue": {"fwd": [-1e-6, 0.0]}})
    with pytest.raises(ValueError):
        bare_profile(corrections={"glue": {"both": [1e-6, 0.0]}})


def _run(b: int, glue_fwd: float, glue_bwd: float, iter_s: float = 1.0) -> dict[str, Any]:
    """An mlp run whose layers' own times are 1 ms / 2 ms, with all the glue charged to layer 0."""
    names = ["0", "1", "2", "3", "4"]
    own = {n: [1e-3, 2e-3] for n in names}
    layers = {n: [1e-3, 2e-3, 0.1, 0.1] for n in names}
    layers["0"] = [1e-3 + glue_fwd, 2e-3 + glue_bwd, 0.1, 0.1]
    return {"batch": b, "layers": layers, "own": own, "iter_s": iter_s}


def test_glue_rows_sum_what_is_charged_beyond_the_own_brackets() -> None:
    raw = {"models": {"mlp": [_run(16, 3e-4, 5e-4, 0.5)]}}
    rows = glue_rows(raw)
    assert rows["fwd"] == [pytest.approx((5.0, 16 * MLP_OUT, 3e-4, 0.5))]
    assert rows["bwd"] == [pytest.approx((5.0, 16 * MLP_OUT, 5e-4, 0.5))]
    assert glue_rows(raw, exclude=["mlp"]) == {"fwd": [], "bwd": []}


def test_glue_fit_recovers_a_per_layer_and_a_per_byte_term() -> None:
    # glue = 5 layers * a + B * c with a = 1e-5 s, c = 2e-12 s/B (forward); backward 3e-5 and 0
    a, c = 1e-5, 2e-12
    runs = [_run(b, 5 * a + b * MLP_OUT * c, 5 * 3e-5, it) for b, it in ((16, 0.003), (64, 0.008))]
    g = fit_glue({"models": {"mlp": runs}})
    assert g is not None
    assert g["fwd"] == pytest.approx((a, c), rel=1e-3)
    assert g["bwd"] == pytest.approx((3e-5, 0.0), abs=1e-12)


def test_glue_fit_keeps_both_terms_non_negative() -> None:
    # glue falling with batch (5e-5 at b=16, 4e-5 at b=64): the unconstrained solution has a
    # negative per-byte term; per layer alone (equal iteration weights) the best a is
    # (5 * 5e-5 + 5 * 4e-5) / (5^2 + 5^2) = 9e-6, which fits better than bytes alone
    runs = [_run(16, 5e-5, 0.0), _run(64, 4e-5, 0.0)]
    g = fit_glue({"models": {"mlp": runs}})
    assert g is not None
    assert g["fwd"] == pytest.approx((9e-6, 0.0), rel=1e-3, abs=1e-15)
    assert g["bwd"] == (0.0, 0.0)


def test_no_own_times_no_glue_and_charged_points() -> None:
    run = _run(16, 3e-4, 5e-4)
    assert fit_glue({"models": {"mlp": [{k: v for k, v in run.items() if k != "own"}]}}) is None
    pts = points_from_raw({"models": {"mlp": [run]}}, micro=False)
    # with own times the points are the layers' own brackets: 1 ms and 2 ms for layer 0 too
    assert {(p.layer, p.phase): p.t_s for p in pts if p.layer == "0"} == {("0", "fwd"): 1e-3,
                                                                           ("0", "bwd"): 2e-3}
    del run["own"]
    pts = points_from_raw({"models": {"mlp": [run]}}, micro=False)
    assert {(p.layer, p.phase): p.t_s for p in pts if p.layer == "0"} == {("0", "fwd"): 1.3e-3,
                                                                           ("0", "bwd"): 2.5e-3}


def test_predict_layers_without_glue_is_the_own_part() -> None:
    m = zoo.get("mlp")
    dev = bare_profile(corrections={"glue": {"fwd": [1e-5, 1e-9], "bwd": [2e-5, 0.0]}})
    f, b = predict_layers(dev, m, 4)
    of, ob = predict_layers(dev, m, 4, glue=False)
    pf, pb = predict_layers(bare_profile(), m, 4)
    assert of == pytest.approx(pf) and ob == pytest.approx(pb)
    assert [x - y for x, y in zip(f, of, strict=True)] == pytest.approx(
        [1e-5 + 1e-9 * 4 * ly.activation_bytes for ly in m.layers])
    assert [x - y for x, y in zip(b, ob, strict=True)] == pytest.approx([2e-5] * len(m.layers))


def test_bench_measures_layers_against_their_own_time_where_recorded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The fit is replaced by a known profile: glue 1e-5 s per layer forward, 2e-5 backward.
    # Run b=16 records own times equal to the curves' figures and charges 1e-4 s of glue to
    # layer 0 in each pass; b=64 has no own times and its charged times are the predictions
    # with glue. Both iterations are the predictions with glue (5 layers x 3e-5 s).
    dev = bare_profile(efficiency={"gemm": 0.5}, corrections={"glue": {"fwd": [1e-5, 0.0], "bwd": [2e-5, 0.0]}})
    monkeypatch.setattr(bench_mod, "fit", lambda profile, exclude: (dev, None))
    m = zoo.get("mlp")
    runs = []
    for b in (16, 64):
        of, ob = predict_layers(dev, m, b, glue=False)
        f, w = predict_layers(dev, m, b)
        assert sum(f) + sum(w) == pytest.approx(sum(of) + sum(ob) + 5 * 3e-5)
        run: dict[str, Any] = {"batch": b, "iter_s": sum(f) + sum(w), "hooked_iter_s": 1.0,
                               "glue_s": 0.0}
        if b == 16:
            run["own"] = {ly.name: [of[i], ob[i]] for i, ly in enumerate(m.layers)}
            run["layers"] = {ly.name: [of[i], ob[i], 0.1, 0.1] for i, ly in enumerate(m.layers)}
            run["layers"]["0"] = [of[0] + 1e-4, ob[0] + 1e-4, 0.1, 0.1]
        else:
            run["layers"] = {ly.name: [f[i], w[i], 0.1, 0.1] for i, ly in enumerate(m.layers)}
        runs.append(run)
    rows = loo_rows(dev.model_copy(update={"measurement": Measurement(raw={"models": {"mlp": runs}})}))
    assert [r["layer_ref"] for r in rows] == ["own", "charged"]
    assert [r["layer_passes"] for r in rows] == [10, 10]
    for r in rows:
        assert r["layer_median_abs_err"] == pytest.approx(0.0, abs=1e-12)
        assert r["layer_p90_abs_err"] == pytest.approx(0.0, abs=1e-12)
        assert r["iter_err"] == pytest.approx(0.0, abs=1e-12)
