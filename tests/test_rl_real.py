"""The `rl` policy on real models: layer grouping, real-model instances, DAgger's expert,
boundary refinement and the scheduler's repair (issue 40).

Hand cases: the two-layer problem of tests/test_placement.py, and a four-layer
chain for the boundary moves (their list is written out in full).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from schedulers.exact import solve
from schedulers.placement import Greedy, merge_repair, shift_descent, shift_moves
from schedulers.rl.dagger import completion_space, expert_action
from schedulers.rl.env import Episode, Instance, unit_features
from schedulers.rl.grouping import MAX_GROUPS, CoarseSpace, group_bounds, grouped
from schedulers.rl.scheduler import RL
from schedulers.rl.workloads import (
    SUITE_FLOORS,
    convnet,
    max_throughput,
    mlp,
    real_instance,
    recsys,
    retarget,
    suite,
    transformer,
)
from sim import zoo
from sim.instances import random_problem
from sim.placement import PlacementSpace
from sim.plan import check_plan
from sim.problem import Objective
from tests.helpers_eval import dense, model, problem
from tests.test_placement import FAST, SLOW, two_layer_problem


def six_layer_space(acts: list[float]) -> PlacementSpace:
    """Six equal layers (1e9/2e9 FLOPs per sample: equal work on every type, memory far
    faster than compute) with the given activation bytes, on the slow/fast profiles."""
    mdl = model(*(dense(f"L{i}", 0.0, 1e9, 2e9, activation_bytes=a) for i, a in enumerate(acts)))
    return PlacementSpace(problem([SLOW] * 4 + [FAST] * 4, [SLOW], mdl, global_batch=8, pipeline=True,
                                  iterations=1000))


@pytest.fixture(scope="module")
def resnet_case():
    """resnet50 (158 layers) on a drawn inventory, and its PlacementSpace."""
    got = real_instance(5, model=zoo.get("resnet50"))
    assert got is not None
    return got


def test_group_bounds_partition_the_layers(resnet_case):
    _, space = resnet_case
    b = group_bounds(space, 24)
    assert b[0] == 0 and b[-1] == space.L == 158 and b.size == 25
    assert np.all(np.diff(b) >= 1)
    small = PlacementSpace(random_problem(3, n_layers=10))
    assert np.array_equal(group_bounds(small, 24), np.arange(11))
    assert grouped(small, 24) is small


def test_group_bounds_by_hand():
    # equal activations score every cut 0: three groups of two layers balance the work exactly
    even = six_layer_space([1e3] * 6)
    assert group_bounds(even, 3).tolist() == [0, 2, 4, 6]
    # two groups; cut scores (log10 activation, scaled to [0, 1] between 1e2 and 1e6) weigh 0.5:
    # after L1 (1e4 B) 0.25, after L2 (1e6 B) 0.5, elsewhere 0. Imbalance 2 * (share - 1/2)^2 * 2:
    # cut at 3: 0 + 0.5; at 2: 0.111 + 0.25; at 4: 0.111 + 0 (the least); at 1 or 5: 0.444
    space = six_layer_space([1e2, 1e4, 1e6, 1e2, 1e2, 1e2])
    assert group_bounds(space, 2).tolist() == [0, 4, 6]
    cs = grouped(space, 2)
    assert isinstance(cs, CoarseSpace) and cs.L == 2
    assert cs.expand(np.array([0, 1])).tolist() == [0, 0, 0, 0, 1, 1]
    assert grouped(space, 6) is space


def test_grouped_placements_cost_what_their_expansion_costs(resnet_case):
    _, space = resnet_case
    cs = grouped(space, 24)
    assert isinstance(cs, CoarseSpace) and cs.L == 24 and cs.K == space.K
    rng = np.random.default_rng(0)
    A = rng.integers(0, cs.K, (200, cs.L))
    A[:cs.K] = np.arange(cs.K)[:, None]                     # single-type plans are feasible or not alike
    g, f = cs.evaluate(A), space.evaluate(cs.expand(A))
    assert np.array_equal(g.feasible, f.feasible)
    assert np.allclose(g.cost_usd[g.feasible], f.cost_usd[f.feasible], rtol=1e-12)
    assert np.allclose(g.throughput_sps, f.throughput_sps, rtol=1e-12)
    # a segment of groups is the full space's segment of the same layers
    s = cs.seg_index[3, 7]
    assert np.array_equal(cs.n[s], space.n[space.seg_index[cs.bounds[3], cs.bounds[7]]])


def test_grouped_optimum_is_a_layer_placement_no_cheaper_than_the_optimum():
    """vgg16 (39 layers) in 16 groups on a drawn 5-type inventory: the grouped optimum costs
    99.28 USD against the layer-level 98.26 (both proven)."""
    got = real_instance(1, model=zoo.get("vgg16"))
    assert got is not None
    space = got[1]
    cs = grouped(space, 16)
    full, coarse = solve(space, 60), solve(cs, 60)
    assert full.proven and coarse.proven
    assert coarse.cost_usd > full.cost_usd * 1.005
    assert space.evaluate(cs.expand(coarse.assignment[None, :])).cost_usd[0] == pytest.approx(coarse.cost_usd)
    plan = cs.to_plan(coarse.assignment, "x")
    check_plan(plan, got[0])
    assert plan.stages[-1].end_layer == 39


def test_unit_features_of_single_layers_are_per_layer_features():
    m = zoo.get("transformer")
    f = unit_features(m.layers, np.arange(len(m.layers) + 1))
    attn = [i for i, ly in enumerate(m.layers) if ly.op == "attention"][0]
    assert f[attn, 5:10].tolist() == [0, 0, 0, 0, 1] and f[attn, -1] == 0.0   # one-hot, size 1
    g = unit_features(m.layers, np.array([0, 2, len(m.layers)]))
    assert g.shape == (3, f.shape[1]) and np.all(g[2] == 0)
    assert g[0, -2] == 1.0                                  # the token embedding is sparse
    assert g[1, 5:10].sum() == pytest.approx(1.0)


def test_shift_moves_by_hand():
    space = PlacementSpace(random_problem(3, n_layers=4, n_types=2))
    a = np.array([0, 0, 1, 1])
    got = {tuple(x) for x in shift_moves(a, space)}
    # the one boundary (after layer 1) moves to 0, 1, 3 or 4
    assert got == {(1, 1, 1, 1), (0, 1, 1, 1), (0, 0, 0, 1), (0, 0, 0, 0)}
    assert shift_moves(np.zeros(4, dtype=int), space).shape == (0, 4)


def test_shift_descent_never_worsens_and_stops_at_a_local_optimum():
    for seed in range(5):
        space = PlacementSpace(random_problem(2_000_000_100 + seed, n_layers=12))
        g = Greedy().search(space, "cost")
        if g is None:
            continue
        before = space.evaluate(g[None, :]).cost_usd[0]
        r = shift_descent(space, g, "cost")
        after = space.evaluate(r[None, :]).cost_usd[0]
        assert after <= before
        moves = shift_moves(r, space)
        if moves.size:
            assert space.evaluate(moves).cost_usd.min() >= after


def test_merge_repair_reaches_a_feasible_plan_or_says_none():
    prob = two_layer_problem(2000.0)
    space = PlacementSpace(prob)
    slow, fast = space.type_names.index("slow"), space.type_names.index("fast")
    # slow cannot carry L0: merging L0's stage into L1's (fast) repairs it
    assert merge_repair(space, np.array([slow, fast]), "cost").tolist() == [fast, fast]
    assert merge_repair(space, np.array([slow, slow]), "cost") is None


def test_rl_repairs_then_falls_back_by_hand():
    space = PlacementSpace(two_layer_problem(2000.0))
    slow, fast = space.type_names.index("slow"), space.type_names.index("fast")
    # L0 on slow misses the floor; merging its stage into L1's (fast) repairs the placement
    info: dict = {"repaired": False, "fallback": None}
    got = RL.repair_or_fall_back(space, np.array([slow, fast]), "cost", 0, info)
    assert got.tolist() == [fast, fast] and info == {"repaired": True, "fallback": None}
    # one stage on slow has nothing to merge: greedy's plan (both layers on fast) stands in
    info = {"repaired": False, "fallback": None}
    got = RL.repair_or_fall_back(space, np.array([slow, slow]), "cost", 0, info)
    assert got.tolist() == [fast, fast] and info == {"repaired": False, "fallback": "greedy"}


def test_completion_space_keeps_the_prefix_and_its_optimum_follows_the_exact_one():
    prob = random_problem(2_000_000_007)
    inst = Instance(prob)
    opt = solve(inst.space, 30)
    assert opt.proven
    ep = Episode(inst)
    for i in range(inst.space.L):
        c = solve(completion_space(ep), 30)
        assert c.cost_usd == pytest.approx(opt.cost_usd, rel=1e-12)
        assert np.array_equal(c.assignment[:i], opt.assignment[:i])
        ep.step(int(opt.assignment[i]))


def test_expert_action_says_none_when_no_completion_meets_the_floor():
    prob = two_layer_problem(2000.0)
    inst = Instance(prob)
    slow, fast = inst.space.type_names.index("slow"), inst.space.type_names.index("fast")
    ep = Episode(inst)
    assert expert_action(ep, 5.0) == fast
    ep.step(slow)                                            # L0 on slow cannot be provisioned
    assert expert_action(ep, 5.0) is None


def test_real_instances_are_seeded_and_their_floor_is_feasible():
    a, b = real_instance(14), real_instance(14)
    assert a is not None and b is not None
    pa, sa = a
    pb, _ = b
    assert pa == pb
    fresh = PlacementSpace(pa)
    assert np.array_equal(sa.n, fresh.n) and np.array_equal(sa.rate, fresh.rate) and sa.target == fresh.target
    assert 2 <= sa.K <= 8 and any(k == "gpu" for k in sa.kinds)
    assert solve(grouped(fresh), 30).assignment is not None   # the floor lies below the grouped maximum


def test_max_throughput_brackets_feasibility():
    prob = two_layer_problem(2000.0)
    space = PlacementSpace(prob)
    top = max_throughput(space)
    # one fast replica carries both layers at 3330 samples/s; four reach 4 x that before the PS
    assert top > 3330.0
    assert space.target == 2000.0                           # left at the problem's own floor
    over = retarget(space, dataclasses.replace(prob, objective=Objective("cost", throughput_min=top * 1.1)))
    assert solve(over, 10).assignment is None
    at = retarget(space, dataclasses.replace(prob, objective=Objective("cost", throughput_min=top * 0.999)))
    assert solve(at, 10).assignment is not None               # and just below it one is


@pytest.mark.parametrize("family", [convnet, transformer, recsys, mlp])
def test_model_families_draw_valid_chains(family):
    for seed in range(4):
        m = family(np.random.default_rng(seed), family.__name__)
        assert len(m.layers) >= 5 and all(ly.activation_bytes > 0 for ly in m.layers)
        assert len({ly.name for ly in m.layers}) == len(m.layers)


def test_suite_is_fixed_and_covers_the_floors():
    s = suite(models=("mlp",), seeds=(3_000_000_001,))
    assert [p.name for p in s] == [f"suite-mlp-3000000001-f{f:g}" for f in SUITE_FLOORS]
    tmins = [p.objective.throughput_min for p in s]
    assert tmins == sorted(tmins) and tmins[1] / tmins[0] == pytest.approx(0.5 / 0.2)
    assert [p.objective for p in suite(models=("mlp",), seeds=(3_000_000_001,))] == [p.objective for p in s]


def test_rl_plans_a_real_model_within_the_floor(resnet_case):
    prob, _ = resnet_case
    plan = RL(samples=4).plan(prob)
    check_plan(plan, prob)
    info = plan.options["rl"]
    assert info["units"] == MAX_GROUPS and info["fallback"] is None    # the policy's plan, not greedy's
    pred = plan.options["placement"]["predicted"]
    assert pred["feasible"] and pred["throughput_sps"] >= prob.objective.throughput_min


def test_training_runs_the_dagger_rounds_after_the_warm_start(tmp_path):
    """train-rl --dagger-rounds 1: the sidecar's warm start records the cloning and one
    DAgger round with the states it labelled."""
    import json

    from experiments import cli

    out = tmp_path / "p.zip"
    assert cli.main(["train-rl", "--random", "--pool-size", "16", "--bc-instances", "16", "--dagger-rounds", "1",
                     "--timesteps", "256", "--n-envs", "2", "--out", str(out), "--quiet"]) == 0
    warm = json.loads(out.with_suffix(".json").read_text())["warm_start"]
    assert warm["steps"] > 0 and len(warm["dagger"]) == 1 and warm["dagger"][0]["labelled"] > 0
