"""bench/calibration_accuracy: the noise floor of the per-layer measurements."""

from __future__ import annotations

import pytest

from bench.calibration_accuracy import noise_floor


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
