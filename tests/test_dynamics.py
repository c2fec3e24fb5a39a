"""Worker status traces: explicit events and the three patterns, expanded into
Dynamic events (sim.dynamics), merged by build_problem, run by the DES.

Each pattern is checked on a case worked out by hand; the random walk on its
invariants (count, bounds, first value) and on seeding (same seed, same events;
another entry or walk does not move its draws).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from experiments import runner
from hardware_profiles.errors import ConfigError
from sim.config import Config, config_from_dict
from sim.dynamics import DYNAMICS_STREAM, MAX_EVENTS, Dynamic, seed_sequence, status_trace
from sim.problem import Problem, build_problem
from tests.test_cli import assert_one_line_error, cli, write_config

# three workers: t4:0, cpu-8c:0, cpu-8c:1
BASE: dict[str, Any] = {
    "name": "dyn",
    "cluster": {
        "devices": [{"type": "t4", "count": 1}, {"type": "cpu-8c", "count": 2}],
        "network": {"bandwidth_gbps": 10},
    },
    "job": {"model": "mlp", "global_batch": 64, "iterations": 20},
}

WALK: dict[str, Any] = {
    "pattern": "random_walk", "workers": "all", "every_s": 0.5, "until_s": 5,
    "slowdown": {"start": 1.0, "sigma": 0.3, "min": 1.0, "max": 4.0},
    "free_memory": {"start": 1.0, "sigma": 0.2, "min": 0.2, "max": 1.0},
}


def problem(dynamics: list[dict[str, Any]], seed: int = 0) -> Problem:
    cfg = config_from_dict({**BASE, "seed": seed, "dynamics": dynamics}, "c.yaml")
    return build_problem(cfg, Path("."), "c.yaml")


def D(worker: int, at_s: float, slowdown: float | None = None, free: float | None = None) -> Dynamic:
    return Dynamic(worker, at_s, slowdown=slowdown, free_memory_frac=free)


# ------------------------------------------------------------------------ explicit events
def test_explicit_free_memory_alone_and_with_slowdown() -> None:
    p = problem([
        {"worker": 2, "at_s": 1.0, "free_memory": 0.5},
        {"worker": 1, "at_s": 1.0, "slowdown": 2.0, "free_memory": 0.25},
        {"worker": 0, "at_s": 0.5, "fail": True},
    ])
    assert p.dynamics == (
        Dynamic(0, 0.5, fail=True),
        D(1, 1.0, 2.0, 0.25),
        D(2, 1.0, None, 0.5),
    )


# --------------------------------------------------------------------------------- steps
def test_steps_exact_events_merged_with_explicit_entries() -> None:
    p = problem([
        {"worker": 2, "at_s": 1.5, "slowdown": 9.0},  # before the pattern in the file
        {"pattern": "steps", "workers": [0, 2], "times_s": [0, 1.5, 4], "slowdown": [2, 1, 3]},
        {"worker": 2, "at_s": 1.5, "free_memory": 0.5},  # after it
    ])
    assert p.dynamics == (
        D(0, 0.0, 2.0), D(2, 0.0, 2.0),
        D(0, 1.5, 1.0), D(2, 1.5, 9.0), D(2, 1.5, 1.0), D(2, 1.5, None, 0.5),
        D(0, 4.0, 3.0), D(2, 4.0, 3.0),
    )


def test_steps_free_memory_on_all_workers() -> None:
    p = problem([{"pattern": "steps", "workers": "all", "times_s": [1, 2], "free_memory": [0.5, 1.0]}])
    assert p.dynamics == (
        D(0, 1.0, None, 0.5), D(1, 1.0, None, 0.5), D(2, 1.0, None, 0.5),
        D(0, 2.0, None, 1.0), D(1, 2.0, None, 1.0), D(2, 2.0, None, 1.0),
    )


# ------------------------------------------------------------------------------ periodic
PERIODIC: dict[str, Any] = {"pattern": "periodic", "workers": [1], "period_s": 4, "duty": 0.25,
                            "phase_s": 1, "until_s": 8, "slowdown": 2.0, "free_memory": 0.25}


def test_periodic_two_periods_exact() -> None:
    # windows [1, 2) and [5, 6); the third would start at 9 >= until_s
    assert problem([PERIODIC]).dynamics == (
        D(1, 1.0, 2.0, 0.25), D(1, 2.0, 1.0, 1.0), D(1, 5.0, 2.0, 0.25), D(1, 6.0, 1.0, 1.0),
    )


def test_periodic_window_open_at_until_is_closed_there_and_unset_fields_stay_none() -> None:
    entry = {**PERIODIC, "until_s": 9.5, "free_memory": None}
    assert problem([entry]).dynamics == (
        D(1, 1.0, 2.0), D(1, 2.0, 1.0), D(1, 5.0, 2.0), D(1, 6.0, 1.0), D(1, 9.0, 2.0), D(1, 9.5, 1.0),
    )


def test_periodic_random_phase_is_per_worker_seeded_and_keeps_the_duty() -> None:
    entry = {**PERIODIC, "workers": "all", "phase_s": 0.5, "random_phase": True, "until_s": 100}
    a, b, c = problem([entry], seed=1), problem([entry], seed=1), problem([entry], seed=2)
    assert a.dynamics == b.dynamics and a.dynamics != c.dynamics
    firsts = []
    for w in range(3):
        ev = [d for d in a.dynamics if d.worker == w]
        phase = ev[0].at_s
        assert 0.5 <= phase < 4.5
        assert [d.at_s for d in ev] == [phase + k * 4 + o for k in range(len(ev) // 2) for o in (0.0, 1.0)]
        firsts.append(phase)
    assert len(set(firsts)) == 3
    # the documented stream: U[0, period_s) from SeedSequence(seed, spawn_key=(DYNAMICS_STREAM, 0, w))
    rng = np.random.default_rng(np.random.SeedSequence(1, spawn_key=(DYNAMICS_STREAM, 0, 2)))
    assert firsts[2] == 0.5 + rng.uniform(0.0, 4.0)


def test_status_trace_of_periodic() -> None:
    t, s, f = status_trace(problem([PERIODIC]).dynamics, 1, until_s=10)
    assert t.tolist() == [0.0, 1.0, 2.0, 5.0, 6.0, 10.0]
    assert s.tolist() == [1.0, 2.0, 1.0, 2.0, 1.0, 1.0]
    assert f.tolist() == [1.0, 0.25, 1.0, 0.25, 1.0, 1.0]
    # another worker has no events: flat 1.0; an event at 0 replaces the start point
    assert [x.tolist() for x in status_trace(problem([PERIODIC]).dynamics, 0, 3)] == [[0.0, 3.0], [1.0, 1.0], [1.0, 1.0]]
    t, s, f = status_trace((D(0, 0.0, 3.0), D(0, 0.0, None, 0.5), D(0, 7.0, 1.0)), 0, 5)
    assert (t.tolist(), s.tolist(), f.tolist()) == ([0.0, 5.0], [3.0, 3.0], [0.5, 0.5])


# --------------------------------------------------------------------------- random walk
def test_random_walk_count_bounds_and_seeding() -> None:
    a, b, c = problem([WALK], seed=5), problem([WALK], seed=5), problem([WALK], seed=6)
    assert a.dynamics == b.dynamics
    assert a.dynamics != c.dynamics
    for w in range(3):
        ev = [d for d in a.dynamics if d.worker == w]
        assert [d.at_s for d in ev] == [k * 0.5 for k in range(10)]  # until_s / every_s = 10
        assert ev[0].slowdown == 1.0 and ev[0].free_memory_frac == 1.0
        sl = [d.slowdown for d in ev]
        fm = [d.free_memory_frac for d in ev]
        assert all(isinstance(x, float) and 1.0 <= x <= 4.0 for x in sl)
        assert all(isinstance(x, float) and 0.2 <= x <= 1.0 for x in fm)
        assert len(set(sl)) > 1 and len(set(fm)) > 1  # it moves
    assert [d.slowdown for d in a.dynamics if d.worker == 0] != [d.slowdown for d in a.dynamics if d.worker == 1]


def test_random_walk_draws_do_not_depend_on_other_entries_or_walks() -> None:
    alone = problem([WALK], seed=5).dynamics
    other = {**WALK, "workers": [1], "slowdown": {"start": 5.0, "sigma": 0.3, "min": 5.0, "max": 6.0}}
    with_more = problem([WALK, other, {"worker": 0, "at_s": 0.25, "slowdown": 7.0}], seed=5).dynamics
    assert sum(1 for d in with_more if d.slowdown is not None and d.slowdown >= 5.0) == 11
    assert tuple(d for d in with_more if d.slowdown is not None and d.slowdown <= 4.0) == alone
    no_mem = problem([{**WALK, "free_memory": None}], seed=5).dynamics
    assert [d.slowdown for d in no_mem] == [d.slowdown for d in alone]
    assert all(d.free_memory_frac is None for d in no_mem)


def test_random_walk_clamps_and_steps_at_non_integer_ratio() -> None:
    entry = {**WALK, "workers": [0], "every_s": 0.3, "until_s": 1.0,
             "slowdown": {"start": 2.0, "sigma": 50.0, "min": 1.5, "max": 3.0}, "free_memory": None}
    ev = problem([entry]).dynamics
    assert [d.at_s for d in ev] == [0.0, 0.3, 0.6, 0.3 * 3]  # ceil(1.0 / 0.3) = 4
    assert ev[0].slowdown == 2.0 and all(d.slowdown in (1.5, 3.0) for d in ev[1:])  # sigma 50: always clamped


def test_seed_sequence_is_the_documented_spawn_tree() -> None:
    ns = np.random.SeedSequence(7, spawn_key=(DYNAMICS_STREAM,))
    want = ns.spawn(3)[2].spawn(2)[1]
    assert seed_sequence(7, 2, 1).generate_state(4).tolist() == want.generate_state(4).tolist()


# -------------------------------------------------------------------------------- errors
ERRORS: dict[str, tuple[list[dict[str, Any]], str, str]] = {
    "unequal list lengths": (
        [{"worker": 0, "at_s": 0, "slowdown": 2},
         {"pattern": "steps", "workers": [0], "times_s": [0, 1, 2], "slowdown": [1, 2, 3], "free_memory": [0.5, 1]}],
        "dynamics[1].free_memory", "2 values but times_s has 3"),
    "times not increasing": (
        [{"pattern": "steps", "workers": [0], "times_s": [1, 1], "slowdown": [1, 2]}],
        "dynamics[0].times_s", "strictly increasing"),
    "duty 1": ([{**PERIODIC, "duty": 1.0}], "dynamics[0].duty", "less than 1"),
    "duty 0": ([{**PERIODIC, "duty": 0}], "dynamics[0].duty", "greater than 0"),
    "period 0": ([{**PERIODIC, "period_s": 0}], "dynamics[0].period_s", "greater than 0"),
    "unknown field": ([{**PERIODIC, "colour": "red"}], "dynamics[0].colour", "unknown field"),
    "unknown field in a walk": (
        [{**WALK, "slowdown": {**WALK["slowdown"], "mu": 0}}], "dynamics[0].slowdown.mu", "unknown field"),
    "unknown pattern": ([{"pattern": "sawtooth", "workers": "all"}], "dynamics[0].pattern", "must be one of"),
    "unknown worker in a pattern": ([{**PERIODIC, "workers": [0, 3]}], "dynamics[0].workers[1]", "worker 3 does not exist"),
    "unknown worker in an event": ([{"worker": 3, "at_s": 1, "free_memory": 0.5}], "dynamics[0].worker", "worker 3 does not exist"),
    "workers not a list": ([{**PERIODIC, "workers": "some"}], "dynamics[0].workers", "or 'all'"),
    "min > max": (
        [{**WALK, "slowdown": {"start": 2, "sigma": 0.1, "min": 3, "max": 1}}], "dynamics[0].slowdown.max", "below min"),
    "start outside": (
        [{**WALK, "free_memory": {"start": 0.1, "sigma": 0.1, "min": 0.2, "max": 1}}],
        "dynamics[0].free_memory.start", "outside"),
    "free memory walk above 1": (
        [{**WALK, "free_memory": {"start": 1, "sigma": 0.1, "min": 0.2, "max": 2}}], "dynamics[0].free_memory", "above 1"),
    "free memory above 1": ([{"worker": 0, "at_s": 1, "free_memory": 1.5}], "dynamics[0].free_memory", "less than or equal to 1"),
    "fail with free memory": ([{"worker": 0, "at_s": 1, "fail": True, "free_memory": 0.5}], "dynamics[0]", "fail: true alone"),
    "pattern without values": ([{**PERIODIC, "slowdown": None, "free_memory": None}], "dynamics[0]", "slowdown and/or free_memory"),
    "too many events": (
        # 100,000 events, then 3 x 301,000: the second entry crosses the cap
        [{**WALK, "workers": [0], "every_s": 1e-3, "until_s": 100, "free_memory": None},
         {**WALK, "every_s": 1e-3, "until_s": 301}], "dynamics[1]",
        f"more than {MAX_EVENTS:,} events (1,003,000 up to this entry)"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_errors_name_the_field(case: str) -> None:
    dynamics, field, text = ERRORS[case]
    with pytest.raises(ConfigError) as e:
        problem(dynamics)
    assert e.value.field == field, e.value.line()
    assert text in e.value.message and "\n" not in e.value.line()


def test_cli_pattern_error_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = write_config(tmp_path / "c.yaml", {**BASE, "dynamics": [{**PERIODIC, "duty": 1.5}]})
    rc, _, err = cli(capsys, "simulate", str(cfg), "--out", str(tmp_path / "o"))
    assert_one_line_error(rc, err, cfg, "dynamics[0].duty")


# ------------------------------------------------------------------------------- the DES
def _run(data: dict[str, Any], out: Path) -> dict[str, Any]:
    runner.run_one(runner.from_dict(data, Path("."), "c.yaml"), "des", out=out, trace=False)
    return json.loads((out / "summary.json").read_text())


def test_des_with_periodic_slowdown_is_reproducible_and_slower(tmp_path: Path) -> None:
    # compute-bound (resnet18 on a fast network), so a compute slowdown shows
    quiet = {**BASE, "cluster": {**BASE["cluster"], "network": {"bandwidth_gbps": 100}},
             "job": {**BASE["job"], "model": "resnet18", "iterations": 6}}
    contended = {**quiet, "seed": 4, "dynamics": [
        {"pattern": "periodic", "workers": "all", "period_s": 0.1, "duty": 0.5, "until_s": 100,
         "slowdown": 3.0, "random_phase": True}]}
    a, b = _run(contended, tmp_path / "a"), _run(contended, tmp_path / "b")
    for name in ("summary.json", "iterations.csv", "config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert a == b
    base = _run(quiet, tmp_path / "base")
    # half the wall time at 1/3 speed: compute runs at 2/3 of full speed on average,
    # so compute takes 1.5x; communication is unchanged
    assert 1.3 * base["elapsed_s"] < a["elapsed_s"] < 1.6 * base["elapsed_s"]
    # the resolved config.json reads back as the same config
    resolved = json.loads((tmp_path / "a" / "config.json").read_text())
    assert Config.model_validate(resolved) == Config.model_validate(contended)


@pytest.mark.parametrize("pattern", ["steps", "random_walk", "periodic"])
def test_simulate_with_each_pattern(pattern: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    entry = {
        "steps": {"pattern": "steps", "workers": [1, 2], "times_s": [0, 0.05], "slowdown": [2, 1],
                  "free_memory": [0.5, 1]},
        "random_walk": {**WALK, "every_s": 0.01, "until_s": 1},
        "periodic": {**PERIODIC, "workers": "all", "period_s": 0.04, "phase_s": 0.01, "until_s": 1},
    }[pattern]
    cfg = write_config(tmp_path / "c.yaml", {**BASE, "seed": 2, "dynamics": [entry]})
    rc, out, err = cli(capsys, "simulate", str(cfg), "--evaluator", "des", "--out", str(tmp_path / "o"))
    assert rc == 0, err
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["iterations"] == 20


def test_readme_dynamics_example_is_valid() -> None:
    """The documented `dynamics:` block (docs/reference/files.md) validates and expands (on three workers)."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "files.md").read_text()
    block = text.split("```yaml\ndynamics:\n", 1)[1].split("```", 1)[0]
    dynamics = yaml.safe_load("dynamics:\n" + block)["dynamics"]
    assert [e.get("pattern", "event") for e in dynamics] == ["event"] * 3 + ["steps", "random_walk", "periodic"]
    p = problem(dynamics)
    # 3 events + 2 x 3 steps + 3 x 60 walk steps + 2 x 60 windows
    assert len(p.dynamics) == 3 + 6 + 180 + 120
