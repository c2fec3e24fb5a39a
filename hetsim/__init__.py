"""hetsim's stable Python API (docs/reference/python_api.md).

    import hetsim

    cfg = hetsim.load_config("experiments/configs/demo.yaml", {"job.iterations": 10})
    result = hetsim.simulate(cfg, scheduler="equal")
    results = hetsim.compare(cfg, ["equal", "proportional"])

    @hetsim.register_scheduler("mine")
    class Mine:
        def plan(self, problem: hetsim.Problem) -> hetsim.Plan: ...

The names below are the API: they keep their meaning within a major version.
Everything else (the ``sim``, ``schedulers``, ``experiments`` ... packages) is the
implementation, importable but free to change. The names load on first use, so
``import hetsim`` (and ``hetsim --version``) stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "ConfigError", "HetsimError", "Loaded", "OnlineScheduler", "Plan", "Problem", "RunResult",
    "Scheduler", "__version__", "compare", "data_parallel_plan", "largest_remainder", "load_config",
    "plan", "problem", "register_scheduler", "scheduler_names", "simulate",
]

if TYPE_CHECKING:
    from hetsim.api import (
        ConfigError,
        HetsimError,
        Loaded,
        OnlineScheduler,
        Plan,
        Problem,
        RunResult,
        Scheduler,
        compare,
        data_parallel_plan,
        largest_remainder,
        load_config,
        plan,
        problem,
        register_scheduler,
        scheduler_names,
        simulate,
    )


def __getattr__(name: str) -> Any:
    """The API's names load here, on first use (all from hetsim.api)."""
    if name not in __all__:
        raise AttributeError(f"module 'hetsim' has no attribute {name!r}")
    value = getattr(importlib.import_module("hetsim.api"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
