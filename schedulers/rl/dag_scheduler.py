"""`rl-dag`: schedule a task DAG with a trained MaskablePPO policy (kind "dag").

The policy picks each task's unit in HEFT's rank order
(schedulers/rl/dag_env.py); placement is the list scheduler's. In every
power mode the problem allows, the deterministic decode and ``samples``
episodes drawn from the policy's distribution are scheduled (one batched
forward pass per task and mode); the least-energy schedule meeting deadline
and period wins, else the shortest frame (the rule of the other DAG
schedulers). The default policy ships with the package
(schedulers/rl/dag_default_policy.zip, trained by ``python -m
schedulers.rl.dag_train``); ``policy`` names another.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

from hardware_profiles.errors import ConfigError
from schedulers.dag import best_plan
from schedulers.rl.dag_env import DagEpisode, DagInstance
from schedulers.rl.scheduler import load_policy, run_episodes
from sim.dag import DagCosts, DagPlan, DagProblem, planning_costs

DEFAULT_DAG_POLICY = Path(__file__).with_name("dag_default_policy.zip")


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run torch on one thread inside the block: the forward passes here are a few small
    matrices, which a thread pool only slows down (badly so on a loaded machine)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def dag_rollout(model: Any, inst: DagInstance, samples: int = 0, seed: int = 0) -> list[DagPlan]:
    """Plans of ``1 + samples`` episodes on one instance: the deterministic decode first,
    then draws of the masked policy with ``np.random.default_rng(seed)``."""
    eps = [DagEpisode(inst) for _ in range(1 + samples)]
    run_episodes(model, eps, DagEpisode.key, seed)
    return [e.plan for e in eps if e.plan is not None]


class RLDag:
    """The trained policy's schedule, best over power modes and sampled episodes.

    Args:
        policy: saved policy file (default: the shipped dag_default_policy.zip).
        samples: sampled episodes per power mode besides the deterministic one
            (0: deterministic only).
        seed: sampling seed.

    After ``plan``, ``seconds`` is the planning time (policy loading excluded)
    and ``info`` says how many episodes met deadline and period.
    """

    # registered lazily as "rl-dag" (kind "dag") in schedulers/__init__.py: torch loads only when chosen
    name: ClassVar[str] = "rl-dag"

    def __init__(self, policy: str | None = None, samples: int = 8, seed: int = 0) -> None:
        if samples < 0:
            raise ValueError("samples must be >= 0")
        self.policy = str(policy) if policy else str(DEFAULT_DAG_POLICY)
        if not Path(self.policy).is_file():
            raise ConfigError("<scheduler rl-dag>", "scheduler.params.policy", f"no policy file {self.policy}")
        self.samples = samples
        self.seed = seed
        self.seconds = 0.0
        self.info: dict[str, Any] = {}

    def _model(self) -> Any:
        return load_policy(self.policy)         # cached per path after the first call

    def plan_costs(self, c: DagCosts) -> DagPlan:
        """The best of this scheduler's episodes in ``c``'s one power mode."""
        model = self._model()
        with one_torch_thread():
            plans = dag_rollout(model, DagInstance(c, int(model.action_space.n)), self.samples, self.seed)
        return best_plan([(p, c) for p in plans])[0]

    def plan(self, problem: DagProblem) -> DagPlan:
        model = self._model()
        t0 = time.perf_counter()
        cands: list[tuple[DagPlan, DagCosts]] = []
        with one_torch_thread():
            for m in problem.allowed_modes:
                c = planning_costs(problem, m)
                inst = DagInstance(c, int(model.action_space.n))
                cands += [(p, c) for p in dag_rollout(model, inst, self.samples, self.seed)]
        best, _ = best_plan(cands)
        self.seconds = time.perf_counter() - t0
        self.info = {"episodes": len(cands), "feasible_episodes": sum(p.feasible(c) for p, c in cands),
                     "seconds": round(self.seconds, 4)}
        return DagPlan(best.mode, best.unit, best.start_s, self.name)
