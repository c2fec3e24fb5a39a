"""Single operators: the ``gemm``, ``bandwidth``, ``dispatch`` and ``host_device``
benchmarks.

GEMMs over a grid of shapes (fp32; on GPUs in every math mode the GPU has,
:mod:`calibration.profiler.modes`), memory copies and elementwise adds (bandwidth), a
one-element add (dispatch overhead; on GPUs a loop of :data:`DISPATCH_LOOP` of them, the
time per add) and, on GPUs, host-device copies. Each is timed with the run's timer
(:class:`~calibration.profiler.timing._OpTimer`): ``torch.profiler`` ranges on
CPUs with the wall clock, the thread's CPU time with one thread, CUDA events on
GPUs.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from calibration.profiler.modes import InMode
from calibration.profiler.registry import Benchmark, Run, Sampled, register
from calibration.profiler.timing import _median_iqr, _OpItem, _OpTimer, _r

#: One-element adds per dispatch sample on a GPU: back to back, without a sync between
#: them, the time per add is what one more kernel costs a stream the host keeps fed
#: (one add between two CUDA events would time the events' own overhead too).
DISPATCH_LOOP = 100


def _row(head: dict[str, Any], item: _OpItem | InMode, q: float) -> dict[str, Any]:
    t_s, iqr = item.figures(q)
    return {**head, "t_s": t_s, "rel_iqr": iqr}


def _gemm(run: Run) -> Sampled:
    """Every (dtype, shape) of the GEMM grid, one item and progress group each; on a GPU
    each dtype is a math mode, timed in its settings (:class:`~calibration.profiler.modes.InMode`:
    fp32 with TF32 off, tf32 with it on; fp16 and bf16 operands in that dtype)."""
    import torch

    tdt = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    groups: list[tuple[str, Sequence[Any]]] = []
    gemm = []
    for dt in run.dtypes:
        for m, n, k in run.spec.gemm:
            lhs = torch.randn(m, k, device=run.dev, dtype=tdt[dt])
            rhs = torch.randn(k, n, device=run.dev, dtype=tdt[dt])
            item: _OpItem | InMode = _OpItem(run.timer, functools.partial(torch.mm, lhs, rhs),
                                             f"mm{m}x{n}x{k}")
            if run.dev.type == "cuda":
                item = InMode(item, dt)
            gemm.append(({"dtype": dt, "m": m, "n": n, "k": k, "flops": 2.0 * m * n * k}, item))
            groups.append((f"gemm {dt} {m}x{n}x{k}", [item]))
    return Sampled(groups, lambda q: {"gemm": [_row(h, it, q) for h, it in gemm]})


def _bandwidth(run: Run) -> Sampled:
    """Copy (read + write) and add (2 reads + write) of each of ``spec.copy_elems`` fp32
    elements, one progress group."""
    import torch

    bw = []
    for n in run.spec.copy_elems:
        x = torch.randn(n, device=run.dev)
        y = torch.empty_like(x)
        bw.append(({"op": "copy", "elems": n, "bytes": 8.0 * n},
                   _OpItem(run.timer, functools.partial(y.copy_, x), f"copy{n}")))
        bw.append(({"op": "add", "elems": n, "bytes": 12.0 * n},
                   _OpItem(run.timer, functools.partial(torch.add, x, x, out=y), f"add{n}")))
    return Sampled([("bandwidth", [item for _, item in bw])],
                   lambda q: {"bandwidth": [_row(h, it, q) for h, it in bw]})


def _dispatch(run: Run) -> Sampled:
    """A one-element add: the framework's dispatch overhead (on a GPU, per add of a loop of
    :data:`DISPATCH_LOOP`, ``raw["dispatch_loop"]``)."""
    import torch

    one = torch.ones(1, device=run.dev)
    if run.dev.type != "cuda":
        dispatch = _OpItem(run.timer, functools.partial(one.add, one), "dispatch")

        def finish(q: float) -> dict[str, Any]:
            t_s, iqr = dispatch.figures(q)
            return {"dispatch_s": t_s, "dispatch_rel_iqr": iqr}

        return Sampled([("dispatch", [dispatch])], finish)

    def adds() -> None:
        for _ in range(DISPATCH_LOOP):
            one.add(one)

    loop = _OpItem(run.timer, adds, "dispatch")

    def finish_loop(q: float) -> dict[str, Any]:
        t_s, iqr = loop.figures(q)
        return {"dispatch_s": _r(t_s / DISPATCH_LOOP), "dispatch_rel_iqr": iqr,
                "dispatch_loop": DISPATCH_LOOP}

    return Sampled([("dispatch", [loop])], finish_loop)


def _host_device(timer: _OpTimer, dev: Any) -> dict[str, Any]:
    import torch

    n = 16_000_000
    host = torch.empty(n, pin_memory=True)
    gpu = torch.empty(n, device=dev)
    h2d = _median_iqr(timer.time(lambda: gpu.copy_(host, non_blocking=True), "h2d"))
    d2h = _median_iqr(timer.time(lambda: host.copy_(gpu, non_blocking=True), "d2h"))
    return {"bytes": 4 * n, "h2d_s": _r(h2d[0]), "h2d_rel_iqr": _r(h2d[1]),
            "d2h_s": _r(d2h[0]), "d2h_rel_iqr": _r(d2h[1]),
            "h2d_Bps": _r(4 * n / h2d[0]), "d2h_Bps": _r(4 * n / d2h[0])}


register(Benchmark(
    "gemm", "torch.mm over the spec's grid of shapes, per dtype (a GPU: per math mode)", ("gemm",),
    order=10,
    build=_gemm, groups=lambda run: len(run.spec.gemm) * len(run.dtypes)))
register(Benchmark(
    "bandwidth", "copy and add of the spec's element counts (memory bandwidth)", ("bandwidth",),
    order=20, build=_bandwidth, groups=lambda run: 1))
register(Benchmark(
    "dispatch", "a one-element add (the framework's dispatch overhead; on a GPU per add of a loop)",
    ("dispatch_s", "dispatch_rel_iqr", "dispatch_loop"), order=30, build=_dispatch, groups=lambda run: 1))
register(Benchmark(
    "host_device", "pinned host to GPU and GPU to host copies of 64 MB", ("host_device",),
    order=80, run=lambda run: {"host_device": _host_device(run.timer, run.dev)},
    label="host-device copies", applies=lambda run: run.dev.type == "cuda"))
