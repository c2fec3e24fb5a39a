"""`rl`: place layers with a trained MaskablePPO policy (the HeterPS method).

The policy sees one layer at a time (schedulers/rl/env.py) and picks its
device type among the valid ones. ``samples = 0`` runs it once,
deterministically (the most probable valid type at every step); ``samples =
k`` (default 16) also draws k episodes from the policy's distribution
(seeded) and keeps the best of the k + 1 placements by the problem's
objective. The default policy ships with the package
(schedulers/rl/default_policy.zip, trained on random instances by ``hetsim
train-rl --random``); ``policy`` names another. The policy was trained for
cost; with ``minimize: energy`` or ``time`` only the choice among its
placements follows the objective.

If every placement the policy makes is infeasible, the plan falls back to
`greedy` (then `genetic`) and says so in ``plan.options["rl"]["fallback"]``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hardware_profiles.errors import ConfigError
from schedulers.placement import Genetic, Greedy, PlacementScheduler, merge_descent, score
from schedulers.rl.env import Episode, Instance
from schedulers.rl.masked_env import Stepper
from sim.placement import PlacementInfeasible, PlacementSpace
from sim.plan import Plan
from sim.problem import Problem

DEFAULT_POLICY = Path(__file__).with_name("default_policy.zip")


@lru_cache(maxsize=4)
def load_policy(path: str) -> Any:
    """A saved MaskablePPO model (cached per path), on the CPU."""
    from sb3_contrib import MaskablePPO

    if not Path(path).is_file():
        raise ConfigError("<scheduler rl>", "scheduler.params.policy", f"no policy file {path}")
    return MaskablePPO.load(path, device="cpu")


def run_episodes(model: Any, eps: Sequence[Stepper], key: Callable[[Any], bytes], seed: int = 0) -> None:
    """Advance episodes of equal length to their end with a saved policy.

    Episode 0 takes the most probable valid action at every step; the others
    sample the masked policy with ``np.random.default_rng(seed)``. All advance
    together, one batched forward pass per step. ``key(episode)`` names an
    episode's state (its actions so far): episodes that agree on it share one
    observation and one forward pass.
    """
    import torch

    rng = np.random.default_rng(seed)
    policy = model.policy
    with torch.no_grad():
        while not eps[0].done:
            where: dict[bytes, int] = {}
            row = [where.setdefault(key(e), len(where)) for e in eps]
            first = {r: n for n, r in reversed(list(enumerate(row)))}
            uniq = [eps[first[r]] for r in range(len(where))]
            obs = torch.as_tensor(np.stack([e.observation() for e in uniq]))
            masks = np.stack([e.action_mask() for e in uniq])
            # the masked distribution of sb3-contrib's get_distribution, without its overhead
            feats = policy.extract_features(obs, policy.pi_features_extractor)
            logits = policy.action_net(policy.mlp_extractor.forward_actor(feats)).numpy().astype(float)
            logits = np.where(masks, logits, -np.inf)
            probs = np.exp(logits - logits.max(axis=1, keepdims=True))
            acts = [int(np.argmax(logits[row[0]]))]
            for r in row[1:]:
                acts.append(int(rng.choice(probs.shape[1], p=probs[r] / probs[r].sum())))
            for e, a in zip(eps, acts):
                e.step(a)


def rollout(model: Any, inst: Instance, samples: int = 0, seed: int = 0) -> np.ndarray:
    """Assignments of ``1 + samples`` episodes on one instance, shape (1 + samples, L).

    Row 0 is the deterministic decode; the others sample the masked policy
    with ``np.random.default_rng(seed)`` (:func:`run_episodes`).
    """
    eps = [Episode(inst) for _ in range(1 + samples)]
    run_episodes(model, eps, lambda e: e.assignment[: e.i].tobytes(), seed)
    return np.stack([e.assignment for e in eps])


class RL(PlacementScheduler):
    """The trained policy's placement (deterministic, or best of ``samples`` draws too).

    Args:
        policy: saved policy file (default: the shipped default_policy.zip).
        samples: extra sampled episodes; the best of them and the
            deterministic one is kept (0: deterministic only; default 16).
        seed: sampling seed (default: the problem's seed).
        polish: then merge neighbouring stages while that lowers the objective
            (greedy's local search, not the policy; off by default).
    """

    # registered lazily as "rl" in schedulers/__init__.py (torch loads only when chosen)
    name: ClassVar[str] = "rl"

    def __init__(self, policy: str | None = None, samples: int = 16, seed: int | None = None,
                 polish: bool = False) -> None:
        if samples < 0:
            raise ValueError("samples must be >= 0")
        self.policy = str(policy) if policy else str(DEFAULT_POLICY)
        self.samples = samples
        self.seed = seed
        self.polish = polish

    def plan(self, problem: Problem) -> Plan:
        t_load = time.perf_counter()
        model = load_policy(self.policy)         # cached after the first call
        t0 = time.perf_counter()
        space = PlacementSpace(problem)
        minimize = problem.objective.minimize
        inst = Instance(problem, int(model.action_space.n), space=space, search=False)
        seed = self.seed if self.seed is not None else problem.seed
        A = rollout(model, inst, self.samples, seed)
        ev = space.evaluate(A)
        s = score(ev, minimize)
        best = int(np.argmin(s))
        info: dict[str, Any] = {"policy": Path(self.policy).name, "samples": self.samples,
                                "deterministic_feasible": bool(ev.feasible[0]),
                                "deterministic_cost_usd": float(ev.cost_usd[0]),
                                "feasible_episodes": int(ev.feasible.sum()), "fallback": None}
        a = A[best]
        if not np.isfinite(s[best]):
            for name, sched in (("greedy", Greedy()), ("genetic", Genetic(seed=seed))):
                g = sched.search(space, minimize)
                if g is not None and space.evaluate(g[None, :]).feasible[0]:
                    a, info["fallback"] = g, name
                    break
            else:
                raise PlacementInfeasible("rl: " + space.describe_infeasible(A[0]))
        elif self.polish:
            a, info["polished_from_cost_usd"] = merge_descent(space, a, minimize), float(ev.cost_usd[best])
        plan = space.to_plan(a, self.name)
        info["seconds"] = round(time.perf_counter() - t0, 4)        # planning, without the load
        info["load_seconds"] = round(t0 - t_load, 4)
        plan.options["rl"] = info
        return plan

    def search(self, space: PlacementSpace, minimize: str) -> np.ndarray | None:
        """The deterministic decode's assignment (no fallback)."""
        model = load_policy(self.policy)
        return rollout(model, Instance(space.problem, int(model.action_space.n), space=space, search=False), 0)[0]
