"""The headline of hetsim validate and of the validation suite (experiments/validate_headline.py),
and --fresh-profile's measure-or-reuse logic (calibration/fresh_profile.py), on hand-made
inputs: every expected figure worked out by hand."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from calibration import fresh_profile as fp
from experiments import cli, validate
from experiments.validate_headline import headline, headline_text, suite_lines
from hardware_profiles import MEASURED_DIR, load_profile_file
from hardware_profiles.errors import ConfigError
from tests.helpers_eval import dense, model, problem, profile
from tests.test_validate import _write

THIS_MACHINE = MEASURED_DIR / "this_machine.json"


def _m(sim: float, real: float) -> dict[str, float]:
    return {"sim": sim, "real": real, "rel_error": (sim - real) / real}


# A run whose mean iteration time is right (+2%) while its parts cancel: worker a's compute
# +100%, b's -20%; communication +10% and +50%.
METRICS = {"iteration_time_mean_s": _m(1.02, 1.0), "throughput_sps": _m(98.0, 100.0),
           "compute_s:a": _m(0.4, 0.2), "compute_s:b": _m(0.4, 0.5),
           "comm_s:a": _m(0.11, 0.1), "comm_s:b": _m(0.3, 0.2)}
# ... with the runtime CPU model of profile this_machine: 0.8 s without it (-20%)
DIAG = {"runtime_cpu": {"models": {"this_machine": {"worker": [1, 0, 1, 0]}}, "scales": {"a": [1.5, 1.0]},
                        "sim_without_model": {"iteration_time_mean_s": 0.8}},
        "profiles": {"this_machine": "measured 2026-11-30 on AMD EPYC"}}


def test_headline_shows_what_the_mean_hides() -> None:
    h = headline(METRICS, DIAG)
    # |errors| 1.0, 0.2 (compute), 0.1, 0.5 (comm): median of all (0.2 + 0.5) / 2
    assert h == {"iteration_time_mean_error": pytest.approx(0.02),
                 "component_median_abs_error": pytest.approx(0.35), "components": 4,
                 "compute_s_median_abs_error": pytest.approx(0.6),
                 "comm_s_median_abs_error": pytest.approx(0.3),
                 "calibrated_models": ["the runtime CPU model of profile this_machine (network.runtime_cpu)"],
                 "drift": None,
                 "profiles": {"this_machine": "measured 2026-11-30 on AMD EPYC"},
                 "iteration_time_mean_error_without_calibrated": pytest.approx(-0.2)}
    assert headline_text(h) == (
        "mean iteration time +2.0%; median |error| over its 4 per-worker compute and communication "
        "metrics 35.0% (compute 60.0%, communication 30.0%); priced with profile this_machine "
        "(measured 2026-11-30 on AMD EPYC); calibrated models of this machine used: the runtime CPU "
        "model of profile this_machine (network.runtime_cpu); without them mean iteration time -20.0%")


def test_headline_without_a_model_or_components() -> None:
    # a run without the runtime CPU model, with one component missing its real side
    metrics = {"iteration_time_mean_s": _m(0.9, 1.0), "compute_s:a": {"sim": 1.0, "real": None, "rel_error": None}}
    h = headline(metrics, {"runtime_cpu": {"models": None, "sim_without_model": {"iteration_time_mean_s": 0.5}}})
    assert h["components"] == 0 and h["component_median_abs_error"] is None
    assert h["calibrated_models"] == [] and h["iteration_time_mean_error_without_calibrated"] is None
    assert headline_text(h) == ("mean iteration time -10.0%; no per-worker compute or communication metric "
                                "measured on both sides; no calibrated model of this machine used "
                                "(no runtime CPU model)")


def test_suite_lines_pool_every_runs_components() -> None:
    # a second run without the model: compute |errors| 0.1, comm 0.7
    other = {"iteration_time_mean_s": _m(1.1, 1.0), "compute_s:c": _m(1.1, 1.0), "comm_s:c": _m(0.17, 0.1)}
    lines = suite_lines([(METRICS, DIAG), (other, {})])
    # all: 1.0, 0.2, 0.1, 0.1, 0.5, 0.7 -> median (0.2 + 0.5) / 2; compute 1.0, 0.2, 0.1 -> 0.2;
    # comm 0.1, 0.5, 0.7 -> 0.5; only the first run used the model: 2% with it, 20% without
    assert lines == [
        "- median |error| over all per-worker compute and communication metrics: 35.0% over 6 "
        "(compute 20.0% over 3, communication 50.0% over 3)",
        "- calibrated models of this machine the DES used: the runtime CPU model of profile this_machine "
        "(network.runtime_cpu); the median |error| of the mean iteration time over the 1 runs that used "
        "them: 2.0% with them, 20.0% without them"]
    assert suite_lines([(other, {})])[1] == ("- calibrated models of this machine the DES used: none "
                                             "(no runtime CPU model)")


def test_validation_json_carries_the_headline() -> None:
    v = validate.Validation("c.yaml", "c", [validate.SchedulerRun("equal", METRICS, DIAG)], None, {})
    data = v.to_json()
    assert data["schedulers"]["equal"]["headline"] == headline(METRICS, DIAG)
    again = validate.Validation.from_json(json.loads(json.dumps(data)))
    assert again.runs[0].metrics == METRICS  # the headline is derived, not read back
    assert f"Headline: {headline_text(headline(METRICS, DIAG))}." in validate.report_md([v])


# ------------------------------------------------------------------ --fresh-profile
def _copy(src: Path, dst: Path) -> None:
    """``src`` as the profile ``dst`` (a profile's name is its file stem)."""
    data = json.loads(src.read_text())
    dst.write_text(json.dumps({**data, "name": dst.stem}))


def _no_measuring(*a: Any, **k: Any) -> Any:
    raise AssertionError("measured although the file exists")


def test_fresh_profile_is_reused_when_the_file_exists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from calibration import profiler

    monkeypatch.setattr(profiler, "run_profile", _no_measuring)
    path = tmp_path / "here.json"
    _copy(THIS_MACHINE, path)  # measured with 1 torch thread
    prof, measured = fp.fresh_profile(path, threads=1)
    assert not measured and prof == load_profile_file(path)
    with pytest.raises(ConfigError) as e:  # other threads than the runtime's: refused, not re-measured
        fp.fresh_profile(path, threads=2)
    assert str(path) in str(e.value) and "measurement.raw.threads" in str(e.value)
    datasheet = tmp_path / "sheet.json"
    _copy(Path(MEASURED_DIR).parent / "cpu-2c.json", datasheet)
    with pytest.raises(ConfigError, match="measurement.raw.device"):
        fp.fresh_profile(datasheet, threads=1)


def test_fresh_profile_measures_once_into_a_new_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from calibration import profiler

    calls = []

    def fake(device: str, out: Path, **kw: Any) -> tuple[Any, Path]:
        calls.append((device, kw))
        _copy(THIS_MACHINE, Path(out))
        return load_profile_file(out), Path(out)

    monkeypatch.setattr(profiler, "run_profile", fake)
    path = tmp_path / "new.json"
    _, measured = fp.fresh_profile(path, threads=1, progress=False)
    assert measured and calls == [("cpu", {"quick": True, "threads": 1, "models": fp.FRESH_MODELS,
                                           "progress": False,
                                           # sampled in 4 rounds across the run, as a full profile is
                                           "spec": replace(profiler.spec_for(True), rounds=4)})]
    _, measured = fp.fresh_profile(path, threads=1)
    assert not measured and len(calls) == 1  # the second config of a suite reuses it
    # named models replace the quick spec's, each at its own batch sizes
    fp.fresh_profile(tmp_path / "other.json", threads=1, progress=False, models={'mlp{"hidden": 64}': (8, 16)})
    assert calls[1][1]["models"] == ['mlp{"hidden": 64}']
    assert calls[1][1]["spec"].models == {'mlp{"hidden": 64}': (8, 16)}
    assert calls[1][1]["spec"].gemm == profiler.spec_for(True).gemm
    assert calls[1][1]["spec"].rounds == 4


def test_with_profile_prices_every_rank_with_this_machine() -> None:
    prob = problem([profile("gpu-a", kind="gpu"), profile("cpu-b", kind="cpu")], [profile("ps", kind="cpu")],
                   model(dense("fc", 1e3)), 20)
    mine = load_profile_file(THIS_MACHINE)
    got = validate.with_profile(prob, mine)
    assert [d.type for d in (*got.cluster.devices, *got.cluster.shards)] == [mine] * 3
    assert [d.id for d in got.cluster.devices] == [d.id for d in prob.cluster.devices]  # the plan's ids kept
    assert validate.profiles_used(got, Path("f.json")) == {
        "this_machine": "measured 2026-11-30 on AMD EPYC, --fresh-profile f.json"}


def test_a_bad_fresh_profile_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    path = _write(tmp_path)
    assert cli.main(["validate", str(path), "--fresh-profile", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hetsim: error: ") and "bad.json: name:" in err[0], err


def test_headline_gives_the_speed_factor_one_or_as_recorded() -> None:
    """A run with one speed factor (x1.062, its probes beside it) says it applied it to
    everything; a run recorded before there was one factor (compute x1.127, copies x1.189)
    gives both as recorded and says what a rescore does with them."""
    probes = [{"compute": 1.0}, {"compute": 1.124}]
    h = headline(METRICS, {**DIAG, "drift": {"compute": 1.062, "probes": probes}})
    assert h["drift"] == {"compute": 1.062}
    assert headline_text(h).endswith("; this machine's speed now against its profile (applied to every "
                                     "process's work and the loopback links): x1.062")
    old = headline(METRICS, {**DIAG, "drift": {"compute": 1.127, "copies": 1.189, "probes": []}})
    assert old["drift"] == {"compute": 1.127, "copies": 1.189}
    assert headline_text(old).endswith("; this machine's speed now against its profile, as recorded: compute "
                                       "x1.127, copies x1.189 (the DES of that run applied both; one rescored "
                                       "now applies the compute one to everything)")
