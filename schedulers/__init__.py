"""Schedulers: Problem -> Plan, registered by name; online ones also rebalance."""

from schedulers import dag, equal, exact, hps, lbbsp, placement, proportional  # noqa: F401  (registration side effect)
from schedulers.base import (
    capped_largest_remainder,
    data_parallel_plan,
    import_plugin,
    largest_remainder,
    load_entry_points,
    make,
    names,
    register,
    register_lazy,
)
from sim.scheduling import OnlineScheduler, Scheduler

# torch and stable-baselines3 load only when `rl` or `rl-dag` is chosen
register_lazy("rl", "schedulers.rl.scheduler:RL")
register_lazy("rl-dag", "schedulers.rl.dag_scheduler:RLDag", kind="dag")

#: The built-in names by kind, which `hetsim --help` lists without importing this
#: package (experiments/cli.py keeps a copy; tests/test_cli_options.py checks the two).
BUILTIN = {kind: tuple(names(kind, plugins=False)) for kind in ("training", "dag")}
# (the `hetsim.schedulers` entry points load when the registry is first read)

__all__ = ["BUILTIN", "OnlineScheduler", "Scheduler", "capped_largest_remainder", "data_parallel_plan",
           "import_plugin", "largest_remainder", "load_entry_points", "make", "names", "register",
           "register_lazy"]
