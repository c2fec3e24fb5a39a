"""The scheduler contracts: what the evaluators may ask of a scheduler.

A scheduler reads a problem and returns a plan; it never reaches into an
evaluator. An online scheduler also answers ``rebalance(plan, observation)``
while the job runs. The evaluators recognise one by
``isinstance(scheduler, OnlineScheduler)``: the protocols are runtime
checkable, and such a check walks the protocol's members, so an evaluator
makes it once per run, not per event.

The contracts live in the model layer (``sim``) because the evaluators depend
on them; the implementations and their registry are in ``schedulers``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from sim.dag import DagPlan, DagProblem
    from sim.observation import Observation
    from sim.plan import Plan
    from sim.problem import Problem


@runtime_checkable
class Scheduler(Protocol):
    """Problem -> Plan (data-parallel or placement, see :class:`sim.plan.PlanKind`)."""

    name: ClassVar[str]

    def plan(self, problem: Problem) -> Plan: ...


@runtime_checkable
class OnlineScheduler(Scheduler, Protocol):
    """A scheduler that also re-plans while the job runs (H-PS, LB-BSP).

    The evaluator (DES, analytic steady state, runtime) calls ``rebalance`` at
    the end of every global iteration. ``plan`` is the plan in force and lists
    every worker of the run (idle and failed ones with batch 0);
    ``obs.workers`` is in the same order. Return None to keep the plan, or a
    plan over the same workers (``plan.with_shares``) whose live workers'
    shares sum to ``obs.global_batch`` and that gives failed workers 0. New
    shares take effect from the next iteration each worker starts. Only
    data-parallel plans are rebalanced.
    """

    def rebalance(self, plan: Plan, obs: Observation) -> Plan | None: ...


@runtime_checkable
class DagScheduler(Protocol):
    """DagProblem -> DagPlan: a periodic task graph scheduled on a board's units."""

    name: ClassVar[str]

    def plan(self, problem: DagProblem) -> DagPlan: ...
