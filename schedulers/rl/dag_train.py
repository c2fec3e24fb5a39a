"""Training the `rl-dag` policy: behaviour cloning of exact schedules, then MaskablePPO.

    python -m schedulers.rl.dag_train --timesteps 200000 --out schedulers/rl/dag_default_policy.zip \
        --log-dir results/rl-dag/logs

1. A pool of training instances (:func:`schedulers.rl.dag_env.draw_costs`,
   seeds below ``TRAIN_SEED_LIMIT`` drawn from the run's seed).
2. Expert actions per pool instance: the unit of each task in the best of the
   energy heuristic's, HEFT's and (small graphs) the exact MILP's schedule,
   each replayed in the environment's order (least energy meeting deadline and
   period, else the shortest frame; the replay can only change a MILP
   schedule's makespan, never its energy).
3. The policy (:class:`schedulers.rl.policy.SlotPolicy`, one scorer shared by
   the unit slots) is fitted to them (``warm_start``), then trained with PPO on
   freshly drawn instances. Logs: SB3's progress.csv and a TensorBoard event
   file in ``LOG_DIR``; the policy is saved with a JSON sidecar saying how.

The routine is the one the `rl` placement trainer shares
(schedulers/rl/training.py); this module says what is the DAG policy's own.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from schedulers.dag import best_plan, heft_schedule, solve_milp
from schedulers.rl.dag_env import (
    MAX_UNITS,
    DagEpisode,
    DagInstance,
    DagScheduleEnv,
    draw_costs,
    replay,
    slot_layout,
)
from schedulers.rl.masked_env import TRAIN_SEED_LIMIT
from schedulers.rl.policy import SlotPolicy
from schedulers.rl.training import MaskedPPOTraining, demonstrations
from sim.dag import DagPlan


@dataclass
class DagTrainConfig:
    """Hyperparameters of one training run (written to the policy's sidecar JSON)."""

    timesteps: int = 200_000
    seed: int = 0
    n_envs: int = 8
    max_units: int = MAX_UNITS
    n_steps: int = 128                  # per env and rollout
    batch_size: int = 256
    n_epochs: int = 5
    learning_rate: float = 5e-5
    gamma: float = 1.0                  # one terminal reward: no discounting
    gae_lambda: float = 0.95
    ent_coef: float = 0.003
    slot_hidden: int = 64
    threads: int = 1
    max_wall_s: float | None = 600.0    # stop PPO once the whole run has taken this long
    pool_size: int = 4000               # behaviour-cloning instances (0: pure PPO)
    bc_epochs: int = 40
    bc_learning_rate: float = 1e-3
    bc_milp_max_tasks: int = 14         # exact expert on graphs up to this size
    bc_milp_limit_s: float = 1.0


def build_pool(size: int, seed: int, max_units: int = MAX_UNITS, progress: bool = False) -> list[DagInstance]:
    """``size`` training instances from seeds below ``TRAIN_SEED_LIMIT`` drawn by
    ``np.random.default_rng(seed)``."""
    from tqdm import tqdm

    rng = np.random.default_rng(seed)
    seeds = rng.integers(0, TRAIN_SEED_LIMIT, size)
    return [DagInstance(draw_costs(int(s)), max_units) for s in tqdm(seeds, desc="instances", disable=not progress)]


def expert_plan(inst: DagInstance, milp_max_tasks: int, milp_limit_s: float) -> DagPlan:
    """The best of the heuristics' and (small graphs) the MILP's units, replayed in the env's order."""
    c = inst.c
    units = [inst.ref.plan.unit, heft_schedule(c).unit]
    if inst.n <= milp_max_tasks:
        m = solve_milp(c, "energy", milp_limit_s)
        if m is not None:
            units.append(m.unit)
    return best_plan([(replay(c, u, inst.order), c) for u in units])[0]


def expert_steps(pool: Sequence[DagInstance], cfg: DagTrainConfig, progress: bool = False
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(observations, masks, actions) of the expert schedules, step by step.

    A feasible expert schedule is never pruned from the mask; an infeasible one
    (the shortest frame where nothing meets the deadline) can be, and then its
    instance contributes the steps before.
    """
    from tqdm import tqdm

    def runs() -> Iterator[tuple[DagEpisode, Iterator[int]]]:
        for inst in tqdm(pool, desc="expert", disable=not progress):
            plan = expert_plan(inst, cfg.bc_milp_max_tasks, cfg.bc_milp_limit_s)
            yield DagEpisode(inst), (int(plan.unit[i]) for i in inst.order)   # the episode's task order

    return demonstrations(runs())


class DagTraining(MaskedPPOTraining[DagTrainConfig]):
    """A training run of the `rl-dag` policy: freshly drawn instances, the expert's
    schedules of a pool of ``pool_size`` more as the warm start."""

    ratio_key = "energy_ratio"
    ratio_tag = "rollout/energy_over_reference"

    def make_env(self) -> gym.Env[Any, Any]:
        return DagScheduleEnv(max_units=self.cfg.max_units)

    def policy(self) -> tuple[Any, dict[str, Any]]:
        return SlotPolicy, {"slot_hidden": self.cfg.slot_hidden, "slot_layout": slot_layout(self.cfg.max_units)}

    def expert(self) -> tuple[dict[str, Any], tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
        cfg = self.cfg
        if not cfg.pool_size:
            return None
        pool = build_pool(cfg.pool_size, cfg.seed, cfg.max_units, self.progress)
        return {"instances": len(pool)}, expert_steps(pool, cfg, self.progress)

    def learn(self, model: Any) -> Path | None:
        """No PPO (and no logs) at 0 timesteps: the warm-started policy is saved as it is."""
        return super().learn(model) if self.cfg.timesteps else None

    def sidecar(self, model: Any, warm: dict[str, Any], events: Path | None) -> dict[str, Any]:
        return {"env": "hetsim/DagSchedule-v0", "config": asdict(self.cfg), "timesteps": int(model.num_timesteps),
                "wall_s": self.wall_s(), "warm_start": warm, "torch": torch.__version__,
                "threads": self.cfg.threads, "log_dir": str(self.log),
                "tensorboard_events": str(events) if events else None}


def train_dag(out: str | Path, cfg: DagTrainConfig, log_dir: str | Path | None = None, progress: bool = True,
              verbose: int = 0) -> dict[str, Any]:
    """Train a policy and save it to ``out`` (an SB3 zip) with ``out``.json beside it.

    Args:
        out: policy file to write.
        cfg: hyperparameters.
        log_dir: progress.csv and the TensorBoard event file (None: ``out`` minus
            its suffix, plus ``_logs``).
        progress: progress bars (pool, expert, training).

    Returns:
        What was written into the sidecar: config, wall seconds, timesteps.
    """
    return DagTraining(out, cfg, log_dir, progress, verbose).run()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m schedulers.rl.dag_train``: train and save an `rl-dag` policy."""
    ap = argparse.ArgumentParser(prog="python -m schedulers.rl.dag_train", description=__doc__.splitlines()[0])
    ap.add_argument("--timesteps", type=int, default=DagTrainConfig.timesteps, help="PPO environment steps")
    ap.add_argument("--out", required=True, help="policy file to write (an SB3 zip; FILE.json beside it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pool-size", type=int, default=DagTrainConfig.pool_size,
                    help="behaviour-cloning instances (0: PPO from a random policy)")
    ap.add_argument("--max-wall-s", type=float, default=DagTrainConfig.max_wall_s,
                    help="stop PPO once the run has taken this long")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--log-dir", default=None)
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    cfg = DagTrainConfig(timesteps=a.timesteps, seed=a.seed, pool_size=a.pool_size, max_wall_s=a.max_wall_s,
                         threads=a.threads)
    meta = train_dag(a.out, cfg, a.log_dir, progress=not a.no_progress)
    print(f"{a.out}: {meta['timesteps']} timesteps in {meta['wall_s']} s; logs in {meta['log_dir']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
