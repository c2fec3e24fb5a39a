"""How fast this machine runs now against when its profile was measured: the drift factor.

A shared machine's speed moves: on this project's 2-core VM the runtime's iterations
ran 10-25% slower a quarter of an hour after a fresh profile than just after it. A DES
priced with the profile as it was then predicts the machine as it was then. `hetsim
validate` with a fresh profile therefore times, just before each real run and after
the last, the whole training iteration (forward, backward; no hooks) of the model the
runtime trains, at the batch shares of the run, where the profile timed that very model
(a :mod:`calibration.model_variants` label in ``raw["models"]``), with the profiler's own
harness: now / then, the median over the shares. "Then" is the profile's figure (a
fresh profile's: the 20th percentile of samples over its interleaved rounds, the
machine's fast state), "now" the median of about half a second of iterations (the mix
of states the runs see), so the factor also carries the profile's fast state to the
speed the runs ran at. The DES then runs every process's
work (compute, a shard's aggregation and update, every message's copies) that much
slower and the loopback links that much slower too: the median over those probes
(:func:`around`, :func:`with_drift`).

One factor for everything: over 615 processes of recorded validation runs, each
process's real CPU, against the same process of the same config in other runs, moved
with this factor (elasticity 0.8-0.9, correlation 0.65-0.74 over workers, shards and
all-reduce workers; the real copies' CPU alone 1.0-1.2, correlation 0.51-0.58), and
not with a probe of large copies (64 MB, memory-bound: correlation 0.00-0.21), which
an earlier version applied to the copies and links
(docs/notes/2026-12-07-drift-one-factor.md, ``python -m bench.drift_probes``).

A profile that did not time the runtime's model (the committed ones, made with the
zoo's default sizes) gets no factor: the DES prices with it as it is.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from sim.emulation import RuntimeEmulation
from sim.problem import Problem

#: a probe's repeats: about PROBE_TARGET_S seconds of the model (at most PROBE_MAX_REPS
#: iterations), so that a small model's probe spans the machine's speed states as the
#: runs do (they switch every 0.1-5 s) instead of catching one for 20 ms
PROBE_TARGET_S = 0.5
PROBE_MAX_REPS = 100


def compute_factor(problem: Problem, label: str, shares: Sequence[int], threads: int) -> dict[str, Any] | None:
    """The iteration of model ``label`` at ``shares`` timed now against the ranks' profile's
    ``raw["models"][label]`` (the batches it timed of ``shares``, else the nearest one):
    ``{"factor": median of now / then, "batches", "now_s", "profile_s"}``; None where the
    profile did not time ``label``."""
    raws = [d.type.measurement.raw for d in problem.cluster.devices if d.type.measurement.raw]
    runs = {int(r["batch"]): float(r["iter_s"]) for r in (raws[0].get("models") or {}).get(label, [])
            if raws and float(r.get("iter_s") or 0) > 0} if raws else {}
    if not runs or not shares:
        return None
    batches = sorted({b for b in shares if b in runs} or {min(runs, key=lambda r: abs(r - max(shares)))})
    import torch

    from calibration.profiler import measure_models, spec_for

    spec = dataclasses.replace(spec_for(True), models={label: tuple(batches)}, min_reps=3, max_reps=PROBE_MAX_REPS,
                               target_s=PROBE_TARGET_S)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = {int(r["batch"]): float(r["iter_s"])
               for r in measure_models({label: tuple(batches)}, torch.device("cpu"), spec)[label]}
    finally:
        torch.set_num_threads(before)
    return {"factor": statistics.median(got[b] / runs[b] for b in batches), "label": label, "batches": batches,
            "now_s": [got[b] for b in batches], "profile_s": [runs[b] for b in batches]}


def speed_now(problem: Problem, label: str, shares: Sequence[int], threads: int) -> dict[str, Any] | None:
    """``{"compute": factor, "compute_probe": ...}``: :func:`compute_factor` of the problem
    (see the module docstring); None where it cannot be measured against the profile."""
    comp = compute_factor(problem, label, shares, threads)
    return None if comp is None else {"compute": comp["factor"], "compute_probe": comp}


def around(probes: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The speed factor of a set of real runs, timed with :func:`speed_now` before each run
    and after the last: ``{"compute"}`` the median over the probes (of two, their mean),
    ``"probes"`` them all; None without probes or where one is None. One probe lasts a
    fraction of a second and catches the machine's passing moods as well as its drift;
    the runs last seconds and the drift takes minutes, so the median over the probes
    around them stands for the speed they ran at (the figures behind this:
    docs/notes/2026-12-07-fresh-profile-variants.md)."""
    if not probes or any(p is None for p in probes):
        return None
    return {"compute": statistics.median(p["compute"] for p in probes),  # type: ignore[index]
            "probes": list(probes)}


def with_drift(emu: RuntimeEmulation, factor: float) -> RuntimeEmulation:
    """``emu`` with every placed process's work (compute, a PS shard's aggregation and
    update, every message's copies) ``factor`` times slower, and the links (``wire_Bps``,
    the loopback rate, and ``allreduce_Bps``, the measured all-reduce's) too."""
    out = emu.scaled({dev: (factor, 1.0) for dev, _ in emu.placement})
    return dataclasses.replace(out, wire_Bps=emu.wire_Bps / factor, allreduce_Bps=emu.allreduce_Bps / factor)
