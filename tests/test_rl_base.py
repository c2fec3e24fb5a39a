"""schedulers/rl/masked_env.py and training.py: the plumbing the `rl` and `rl-dag` stacks share,
on a toy environment whose every outcome is known by hand."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from schedulers.rl.masked_env import MaskedSlotEnv, log_ratio, observation_vector, padded_mask
from schedulers.rl.training import demonstrations


class Toy:
    """An instance of ``n`` steps for a policy of ``slots`` slots."""

    def __init__(self, slots: int = 4, n: int = 3) -> None:
        self.slots, self.n = slots, n


class ToyEpisode:
    """Three real slots of four; slot 0 is never valid; reward: minus the sum of the actions."""

    def __init__(self, inst: Toy) -> None:
        self.inst = inst
        self.actions: list[int] = []

    @property
    def done(self) -> bool:
        return len(self.actions) >= self.inst.n

    def action_mask(self) -> np.ndarray:
        return padded_mask(np.array([False, True, True]), self.inst.slots)

    def observation(self) -> np.ndarray:
        return observation_vector([np.array([float(len(self.actions))]), np.full(self.inst.slots, 0.5)])

    def step(self, action: int) -> None:
        self.actions.append(action)

    def outcome(self) -> dict[str, Any]:
        return {"reward": -float(sum(self.actions)), "feasible": True}


class ToyEnv(MaskedSlotEnv[Toy, ToyEpisode]):
    instance_kind = "Toy"
    slots_param = "slots"

    def __init__(self, fixed: Toy | None = None, pool: list[Toy] | None = None) -> None:
        super().__init__(4, (1, 1, 1), fixed, pool)

    def draw_instance(self) -> Toy:
        return Toy(4, 1 + self.training_seed() % 3)

    def new_episode(self, inst: Toy) -> ToyEpisode:
        return ToyEpisode(inst)

    def reset_info(self, inst: Toy) -> dict[str, Any]:
        return {"n": inst.n}

    def final_info(self, ep: ToyEpisode) -> dict[str, Any]:
        return {"actions": list(ep.actions)}


def test_an_episode_replaces_masked_actions_and_ends_with_its_outcome() -> None:
    env = ToyEnv(fixed=Toy())
    assert env.observation_space.shape == (5,) and env.action_space.n == 4  # context 1 + 4 slots of 1
    obs, info = env.reset(seed=0)
    assert info == {"n": 3} and obs.tolist() == [0.0, 0.5, 0.5, 0.5, 0.5]
    assert env.action_masks().tolist() == [False, True, True, False]
    obs, r, done, trunc, info = env.step(0)               # excluded: the first valid slot, 1
    assert (r, done, trunc, info) == (0.0, False, False, {"invalid_action": 0}) and obs[0] == 1.0
    _, _, done, _, info = env.step(3)                     # padding: 1 again
    assert not done and info == {"invalid_action": 3}
    obs, r, done, trunc, info = env.step(2)
    assert done and not trunc and r == -4.0               # actions 1 + 1 + 2
    assert info == {"reward": -4.0, "feasible": True, "actions": [1, 1, 2]}
    assert obs.dtype == np.float32 and not obs.any()
    with pytest.raises(AssertionError):
        env.step(1)                                       # the episode is over


def test_a_pool_must_be_nonempty_and_built_for_the_envs_slots() -> None:
    with pytest.raises(ValueError, match="pool: a non-empty list of Toys built with the same slots"):
        ToyEnv(pool=[Toy(slots=4), Toy(slots=3)])
    with pytest.raises(ValueError, match="non-empty"):
        ToyEnv(pool=[])
    env = ToyEnv(pool=[Toy(n=1), Toy(n=2)])
    assert {env.reset(seed=s)[1]["n"] for s in range(20)} == {1, 2}
    assert {ToyEnv().reset(seed=s)[1]["n"] for s in range(20)} == {1, 2, 3}   # drawn: 1 + seed % 3


def test_observation_helpers_by_hand() -> None:
    raw = np.array([np.nan, np.inf, -np.inf, 12.0, -3.5])
    assert observation_vector([raw[:2], raw[2:]], finite=True).tolist() == [0.0, 10.0, -10.0, 10.0, -3.5]
    kept = observation_vector([raw])                      # clipping alone keeps nan
    assert math.isnan(kept[0]) and kept[1:].tolist() == [10.0, -10.0, 10.0, -3.5] and kept.dtype == np.float32
    assert log_ratio(np.array([math.e, np.inf, np.nan, 1e-9]), 1.0).tolist() == pytest.approx([1.0, 5.0, 5.0, -5.0])
    assert padded_mask(np.array([True, False]), 4).tolist() == [True, False, False, False]
    assert MaskedSlotEnv.obs_length((19, 19, 16), 8) == 19 + 8 * 16


def test_demonstrations_follow_the_expert_until_the_mask_excludes_it() -> None:
    obs, masks, acts = demonstrations([(ToyEpisode(Toy()), [1, 0, 2]), (ToyEpisode(Toy(n=2)), [2, 1])])
    # the first run stops at its excluded action 0 (one step recorded), the second runs to its end
    assert acts.tolist() == [1, 2, 1]
    assert obs[:, 0].tolist() == [0.0, 0.0, 1.0] and obs.shape == (3, 5)
    assert masks.shape == (3, 4) and masks.all(axis=0).tolist() == [False, True, True, False]
