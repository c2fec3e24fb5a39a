"""DAgger for the `rl` placement policy: the exact solver labels the states the policy visits.

Behaviour cloning (schedulers/rl/training.py) fits the policy to the exact
optimum's own steps, so it never sees the states its own mistakes lead to,
and on long models one early mistake leads it far from every state it was
trained on. DAgger (Ross, Gordon and Bagnell, 2011) runs the policy, asks the
expert what to do in the states it reached, adds those steps to the data and
fits again. The expert here is the exact solver on the *completion* of a
partial placement (:func:`completion_space`): the cheapest placement that
keeps the units already placed as they are.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

from schedulers.exact import solve
from schedulers.rl.env import Episode, Instance
from sim.placement import PlacementSpace


def completion_space(ep: Episode) -> PlacementSpace:
    """A copy of ``ep``'s space in which only placements continuing its prefix are provisioned.

    The closed stages keep their segment and type; the open stage (its type,
    from its first unit) may end at unit ``ep.i`` or later; no other option
    holding a placed unit remains (it gets no replicas, which every searcher
    reads as infeasible).
    """
    sp = ep.inst.space
    i = ep.i
    allowed = sp.seg_j[:, None] >= i                              # options holding no placed unit
    allowed = np.repeat(allowed, sp.K, axis=1)
    a = ep.assignment
    j = 0
    while j < ep.start:                                           # the closed stages
        e = j + 1
        while e < ep.start and a[e] == a[j]:
            e += 1
        allowed[sp.seg_index[j, e], a[j]] = True
        j = e
    if ep.prev >= 0:
        allowed[sp.seg_index[ep.start, i:sp.L + 1], ep.prev] = True
    c = copy.copy(sp)
    c.n = np.where(allowed, sp.n, 0)
    c.rate = np.where(allowed, sp.rate, np.inf)
    c.tput = np.where(allowed, sp.tput, 0.0)
    c.ps = np.where(allowed, sp.ps, 0.0)
    c.busy = np.where(allowed, sp.busy, 0.0)
    return c


def expert_action(ep: Episode, time_limit_s: float) -> int | None:
    """The type of unit ``ep.i`` in the cheapest feasible completion of ``ep``; None when no
    completion is feasible (or none was found in time)."""
    r = solve(completion_space(ep), time_limit_s=time_limit_s)
    if r.assignment is None or not np.isfinite(r.cost_usd):
        return None
    return int(r.assignment[ep.i])


def policy_logits(model: Any, obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The masked policy's logits for one observation."""
    import torch

    policy = model.policy
    with torch.no_grad():
        feats = policy.extract_features(torch.as_tensor(obs[None, :]), policy.pi_features_extractor)
        logits = policy.action_net(policy.mlp_extractor.forward_actor(feats)).numpy()[0].astype(float)
    return np.where(mask, logits, -np.inf)


def visited_steps(model: Any, pool: Sequence[Instance], per_episode: int, rng: np.random.Generator,
                  time_limit_s: float = 0.5, sample_share: float = 0.5
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, int]]:
    """(observations, masks, expert actions) at up to ``per_episode`` states of one episode of
    the policy per instance of ``pool``, and counts (states labelled, without a completion).

    An episode follows the policy's most probable action, or (with
    probability ``sample_share``) samples it; the states labelled are drawn
    uniformly among its steps.
    """
    obs, masks, acts = [], [], []
    counts = {"labelled": 0, "no_completion": 0}
    for inst in pool:
        ep = Episode(inst)
        sample = rng.random() < sample_share
        L = inst.space.L
        chosen = set(rng.choice(L, size=min(per_episode, L), replace=False).tolist())
        while not ep.done:
            o, m = ep.observation(), ep.action_mask()
            if ep.i in chosen:
                a = expert_action(ep, time_limit_s)
                if a is None or not m[a]:
                    counts["no_completion"] += 1
                else:
                    obs.append(o)
                    masks.append(m)
                    acts.append(a)
                    counts["labelled"] += 1
            lg = policy_logits(model, o, m)
            if sample:
                p = np.exp(lg - lg.max())
                k = int(rng.choice(lg.size, p=p / p.sum()))
            else:
                k = int(np.argmax(lg))
            ep.step(k)
    return np.array(obs), np.array(masks), np.array(acts), counts
