"""bench/calibration_accuracy: the noise floor of the per-layer measurements and the twin floor."""

from __future__ import annotations

from pathlib import Path

import pytest

import calibration.accuracy as bench_mod
from calibration.accuracy import loo_rows, noise_floor, twin_floor
from calibration.calibrate import predict_layers
from hardware_profiles.schema import Measurement
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


def _relu_raw(mlp: dict[str, tuple[float, float]], twins: list[tuple[float, float]]) -> dict:
    """The zoo's mlp at batch 16 with (forward, backward) seconds of its ReLUs '1' and '3'
    (4096 bytes in and out per sample), and one single-layer benchmark of the same ReLU
    per entry of ``twins``: at batch 16 the same work (those seconds), at 64 other work."""
    relu = {"name": "micro", "input_bytes": 4096.0,
            "layers": [{"name": "relu", "op": "elementwise", "fwd_flops": 0.0, "bwd_flops": 0.0,
                        "param_bytes": 0.0, "activation_bytes": 4096.0}]}
    return {
        "models": {"mlp": [{"batch": 16, "iter_s": 1e-3, "hooked_iter_s": 1e-3, "layers": {
            k: [f, b, 0.0, 0.0] for k, (f, b) in mlp.items()}}]},
        "micro": [{"name": f"relu_{i}", "model": relu, "runs": [
            {"batch": 16, "iter_s": 1e-4, "layers": {"relu": [f, b, 0.0, 0.0]}},
            {"batch": 64, "iter_s": 1e-4, "layers": {"relu": [1e-3, 1e-3, 0.0, 0.0]}},
        ]} for i, (f, b) in enumerate(twins)],
    }


#: forward twins 8, 9 and 16 us (median 9, mean 11); backward twins 10 us each
TWINS = [(8e-6, 1e-5), (9e-6, 1e-5), (1.6e-5, 1e-5)]


def test_twin_floor_by_hand() -> None:
    # mlp: '1' forward 10 us -> |10/9 - 1| = 1/9; '3' forward 12 us -> 1/3; '1' backward
    # 20 us -> |20/10 - 1| = 1; '3' backward not measured (0: no pass). Median of the
    # three: 1/3. The two ReLUs of the mlp are not each other's twins (one model).
    prof = bare_profile(measurement={"raw": _relu_raw({"1": (1e-5, 2e-5), "3": (1.2e-5, 0.0)}, TWINS)})
    assert twin_floor(prof) == {("mlp", 16): {"passes": 3, "median_abs_err": pytest.approx(1 / 3)}}


def test_twin_floor_without_twins_is_empty() -> None:
    raw = _relu_raw({"1": (1e-5, 2e-5), "3": (1.2e-5, 0.0)}, TWINS)
    for entry in raw["micro"]:
        entry["runs"] = entry["runs"][1:]  # only batch 64: other work
    assert twin_floor(bare_profile(measurement={"raw": raw})) == {}
    assert twin_floor(bare_profile()) == {}  # no raw measurements at all


def test_passes_lists_every_pass_of_the_held_out_model(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # The fit is replaced by a known profile; every measured pass of the mlp at batch 16
    # took 1.25 times its prediction: each of its 10 passes is listed at -20.0%. ctr_dnn
    # at 32, measured at its predictions, is listed only when asked for; its first ReLU
    # (32 x 512) does the work of the mlp's two (16 x 1024), as does a benchmark of the
    # ReLU whose forward took the prediction p. mlp: forward twins (p, p), backward (p):
    # 4 passes, each |1.25 - 1| = 0.25 off. ctr_dnn's ReLU: forward twins (1.25p, 1.25p,
    # p) -> median 1.25p, backward (1.25p, 1.25p): 2 passes, each |1 / 1.25 - 1| = 0.2.
    dev = bare_profile(efficiency={"gemm": 0.5})
    monkeypatch.setattr(bench_mod, "fit", lambda profile, exclude: (dev, None))
    m = zoo.get("mlp")
    f, w = predict_layers(dev, m, 16, glue=False)
    assert f[1] == f[3]
    raw = _relu_raw({ly.name: (1.25 * f[i], 1.25 * w[i]) for i, ly in enumerate(m.layers)},
                    [(f[1], 0.0)])
    c = zoo.get("ctr_dnn")
    cf, cw = predict_layers(dev, c, 32)
    raw["models"]["ctr_dnn"] = [{"batch": 32, "iter_s": 1.0, "hooked_iter_s": 1.0, "layers": {
        ly.name: [cf[i], cw[i], 0.0, 0.0] for i, ly in enumerate(c.layers)}}]
    prof = dev.model_copy(update={"measurement": Measurement(raw=raw)})
    monkeypatch.setattr(bench_mod, "load_profile_file", lambda path: prof)

    rows = loo_rows(prof)
    assert [(r["model"], r["batch"], r["twin_passes"]) for r in rows] == [("mlp", 16, 4), ("ctr_dnn", 32, 2)]
    assert [r["twin_median_abs_err"] for r in rows] == [pytest.approx(0.25), pytest.approx(0.2)]
    # per pass: the forward ReLU's twins are the benchmark's and ctr_dnn's (median p), the
    # backward's ctr_dnn's alone (the benchmark's backward is 0: no pass); GEMMs have none
    twins = {(p["layer"], p["phase"]): (p["twins"], p["twin_s"]) for p in rows[0]["passes"]}
    assert twins[("1", "fwd")] == (2, pytest.approx(f[1]))
    assert twins[("3", "bwd")] == (1, pytest.approx(w[3]))
    assert twins[("0", "fwd")] == (0, None)
    assert rows[1]["layer_median_abs_err"] == pytest.approx(0.0, abs=1e-12)

    assert bench_mod.main(["p.json", "--passes", "mlp"]) == 0
    out = capsys.readouterr().out
    assert "mlp at batch 16 (held out): median |err| 20.0% over 10 passes" in out
    assert out.count("-20.0%") == 10
    assert "ctr_dnn" not in out
    # the table: the twins column
    bench_mod.main(["p.json"])
    table = capsys.readouterr().out.splitlines()
    assert [ln.split("  ")[-1].strip() for ln in table if ln.startswith(("mlp ", "ctr_dnn "))] == ["4: 25.0%", "2: 20.0%"]


def test_passes_errors_are_one_line(capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    prof = bare_profile(measurement={"raw": _relu_raw({"1": (1e-5, 2e-5)}, TWINS)})
    monkeypatch.setattr(bench_mod, "load_profile_file", lambda path: prof)
    # a model the profile did not measure
    assert bench_mod.main(["p.json", "--passes", "vgg16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: p.json: --passes vgg16: the profile measured no such model (it has: mlp)"]
    # one model's passes do not compare two profiles
    assert bench_mod.main(["p.json", "--passes", "mlp", "--repeat", "q.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --passes lists one profile's passes; leave out --repeat"]


def test_plot_writes_the_figure(tmp_path: Path) -> None:
    from experiments.plots import calibration_figure

    passes = [{"layer": "0", "op": "gemm", "phase": "fwd", "pred_s": 1e-4, "meas_s": 1.1e-4, "err": -1 / 11},
              {"layer": "1", "op": "elementwise", "phase": "bwd", "pred_s": 2e-5, "meas_s": 1e-5, "err": 1.0}]
    rows = [{"model": "mlp", "batch": 16, "layer_median_abs_err": 0.5, "iter_err": 0.02, "passes": passes},
            {"model": "mlp", "batch": 64, "layer_median_abs_err": 0.05, "iter_err": -0.01, "passes": passes}]
    out = calibration_figure(rows, tmp_path / "c.png", title="t")
    assert out == tmp_path / "c.png"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_path_errors_are_one_line_and_come_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # both fail before the profile is read (a profile that does not exist is not reached)
    def unread(path: str) -> None:
        raise AssertionError("the profile was read")

    monkeypatch.setattr(bench_mod, "load_profile_file", unread)
    assert bench_mod.main(["p.json", "--plot", "fig.svg"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: fig.svg: --plot: a figure file name must end in .png"]
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert bench_mod.main(["p.json", "--plot", str(blocker / "fig.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {blocker}: --plot: cannot write there")


def _runs(layers: dict[str, list[float]], own: dict[str, list[float]] | None, iter_s: float) -> dict:
    run = {"batch": 16, "iter_s": iter_s, "hooked_iter_s": iter_s,
           "layers": {k: [*v, 0.0, 0.0] for k, v in layers.items()}}
    if own is not None:
        run["own"] = own
    return {"models": {"mlp": [run]}}


def test_repeatability_overall_and_per_row_by_hand() -> None:
    a = _runs({"1": [1e-5, 2e-5], "3": [1e-5, 1e-5]}, {"1": [0.8e-5, 1.6e-5], "3": [1e-5, 1e-5]}, 1e-3)
    a["models"]["mlp"].append({**a["models"]["mlp"][0], "batch": 64})  # the second profile lacks it
    b = _runs({"1": [1.2e-5, 2e-5], "3": [1e-5, 0.5e-5]}, {"1": [1e-5, 2e-5], "3": [1.1e-5, 1e-5]}, 1.1e-3)
    rep = bench_mod.repeatability(bare_profile(measurement={"raw": a}), bare_profile(measurement={"raw": b}))
    # overall, charged times: 0.2, 0, 0, 0.5 -> median 0.1; one iteration 10% apart
    assert rep["layer_passes"] == 4 and rep["layer_median_abs_diff"] == pytest.approx(0.1)
    assert rep["iterations"] == 1 and rep["iter_median_abs_diff"] == pytest.approx(0.1)
    # the row, own times: 1.0/0.8, 2.0/1.6, 1.1/1.0, 1.0/1.0 -> 0.25, 0.25, 0.1, 0 -> median 0.175
    assert rep["rows"] == [{"model": "mlp", "batch": 16, "passes": 4, "layer_ref": "own",
                            "layer_median_abs_diff": pytest.approx(0.175), "iter_diff": pytest.approx(0.1)}]
    # layer '1' own in both, '3' own in the first only: '1' on own times (0.25, 0.25),
    # '3' on charged ones (0, 0.5); a layer the second profile lacks ('5') is no pass
    a["models"]["mlp"][0]["layers"]["5"] = [1e-5, 1e-5, 0.0, 0.0]
    del b["models"]["mlp"][0]["own"]["3"]
    row = bench_mod.repeatability(bare_profile(measurement={"raw": a}), bare_profile(measurement={"raw": b}))["rows"][0]
    assert row["layer_ref"] == "own and charged" and row["passes"] == 4
    assert row["layer_median_abs_diff"] == pytest.approx(0.25)
    # without own times in the second profile, the charged ones: 0.2, 0, 0, 0.5 -> 0.1;
    # a pass timed 0 in the second (not measured) is no pass
    del b["models"]["mlp"][0]["own"]
    b["models"]["mlp"][0]["layers"]["3"][1] = 0.0
    row = bench_mod.repeatability(bare_profile(measurement={"raw": a}), bare_profile(measurement={"raw": b}))["rows"][0]
    assert row["layer_ref"] == "charged" and row["passes"] == 3
    assert row["layer_median_abs_diff"] == pytest.approx(0.0)


def test_the_table_shows_each_rows_repeat(capsys: pytest.CaptureFixture[str]) -> None:
    row = {"model": "mlp", "batch": 16, "layer_passes": 4, "layer_median_abs_err": 0.2,
           "layer_p90_abs_err": 0.3, "iter_pred_s": 1e-3, "iter_meas_s": 1e-3, "iter_err": 0.0,
           "glue_frac": 0.0, "layers_over_iter": 1.0, "layer_ref": "own", "twin_passes": 0}
    rep = {"layer_median_abs_diff": 0.1, "layer_p90_abs_diff": 0.2, "iter_median_abs_diff": 0.1,
           "iter_max_abs_diff": 0.1, "spread_a": None, "spread_b": None,
           "rows": [{"model": "mlp", "batch": 16, "passes": 4, "layer_ref": "own",
                     "layer_median_abs_diff": 0.175, "iter_diff": -0.1}]}
    assert bench_mod.print_report([row], rep) is False  # 20% per layer: a miss
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].split()[-6:] == ["ok", "repeat", "layer", "/", "iter", "twins"]
    assert lines[3].split()[-5:] == ["NO", "17.5%", "/", "-10.0%", "-"]
    bench_mod.print_report([row], None)  # without a second profile: no repeat column
    plain = capsys.readouterr().out.splitlines()
    assert "repeat" not in plain[2] and plain[3].split()[-2:] == ["NO", "-"]


def test_a_file_that_is_no_profile_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "p.json"
    bad.write_text("{}")
    good = Path(__file__).resolve().parents[1] / "hardware_profiles" / "measured" / "this_machine.json"
    for argv in ([str(bad)], [str(good), "--repeat", str(bad)]):
        assert bench_mod.main(argv) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {bad}")
