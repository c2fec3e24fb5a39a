"""How long the runtime's messages take to change hands, by where the shard runs
(`python -m bench.handoff_bench`). Not a test: figures depend on the machine.

Round trips of the runtime's own messages (``runtime.wire``: a PUSH, header only
or with a small payload, answered by a header-only PARAMS) between a worker-like
rank pinned to the first core and a shard-like rank with a ``Receiver`` thread
(:func:`calibration.profiler.handoff_rtts`), on idle cores and with a busy
process (a GEMM loop) pinned to every core, the shard unpinned, pinned to the
worker's core, or pinned to another core.

It is why the validation suite pins its PS shard (``runtime.ps_affinity``): the
DES shares each core among the processes that may run on it, but on the 2-core
validation machine an unpinned shard beside pinned busy processes waits for the
OS scheduler far longer than that model says (docs/guides/validation.md, "Why the shard is pinned").
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from tqdm import tqdm

from calibration.profiler import handoff_rtts
from runtime.affinity import usable_cpus

WARMUP = 20  # round trips left out of the times


def cases(cores: list[int]) -> list[tuple[int, int | None, int]]:
    """(busy processes, shard core or None for unpinned, payload bytes) of each case."""
    places: list[int | None] = [None, cores[0], *cores[1:2]]
    return [(hogs, place, payload) for hogs in (0, len(cores)) for place in places for payload in (0, 1024)]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300, help="round trips per case (after 20 of warm-up)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    cores = usable_cpus() or [0]
    rows = []
    for hogs, place, payload in tqdm(cases(cores), desc="hand-off cases", disable=args.json):
        got = handoff_rtts(hogs, args.rounds, warmup=WARMUP, shard_core=place, payload_bytes=payload)
        where = "unpinned" if place is None else ("worker's core" if place == cores[0] else f"core {place}")
        per = 1e3 / (args.rounds + WARMUP)  # CPU ms per round trip, over every round
        rows.append({"busy_processes": hogs, "shard": where, "payload_bytes": payload,
                     "mean_ms": round(1e3 * statistics.fmean(got.rtts), 3),
                     "median_ms": round(1e3 * statistics.median(got.rtts), 3),
                     "worker_cpu_ms": round(per * got.cpu_s, 3),
                     "worker_gloo_thread_cpu_ms": None if got.loop_cpu_s is None else round(per * got.loop_cpu_s, 3),
                     "shard_cpu_ms": round(per * got.shard_cpu_s, 3),
                     "shard_gloo_thread_cpu_ms": (None if got.shard_loop_cpu_s is None
                                                  else round(per * got.shard_loop_cpu_s, 3))})
    out = {"cores": cores, "rounds": args.rounds, "worker_core": cores[0], "cases": rows}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"worker pinned to core {cores[0]} of {cores}; {args.rounds} round trips per case")
        print("CPU ms per round trip of each rank, all of it and its gloo thread's")
        print(f"{'busy':>4}  {'shard':<14} {'payload':>7}  {'mean ms':>8}  {'median ms':>9}  "
              f"{'worker CPU':>10}  {'its gloo':>8}  {'shard CPU':>9}  {'its gloo':>8}")

        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x:.3f}"

        for r in rows:
            print(f"{r['busy_processes']:>4}  {r['shard']:<14} {r['payload_bytes']:>7}  "
                  f"{r['mean_ms']:>8.3f}  {r['median_ms']:>9.3f}  {r['worker_cpu_ms']:>10.3f}  "
                  f"{ms(r['worker_gloo_thread_cpu_ms']):>8}  {r['shard_cpu_ms']:>9.3f}  "
                  f"{ms(r['shard_gloo_thread_cpu_ms']):>8}")
    return out


if __name__ == "__main__":
    main()
