"""The discrete-event simulator (SimPy) of distributed training."""

from __future__ import annotations

from sim.costmodel import plan_costs
from sim.des.engine import DataParallelSim
from sim.plan import Plan
from sim.problem import Problem
from sim.result import RunResult


def simulate(problem: Problem, plan: Plan, trace: bool = True) -> RunResult:
    """Run ``plan`` for ``problem.job.iterations`` iterations in the DES.

    Deterministic: the same problem and plan give the same result, byte for byte.
    """
    sim = DataParallelSim(problem, plan, plan_costs(problem, plan), trace=trace)
    return sim.run()


__all__ = ["simulate", "DataParallelSim"]
