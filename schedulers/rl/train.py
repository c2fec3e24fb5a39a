"""Training the `rl` placement policy with sb3-contrib's MaskablePPO.

Two modes, as in the issue: *generalisation* (one policy for models and
clusters it has not seen: episodes drawn from a pool of
:func:`sim.instances.random_problem` instances with training seeds) and
*fine-tune* (HeterPS trains per model: every episode is one Problem, starting
from a given policy). Logs go to ``LOG_DIR``: SB3's progress.csv and a
TensorBoard event file (schedulers/rl/tblog.py). The policy is saved as an SB3
zip with a JSON sidecar (``FILE.json``) recording how it was trained. The
routine is the one the `rl-dag` trainer shares (schedulers/rl/training.py);
this module says what is the placement policy's own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from sb3_contrib import MaskablePPO
from stable_baselines3.common.vec_env import DummyVecEnv

from schedulers.exact import solve
from schedulers.placement import Greedy
from schedulers.rl.dagger import visited_steps
from schedulers.rl.env import MAX_TYPES, Episode, Instance, PlacementEnv
from schedulers.rl.grouping import MAX_GROUPS
from schedulers.rl.masked_env import TRAIN_SEED_LIMIT
from schedulers.rl.policy import SlotPolicy
from schedulers.rl.scheduler import DEFAULT_POLICY, RL, load_policy
from schedulers.rl.training import MaskedPPOTraining, demonstrations, warm_start
from schedulers.rl.workloads import real_instance
from sim.instances import random_problem
from sim.placement import PlacementInfeasible
from sim.problem import Problem


@dataclass
class TrainConfig:
    """Hyperparameters of one training run (written to the policy's sidecar JSON)."""

    timesteps: int = 200_000
    seed: int = 0
    n_envs: int = 8
    pool_size: int = 6000               # training instances (generalisation mode)
    real_share: float = 0.0             # of them real-model ones (schedulers/rl/workloads.py), else random
    groups: int = MAX_GROUPS            # units a long model is grouped into (schedulers/rl/grouping.py)
    max_types: int = MAX_TYPES
    n_steps: int = 256                  # per env and rollout
    batch_size: int = 256
    n_epochs: int = 10
    learning_rate: float = 1e-4
    gamma: float = 1.0                  # one terminal reward: no discounting
    gae_lambda: float = 0.95
    ent_coef: float = 0.01
    net_arch: list[int] = field(default_factory=lambda: [128, 128])   # "mlp" policy; critic of "slot"
    policy: str = "slot"                # "slot" (schedulers/rl/policy.py) or "mlp"
    slot_hidden: int = 64
    threads: int = 1
    max_wall_s: float | None = None     # stop PPO once the whole run has taken this long
    # behaviour-cloning warm start: the exact optimum's actions on this many pool instances
    # (0: pure PPO from a random policy); see warm_start()
    bc_instances: int = 6000
    bc_epochs: int = 40
    bc_learning_rate: float = 1e-3
    bc_exact_limit_s: float = 0.5
    # DAgger after the warm start (schedulers/rl/dagger.py): rounds, episodes per round (pool
    # instances drawn anew each round), states labelled per episode, fitting epochs per round
    dagger_rounds: int = 0
    dagger_instances: int = 300
    dagger_states: int = 8
    dagger_epochs: int = 10
    instance_kwargs: dict[str, Any] = field(default_factory=dict)


def build_pool(size: int, seed: int, max_types: int = MAX_TYPES, progress: bool = False,
               instance_kwargs: dict[str, Any] | None = None, real_share: float = 0.0,
               groups: int = MAX_GROUPS) -> list[Instance]:
    """``size`` training instances that a reference plan solves, ``round(real_share * size)``
    of them real-model ones (:func:`schedulers.rl.workloads.real_instance`), the rest random
    (:func:`sim.instances.random_problem`), interleaved in proportion; seeds below
    ``TRAIN_SEED_LIMIT`` drawn by ``np.random.default_rng(seed)``."""
    from tqdm import tqdm

    rng = np.random.default_rng(seed)
    pool: list[Instance] = []
    real = round(real_share * size)
    made = {"random": 0, "real": 0}
    with tqdm(total=size, desc="instances", unit="inst", disable=not progress) as bar:
        while len(pool) < size:
            # the kind further behind its share goes next
            kind = "real" if made["real"] * size < real * (len(pool) + 1) else "random"
            s = int(rng.integers(0, TRAIN_SEED_LIMIT))
            if kind == "random":
                inst = Instance(random_problem(s, **(instance_kwargs or {})), max_types, groups=groups)
            else:
                got = real_instance(s, groups=groups)
                if got is None:
                    continue
                inst = Instance(got[0], max_types, space=got[1], groups=groups)
            if np.isfinite(inst.ref.cost_usd):
                pool.append(inst)
                made[kind] += 1
                bar.update(1)
    return pool


def expert_steps(pool: list[Instance], time_limit_s: float = 1.0, progress: bool = False
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(observations, masks, actions) of the exact solver's placements, step by step.

    An instance whose optimum is not found within ``time_limit_s`` contributes
    the best placement found; a step whose optimal type the mask excludes ends
    that instance's contribution (the mask is a per-layer test and can be
    stricter than the whole placement).
    """
    from tqdm import tqdm

    def runs() -> Iterator[tuple[Episode, list[int]]]:
        for inst in tqdm(pool, desc="exact", unit="inst", disable=not progress):
            r = solve(inst.space, time_limit_s=time_limit_s)
            if r.assignment is not None:
                yield Episode(inst), [int(k) for k in r.assignment]

    return demonstrations(runs())


class PlacementTraining(MaskedPPOTraining[TrainConfig]):
    """A training run of the `rl` policy: on a pool of random instances, or fine-tuning on
    one problem (from ``init``, a saved policy, when given)."""

    def __init__(self, out: str | Path, cfg: TrainConfig, problem: Problem | None = None,
                 init: str | Path | None = None, log_dir: str | Path | None = None, progress: bool = True,
                 verbose: int = 0) -> None:
        super().__init__(out, cfg, log_dir, progress, verbose)
        self.problem = problem
        self.init = init
        self.reset_num_timesteps = init is None
        self.pool: list[Instance] = []

    def prepare(self) -> None:
        cfg = self.cfg
        if self.problem is None:
            self.pool = build_pool(cfg.pool_size, cfg.seed, cfg.max_types, self.progress, cfg.instance_kwargs,
                                   cfg.real_share, cfg.groups)
        else:
            self.pool = [Instance(self.problem, cfg.max_types, groups=cfg.groups)]

    def make_env(self) -> gym.Env[Any, Any]:
        return PlacementEnv(max_types=self.cfg.max_types, pool=self.pool)

    def policy(self) -> tuple[Any, dict[str, Any]]:
        cfg = self.cfg
        if cfg.policy == "slot":
            return SlotPolicy, {"slot_hidden": cfg.slot_hidden}
        return "MlpPolicy", {"net_arch": {"pi": list(cfg.net_arch), "vf": list(cfg.net_arch)}}

    def build_model(self, vec: DummyVecEnv) -> Any:
        """A new model, or (fine-tune) the ``init`` policy with this config's PPO settings."""
        if self.init is None:
            return super().build_model(vec)
        cfg = self.cfg
        model = MaskablePPO.load(str(self.init), env=vec, device="cpu", seed=cfg.seed,
                                 learning_rate=cfg.learning_rate, n_steps=cfg.n_steps,
                                 batch_size=cfg.batch_size, n_epochs=cfg.n_epochs, ent_coef=cfg.ent_coef)
        slots = int(model.action_space.n)  # type: ignore[attr-defined]
        if slots != cfg.max_types:
            raise ValueError(f"policy {self.init} has {slots} type slots, the config {cfg.max_types}")
        return model

    def expert(self) -> tuple[dict[str, Any], tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
        """The exact solver's placements of the first ``bc_instances`` pool instances (a new model only)."""
        cfg = self.cfg
        if not cfg.bc_instances or self.init is not None:
            return None
        return {}, expert_steps(self.pool[: cfg.bc_instances], cfg.bc_exact_limit_s, self.progress)

    def after_warm_start(self, model: Any, obs: np.ndarray, masks: np.ndarray, acts: np.ndarray
                         ) -> dict[str, Any]:
        """After behaviour cloning on the exact placements, ``dagger_rounds`` rounds of DAgger:
        the exact completions of states the policy reaches join the data, and the policy is
        fitted again on all of it."""
        cfg = self.cfg
        out: dict[str, Any] = {}
        rng = np.random.default_rng(cfg.seed + 1)
        rounds = []
        for r in range(cfg.dagger_rounds):
            t = time.perf_counter()
            pick = rng.choice(len(self.pool), size=min(cfg.dagger_instances, len(self.pool)), replace=False)
            o, m, a, counts = visited_steps(model, [self.pool[i] for i in pick], cfg.dagger_states, rng,
                                            cfg.bc_exact_limit_s)
            if len(a):
                obs, masks, acts = np.concatenate([obs, o]), np.concatenate([masks, m]), np.concatenate([acts, a])
            loss = warm_start(model, obs, masks, acts, cfg.dagger_epochs, cfg.bc_learning_rate, cfg.seed + 1 + r)
            rounds.append({**counts, "loss": round(loss, 4), "seconds": round(time.perf_counter() - t, 1)})
        if rounds:
            out["dagger"] = rounds
        return out

    def sidecar(self, model: Any, warm: dict[str, Any], events: Path | None) -> dict[str, Any]:
        problem, init = self.problem, self.init
        return {"mode": "fine-tune" if problem is not None else "random",
                "problem": problem.name if problem else None, "init": str(init) if init else None,
                "config": asdict(self.cfg), "timesteps": int(model.num_timesteps), "wall_s": self.wall_s(),
                "pool_s": round(self.setup_s, 1), "warm_start": warm, "torch": torch.__version__,
                "log_dir": str(self.log), "tensorboard_events": str(events)}


def train(out: str | Path, cfg: TrainConfig, problem: Problem | None = None, init: str | Path | None = None,
          log_dir: str | Path | None = None, progress: bool = True, verbose: int = 0) -> dict[str, Any]:
    """Train a policy and save it to ``out`` (an SB3 zip) with ``out``.json beside it.

    Args:
        out: policy file to write.
        cfg: hyperparameters.
        problem: fine-tune on this one problem (None: the random-instance pool).
        init: start from this saved policy (fine-tune mode's usual start).
        log_dir: progress.csv and the TensorBoard event file (None: ``out`` minus
            its suffix, plus ``_logs``).
        progress: progress bars (instance pool, then training).

    Returns:
        What was written into the sidecar: config, wall seconds, timesteps.
    """
    return PlacementTraining(out, cfg, problem, init, log_dir, progress, verbose).run()


def default_policy() -> Path:
    """The policy shipped with the package."""
    return DEFAULT_POLICY


def compare_on(problem: Problem, policy: str | Path) -> str:
    """One line: the policy's plan cost on ``problem`` next to greedy's."""
    load_policy.cache_clear()
    parts = []
    for name, sched in (("rl", RL(str(policy))), ("greedy", Greedy())):
        try:
            plan = sched.plan(problem)
            cost = plan.options["placement"]["predicted"]["cost_usd"]
            fb = (plan.options.get("rl") or {}).get("fallback")
            parts.append(f"{name} {cost:.4g} USD" + (f" (fallback {fb})" if fb else ""))
        except PlacementInfeasible as e:
            parts.append(f"{name}: {e}")
    return f"{problem.name}: " + ", ".join(parts)
