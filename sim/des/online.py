"""Online scheduling and adaptive quantization in a data-parallel run: new shares, new widths.

Given a scheduler with a callable ``rebalance``, the run calls it at the end of
every global iteration with an :class:`~sim.observation.Observation` of the
iterations since the previous call, and stages the plan it returns; with
``job.quant_adaptive``, every ``job.quant_every``-th global iteration's modelled
loss goes to the policy, and a new width is staged likewise. Staged rows are
taken by each worker from the next iteration it starts (see :mod:`sim.des.engine`).
"""

from __future__ import annotations

import dataclasses

from sim.costmodel import PlanCosts, plan_costs
from sim.des.costrows import worker_rows
from sim.des.state import RunState
from sim.observation import Observation, WorkerStatus, accepted_shares, full_membership, rate_sps
from sim.plan import Plan


class Online(RunState):
    """Rebalances and width changes (a mixin of :class:`sim.des.engine.DataParallelSim`)."""

    __slots__ = ()

    def _adopt(self, w: int) -> None:
        """Worker w starts an iteration: it takes its pending share, if any."""
        rows = self.next_rows[w]
        if rows is None:
            return
        self.next_rows[w] = None
        (self.batch[w], self.fwd[w], self.bwd[w], self.pull_b[w], self.push_b[w],
         self.agg[w], self.apply_one[w], self.wbits[w], self.quant[w]) = rows

    def observation(self) -> Observation:
        """The Observation of the window since the previous rebalance call."""
        cl = self.problem.cluster
        share = {r.device: r.batch for r in self.plan_now.replicas}
        ws = tuple(
            WorkerStatus(device=dev, batch=share.get(dev, 0), compute_s=self.win_compute[w],
                         samples=self.win_samples[w], rate_sps=rate_sps(self.win_samples[w], self.win_compute[w]),
                         free_memory_bytes=cl.device(dev).type.memory_bytes * self.free_frac[w],
                         alive=not self.detected[w])
            for w, dev in enumerate(self.c.workers)
        )
        return Observation(self.env.now, len(self.iter_end), ws, self.problem.job.global_batch)

    def _rebalance(self) -> None:
        assert self.rebalance_fn is not None
        obs = self.observation()
        self.win_compute = [0.0] * self.N
        self.win_samples = [0] * self.N
        # Schedulers see every worker of the run, idle and dead ones with share 0.
        new = self.rebalance_fn(full_membership(self.plan_now, self.c.workers), obs)
        if new is None:
            return
        shares = accepted_shares(new, obs, self.problem.job.global_batch)
        full = full_membership(new, self.c.workers, shares)
        costs = self._stage(full)
        for w in range(self.N):
            self.next_pull[w] = costs.pull_bytes[w].tolist()
            wake = self.wake[w]
            if shares[w] > 0 and wake is not None and not wake.triggered:
                wake.succeed()
        self.plan_now = full
        self.rebalances += 1

    def _stage(self, plan: Plan) -> PlanCosts:
        """Cost rows of ``plan`` at the current width, taken by each worker at the
        next iteration it starts (a rebalance and a width change both go through here)."""
        costs = plan_costs(self.qproblem, plan)
        if costs.n_chunks != self.C or list(costs.chunk_shard) != self.chunk_shard:
            raise ValueError("a new plan or width must keep the PS shards and layer groups")
        rows = worker_rows(costs, self.qproblem.job.quant_bits)
        for w in range(self.N):
            self.next_rows[w] = rows[w]
        self.apply_all = costs.apply_s.tolist()
        return costs

    def _requantize(self) -> None:
        """Adaptive quantization: observe the loss (every ``quant_every`` iterations) and,
        when the policy's width changes, rebuild every worker's cost rows at the new width
        (taken from each worker's next iteration, like a rebalanced share)."""
        assert self.qpolicy is not None
        k = len(self.iter_end)
        if k % self.problem.job.quant_every:
            return
        self.loss_history.append(self.iter_loss[-1])
        cur = self.qproblem.job.quant_bits
        if self.qpolicy.monotone and cur == self.qpolicy.levels[-1]:
            return  # already the finest: a monotone policy never goes coarser
        q = self.qpolicy.bits(k, self.loss_history)
        if q == cur:
            return
        self.qproblem = dataclasses.replace(self.problem, job=dataclasses.replace(self.problem.job, quant_bits=q))
        self.quant_changes.append((k, q))
        # plan_now holds every pending share (a rebalance updates it), so its costs
        # at the new width are the rows each worker takes next.
        self._stage(self.plan_now)
