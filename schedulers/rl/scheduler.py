"""`rl`: place layers with a trained MaskablePPO policy (the HeterPS method).

The policy sees one unit at a time (schedulers/rl/env.py) and picks its
device type among the valid ones; a unit is a layer, or for a model of more
than the policy's ``groups`` layers (24 by default) a contiguous group of
layers (schedulers/rl/grouping.py). ``samples = 0`` runs it once,
deterministically (the most probable valid type at every step); ``samples =
k`` (default 16) also draws k episodes from the policy's distribution
(seeded) and keeps the best of the k + 1 placements by the problem's
objective, after moving each one's stage boundaries layer by layer while
that lowers the objective (``refine``). The default policy ships with the
package (schedulers/rl/default_policy.zip, trained on random and real-model
instances by ``hetsim train-rl --random --real-share ...``; its sidecar
default_policy.json records the run); ``policy`` names another. The policy
was trained for cost; with ``minimize: energy`` or ``time`` only the choice
among its placements follows the objective.

The floor is a hard constraint: a plan below ``throughput_min`` is never
returned. If every placement the policy makes misses it, the deterministic
one is repaired by greedy's merge repair (``plan.options["rl"]["repaired"]``);
if that fails too the plan falls back to `greedy` (then `genetic`) and says
so in ``plan.options["rl"]["fallback"]``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hardware_profiles.errors import ConfigError
from schedulers.placement import (
    Genetic,
    Greedy,
    PlacementScheduler,
    merge_descent,
    merge_repair,
    score,
    shift_descent,
)
from schedulers.rl.env import Episode, Instance
from schedulers.rl.grouping import MAX_GROUPS
from schedulers.rl.masked_env import Stepper
from sim.placement import PlacementInfeasible, PlacementSpace
from sim.plan import Plan
from sim.problem import Problem

DEFAULT_POLICY = Path(__file__).with_name("default_policy.zip")
#: Softmax temperature of the sampled episodes: above 1 they stray further from the
#: deterministic one, so that best-of-k sees more distinct placements.
TEMPERATURE = 2.0


@lru_cache(maxsize=4)
def load_policy(path: str) -> Any:
    """A saved MaskablePPO model (cached per path), on the CPU."""
    from sb3_contrib import MaskablePPO

    if not Path(path).is_file():
        raise ConfigError("<scheduler rl>", "scheduler.params.policy", f"no policy file {path}")
    return MaskablePPO.load(path, device="cpu")


def run_episodes(model: Any, eps: Sequence[Stepper], key: Callable[[Any], bytes], seed: int = 0,
                 temperature: float = 1.0) -> None:
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
            probs = np.exp((logits - logits.max(axis=1, keepdims=True)) / temperature)
            acts = [int(np.argmax(logits[row[0]]))]
            for r in row[1:]:
                acts.append(int(rng.choice(probs.shape[1], p=probs[r] / probs[r].sum())))
            for e, a in zip(eps, acts):
                e.step(a)


def rollout(model: Any, inst: Instance, samples: int = 0, seed: int = 0, temperature: float = 1.0) -> np.ndarray:
    """Per-unit assignments of ``1 + samples`` episodes on one instance, shape (1 + samples, units).

    Row 0 is the deterministic decode; the others sample the masked policy
    with ``np.random.default_rng(seed)`` (:func:`run_episodes`).
    """
    eps = [Episode(inst) for _ in range(1 + samples)]
    run_episodes(model, eps, lambda e: e.assignment[: e.i].tobytes(), seed, temperature)
    return np.stack([e.assignment for e in eps])


def policy_groups(path: str) -> int:
    """The units a policy was trained to place (its sidecar's ``config.groups``; MAX_GROUPS
    for a policy whose sidecar does not say)."""
    side = Path(path).with_suffix(".json")
    try:
        return int(json.loads(side.read_text())["config"]["groups"])
    except (OSError, ValueError, KeyError, TypeError):
        return MAX_GROUPS


class RL(PlacementScheduler):
    """The trained policy's placement (deterministic, or best of ``samples`` draws too).

    Args:
        policy: saved policy file (default: the shipped default_policy.zip).
        samples: extra sampled episodes; the best of them and the
            deterministic one is kept (0: deterministic only; default 16).
        seed: sampling seed (default: the problem's seed).
        temperature: softmax temperature of the sampled episodes (default
            ``TEMPERATURE``; 1 samples the policy's own distribution).
        refine: then, in each distinct feasible placement of the episodes, move
            stage boundaries layer by layer while that lowers the objective
            (:func:`schedulers.placement.shift_descent`: the policy places
            groups of layers, this restores the layer resolution), and keep the
            best (on by default).
        polish: then merge neighbouring stages while that lowers the objective
            (greedy's local search, not the policy; off by default).
    """

    # registered lazily as "rl" in schedulers/__init__.py (torch loads only when chosen)
    name: ClassVar[str] = "rl"

    def __init__(self, policy: str | None = None, samples: int = 16, seed: int | None = None,
                 temperature: float = TEMPERATURE, refine: bool = True, polish: bool = False) -> None:
        if samples < 0:
            raise ValueError("samples must be >= 0")
        if not temperature > 0:
            raise ValueError("temperature must be > 0")
        self.temperature = float(temperature)
        self.policy = str(policy) if policy else str(DEFAULT_POLICY)
        self.samples = samples
        self.seed = seed
        self.refine = refine
        self.polish = polish

    def instance(self, model: Any, space: PlacementSpace) -> Instance:
        return Instance(space.problem, int(model.action_space.n), space=space, search=False,
                        groups=policy_groups(self.policy))

    def plan(self, problem: Problem) -> Plan:
        t_load = time.perf_counter()
        model = load_policy(self.policy)         # cached after the first call
        t0 = time.perf_counter()
        space = PlacementSpace(problem)
        minimize = problem.objective.minimize
        inst = self.instance(model, space)
        seed = self.seed if self.seed is not None else problem.seed
        A = inst.expand(rollout(model, inst, self.samples, seed, self.temperature))
        ev = space.evaluate(A)
        s = score(ev, minimize)
        best = int(np.argmin(s))
        info: dict[str, Any] = {"policy": Path(self.policy).name, "samples": self.samples,
                                "units": inst.space.L, "deterministic_feasible": bool(ev.feasible[0]),
                                "deterministic_cost_usd": float(ev.cost_usd[0]),
                                "feasible_episodes": int(ev.feasible.sum()), "repaired": False, "fallback": None}
        if not np.isfinite(s[best]):
            a = self.repair_or_fall_back(space, A[0], minimize, seed, info)
            cands, cost = a[None, :], float(space.evaluate(a[None, :]).cost_usd[0])
        else:
            a, cands, cost = A[best], np.unique(A[np.isfinite(s)], axis=0), float(ev.cost_usd[best])
        if self.refine:
            info["refined_from_cost_usd"] = cost
            R = np.array([shift_descent(space, c, minimize) for c in cands])
            a = R[int(np.argmin(score(space.evaluate(R), minimize)))]
        if self.polish:
            info["polished_from_cost_usd"] = float(space.evaluate(a[None, :]).cost_usd[0])
            a = merge_descent(space, a, minimize)
        plan = space.to_plan(a, self.name)
        info["seconds"] = round(time.perf_counter() - t0, 4)        # planning, without the load
        info["load_seconds"] = round(t0 - t_load, 4)
        plan.options["rl"] = info
        return plan

    @staticmethod
    def repair_or_fall_back(space: PlacementSpace, a: np.ndarray, minimize: str, seed: int,
                            info: dict[str, Any]) -> np.ndarray:
        """No episode met the floor: the deterministic one repaired by greedy's merge repair
        (``info["repaired"]``), else greedy's then genetic's plan (``info["fallback"]``)."""
        r = merge_repair(space, a, minimize)
        if r is not None:
            info["repaired"] = True
            return r
        for name, sched in (("greedy", Greedy()), ("genetic", Genetic(seed=seed))):
            g = sched.search(space, minimize)
            if g is not None and space.evaluate(g[None, :]).feasible[0]:
                info["fallback"] = name
                return g
        raise PlacementInfeasible("rl: " + space.describe_infeasible(a))

    def search(self, space: PlacementSpace, minimize: str) -> np.ndarray | None:
        """The deterministic decode's assignment (no repair, refinement or fallback)."""
        model = load_policy(self.policy)
        inst = self.instance(model, space)
        return inst.expand(rollout(model, inst, 0)[0])
