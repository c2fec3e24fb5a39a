"""Random placement instances (Problem B): models and clusters drawn from a seeded distribution.

Used by the property tests (exact == bruteforce), the RL training
distribution (one policy for models it has not seen) and bench/placement.py.
A model is a chain: optionally a block of sparse embedding layers (the
IO-bound CTR front), then dense layers (gemm / conv / attention with
elementwise layers between), sizes log-uniform over several decades. A
cluster draws device types from the shipped datasheet profiles (at least one
CPU and one GPU type), an inventory count per type, PS shards and a network
bandwidth. ``throughput_min`` is a fraction of what the fastest single-type
plan reaches, so most instances are feasible but not trivially so.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hardware_profiles import load_profile
from sim.cluster import Cluster, Device, Network
from sim.dag import Edge, Task, TaskGraph
from sim.placement import PlacementSpace
from sim.problem import Job, Objective, Problem
from sim.workload import Layer, Model, Sparse

CPU_TYPES = ("cpu-2c", "cpu-8c", "cpu-16c")
GPU_TYPES = ("t4", "l4", "a10g", "v100", "a100", "h100")


def _lu(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def random_model(rng: np.random.Generator, n_layers: int, name: str = "random") -> Model:
    """A chain of ``n_layers`` layers: maybe sparse embeddings first, then dense layers."""
    layers: list[Layer] = []
    n_sparse = int(rng.integers(0, max(1, n_layers // 3) + 1)) if rng.random() < 0.6 else 0
    for i in range(n_layers):
        if i < n_sparse:
            row = _lu(rng, 16, 512)
            rows = float(rng.integers(1, 64))
            layers.append(Layer(f"emb{i}", "embedding", 0.0, 0.0, param_bytes=_lu(rng, 1e7, 5e9),
                                activation_bytes=rows * row / 8,
                                sparse=Sparse(rows_per_sample=rows, row_bytes=row)))
            continue
        op = str(rng.choice(["gemm", "gemm", "conv", "attention", "elementwise"]))
        if op == "elementwise":
            act = _lu(rng, 1e3, 1e6)
            layers.append(Layer(f"l{i}", "elementwise", act / 4, act / 2, 0.0, act))
            continue
        flops = _lu(rng, 1e5, 5e9)
        params = _lu(rng, 1e4, 2e7)
        act = _lu(rng, 256, 2e6)
        layers.append(Layer(f"l{i}", op, flops, 2 * flops, params, act))  # type: ignore[arg-type]
    return Model(name, tuple(layers), input_bytes=_lu(rng, 64, 6e5))


def random_problem(seed: int, n_layers: int | tuple[int, int] = (4, 24), n_types: int | tuple[int, int] = (2, 5),
                   samples: float = 1e7, throughput_frac: tuple[float, float] = (0.05, 0.6),
                   counts: tuple[int, int] = (2, 16)) -> Problem:
    """A seeded random placement problem (minimise cost subject to throughput_min)."""
    rng = np.random.default_rng(seed)
    L = n_layers if isinstance(n_layers, int) else int(rng.integers(n_layers[0], n_layers[1] + 1))
    K = n_types if isinstance(n_types, int) else int(rng.integers(n_types[0], n_types[1] + 1))
    K = max(2, min(K, len(CPU_TYPES) + len(GPU_TYPES)))
    n_cpu = int(rng.integers(max(1, K - len(GPU_TYPES)), min(K - 1, len(CPU_TYPES)) + 1))
    names = list(rng.choice(CPU_TYPES, n_cpu, replace=False)) + \
        list(rng.choice(GPU_TYPES, K - n_cpu, replace=False))
    gbps = float(rng.choice([1, 10, 25, 100]))
    nic = gbps * 1e9 / 8
    devices = []
    for name in names:
        prof = load_profile(str(name))
        for c in range(int(rng.integers(counts[0], counts[1] + 1))):
            devices.append(Device(f"{name}:{c}", prof, nic))
    ps_prof = load_profile("cpu-16c")
    shards = tuple(Device(f"ps:{s}", ps_prof, nic) for s in range(int(rng.integers(2, 9))))
    cluster = Cluster(tuple(devices), shards, Network(latency_s=50e-6))
    model = random_model(rng, L)
    batch = int(rng.choice([64, 256, 1024, 4096]))
    job = Job(model=model, global_batch=batch, iterations=max(1, int(samples // batch)),
              pipeline=bool(rng.random() < 0.5))
    problem = Problem(f"random-{seed}", seed, cluster, job, Objective("cost"))
    # throughput_min: a fraction of the fastest single-type plan (unconstrained provisioning)
    space = PlacementSpace(problem)
    full = np.arange(L + 1)
    seg = space.seg_index[0, L]
    reach = float(np.where(space.fits[seg], space.stage_tput[seg], 0.0).max())
    single = space.seg_index[full[:-1], full[1:]]
    reach = min(reach * 4, float(np.where(space.fits[single], space.stage_tput[single], 0.0).max(axis=(1, 2)).min()))
    frac = rng.uniform(*throughput_frac)
    return replace(problem, objective=Objective("cost", throughput_min=max(1.0, frac * reach)))


# ------------------------------------------------------------------ random task graphs (robotics)

#: Op classes of random DAG tasks: what robotics kernels and perception layers are.
DAG_OPS = ("elementwise", "gemm", "conv", "embedding")


def random_graph(seed: int, n_tasks: int, max_width: int = 3, name: str | None = None) -> TaskGraph:
    """A random layered DAG of ``n_tasks`` tasks (seeded).

    Tasks are laid out in layers of 1..``max_width``; each task after the first
    layer takes input from 1-2 tasks of earlier layers (at least one from the
    layer just before), so the graph is connected forward. Work is log-uniform:
    1e6-1e9 FLOPs, 1e4-1e7 bytes, 1-20 kernel launches; edges carry 1e3-1e6 bytes.
    """
    rng = np.random.default_rng(np.random.SeedSequence(seed))
    layers: list[list[int]] = []
    i = 0
    while i < n_tasks:
        w = min(int(rng.integers(1, max_width + 1)), n_tasks - i)
        layers.append(list(range(i, i + w)))
        i += w
    tasks = [Task(f"t{k}", str(rng.choice(DAG_OPS)), _lu(rng, 1e6, 1e9), _lu(rng, 1e4, 1e7),
                  int(rng.integers(1, 21))) for k in range(n_tasks)]
    edges: dict[tuple[int, int], float] = {}
    for li in range(1, len(layers)):
        earlier = [t for lay in layers[:li] for t in lay]
        for t in layers[li]:
            srcs = {int(rng.choice(layers[li - 1]))}
            if rng.random() < 0.5:
                srcs.add(int(rng.choice(earlier)))
            for s in srcs:
                edges[s, t] = _lu(rng, 1e3, 1e6)
    return TaskGraph(name or f"random-{seed}", tuple(tasks),
                     tuple(Edge(f"t{a}", f"t{b}", nb) for (a, b), nb in sorted(edges.items())))
