"""`rl-dag`: the DAG scheduling environment hetsim/DagSchedule-v0, its trainer and scheduler."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import schedulers
import schedulers.rl  # noqa: F401  (registers hetsim/DagSchedule-v0)
from hardware_profiles.board import load_board
from schedulers.dag import energy_schedule, heft_schedule, make_dag
from schedulers.rl.dag_env import (
    MAX_UNITS,
    DagEpisode,
    DagInstance,
    DagScheduleEnv,
    draw_costs,
    obs_size,
)
from schedulers.rl.dag_scheduler import DEFAULT_DAG_POLICY, RLDag
from schedulers.rl.dag_train import DagTrainConfig, train_dag
from schedulers.rl.tblog import read_scalars
from sim.dag import DagCosts, DagProblem, dag_costs
from sim.instances import random_graph

INF = math.inf


def board_problem(seed: int, board: str, factor: float, n_tasks: int = 7) -> DagProblem:
    """A random graph whose deadline is ``factor`` x HEFT's makespan in the board's first mode."""
    b = load_board(board)
    g = random_graph(seed, n_tasks)
    c0 = dag_costs(DagProblem(g, b, 1.0, 1.0), next(iter(b.power_modes)))
    hm = heft_schedule(c0).makespan_s(c0)
    return DagProblem(g, b, period_s=1.5 * factor * hm, deadline_s=factor * hm)


def test_env_passes_gymnasium_and_sb3_checkers():
    env = gymnasium.make("hetsim/DagSchedule-v0").unwrapped
    assert isinstance(env, DagScheduleEnv)
    gym_check_env(env)
    sb3_check_env(DagScheduleEnv())
    obs, info = env.reset(seed=0)
    assert obs.shape == (obs_size(MAX_UNITS),) and env.action_space.n == MAX_UNITS
    assert 6 <= info["tasks"] <= 20


def _episode(env: DagScheduleEnv, seed: int) -> tuple[list[np.ndarray], tuple[int, ...], float]:
    """Observations, units and reward of one episode whose valid actions are drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    seen, done = [obs], False
    while not done:
        obs, reward, done, _, info = env.step(int(rng.choice(np.flatnonzero(env.action_masks()))))
        seen.append(obs)
    return seen, info["units"], reward


def test_same_seed_same_episode_twice():
    a, b = _episode(DagScheduleEnv(), 3), _episode(DagScheduleEnv(), 3)
    assert len(a[0]) == len(b[0]) and all(np.array_equal(x, y) for x, y in zip(a[0], b[0]))
    assert a[1] == b[1] and a[2] == b[2]
    c = _episode(DagScheduleEnv(), 4)
    assert len(c[0]) != len(a[0]) or any(not np.array_equal(x, y) for x, y in zip(a[0], c[0]))


@pytest.mark.parametrize("prune", [False, True])
def test_masks_are_runnable_units_and_invalid_actions_are_replaced(prune):
    env = DagScheduleEnv(prune=prune)
    for seed in range(5):
        env.reset(seed=seed)
        ep = env.episode
        assert ep is not None
        c = ep.inst.c
        while not ep.done:
            m = env.action_masks()
            runnable = np.isfinite(c.time_s[ep.task])
            assert not m[len(c.units):].any() and m.any()
            if prune:
                assert not (m[: len(c.units)] & ~runnable).any()
            else:
                assert np.array_equal(m[: len(c.units)], runnable)
            bad = [u for u in range(MAX_UNITS) if not m[u]]
            task = ep.task
            _, _, _, _, info = env.step(bad[0] if bad else int(np.flatnonzero(m)[0]))
            if bad:
                assert info["invalid_action"] == bad[0]
            assert math.isfinite(c.time_s[task, ep.actions[-1]])


def test_policy_actions_respect_the_mask():
    from schedulers.rl.scheduler import load_policy

    model = load_policy(str(DEFAULT_DAG_POLICY))
    env = DagScheduleEnv()
    for seed in range(3):
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            m = env.action_masks()
            for det in (True, False):
                a, _ = model.predict(obs, action_masks=m, deterministic=det)
                assert m[int(a)]
            obs, _, done, _, info = env.step(int(a))
            assert "invalid_action" not in info


def test_episode_places_tasks_exactly_as_the_list_scheduler():
    """Given the energy heuristic's units, an episode rebuilds its schedule, start times included."""
    for seed in (1, 2, 3):
        c = draw_costs(seed)
        ref = energy_schedule(c)
        ep = DagEpisode(DagInstance(c))
        while not ep.done:
            ep.step(ref.unit[ep.task])
        assert ep.plan is not None
        assert ep.plan.unit == ref.unit and ep.plan.start_s == ref.start_s


def _one_task(deadline_s: float) -> DagCosts:
    """One task: 1 s on unit 0 at 10 W busy, 4 s on unit 1 at 1 W; idle 2 W over a 5 s period."""
    return DagCosts.from_tables([[1.0, 4.0]], {}, busy_w=[10.0, 1.0], idle_w=2.0, period_s=5.0, deadline_s=deadline_s)


def test_reward_by_hand():
    def run(deadline_s: float, unit: int) -> dict:
        env = DagScheduleEnv(_one_task(deadline_s), prune=False)
        env.reset(seed=0)
        _, reward, done, _, info = env.step(unit)
        assert done and info["reward"] == reward and info["units"] == (unit,)
        return info

    # the energy heuristic takes unit 1 (10 + 4 J): that is -1, unit 0 (10 + 10 J) -20/14
    assert run(5.0, 1)["reward"] == pytest.approx(-1.0)
    assert run(5.0, 0)["reward"] == pytest.approx(-20 / 14) and run(5.0, 0)["feasible"]
    # deadline 3 s: the heuristic needs unit 0 (20 J); unit 1 (14 J) misses by 1/3: -14/20 - (1 + 4/3)
    late = run(3.0, 1)
    assert not late["feasible"] and late["miss"] == pytest.approx(1 / 3)
    assert late["reward"] == pytest.approx(-14 / 20 - 1 - 4 / 3)
    assert run(3.0, 0)["reward"] == pytest.approx(-1.0)


def test_pruning_drops_only_units_that_miss_for_certain():
    def mask(deadline_s: float, period_s: float = 5.0) -> list[bool]:
        c = _one_task(deadline_s)
        env = DagScheduleEnv(DagCosts.from_tables(c.time_s, {}, c.busy_w, c.idle_w, period_s, deadline_s))
        env.reset(seed=0)
        return env.action_masks()[:2].tolist()

    assert mask(5.0) == [True, True]
    assert mask(4.0) == [True, True]          # finishing at the deadline meets it
    assert mask(3.0) == [True, False]         # 4 s on unit 1 misses a 3 s deadline
    assert mask(5.0, period_s=3.0) == [True, False]
    assert mask(0.5) == [True, True]          # nothing meets it: both stay valid
    # a chain a -> b: a on unit 1 (4 s) leaves b (>= 1 s) no room before a 4.5 s deadline
    c = DagCosts.from_tables([[1.0, 4.0], [1.0, 1.0]], {(0, 1): 0.0}, deadline_s=4.5)
    env = DagScheduleEnv(c)
    env.reset(seed=0)
    assert env.action_masks()[:2].tolist() == [True, False]


def test_one_task_with_a_masked_unit_goes_to_the_other():
    for row, unit in (([INF, 2.0], 1), ([2.0, INF], 0)):
        c = DagCosts.from_tables([row], {}, busy_w=[1.0, 5.0], idle_w=1.0, period_s=4.0, deadline_s=4.0)
        env = DagScheduleEnv(c)
        env.reset(seed=0)
        assert env.action_masks().tolist() == [i == unit for i in range(MAX_UNITS)]
        for samples in (0, 4):
            plan = RLDag(samples=samples).plan_costs(c)
            plan.check(c)
            assert plan.unit == (unit,) and plan.start_s == (0.0,)


@pytest.mark.parametrize(("seed", "board", "factor"), [(11, "agx-orin-32", 1.0), (12, "orin-nano-8", 1.5),
                                                        (13, "agx-xavier", 2.0), (14, "rpi4", 1.2)])
def test_scheduler_plans_are_valid_and_repeatable(seed, board, factor):
    pr = board_problem(seed, board, factor, n_tasks=9)
    sched = make_dag("rl-dag", {"samples": 4})
    plan = sched.plan(pr)
    c = dag_costs(pr, plan.mode)
    plan.check(c)
    assert plan.scheduler == "rl-dag" and plan.mode in pr.allowed_modes
    assert sched.seconds > 0 and sched.info["episodes"] == 5 * len(pr.allowed_modes)
    assert make_dag("rl-dag", {"samples": 4}).plan(pr) == plan
    # the best of its episodes: never above the deterministic decode's own choice
    det = make_dag("rl-dag", {"samples": 0}).plan(pr)
    cd = dag_costs(pr, det.mode)
    if det.feasible(cd):
        assert plan.feasible(c) and plan.energy_j(c) <= det.energy_j(cd) * (1 + 1e-9)


def test_registered_lazily_as_a_dag_scheduler():
    code = ("import sys, schedulers; assert 'rl-dag' in schedulers.base.names('dag'); "
            "assert 'rl-dag' not in schedulers.names(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert "rl-dag" in schedulers.base.names("dag")
    with pytest.raises(Exception, match="no policy file"):
        make_dag("rl-dag", {"policy": "/nonexistent.zip"})


def test_default_policy_ships_small_with_its_recipe():
    assert DEFAULT_DAG_POLICY.is_file() and DEFAULT_DAG_POLICY.stat().st_size < 2 * 2**20
    meta = json.loads(DEFAULT_DAG_POLICY.with_suffix(".json").read_text())
    assert meta["timesteps"] > 0 and meta["wall_s"] < 15 * 60 and "seed" in meta["config"]


def test_tiny_training_writes_policy_logs_and_tensorboard_events(tmp_path):
    out = tmp_path / "tiny.zip"
    cfg = DagTrainConfig(timesteps=256, n_envs=2, n_steps=64, batch_size=64, n_epochs=1, pool_size=3,
                         bc_epochs=1, bc_milp_max_tasks=0)
    meta = train_dag(out, cfg, progress=False)
    assert out.is_file() and out.with_suffix(".json").is_file()
    assert meta["timesteps"] == 256 and meta["warm_start"]["instances"] == 3
    tags = {tag for _, tag, _ in read_scalars(meta["tensorboard_events"])}
    assert {"time/fps", "train/loss", "rollout/feasible_share"} <= tags
    c = DagCosts.from_tables([[INF, 2.0]], {}, busy_w=[1.0, 5.0], idle_w=1.0, period_s=4.0, deadline_s=4.0)
    assert RLDag(str(out), samples=2).plan_costs(c).unit == (1,)
