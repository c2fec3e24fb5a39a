"""The discrete-event simulator (SimPy) of distributed training."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.costmodel import plan_costs
from sim.des.engine import DataParallelSim
from sim.des.pipeline import simulate_pipeline
from sim.plan import Plan
from sim.problem import Problem
from sim.result import RunResult


def simulate(problem: Problem, plan: Plan, trace: bool = True,
             on_iteration: Callable[[int], None] | None = None, scheduler: Any = None) -> RunResult:
    """Run ``plan`` for ``problem.job.iterations`` iterations in the DES.

    Deterministic: the same problem and plan give the same result, byte for byte.

    Args:
        trace: record a Chrome trace (capped at 200,000 events).
        on_iteration: called with the number of iterations done after each one
            (progress bars).
        scheduler: the scheduler that made ``plan``. If it has a callable
            ``rebalance(plan, observation)`` (an online scheduler), it is called at
            the end of every global iteration and the plan it returns is applied
            (see :mod:`sim.des.engine`); ``extra["rebalances"]`` counts the plans
            applied and ``extra["final_shares"]`` gives the last one.

    Layer-placement plans (:attr:`Plan.is_placement`) run in
    :mod:`sim.des.pipeline` (``scheduler`` is not called: placement plans are static).
    """
    if plan.is_placement:  # layer placement: a pipeline of stages
        return simulate_pipeline(problem, plan, trace=trace, on_iteration=on_iteration)
    sim = DataParallelSim(problem, plan, plan_costs(problem, plan), trace=trace,
                          on_iteration=on_iteration, scheduler=scheduler)
    return sim.run()


__all__ = ["simulate", "DataParallelSim"]
