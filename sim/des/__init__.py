"""The discrete-event simulator (SimPy) of distributed training."""

from __future__ import annotations

from collections.abc import Callable

from sim.costmodel import plan_costs
from sim.des.engine import DataParallelSim
from sim.plan import Plan
from sim.problem import Problem
from sim.result import RunResult


def simulate(problem: Problem, plan: Plan, trace: bool = True,
             on_iteration: Callable[[int], None] | None = None) -> RunResult:
    """Run ``plan`` for ``problem.job.iterations`` iterations in the DES.

    Deterministic: the same problem and plan give the same result, byte for byte.

    Args:
        trace: record a Chrome trace (capped at 200,000 events).
        on_iteration: called with the number of iterations done after each one
            (progress bars).
    """
    sim = DataParallelSim(problem, plan, plan_costs(problem, plan), trace=trace,
                          on_iteration=on_iteration)
    return sim.run()


__all__ = ["simulate", "DataParallelSim"]
