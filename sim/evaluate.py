"""One entry point for every evaluator and every plan kind: :func:`evaluate`.

The plan's :class:`~sim.plan.PlanKind` picks the model, here and nowhere else:

========================  =========================================  ==================================
kind                      ``analytic``                               ``des``
========================  =========================================  ==================================
``DATA_PARALLEL``         :func:`sim.analytic.evaluate`              :func:`sim.des.simulate`
(``job.sync: allreduce``) :func:`sim.collective_analytic.evaluate`   :func:`sim.des.collective.simulate`
``PLACEMENT``             :func:`sim.multistage.evaluate_analytic`   :func:`sim.des.pipeline.simulate_pipeline`
``DAG``                   (none: a DAG plan's own figures)           :func:`sim.des.frames.simulate_frames`
========================  =========================================  ==================================

Only data-parallel plans are rebalanced by an online scheduler; placement and
DAG plans are static.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import assert_never

from sim import analytic, collective_analytic, des
from sim.dag import DagPlan, DagProblem, dag_costs
from sim.des import collective
from sim.des.frames import FrameOptions, simulate_frames
from sim.des.pipeline import simulate_pipeline
from sim.emulation import RuntimeEmulation, emulated_problem
from sim.multistage import evaluate_analytic
from sim.plan import Plan, PlanKind
from sim.problem import Problem
from sim.result import RunResult
from sim.scheduling import Scheduler

EVALUATORS = ("des", "analytic")


def evaluate(problem: Problem | DagProblem, plan: Plan | DagPlan, evaluator: str = "analytic", *,
             scheduler: Scheduler | None = None, trace: bool = True,
             on_iteration: Callable[[int], None] | None = None,
             frames: FrameOptions | None = None,
             emulation: RuntimeEmulation | None = None) -> RunResult:
    """Evaluate ``plan`` for ``problem`` with ``evaluator`` (``des`` or ``analytic``).

    Args:
        problem: a :class:`~sim.problem.Problem` (training plans) or a
            :class:`~sim.dag.DagProblem` (DAG plans).
        plan: a :class:`~sim.plan.Plan` or a :class:`~sim.dag.DagPlan`; its ``kind``
            picks the model (see the module docstring).
        scheduler: the scheduler that made ``plan``; an
            :class:`~sim.scheduling.OnlineScheduler` rebalances a data-parallel plan
            during the run (DES) or to its steady state (analytic).
        trace: record a Chrome trace (training plans; a DAG run traces
            ``frames.trace_frames`` frames).
        on_iteration: called with the iterations done after each one (DES of
            training plans: progress bars).
        frames: how the frames DES departs from a DAG plan's figures (default:
            ``FrameOptions()``).
        emulation: the runtime on this machine (:class:`~sim.emulation.RuntimeEmulation`,
            training plans), given to the evaluator; None: a plain simulation.

    Returns:
        The run's RunResult (a :class:`~sim.result.FrameResult` for a DAG plan).

    Raises:
        ValueError: an unknown evaluator, a problem of the wrong type for the
            plan's kind, the analytic evaluator asked for a DAG plan, or an
            emulation with a DAG plan.
    """
    if evaluator not in EVALUATORS:
        raise ValueError(f"unknown evaluator {evaluator!r}; use {' or '.join(EVALUATORS)}")
    des_run = evaluator == "des"
    match plan.kind:
        case PlanKind.DATA_PARALLEL:
            pr, pl = _training(problem, plan)
            if pr.job.sync == "allreduce":  # collectives among the workers, no PS
                if des_run:
                    return _noted(pr, collective.simulate(pr, pl, trace=trace, on_iteration=on_iteration,
                                                          scheduler=scheduler, emulation=emulation))
                return _noted(pr, collective_analytic.evaluate(emulated_problem(pr, emulation), pl,
                                                               scheduler=scheduler))
            if des_run:
                return _noted(pr, des.simulate(pr, pl, trace=trace, on_iteration=on_iteration,
                                               scheduler=scheduler, emulation=emulation))
            return _noted(pr, analytic.evaluate(pr, pl, scheduler=scheduler, emulation=emulation))
        case PlanKind.PLACEMENT:  # a pipeline of stages; static, so no scheduler
            pr, pl = _training(problem, plan)
            if pr.job.sync == "allreduce":
                raise ValueError("job.sync: allreduce runs data-parallel plans only, not a placement")
            if des_run:
                return _noted(pr, simulate_pipeline(pr, pl, trace=trace, on_iteration=on_iteration,
                                                    emulation=emulation))
            return _noted(pr, evaluate_analytic(pr, pl, emulation=emulation))
        case PlanKind.DAG:
            if not isinstance(plan, DagPlan) or not isinstance(problem, DagProblem):
                raise ValueError("a DAG plan is a sim.dag.DagPlan of a sim.dag.DagProblem")
            if emulation is not None:
                raise ValueError("a runtime emulation applies to training plans, not a DAG plan")
            if not des_run:
                raise ValueError("a DAG plan runs in the frames DES (evaluator 'des'); "
                                 "its own figures are DagPlan.makespan_s and energy_j")
            return simulate_frames(dag_costs(problem, plan.mode), plan, frames or FrameOptions(),
                                   name=problem.graph.name)
        case _:
            assert_never(plan.kind)


def _noted(problem: Problem, result: RunResult) -> RunResult:
    """``result`` with the problem's notes (:attr:`Problem.notes`) in its summary
    (``notes``), where it has any, before the evaluator's own."""
    if problem.notes:
        result.extra["notes"] = list(problem.notes) + list(result.extra.get("notes", []))
    return result


def _training(problem: Problem | DagProblem, plan: Plan | DagPlan) -> tuple[Problem, Plan]:
    """``(problem, plan)`` of a training plan kind, or ValueError."""
    if not isinstance(plan, Plan) or not isinstance(problem, Problem):
        raise ValueError(f"a {plan.kind} plan is a sim.plan.Plan of a sim.problem.Problem")
    return problem, plan
