"""Problem B (HeterPS placement): the steady-state model, provisioning and the placement schedulers.

Hand-computed cases use round-number profiles (tests/helpers_eval.py): no
launch overhead, memory far faster than compute, so a layer's time is
flops / peak. Property tests compare `exact` with `bruteforce` (every
placement) on small random instances (sim/instances.py).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schedulers import make
from schedulers.exact import Exact, solve
from schedulers.placement import Bruteforce, Genetic, Greedy
from sim.instances import random_problem
from sim.placement import PlacementInfeasible, PlacementSpace
from sim.plan import check_plan
from sim.problem import Objective
from tests.helpers_eval import dense, model, problem, profile

SLOW = profile("slow", peak=1e12, mem_bw=1e15, kind="cpu", price=1.0, idle_w=10, active_w=60)
FAST = profile("fast", peak=1e13, mem_bw=1e15, kind="gpu", price=5.0, idle_w=20, active_w=220)


def two_layer_problem(tmin: float, counts: int = 4):
    """L0: 1e9/2e9 FLOPs per sample (fwd/bwd), L1: 1e6/2e6; no parameters, no activations."""
    mdl = model(dense("L0", 0.0, 1e9, 2e9), dense("L1", 0.0, 1e6, 2e6))
    p = problem([SLOW] * counts + [FAST] * counts, [SLOW], mdl, global_batch=8, pipeline=True,
                iterations=1000)
    return dataclasses.replace(p, objective=Objective("cost", throughput_min=tmin))


def test_stage_throughput_and_provisioning_by_hand():
    space = PlacementSpace(two_layer_problem(2000.0))
    slow, fast = space.type_names.index("slow"), space.type_names.index("fast")
    whole = space.seg_index[0, 2]
    # all on slow: n replicas, largest share ceil(8/n), 3.003e9 FLOPs per sample at 1e12
    for n in (1, 2, 4):
        b = -(-8 // n)
        assert space.stage_tput[whole, slow, n - 1] == pytest.approx(8 / (b * 3.003e-3), rel=1e-12)
    # 4 slow replicas reach 8 / 6.006e-3 = 1332 < 2000: no provisioning on slow
    assert space.n[whole, slow] == 0 and np.isinf(space.rate[whole, slow])
    # one fast replica: 8 / (8 * 3.003e-4) = 3330.0 >= 2000
    assert space.n[whole, fast] == 1
    assert space.tput[whole, fast] == pytest.approx(8 / (8 * 3.003e-4), rel=1e-12)
    ev = space.evaluate_one(np.array([fast, fast]))
    T = 8 / (8 * 3.003e-4)
    elapsed = 8000 / T
    assert ev["feasible"] and ev["throughput_sps"] == pytest.approx(T, rel=1e-12)
    # one fast replica at 5 $/h plus the PS shard (slow profile) at 1 $/h
    assert ev["cost_usd"] == pytest.approx(6.0 * elapsed / 3600, rel=1e-12)
    # busy all the time (T equals its compute rate): active 220 W; the PS idles at 10 W
    assert ev["energy_j"] == pytest.approx((220 + 10) * elapsed, rel=1e-9)
    # L0 on fast, L1 on slow: stages 3333.3 and 333333 samples/s; rate 5 + 1 + PS 1
    mixed = space.evaluate_one(np.array([fast, slow]))
    assert mixed["throughput_sps"] == pytest.approx(8 / (8 * 3e-4), rel=1e-12)
    assert mixed["rate_usd_h"] == pytest.approx(7.0)


@pytest.mark.parametrize("name", ["exact", "bruteforce", "greedy", "genetic", "gpu_only"])
def test_every_scheduler_finds_the_hand_optimum(name):
    prob = two_layer_problem(2000.0)
    plan = make(name).plan(prob)
    check_plan(plan, prob)
    assert [(s.first_layer, s.end_layer, s.device_type, len(s.replicas)) for s in plan.stages] == [(0, 2, "fast", 1)]


def test_cpu_only_infeasible_names_the_bottleneck():
    with pytest.raises(PlacementInfeasible, match="cpu_only"):
        make("cpu_only").plan(two_layer_problem(2000.0))
    # below 1332 samples/s four slow replicas suffice
    plan = make("cpu_only").plan(two_layer_problem(1000.0))
    assert [(s.device_type, len(s.replicas)) for s in plan.stages] == [("slow", 4)]


def test_unreachable_target_names_the_layer():
    # L0 alone reaches at most 8 / (2 * 3e-4) = 13333 samples/s (4 fast replicas, 2 samples each)
    with pytest.raises(PlacementInfeasible, match=r"layer 'L0' reaches at most 1\.333e\+04"):
        make("exact").plan(two_layer_problem(20000.0))


def test_vectorised_evaluation_equals_one_by_one():
    space = PlacementSpace(random_problem(3, n_layers=8, n_types=3))
    A = np.random.default_rng(0).integers(0, space.K, (200, space.L))
    ev = space.evaluate(A)
    for p in range(0, 200, 17):
        one = space.evaluate_one(A[p])
        assert one["cost_usd"] == ev.cost_usd[p] or (np.isinf(one["cost_usd"]) and np.isinf(ev.cost_usd[p]))
        assert one["throughput_sps"] == ev.throughput_sps[p]
        assert one["feasible"] == bool(ev.feasible[p])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), tight=st.booleans())
def test_exact_equals_bruteforce(seed, tight):
    counts = (1, 3) if tight else (2, 16)
    frac = (0.2, 0.9) if tight else (0.05, 0.6)
    prob = random_problem(seed, n_layers=(2, 6), n_types=(2, 3), counts=counts, throughput_frac=frac)
    space = PlacementSpace(prob)
    brute = Bruteforce().search(space, "cost")
    res = solve(space, time_limit_s=30)
    if brute is None or not space.evaluate(brute[None, :]).feasible[0]:
        assert res.assignment is None
        return
    best = space.evaluate(brute[None, :]).cost_usd[0]
    # the bound is valid and the placement no better than the optimum; proven means equal
    assert res.lower_bound_usd <= best * (1 + 1e-9) and res.cost_usd >= best * (1 - 1e-9)
    if res.proven:
        assert res.cost_usd == pytest.approx(best, rel=1e-9)
    else:  # only placements held back by the PS bound leave a gap (T off the stage-throughput grid)
        every = np.array(list(itertools.product(range(space.K), repeat=space.L)))
        assert "ps" in space.evaluate(every).bottleneck
    # the heuristics never beat the optimum
    for sched in (Greedy(), Genetic(generations=20, seed=0)):
        a = sched.search(space, "cost")
        if a is not None:
            assert space.evaluate(a[None, :]).cost_usd[0] >= best * (1 - 1e-9)


def test_plans_tile_the_model_and_use_the_inventory():
    prob = random_problem(11, n_layers=12, n_types=4)
    plan = Exact(time_limit_s=30).plan(prob)
    check_plan(plan, prob)
    assert plan.options["exact"]["gap"] >= 0
    assert plan.options["placement"]["predicted"]["feasible"]


def test_genetic_is_deterministic_per_seed():
    space = PlacementSpace(random_problem(5, n_layers=10, n_types=4))
    a = Genetic(generations=30, seed=7).search(space, "cost")
    b = Genetic(generations=30, seed=7).search(space, "cost")
    assert a is not None and np.array_equal(a, b)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000))
def test_inventory_dp_equals_milp(seed):
    """Where the inventory binds, the DP with inventory state and the MILP find the same least rate."""
    from schedulers.exact import dp_min_rate, milp_min_rate, rc_dp_min_rate, usage

    space = PlacementSpace(random_problem(seed, n_layers=(6, 14), n_types=(2, 4), counts=(1, 4),
                                          throughput_frac=(0.2, 0.9)))
    allowed = space.n > 0
    _, a = dp_min_rate(space, allowed)
    if a is None:
        return
    binding = [int(k) for k in np.flatnonzero(usage(space, a) > space.counts)]
    r_milp, a_milp = milp_min_rate(space, allowed, None, time_limit_s=60)
    r_dp, a_dp = rc_dp_min_rate(space, allowed, list(range(space.K)))  # every type in the state
    assert (a_dp is None) == (a_milp is None)
    if a_dp is not None:
        assert r_dp == pytest.approx(r_milp, rel=1e-7)
        assert (usage(space, a_dp) <= space.counts).all()
    del binding


def test_sparse_tables_are_capped_one_by_one():
    """Two tables in one stage: a small one every batch saturates, a big one it does not.

    B = 1024, one id of 64 bytes per table and sample: table a (1e4 bytes) sends all of
    itself, table b (1e10 bytes) 1024 x 64 = 65,536 bytes; 75,536 bytes per iteration,
    not min(2 x 65,536, 1e4 + 1e10) = 131,072.
    """
    from tests.helpers_eval import sparse

    mdl = model(sparse("a", 1e4, 1, 64), sparse("b", 1e10, 1, 64))
    p = problem([FAST], [SLOW], mdl, global_batch=1024, pipeline=True)
    space = PlacementSpace(p)
    seg = space.seg_index[0, 2]
    assert space.ps_load[seg, 0, 0] == pytest.approx(75_536 / 1024, rel=1e-12)


def ps_bound_problem(seed: int, squeeze: float, tight: bool):
    """A small random instance whose PS shards' NICs are cut to ``squeeze`` times what the
    lightest placement (least PS load) needs to meet throughput_min: the PS then holds
    back most placements, and the optimum often runs at T = T_ps."""
    from schedulers.exact import dp_min_rate

    prob = random_problem(seed, n_layers=(2, 6), n_types=(2, 3), counts=(1, 3) if tight else (2, 16),
                          throughput_frac=(0.2, 0.9) if tight else (0.05, 0.6))
    space = PlacementSpace(prob)
    p_min, _ = dp_min_rate(space, space.n > 0, space.ps)
    shards = prob.cluster.shards
    nic = max(p_min, 1.0) * space.target * squeeze / len(shards)
    cluster = dataclasses.replace(prob.cluster, shards=tuple(dataclasses.replace(s, nic_bw_Bps=nic) for s in shards))
    return dataclasses.replace(prob, cluster=cluster)


@pytest.mark.parametrize("squeeze", [1.05, 1.5, 3.0])
def test_exact_proves_the_bruteforce_optimum_when_the_ps_binds(squeeze):
    """Proven, and the same cost as every placement enumerated, on 80 PS-bound instances
    per squeeze (40 seeds, loose and tight inventory). Seeds 9, 18, 31, 33, 36 and 39
    once ended with a gap: the discretised PS bound stuck below the incumbent's rate at
    the incumbent's own T, or HiGHS meeting the PS row only within its tolerance."""
    ps_optima = 0
    for seed, tight in itertools.product(range(40), (False, True)):
        space = PlacementSpace(ps_bound_problem(seed, squeeze, tight))
        brute = Bruteforce().search(space, "cost")
        res = solve(space, time_limit_s=60)
        ev = space.evaluate(brute[None, :]) if brute is not None else None
        if ev is None or not ev.feasible[0]:
            assert res.assignment is None and res.proven, (seed, tight)
            continue
        assert res.proven, (seed, tight, res.gap)
        assert res.cost_usd == pytest.approx(float(ev.cost_usd[0]), rel=1e-9), (seed, tight)
        ps_optima += ev.bottleneck[0] == "ps"
    assert ps_optima >= 20     # the PS sets T at the optimum in a good share of them


def test_rc_dp_with_ps_units_equals_enumeration():
    """The DP with inventory and a discretised PS resource: the least rate over every
    placement whose binding types fit the inventory and whose units fit the budget."""
    from schedulers.exact import rc_dp_min_rate, usage

    checked = 0
    for seed in range(30):
        space = PlacementSpace(ps_bound_problem(seed, 1.5, tight=True))
        allowed = space.n > 0
        units = np.floor(space.ps * 32 / max(float(space.ps.max()), 1e-300)).astype(int)
        every = np.array(list(itertools.product(range(space.K), repeat=space.L)))
        for budget in (8, 24, 64):
            binding = [0] if space.K > 1 else []
            r_dp, a_dp = rc_dp_min_rate(space, allowed, binding, (units, budget))
            best = np.inf
            for a in every:
                st = [(space.seg_index[j, i], k) for j, i, k in space.stages_of(a)]
                if all(allowed[s, k] for s, k in st) and sum(units[s, k] for s, k in st) <= budget \
                        and all(usage(space, a)[k] <= space.counts[k] for k in binding):
                    best = min(best, sum(space.rate[s, k] for s, k in st))
            assert (a_dp is None) == np.isinf(best), (seed, budget)
            if a_dp is not None:
                assert r_dp == pytest.approx(best, rel=1e-12)
                st = [(space.seg_index[j, i], k) for j, i, k in space.stages_of(a_dp)]
                assert sum(units[s, k] for s, k in st) <= budget
                assert sum(space.rate[s, k] for s, k in st) == pytest.approx(r_dp, rel=1e-12)
                checked += 1
    assert checked >= 40


# the proven optimum of two bench instances, as exact found it with the shipped profiles
# (GPU profiles fitted to published measurements, 2026-12-07)
@pytest.mark.parametrize(("seed", "cost_usd"), [(1012, 6.581950186186241), (1016, 67.85880177417368)])
def test_exact_proves_the_ps_bound_bench_instances(seed, cost_usd):
    """The two 60-layer x 8-type bench instances the PS holds back, once left unproven
    in 10 s with the datasheet GPU profiles."""
    res = solve(PlacementSpace(random_problem(seed, n_layers=60, n_types=8)), time_limit_s=60)
    assert res.proven and res.cost_usd == pytest.approx(cost_usd, rel=1e-9)
