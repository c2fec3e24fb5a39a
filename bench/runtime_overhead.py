"""The runtime's own overhead against torch DDP (`python -m bench.runtime_overhead`).

For each model, the same training on the same machine twice: `hetsim run`'s
runtime (BSP, equal shares, 1 PS shard, fp32 pushes: ``W`` worker processes
plus the shard) and torch ``DistributedDataParallel`` over gloo (``W``
processes, all-reduce, SGD on every rank). Same model and sizes, same global
batch split evenly, same torch threads per process, same data: each worker
draws its samples from the teacher task with the runtime's generators, inside
the timed iteration in both. Throughput = global batch x timed iterations /
their wall time, the first ``--warmup`` iterations excluded (rank 0's clock:
the PS commit in the runtime, the end of the optimizer step in DDP; BSP and
all-reduce keep the ranks in lock step). Both run with freed memory kept
(``runtime.launch.keep_freed_memory``). Each repeat starts both afresh,
runtime and DDP alternating; the figure is the median over repeats. The ratio
is runtime samples/s over DDP samples/s (1.0: no overhead).

Not a test: figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from experiments import run as entry
from runtime import task
from runtime.launch import LOOPBACK, die_with_parent, free_port, keep_freed_memory, reap, run_local

# zoo sizes small enough for a few CPU cores; resnet18 keeps its full width at 32x32 input
MODELS: dict[str, dict[str, Any]] = {
    "mlp": {"in_features": 784, "hidden": [1024, 1024], "classes": 10},
    "resnet18": {"classes": 10, "size": 32},
}
SEED = 0


def sps(ends_s: list[float], batch: int, warmup: int) -> float:
    """Samples/s over the iterations after ``warmup`` (``ends_s``: end time of each iteration)."""
    n = len(ends_s) - warmup
    return batch * n / (ends_s[-1] - ends_s[warmup - 1])


def runtime_sps(model: str, workers: int, batch: int, iterations: int, warmup: int, threads: int) -> float:
    cfg = {
        "name": f"overhead-{model}", "seed": SEED,
        "cluster": {"devices": [{"type": "this_machine", "count": workers}],
                    "ps": {"shards": 1, "type": "this_machine"},
                    "network": {"bandwidth_gbps": 13, "latency_us": 65}},
        "job": {"model": model, "global_batch": batch, "iterations": iterations, "sync": "bsp",
                "failure_timeout_s": 120.0},
        "scheduler": {"name": "equal"},
        "runtime": {"model_kwargs": MODELS[model], "lr": 0.01, "threads": threads},
    }
    with tempfile.TemporaryDirectory(prefix="hetsim-overhead-") as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        result = run_local(entry.prepare(path).spec, wall_timeout_s=1800)
    return sps(result.iter_end_s, batch, warmup)


def _ddp_rank(rank: int, world: int, port: int, model: str, batch: int, iterations: int, threads: int,
              out: str) -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns Ctrl-C and reaps the ranks
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    keep_freed_memory()  # as every runtime rank does: the same allocator on both sides
    torch.set_num_threads(threads)
    os.environ.update({"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port)})
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=1800))
    try:
        module, _ = task.build(model, SEED, MODELS[model])
        teacher = task.Teacher(model, SEED, MODELS[model])
        ddp = DistributedDataParallel(module.train())
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        share = batch // world
        ends = []
        for t in range(iterations):
            gen, _ = task.iteration_generators(SEED, rank, t)
            x, y = teacher.batch(share, gen)
            opt.zero_grad(set_to_none=False)
            task.loss_fn(task.call(ddp, x), y).backward()  # the gradient all-reduce runs in backward
            opt.step()
            ends.append(time.perf_counter())
        if rank == 0:
            Path(out).write_text(json.dumps(ends))
    finally:
        dist.destroy_process_group()


def ddp_sps(model: str, workers: int, batch: int, iterations: int, warmup: int, threads: int) -> float:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    port = free_port()
    procs: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="hetsim-ddp-") as tmp:
        out = str(Path(tmp) / "ends.json")
        try:
            for r in range(workers):
                p = ctx.Process(target=_ddp_rank, args=(r, workers, port, model, batch, iterations, threads, out))
                p.start()
                procs.append(p)
            for p in procs:
                p.join()
            if any(p.exitcode != 0 for p in procs):
                raise RuntimeError(f"a DDP rank failed: exit codes {[p.exitcode for p in procs]}")
            ends = json.loads(Path(out).read_text())
        finally:
            reap(procs)
    return sps(ends, batch, warmup)


def measure(models: list[str], workers: int, batch: int, iterations: int, warmup: int, threads: int,
            repeats: int) -> list[dict[str, Any]]:
    rows = []
    for model in models:
        rt, ddp = [], []
        for _ in range(repeats):  # alternating, so a change of machine load hits both
            rt.append(runtime_sps(model, workers, batch, iterations, warmup, threads))
            ddp.append(ddp_sps(model, workers, batch, iterations, warmup, threads))
        a, b = statistics.median(rt), statistics.median(ddp)
        rows.append({"model": model, "runtime_sps": a, "ddp_sps": b, "ratio": a / b,
                     "runtime_repeats": rt, "ddp_repeats": ddp})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--workers", type=int, default=2, help="worker processes (both systems)")
    ap.add_argument("--batch", type=int, default=64, help="global batch, split evenly")
    ap.add_argument("--iterations", type=int, default=30, help="iterations per repeat, warm-up included")
    ap.add_argument("--warmup", type=int, default=5, help="leading iterations not timed")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process (both systems)")
    ap.add_argument("--repeats", type=int, default=3, help="fresh starts of each system; the median is reported")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = ap.parse_args()
    models = a.models.split(",")
    if unknown := [m for m in models if m not in MODELS]:
        ap.error(f"--models: unknown {unknown}; known: {', '.join(MODELS)}")
    if not 0 < a.warmup < a.iterations or a.batch % a.workers:
        ap.error("need 0 < --warmup < --iterations and --batch divisible by --workers")
    rows = measure(models, a.workers, a.batch, a.iterations, a.warmup, a.threads, a.repeats)
    if a.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{a.workers} workers, global batch {a.batch}, {a.threads} thread(s) per process, "
          f"{a.iterations - a.warmup} timed iterations, median of {a.repeats}; {os.cpu_count()} CPUs")
    print(f"{'model':9} {'runtime_sps':>12} {'ddp_sps':>10} {'ratio':>6}")
    for r in rows:
        print(f"{r['model']:9} {r['runtime_sps']:12.1f} {r['ddp_sps']:10.1f} {r['ratio']:6.2f}")


if __name__ == "__main__":
    main()
