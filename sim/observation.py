"""What an online scheduler sees of a running job: the seam between evaluators and schedulers.

The DES (and, later, the real runtime) builds an :class:`Observation` at every
rebalance point and hands it to ``scheduler.rebalance(plan, observation)``.
Everything in it is measured, not modelled: a worker slowed down by
background load shows a lower ``rate_sps``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.plan import Plan, Replica, Stage


@dataclass(frozen=True)
class WorkerStatus:
    """One worker's state over the observation window.

    The window runs from the previous rebalance call (or the start of the run)
    to this one; a worker's iteration counts in the window in which its
    forward and backward passes finish.

    Attributes:
        device: device id (as in the plan).
        batch: its share in the plan in force when the observation is made.
        compute_s: seconds spent in forward and backward passes in the window
            (wall time, so slowdowns lengthen it).
        samples: samples whose forward and backward passes finished in the window.
        rate_sps: ``samples / compute_s``, samples per second of compute; 0.0
            when the worker computed nothing in the window (no measurement:
            schedulers should keep their previous estimate).
        free_memory_bytes: device memory free for training now (memory_bytes x
            the current free fraction from the job's dynamics, 1.0 by default).
        alive: False once the worker's failure has been detected.
    """

    device: str
    batch: int
    compute_s: float
    samples: int
    rate_sps: float
    free_memory_bytes: float
    alive: bool = True


@dataclass(frozen=True)
class Observation:
    """The job at one rebalance point.

    Attributes:
        time_s: simulated (or wall) time of the observation.
        iteration: global iterations completed so far.
        workers: one status per worker of the plan, in plan order; the worker
            set never changes during a run (a share of 0 idles a worker).
        global_batch: samples per global iteration the shares must sum to
            (over live workers).
    """

    time_s: float
    iteration: int
    workers: tuple[WorkerStatus, ...]
    global_batch: int

    @property
    def live(self) -> tuple[WorkerStatus, ...]:
        """The workers not known to have failed."""
        return tuple(w for w in self.workers if w.alive)


def rate_sps(samples: int, compute_s: float) -> float:
    """Measured rate of a window: samples per second of compute, 0.0 without compute."""
    return samples / compute_s if compute_s > 0 and samples > 0 else 0.0


def full_membership(plan: Plan, workers: tuple[str, ...], shares: list[int] | None = None) -> Plan:
    """``plan`` with one replica per worker of the run, in run order (absent ones with 0)."""
    st = plan.stages[0]
    if shares is None:
        have = {r.device: r.batch for r in plan.replicas}
        shares = [have.get(d, 0) for d in workers]
    reps = tuple(Replica(d, int(b)) for d, b in zip(workers, shares))
    return Plan((Stage(st.first_layer, st.end_layer, reps, st.device_type),), plan.ps_shards,
                plan.scheduler, dict(plan.options), plan.kind)


def accepted_shares(plan: Plan, obs: Observation, global_batch: int) -> list[int]:
    """Per-worker shares (observation order) of a plan returned by ``rebalance``.

    Raises:
        ValueError: the plan names a device outside the run, gives a failed worker
            work, has a negative share, or its live workers' shares do not sum to
            the global batch (less ``options["memory_short_samples"]``).
    """
    if len(plan.stages) != 1:
        raise ValueError("rebalance must return a single-stage (data-parallel) plan")
    index = {ws.device: i for i, ws in enumerate(obs.workers)}
    shares = [0] * len(obs.workers)
    for r in plan.replicas:
        if r.device not in index:
            raise ValueError(f"rebalanced plan uses {r.device!r}, which is not a worker of this run")
        if r.batch < 0:
            raise ValueError(f"rebalanced plan gives {r.device!r} a negative share")
        shares[index[r.device]] = int(r.batch)
    for ws, b in zip(obs.workers, shares):
        if not ws.alive and b > 0:
            raise ValueError(f"rebalanced plan gives failed worker {ws.device!r} a share of {b}")
    want = global_batch - int(plan.options.get("memory_short_samples", 0))
    got = sum(shares)
    if got != want:
        raise ValueError(f"rebalanced plan's live shares sum to {got}, not {want}")
    return shares
