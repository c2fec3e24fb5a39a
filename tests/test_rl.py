"""The `rl` scheduler (HeterPS method): environment, policy files, scheduler, training CLI.

Hand case: two_layer_problem of tests/test_placement.py (throughput_min 2000
samples/s). Layer L0 alone on four `slow` replicas reaches 8 / 6.006e-3 =
1332 samples/s, so `slow` is masked for L0; L1 is tiny and fits anywhere.
The cheapest plan is both layers on one `fast` replica, which is also the
reference plan (best single type), so that episode's reward is exactly -1.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import gymnasium
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import schedulers
import schedulers.rl  # noqa: F401  (registers hetsim/Placement-v0)
from experiments.cli import main
from hardware_profiles.errors import HetsimError
from schedulers.rl.env import MAX_TYPES, Instance, PlacementEnv
from schedulers.rl.scheduler import DEFAULT_POLICY, RL, load_policy
from schedulers.rl.tblog import crc32c, read_scalars
from schedulers.rl.train import TrainConfig, train
from sim.instances import random_problem
from sim.plan import check_plan
from sim.problem import Objective
from tests.test_placement import two_layer_problem

ROOT = Path(__file__).resolve().parents[1]


def run_episode(env: PlacementEnv, seed: int, action_seed: int = 0) -> list:
    """(obs, mask, reward) of every step, actions drawn uniformly among the valid ones."""
    rng = np.random.default_rng(action_seed)
    obs, _ = env.reset(seed=seed)
    trace, done = [], False
    while not done:
        mask = env.action_masks()
        obs2, r, done, trunc, _ = env.step(int(rng.choice(np.flatnonzero(mask))))
        trace.append((obs, mask, r))
        obs = obs2
        assert not trunc
    return trace


@pytest.mark.parametrize("fixed", [False, True])
def test_env_passes_gymnasium_and_sb3_checks(fixed):
    env = PlacementEnv(random_problem(7) if fixed else None)
    gym_check_env(env, skip_render_check=True)
    sb3_check_env(PlacementEnv(random_problem(7) if fixed else None))


def test_registered_id_makes_the_env():
    env = gymnasium.make("hetsim/Placement-v0")
    assert isinstance(env.unwrapped, PlacementEnv)
    assert env.action_space == gymnasium.spaces.Discrete(MAX_TYPES)


def test_same_seed_same_episode_and_another_seed_another():
    a, b = run_episode(PlacementEnv(), 11), run_episode(PlacementEnv(), 11)
    assert len(a) == len(b)
    for (oa, ma, ra), (ob, mb, rb) in zip(a, b):
        assert np.array_equal(oa, ob) and np.array_equal(ma, mb) and ra == rb
    c = run_episode(PlacementEnv(), 12)
    assert len(c) != len(a) or not np.array_equal(c[0][0], a[0][0])


def test_masks_exclude_padding_and_keep_one_action():
    env = PlacementEnv()
    for seed in range(5):
        for obs, mask, _ in run_episode(env, seed):
            K = env.episode.inst.space.K
            assert K < MAX_TYPES and not mask[K:].any() and mask[:K].any()
            assert env.observation_space.contains(obs)


def test_hand_case_masks_and_reward():
    prob = two_layer_problem(2000.0)
    env = PlacementEnv(prob)
    names = env.episode.inst.space.type_names if env.episode else Instance(prob).space.type_names
    slow, fast = names.index("slow"), names.index("fast")
    env.reset(seed=0)
    expect0 = np.zeros(MAX_TYPES, bool)
    expect0[fast] = True
    assert np.array_equal(env.action_masks(), expect0)
    env.step(fast)
    expect1 = np.zeros(MAX_TYPES, bool)
    expect1[[slow, fast]] = True
    assert np.array_equal(env.action_masks(), expect1)
    _, r, done, _, info = env.step(fast)
    assert done and info["feasible"] and r == pytest.approx(-1.0, abs=1e-12)
    assert list(info["assignment"]) == [fast, fast]


def test_mask_allows_a_type_whose_stage_fits_only_once_longer():
    """L0 sends 1e6 activation bytes per sample. On `slow` (1 GB/s NICs) a stage ending at
    L0 moves them at most 4 x 1000 samples/s with 4 replicas, short of the 10,000 target,
    while a stage holding both layers has no boundary and computes 6e6 FLOPs per sample at
    1e12 FLOP/s: `slow` is valid for L0 as the start of a two-layer stage (a mask of the
    one-layer stage alone would allow only `fast`, whose 10 GB/s NIC carries L0 alone)."""
    from tests.helpers_eval import dense, model, problem
    from tests.test_placement import FAST, SLOW

    mdl = model(dense("L0", 0.0, 1e6, 2e6, activation_bytes=1e6), dense("L1", 0.0, 1e6, 2e6))
    prob = dataclasses.replace(
        problem([SLOW] * 4 + [FAST] * 4, [SLOW], mdl, global_batch=8, pipeline=True, iterations=1000,
                worker_nic=[1e9] * 4 + [1e10] * 4),
        objective=Objective("cost", throughput_min=1e4))
    env = PlacementEnv(prob)
    env.reset(seed=0)
    space = env.episode.inst.space
    slow, fast = space.type_names.index("slow"), space.type_names.index("fast")
    assert space.n[space.seg_index[0, 1], slow] == 0 and space.n[space.seg_index[0, 2], slow] == 1
    both = np.zeros(MAX_TYPES, bool)
    both[[slow, fast]] = True
    assert np.array_equal(env.action_masks(), both)
    env.step(slow)
    assert np.array_equal(env.action_masks(), both)
    _, _, done, _, info = env.step(slow)
    # slow: 1 replica + PS at 2 USD/h for 166,667 samples/s; the reference (fast) 6 USD/h for 1,666,667
    assert done and info["feasible"] and info["cost_ratio"] == pytest.approx(10 / 3)


def test_too_many_types_is_refused():
    with pytest.raises(HetsimError, match="at most 2"):
        Instance(random_problem(1, n_types=3), max_types=2)


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    out = tmp_path_factory.mktemp("rl") / "tiny.zip"
    cfg = TrainConfig(timesteps=256, n_envs=2, n_steps=64, batch_size=64, n_epochs=2, pool_size=8)
    meta = train(out, cfg, progress=False)
    return out, meta


def test_tiny_training_writes_policy_logs_and_tensorboard_events(tiny_policy):
    out, meta = tiny_policy
    assert out.is_file() and out.with_suffix(".json").is_file()
    assert meta["timesteps"] == 256
    assert (Path(meta["log_dir"]) / "progress.csv").is_file()
    tags = {tag for _, tag, _ in read_scalars(meta["tensorboard_events"])}
    assert {"time/fps", "train/loss", "rollout/feasible_share"} <= tags


def test_saved_policy_round_trips_with_the_same_actions(tiny_policy, tmp_path):
    out, _ = tiny_policy
    model = load_policy(str(out))
    copy = tmp_path / "copy.zip"
    model.save(str(copy))
    again = load_policy(str(copy))
    env = PlacementEnv()
    for seed in range(3):
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            m = env.action_masks()
            a1, _ = model.predict(obs, action_masks=m, deterministic=True)
            a2, _ = again.predict(obs, action_masks=m, deterministic=True)
            assert int(a1) == int(a2) and m[int(a1)]
            obs, _, done, _, _ = env.step(int(a1))


def test_default_policy_ships_small():
    assert DEFAULT_POLICY.is_file() and DEFAULT_POLICY.stat().st_size < 2 * 2**20


@pytest.mark.parametrize("samples", [0, 4])
def test_rl_scheduler_plans_are_valid(samples):
    prob = two_layer_problem(2000.0)
    plan = schedulers.make("rl", {"samples": samples}).plan(prob)
    check_plan(plan, prob)
    assert [(s.first_layer, s.end_layer, s.device_type, len(s.replicas)) for s in plan.stages] == \
        [(0, 2, "fast", 1)]
    assert plan.options["rl"]["fallback"] is None and plan.options["rl"]["samples"] == samples
    for seed in (2_000_000_001, 2_000_000_002, 2_000_000_005):
        p = random_problem(seed)
        check_plan(RL(samples=samples).plan(p), p)


def test_scheduler_falls_back_honestly(monkeypatch):
    import schedulers.rl.scheduler as mod

    prob = two_layer_problem(2000.0)
    slow = Instance(prob).space.type_names.index("slow")
    # a policy that puts everything on `slow`, which cannot carry L0: greedy's plan, recorded
    monkeypatch.setattr(mod, "rollout", lambda model, inst, samples, seed=0, temperature=1.0: np.full((1 + samples, 2), slow))
    plan = RL(samples=2).plan(prob)
    check_plan(plan, prob)
    assert plan.options["rl"]["fallback"] == "greedy"
    assert plan.options["rl"]["feasible_episodes"] == 0
    assert [(s.device_type, len(s.replicas)) for s in plan.stages] == [("fast", 1)]


def test_importing_schedulers_does_not_import_torch():
    code = "import sys, schedulers; assert 'rl' in schedulers.names(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_train_rl_cli(tmp_path, capsys):
    out = tmp_path / "p.zip"
    rc = main(["train-rl", "--random", "--timesteps", "64", "--n-envs", "1", "--pool-size", "4",
               "--out", str(out), "--quiet"])
    assert rc == 0 and out.is_file()
    assert "wrote" in capsys.readouterr().out
    assert main(["train-rl", "--timesteps", "64", "--out", str(out)]) == 2   # neither CONFIG nor --random


def test_train_rl_cli_fine_tunes_on_a_config(tmp_path, capsys):
    import yaml

    cfg = {"name": "small", "cluster": {"devices": [{"type": "t4", "count": 2}, {"type": "cpu-8c", "count": 4}],
                                        "network": {"bandwidth_gbps": 10}},
           "job": {"model": "mlp", "global_batch": 64, "iterations": 6},
           "objective": {"minimize": "cost", "throughput_min": 100.0}}
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "ft.zip"
    rc = main(["train-rl", str(path), "--fine-tune", "--timesteps", "64", "--n-envs", "1", "--out", str(out),
               "--quiet"])
    assert rc == 0 and out.is_file()
    text = capsys.readouterr().out
    assert "fine-tune" in text and "small: rl " in text and "greedy " in text


def test_crc32c_check_value():
    assert crc32c(b"123456789") == 0xE3069283
