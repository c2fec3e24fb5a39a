"""The analytic evaluator against the DES.

ARCHITECTURE.md: "The analytic evaluator and the DES must agree exactly on
cases without contention and within a few per cent with it." Without link
sharing both execute the same max-plus recursion on the same PlanCosts, so
every iteration end must agree to float rounding (rel 1e-9). With fair
sharing the analytic uses time-averaged shares, so steady-state throughput
must agree within 3 %. ASP and SSP are steady-state queueing approximations
(mean-value analysis) of an unsynchronised system whose DES throughput is
measured in whole global batches: 10 % on fixed cases.
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, given, settings

from sim import analytic, des
from tests.helpers_eval import build, case_specs, dense, model, plan, problem, profile, time_limit

EXACT = 1e-9
CONTENTION_TOL = 0.03


def _both(spec: dict, limit_s: float = 20.0, **job):
    prob, pl = build(spec, **job)
    with time_limit(limit_s):
        d = des.simulate(prob, pl, trace=False)
    return d, analytic.evaluate(prob, pl)


def _rel(a: float, d: float) -> float:
    return abs(a - d) / d


# -- (a) no contention: exact agreement -----------------------------------------------


def test_hand_case_agrees_exactly() -> None:
    # The one-worker case of test_des: 0.0328 s per iteration in both, pipelined or not
    # (one layer: pipelining has nothing to overlap).
    gpu = profile("gpu")
    ps = profile("ps", kind="cpu", mem_bw=1e10, nic=2e9)
    m = model(dense("fc", 1e6, fwd_flops=1e9, bwd_flops=2e9))
    for pipeline in (False, True):
        prob = problem([gpu], [ps], m, 10, latency_s=1e-4, iterations=6, pipeline=pipeline)
        pl = plan(prob, [10])
        d, a = des.simulate(prob, pl), analytic.evaluate(prob, pl)
        assert a.iter_end_s == pytest.approx([0.0328 * k for k in range(1, 7)], rel=EXACT)
        assert a.iter_end_s == pytest.approx(d.iter_end_s, rel=EXACT)
        assert a.evaluator == "analytic" and d.evaluator == "des"


@settings(max_examples=60, deadline=None)
@given(spec=case_specs())
def test_no_contention_every_iteration_end_agrees(spec: dict) -> None:
    # 12 iterations: the analytic extrapolates once two iterations repeat; the DES runs them all.
    d, a = _both(spec, limit_s=5.0, sharing="none", iterations=12, warmup=2)
    assert len(d.iter_end_s) == len(a.iter_end_s) == 12
    assert a.iter_end_s == pytest.approx(d.iter_end_s, rel=EXACT)
    assert a.iter_samples == d.iter_samples == [sum(spec["shares"])] * 12
    assert a.throughput_sps == pytest.approx(d.throughput_sps, rel=1e-8)
    # the same devices, the same compute time per worker
    assert [x.id for x in a.devices] == [x.id for x in d.devices]
    for xa, xd in zip(a.devices, d.devices):
        if xa.role == "worker":
            assert xa.compute_s == pytest.approx(xd.compute_s, rel=1e-9)


def test_simultaneous_arrivals_apply_after_every_aggregation() -> None:
    # Every time is a multiple of 1/1024 s, so float sums are exact and the tie is real.
    # Worker 0 ('a', 4 samples): fwd 4/1024, bwd 4/1024. Worker 1 ('b', 1 sample, launch 2/1024
    # per kernel): fwd 2/1024 + 1/1024, bwd 4/1024 + 1/1024. Pulls and pushes of 976562.5 B at
    # 1e9 B/s take 1/1024; aggregation and apply 3 x 976562.5 / 3e9 = 1/1024 each.
    # Both gradients land at (1 + 8 + 1)/1024; the shard aggregates two and applies:
    # 13/1024 s per iteration. Worker 1's backward was scheduled first (its forward is
    # shorter), so its gradient is delivered first.
    a = profile("a", peak=1e12, nic=1e9)
    b = profile("b", peak=1e12, nic=1e9, launch=2 / 1024)
    ps = profile("ps", kind="cpu", mem_bw=3e9, nic=1e9)
    m = model(dense("fc", 976562.5, fwd_flops=9.765625e8, bwd_flops=9.765625e8))
    prob = problem([a, b], [ps], m, 5, sharing="none", iterations=3)
    pl = plan(prob, [4, 1])
    assert analytic.evaluate(prob, pl).iteration_times().tolist() == [13 / 1024] * 3
    with time_limit(20):
        d = des.simulate(prob, pl)
    assert d.iteration_times().tolist() == [13 / 1024] * 3


def test_worker_time_split_agrees_without_contention() -> None:
    # One worker: per iteration 0.03 s compute, 2.2e-3 s of its own pull+push (comm) and
    # 6e-4 s of shard work (wait). 4 iterations: 0.12, 0.0088, 0.0024 in both evaluators.
    gpu = profile("gpu")
    ps = profile("ps", kind="cpu", mem_bw=1e10, nic=2e9)
    prob = problem([gpu], [ps], model(dense("fc", 1e6, fwd_flops=1e9, bwd_flops=2e9)), 10,
                   latency_s=1e-4, iterations=4)
    pl = plan(prob, [10])
    for r in (des.simulate(prob, pl), analytic.evaluate(prob, pl)):
        w = r.summary()["workers"]["gpu:0"]
        assert [w["compute_s"], w["comm_s"], w["wait_s"]] == pytest.approx([0.12, 0.0088, 0.0024], rel=EXACT)


# -- (b) fair sharing: steady-state throughput within 3 % ----------------------------------


@settings(max_examples=60, deadline=None, derandomize=True, phases=[Phase.explicit, Phase.generate])
@given(spec=case_specs())
def test_contention_throughput_within_3_percent(spec: dict) -> None:
    # derandomize: the suite is reproducible, and without the shrink phase a failure costs
    # seconds, not minutes. The targeted searches that find failing cases are in the report;
    # their minimal examples are kept below as explicit xfails.
    d, a = _both(spec, limit_s=5.0, sharing="fair", iterations=12, warmup=4)
    assert len(d.iter_end_s) == 12
    assert _rel(a.throughput_sps, d.throughput_sps) <= CONTENTION_TOL


def test_contention_one_worker_three_shards_pipelined() -> None:
    # Minimal form of the worst case hypothesis found (+14.5 % with a sparse table and 8 layers).
    # Two 1.2e6-B layers over 3 shards: chunks (s0, l0) 8e5 B, (s1, l0) 4e5, (s1, l1) 4e5,
    # (s2, l1) 8e5. While all four pull, the worker's downlink gives each 7.5e8 B/s and shard 1's
    # uplink gives its two 5e8 B/s; the worker link is not full, so no rate is a time average.
    spec = {"types": [(1e12, 1e12, 0.0, 3e9)], "workers": [0], "shares": [1], "shards": 3,
            "ps": (1e20, 1e9), "layers": [(1200000, 0.0, 0.0, 0), (1200000, 0.0, 0.0, 0)],
            "sparse": None, "pipeline": True, "bits": 32, "latency": 0.0}
    d, a = _both(spec, sharing="fair", iterations=12, warmup=4)
    assert d.iteration_times()[-1] == pytest.approx(1.9545e-3, rel=1e-4)
    assert _rel(a.throughput_sps, d.throughput_sps) <= CONTENTION_TOL


def test_contention_hypothesis_minimal_example() -> None:
    # Hypothesis' shrunk counterexample of the 3 % property (targeted search, 3000 examples).
    spec = {"types": [(1e12, 1e10, 0.0, 3e8), (1e11, 1e10, 0.0, 1e8), (1e12, 1e10, 1e-05, 3e8)],
            "workers": [0, 0, 0, 0, 2, 0], "shares": [1, 1, 1, 1, 1, 4], "shards": 1,
            "ps": (1e9, 1e9), "layers": [(1, 0.0, 2e7, 0), (3379, 0.0, 0.0, 0)], "sparse": None,
            "pipeline": False, "bits": 32, "latency": 0.0}
    d, a = _both(spec, sharing="fair", iterations=12, warmup=4)
    assert _rel(a.throughput_sps, d.throughput_sps) <= CONTENTION_TOL


# -- (c) ASP and SSP: within 10 % on fixed cases ----------------------------------------------

FAST = profile("fast", peak=2e12)
SLOW = profile("slow", peak=1e12)
CPU = profile("cpu", kind="cpu", peak=2e11, mem_bw=5e10)
PS = profile("ps", kind="cpu", mem_bw=2e10, nic=2e9)
NET = model(dense("conv", 2e6, fwd_flops=2e8, bwd_flops=4e8, activation_bytes=4e4),
            dense("fc", 1e6, fwd_flops=1e8, bwd_flops=2e8))

ASYNC_CASES = {
    # name: (workers, shares, shards, job keywords)
    "asp-2-workers-no-sharing": ([FAST, SLOW], [20, 12], 1, dict(sync="asp", sharing="none")),
    "asp-3-workers-2-shards-fair": ([FAST, SLOW, CPU], [20, 12, 2], 2, dict(sync="asp", sharing="fair")),
    "asp-pipelined-fair": ([FAST, SLOW, CPU], [20, 12, 2], 2, dict(sync="asp", sharing="fair", pipeline=True)),
    "asp-8-bit-fair": ([FAST, SLOW], [20, 12], 1, dict(sync="asp", sharing="fair", quant_bits=8)),
    "ssp0-fair": ([FAST, SLOW, CPU], [20, 12, 2], 2, dict(sync="ssp", staleness=0, sharing="fair")),
    "ssp2-fair": ([FAST, SLOW, CPU], [20, 12, 2], 2, dict(sync="ssp", staleness=2, sharing="fair")),
    "ssp1-4-workers-no-sharing": ([FAST, FAST, SLOW, SLOW], [10, 10, 6, 6], 1,
                                  dict(sync="ssp", staleness=1, sharing="none")),
}


@pytest.mark.parametrize("name", list(ASYNC_CASES))
def test_async_throughput_within_10_percent(name: str) -> None:
    # Why 10 %: the analytic treats each worker as a customer of a closed queueing network and
    # solves it by approximate mean-value analysis, which ignores the phase relations between
    # unsynchronised workers (who queues behind whom at a shard or on a link); the DES counts
    # throughput in whole global batches, so its window is off by up to a worker cycle at each
    # end (60 iterations, 10 warm-up: about 1 %). Neither is exact, so only a coarse bound holds.
    workers, shares, shards, job = ASYNC_CASES[name]
    prob = problem(workers, [PS] * shards, NET, sum(shares), iterations=60, warmup=10, latency_s=5e-5, **job)
    pl = plan(prob, shares)
    with time_limit(20):
        d = des.simulate(prob, pl, trace=False)
    a = analytic.evaluate(prob, pl)
    assert len(d.iter_end_s) == 60
    assert _rel(a.throughput_sps, d.throughput_sps) <= 0.10
