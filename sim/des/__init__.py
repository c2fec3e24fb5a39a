"""The discrete-event simulator (SimPy) of distributed training: :func:`simulate` runs a
data-parallel plan (:func:`sim.evaluate.evaluate` dispatches every plan kind)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sim.costmodel import plan_costs
from sim.des.engine import DataParallelSim
from sim.emulation import RuntimeEmulation, emulated_problem
from sim.plan import Plan, PlanKind, require_kind
from sim.problem import Problem
from sim.result import RunResult


def simulate(problem: Problem, plan: Plan, trace: bool = True,
             on_iteration: Callable[[int], None] | None = None, scheduler: Any = None,
             emulation: RuntimeEmulation | None = None) -> RunResult:
    """Run the data-parallel ``plan`` for ``problem.job.iterations`` iterations in the DES.

    Deterministic: the same problem and plan give the same result, byte for byte.

    Args:
        trace: record a Chrome trace (capped at 200,000 events).
        on_iteration: called with the number of iterations done after each one
            (progress bars).
        scheduler: the scheduler that made ``plan``. If it is an
            :class:`~sim.scheduling.OnlineScheduler`, its ``rebalance(plan, observation)``
            is called at the end of every global iteration and the plan it returns is
            applied (see :mod:`sim.des.engine`); ``extra["rebalances"]`` counts the plans
            applied and ``extra["final_shares"]`` gives the last one.
        emulation: the runtime on this machine (:class:`~sim.emulation.RuntimeEmulation`:
            the run is of :func:`~sim.emulation.emulated_problem`, and the DES models its
            CPU scales, serial messages and whole pulls); None: a plain simulation.

    Plans of another kind are refused (ValueError): :func:`sim.evaluate.evaluate`
    runs layer placements in :mod:`sim.des.pipeline` and DAG schedules in
    :mod:`sim.des.frames`.
    """
    require_kind(plan, PlanKind.DATA_PARALLEL, "sim.des.simulate")
    if problem.job.sync == "allreduce":
        raise ValueError("sim.des.simulate runs parameter-server plans; an all-reduce job runs in "
                         "sim.des.collective.simulate (sim.evaluate.evaluate picks it)")
    problem = emulated_problem(problem, emulation)
    sim = DataParallelSim(problem, plan, plan_costs(problem, plan), trace=trace,
                          on_iteration=on_iteration, scheduler=scheduler, emulation=emulation)
    return sim.run()


__all__ = ["simulate", "DataParallelSim"]
