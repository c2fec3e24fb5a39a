"""bench/calibration_accuracy: the noise floor of the per-layer measurements and the twin floor."""

from __future__ import annotations

import pytest

import bench.calibration_accuracy as bench_mod
from bench.calibration_accuracy import noise_floor, twin_floor
from hardware_profiles.calibrate import predict_layers
from sim import zoo
from tests.helpers_profiles import bare_profile


def test_noise_floor_by_hand() -> None:
    # mlp: layers '1' and '3' are ReLUs of one signature (4096 output bytes).
    # rel IQR 0.1349 -> sigma 0.1; 16 repeats -> SE of the median 1.2533 * 0.1 / 4.
    iqr = 0.1349
    raw = {"models": {"mlp": [{"batch": 16, "reps": 16, "layers": {
        "1": [1e-5, 2e-5, iqr, iqr],
        "3": [1.5e-5, 2e-5, iqr, iqr],
    }}]}}
    n = noise_floor(raw)
    assert n["layer_passes"] == 4
    assert n["se_median"] == pytest.approx(1.2533 * 0.1 / 4)
    # forward: 1e-5 vs 1.5e-5 -> 1/3 and 1/2; backward equal -> 0, 0; median 1/6
    assert n["same_sig_passes"] == 4
    assert n["same_sig_median"] == pytest.approx((0.0 + 1 / 3) / 2)
    assert noise_floor({})["se_median"] is None


def _relu_raw(mlp_fwd: tuple[float, float], micro_fwd: float) -> dict:
    """The zoo's mlp at batch 16 (its ReLUs '1' and '3': 4096 bytes in and out per
    sample) and a single-layer benchmark of the same ReLU: the same work at batch 16."""
    relu = {"name": "micro", "input_bytes": 4096.0,
            "layers": [{"name": "relu", "op": "elementwise", "fwd_flops": 0.0, "bwd_flops": 0.0,
                        "param_bytes": 0.0, "activation_bytes": 4096.0}]}
    return {
        "models": {"mlp": [{"batch": 16, "iter_s": 1e-3, "hooked_iter_s": 1e-3, "layers": {
            "1": [mlp_fwd[0], 0.0, 0.0, 0.0],
            "3": [mlp_fwd[1], 0.0, 0.0, 0.0],
        }}]},
        "micro": [{"name": "relu_16k", "model": relu, "runs": [
            {"batch": 16, "iter_s": 1e-4, "layers": {"relu": [micro_fwd, 0.0, 0.0, 0.0]}},
            # another batch: other work, no twin of the mlp's passes
            {"batch": 64, "iter_s": 1e-4, "layers": {"relu": [1e-3, 0.0, 0.0, 0.0]}},
        ]}],
    }


def test_twin_floor_by_hand() -> None:
    # mlp's forward ReLUs at 10 us and 12 us; the benchmark's, the same work, at 8 us:
    # |10/8 - 1| = 0.25, |12/8 - 1| = 0.5 -> 2 passes, median 0.375. The two ReLUs
    # of the mlp are not each other's twins (one model), and zero times are no passes.
    prof = bare_profile(raw=_relu_raw((1e-5, 1.2e-5), 8e-6))
    assert twin_floor(prof) == {("mlp", 16): {"passes": 2, "median_abs_err": pytest.approx(0.375)}}


def test_twin_floor_without_twins_is_empty() -> None:
    raw = _relu_raw((1e-5, 1.2e-5), 8e-6)
    raw["micro"][0]["runs"] = raw["micro"][0]["runs"][1:]  # only batch 64: other work
    assert twin_floor(bare_profile(raw=raw)) == {}


def test_passes_lists_every_pass_of_the_held_out_model(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # The fit is replaced by a known profile; every measured pass of the mlp at batch 16
    # took 1.25 times its prediction: each of its 10 passes is listed at -20.0%.
    dev = bare_profile(efficiency={"gemm": 0.5})
    monkeypatch.setattr(bench_mod, "fit", lambda profile, exclude: (dev, None))
    m = zoo.get("mlp")
    f, w = predict_layers(dev, m, 16)
    run = {"batch": 16, "iter_s": 1.0, "hooked_iter_s": 1.0, "glue_s": 0.0,
           "layers": {ly.name: [1.25 * f[i], 1.25 * w[i], 0.1, 0.1] for i, ly in enumerate(m.layers)}}
    prof = dev.model_copy(update={"raw": {"models": {"mlp": [run]}}})
    monkeypatch.setattr(bench_mod, "load_profile_file", lambda path: prof)
    assert bench_mod.main(["p.json", "--passes", "mlp"]) == 0
    out = capsys.readouterr().out
    assert "mlp at batch 16 (held out): median |err| 20.0% over 10 passes" in out
    assert out.count("-20.0%") == 10
    # a model the profile did not measure: one line, exit 2
    assert bench_mod.main(["p.json", "--passes", "vgg16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: p.json: --passes vgg16: the profile measured no such model (it has: mlp)"]
