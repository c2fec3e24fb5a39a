"""`hps`: H-PS dynamic allocation of the global batch over heterogeneous workers.

Every ``rebalance_every`` global iterations the scheduler resets the shares
proportional to each worker's exponentially smoothed observed rate, capped by
what fits in the worker's free memory:

    cap = floor((free_memory_bytes - fixed) / per_sample)
    fixed = param_bytes * (2 + optimizer_state_copies)   (parameters, gradients, state)
    per_sample = sum of layer activation bytes x dtype scale   (training keeps them all)

(:func:`sim.costmodel.fixed_memory_bytes`,
:func:`sim.costmodel.activation_memory_per_sample_bytes`). Capped workers
keep their cap and the rest of the batch is spread over the others in
proportion to rate until no cap is violated; integers sum to the global
batch. When a failure is detected the dead worker's share goes to the others
at once, without waiting for the next period. If the cluster cannot hold the
global batch at all, every worker gets its cap and the shortfall is recorded
in ``plan.options["memory_short_samples"]`` (nothing is raised here; a plan
checker may still refuse such a plan).

``status_aware: false`` is the ablation without status awareness: the shares
come from the modelled (profiled) rates and the free memory at t = 0 only, as
in :meth:`HPS.plan`, and observations never move them. A detected failure
still sends the dead worker's share to the others at once, split by the same
modelled rates and t = 0 caps (otherwise the global batch would shrink).

H-PS's other mechanisms are job options in hetsim, not the scheduler's:
layer-wise pipelining of push/pull is ``job.pipeline`` and gradient
quantization is ``job.quantization``. The scheduler's mechanism is the
allocation.
"""

from __future__ import annotations

import dataclasses

from schedulers.base import RateEstimate, capped_largest_remainder, register
from schedulers.proportional import Proportional
from sim.costmodel import iteration_compute_s, max_batch_in_memory
from sim.observation import Observation
from sim.plan import Plan
from sim.problem import Problem, initial_free_memory_bytes
from sim.workload import Model


@register("hps")
class HPS:
    """Memory-capped, rate-proportional shares, reset every ``rebalance_every`` iterations.

    Args:
        rebalance_every: global iterations between two resets (>= 1).
        alpha: smoothing weight of the newest observed rate, in (0, 1].
        optimizer_state_copies: parameter-sized optimizer buffers per worker
            (1: momentum SGD, 2: Adam, 0: plain SGD).
        rounds: refinement rounds of the modelled rates of the initial plan.
        status_aware: False: never rebalance from observed rates or free memory;
            keep the plan's modelled split (a failure is still redistributed,
            by modelled rates).
        min_share: samples every live worker keeps at a rebalance (when its
            memory holds them and the global batch allows), so a worker that
            looked slow is still measured and can win its share back; 0 lets
            a worker's share fall to nothing for good.
    """

    def __init__(self, rebalance_every: int = 5, alpha: float = 0.5, optimizer_state_copies: int = 1,
                 rounds: int = 5, status_aware: bool = True, min_share: int = 1) -> None:
        if min_share < 0:
            raise ValueError("min_share must be >= 0")
        if rebalance_every < 1:
            raise ValueError("rebalance_every must be >= 1")
        if optimizer_state_copies < 0:
            raise ValueError("optimizer_state_copies must be >= 0")
        self.rebalance_every = rebalance_every
        self.copies = optimizer_state_copies
        self.rates = RateEstimate(alpha)
        self.proportional = Proportional(rounds)
        self.calls = 0
        self.model: Model | None = None  # set by plan(): caps need the model
        self.dtype = "fp32"
        self.status_aware = status_aware
        self.min_share = min_share
        # set by plan(): the modelled rate and the t = 0 cap of every worker, by device id
        self.modelled: dict[str, tuple[float, int | None]] = {}

    def plan(self, problem: Problem) -> Plan:
        """Memory-capped proportional split from the modelled rates (free memory at t = 0)."""
        job = problem.job
        self.model, self.dtype = job.model, job.dtype
        base = self.proportional.plan(problem)
        devs = [problem.cluster.device(r.device) for r in base.replicas]
        rates = [r.batch / iteration_compute_s(job.model, d.type, job.dtype, r.batch, job.memory_format)
                 for r, d in zip(base.replicas, devs)]
        free_now = initial_free_memory_bytes(problem)
        free = [free_now[d.id] for d in devs]
        caps = [max_batch_in_memory(job.model, job.dtype, f, self.copies) for f in free]
        self.modelled = {r.device: (rate, cap) for r, rate, cap in zip(base.replicas, rates, caps)}
        shares, short = capped_largest_remainder(rates, caps, job.global_batch)
        plan = dataclasses.replace(base, scheduler=self.name)  # type: ignore[attr-defined]
        plan = plan.with_shares({r.device: b for r, b in zip(base.replicas, shares)})
        # with_shares drops zero shares; a worker that cannot hold one sample is left out
        if short:
            plan.options["memory_short_samples"] = short
        return plan

    def caps(self, obs: Observation) -> list[int | None]:
        """Samples each worker can hold in its free memory (None: no cap known)."""
        if self.model is None:
            return [None] * len(obs.workers)
        return [max_batch_in_memory(self.model, self.dtype, w.free_memory_bytes, self.copies)
                for w in obs.workers]

    def rebalance(self, plan: Plan, obs: Observation) -> Plan | None:
        dead_with_work = any(not w.alive and w.batch > 0 for w in obs.workers)
        if not self.status_aware:
            return self._without_status(plan, obs) if dead_with_work else None
        self.rates.update(obs)
        self.calls += 1
        if self.calls % self.rebalance_every != 0 and not dead_with_work:
            return None
        rates = self.rates.live_rates(obs)
        if rates is None:
            if not dead_with_work:
                return None
            rates = [float(w.batch) if w.alive else 0.0 for w in obs.workers]
            if sum(rates) <= 0:
                rates = [1.0 if w.alive else 0.0 for w in obs.workers]
        return self._apply(plan, obs, rates, self.caps(obs))

    def _without_status(self, plan: Plan, obs: Observation) -> Plan | None:
        """A failure without status awareness: the live workers' modelled rates and t = 0 caps."""
        rates = [self.modelled.get(w.device, (0.0, None))[0] if w.alive else 0.0 for w in obs.workers]
        if sum(rates) <= 0:
            rates = [1.0 if w.alive else 0.0 for w in obs.workers]
        caps = [self.modelled.get(w.device, (0.0, None))[1] for w in obs.workers]
        return self._apply(plan, obs, rates, caps)

    def _floor(self, shares: list[int], obs: Observation, caps: list[int | None]) -> list[int]:
        """Raise live workers below ``min_share`` to it, taking samples from the largest shares."""
        m = self.min_share
        live = [i for i, (w, c) in enumerate(zip(obs.workers, caps)) if w.alive and (c is None or c >= m)]
        if m == 0 or len(live) * m > obs.global_batch:
            return shares
        out = list(shares)
        for i in live:
            while out[i] < m:
                j = max(range(len(out)), key=lambda x: (out[x] - (m if x in live else 0), -x))
                if out[j] - (m if j in live else 0) <= 0:
                    return shares
                out[j] -= 1
                out[i] += 1
        return out

    def _apply(self, plan: Plan, obs: Observation, rates: list[float],
               caps: list[int | None]) -> Plan | None:
        shares, short = capped_largest_remainder(rates, caps, obs.global_batch)
        shares = self._floor(shares, obs, caps)
        if shares == [w.batch for w in obs.workers] and short == int(plan.options.get("memory_short_samples", 0)):
            return None
        new = plan.with_shares({w.device: b for w, b in zip(obs.workers, shares)})
        new.options.pop("memory_short_samples", None)
        if short:
            new.options["memory_short_samples"] = short
        return new
