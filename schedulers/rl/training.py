"""The training routine the `rl` and `rl-dag` policies share (:class:`MaskedPPOTraining`).

One run: ``n_envs`` copies of a masked slot environment
(schedulers/rl/masked_env.py) in a seeded ``DummyVecEnv``; sb3-contrib's
MaskablePPO on them; optionally a behaviour-cloning warm start
(:func:`warm_start`) on an expert's steps (:func:`demonstrations`); PPO with
SB3's progress.csv and a TensorBoard event file (schedulers/rl/tblog.py) in
the log folder, stopped at the run's wall-clock budget; the policy saved as
an SB3 zip with a JSON sidecar (``FILE.json``) recording how it was
trained. The placement trainer (schedulers/rl/train.py) and the DAG trainer
(schedulers/rl/dag_train.py) say only what differs: the environment, the
policy, the expert, the statistic logged and the sidecar's fields.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import gymnasium as gym
import numpy as np
import torch
from sb3_contrib import MaskablePPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import configure
from stable_baselines3.common.vec_env import DummyVecEnv

from hardware_profiles.fileio import atomic_write
from schedulers.rl.masked_env import Stepper
from schedulers.rl.tblog import TensorBoardEvents


class PPOSettings(Protocol):
    """The hyperparameters every training run reads (both trainers' configs have them)."""

    timesteps: int
    seed: int
    n_envs: int
    n_steps: int                        # per env and rollout
    batch_size: int
    n_epochs: int
    learning_rate: float
    gamma: float
    gae_lambda: float
    ent_coef: float
    threads: int
    max_wall_s: float | None            # stop PPO once the whole run has taken this long
    bc_epochs: int
    bc_learning_rate: float


CfgT = TypeVar("CfgT", bound=PPOSettings)


def demonstrations(runs: Iterable[tuple[Stepper, Iterable[int]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(observations, masks, actions) of an expert, step by step.

    Each run is a fresh episode and the expert's actions in the episode's step
    order; the episode follows them to its end or to the first action its mask
    excludes (the mask can be stricter than the expert: that run then
    contributes the steps before).
    """
    obs, masks, acts = [], [], []
    for ep, actions in runs:
        for a in actions:
            m = ep.action_mask()
            if not m[a]:
                break
            obs.append(ep.observation())
            masks.append(m)
            acts.append(a)
            ep.step(a)
    return np.array(obs), np.array(masks), np.array(acts)


def warm_start(model: Any, obs: np.ndarray, masks: np.ndarray, acts: np.ndarray, epochs: int,
               lr: float, seed: int, batch: int = 256) -> float:
    """Behaviour cloning: fit the policy's masked action distribution to ``acts`` (cross-entropy).

    Returns the last epoch's mean loss. The value head is left to PPO.
    """
    gen = torch.Generator().manual_seed(seed)
    policy = model.policy
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    o, m, a = torch.as_tensor(obs), torch.as_tensor(masks), torch.as_tensor(acts)
    loss_sum = 0.0
    for _ in range(epochs):
        perm = torch.randperm(len(a), generator=gen)
        loss_sum, nb = 0.0, 0
        for i in range(0, len(a), batch):
            idx = perm[i:i + batch]
            dist = policy.get_distribution(o[idx], action_masks=m[idx].numpy())
            loss = -dist.log_prob(a[idx]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum, nb = loss_sum + float(loss.detach()), nb + 1
        loss_sum /= max(nb, 1)
    return loss_sum


class EpisodeStats(BaseCallback):
    """Logs finished episodes' feasible share and, over the feasible ones, the mean of
    ``info[ratio_key]`` (the plan's objective over its reference) as ``ratio_tag``;
    stops training at ``deadline`` (a ``time.perf_counter()`` value)."""

    def __init__(self, deadline: float | None = None, ratio_key: str = "cost_ratio",
                 ratio_tag: str = "rollout/cost_over_reference") -> None:
        super().__init__()
        self.ratios: list[float] = []
        self.feasible: list[bool] = []
        self.deadline = deadline
        self.ratio_key = ratio_key
        self.ratio_tag = ratio_tag

    def _on_step(self) -> bool:
        if self.deadline is not None and time.perf_counter() > self.deadline:
            return False
        for info in self.locals.get("infos", []):
            if "feasible" in info:
                self.feasible.append(bool(info["feasible"]))
                if info["feasible"]:
                    self.ratios.append(float(info[self.ratio_key]))
        return True

    def _on_rollout_end(self) -> None:
        if self.feasible:
            self.logger.record("rollout/feasible_share", float(np.mean(self.feasible)))
        if self.ratios:
            self.logger.record(self.ratio_tag, float(np.mean(self.ratios)))
        self.ratios, self.feasible = [], []


def learn_logged(model: Any, timesteps: int, log_dir: Path, callback: BaseCallback, progress: bool,
                 verbose: int = 0, reset_num_timesteps: bool = True) -> Path:
    """``model.learn`` with SB3's progress.csv and a TensorBoard event file in ``log_dir``
    (plus stdout with ``verbose``); returns the event file's path."""
    logger = configure(str(log_dir), ["csv"] + (["stdout"] if verbose else []))
    tb = TensorBoardEvents(log_dir)
    logger.output_formats.append(tb)
    model.set_logger(logger)
    try:
        model.learn(timesteps, callback=callback, progress_bar=progress, reset_num_timesteps=reset_num_timesteps)
    finally:
        tb.close()
    return tb.path


class MaskedPPOTraining(Generic[CfgT]):
    """One training run of a masked slot policy (module docstring); :meth:`run` is the routine.

    A subclass names the environment (:meth:`make_env`), the policy of a new
    model (:meth:`policy`), the expert (:meth:`expert`), the episode
    statistic logged (``ratio_key``/``ratio_tag``) and the sidecar
    (:meth:`sidecar`); it may build instance pools first (:meth:`prepare`).

    Attributes (set by :meth:`run`): ``t0``, the run's start
    (``time.perf_counter()``); ``setup_s``, seconds until the environments
    were ready; ``log``, the log folder.
    """

    #: ``info`` key of the objective ratio over the reference, and the tag it is logged as
    ratio_key: ClassVar[str] = "cost_ratio"
    ratio_tag: ClassVar[str] = "rollout/cost_over_reference"
    #: count timesteps from 0 (False: go on from a loaded model's count)
    reset_num_timesteps: bool = True

    def __init__(self, out: str | Path, cfg: CfgT, log_dir: str | Path | None = None,
                 progress: bool = True, verbose: int = 0) -> None:
        self.out = Path(out)
        self.cfg = cfg
        self.log = Path(log_dir) if log_dir else self.out.with_name(self.out.stem + "_logs")
        self.progress = progress
        self.verbose = verbose
        self.t0 = 0.0
        self.setup_s = 0.0

    # ------------------------------------------------------ what differs
    def prepare(self) -> None:
        """Before the environments are made (instance pools they share)."""

    def make_env(self) -> gym.Env[Any, Any]:
        """One environment of the vector."""
        raise NotImplementedError

    def policy(self) -> tuple[Any, dict[str, Any]]:
        """(policy class or name, policy_kwargs) of a new model."""
        raise NotImplementedError

    def expert(self) -> tuple[dict[str, Any], tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
        """Facts about the expert (first in the sidecar's ``warm_start``) and its
        (observations, masks, actions); None: no warm start."""
        return None

    def sidecar(self, model: Any, warm: dict[str, Any], events: Path | None) -> dict[str, Any]:
        """What the JSON sidecar records: config, timesteps, times, warm start, logs."""
        raise NotImplementedError

    # ------------------------------------------------------------ routine
    def build_model(self, vec: DummyVecEnv) -> Any:
        """A new MaskablePPO model with the config's hyperparameters, on the CPU."""
        cfg = self.cfg
        policy, kwargs = self.policy()
        return MaskablePPO(policy, vec, n_steps=cfg.n_steps, batch_size=cfg.batch_size, n_epochs=cfg.n_epochs,
                           learning_rate=cfg.learning_rate, gamma=cfg.gamma, gae_lambda=cfg.gae_lambda,
                           ent_coef=cfg.ent_coef, seed=cfg.seed, device="cpu", policy_kwargs=kwargs,
                           verbose=self.verbose)

    def warm_start(self, model: Any) -> dict[str, Any]:
        """Behaviour cloning on the expert's steps; the sidecar's ``warm_start`` ({} without)."""
        t = time.perf_counter()
        got = self.expert()
        if got is None:
            return {}
        facts, (obs, masks, acts) = got
        loss = warm_start(model, obs, masks, acts, self.cfg.bc_epochs, self.cfg.bc_learning_rate, self.cfg.seed)
        out = {**facts, "steps": int(len(acts)), "loss": round(loss, 4), "seconds": round(time.perf_counter() - t, 1)}
        return {**out, **self.after_warm_start(model, obs, masks, acts)}

    def after_warm_start(self, model: Any, obs: np.ndarray, masks: np.ndarray, acts: np.ndarray
                         ) -> dict[str, Any]:
        """More training after behaviour cloning on the expert's (obs, masks, acts); what it
        adds to the sidecar's ``warm_start`` (nothing by default)."""
        return {}

    def learn(self, model: Any) -> Path | None:
        """PPO for the config's timesteps, logged, within its wall-clock budget; the event file."""
        cfg = self.cfg
        stats = EpisodeStats(self.t0 + cfg.max_wall_s if cfg.max_wall_s else None, ratio_key=self.ratio_key,
                             ratio_tag=self.ratio_tag)
        return learn_logged(model, cfg.timesteps, self.log, stats, self.progress, self.verbose,
                            reset_num_timesteps=self.reset_num_timesteps)

    def run(self) -> dict[str, Any]:
        """Train, save the policy to ``out`` (an SB3 zip) and ``out``.json beside it;
        returns what the sidecar holds."""
        cfg = self.cfg
        self.t0 = time.perf_counter()
        torch.manual_seed(cfg.seed)
        torch.set_num_threads(cfg.threads)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.prepare()
        vec = DummyVecEnv([self.make_env for _ in range(cfg.n_envs)])
        vec.seed(cfg.seed)
        self.setup_s = time.perf_counter() - self.t0
        model = self.build_model(vec)
        warm = self.warm_start(model)
        events = self.learn(model)
        model.save(str(self.out))
        meta = self.sidecar(model, warm, events)
        atomic_write(self.out.with_suffix(".json"), json.dumps(meta, indent=2) + "\n")
        return meta

    def wall_s(self) -> float:
        """Seconds since the run started, rounded as the sidecar records them."""
        return round(time.perf_counter() - self.t0, 1)
