"""What the `rl` and `rl-dag` environments share: masked slot environments.

Both are one discrete choice per step among ``slots`` action slots (a device
type per layer for hetsim/Placement-v0, a unit per task for
hetsim/DagSchedule-v0), padded to the policy's slot count. An *instance*
holds the per-problem facts computed once (its ``slots`` is the slot count it
was built for); an *episode* (:class:`SlotEpisode`) is one solution in progress
on an instance and builds each step's observation and action mask. The
schedulers drive episodes directly, several at once
(:func:`schedulers.rl.scheduler.run_episodes`); :class:`MaskedSlotEnv` wraps
them as a ``gymnasium.Env`` for training.

The observation is one float32 vector in ``[-OBS_BOUND, OBS_BOUND]``: a
context block, then one block of equal length per slot (padding slots
zero), as ``slot_layout`` says (:class:`schedulers.rl.policy.SlotPolicy`
reads it so).

Environment cards: each environment's class docstring is its card, in the
sections of gymnasium's own environments (``## Description``, ``## Action
Space``, ``## Observation Space``, ``## Rewards``, ``## Episode End``).
What this base fixes holds for both and is restated there: the action space
is ``Discrete(slots)``; ``action_masks()`` (what sb3-contrib's MaskablePPO
reads) marks the valid slots, padding never; an action outside the mask is
replaced by the first valid one and ``info["invalid_action"]`` names it;
the reward is 0 until the last step, which terminates the episode with a
zero observation and the episode's outcome in ``info``; episodes never
truncate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

#: Largest random seed drawn for a training instance; held-out seeds (bench) lie above it.
TRAIN_SEED_LIMIT = 1_000_000_000
#: Observations are clipped to [-OBS_BOUND, OBS_BOUND].
OBS_BOUND = 10.0


def log_ratio(num: np.ndarray | float, den: np.ndarray | float) -> np.ndarray:
    """log(num / den) clipped to [-5, 5]; inf (no option) and nan map to 5."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.log(np.asarray(num, dtype=float) / den)
    return np.clip(np.where(r == r, r, 5.0), -5.0, 5.0)


def observation_vector(parts: Sequence[np.ndarray], finite: bool = False) -> np.ndarray:
    """``parts`` concatenated, clipped to [-OBS_BOUND, OBS_BOUND], as float32. With
    ``finite``, nan becomes 0 and +-inf the bounds first (clipping keeps nan)."""
    obs = np.concatenate(parts)
    if finite:
        obs = np.nan_to_num(obs, nan=0.0, posinf=OBS_BOUND, neginf=-OBS_BOUND)
    return np.clip(obs, -OBS_BOUND, OBS_BOUND).astype(np.float32)


def padded_mask(valid: np.ndarray, slots: int) -> np.ndarray:
    """The action mask of ``slots`` slots: ``valid`` for the real ones, False for padding."""
    m = np.zeros(slots, dtype=bool)
    m[: valid.size] = valid
    return m


class Stepper(Protocol):
    """An episode as :func:`schedulers.rl.scheduler.run_episodes` drives it."""

    @property
    def done(self) -> bool: ...

    def observation(self) -> np.ndarray: ...

    def action_mask(self) -> np.ndarray: ...

    def step(self, action: int) -> None: ...


class SlotEpisode(Stepper, Protocol):
    """An episode as :class:`MaskedSlotEnv` drives it: a Stepper whose finished solution
    has an outcome (``reward`` and the facts ``info`` reports)."""

    def outcome(self) -> dict[str, Any]: ...


class SlotInstance(Protocol):
    """An instance: the per-problem facts its episodes read, built for ``slots`` action slots."""

    @property
    def slots(self) -> int: ...


InstT = TypeVar("InstT", bound=SlotInstance)
EpT = TypeVar("EpT", bound=SlotEpisode)


class MaskedSlotEnv(gym.Env[np.ndarray, np.int64], Generic[InstT, EpT]):
    """The gymnasium plumbing of a masked slot environment (module docstring).

    Each reset starts an episode on ``fixed`` when given, else on an instance
    of ``pool`` picked with ``self.np_random``, else on a freshly drawn one
    (:meth:`draw_instance`). A subclass says how to draw an instance, how to
    start an episode on it, and what ``info`` holds at reset and at the end.
    """

    metadata: dict[str, Any] = {"render_modes": []}
    #: names in the error for a bad pool: the instance class and the slot-count argument
    instance_kind: ClassVar[str] = "instance"
    slots_param: ClassVar[str] = "slots"

    def __init__(self, slots: int, layout: tuple[int, int, int], fixed: InstT | None,
                 pool: Sequence[InstT] | None) -> None:
        self.fixed = fixed
        self.pool = list(pool) if pool is not None else None
        if self.pool is not None and (not self.pool or any(x.slots != slots for x in self.pool)):
            raise ValueError(f"pool: a non-empty list of {self.instance_kind}s built with the same "
                             f"{self.slots_param}")
        self.observation_space = spaces.Box(-OBS_BOUND, OBS_BOUND, (self.obs_length(layout, slots),), np.float32)
        self.action_space = spaces.Discrete(slots)
        self.episode: EpT | None = None

    @staticmethod
    def obs_length(layout: tuple[int, int, int], slots: int) -> int:
        """Length of an observation of ``layout`` (context features, offset of the first
        slot, features per slot) with ``slots`` slots."""
        _, per_at, per_slot = layout
        return per_at + slots * per_slot

    def training_seed(self) -> int:
        """The seed of a fresh training instance: below TRAIN_SEED_LIMIT, from ``self.np_random``."""
        return int(self.np_random.integers(0, TRAIN_SEED_LIMIT))

    # ------------------------------------------------------ what differs
    def draw_instance(self) -> InstT:
        """A fresh training instance (from :meth:`training_seed`)."""
        raise NotImplementedError

    def new_episode(self, inst: InstT) -> EpT:
        raise NotImplementedError

    def reset_info(self, inst: InstT) -> dict[str, Any]:
        """``info`` of a reset on ``inst``."""
        raise NotImplementedError

    def final_info(self, ep: EpT) -> dict[str, Any]:
        """What the last step's ``info`` holds besides the episode's outcome."""
        raise NotImplementedError

    # ----------------------------------------------------------- plumbing
    def _draw(self) -> InstT:
        if self.pool is not None:
            return self.pool[int(self.np_random.integers(len(self.pool)))]
        return self.draw_instance()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        inst = self.fixed if self.fixed is not None else self._draw()
        self.episode = ep = self.new_episode(inst)
        return ep.observation(), self.reset_info(inst)

    def action_masks(self) -> np.ndarray:
        """Valid actions of the current step (sb3-contrib's MaskablePPO reads this)."""
        assert self.episode is not None, "call reset() first"
        return self.episode.action_mask()

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        ep = self.episode
        assert ep is not None and not ep.done, "call reset() first"
        a = int(action)
        mask = ep.action_mask()
        info: dict[str, Any] = {}
        if not mask[a]:                   # a padding slot or an action the mask excludes
            info["invalid_action"] = a
            a = int(np.flatnonzero(mask)[0])
        ep.step(a)
        if ep.done:
            out = ep.outcome()
            info.update(out, **self.final_info(ep))
            return np.zeros(self.observation_space.shape, np.float32), out["reward"], True, False, info
        return ep.observation(), 0.0, False, False, info
