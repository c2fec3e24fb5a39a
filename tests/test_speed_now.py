"""This machine's speed now against its profile's (calibration/speed_now.py): the drift
factors, measured with the profiler's own harness, and how the emulation applies them."""

from __future__ import annotations

import dataclasses

import pytest

import calibration.profiler as profiler
from calibration import speed_now
from hardware_profiles.schema import Measurement
from sim import des
from sim.cluster import Host, Placement
from sim.emulation import CpuScale, RuntimeEmulation
from tests.helpers_eval import dense, model, plan, problem, profile
from tests.test_hosts import _approx

LABEL = 'mlp{"hidden":[64]}'


def _timed(raw: dict[str, object] | None):  # type: ignore[no-untyped-def]
    cpu = profile("cpu", kind="cpu", peak=1e10, mem_bw=1e10)
    cpu = cpu.model_copy(update={"measurement": Measurement(raw=raw)})
    return problem([cpu, cpu], [profile("ps", kind="cpu")], model(dense("fc", 1e6, 1e8, 2e8)), 16)


def test_compute_factor_is_now_over_then_at_the_profiles_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The profile timed the model at batches 8 and 16 (0.1 and 0.2 s an iteration); timed
    now at 0.12 and 0.26 s: factors 1.2 and 1.3. Shares (8, 16): both, median 1.25; a share
    it did not time (15): the nearest batch it did (16) alone."""
    prob = _timed({"models": {LABEL: [{"batch": 8, "iter_s": 0.1}, {"batch": 16, "iter_s": 0.2}]}})
    now = {8: 0.12, 16: 0.26}
    asked: list[tuple[int, ...]] = []
    specs: list[profiler.ProfileSpec] = []

    def fake(chosen, dev, spec):  # type: ignore[no-untyped-def]
        (label, batches), = chosen.items()
        asked.append(batches)
        specs.append(spec)
        return {label: [{"batch": b, "iter_s": now[b]} for b in batches]}

    monkeypatch.setattr(profiler, "measure_models", fake)
    got = speed_now.compute_factor(prob, LABEL, [8, 16], threads=1)
    assert got is not None and got["factor"] == pytest.approx(1.25) and got["batches"] == [8, 16]
    got = speed_now.compute_factor(prob, LABEL, [15], threads=1)
    assert got is not None and got["factor"] == pytest.approx(1.3) and asked[-1] == (16,)
    # a model the profile did not time, or no raw measurements: no factor, nothing timed
    assert speed_now.compute_factor(prob, "mlp{}", [8], threads=1) is None
    assert speed_now.compute_factor(_timed(None), LABEL, [8], threads=1) is None
    assert len(asked) == 2
    # each probe: about half a second of iterations (at most 100), one round, their median
    assert [(x.target_s, x.max_reps, x.min_reps, x.rounds) for x in specs] == [(0.5, 100, 3, 1)] * 2


def test_with_drift_slows_every_process_and_the_links_by_one_factor() -> None:
    """x1.25: every placed process's CPU scale 1.25 (a worker's compute and copies, the
    shard's work and copies alike), the loopback links 1e9 / 1.25 = 8e8 B/s."""
    prob = _timed({})
    ids = [d.id for d in prob.cluster.devices]
    placement = ((ids[0], Placement(0, 1, (0,))), (ids[1], Placement(0, 1, (1,))), ("ps:0", Placement(0, 1, None)))
    emu = RuntimeEmulation(host=Host("h", 3), placement=placement, wire_Bps=1e9)
    got = speed_now.with_drift(emu, 1.25)
    assert [got.cpu_scale(d) for d in (*ids, "ps:0")] == [CpuScale(1.25, 1.0)] * 3
    assert got.wire_Bps == pytest.approx(8e8)
    # in the DES a worker alone on its core computes 1.25 times as long: fwd 1e8 / 1e10 = 10 ms
    with_host = dataclasses.replace(prob, cluster=dataclasses.replace(prob.cluster, hosts=(Host("h", 3),),
                                                                      placement=placement))
    r = des.simulate(with_host, plan(with_host, [8, 8]), emulation=got)
    fwd = next(e for e in r.trace if e.get("ph") == "X" and e["pid"] == 0 and e["name"] == "fwd")
    assert fwd["dur"] * 1e-6 == _approx(1.25 * 8 * 1e8 / 1e10)


def test_around_takes_the_median_over_the_probes() -> None:
    """Probes before runs 0, 1, 2 and after run 2 (1.4, 1.1, 1.2, 1.0): the median,
    (1.1 + 1.2) / 2 = 1.15; the first probe's passing x1.4 moves it little. Of one
    repeat's two probes, their mean; a missing probe gives no factor."""
    probes = [{"compute": c} for c in (1.4, 1.1, 1.2, 1.0)]
    got = speed_now.around(probes)
    assert got is not None and got["compute"] == pytest.approx(1.15) and got["probes"] == probes
    two = speed_now.around(probes[:2])
    assert two is not None and two["compute"] == pytest.approx(1.25)
    assert speed_now.around([probes[0], None]) is None
    assert speed_now.around([]) is None
