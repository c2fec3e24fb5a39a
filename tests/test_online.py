"""Online schedulers (lbbsp, hps) and the rebalance seam, on cases worked out by hand.

Shared round numbers (as in test_des.py): worker ``fast`` 2e12 FLOP/s and ``slow``
1e12 FLOP/s (memory 1e12 B/s, no launch overhead, NIC 1e9 B/s, 16e9 B of memory);
shard ``ps`` with free compute (1e20 B/s memory) and a 2e9 B/s NIC; one layer ``fc``:
1e6 parameter bytes, 1e9 fwd + 2e9 bwd FLOP per sample; latency 1e-4 s; no link
sharing. So a pull or push takes 1.1e-3 s, b samples compute for 3e9 b / peak s,
and a BSP iteration is 2.2e-3 s plus the slowest worker's compute.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import schedulers
from experiments import runner
from experiments.cli import main
from schedulers.base import _REGISTRY, capped_largest_remainder
from schedulers.hps import HPS
from schedulers.lbbsp import LBBSP
from sim import analytic, des
from sim.costmodel import (
    activation_memory_per_sample_bytes,
    fixed_memory_bytes,
    max_batch_in_memory,
)
from sim.dynamics import Dynamic
from sim.observation import Observation, WorkerStatus, accepted_shares
from sim.plan import Plan
from tests.helpers_eval import dense, model, plan, problem, profile, sparse, time_limit

EXACT = 1e-9
FAST = profile("fast", peak=2e12)
SLOW = profile("slow", peak=1e12)
PS_FREE = profile("ps", kind="cpu", mem_bw=1e20, nic=2e9)
FC = model(dense("fc", 1e6, fwd_flops=1e9, bwd_flops=2e9))
COMM = 2.2e-3  # pull + push per BSP iteration


def _two(B: int = 30, **kw):
    kw.setdefault("iterations", 4)
    return problem([FAST, SLOW], [PS_FREE], FC, B, latency_s=1e-4, sharing="none", **kw)


def _run(prob, pl, sched, **kw):
    with time_limit(60):
        return des.simulate(prob, pl, scheduler=sched, **kw)


def _ws(device: str, batch: int, rate: float, free: float = 16e9, alive: bool = True) -> WorkerStatus:
    compute = batch / rate if rate > 0 else 0.0
    return WorkerStatus(device, batch, compute, batch if rate > 0 else 0, rate, free, alive)


def _shares(p: Plan | None, devices: list[str]) -> list[int] | None:
    if p is None:
        return None
    have = {r.device: r.batch for r in p.replicas}
    return [have.get(d, 0) for d in devices]


# -- rebalancing equalises compute times ---------------------------------------------------


def test_lbbsp_rebalance_gives_equal_compute_times_on_two_workers() -> None:
    # Start 15/15. Iteration 0: fast computes 15 x 3e9 / 2e12 = 0.0225 s (rate 666.7/s), slow
    # 15 x 3e9 / 1e12 = 0.045 s (333.3/s): 0.045 + 2.2e-3 = 0.0472 s. At the barrier lbbsp
    # (damping 0) sets shares proportional to rate: 20/10, so both compute 0.03 s from
    # iteration 1 on: 0.0322 s per iteration.
    prob = _two()
    r = _run(prob, plan(prob, [15, 15]), LBBSP(damping=0.0))
    assert r.iteration_times() == pytest.approx([0.0472, 0.0322, 0.0322, 0.0322], rel=EXACT)
    assert r.iter_samples == [30] * 4
    assert r.extra["rebalances"] == 1
    assert r.extra["final_shares"] == {"fast:0": 20, "slow:0": 10}
    w = r.summary()["workers"]
    assert w["fast:0"]["compute_s"] == pytest.approx(0.0225 + 3 * 0.03, rel=EXACT)
    assert w["slow:0"]["compute_s"] == pytest.approx(0.045 + 3 * 0.03, rel=EXACT)
    # the analytic evaluator drives lbbsp to the same steady state
    a = analytic.evaluate(prob, plan(prob, [15, 15]), scheduler=LBBSP(damping=0.0))
    assert a.iteration_times() == pytest.approx([0.0322] * 4, rel=EXACT)
    assert a.extra["rebalances"] == 1 and a.extra["final_shares"] == {"fast:0": 20, "slow:0": 10}
    # without a scheduler the analytic evaluator is unchanged
    plain = analytic.evaluate(prob, plan(prob, [15, 15]))
    assert plain.iteration_times() == pytest.approx([0.0472] * 4, rel=EXACT)
    assert "rebalances" not in plain.extra


def test_offline_scheduler_in_the_des_changes_nothing() -> None:
    prob = _two()
    pl = plan(prob, [15, 15])
    a = _run(prob, pl, schedulers.make("proportional"))
    b = _run(prob, pl, None)
    assert a.summary_json() == b.summary_json() and "rebalances" not in a.extra


# -- lbbsp: smoothing and damping --------------------------------------------------------------


def test_lbbsp_damping_trajectory_on_scripted_observations() -> None:
    # alpha 0.5, damping 0.5, B 30, start 15/15.
    # 1: rates 600/300 (first measurement: taken as is): target 20/10, new 17.5/12.5 -> tie of
    #    remainders goes to the lower index: 18/12.
    # 2: rates 300/300 -> smoothed 450/300: target 18/12 = old: unchanged -> None.
    # 3: rates 300/300 -> smoothed 375/300: target 16.667/13.333, new 17.333/12.667 -> 17/13.
    # 4: worker b measured nothing (rate 0): its estimate stays 300; a 300 -> 337.5:
    #    target 15.882/14.118, new 16.441/13.559 -> 16/14.
    prob = _two()
    s = LBBSP(alpha=0.5, damping=0.5)
    devs = ["fast:0", "slow:0"]
    p = plan(prob, [15, 15])
    got = []
    script = [(600.0, 300.0), (300.0, 300.0), (300.0, 300.0), (300.0, 0.0)]
    for k, (ra, rb) in enumerate(script):
        cur = _shares(p, devs)
        assert cur is not None
        obs = Observation(0.1 * k, k + 1, (_ws("fast:0", cur[0], ra), _ws("slow:0", cur[1], rb)), 30)
        new = s.rebalance(p, obs)
        got.append(_shares(new, devs))
        p = new or p
    assert got == [[18, 12], None, [17, 13], [16, 14]]
    assert s.rates.rate_sps == pytest.approx({"fast:0": 337.5, "slow:0": 300.0}, rel=1e-12)


def test_lbbsp_plan_is_proportionals_split() -> None:
    prob = _two()
    a, b = LBBSP().plan(prob), schedulers.make("proportional").plan(prob)
    assert a.replicas == b.replicas and a.scheduler == "lbbsp"


# -- memory model --------------------------------------------------------------------------------

MEM = model(dense("a", 1e6, activation_bytes=1e5), dense("b", 1e6, activation_bytes=1e5))


def test_memory_functions_by_hand() -> None:
    # parameters 2e6 B: + gradients + one momentum buffer = 6e6 B; Adam (2 copies) 8e6 B.
    assert fixed_memory_bytes(MEM) == 6e6
    assert fixed_memory_bytes(MEM, 2) == 8e6
    assert fixed_memory_bytes(MEM, 0) == 4e6
    # activations kept for the backward pass: 2 x 1e5 B per sample in fp32, half in fp16
    assert activation_memory_per_sample_bytes(MEM, "fp32") == 2e5
    assert activation_memory_per_sample_bytes(MEM, "fp16") == 1e5
    # (6e6 + 7.5 x 2e5 - 6e6) / 2e5 -> 7 samples; less than the fixed part -> 0
    assert max_batch_in_memory(MEM, "fp32", 6e6 + 7.5 * 2e5) == 7
    assert max_batch_in_memory(MEM, "fp32", 5e6) == 0
    assert max_batch_in_memory(model(dense("x", 1e6)), "fp32", 1e9) is None  # no activations: no cap


# -- hps: memory caps, redistribution, failures ----------------------------------------------


def _hps3(**kw) -> tuple[HPS, Plan, list[str]]:
    prob = problem([SLOW] * 3, [PS_FREE], MEM, 30)
    s = HPS(rebalance_every=1, alpha=1.0, **kw)
    s.plan(prob)  # binds the model the caps are computed for
    devs = [d.id for d in prob.cluster.devices]
    return s, plan(prob, [10, 10, 10]), devs


def _mem(samples: float) -> float:
    return 6e6 + samples * 2e5  # free memory that holds exactly ``samples`` (fp32, MEM)


def test_hps_caps_a_worker_short_of_memory() -> None:
    # Equal rates: 10/10/10 uncapped. Worker 0 holds only 5 samples: it gets 5, and the other
    # 25 are split 12.5/12.5 -> 13/12 (largest remainder, tie to the lower index).
    s, p, devs = _hps3()
    obs = Observation(1.0, 1, (_ws(devs[0], 10, 100, _mem(5.5)), _ws(devs[1], 10, 100),
                               _ws(devs[2], 10, 100)), 30)
    assert _shares(s.rebalance(p, obs), devs) == [5, 13, 12]


def test_hps_redistributes_until_no_cap_is_violated() -> None:
    # Rates 100/200/300, B 60: quotas 10/20/30. Worker 2 holds 20: capped; the other 40 go
    # 1:2 -> 13.3/26.7, but worker 1 holds 25: capped; worker 0 takes the remaining 15.
    prob = problem([SLOW] * 3, [PS_FREE], MEM, 60)
    s = HPS(rebalance_every=1, alpha=1.0)
    s.plan(prob)
    devs = [d.id for d in prob.cluster.devices]
    p = plan(prob, [20, 20, 20])
    obs = Observation(1.0, 1, (_ws(devs[0], 20, 100), _ws(devs[1], 20, 200, _mem(25)),
                               _ws(devs[2], 20, 300, _mem(20))), 60)
    new = s.rebalance(p, obs)
    assert _shares(new, devs) == [15, 25, 20]
    assert new is not None and "memory_short_samples" not in new.options


@pytest.mark.parametrize(("min_share", "expected"), [(1, [1, 28, 1]), (0, [0, 30, 0]), (3, [3, 24, 3])])
def test_hps_keeps_a_min_share_so_a_slow_looking_worker_is_still_measured(min_share, expected) -> None:
    # Rates 1/1000/1, B 30: quotas 0.03/29.94/0.03 -> 0/30/0; with min_share m the two
    # starved workers get m each, taken from the largest share.
    s, p, devs = _hps3(min_share=min_share)
    obs = Observation(1.0, 1, (_ws(devs[0], 10, 1), _ws(devs[1], 10, 1000), _ws(devs[2], 10, 1)), 30)
    assert _shares(s.rebalance(p, obs), devs) == expected


def test_hps_memory_short_gives_every_worker_its_cap() -> None:
    s, p, devs = _hps3()
    obs = Observation(1.0, 1, tuple(_ws(d, 10, 100, _mem(5)) for d in devs), 30)
    new = s.rebalance(p, obs)
    assert _shares(new, devs) == [5, 5, 5]
    assert new is not None and new.options["memory_short_samples"] == 15


def test_hps_waits_rebalance_every_calls_but_not_for_a_failure() -> None:
    prob = problem([SLOW] * 3, [PS_FREE], MEM, 30)
    s = HPS(rebalance_every=3, alpha=1.0)
    s.plan(prob)
    devs = [d.id for d in prob.cluster.devices]
    p = plan(prob, [10, 10, 10])
    uneven = Observation(1.0, 1, (_ws(devs[0], 10, 100), _ws(devs[1], 10, 200), _ws(devs[2], 10, 100)), 30)
    assert s.rebalance(p, uneven) is None  # call 1 of 3
    # call 2: worker 1 failed (detected): its share goes to the others at once
    dead = Observation(2.0, 2, (_ws(devs[0], 10, 100), _ws(devs[1], 10, 0, alive=False),
                                _ws(devs[2], 10, 100)), 30)
    assert _shares(s.rebalance(p, dead), devs) == [15, 0, 15]


def test_hps_plan_is_capped_proportional_split() -> None:
    # modelled rates 2:1 -> 20/10 as proportional; with memory for 10 samples on the fast
    # worker (free_memory_frac at t = 0): 10/20.
    big = model(dense("fc", 1e6, fwd_flops=1e9, bwd_flops=2e9, activation_bytes=1e8))
    free = (3e6 + 10.5 * 1e8) / 16e9
    prob = problem([FAST, SLOW], [PS_FREE], big, 30,
                   dynamics=[Dynamic(worker=0, at_s=0.0, free_memory_frac=free)])
    assert [r.batch for r in HPS().plan(prob).replicas] == [10, 20]
    assert [r.batch for r in HPS().plan(problem([FAST, SLOW], [PS_FREE], big, 30)).replicas] == [20, 10]


rates_st = st.lists(st.tuples(st.floats(0.0, 1e4), st.one_of(st.none(), st.integers(0, 200)), st.booleans()),
                    min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(ws=rates_st, B=st.integers(1, 500))
def test_capped_shares_are_integers_summing_to_B(ws: list, B: int) -> None:
    weights = [r if alive else 0.0 for r, _, alive in ws]
    if sum(weights) <= 0:
        weights[0] = 1.0
    caps = [c for _, c, _ in ws]
    shares, short = capped_largest_remainder(weights, caps, B)
    assert all(isinstance(x, int) and x >= 0 for x in shares)
    assert sum(shares) + short == B
    for x, c, w in zip(shares, caps, weights):
        assert c is None or x <= c
        assert w > 0 or x == 0
    room = sum(min(c if c is not None else B, B) for c, w in zip(caps, weights) if w > 0)
    assert short == max(0, B - room)


@settings(max_examples=100, deadline=None)
@given(ws=st.lists(st.tuples(st.floats(1.0, 1e4), st.booleans()), min_size=2, max_size=6),
       B=st.integers(1, 300), damping=st.sampled_from([0.0, 0.5, 0.9]))
def test_online_schedulers_return_integers_summing_to_B(ws: list, B: int, damping: float) -> None:
    alive = [a for _, a in ws]
    if not any(alive):
        alive[0] = True
    prob = problem([SLOW] * len(ws), [PS_FREE], MEM, B)
    devs = [d.id for d in prob.cluster.devices]
    old = [B // len(ws)] * len(ws)
    old[0] += B - sum(old)
    p = plan(prob, [max(b, 1) for b in old]) if all(old) else plan(prob, [1] * len(ws))
    obs = Observation(1.0, 1, tuple(_ws(d, b, r, alive=a) for d, b, (r, _), a in zip(devs, old, ws, alive)), B)
    hps = HPS(rebalance_every=1)
    hps.plan(prob)
    for s in (LBBSP(damping=damping), hps):
        new = s.rebalance(p, obs)
        shares = _shares(new, devs) or old
        assert all(isinstance(x, int) and x >= 0 for x in shares)
        assert sum(b for b, a in zip(shares, alive) if a) == B
        assert all(b == 0 for b, a in zip(shares, alive) if not a)


def test_engine_refuses_plans_that_break_the_contract() -> None:
    prob = _two()
    p = plan(prob, [20, 10])
    obs = Observation(0.0, 1, (_ws("fast:0", 20, 100), _ws("slow:0", 10, 0, alive=False)), 30)
    assert accepted_shares(p.with_shares({"slow:0": 0, "fast:0": 30}), obs, 30) == [30, 0]
    with pytest.raises(ValueError, match="failed worker"):
        accepted_shares(p.with_shares({"fast:0": 20}), obs, 30)
    with pytest.raises(ValueError, match="sum to 25"):
        accepted_shares(p.with_shares({"fast:0": 25, "slow:0": 0}), obs, 30)


# -- failures and slowdowns in the DES --------------------------------------------------------


def test_hps_gives_a_failed_workers_share_to_the_others() -> None:
    # 20/10 (hps.plan). Iteration 0: 0.0322 s. The slow worker dies at 0.05, mid-compute; the
    # failure is detected at 0.15 and iteration 1 ends then with the fast worker's 20 samples.
    # hps moves the dead worker's 10 samples to the fast one: 30 samples per iteration in
    # 30 x 3e9 / 2e12 + 2.2e-3 = 0.0472 s. `equal` (15/15) continues with 15 samples.
    prob = _two(iterations=6, failure_timeout_s=0.1, dynamics=[Dynamic(worker=1, at_s=0.05, fail=True)])
    s = schedulers.make("hps", {"rebalance_every": 5})
    r = _run(prob, s.plan(prob), s)
    assert r.iter_samples == [30, 20, 30, 30, 30, 30]
    assert r.iteration_times() == pytest.approx([0.0322, 0.1178] + [0.0472] * 4, rel=EXACT)
    assert r.extra["final_shares"] == {"fast:0": 30, "slow:0": 0}
    e = schedulers.make("equal")
    assert _run(prob, e.plan(prob), e).iter_samples == [30, 15, 15, 15, 15, 15]


def test_hps_recovers_from_a_slowdown_that_proportional_keeps() -> None:
    # 20/10 from the model. At 0.2 s the fast worker slows down 4x (5e11 FLOP/s, half the
    # slow one). proportional keeps 20/10: 20 x 3e9 / 5e11 + 2.2e-3 = 0.1222 s per iteration.
    # hps (every 2 iterations, smoothed rates) converges to 10/20: both compute 0.06 s,
    # 0.0622 s per iteration, 1.96x the throughput.
    prob = _two(iterations=40, dynamics=[Dynamic(worker=0, at_s=0.2, slowdown=4.0)])
    h = schedulers.make("hps", {"rebalance_every": 2})
    rh = _run(prob, h.plan(prob), h, trace=False)
    p = schedulers.make("proportional")
    rp = _run(prob, p.plan(prob), p, trace=False)
    assert rh.extra["final_shares"] == {"fast:0": 10, "slow:0": 20}
    assert rh.iteration_times()[-10:] == pytest.approx([0.0622] * 10, rel=EXACT)
    assert rp.iteration_times()[-10:] == pytest.approx([0.1222] * 10, rel=EXACT)
    # over the whole run (39 measured iterations, convergence included): below the steady
    # ratio 0.1222 / 0.0622 because of the transient. Pinned values (the DES is deterministic):
    assert rh.throughput_sps > 1.7 * rp.throughput_sps
    assert rh.throughput_sps == pytest.approx(479.7638085855678, rel=1e-9)
    assert rp.throughput_sps == pytest.approx(272.1753088140317, rel=1e-9)


def test_hps_without_status_awareness_keeps_the_modelled_split_under_a_slowdown() -> None:
    # The case above with status_aware false: the split stays the modelled 20/10 although the
    # fast worker runs at half the slow one's speed from 0.2 s, so every iteration after the
    # slowdown takes 20 x 3e9 / 5e11 + 2.2e-3 = 0.1222 s, as with proportional (status-aware
    # hps: 0.0622 s); nothing is ever rebalanced.
    prob = _two(iterations=40, dynamics=[Dynamic(worker=0, at_s=0.2, slowdown=4.0)])
    h = schedulers.make("hps", {"rebalance_every": 2, "status_aware": False})
    r = _run(prob, h.plan(prob), h, trace=False)
    assert r.extra["final_shares"] == {"fast:0": 20, "slow:0": 10}
    assert r.extra["rebalances"] == 0
    assert r.iteration_times()[-10:] == pytest.approx([0.1222] * 10, rel=EXACT)
    assert r.throughput_sps == pytest.approx(272.1753088140317, rel=1e-9)  # proportional's


def test_hps_without_status_awareness_splits_a_failed_share_by_modelled_rates() -> None:
    # Modelled rates 2:1:1 (fast, slow, slow): 20/10/10 of 40. Observed: the fast worker at 50
    # samples/s (slowed down), worker 1 dead, worker 2 at 100/s. Status-aware (alpha 1): rates
    # 50 : 0 : 100 -> 13.3/26.7 -> 13/0/27. Without status: modelled 2 : 0 : 1 -> 26.7/13.3 ->
    # 27/0/13. Without a failure, the unaware one keeps the plan whatever it observes.
    prob = problem([FAST, SLOW, SLOW], [PS_FREE], FC, 40)
    devs = [d.id for d in prob.cluster.devices]
    aware, unaware = HPS(rebalance_every=1, alpha=1.0), HPS(rebalance_every=1, alpha=1.0, status_aware=False)
    p = aware.plan(prob)
    assert [r.batch for r in unaware.plan(prob).replicas] == [r.batch for r in p.replicas] == [20, 10, 10]
    dead = Observation(1.0, 1, (_ws(devs[0], 20, 50), _ws(devs[1], 10, 0, alive=False),
                                _ws(devs[2], 10, 100)), 40)
    assert _shares(aware.rebalance(p, dead), devs) == [13, 0, 27]
    assert _shares(unaware.rebalance(p, dead), devs) == [27, 0, 13]
    slowed = Observation(1.0, 1, (_ws(devs[0], 20, 50), _ws(devs[1], 10, 100), _ws(devs[2], 10, 100)), 40)
    assert unaware.rebalance(p, slowed) is None
    assert _shares(aware.rebalance(p, slowed), devs) == [8, 16, 16]


# -- the seam ---------------------------------------------------------------------------------


class _Recorder:
    """A dummy online scheduler: fixed 20/10 plan, records what it sees, never changes it."""

    name = "recorder"

    def __init__(self) -> None:
        self.seen: list[tuple[tuple[int, ...], Observation]] = []

    def plan(self, problem):
        return plan(problem, [20, 10], "recorder")

    def rebalance(self, plan: Plan, obs: Observation) -> Plan | None:
        self.seen.append((tuple(r.batch for r in plan.replicas), obs))
        return None


def test_seam_observations_are_measured() -> None:
    # The fast worker runs at half speed from t = 0: 20 samples compute in 0.06 s (rate 333.3),
    # the slow worker's 10 in 0.03 s (333.3). Iterations take 0.0622 s and end at 0.0622,
    # 0.1244, 0.1866; rebalance is called after the first two (not after the last). At 0.07
    # the slow worker's free memory drops to a quarter of its 16e9 B.
    schedulers.register("recorder_test")(_Recorder)
    try:
        prob = _two(iterations=3, dynamics=[Dynamic(worker=0, at_s=0.0, slowdown=2.0),
                                            Dynamic(worker=1, at_s=0.07, free_memory_frac=0.25)])
        s = schedulers.make("recorder_test")
        r = runner.evaluate(prob, s.plan(prob), "des", scheduler=s)
    finally:
        del _REGISTRY["recorder_test"]
    assert "recorder_test" not in schedulers.names()
    assert r.iter_end_s == pytest.approx([0.0622, 0.1244, 0.1866], rel=EXACT)
    assert r.extra["rebalances"] == 0
    assert [b for b, _ in s.seen] == [(20, 10), (20, 10)]
    for k, (_, obs) in enumerate(s.seen):
        assert obs.time_s == pytest.approx(0.0622 * (k + 1), rel=EXACT)
        assert obs.iteration == k + 1 and obs.global_batch == 30
        f, w = obs.workers
        assert (f.device, f.batch, f.samples, f.alive) == ("fast:0", 20, 20, True)
        assert (w.device, w.batch, w.samples, w.alive) == ("slow:0", 10, 10, True)
        assert f.compute_s == pytest.approx(0.06, rel=EXACT)
        assert w.compute_s == pytest.approx(0.03, rel=EXACT)
        assert f.rate_sps == pytest.approx(1000 / 3, rel=EXACT)
        assert w.rate_sps == pytest.approx(1000 / 3, rel=EXACT)
        assert f.free_memory_bytes == 16e9
        assert w.free_memory_bytes == (16e9 if k == 0 else 4e9)


def test_failed_worker_is_observed_dead_after_detection() -> None:
    prob = _two(iterations=5, failure_timeout_s=0.1, dynamics=[Dynamic(worker=1, at_s=0.05, fail=True)])
    s = _Recorder()
    _run(prob, s.plan(prob), s)
    # iterations end at 0.0322 (both alive), 0.15 (detected at 0.15), ...
    alive = [tuple(w.alive for w in obs.workers) for _, obs in s.seen]
    assert alive == [(True, True)] + [(True, False)] * 3
    assert [obs.workers[1].samples for _, obs in s.seen] == [10, 0, 0, 0]


class _Idler:
    """Gives everything to the fast worker after the first iteration, idling the slow one."""

    name = "idler"

    def plan(self, problem):
        return plan(problem, [20, 10], "idler")

    def rebalance(self, plan: Plan, obs: Observation) -> Plan | None:
        return plan.with_shares({"fast:0": 30, "slow:0": 0})


@pytest.mark.parametrize("sync", ["bsp", "asp", "ssp"])
def test_a_zero_share_idles_a_worker_that_stays_a_member(sync: str) -> None:
    prob = _two(iterations=6, sync=sync, staleness=1)
    s = _Idler()
    r = _run(prob, s.plan(prob), s)
    assert len(r.iter_end_s) == 6 and set(r.iter_samples) == {30}
    if sync == "bsp":
        # from iteration 1 on the fast worker alone: 30 x 3e9 / 2e12 + 2.2e-3 = 0.0472 s
        assert r.iteration_times() == pytest.approx([0.0322] + [0.0472] * 5, rel=EXACT)
        assert r.summary()["workers"]["slow:0"]["compute_s"] == pytest.approx(0.03, rel=EXACT)


def test_sparse_rows_follow_the_share_actually_run() -> None:
    # A sparse table: each sample touches 10 rows of 1e4 B; lbbsp moves samples between
    # the workers. Every iteration still processes the global batch and the run finishes.
    emb = sparse("emb", 1e9, rows_per_sample=10, row_bytes=1e4)
    m = model(emb, dense("fc", 1e6, fwd_flops=1e9, bwd_flops=2e9))
    prob = problem([FAST, SLOW], [PS_FREE, PS_FREE], m, 30, latency_s=1e-4, sharing="fair", iterations=8)
    r = _run(prob, plan(prob, [15, 15]), LBBSP(damping=0.0))
    assert r.iter_samples == [30] * 8 and r.extra["final_shares"] == {"fast:0": 20, "slow:0": 10}
    ends = r.iteration_times()
    # once settled at 20/10 the iterations repeat
    assert ends[-1] == pytest.approx(ends[-2], rel=1e-9)


def test_same_online_run_same_bytes() -> None:
    prob = _two(iterations=12, dynamics=[Dynamic(worker=0, at_s=0.1, slowdown=3.0)])
    outs = []
    for _ in range(2):
        s = schedulers.make("hps", {"rebalance_every": 2})
        r = _run(prob, s.plan(prob), s)
        outs.append((r.summary_json(), r.iterations_csv(), r.trace_json()))
    assert outs[0] == outs[1]


# -- the command line -------------------------------------------------------------------------


@pytest.mark.parametrize("evaluator", ["des", "analytic"])
def test_simulate_with_hps_from_a_config(tmp_path: Path, evaluator: str, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = {
        "name": "online",
        "cluster": {"devices": [{"type": "t4", "count": 1}, {"type": "cpu-8c", "count": 2}],
                    "network": {"bandwidth_gbps": 10}},
        "job": {"model": "mlp", "global_batch": 64, "iterations": 6},
        "scheduler": {"name": "hps", "params": {"rebalance_every": 2}},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    assert main(["simulate", str(path), "--evaluator", evaluator, "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["scheduler"] == "hps" and s["evaluator"] == evaluator
    assert isinstance(s["rebalances"], int) and sum(s["final_shares"].values()) == 64
    assert (out / "iterations.csv").read_text().splitlines()[0] == "iteration,start_s,end_s,time_s,samples"
