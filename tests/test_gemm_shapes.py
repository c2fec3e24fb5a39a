"""bench/gemm_shapes: the one-rate floor, the groups by row count, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calibration import gemm_shapes as gs
from calibration.profiler import write_profile
from hardware_profiles.errors import ConfigError
from tests.helpers_profiles import bare_profile


def _entry(i: int, o: int, times: dict[int, tuple[float, float]]) -> dict:
    """A saved measurement of Linear(i, o): batch -> (own forward s, own backward s)."""
    model = {"name": "micro", "input_bytes": 4.0 * i,
             "layers": [{"name": "linear", "op": "gemm", "fwd_flops": 2.0 * i * o,
                         "bwd_flops": 4.0 * i * o, "param_bytes": 4.0 * (i * o + o),
                         "activation_bytes": 4.0 * o}]}
    runs = [{"batch": b, "iter_s": 1.0, "layers": {"linear": [9.0, 9.0, 0.0, 0.0]},
             "own": {"linear": [f, k]}} for b, (f, k) in times.items()]
    return {"name": f"linear_{i}x{o}_rows", "model": model, "runs": runs}


def test_one_rate_floor_by_hand() -> None:
    assert gs.one_rate_floor([2.0, 2.0, 2.0]) == (2.0, 0.0)
    # two rates: the median is the mean of |1/v - 1| and |2/v - 1|, 1 / (2 v) on [1, 2]
    v, med = gs.one_rate_floor([1.0, 2.0])
    assert (v, med) == pytest.approx((2.0, 0.25))
    # three: on [1, 2] the middle error is max(1 - 1/v, 2/v - 1), least at v = 1.5; on
    # [2, 4] it is max(1 - 2/v, 4/v - 1), least at v = 3: both 1/3, nothing does better
    v, med = gs.one_rate_floor([4.0, 1.0, 2.0])
    assert med == pytest.approx(1 / 3, abs=1e-3)
    assert v == pytest.approx(1.5, rel=1e-3) or v == pytest.approx(3.0, rel=1e-3)
    with pytest.raises(ValueError):
        gs.one_rate_floor([1.0, 0.0])
    assert gs.half_range([1.0, 3.0]) == pytest.approx(0.5)


def test_rows_and_groups_by_hand() -> None:
    # Linear(16, 16) at 8 rows: 4096 FLOPs forward, 8192 backward; the second shape
    # (16 x 32) does twice the work in the same time: twice the rate
    entries = [_entry(16, 16, {8: (4e-6, 8e-6)}), _entry(16, 32, {8: (4e-6, 8e-6)})]
    rows = gs.shape_rows(entries)
    assert [(r["shape"], r["batch"], r["phase"], r["flops"]) for r in rows] == [
        ("16x16", 8, "fwd", 4096.0), ("16x16", 8, "bwd", 8192.0),
        ("16x32", 8, "fwd", 8192.0), ("16x32", 8, "bwd", 16384.0)]
    # forward bytes: weights and bias (16*16 + 16) * 4 + 8 rows * (16 + 16) * 4
    assert rows[0]["bytes"] == 1088.0 + 1024.0
    assert rows[0]["intensity"] == pytest.approx(4096.0 / 2112.0)
    assert rows[0]["rate"] == pytest.approx(4096.0 / 4e-6)
    assert "pred_s" not in rows[0]
    fwd, bwd = gs.groups(rows)
    assert (fwd["batch"], fwd["phase"], fwd["shapes"]) == (8, "fwd", 2)
    assert fwd["max_over_min"] == pytest.approx(2.0)
    assert fwd["floor"] == pytest.approx(0.25) and fwd["half_range"] == pytest.approx(1 / 3)
    assert bwd["rate_median"] == pytest.approx(1.5 * 8192.0 / 8e-6)
    assert "pred_median" not in fwd


def test_the_cost_model_prices_every_shape() -> None:
    # 1 GFLOP/s and 1 GB/s, no curves: a pass costs its launches plus the larger of
    # FLOPs / 1e9 and bytes / 1e9; 16x16 forward at 8 rows: 4096 FLOPs, 2112 bytes
    prof = bare_profile()
    entries = [_entry(16, 16, {8: (4.096e-6, 1e-5)}), _entry(16, 32, {8: (1e-5, 1e-5)})]
    rows = gs.shape_rows(entries, prof)
    assert rows[0]["pred_s"] == pytest.approx(1e-6 + 4.096e-6)
    g = gs.groups(rows)[0]
    ratios = [r["pred_s"] / r["t_s"] for r in rows if r["phase"] == "fwd"]
    assert g["pred_median"] == pytest.approx(sum(abs(x - 1) for x in ratios) / 2)
    assert g["pred_worst"] == pytest.approx(max(abs(x - 1) for x in ratios))
    assert g["pred_floor"] == pytest.approx(gs.one_rate_floor(ratios)[1])


def test_parse_shapes() -> None:
    assert gs.parse_shapes(["16x32", "8x8", "16x32"]) == ["16x32", "8x8"]
    for bad in ("16x", "axb", "0x5", "4x4x4"):
        with pytest.raises(ConfigError, match="--shapes"):
            gs.parse_shapes([bad])


def test_measures_saves_and_reports_the_same_again(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "s.json"
    assert gs.main(["--shapes", "16x16", "8x32", "--rounds", "1", "--out", str(out), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    saved = json.loads(out.read_text())
    assert saved["meta"] == {"shapes": ["16x16", "8x32"], "rounds": 1, "threads": 1}
    assert [e["name"] for e in saved["entries"]] == ["linear_16x16_rows", "linear_8x32_rows"]
    assert [r["batch"] for r in saved["entries"][0]["runs"]] == [8, 16, 32, 64]
    assert [(g["batch"], g["phase"], g["shapes"]) for g in first["groups"]] == [
        (b, ph, 2) for b in (8, 16, 32, 64) for ph in ("fwd", "bwd")]
    # 8 x 32 at 64 rows, backward: 4 * 8 * 32 * 64 FLOPs
    assert [r["flops"] for r in first["rows"] if (r["shape"], r["batch"], r["phase"])
            == ("8x32", 64, "bwd")] == [65536.0]
    assert gs.main(["--load", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == first


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def err_of(args: list[str]) -> str:
        assert gs.main(args) == 2
        e = capsys.readouterr().err.strip()
        assert "\n" not in e
        return e

    assert err_of(["--shapes", "16x"]).startswith("error: <command line>: --shapes: '16x'")
    assert err_of(["--rounds", "0"]) == "error: <command line>: --rounds: must be at least 1"
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert err_of(["--out", str(blocker / "sub" / "s.json")]).startswith(
        f"error: {blocker / 'sub'}: --out: cannot write there")
    assert err_of(["--load", str(tmp_path / "none.json")]).startswith(
        f"error: {tmp_path / 'none.json'}: --load: cannot be read as JSON")
    # a profile without raw measurements: said before anything is measured
    bare = tmp_path / "m.json"
    write_profile(bare_profile(), bare)
    assert err_of(["--profile", str(bare), "--out", str(blocker / "sub" / "s.json")]) == (
        f"error: {bare}: measurement.raw: no raw layer measurements to fit (a profile of hetsim profile has them)")
    bad = tmp_path / "bad.json"
    meta = {"shapes": ["16x16"], "rounds": 1, "threads": 1}
    good = _entry(16, 16, {8: (1e-6, 2e-6)})
    layer = good["model"]["layers"][0]
    no_gemm = {**good, "model": {**good["model"], "layers": [
        {**layer, "op": "elementwise", "fwd_flops": 0.0, "bwd_flops": 0.0, "param_bytes": 0.0}]}}
    no_flops = {**good, "model": {**good["model"], "layers": [{**layer, "fwd_flops": 0.0}]}}
    bad_model = {**good, "model": {**good["model"], "layers": [{**layer, "op": "nope"}]}}
    for saved, field, says in (
            ({"entries": []}, "", "not saved measurements"),
            ({"meta": {"shapes": ["16x16"], "rounds": 1}, "entries": []}, "meta.threads",
             "missing"),
            ({"meta": {**meta, "shapes": ["abc"]}, "entries": []}, "meta.shapes", "'abc'"),
            ({"meta": {**meta, "shapes": [5]}, "entries": []}, "meta.shapes", "must be a list"),
            ({"meta": meta, "entries": [{"name": "x"}]}, "entries[0]", "needs name"),
            ({"meta": meta, "entries": [{**good, "runs": [{"batch": "8", "layers": {}}]}]},
             "entries[0].runs[0]", "needs batch"),
            ({"meta": meta, "entries": [{**good, "runs": [{"batch": 8, "layers": {},
                                                          "own": "zz"}]}]},
             "entries[0].runs[0]", "needs batch"),
            ({"meta": meta, "entries": [no_gemm]}, "entries[0].model", "has no GEMM"),
            ({"meta": meta, "entries": [no_flops]}, "entries[0].model", "has no GEMM"),
            ({"meta": meta, "entries": [bad_model]}, "entries[0].model", "layers[0].op"),
            ({"meta": meta, "entries": [{**good, "runs": [{"batch": 8, "layers": {}}]}]},
             "entries[0].runs[0].layers.linear", "needs [forward s"),
            ({"meta": meta, "entries": [{**good, "runs": [{"batch": 8, "layers": {},
                                                          "own": {"linear": [-1.0, 1.0]}}]}]},
             "entries[0].runs[0].layers.linear", "needs [forward s")):
        bad.write_text(json.dumps(saved))
        want = f"error: {bad}: {field}: {says}" if field else f"error: {bad}: {says}"
        assert err_of(["--load", str(bad)]).startswith(want)


def test_the_text_report_of_a_saved_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # own times only (no charged ones): the report reads them; shapes come from the entries
    a = _entry(16, 16, {8: (4e-6, 8e-6)})
    b = _entry(16, 32, {8: (4e-6, 8e-6)})
    for e in (a, b):
        for run in e["runs"]:
            run["layers"] = {}
    saved = tmp_path / "s.json"
    saved.write_text(json.dumps({"meta": {"shapes": ["16x16"], "rounds": 2, "threads": 1},
                                 "entries": [a, b]}))
    assert gs.main(["--load", str(saved)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("GEMM shapes at few rows: 2 Linear shapes, 2 round(s), 1 thread(s); rates in "
                      "GFLOP/s (FLOPs / own time)")
    # forward rates 1.024 and 2.048 GFLOP/s: max/min 2, floor 25%, half range 33.3%
    assert out[2].split() == ["8", "fwd", "1.9-2.2", "1.0", "1.5", "2.0", "2.00", "25.0%", "33.3%"]
    # per shape: forward / backward GFLOP/s, weights and bias in MiB
    assert out[-2].split() == ["16x16", "0.00", "1.0/1.0"]
    assert out[-1].split() == ["16x32", "0.00", "2.0/2.0"]
