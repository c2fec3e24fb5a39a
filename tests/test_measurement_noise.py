"""bench/measurement_noise: the spread of repeated measurements, the oracle floor, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration import measurement_noise as noise
from calibration.accuracy import run_errors
from calibration.calibrate import predict_layers
from sim import zoo
from tests.helpers_profiles import bare_profile


def _run(batch: int, iter_s: float, own: dict[str, tuple[float, float]] | None,
         charged: dict[str, tuple[float, float]]) -> dict:
    run = {"batch": batch, "iter_s": iter_s, "hooked_iter_s": iter_s,
           "layers": {k: [f, b, 0.0, 0.0] for k, (f, b) in charged.items()}}
    if own is not None:
        run["own"] = {k: [f, b] for k, (f, b) in own.items()}
    return run


def _trials() -> list[dict]:
    """Three trials of mlp at 16: layer '0' own forward 1, 2, 4 us (backward 2 us in
    each), iterations 8, 10, 12 ms; the charged times differ and must not count. The
    third trial has mlp at 64 too, which the others lack."""
    trials = []
    for fwd, it in ((1e-6, 8e-3), (2e-6, 10e-3), (4e-6, 12e-3)):
        trials.append({"mlp": [_run(16, it, {"0": (fwd, 2e-6)}, {"0": (9.0, 9.0)})]})
    trials[2]["mlp"].append(_run(64, 1.0, {"0": (1.0, 1.0)}, {"0": (1.0, 1.0)}))
    return trials


def test_spread_by_hand() -> None:
    sp = noise.spread(_trials())
    rows = sp["rows"]
    assert len(rows) == 1  # mlp at 64 is in one trial only
    r = rows[0]
    assert (r["model"], r["batch"], r["trials"], r["passes"]) == ("mlp", 16, 3, 2)
    it = r["iter_s"]
    assert (it["median"], it["min"], it["max"]) == pytest.approx((10e-3, 8e-3, 12e-3))
    assert it["floor"] == pytest.approx(4 / 20)
    # forward: (4 - 1) / (4 + 1) = 0.6; backward 0 -> median 0.3
    assert r["pass_spread"] == pytest.approx(0.3)
    o = r["oracle"]
    # medians: forward 2 us, backward 2 us, iteration 10 ms. Per trial, the median of
    # |2/f - 1| and 0: 0.5, 0, 0.25; iteration 10/8 - 1, 0, 10/12 - 1
    assert o["layer_median_abs_err"] == pytest.approx({"median": 0.25, "max": 0.5})
    assert o["iter_errs"] == pytest.approx([0.25, 0.0, -1 / 6])
    assert o["iter_abs_err"] == pytest.approx({"median": 1 / 6, "max": 0.25})
    assert o["trials_meeting_targets"] == 1  # only the middle trial: 0.25 > 15% in the third
    # one model: nothing to learn the machine's state from
    assert r["oracle_state"] is None
    assert sp["all_rows"] == {"oracle": 1, "oracle_state": None}


def test_the_state_aware_oracle_learns_the_trial_speed_from_the_other_models() -> None:
    # ctr_dnn iterations 10, 10, 20 ms (over its median: 1, 1, 2); mlp 8, 10, 20 ms
    # (0.8, 1, 2). Each layer's own time moves with its model's iteration.
    def trial(mlp_s: float, ctr_s: float) -> dict:
        return {"mlp": [_run(16, mlp_s, {"0": (mlp_s / 10, mlp_s / 10)}, {"0": (1.0, 1.0)})],
                "ctr_dnn": [_run(32, ctr_s, {"a": (ctr_s / 10, ctr_s / 10)}, {"a": (1.0, 1.0)})]}

    trials = [trial(8e-3, 10e-3), trial(10e-3, 10e-3), trial(20e-3, 20e-3)]
    sp = noise.spread(trials)
    scales = noise.state_scales(noise._runs(trials))
    assert scales[("mlp", 16)] == pytest.approx([1.0, 1.0, 2.0])
    assert scales[("ctr_dnn", 32)] == pytest.approx([0.8, 1.0, 2.0])
    by = {r["model"]: r for r in sp["rows"]}
    # mlp: median 10 ms; plain 10/8 - 1, 0, 10/20 - 1; state-aware 10/8 - 1, 0, 2 * 10/20 - 1
    assert by["mlp"]["oracle"]["iter_errs"] == pytest.approx([0.25, 0.0, -0.5])
    assert by["mlp"]["oracle_state"]["iter_errs"] == pytest.approx([0.25, 0.0, 0.0])
    assert by["mlp"]["oracle_state"]["layer_median_abs_err"] == pytest.approx(
        {"median": 0.0, "max": 0.25})
    # ctr_dnn: median 10 ms; plain 0, 0, -0.5; state-aware 0.8 - 1, 0, 0
    assert by["ctr_dnn"]["oracle"]["iter_errs"] == pytest.approx([0.0, 0.0, -0.5])
    assert by["ctr_dnn"]["oracle_state"]["iter_errs"] == pytest.approx([-0.2, 0.0, 0.0])
    # every row at once: plain only in trial 2; state-aware in trial 2 and 3
    assert sp["all_rows"] == {"oracle": 1, "oracle_state": 2}


def test_charged_times_stand_in_where_no_own_time() -> None:
    trials = [{"mlp": [_run(16, 1e-3, None, {"0": (t, 0.0)})]} for t in (1e-6, 3e-6)]
    r = noise.spread(trials)["rows"][0]
    assert r["passes"] == 1  # a backward of 0 is no pass
    assert r["pass_spread"] == pytest.approx(0.5)
    assert r["iter_s"]["floor"] == 0.0


def test_half_range_is_the_best_single_value_against_all() -> None:
    xs = [3.0, 5.0, 4.0]
    best = 2 * 5.0 * 3.0 / 8.0
    assert max(abs(best / x - 1) for x in xs) == pytest.approx(noise.half_range(xs))


def test_parse_models() -> None:
    assert noise.parse_models(["mlp:64,16", "ctr_dnn:32", "mlp:16"]) == {
        "mlp": (16, 64), "ctr_dnn": (32,)}


@pytest.mark.parametrize("arg, says", [("nope:16", "unknown zoo model 'nope'"),
                                       ("mlp", "MODEL:B1,B2"), ("mlp:0", "MODEL:B1,B2"),
                                       ("mlp:a", "MODEL:B1,B2")])
def test_bad_models_are_one_line(arg: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert noise.main(["--models", arg]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: <command line>: --models:") and says in err
    assert "\n" not in err


def test_against_scores_each_trial_as_the_bench_does() -> None:
    # A profile whose curves price mlp: the trials are the profile's own run, and a copy
    # of it with every time doubled; its error against each is run_errors' against each.
    base = {"batch": 16, "iter_s": 4e-3, "hooked_iter_s": 4e-3, "glue_s": 0.0,
            "layers": {ly.name: [1e-4, 2e-4, 0.0, 0.0] for ly in zoo.get("mlp").layers}}
    double = {**base, "iter_s": 8e-3, "layers": {k: [2e-4, 4e-4, 0.0, 0.0] for k in base["layers"]}}
    ctr = {**base, "batch": 32, "layers": {ly.name: [1e-4, 2e-4, 0.0, 0.0]
                                           for ly in zoo.get("ctr_dnn").layers}}
    raw = {"models": {"mlp": [base], "ctr_dnn": [ctr]}}
    prof = bare_profile(measurement={"raw": raw})
    got = noise.against(prof, [{"mlp": [base]}, {"mlp": [double]}])
    from calibration.calibrate import fit

    fitted, _ = fit(prof, exclude=["mlp"])
    want = [run_errors(fitted, zoo.get("mlp"), r) for r in (base, double)]
    g = got[("mlp", 16)]
    assert g["iter_errs"] == pytest.approx([w["iter_err"] for w in want])
    # every time doubled: pred / (2 m) - 1 = (e + 1) / 2 - 1, per layer and per iteration
    e0, e1 = g["iter_errs"]
    assert e1 == pytest.approx((e0 + 1) / 2 - 1)
    assert want[1]["passes"][0]["err"] == pytest.approx((want[0]["passes"][0]["err"] + 1) / 2 - 1)
    pf, pb = predict_layers(fitted, zoo.get("mlp"), 16)
    assert g["iter_pred_s"] == pytest.approx(sum(pf) + sum(pb))


def test_measures_saves_and_reports_the_same_again(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "t.json"
    assert noise.main(["--models", "mlp:2", "--trials", "2", "--rounds", "1", "--out", str(out),
                       "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    saved = json.loads(out.read_text())
    assert saved["meta"] == {"trials": 2, "rounds": 1, "threads": 1, "models": {"mlp": [2]}}
    assert len(saved["trials"]) == 2 and [r["batch"] for r in saved["trials"][0]["mlp"]] == [2]
    assert [(r["model"], r["batch"], r["trials"], r["passes"]) for r in first["rows"]] == [
        ("mlp", 2, 2, 10)]
    assert noise.main(["--load", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == first["rows"]


def test_load_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    meta = {"trials": 2, "rounds": 1, "threads": 1}
    run = _run(16, 1e-3, None, {"0": (1e-6, 1e-6)})
    for trials, field, says in (
            ([{}], "trials", "needs two trials or more"),
            ([1, 2], "trials[0]", "needs model -> list of runs"),
            ([{"mlp": {}}, {}], "trials[0].mlp", "needs a list of runs"),
            ([{"mlp": [{**run, "batch": "x"}]}, {}], "trials[0].mlp[0]", "needs batch"),
            ([{"mlp": [run]}, {"mlp": [{**run, "iter_s": 0}]}], "trials[1].mlp[0].iter_s",
             "needs a time above 0"),
            ([{"mlp": [run]}, {"mlp": [{**run, "layers": {"0": [-1, 0]}}]}],
             "trials[1].mlp[0].layers.0", "needs [forward s")):
        bad.write_text(json.dumps({"meta": meta, "trials": trials}))
        assert noise.main(["--load", str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {bad}: {field}: {says}") and "\n" not in err
    bad.write_text(json.dumps({"meta": {}, "trials": [{}, {}]}))
    assert noise.main(["--load", str(bad)]) == 2
    assert capsys.readouterr().err.strip().startswith(f"error: {bad}: meta: ")
    # no model and batch in every trial: an error, not a report over no rows
    bad.write_text(json.dumps({"meta": meta, "trials": [{"mlp": [run]}, {"ctr_dnn": [run]}]}))
    assert noise.main(["--load", str(bad)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {bad}: trials: no model and batch size is in every trial")
    assert noise.main(["--load", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {tmp_path / 'none.json'}: --load: cannot be read as JSON") \
        and "\n" not in err
    bad.write_text(json.dumps([1, 2]))
    assert noise.main(["--load", str(bad)]) == 2
    assert capsys.readouterr().err.strip().startswith(f"error: {bad}: --load: not saved trials")


def test_unwritable_out_is_one_line_before_measuring(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert noise.main(["--models", "mlp:2", "--out", str(blocker / "sub" / "t.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {blocker / 'sub'}: --out: cannot write there") and "\n" not in err
