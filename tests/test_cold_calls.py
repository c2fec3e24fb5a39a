"""The cold-call term: what a pass pays after passes that moved many bytes.

The window of passes before each pass in execution order, the profile's cold curve,
the cost model adding it to passes priced by the curves (not to measured tables), the
curves built from the profiler's benchmark, and the fit choosing a window.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from calibration.calibrate import Point, _point_time, cold_curves
from hardware_profiles import DeviceProfile
from sim.corrections import ColdCalls, corrections_of
from sim.costmodel import layer_time_s, layer_times, layer_work, window_sums
from tests.helpers_eval import dense, model
from tests.helpers_profiles import bare_profile

#: 0 s up to 1 MB moved, 100 us from 100 MB on; 50 us at 10 MB (log-linear)
CURVE = {"bytes": [1e6, 1e8], "s": [0.0, 1e-4]}


def cold_profile(curves: dict, window: int | None = None, **kw: object) -> DeviceProfile:
    """bare_profile with the cold_calls correction of ``curves`` (and ``window``, if given)."""
    params = {"curves": curves, **({} if window is None else {"window": window})}
    return bare_profile(corrections={"cold_calls": params}, **kw)


def cold_s(dev: DeviceProfile, op: str, streamed: float) -> float:
    """The cold_calls correction's seconds for a pass of ``op`` after ``streamed`` bytes."""
    return sum(c.at(op, streamed) for c in corrections_of(dev) if isinstance(c, ColdCalls))


def test_window_sums_follow_the_iteration_by_hand() -> None:
    # order: f0=1, f1=2, f2=3, b2=30, b1=20, b0=10, then f0 again
    f, b = window_sums([1, 2, 3], [10, 20, 30], 1)
    assert f.tolist() == [10, 1, 2] and b.tolist() == [20, 30, 3]
    f, b = window_sums([1, 2, 3], [10, 20, 30], 2)
    assert f.tolist() == [30, 11, 3] and b.tolist() == [50, 33, 5]
    # a window longer than the iteration wraps around it
    f, _ = window_sums([1.0], [10.0], 3)  # before f0: b0, f0, b0
    assert f.tolist() == [21.0]


def test_cold_curve_interpolates_in_log_bytes_and_clamps() -> None:
    dev = cold_profile({"elementwise": CURVE}, 2)
    assert cold_s(dev, "elementwise", 1e7) == pytest.approx(5e-5)
    assert cold_s(dev, "elementwise", 1e5) == 0.0 and cold_s(dev, "elementwise", 1e9) == pytest.approx(1e-4)
    assert cold_s(dev, "elementwise", 0.0) == 0.0
    assert cold_s(dev, "gemm", 1e7) == 0.0  # no curve for the class: nothing
    assert cold_s(bare_profile(), "elementwise", 1e7) == 0.0 and corrections_of(bare_profile()) == ()


@pytest.mark.parametrize(("value", "message"), [
    ({"elementwise": {"bytes": [1e6], "s": [0.0, 1e-4]}}, "non-empty lists of equal length"),
    ({"elementwise": {"bytes": [1e8, 1e6], "s": [0.0, 1e-4]}}, "positive and strictly increasing"),
    ({"elementwise": {"bytes": [1e6, 1e8], "s": [0.0, 0.5]}}, r"in \[0, 0.01\]"),
    ({"matmul": CURVE}, "unknown op class 'matmul'"),
])
def test_cold_curve_validation(value: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        cold_profile(value)


def test_cold_window_is_at_least_one() -> None:
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        cold_profile({"elementwise": CURVE}, 0)


def test_a_pass_priced_by_the_curves_pays_the_cold_seconds_a_table_does_not() -> None:
    dev = cold_profile({"gemm": CURVE})
    ly = dense("fc", 4e3, fwd_flops=1e6, activation_bytes=40.0)
    base = layer_time_s(ly, "fwd", 10, dev, "fp32", 40.0)
    assert layer_time_s(ly, "fwd", 10, dev, "fp32", 40.0, streamed_bytes=1e7) == pytest.approx(base + 5e-5)
    table = {"layers": {ly.signature: {"batch": [10], "fwd_s": [1e-3], "bwd_s": [2e-3]}}}
    tabled = cold_profile({"gemm": CURVE}, **table)
    assert layer_time_s(ly, "fwd", 10, tabled, "fp32", 40.0, streamed_bytes=1e7) == pytest.approx(1e-3)


def test_layer_times_add_the_window_of_each_pass() -> None:
    # three layers; window 2: layer 0's forward follows the backward of layers 0 and 1
    m = model(dense("a", 4e6, fwd_flops=1e6, bwd_flops=2e6, activation_bytes=4e3),
              dense("b", 8e6, fwd_flops=1e6, bwd_flops=2e6, activation_bytes=4e3),
              dense("c", 2e6, fwd_flops=1e6, bwd_flops=2e6, activation_bytes=4e3), input_bytes=4e3)
    cold = cold_profile({"gemm": CURVE}, 2)
    warm = bare_profile()
    fc, bc = layer_times(m, cold, "fp32", 4)
    fw, bw = layer_times(m, warm, "fp32", 4)
    nbytes = {(i, ph): layer_work(ly, ph, 4, "fp32", m.input_bytes_of(i))[2]
              for i, ly in enumerate(m.layers) for ph in ("fwd", "bwd")}
    assert fc[0] - fw[0] == pytest.approx(cold_s(cold, "gemm", nbytes[0, "bwd"] + nbytes[1, "bwd"]))
    assert fc[2] - fw[2] == pytest.approx(cold_s(cold, "gemm", nbytes[1, "fwd"] + nbytes[0, "fwd"]))
    assert bc[2] - bw[2] == pytest.approx(cold_s(cold, "gemm", nbytes[2, "fwd"] + nbytes[1, "fwd"]))
    assert bc[0] - bw[0] == pytest.approx(cold_s(cold, "gemm", nbytes[1, "bwd"] + nbytes[2, "bwd"]))
    assert all(x > 0 for x in np.concatenate([fc - fw, bc - bw]))


def test_cold_curves_from_the_benchmark_by_hand() -> None:
    raw = {"cold": {"moved_bytes": [1e5, 1e6, 1e7],
                    "cold_s": {"relu": [2e-6, 5e-6, 4e-6], "linear": [1e-5, 3e-5, 9e-5]},
                    "warm_s": {"relu": [3e-6, 3e-6, 3e-6], "linear": [1e-5, 1e-5, 1e-5]}}}
    c = cold_curves(raw)
    assert c is not None and set(c) == {"elementwise", "gemm", "conv", "attention"}  # no embedding call
    # relu: 2 - 3 < 0 -> 0; 2 us; 1 us, which the running maximum keeps at 2
    assert c["elementwise"].bytes == [1e5, 1e6, 1e7]
    assert c["elementwise"].s == pytest.approx([0.0, 2e-6, 2e-6])
    assert c["conv"].s == pytest.approx([0.0, 2e-5, 8e-5]) and c["conv"] == c["gemm"] == c["attention"]
    assert cold_curves({}) is None


def test_a_point_is_priced_with_its_window() -> None:
    dev = cold_profile({"elementwise": CURVE}, 2)
    p = Point("elementwise", "fwd", 0.0, 1e3, 1, 1e-5, "m", "relu", 1, kind="elementwise/k1",
              before=(1e6, 1e7, 1e8))
    assert _point_time(dev, p) - _point_time(bare_profile(), p) == pytest.approx(5e-5)


def test_the_profile_summary_states_the_cold_calls() -> None:
    from calibration.profiler import summary

    dev = cold_profile({"elementwise": CURVE}, 3)
    # 16 MiB = 16777216 bytes: log10 7.2248, 0.6124 of the way from 1e6 (0 s) to 1e8 (100 us)
    assert summary(dev).splitlines()[-1] == "cold calls (window 3 passes): after 16 MiB moved, elementwise +61.2 us"
    assert "cold calls" not in summary(bare_profile())


@pytest.mark.parametrize(("cold", "message"), [
    ({"moved_bytes": [1e5, 1e6]}, "needs moved_bytes, cold_s and warm_s"),
    ({"moved_bytes": [1e6, 1e5], "cold_s": {}, "warm_s": {}}, "positive and increasing"),
    ({"moved_bytes": [1e5, 1e6], "cold_s": {"relu": [1e-6, 2e-6]}, "warm_s": {}}, "one cold_s and one warm_s"),
    ({"moved_bytes": [1e5, 1e6], "cold_s": {"relu": [1e-6]}, "warm_s": {"relu": [1e-6]}},
     "one cold_s and one warm_s"),
])
def test_a_malformed_benchmark_is_refused(cold: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cold_curves({"cold": cold})


def test_a_benchmark_that_measured_no_cold_cost_leaves_the_fit_alone() -> None:
    # cold == warm at every size: every window's cold seconds are 0, no window beats none
    from calibration.calibrate import fit

    raw = {"micro": [{"name": "relu_x", "model": {
        "name": "micro", "input_bytes": 4096.0,
        "layers": [{"name": "relu", "op": "elementwise", "fwd_flops": 0.0, "bwd_flops": 0.0,
                    "param_bytes": 0.0, "activation_bytes": 4096.0}]},
        "runs": [{"batch": b, "iter_s": 1e-4, "layers": {"relu": [t, 2 * t, 0.0, 0.0]}}
                 for b, t in ((1, 5e-6), (4, 8e-6), (16, 2e-5), (64, 7e-5), (256, 2.6e-4))]}],
        "dispatch_s": 1e-6}
    flat = {"moved_bytes": [1e5, 1e6], "cold_s": {"relu": [3e-6, 3e-6]}, "warm_s": {"relu": [3e-6, 3e-6]}}
    plain, _ = fit(bare_profile(measurement={"raw": raw}))
    same, _ = fit(bare_profile(measurement={"raw": {**raw, "cold": flat}}))
    assert same.corrections.cold_calls is None
    assert same.model_dump(exclude={"measurement"}) == plain.model_dump(exclude={"measurement"})


def test_calibrate_refuses_a_malformed_benchmark_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from calibration.profiler import write_profile
    from experiments.cli import main

    raw = {"micro": [{"name": "relu_x", "model": {
        "name": "micro", "input_bytes": 4096.0,
        "layers": [{"name": "relu", "op": "elementwise", "fwd_flops": 0.0, "bwd_flops": 0.0,
                    "param_bytes": 0.0, "activation_bytes": 4096.0}]},
        "runs": [{"batch": 1, "iter_s": 1e-4, "layers": {"relu": [5e-6, 1e-5, 0.0, 0.0]}}]}],
        "cold": {"moved_bytes": [1e6, 1e5], "cold_s": {}, "warm_s": {}}}
    path = tmp_path / "m.json"
    write_profile(bare_profile(measurement={"raw": raw}), path)
    assert main(["calibrate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"hetsim: error: {path}: measurement.raw.cold: moved_bytes must be positive and increasing"]
