"""The closed form of an all-reduce plan (``job.sync: allreduce``): the recursion of
:mod:`sim.collective`, vectorised over the workers, one BSP iteration at a time.

Iterations are computed until two successive ones take the same time; the rest are
extrapolated, so the cost is a few iterations whatever ``job.iterations`` is. Without
dynamics the DES (:mod:`sim.des.collective`) executes the same recursion event by
event, so the two agree to float rounding. Hosts: each hosted worker's compute is
stretched by its share of the cores with every hosted worker runnable
(:meth:`sim.cluster.Cluster.host_stretch`), the steady-state view; the DES shares the cores
as the work comes and goes, and charges the collective's copies to them.
"""

from __future__ import annotations

import numpy as np

from sim.analytic import bsp_time_to_target, dyn_note, steady_state
from sim.collective import collective_costs, iteration, run_notes
from sim.plan import Plan, PlanKind, require_kind
from sim.problem import Problem
from sim.result import DeviceUsage, RunResult


def evaluate(problem: Problem, plan: Plan, scheduler: object = None) -> RunResult:
    """Evaluate the all-reduce ``plan`` in closed form; the DES's RunResult schema.

    BSP iterations by the recursion of the module docstring, vectorised over the
    workers, until two successive iterations take the same time; the rest are
    extrapolated. With an :class:`~sim.scheduling.OnlineScheduler` the plan its
    rebalancing settles on (:func:`sim.analytic.steady_state`).
    """
    require_kind(plan, PlanKind.DATA_PARALLEL, "sim.collective_analytic.evaluate")
    return steady_state(problem, plan, scheduler, _evaluate, _compute_per_iteration)


def _compute_per_iteration(problem: Problem, plan: Plan) -> dict[str, float]:
    c = collective_costs(problem, plan)
    return dict(zip(c.workers, (c.fwd_s + c.bwd_s).tolist()))


def _evaluate(problem: Problem, plan: Plan) -> RunResult:
    job = problem.job
    c = collective_costs(problem, plan)
    N, n_iter = len(c.workers), job.iterations
    comm = c.comm_s(range(N))
    compute_it = c.fwd_s + c.bwd_s + c.opt_s
    start = np.zeros(N)
    ends: list[float] = []
    comm_w = np.zeros(N)
    prev_d: float | None = None
    while len(ends) < n_iter:
        end, back, S, E = iteration(c, start, comm)
        ends.append(float(end.max()) if N else 0.0)
        # a worker's own all-reduces in flight while it waits after its backward
        last = E[-1] if len(E) else -np.inf
        per = np.clip(np.minimum(E[None, :], last) - np.maximum(S[None, :], back[:, None]), 0.0, None).sum(axis=1)
        comm_w += per
        d = ends[-1] - (ends[-2] if len(ends) > 1 else 0.0)
        start = end
        if prev_d is not None and abs(d - prev_d) <= 1e-12 * d and len(ends) < n_iter:
            left = n_iter - len(ends)  # periodic from here on: the rest repeat the last one
            last = ends[-1]
            ends.extend([last + d * k for k in range(1, left + 1)])
            comm_w += per * left
            break
        prev_d = d
    T = ends[-1] if ends else 0.0
    compute = compute_it * n_iter
    wait = np.maximum(T - compute - comm_w, 0.0)
    cl = problem.cluster
    devices = []
    for w, dev_id in enumerate(c.workers):
        t = cl.device(dev_id).type
        devices.append(DeviceUsage(dev_id, "worker", t.price_per_hour, t.power_w.idle, t.power_w.active,
                                   float(compute[w]), float(compute[w]), float(comm_w[w]), float(wait[w])))
    samples = int(c.batch.sum())
    extra = {**dyn_note(problem), **run_notes(c)}
    return RunResult(
        name=problem.name, evaluator="analytic", scheduler=plan.scheduler, seed=problem.seed,
        iter_end_s=ends, iter_samples=[samples] * len(ends), devices=devices,
        warmup=job.warmup_iterations, extra=extra,
        time_to_target_s=bsp_time_to_target(problem, ends, samples),
    )


