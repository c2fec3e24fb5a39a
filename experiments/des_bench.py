"""Speed and scale of the evaluators (`hetsim bench`). Not a test: it prints figures.

* SimPy's bare event rate (a process yielding timeouts) against the DES's
  simulated events per second on a 64-worker, 8-shard, resnet50, BSP,
  pipelined job, and their ratio: measured five times, each DES run right
  after its SimPy loop, and the median reported (``--repeat``).
* DES wall time for 1,024 workers x 16 shards x 20 iterations (resnet50, BSP,
  no pipelining), and how it grows with workers and with iterations.
* DES wall time of an all-reduce plan (``job.sync: allreduce``, ring, 25 MiB buckets
  overlapping the backward) of 256 workers x 20 iterations (resnet50).
* Analytic evaluator wall time on up to 100,000 workers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import simpy

from experiments import runner
from sim import analytic
from sim.costmodel import plan_costs
from sim.des import collective, kernel
from sim.des.engine import DataParallelSim

_TYPES = ("a100", "v100", "t4", "l4")


def bench_config(workers: int, shards: int, iterations: int, pipeline: bool,
                 model: str = "resnet50", per_worker_batch: int = 32, sharing: str = "fair",
                 sync: str = "bsp") -> runner.Loaded:
    """A heterogeneous cluster: ``workers`` spread evenly over four GPU types (with
    ``sync: allreduce``, no parameter server and ``shards`` unused)."""
    counts = [workers // len(_TYPES) + (1 if i < workers % len(_TYPES) else 0) for i in range(len(_TYPES))]
    cluster: dict[str, Any] = {
        "devices": [{"type": t, "count": n} for t, n in zip(_TYPES, counts) if n > 0],
        "network": {"bandwidth_gbps": 25, "latency_us": 20, "sharing": sharing},
    }
    if sync != "allreduce":
        cluster["ps"] = {"shards": shards, "type": "cpu-16c"}
    data = {
        "name": f"bench-{workers}w-{shards}s",
        "cluster": cluster,
        "job": {"model": model, "global_batch": per_worker_batch * workers, "iterations": iterations,
                "sync": sync, "pipeline": pipeline},
        "scheduler": {"name": "proportional"},
    }
    return runner.from_dict(data, Path("."), "<bench>")


def simpy_event_rate(n: int = 300_000, inlined: bool = False) -> float:
    """Events per second of a bare SimPy loop of timeouts, run by ``env.run`` or,
    with ``inlined``, by the event loop the DES uses (:func:`sim.des.kernel.run` on a
    :class:`sim.des.kernel.Environment`, SimPy's step inlined): the fair baseline for
    the DES's own loop."""
    env = kernel.Environment() if inlined else simpy.Environment()

    def loop() -> Any:
        for _ in range(n):
            yield env.timeout(1.0)

    proc = env.process(loop())
    t0 = time.perf_counter()
    if inlined:
        kernel.run(env, proc)
    else:
        env.run()
    return n / (time.perf_counter() - t0)


def _timed_run(loaded: runner.Loaded, make_sim: Any) -> tuple[Any, Any, float, int]:
    """(sim, result, wall seconds, events) of ``make_sim(problem, plan)`` run on the
    config's plan; planning is not timed."""
    problem = runner.problem_of(loaded)
    plan = runner.plan_for(loaded, problem)
    t0 = time.perf_counter()
    sim = make_sim(problem, plan)
    result = sim.run()
    wall = time.perf_counter() - t0
    return sim, result, wall, kernel.processed_events(sim.env)


def des_run(workers: int, shards: int, iterations: int, pipeline: bool,
            sharing: str = "fair") -> dict[str, Any]:
    """Wall time and event count of one DES run (tracing off, as in large runs)."""
    _, result, wall, events = _timed_run(
        bench_config(workers, shards, iterations, pipeline, sharing=sharing),
        lambda pr, pl: DataParallelSim(pr, pl, plan_costs(pr, pl), trace=False))
    return {"workers": workers, "shards": shards, "iterations": iterations, "pipeline": pipeline,
            "sharing": sharing, "wall_s": wall, "wall_s_per_iteration": wall / iterations, "events": events,
            "events_per_s": events / wall, "sim_throughput_sps": result.throughput_sps}


def allreduce_run(workers: int, iterations: int) -> dict[str, Any]:
    """Wall time and event count of one all-reduce DES run (`job.sync: allreduce`, pipelined,
    tracing off)."""
    sim, result, wall, events = _timed_run(
        bench_config(workers, 0, iterations, pipeline=True, sync="allreduce"),
        lambda pr, pl: collective.AllreduceSim(pr, pl, trace=False))
    return {"workers": workers, "iterations": iterations, "wall_s": wall, "events": events,
            "buckets": sim.K, "sim_throughput_sps": float(result.throughput_sps)}


def analytic_run(workers: int, shards: int = 16, iterations: int = 20) -> dict[str, float]:
    loaded = bench_config(workers, shards, iterations, pipeline=False)
    problem = runner.problem_of(loaded)
    plan = runner.plan_for(loaded, problem)
    t0 = time.perf_counter()
    result = analytic.evaluate(problem, plan)
    wall = time.perf_counter() - t0
    return {"workers": workers, "wall_s": wall, "sim_throughput_sps": result.throughput_sps}


def ratio_pairs(repeat: int, quick: bool = False, sharing: str = "fair") -> list[dict[str, Any]]:
    """``repeat`` measurements of the ratio, each a bare SimPy rate and the DES run
    taken right after it (so that both see the machine in one state: on a shared
    machine either rate drifts by 10-20% over minutes)."""
    pairs = []
    for _ in range(repeat):
        simpy_rate = simpy_event_rate(50_000 if quick else 300_000)
        run = des_run(16 if quick else 64, 8, 3 if quick else 5, pipeline=True, sharing=sharing)
        pairs.append({"simpy_events_per_s": simpy_rate, "des_event_rate_run": run,
                      "ratio": run["events_per_s"] / simpy_rate})
    return pairs


def run_all(quick: bool = False, progress: bool = True, repeat: int | None = None) -> dict[str, Any]:
    """Every figure the benchmark reports, as a dict (what --json prints).

    The ratio is measured ``repeat`` times (default 5, 1 with ``quick``) by
    :func:`ratio_pairs`; the pair with the median ratio (the lower middle one for
    an even count) gives ``simpy_events_per_s``, ``des_event_rate_run`` and
    ``ratio``, and ``ratio_runs`` lists every pair's ratio in the order measured.
    The contention-free reference is one pair of its own; the inlined loop's rate
    (``simpy_events_per_s_inlined``) is measured beside a plain one
    (``simpy_events_per_s_beside_inlined``).
    """
    say = print if progress else (lambda *a, **k: None)
    n = (1 if quick else 5) if repeat is None else repeat
    if n < 1:
        raise ValueError("repeat must be at least 1")
    out: dict[str, Any] = {}
    say(f"ratio, {n} time(s): bare SimPy event rate, then the DES: {16 if quick else 64} workers x "
        "8 shards, resnet50, BSP, pipelined ...", flush=True)
    pairs = ratio_pairs(n, quick)
    mid = sorted(pairs, key=lambda x: x["ratio"])[(n - 1) // 2]
    out["simpy_events_per_s"] = mid["simpy_events_per_s"]
    out["des_event_rate_run"] = mid["des_event_rate_run"]
    out["des_events_per_s"] = mid["des_event_rate_run"]["events_per_s"]
    out["ratio"] = mid["ratio"]
    out["ratio_runs"] = [x["ratio"] for x in pairs]
    # the loop the DES runs SimPy's queue with, beside env.run: measured together
    out["simpy_events_per_s_beside_inlined"] = simpy_event_rate(50_000 if quick else 300_000)
    out["simpy_events_per_s_inlined"] = simpy_event_rate(50_000 if quick else 300_000, inlined=True)
    say("  the same job on a contention-free network (sharing: none), for reference ...", flush=True)
    (ref_pair,) = ratio_pairs(1, quick, sharing="none")
    ref = ref_pair["des_event_rate_run"]
    out["des_event_rate_run_no_contention"] = ref
    out["simpy_events_per_s_no_contention"] = ref_pair["simpy_events_per_s"]
    out["ratio_no_contention"] = ref_pair["ratio"]
    sizes = (32, 64, 128) if quick else (128, 256, 512, 1024)
    iters = (2, 4) if quick else (5, 10, 20)
    out["des_scale_workers"] = []
    for n in sizes:
        say(f"DES scale: {n} workers x 16 shards x {iters[-1]} iterations ...", flush=True)
        out["des_scale_workers"].append(des_run(n, 16, iters[-1], pipeline=False))
    out["des_scale_iterations"] = []
    for k in iters[:-1]:
        say(f"DES scale: {sizes[-1]} workers x 16 shards x {k} iterations ...", flush=True)
        out["des_scale_iterations"].append(des_run(sizes[-1], 16, k, pipeline=False))
    out["des_scale_iterations"].append(out["des_scale_workers"][-1])
    n_ar, it_ar = (32, 4) if quick else (256, 20)
    say(f"DES all-reduce: {n_ar} workers x {it_ar} iterations ...", flush=True)
    out["des_allreduce"] = allreduce_run(n_ar, it_ar)
    out["analytic_scale"] = []
    for n in ((1_000, 10_000) if quick else (1_000, 10_000, 100_000)):
        say(f"analytic: {n} workers ...", flush=True)
        out["analytic_scale"].append(analytic_run(n))
    big = out["des_scale_workers"][-1]
    out["targets"] = {
        "ratio>=0.3": out["ratio"] >= 0.3,
        f"des_{big['workers']}w_20it<60s": big["wall_s"] < 60 if not quick else None,
        "analytic_100k<1s": out["analytic_scale"][-1]["wall_s"] < 1 if not quick else None,
        "des_allreduce_256w_20it<10s": out["des_allreduce"]["wall_s"] < 10 if not quick else None,
    }
    return out


def print_report(f: dict[str, Any]) -> None:
    print()
    print(f"bare SimPy events/s            {f['simpy_events_per_s']:,.0f}")
    r = f["des_event_rate_run"]
    print(f"DES events/s ({r['workers']}w x {r['shards']}s, pipelined) {f['des_events_per_s']:,.0f}"
          f"   ({r['events']:,} events in {r['wall_s']:.2f} s, {r['wall_s_per_iteration']:.3f} s/iteration)")
    runs = f.get("ratio_runs", [f["ratio"]])
    spread = (f"   (median of {len(runs)}: {min(runs):.3f}-{max(runs):.3f})" if len(runs) > 1 else "")
    print(f"ratio                          {f['ratio']:.3f}   (target >= 0.3){spread}")
    print(f"  the DES runs SimPy's queue with its own loop (SimPy's step inlined); through that "
          f"loop the bare timeouts run at {f['simpy_events_per_s_inlined']:,.0f} events/s, "
          f"against {f['simpy_events_per_s_beside_inlined']:,.0f} through env.run beside it")
    ref = f["des_event_rate_run_no_contention"]
    print(f"  same job, sharing: none      {ref['events_per_s']:,.0f} events/s, ratio "
          f"{f['ratio_no_contention']:.2f}   ({ref['events']:,} events in {ref['wall_s']:.2f} s)")
    print("\nDES wall time vs workers (16 shards, BSP, no pipelining):")
    for x in f["des_scale_workers"]:
        print(f"  {x['workers']:>6} workers x {x['iterations']:>3} it: {x['wall_s']:7.2f} s  "
              f"{x['wall_s'] / x['workers'] * 1e3:6.2f} ms/worker  {x['events']:>10,} events")
    print("DES wall time vs iterations:")
    for x in f["des_scale_iterations"]:
        print(f"  {x['workers']:>6} workers x {x['iterations']:>3} it: {x['wall_s']:7.2f} s  "
              f"{x['wall_s'] / x['iterations']:6.3f} s/iteration")
    a = f["des_allreduce"]
    print(f"DES all-reduce (ring, {a['buckets']} buckets, pipelined): {a['workers']} workers x "
          f"{a['iterations']} it: {a['wall_s']:.2f} s  {a['events']:,} events")
    print("Analytic wall time vs workers:")
    for x in f["analytic_scale"]:
        print(f"  {x['workers']:>7} workers: {x['wall_s'] * 1e3:8.1f} ms")
    print("\ntargets:", ", ".join(f"{k}: {v}" for k, v in f["targets"].items()))
