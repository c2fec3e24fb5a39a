"""`lbbsp`: LB-BSP-style load balancing of BSP iterations by observed speed.

At every barrier the scheduler predicts each worker's speed as its
exponentially smoothed observed rate and aims for shares that make the
predicted compute times equal (shares proportional to rate). To avoid
oscillation it moves only part of the way:
``new = damping * old + (1 - damping) * target``, rounded to integers summing
to the global batch by largest remainder. The initial plan is
``proportional``'s split from the modelled rates.
"""

from __future__ import annotations

import dataclasses

from schedulers.base import RateEstimate, largest_remainder, register
from schedulers.proportional import Proportional
from sim.observation import Observation
from sim.plan import Plan
from sim.problem import Problem


@register("lbbsp")
class LBBSP:
    """Rebalance at every barrier towards shares proportional to the smoothed rate.

    Args:
        alpha: smoothing weight of the newest observed rate, in (0, 1].
        damping: weight of the old share in the new one, in [0, 1) (0: jump to the target).
        rounds: refinement rounds of the initial proportional split.
    """

    def __init__(self, alpha: float = 0.5, damping: float = 0.5, rounds: int = 5) -> None:
        if not 0.0 <= damping < 1.0:
            raise ValueError("damping must be in [0, 1)")
        self.rates = RateEstimate(alpha)
        self.damping = damping
        self.initial = Proportional(rounds)

    def plan(self, problem: Problem) -> Plan:
        return dataclasses.replace(self.initial.plan(problem), scheduler=self.name)  # type: ignore[attr-defined]

    def rebalance(self, plan: Plan, obs: Observation) -> Plan | None:
        self.rates.update(obs)
        rates = self.rates.live_rates(obs)
        if rates is None:
            return None
        B, total_rate = obs.global_batch, sum(rates)
        new = [0.0 if not w.alive else self.damping * w.batch + (1.0 - self.damping) * B * r / total_rate
               for w, r in zip(obs.workers, rates)]
        shares = largest_remainder(new, B)
        if shares == [w.batch for w in obs.workers]:
            return None
        return plan.with_shares({w.device: b for w, b in zip(obs.workers, shares)})
