"""Size limits checked before any work starts: a config whose simulation would run for
hours or fill the memory is refused up front with the limit and the reason in one line,
instead of hanging (``--force`` on the command line skips these checks).

The work is estimated from the config alone (before profiles and models are resolved,
so that 10^7 devices are refused before 10^7 device objects exist) and again from the
built problem (its iteration count, which a ``target_loss`` fixes only then):

* processes (devices plus PS shards): every one is an object, a DES process and a
  column of the per-iteration records;
* iterations: ``iterations.csv`` holds one row per iteration (about 70 bytes) and the
  analytic evaluator's per-iteration arrays grow with it;
* DES work, iterations x processes: each is a handful of events per layer (about
  10^4 a second);
* frames x tasks of a robotics pipeline's frames DES.
"""

from __future__ import annotations

import math
from typing import Any

from hardware_profiles.errors import ConfigError

#: devices plus PS shards of one cluster
MAX_PROCESSES = 20_000
#: iterations of one run (both evaluators)
MAX_ITERATIONS = 1_000_000
#: iterations x processes of one DES run
MAX_DES_WORK = 10_000_000
#: frames x tasks of one frames DES (`hetsim dag`)
MAX_FRAME_WORK = 50_000_000

FORCE_HINT = "--force to run anyway"


def _refuse(source: str, field: str, what: str, n: float, limit: int, why: str) -> ConfigError:
    return ConfigError(source, field, f"{what} {n:.3g} exceeds the limit {limit:.3g} ({why}); {FORCE_HINT}")


def check_config(cfg: Any, source: str, force: bool = False) -> None:
    """Refuse a training config (:class:`sim.config.Config`) whose cluster or iteration
    count is beyond the limits, before anything is built.

    Raises:
        ConfigError: naming the field, the estimate, the limit and why (unless ``force``).
    """
    if force:
        return
    cl = cfg.cluster
    devices = sum(e.count for e in cl.devices)
    if devices + cl.ps.shards > MAX_PROCESSES:
        field = "cluster.ps.shards" if cl.ps.shards > devices else "cluster.devices"
        raise _refuse(source, field, "devices plus PS shards", devices + cl.ps.shards, MAX_PROCESSES,
                      "each is a simulated process; building and simulating them would take hours")
    j = cfg.job
    iterations = j.iterations if j.iterations is not None else -(-(j.samples or 0) // j.global_batch)
    check_iterations(iterations, devices + cl.ps.shards, source, "job.samples" if j.samples else "job.iterations")


def check_iterations(iterations: int, processes: int, source: str, field: str = "job.iterations",
                     evaluator: str = "des", force: bool = False) -> None:
    """Refuse a run of ``iterations`` over ``processes`` beyond the limits (module
    docstring); the DES limit applies to ``evaluator`` ``des`` only."""
    if force:
        return
    if iterations > MAX_ITERATIONS:
        raise _refuse(source, field, "iterations", iterations, MAX_ITERATIONS,
                      "iterations.csv and the evaluators' records hold one row per iteration")
    if evaluator == "des" and iterations * processes > MAX_DES_WORK:
        raise _refuse(source, field, "DES work of iterations x processes", iterations * processes,
                      MAX_DES_WORK, "about 10^4 of these a second; the analytic evaluator is the fast one")


def check_problem(problem: Any, evaluator: str, source: str, force: bool = False) -> None:
    """:func:`check_iterations` on a built problem (its iteration count is final: a
    ``target_loss`` is resolved into iterations by then)."""
    procs = len(problem.cluster.devices) + len(problem.cluster.shards)
    check_iterations(problem.job.iterations, procs, source, evaluator=evaluator, force=force)


def check_frames(frames: int, tasks: int, source: str, force: bool = False) -> None:
    """Refuse a frames DES of ``frames`` x ``tasks`` beyond :data:`MAX_FRAME_WORK`."""
    if not force and frames * tasks > MAX_FRAME_WORK:
        raise _refuse(source, "des.frames", "frames x tasks", frames * tasks, MAX_FRAME_WORK,
                      "each task of each frame is a handful of DES events")


def non_finite(x: Any, where: str = "") -> tuple[str, float] | None:
    """The first (dotted path, value) of a float in ``x`` (nested dicts, lists, tuples)
    that is infinite or NaN; None when every number is finite."""
    if isinstance(x, float):
        return None if math.isfinite(x) else (where, x)
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list | tuple) else ()
    for k, v in items:
        bad = non_finite(v, f"{where}.{k}" if where and isinstance(k, str) else
                         f"{where}[{k}]" if where else str(k))
        if bad is not None:
            return bad
    return None
