"""`equal`: the homogeneous-PS baseline: the global batch split evenly."""

from __future__ import annotations

from schedulers.base import data_parallel_plan, register
from sim.plan import Plan
from sim.problem import Problem


@register("equal")
class Equal:
    """Every device gets B // N samples; the first B % N get one more."""

    def plan(self, problem: Problem) -> Plan:
        n = len(problem.cluster.devices)
        B = problem.job.global_batch
        shares = [B // n + (1 if i < B % n else 0) for i in range(n)]
        return data_parallel_plan(problem, shares, "equal")
