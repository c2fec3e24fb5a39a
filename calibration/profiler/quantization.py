"""The runtime's gradient pack and unpack at each bit width: the ``quant`` benchmark,
and the profile's ``quant`` entry made from it."""

from __future__ import annotations

import functools
from typing import Any

from calibration.profiler.registry import Benchmark, Run, register
from calibration.profiler.timing import _median_iqr, _OpTimer, _r
from runtime.launch import keep_freed_memory


def quant_bench(timer: _OpTimer, n: int) -> list[dict[str, Any]]:
    """The runtime's gradient pack and unpack (``runtime.quant``, on the host CPU where the
    runtime runs them) of ``n`` fp32 values at each bit width below 32.

    Measured with freed memory kept (:func:`runtime.launch.keep_freed_memory`, from here on
    for this process), as every rank of the runtime runs: otherwise glibc hands the
    temporaries back and each repeat faults them in again, and the figures vary 2-4x
    from run to run (measured: 8-bit pack of 2^20 values 10-11 ns per value, kept 4.8).
    """
    import torch

    from runtime import quant

    keep_freed_memory()

    x = torch.randn(n)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for bits in (2, 4, 8, 16):
        buf = quant.pack(x, bits, gen)
        pk = _median_iqr(timer.time(functools.partial(quant.pack, x, bits, gen), f"pack{bits}"))
        up = _median_iqr(timer.time(functools.partial(quant.unpack, buf, n, bits), f"unpack{bits}"))
        rows.append({"bits": bits, "values": n, "pack_s": _r(pk[0]), "pack_rel_iqr": _r(pk[1]),
                     "unpack_s": _r(up[0]), "unpack_rel_iqr": _r(up[1])})
    return rows


def quant_costs(raw: dict[str, Any]) -> dict[str, dict[str, float]] | None:
    """The profile's ``quant`` entry (seconds per value by bit width) from :func:`quant_bench` rows."""
    rows = raw.get("quant")
    if not rows:
        return None
    return {str(r["bits"]): {"pack_s_per_value": _r(r["pack_s"] / r["values"]),
                             "unpack_s_per_value": _r(r["unpack_s"] / r["values"])} for r in rows}


def _host_timer(run: Run) -> _OpTimer:
    """The timer of the pack and unpack, which run on the host CPU: the run's own on a
    CPU, a CPU clock's (not CUDA events) on a GPU."""
    if run.dev.type != "cuda":
        return run.timer
    import torch

    return _OpTimer(torch.device("cpu"), run.spec)


register(Benchmark(
    "quant", "the runtime's gradient pack and unpack at 2, 4, 8 and 16 bits", ("quant",),
    order=60, run=lambda run: {"quant": quant_bench(_host_timer(run), 1 << (18 if run.quick else 20))},
    label="quantization"))
