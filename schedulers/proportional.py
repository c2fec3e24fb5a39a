"""`proportional`: shares proportional to each device's modelled compute rate."""

from __future__ import annotations

from schedulers.base import data_parallel_plan, largest_remainder, register
from sim.costmodel import iteration_compute_s
from sim.plan import Plan
from sim.problem import Problem


@register("proportional")
class Proportional:
    """Shares proportional to samples/s of forward+backward, found by fixed point.

    A device's rate depends on its batch (launch overheads amortise), so the
    shares are refined ``rounds`` times: rate_w = b_w / t_w(b_w), then
    b = largest_remainder(rate, B).

    Args:
        rounds: refinement rounds (>= 1).
    """

    def __init__(self, rounds: int = 5) -> None:
        if rounds < 1:
            raise ValueError("rounds must be >= 1")
        self.rounds = rounds

    def plan(self, problem: Problem) -> Plan:
        job, devs = problem.job, problem.cluster.devices
        B = job.global_batch
        shares = [max(1, B // len(devs))] * len(devs)
        for _ in range(self.rounds):
            rates = [max(b, 1) / iteration_compute_s(job.model, d.type, job.dtype, max(b, 1), job.memory_format)
                     for d, b in zip(devs, shares)]
            shares = largest_remainder(rates, B)
        return data_parallel_plan(problem, shares, "proportional")
