"""Multi-stage (layer-placement) plans: the analytic evaluator (sim/multistage.py), the
pipeline DES (sim/des/pipeline.py) and their dispatch from the common entry points.

The hand case uses round-number profiles (tests/helpers_eval.py): no launch
overhead and memory far faster than compute, so a layer's time is flops / peak.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from experiments.cli import main
from hardware_profiles.errors import HetsimError
from schedulers import make
from sim.des.pipeline import default_in_flight, simulate_pipeline
from sim.evaluate import evaluate
from sim.instances import random_problem
from sim.multistage import evaluate_analytic, pipeline_model, steady_figures
from sim.placement import PlacementSpace
from sim.plan import Plan, PlanKind, Replica, Stage, check_plan
from tests.helpers_eval import dense, model, problem, profile, time_limit

FAST = profile("fast", peak=1e13, mem_bw=1e15, nic=1e9, price=5.0, idle_w=20, active_w=220)
SLOW = profile("slow", peak=1e12, mem_bw=1e15, nic=1e9, kind="cpu", price=1.0, idle_w=10, active_w=60)
PS = profile("ps", kind="cpu", mem_bw=1e15, nic=1e10, price=1.0, idle_w=10, active_w=50)


def hand_case(pipeline: bool, shares: tuple[int, int] = (4, 4), iterations: int = 200):
    """L0 (1e9/2e9 FLOPs per sample, 1e6 param bytes, 1e5 activation bytes) on one fast
    replica; L1 (1e8/2e8 FLOPs, 4e6 param bytes) on two slow replicas; B = 8."""
    mdl = model(dense("L0", 1e6, 1e9, 2e9, activation_bytes=1e5),
                dense("L1", 4e6, 1e8, 2e8, activation_bytes=1e3))
    prob = problem([FAST, SLOW, SLOW], [PS], mdl, global_batch=8, pipeline=pipeline,
                   latency_s=0.0 if pipeline else 1e-4, iterations=iterations)
    plan = Plan((Stage(0, 1, (Replica("fast:0", 8),), "fast"),
                 Stage(1, 2, (Replica("slow:0", shares[0]), Replica("slow:1", shares[1])), "slow")),
                ("ps:0",), "hand", kind=PlanKind.PLACEMENT)
    check_plan(plan, prob)
    return prob, plan


# Stage 0, per iteration: compute 8 * 3e9 / 1e13 = 2.4e-3 s; pull = push = 1e6 B; it sends
# 8 * 1e5 = 8e5 B of activations and receives as many gradient bytes.
# Stage 1, per replica (4 samples): compute 4 * 3e8 / 1e12 = 1.2e-3 s; pull = push = 4e6 B;
# 4e5 B of boundary traffic each way.
# With pipelining (PS traffic overlapped): stage 0 max(2.4e-3, (1e6 + 8e5) / 1e9) = 2.4e-3 s;
#   stage 1 max(1.2e-3, (4e6 + 4e5) / 1e9) = 4.4e-3 s (its NIC); PS: 9e6 B / 1e10 = 9e-4 s.
#   T = 8 / 4.4e-3 = 1818.18 samples/s, bottleneck stage 1.
# Without (latency 1e-4): stage 0 2.4e-3 + 2e6 / 1e9 + 2e-4 = 4.6e-3 s; stage 1
#   1.2e-3 + 8e6 / 1e9 + 2e-4 = 9.4e-3 s. T = 8 / 9.4e-3 = 851.06 samples/s.
HAND = {True: 8 / 4.4e-3, False: 8 / 9.4e-3}


@pytest.mark.parametrize("pipeline", [True, False])
def test_hand_two_stage_throughput(pipeline: bool) -> None:
    prob, plan = hand_case(pipeline)
    m = pipeline_model(prob, plan)
    assert m.throughput_sps == pytest.approx(HAND[pipeline], rel=1e-12)
    assert m.bottleneck == "stage 1"
    a = evaluate(prob, plan, "analytic")  # dispatched on the kind: a placement
    assert a.evaluator == "analytic"
    assert a.throughput_sps == pytest.approx(HAND[pipeline], rel=1e-12)
    d = evaluate(prob, plan, "des", trace=False)
    assert d.evaluator == "des" and len(d.iter_end_s) == 200
    assert d.extra["steady_throughput_sps"] == pytest.approx(HAND[pipeline], rel=0.01)
    # at steady state the bottleneck stage's NIC / engine sets every iteration's time
    assert np.diff(d.iter_end_s)[-50:-10] == pytest.approx(8 / HAND[pipeline], rel=0.01)


def test_hand_cost_energy_and_devices() -> None:
    prob, plan = hand_case(True, iterations=1000)
    r = evaluate_analytic(prob, plan)
    T = HAND[True]
    elapsed_steady = 8000 / T
    p = r.extra["placement"]
    # 5 (fast) + 2 * 1 (slow) + 1 (PS shard) $/h over the samples at the steady rate
    assert p["rate_usd_h"] == pytest.approx(8.0)
    assert p["cost_usd"] == pytest.approx(8.0 * elapsed_steady / 3600, rel=1e-12)
    # busy fractions: fast 2.4e-3 / 4.4e-3, slow 1.2e-3 / 4.4e-3; the PS idles
    watts = 20 + 200 * 2.4 / 4.4 + 2 * (10 + 50 * 1.2 / 4.4) + 10
    assert p["energy_j"] == pytest.approx(watts * elapsed_steady, rel=1e-12)
    # the run: a fill iteration, then one per period; devices busy for their compute
    assert np.diff(r.iter_end_s)[1:] == pytest.approx(8 / T, rel=1e-12)
    assert r.elapsed_s == pytest.approx(p["fill_s"] + 999 * 8 / T, rel=1e-12)
    assert r.cost_usd == pytest.approx(8.0 * r.elapsed_s / 3600, rel=1e-12)
    busy = {d.id: d.busy_s for d in r.devices}
    assert busy == pytest.approx({"fast:0": 1000 * 2.4e-3, "slow:0": 1000 * 1.2e-3,
                                  "slow:1": 1000 * 1.2e-3, "ps:0": 0.0}, rel=1e-12)
    # uncontended fill: stage 0 pulls (1e-3) and runs forward (8e-4), the activations
    # cross (8e-4 on stage 0's NIC) at 2.6e-3, but stage 1's pull (4e-3, from 0) is later;
    # its forward and backward (4e-4 + 8e-4) end at 5.2e-3 and its push takes 4e-3: 9.2e-3
    # (stage 0: gradients 8e-4, backward 1.6e-3, push 1e-3 end at 8.6e-3)
    assert p["fill_s"] == pytest.approx(4e-3 + 4e-4 + 8e-4 + 4e-3, rel=1e-12)


def test_an_edited_plan_uses_its_own_shares() -> None:
    # slow shares 5 / 3: the larger moves (4e6 + 5e5) B per iteration: T = 8 / 4.5e-3
    prob, plan = hand_case(True, shares=(5, 3))
    assert pipeline_model(prob, plan).throughput_sps == pytest.approx(8 / 4.5e-3, rel=1e-12)
    d = simulate_pipeline(prob, plan, trace=False)
    assert d.extra["steady_throughput_sps"] == pytest.approx(8 / 4.5e-3, rel=0.01)


def test_des_is_deterministic_and_writes_a_trace() -> None:
    prob, plan = hand_case(False, shares=(5, 3), iterations=30)
    a, b = evaluate(prob, plan, "des"), evaluate(prob, plan, "des")
    assert a.trace_json() == b.trace_json() and a.summary_json() == b.summary_json()
    assert a.iterations_csv() == b.iterations_csv()
    ev = json.loads(a.trace_json())["traceEvents"]
    threads = {(e["pid"], e["args"]["name"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {(0, "fast:0"), (0, "slow:0"), (0, "slow:1"), (2, "ps:0")} <= threads
    names = {e["name"] for e in ev if e["ph"] == "X" and e["pid"] == 0}
    assert {"fwd 0", "bwd 0", "pull 0", "push 0", "fwd 29", "bwd 29"} <= names


# ---------------------------------------------------------------------------------------
# PlacementSpace consistency: the same formulas
# ---------------------------------------------------------------------------------------
def scheduler_plans(seed: int) -> list[tuple[Any, Plan]]:
    prob = random_problem(seed, n_layers=(3, 6))
    out = []
    for name in ("greedy", "exact"):
        try:
            out.append((prob, make(name).plan(prob)))
        except HetsimError:
            pass
    return out


@pytest.mark.parametrize("seed", range(12))
def test_matches_placement_space_for_scheduler_plans(seed: int) -> None:
    for prob, plan in scheduler_plans(seed):
        space = PlacementSpace(prob)
        want = space.evaluate_one(space.assignment_of(plan))
        keys = ("throughput_sps", "rate_usd_h", "cost_usd", "energy_j")
        # PlacementSpace's convention (every replica at the stage's largest share): equal
        got = steady_figures(prob, plan, pipeline_model(prob, plan, largest_share=True))
        assert got["bottleneck"] == want["bottleneck"]
        for k in keys:
            assert got[k] == pytest.approx(want[k], rel=1e-9), k
        # the evaluator (each replica at its own share): equal where the split is even,
        # else the same throughput and price and at most the energy
        r = evaluate_analytic(prob, plan)
        p = r.extra["placement"]
        even = all(len({x.batch for x in s.replicas}) == 1 for s in plan.stages)
        for k in keys:
            if even or k != "energy_j":
                assert p[k] == pytest.approx(want[k], rel=1e-9), k
            else:
                assert p[k] <= want[k] * (1 + 1e-9)
        # the RunResult: the same price over the run, which adds the fill to samples / T
        n = prob.job.iterations
        assert r.elapsed_s == pytest.approx(p["fill_s"] + (n - 1) * prob.job.global_batch / p["throughput_sps"],
                                            rel=1e-9)
        assert r.cost_usd == pytest.approx(p["rate_usd_h"] * r.elapsed_s / 3600, rel=1e-9)


# ---------------------------------------------------------------------------------------
# DES vs analytic on random instances
# ---------------------------------------------------------------------------------------
def random_plans(seed: int, n_random: int = 2) -> list[tuple[Any, Plan]]:
    """Scheduler plans plus random assignments (a few stages) provisioned by PlacementSpace."""
    out = scheduler_plans(seed)
    prob = random_problem(seed, n_layers=(3, 6))
    space = PlacementSpace(prob)
    rng = np.random.default_rng(seed)
    for _ in range(n_random):
        cuts = sorted(rng.choice(np.arange(1, space.L), size=min(space.L - 1, 2), replace=False))
        a = np.empty(space.L, dtype=int)
        for lo, hi in zip([0, *cuts], [*cuts, space.L]):
            a[lo:hi] = rng.integers(space.K)
        try:
            out.append((prob, space.to_plan(a, "random")))
        except HetsimError:
            pass
    return [(p, pl) for p, pl in out if len(pl.stages) > 1]


# derandomize: CI draws the same seeds every run (a random draw must not make CI flaky).
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(seed=st.integers(0, 10_000))
def test_des_agrees_with_analytic_within_5_percent(seed: int) -> None:
    _check_agreement(seed)


@pytest.mark.parametrize("seed", [3457, 579, 274, 768])
def test_des_agrees_where_serial_ps_sync_meets_a_busy_pool(seed: int) -> None:
    # Seeds where a non-pipelined plan's PS messages queue on the shared PS pool. Served
    # oldest iteration first, a stage's small serial pull/push waited behind other stages'
    # large ones: 3457's greedy plan (cpu-2c x2 | cpu-16c x7 | cpu-2c x11) ran 10.2% below
    # the model, 579's (t4 x5 | cpu-16c x6) 13.9%, 274's exact plan 5.2%. Shortest message
    # first (sim/des/pipeline.py) keeps the stall to the message's own NIC time.
    _check_agreement(seed)


def _check_agreement(seed: int) -> None:
    for prob, plan in random_plans(seed):
        w0 = default_in_flight(pipeline_model(prob, plan))[0]
        prob = dataclasses.replace(prob, job=dataclasses.replace(prob.job, iterations=4 * w0 + 200))
        want = evaluate_analytic(prob, plan).throughput_sps
        with time_limit(30):
            got = simulate_pipeline(prob, plan, trace=False).extra["steady_throughput_sps"]
        assert got == pytest.approx(want, rel=0.05), (seed, [(s.device_type, len(s.replicas)) for s in plan.stages])


# ---------------------------------------------------------------------------------------
# The CLI with a placement scheduler
# ---------------------------------------------------------------------------------------
def _profile_json(p: Any) -> str:
    return json.dumps(p.model_dump(mode="json", by_alias=True, exclude_none=True))


def placed_case(tmp_path: Path, iterations: int) -> Path:
    """The two-layer model on 2 fast and 8 slow devices, objective cost with
    throughput_min 2500 (the case below): profiles, model and c.yaml under ``tmp_path``."""
    (tmp_path / "p").mkdir()
    for prof in (profile("fast", peak=1e13, mem_bw=1e15, nic=1e9, price=30.0), SLOW, PS):
        (tmp_path / "p" / f"{prof.name}.json").write_text(_profile_json(prof))
    (tmp_path / "m.yaml").write_text(yaml.safe_dump({"name": "two", "layers": [
        {"name": "L0", "op": "gemm", "fwd_flops": 1e9, "bwd_flops": 2e9, "param_bytes": 1e5,
         "activation_bytes": 1e3},
        {"name": "L1", "op": "gemm", "fwd_flops": 5e8, "bwd_flops": 1e9, "param_bytes": 1e5,
         "activation_bytes": 1e3}]}))
    cfg = {"name": "placed", "seed": 3, "profiles": ["p/"],
           "cluster": {"devices": [{"type": "fast", "count": 2}, {"type": "slow", "count": 8}],
                       "ps": {"shards": 1, "type": "ps"}, "network": {"latency_us": 10}},
           "job": {"model": {"file": "m.yaml"}, "global_batch": 8, "iterations": iterations, "pipeline": True},
           "objective": {"minimize": "cost", "throughput_min": 2500},
           "scheduler": {"name": "exact"}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    return tmp_path / "c.yaml"


def test_cli_simulate_placement_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # L0 3e9 FLOPs per sample, L1 1.5e9; a fast replica costs 30 $/h. throughput_min 2500,
    # B = 8; cost per sample ~ (rate incl. the 1 $/h shard) / throughput:
    #   all on fast: one replica 8 / (8 * 4.5e-4) = 2222 < 2500; two 4444: 61 / 4444 = 0.0137
    #   L0 on fast (3333) + L1 on 4 slow (2 samples: 8 / 3e-3 = 2667): 35 / 2667 = 0.0131
    #   L0 on 8 slow (2667) + L1 on fast (6667): 39 / 2667 = 0.0146; all on slow: infeasible.
    placed_case(tmp_path, iterations=80)
    s = {}
    for ev in ("des", "analytic"):
        out = tmp_path / ev
        rc = main(["simulate", str(tmp_path / "c.yaml"), "--evaluator", ev, "--out", str(out)])
        assert rc == 0, capsys.readouterr().err
        plan = json.loads((out / "plan.json").read_text())
        assert [(x["layers"], x["device_type"], len(x["replicas"])) for x in plan["stages"]] == \
            [([0, 1], "fast", 1), ([1, 2], "slow", 4)]
        s[ev] = json.loads((out / "summary.json").read_text())
        assert s[ev]["evaluator"] == ev and s[ev]["scheduler"] == "exact" and s[ev]["iterations"] == 80
        assert set(s[ev]["utilization"]) == {"fast:0", "slow:0", "slow:1", "slow:2", "slow:3", "ps:0"}
        assert (out / "trace.json").is_file() == (ev == "des")  # the analytic evaluator has no timeline
    # L1 on 4 slow replicas (2 samples each): 8 / (2 * 1.5e-3) samples/s
    assert s["analytic"]["throughput_sps"] == pytest.approx(8 / 3e-3, rel=1e-9)
    assert s["analytic"]["placement"]["throughput_sps"] == pytest.approx(8 / 3e-3, rel=1e-9)
    assert s["des"]["steady_throughput_sps"] == pytest.approx(8 / 3e-3, rel=0.01)
    assert s["des"]["cost_usd"] == pytest.approx(s["analytic"]["cost_usd"], rel=0.1)
    assert any(e["ph"] == "X" for e in json.loads((tmp_path / "des" / "trace.json").read_text())["traceEvents"])
