"""Lookups: the cost per row looked up (the ``row_cost`` correction), its fit, the
committed profile's small-table embedding benchmarks, and adding single-layer benchmarks
to a measured profile (``hetsim profile --add-micro``)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from calibration import profiler as P
from calibration.calibrate import (
    COLD_WINDOWS,
    _bandwidth_fit,
    _point_time,
    _rel_errors,
    drift_of,
    fit,
    points_from_raw,
)
from experiments.cli import main
from hardware_profiles import load_profile_file
from hardware_profiles.errors import ConfigError
from hardware_profiles.schema import BandwidthCurve, Measurement
from sim.corrections import PassContext, RowCost, corrections_of
from sim.costmodel import layer_time_s, looked_up_rows
from sim.workload import Layer, Sparse
from tests.helpers_profiles import bare_profile

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]
THIS_MACHINE = ROOT / "hardware_profiles" / "measured" / "this_machine.json"


# ------------------------------------------------------------ pricing
def test_row_cost_lookup_and_pricing() -> None:
    # 1 GB/s, 1 us launches; a table of 1e4 bytes, 2 rows of 64 B a sample, batch 10,
    # 16 input bytes a sample: 20 rows looked up, 1280 bytes of them touched
    emb = Layer("emb", "embedding", 0.0, 0.0, 1e4, 64.0, Sparse(2.0, 64.0))
    assert looked_up_rows(emb, 10) == 20.0
    assert looked_up_rows(Layer("relu", "elementwise", 0.0, 0.0, 0.0, 64.0), 10) == 0.0
    dev = bare_profile(corrections={"row_cost": {"fwd": {"embedding/k1p": 1e-7}, "bwd": {"embedding": 3e-7}}})
    # forward: 1 launch + 20 rows x 1e-7 (the kind's entry) + (1280 + 10 * (16 + 64)) B / 1e9
    assert layer_time_s(emb, "fwd", 10, dev, "fp32", 16.0) == pytest.approx(1e-6 + 2e-6 + 2.08e-6)
    # backward: 2 launches + 20 x 3e-7 (the op class's entry) + (2 * 1280 + 10 * (16 + 128)) B / 1e9
    assert layer_time_s(emb, "bwd", 10, dev, "fp32", 16.0) == pytest.approx(2e-6 + 6e-6 + 4e-6)
    (rc,) = corrections_of(dev)
    assert isinstance(rc, RowCost)
    k2pr = PassContext("embedding", "fwd", 0.0, 2, 0.0, rows=1.0, layer_kernels=2, has_params=True,
                       reduces=True)
    assert rc.extra_s(k2pr) == 0.0  # k2pr: no entry, no op class's
    assert corrections_of(bare_profile()) == ()  # no row cost at all
    with pytest.raises(ValueError, match="unknown key"):
        bare_profile(corrections={"row_cost": {"fwd": {"lookup": 1e-7}}})
    with pytest.raises(ValueError):
        bare_profile(corrections={"row_cost": {"bwd": {"embedding": -1e-9}}})


def test_bandwidth_fit_finds_the_per_row_cost() -> None:
    # t = 5e-8 s per row looked up + bytes / 1e9 (eff 1), three sources whose rows and
    # bytes vary apart. The smallest time per row is 0.0928 ms / 512 rows (b's first
    # pass); the row-cost candidates are 0, 5e-8 and 0.9 of it. Only 5e-8 with no call
    # overhead leaves a flat efficiency, which every left-out source then follows
    # exactly: that pair is chosen, with a flat curve at 1.
    passes = {"a": [(64, 1e5), (1024, 1e5), (64, 4e6)], "b": [(512, 3e4), (2048, 2e6)],
              "c": [(128, 5e5), (4096, 5e5)]}
    rows = np.array([n for v in passes.values() for n, _ in v], dtype=float)
    nb = np.array([x for v in passes.values() for _, x in v])
    src = np.array([k for k, v in passes.items() for _ in v])
    busy = 5e-8 * rows + nb / 1e9
    base = float(np.min(busy / rows))
    assert base == pytest.approx(5e-8 + 3e4 / 1e9 / 512)
    c, r, curve = _bandwidth_fit(nb, busy, src, 1e9, fractions=(0.0, 0.5), rows=rows,
                                 row_fractions=(0.0, 5e-8 / base, 0.9))
    assert (c, r) == (0.0, pytest.approx(5e-8, rel=1e-12))
    assert curve is not None and curve.eff == pytest.approx([1.0] * len(curve.eff), rel=1e-6)


# ------------------------------------------------ the committed profile
def test_this_machine_prices_its_small_tables_near_their_measurements() -> None:
    # The backward of the nn.Embedding benchmarks of tables up to 2 MB (measured by
    # --add-micro): the curves price each pass's own time within 50% (the committed fit:
    # -10% to +33%; before those benchmarks the backward's fitted call overhead alone,
    # 167 us, was 1.9-12x their 13.7-86 us), and the backward's bandwidth curves stay below
    # 1.5x the DRAM copy rate (above 1 only where a table and its gradient stay in cache).
    dev = load_profile_file(THIS_MACHINE)
    raw = dev.measurement.raw or {}
    small = {e["name"] for e in raw["micro"] if e["name"].startswith("emb_")
             and e["model"]["layers"][0]["param_bytes"] <= 2.1e6}
    assert len(small) == 7
    pts = [p for p in points_from_raw(raw, dense_sparse_grad=dev.corrections.dense_sparse_grad is not None,
                                      weight_grad_only=dev.corrections.weight_grad_only_bwd is not None)
           if p.model.removeprefix("micro:") in small and p.phase == "bwd"]
    assert len(pts) == 2 * len(small)  # two batch sizes each
    errs = {(p.model, p.batch): _point_time(dev, p) / p.t_s - 1 for p in pts}
    assert max(abs(e) for e in errs.values()) < 0.5, errs
    for key in ("embedding", "embedding/k1p"):
        curve = (dev.mem_efficiency_bwd or {})[key]
        assert isinstance(curve, BandwidthCurve) and max(curve.eff) < 1.5


# ------------------------------------------------ adding benchmarks
@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A measured profile of one single-layer benchmark and a small mlp (1 thread)."""
    spec = replace(P.spec_for(True), gemm=((32, 32, 32),), copy_elems=(1000,),
                   micro=("relu_1m",), models={"mlp": (4, 8)}, min_reps=2, max_reps=2)
    _, path = P.run_profile("cpu", tmp_path_factory.mktemp("prof") / "tiny.json", threads=1,
                            network=False, progress=False, spec=spec)
    return path


def test_add_micro_measures_merges_notes_and_refits(tiny_profile: Path, tmp_path: Path) -> None:
    path = tmp_path / "tiny.json"
    path.write_bytes(tiny_profile.read_bytes())
    before = load_profile_file(path)
    assert before.corrections.row_cost is None and "embedding" not in (before.mem_efficiency_bwd or {})
    prof, new = P.add_micro(path, ["emb_500x16"], progress=False)
    assert [e["name"] for e in new] == ["emb_500x16"]
    loaded = load_profile_file(path)
    raw = loaded.measurement.raw or {}
    assert [e["name"] for e in raw["micro"]] == ["relu_1m", "emb_500x16"]
    entry = raw["micro"][1]
    assert [r["batch"] for r in entry["runs"]] == [64, 1024]
    assert all(r["own"]["embedding"][0] > 0 and r["own"]["embedding"][1] > 0 for r in entry["runs"])
    assert entry["model"]["layers"][0]["param_bytes"] == 500 * 16 * 4
    note = raw["micro_note"].splitlines()
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d"  # start and end, each with its date (UTC)
    assert len(note) == 1 and re.match(rf"emb_500x16: measured {stamp} - {stamp} UTC by ", note[0])
    assert "1 thread(s), clock thread" in note[0] and "replacing" not in note[0]
    assert loaded.source.note.endswith("see raw.micro_note.")
    # the rest of raw is as it was; the fit now has the embedding's curves
    assert raw["models"] == (before.measurement.raw or {})["models"] and raw["micro"][0] == (before.measurement.raw or {})["micro"][0]
    assert "embedding" in (loaded.mem_efficiency_bwd or {})
    assert loaded.layers == before.layers and loaded.peak_flops == before.peak_flops
    # measured again (named twice: once): replaced in place, a second note line, one
    # pointer in source.note
    _, new = P.add_micro(path, ["emb_500x16", "emb_500x16"], progress=False)
    assert [e["name"] for e in new] == ["emb_500x16"]
    again = load_profile_file(path)
    assert [e["name"] for e in (again.measurement.raw or {})["micro"]] == ["relu_1m", "emb_500x16"]
    lines = (again.measurement.raw or {})["micro_note"].splitlines()
    assert len(lines) == 2 and lines[1].endswith("replacing the earlier emb_500x16; the curves re-fitted.")
    assert again.source.note.count("raw.micro_note") == 1


def test_add_micro_missing_measures_what_the_profile_lacks(tiny_profile: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny.json"
    path.write_bytes(tiny_profile.read_bytes())
    monkeypatch.setattr(P, "_ALL_MICRO", ("relu_1m", "emb_3000x8"))  # a grid of two
    _, new = P.add_micro(path, ["missing"], progress=False)
    assert [e["name"] for e in new] == ["emb_3000x8"]
    assert (load_profile_file(path).measurement.raw or {})["micro_note"].startswith("emb_3000x8: measured 20")
    written = path.read_bytes()
    prof, new = P.add_micro(path, ["missing"], progress=False)  # nothing left: nothing written
    assert new == [] and path.read_bytes() == written
    assert [e["name"] for e in (prof.measurement.raw or {})["micro"]] == ["relu_1m", "emb_3000x8"]
    capsys.readouterr()
    assert main(["profile", "--add-micro", "missing", "--out", str(path), "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == f"nothing to measure; {path} unchanged"
    assert path.read_bytes() == written


def test_add_micro_refuses_what_would_not_match(tiny_profile: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="not a single-layer benchmark of the grid"):
        P.add_micro(tiny_profile, ["emb_2x2"], progress=False)
    with pytest.raises(ConfigError, match="--threads: 2 differs from the profile's 1"):
        P.add_micro(tiny_profile, ["emb_500x16"], threads=2, progress=False)
    bare = tmp_path / "m.json"
    P.write_profile(bare_profile(), bare)
    with pytest.raises(ConfigError, match="no single-layer benchmarks"):
        P.add_micro(bare, ["emb_500x16"], progress=False)
    real = P.describe_device
    monkeypatch.setattr(P, "describe_device", lambda dev: {**real(dev), "host": "elsewhere"})
    with pytest.raises(ConfigError, match="raw.host: measured with .* here 'elsewhere'"):
        P.add_micro(tiny_profile, ["emb_500x16"], progress=False)
    monkeypatch.undo()
    assert main(["profile", "--add-micro", "emb_500x16", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--add-micro" in err[0] and "needs --out" in err[0]
    # flags of a whole profile run are refused, not ignored; so is an empty list
    for extra, why in ((["--quick"], "does not combine with --quick"),
                       (["--models", "mlp"], "does not combine with --models"),
                       (["--suite", "robotics"], "does not combine with --suite robotics")):
        assert main(["profile", "--add-micro", "emb_500x16", "--out", str(tiny_profile), *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--add-micro" in err[0] and why in err[0]
    assert main(["profile", "--add-micro", ",", "--out", str(tiny_profile)]) == 2
    assert "names no benchmark" in capsys.readouterr().err
    assert "micro_note" not in (load_profile_file(tiny_profile).measurement.raw or {})  # nothing written


def test_calibrate_prints_the_drift_probe_figures(tiny_profile: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny.json"
    path.write_bytes(tiny_profile.read_bytes())
    spread = load_profile_file(path).measurement.spread or {}
    # eight steps, a sample after each: gemm, bandwidth, dispatch, relu_1m, mlp at 4 and 8,
    # quantization, cold calls
    assert spread["drift_samples"] == 8
    assert main(["calibrate", str(path)]) == 0
    out = capsys.readouterr().out
    assert P.drift_line(drift_of(load_profile_file(path).measurement.raw or {}) or {}) in out
    assert "after each of 8 steps" in out


def test_add_micro_measures_in_the_profiles_rounds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = replace(P.spec_for(True), gemm=((32, 32, 32),), copy_elems=(1000,),
                   micro=("relu_1m",), models={"mlp": (4,)}, min_reps=2, max_reps=2)
    _, path = P.run_profile("cpu", tmp_path / "r2.json", threads=1, network=False,
                            progress=False, spec=spec, rounds=2)
    assert (load_profile_file(path).measurement.raw or {})["rounds"] == 2
    seen = []
    real = P.measure_micro

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(kwargs.get("rounds"))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(P, "measure_micro", spy)
    P.add_micro(path, ["emb_500x16"], progress=False)
    assert seen == [2]
    note = (load_profile_file(path).measurement.raw or {})["micro_note"]
    assert "spec's repeats in 2 round(s)) and merged" in note


# ------------------------------------------------ cold calls
def test_profile_measures_cold_calls_and_the_fit_chooses_a_window(tiny_profile: Path) -> None:
    prof = load_profile_file(tiny_profile)
    cold = (prof.measurement.raw or {})["cold"]
    assert cold["moved_bytes"] == [int(m * 2**20) for m in P.COLD_MOVED_MIB]
    assert set(cold["cold_s"]) == set(cold["warm_s"]) == {"relu", "linear", "embedding"}
    assert all(len(v) == len(P.COLD_MOVED_MIB) and min(v) > 0 for v in cold["cold_s"].values())
    # the fit keeps a cold window only where it prices the measured passes better (the
    # median |error| over them, cold seconds included) than no cold term at all
    fitted, f = fit(prof)
    no_cold = prof.model_copy(update={"measurement": Measurement(
        raw={k: v for k, v in (prof.measurement.raw or {}).items() if k != "cold"})})
    plain, g = fit(no_cold)
    assert plain.corrections.cold_calls is None
    assert [p.t_s for p in f.points] == [p.t_s for p in g.points]  # the times as measured
    err = float(np.median(np.abs(_rel_errors(fitted, f.points))))
    err_plain = float(np.median(np.abs(_rel_errors(plain, g.points))))
    cold_fit = fitted.corrections.cold_calls
    if cold_fit is None:
        assert err == err_plain
        assert fitted.model_dump(exclude={"measurement"}) == plain.model_dump(exclude={"measurement"})
    else:
        assert cold_fit.window in COLD_WINDOWS and err < err_plain
        assert set(cold_fit.curves) == {"elementwise", "gemm", "conv", "attention", "embedding"}
    # the profile as written was fitted the same way
    assert prof.corrections.cold_calls == cold_fit


def test_add_micro_cold_measures_the_benchmark_into_raw_cold(tiny_profile: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(P, "_ALL_MICRO", ("relu_1m",))  # a grid of the one the profile has
    path = tmp_path / "tiny.json"
    data = json.loads(tiny_profile.read_text())
    del data["measurement"]["raw"]["cold"]
    path.write_text(json.dumps(data))
    prof, new = P.add_micro(path, ["missing"], progress=False)  # 'missing' includes it on a CPU
    assert [e["name"] for e in new] == ["cold"]
    raw = load_profile_file(path).measurement.raw or {}
    assert raw["cold"]["moved_bytes"] == [int(m * 2**20) for m in P.COLD_MOVED_MIB]
    assert raw["micro_note"].splitlines()[-1].startswith("cold: measured 20")
    assert "into this profile's raw.micro (cold: raw.cold, 15 cases a size in one pass)" in raw["micro_note"]
    assert [e["name"] for e in raw["micro"]] == [e["name"] for e in data["measurement"]["raw"]["micro"]]
    assert prof.corrections.cold_calls is None or prof.corrections.cold_calls.window in COLD_WINDOWS
    capsys.readouterr()
    assert main(["profile", "--add-micro", "cold", "--out", str(path), "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines() == ["measured cold; re-fitted", f"wrote {path}"]
    # a GPU profile's passes do not flush the host's caches: refused
    data["measurement"]["raw"]["device"] = "cuda:0"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="'cold' is a CPU benchmark"):
        P.add_micro(path, ["cold"], progress=False)


def test_add_micro_measures_an_extra_benchmark_only_when_asked(tiny_profile: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tiny.json"
    path.write_bytes(tiny_profile.read_bytes())
    have = tuple(e["name"] for e in (load_profile_file(path).measurement.raw or {})["micro"])
    monkeypatch.setattr(P, "_ALL_MICRO", have)  # the grid: what the profile has
    # not in the grid, so 'missing' leaves it out (the profile has raw.cold too)
    assert P.add_micro(path, ["missing"], progress=False)[1] == []
    _, new = P.add_micro(path, ["linear_256x256_b16"], progress=False)
    assert [e["name"] for e in new] == ["linear_256x256_b16"]
    assert [r["batch"] for r in new[0]["runs"]] == [16, 32]
    raw = load_profile_file(path).measurement.raw or {}
    assert [e["name"] for e in raw["micro"]] == [*have, "linear_256x256_b16"]
