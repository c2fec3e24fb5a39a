"""How much a small layer call costs right after a pass that streamed a lot of memory
(`python -m bench.cold_call`). Not a test: figures depend on the machine.

A pass that streams more bytes than the caches hold evicts the framework's
code and data and the next call's own tensors, and the next call runs cold:
two passes of identical work do not cost the same whatever ran before them.
This benchmark shows it: each case streams ``moved`` bytes (a ``copy_``
between two buffers of half that size, not timed), then times one call of a
small op (the cold time), then the same call again at once (the warm time).
It is the profiler's cold-call benchmark
(:func:`calibration.profiler.cold_bench`: ``hetsim profile`` stores it in
``measurement.raw.cold`` and ``hetsim calibrate`` turns it into the profile's
``cold_calls`` correction, which the cost model adds to a pass after passes that moved
that much), at sizes of your choosing. Ops: an in-place ReLU over 16 KiB, an
``nn.Linear(64, 64)`` forward on 8 rows with autograd recording, an
``nn.Embedding(10000, 16)`` lookup of 32 rows.

Times are the calling thread's CPU time (torch on one thread), so another
process holding the core does not count; median of ``--reps`` cases (docs/notes/2026-12-06-cold-calls.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from calibration.profiler import cold_bench

MOVED_MB = (2, 16, 64, 256, 512)


def measure(moved_mb: Sequence[float], reps: int, progress: bool = True) -> list[dict[str, Any]]:
    """Time every call of the profiler's cold-call benchmark
    (:func:`calibration.profiler.cold_bench`) after streaming each of
    ``moved_mb`` MiB, on one CPU thread.

    Returns:
        One row per size (in the order given) and call: ``moved_bytes`` (MiB * 2**20,
        read and written by the copy), ``op`` (``relu``, ``linear``, ``embedding``:
        :func:`~calibration.profiler.cold_calls`), ``cold_s`` and ``warm_s``
        (medians of ``reps`` cases, seconds of the thread's CPU time) and ``ratio``
        (``cold_s / warm_s``; None if the warm time is 0).
    """
    import torch

    torch.set_num_threads(1)
    bars: list[Any] = []  # drawn after the first size: a size too large fails before any bar

    def step() -> None:
        if not bars:
            bars.append(tqdm(total=len(moved_mb), desc="bytes moved", disable=not progress))
        bars[0].update(1)

    try:
        raw = cold_bench(torch.device("cpu"), moved_mb, reps, progress=step)
    finally:
        for bar in bars:
            bar.close()
    rows = []
    for i, nb in enumerate(raw["moved_bytes"]):
        for name in raw["cold_s"]:
            c, w = raw["cold_s"][name][i], raw["warm_s"][name][i]
            rows.append({"moved_bytes": nb, "op": name, "cold_s": c, "warm_s": w,
                         "ratio": c / w if w > 0 else None})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cold_call", description=__doc__.splitlines()[0])
    ap.add_argument("--moved-mb", default=",".join(str(x) for x in MOVED_MB),
                    help="comma-separated MiB streamed before each timed call "
                         f"(default {','.join(str(x) for x in MOVED_MB)})")
    ap.add_argument("--reps", default="15", help="cases per size and op (default 15)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args(argv)
    try:
        sizes = [float(x) for x in a.moved_mb.split(",") if x.strip()]
    except ValueError:
        print(f"error: --moved-mb: not a list of numbers: {a.moved_mb!r}", file=sys.stderr)
        return 2
    if not sizes or not all(math.isfinite(x) and x > 0 for x in sizes):
        print("error: --moved-mb: give one or more finite sizes above 0", file=sys.stderr)
        return 2
    reps = int(a.reps) if a.reps.strip().isdigit() else 0
    if reps < 1:
        print(f"error: --reps: must be a whole number of at least 1, got {a.reps!r}", file=sys.stderr)
        return 2
    try:
        rows = measure(sizes, reps, progress=not a.json)
    except (RuntimeError, MemoryError) as e:  # buffers of max(--moved-mb) / 2 MiB each
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"error: --moved-mb: cannot stream {max(sizes):g} MiB here: {first}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'moved MiB':>10}  {'op':<27}{'cold us':>9}{'warm us':>9}{'cold/warm':>11}")
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.1f}x"
        print(f"{r['moved_bytes'] / 2**20:>10g}  {r['op']:<27}{1e6 * r['cold_s']:>9.1f}"
              f"{1e6 * r['warm_s']:>9.1f}{ratio:>11}")
    print("(cold: the call right after streaming that many bytes; warm: the same call again at "
          "once; median of the cases; CPU time of this thread)")
    return 0
