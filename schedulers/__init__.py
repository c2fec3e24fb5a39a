"""Schedulers: Problem -> Plan, registered by name; online ones also rebalance."""

from schedulers import dag, equal, exact, hps, lbbsp, placement, proportional  # noqa: F401  (registration side effect)
from schedulers.base import (
    capped_largest_remainder,
    largest_remainder,
    make,
    names,
    register,
    register_lazy,
)
from sim.scheduling import OnlineScheduler, Scheduler

# torch and stable-baselines3 load only when `rl` or `rl-dag` is chosen
register_lazy("rl", "schedulers.rl.scheduler:RL")
register_lazy("rl-dag", "schedulers.rl.dag_scheduler:RLDag", kind="dag")

__all__ = ["OnlineScheduler", "Scheduler", "capped_largest_remainder", "largest_remainder", "make", "names",
           "register", "register_lazy"]
