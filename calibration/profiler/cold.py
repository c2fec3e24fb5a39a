"""What a small call costs right after a pass that streamed a lot of memory: the
``cold`` benchmark (CPU hosts)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from calibration.profiler.registry import Benchmark, register
from calibration.profiler.timing import _Clock, _r

#: Bytes (MiB, read and written by one copy) the cold-call benchmark moves before
#: each timed call: from what the caches hold to well past them.
COLD_MOVED_MIB = (0.25, 1, 4, 16, 64, 256)


#: Cases per size and call of the cold-call benchmark (the median is kept).
COLD_REPS = 15


def cold_calls(dev: Any) -> dict[str, Callable[[], Any]]:
    """The cold-call benchmark's small calls, by name: an in-place ReLU over 16 KiB
    (``relu``), an ``nn.Linear(64, 64)`` on 8 rows with autograd recording
    (``linear``), an ``nn.Embedding(10000, 16)`` lookup of 32 rows (``embedding``)."""
    import torch

    relu = torch.nn.ReLU(inplace=True)
    z = torch.randn(4096, device=dev)
    lin = torch.nn.Linear(64, 64).to(dev)
    x = torch.randn(8, 64, device=dev, requires_grad=True)
    emb = torch.nn.Embedding(10_000, 16).to(dev)
    ids = torch.randint(0, 10_000, (32,), device=dev)
    return {"relu": lambda: relu(z), "linear": lambda: lin(x), "embedding": lambda: emb(ids)}


def cold_bench(dev: Any, moved_mib: Sequence[float] = COLD_MOVED_MIB, reps: int = COLD_REPS,
               progress: Callable[[], None] | None = None) -> dict[str, Any]:
    """What a small call costs right after a pass that streamed a lot of memory.

    For each size, ``reps`` times: a ``copy_`` between two buffers that reads and
    writes ``moved_mib`` MiB (not timed), then one call of each of
    :func:`cold_calls` timed (cold), then the same call again at once (warm).
    Timed with the profile's clock (on one CPU thread its CPU time). A pass that
    streams more than the caches hold evicts the framework's code and data and
    the next call's tensors; the cost model adds the difference to the pass after
    passes that moved that much (``corrections.cold_calls``). ``progress``: called after
    each size.

    Returns:
        ``{"moved_bytes": [...], "cold_s": {call: [...]}, "warm_s": {call: [...]},
        "reps": reps, "statistic": ...}``, one median per size.
    """
    import torch

    calls = cold_calls(dev)
    for call in calls.values():  # first calls pay one-time costs
        call()
    clock = _Clock(dev)
    half = int(max(moved_mib) * 2**20 / 2 / 4)  # fp32 elements of each buffer at the largest size
    src, dst = torch.randn(half, device=dev), torch.empty(half, device=dev)
    cold: dict[str, list[float]] = {k: [] for k in calls}
    warm: dict[str, list[float]] = {k: [] for k in calls}
    for mib in moved_mib:
        n = int(mib * 2**20 / 2 / 4)
        a, b = src[:n], dst[:n]
        for name, call in calls.items():
            c, w = [], []
            for _ in range(reps):
                b.copy_(a)
                clock.sync()
                t0 = clock.mark()
                call()
                t1 = clock.mark()
                call()
                t2 = clock.mark()
                c.append(clock.seconds(t0, t1))
                w.append(clock.seconds(t1, t2))
            cold[name].append(_r(statistics.median(c)))
            warm[name].append(_r(statistics.median(w)))
        if progress is not None:
            progress()
    return {"moved_bytes": [int(m * 2**20) for m in moved_mib], "cold_s": cold, "warm_s": warm,
            "reps": reps, "statistic": "median of reps; cold: right after the copy, warm: again at once"}


register(Benchmark(
    "cold", "a small call's time right after a pass that streamed memory (CPU hosts)", ("cold",),
    order=70, run=lambda run: {"cold": cold_bench(run.dev)}, label="cold calls",
    # a GPU's passes do not flush the host's caches
    applies=lambda run: run.dev.type == "cpu"))
