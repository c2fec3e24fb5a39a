"""Training the `rl` placement policy with sb3-contrib's MaskablePPO.

Two modes, as in the issue: *generalisation* (one policy for models and
clusters it has not seen: episodes drawn from a pool of
:func:`sim.instances.random_problem` instances with training seeds) and
*fine-tune* (HeterPS trains per model: every episode is one Problem, starting
from a given policy). Logs go to ``LOG_DIR``: SB3's progress.csv and a
TensorBoard event file (schedulers/rl/tblog.py). The policy is saved as an SB3
zip with a JSON sidecar (``FILE.json``) recording how it was trained.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from sb3_contrib import MaskablePPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import configure
from stable_baselines3.common.vec_env import DummyVecEnv

from schedulers.exact import solve
from schedulers.placement import Greedy
from schedulers.rl.env import MAX_TYPES, TRAIN_SEED_LIMIT, Episode, Instance, PlacementEnv
from schedulers.rl.policy import SlotPolicy
from schedulers.rl.scheduler import DEFAULT_POLICY, RL, load_policy
from schedulers.rl.tblog import TensorBoardEvents
from sim.instances import random_problem
from sim.placement import PlacementInfeasible
from sim.problem import Problem


@dataclass
class TrainConfig:
    """Hyperparameters of one training run (written to the policy's sidecar JSON)."""

    timesteps: int = 200_000
    seed: int = 0
    n_envs: int = 8
    pool_size: int = 6000               # random instances (generalisation mode)
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
    instance_kwargs: dict[str, Any] = field(default_factory=dict)


def build_pool(size: int, seed: int, max_types: int = MAX_TYPES, progress: bool = False,
               instance_kwargs: dict[str, Any] | None = None) -> list[Instance]:
    """``size`` random training instances that a reference plan solves, from seeds below
    ``TRAIN_SEED_LIMIT`` drawn by ``np.random.default_rng(seed)``."""
    from tqdm import tqdm

    rng = np.random.default_rng(seed)
    pool: list[Instance] = []
    with tqdm(total=size, desc="instances", unit="inst", disable=not progress) as bar:
        while len(pool) < size:
            inst = Instance(random_problem(int(rng.integers(0, TRAIN_SEED_LIMIT)), **(instance_kwargs or {})),
                            max_types)
            if np.isfinite(inst.ref.cost_usd):
                pool.append(inst)
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

    obs, masks, acts = [], [], []
    for inst in tqdm(pool, desc="exact", unit="inst", disable=not progress):
        r = solve(inst.space, time_limit_s=time_limit_s)
        if r.assignment is None:
            continue
        ep = Episode(inst)
        for k in r.assignment:
            m = ep.action_mask()
            if not m[int(k)]:
                break
            obs.append(ep.observation())
            masks.append(m)
            acts.append(int(k))
            ep.step(int(k))
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
    t0 = time.perf_counter()
    torch.set_num_threads(cfg.threads)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    log = Path(log_dir) if log_dir else out.with_name(out.stem + "_logs")
    if problem is None:
        pool = build_pool(cfg.pool_size, cfg.seed, cfg.max_types, progress, cfg.instance_kwargs)
    else:
        pool = [Instance(problem, cfg.max_types)]
    envs: list[Callable[[], gym.Env[Any, Any]]] = [
        lambda: PlacementEnv(max_types=cfg.max_types, pool=pool) for _ in range(cfg.n_envs)]
    vec = DummyVecEnv(envs)
    vec.seed(cfg.seed)
    pool_s = time.perf_counter() - t0
    if init is not None:
        model = MaskablePPO.load(str(init), env=vec, device="cpu", seed=cfg.seed,
                                 learning_rate=cfg.learning_rate, n_steps=cfg.n_steps,
                                 batch_size=cfg.batch_size, n_epochs=cfg.n_epochs, ent_coef=cfg.ent_coef)
        slots = int(model.action_space.n)  # type: ignore[attr-defined]
        if slots != cfg.max_types:
            raise ValueError(f"policy {init} has {slots} type slots, the config {cfg.max_types}")
    else:
        if cfg.policy == "slot":
            policy: Any = SlotPolicy
            kwargs: dict[str, Any] = {"slot_hidden": cfg.slot_hidden}
        else:
            policy, kwargs = "MlpPolicy", {"net_arch": {"pi": list(cfg.net_arch), "vf": list(cfg.net_arch)}}
        model = MaskablePPO(policy, vec, n_steps=cfg.n_steps, batch_size=cfg.batch_size,
                            n_epochs=cfg.n_epochs, learning_rate=cfg.learning_rate, gamma=cfg.gamma,
                            gae_lambda=cfg.gae_lambda, ent_coef=cfg.ent_coef, seed=cfg.seed, device="cpu",
                            policy_kwargs=kwargs, verbose=verbose)
    bc: dict[str, Any] = {}
    if cfg.bc_instances and init is None:
        t = time.perf_counter()
        obs, masks, acts = expert_steps(pool[: cfg.bc_instances], cfg.bc_exact_limit_s, progress)
        loss = warm_start(model, obs, masks, acts, cfg.bc_epochs, cfg.bc_learning_rate, cfg.seed)
        bc = {"steps": int(len(acts)), "loss": round(loss, 4), "seconds": round(time.perf_counter() - t, 1)}
    events = learn_logged(model, cfg.timesteps, log, EpisodeStats(t0 + cfg.max_wall_s if cfg.max_wall_s else None),
                          progress, verbose, reset_num_timesteps=init is None)
    model.save(str(out))
    meta = {"mode": "fine-tune" if problem is not None else "random", "problem": problem.name if problem else None,
            "init": str(init) if init else None, "config": asdict(cfg),
            "timesteps": int(model.num_timesteps), "wall_s": round(time.perf_counter() - t0, 1),
            "pool_s": round(pool_s, 1), "warm_start": bc, "torch": torch.__version__, "log_dir": str(log),
            "tensorboard_events": str(events)}
    out.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


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
