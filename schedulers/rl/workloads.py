"""Placement instances of real models: what the `rl` policy trains on beside the random chains.

:func:`sim.instances.random_problem` draws chains of 4-24 layers of
independent random sizes. Users place real networks: tens to hundreds of
layers, mostly repeated blocks, with the elementwise layers (norms,
activations, dropout, pooling) between the layers that carry the work. This
module draws those:

* **Models.** The zoo's models (:mod:`sim.zoo`) at their real depth, and
  networks of the same families built here layer by layer as
  :func:`sim.torch_extract.from_torch` lists them (FLOPs, parameter and
  activation bytes per sample from the layer shapes): residual and plain
  convolutional networks (depth, width, input size), encoder transformers
  (blocks, width, sequence, vocabulary), recommendation models (embedding
  tables, then an MLP) and plain MLPs.
* **Inventories.** 2-8 device types drawn from the shipped datasheet
  profiles with their prices (``CPU_TYPES`` and ``GPU_TYPES``), at least one
  GPU, 1-32 devices of a CPU type and 1-16 of a GPU type; 1-8 PS shards;
  1-100 Gbit/s.
* **Floors.** ``throughput_min`` a fraction (``floor``, drawn uniformly) of
  the highest throughput any placement reaches within the inventory
  (:func:`max_throughput`), so floors cover the feasible range.

Everything is drawn from ``np.random.default_rng(seed)``; the same seed gives
the same problem.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from hardware_profiles import load_profile
from schedulers.exact import dp_min_rate, inventory_dp
from schedulers.rl.grouping import MAX_GROUPS, grouped
from sim import zoo
from sim.cluster import Cluster, Device, Network
from sim.placement import PlacementSpace
from sim.problem import Job, Objective, Problem
from sim.workload import Layer, Model, Sparse

CPU_TYPES = ("cpu-2c", "cpu-8c", "cpu-16c")
GPU_TYPES = ("t4", "l4", "a10g", "v100", "a100", "h100", "h200")
BATCHES = (64, 128, 256, 512, 1024, 2048, 4096)
#: Largest inventory state the feasibility test's resource DP may take on.
FEASIBILITY_MAX_STATES = 20_000
F32 = 4.0


def _lu(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.exp(rng.uniform(np.log(lo), np.log(hi))))


def _ew(name: str, act: float, params: float = 0.0, kernels: int = 1, inplace: bool = False,
        window: int = 1) -> Layer:
    return Layer(name, "elementwise", 0.0, 0.0, params, act, kernels=kernels, inplace=inplace, window=window)


def _conv(name: str, hw: int, cin: int, cout: int, k: int, first: bool = False) -> Layer:
    f = 2.0 * hw * hw * cin * cout * k * k
    return Layer(name, "conv", f, f if first else 2 * f, F32 * (cin * cout * k * k), F32 * hw * hw * cout)


def _gemm(name: str, rows: int, cin: int, cout: int, first: bool = False, bias: bool = True) -> Layer:
    f = 2.0 * rows * cin * cout
    return Layer(name, "gemm", f, f if first else 2 * f, F32 * (cin * cout + (cout if bias else 0)),
                 F32 * rows * cout)


def convnet(rng: np.random.Generator, name: str = "convnet") -> Model:
    """A residual (basic or bottleneck blocks, BatchNorm) or plain (VGG-like) image network."""
    size = int(rng.choice([32, 64, 128, 160, 224, 256]))
    width = int(rng.choice([16, 32, 48, 64, 96]))
    classes = int(rng.choice([10, 100, 1000]))
    layers: list[Layer] = []
    if rng.random() < 0.25:                                    # plain: conv+relu pairs, pools, big classifier
        hw, c = size, 3
        for s in range(int(rng.integers(3, 6))):
            cout = min(width * 2 ** s, 512)
            for r in range(int(rng.integers(1, 4))):
                layers += [_conv(f"s{s}.{r}.conv", hw, c, cout, 3, first=not layers), _ew(f"s{s}.{r}.relu", F32 * hw * hw * cout, inplace=True)]
                c = cout
            hw = max(1, hw // 2)
            layers.append(_ew(f"s{s}.pool", F32 * hw * hw * c, window=4))
        hidden = int(rng.choice([512, 1024, 4096]))
        layers += [_gemm("fc0", 1, c * hw * hw, hidden), _ew("fc0.relu", F32 * hidden), _ew("fc0.drop", F32 * hidden, kernels=3),
                   _gemm("fc1", 1, hidden, classes)]
        return Model(name, tuple(layers), input_bytes=F32 * 3 * size * size)
    bottleneck = rng.random() < 0.5
    hw = size // 2
    layers += [_conv("conv1", hw, 3, width, 7, first=True), _ew("bn1", F32 * hw * hw * width, F32 * 2 * width, 2),
               _ew("relu", F32 * hw * hw * width, inplace=True)]
    hw = max(1, hw // 2)
    layers.append(_ew("maxpool", F32 * hw * hw * width, window=9))
    c = width
    for s in range(4):
        mid = width * 2 ** s
        cout = mid * 4 if bottleneck else mid
        for blk in range(int(rng.integers(1, 9 if bottleneck else 4))):
            if blk == 0 and s > 0:
                hw = max(1, hw // 2)
            p = f"layer{s + 1}.{blk}"
            chans = [(c, mid, 1), (mid, mid, 3), (mid, cout, 1)] if bottleneck else [(c, mid, 3), (mid, cout, 3)]
            for j, (ci, co, k) in enumerate(chans):
                layers += [_conv(f"{p}.conv{j + 1}", hw, ci, co, k), _ew(f"{p}.bn{j + 1}", F32 * hw * hw * co, F32 * 2 * co, 2)]
                if j < len(chans) - 1:
                    layers.append(_ew(f"{p}.relu#{j + 1}", F32 * hw * hw * co, inplace=True))
            if blk == 0 and c != cout:
                layers += [_conv(f"{p}.downsample.0", hw, c, cout, 1), _ew(f"{p}.downsample.1", F32 * hw * hw * cout, F32 * 2 * cout, 2)]
            layers.append(_ew(f"{p}.relu#{len(chans)}", F32 * hw * hw * cout, inplace=True))
            c = cout
    layers += [_ew("avgpool", F32 * c), _gemm("fc", 1, c, classes)]
    return Model(name, tuple(layers), input_bytes=F32 * 3 * size * size)


def transformer(rng: np.random.Generator, name: str = "transformer") -> Model:
    """A pre-norm encoder language model: token embedding (sparse), blocks, LM head."""
    d = int(rng.choice([256, 384, 512, 768, 1024]))
    seq = int(rng.choice([64, 128, 256, 512]))
    vocab = int(rng.choice([8000, 16000, 32000, 50000]))
    ff = 4 * d
    a = F32 * seq * d
    layers: list[Layer] = [Layer("tok", "embedding", 0.0, 0.0, F32 * vocab * d, a, Sparse(seq, F32 * d)),
                           _ew("drop", a, kernels=3)]
    for b in range(int(rng.integers(2, 13))):
        p = f"encoder.layers.{b}"
        att = 2.0 * seq * 4 * d * d + 4.0 * seq * seq * d
        layers += [_ew(f"{p}.norm1", a, F32 * 2 * d),
                   Layer(f"{p}.self_attn", "attention", att, 2 * att, F32 * (4 * d * d + 4 * d), a, kernels=19),
                   _ew(f"{p}.dropout1", a, kernels=3), _ew(f"{p}.norm2", a, F32 * 2 * d),
                   _gemm(f"{p}.linear1", seq, d, ff), _ew(f"{p}.dropout", F32 * seq * ff, kernels=3),
                   _gemm(f"{p}.linear2", seq, ff, d), _ew(f"{p}.dropout2", a, kernels=3)]
    layers += [_ew("encoder.norm", a, F32 * 2 * d), _gemm("head", seq, d, vocab)]
    return Model(name, tuple(layers), input_bytes=F32 * seq)


def recsys(rng: np.random.Generator, name: str = "recsys") -> Model:
    """Embedding tables (one sparse layer per field), optionally a wide part, then an MLP."""
    fields = int(rng.integers(4, 41))
    dim = int(rng.choice([8, 16, 32, 64, 128]))
    rows = _lu(rng, 1e4, 5e6)
    ids = float(rng.choice([1, 1, 2, 4, 8]))
    layers: list[Layer] = []
    if rng.random() < 0.3:
        layers.append(Layer("wide", "embedding", 0.0, 0.0, F32 * rows * fields / 10, F32,
                            Sparse(fields * ids, F32), kernels=2))
    layers += [Layer(f"emb.{i}", "embedding", 0.0, 0.0, F32 * rows * dim, F32 * dim, Sparse(ids, F32 * dim))
               for i in range(fields)]
    c = fields * dim + 13
    for i, w in enumerate(sorted(rng.choice([128, 256, 512, 1024, 2048], int(rng.integers(2, 6))))[::-1]):
        layers += [_gemm(f"deep.{2 * i}", 1, c, int(w), first=i == 0), _ew(f"deep.{2 * i + 1}", F32 * int(w))]
        c = int(w)
    layers.append(_gemm(f"deep.{2 * len(layers)}", 1, c, 1))
    return Model(name, tuple(layers), input_bytes=F32 * (fields * ids + 13))


def mlp(rng: np.random.Generator, name: str = "mlp") -> Model:
    """A multilayer perceptron of 2-12 hidden layers."""
    c0 = c = int(rng.choice([784, 1024, 3072]))
    layers: list[Layer] = []
    for i in range(int(rng.integers(2, 13))):
        w = int(rng.choice([512, 1024, 2048, 4096, 8192]))
        layers += [_gemm(f"{2 * i}", 1, c, w, first=i == 0), _ew(f"{2 * i + 1}", F32 * w, inplace=True)]
        c = w
    layers.append(_gemm("out", 1, c, int(rng.choice([10, 100, 1000]))))
    return Model(name, tuple(layers), input_bytes=F32 * c0)


#: Model families drawn by :func:`real_model`, with their shares.
FAMILIES: dict[str, tuple[Callable[[np.random.Generator, str], Model], float]] = {
    "convnet": (convnet, 0.35), "transformer": (transformer, 0.3), "recsys": (recsys, 0.25), "mlp": (mlp, 0.1),
}


def real_model(rng: np.random.Generator, zoo_share: float = 0.5) -> Model:
    """A zoo model (with probability ``zoo_share``) or one drawn from a family of ``FAMILIES``."""
    if rng.random() < zoo_share:
        return zoo.get(str(rng.choice(zoo.names())))
    names = list(FAMILIES)
    p = np.array([FAMILIES[n][1] for n in names])
    fam = str(rng.choice(names, p=p / p.sum()))
    return FAMILIES[fam][0](rng, fam)


def feasible_at(space: PlacementSpace, target: float) -> bool:
    """Does the least-rate placement with every stage at ``target`` (within the inventory) meet it?

    Provisions ``space`` at ``target``. A sufficient test: a placement the
    least-rate one leaves out (for the PS bound) may still meet the target.
    """
    space.provision(target)
    allowed = space.n > 0
    _, a = dp_min_rate(space, allowed)
    if a is None:
        return False
    _, a, _, done = inventory_dp(space, allowed, a, max_states=FEASIBILITY_MAX_STATES)
    return a is not None and done and bool(space.evaluate(a[None, :]).feasible[0])


def max_throughput(space: PlacementSpace, rel: float = 0.01) -> float:
    """The highest ``throughput_min`` :func:`feasible_at` meets (bisection to ``rel``), 0 if none.

    Leaves ``space`` provisioned at its problem's own ``throughput_min``.
    """
    own = space.target
    hi = space.best_reachable()[0]
    lo = hi * 1e-4
    if not hi > 0 or not feasible_at(space, lo):
        space.provision(own)
        return 0.0
    while hi / lo > 1 + rel:
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if feasible_at(space, mid) else (lo, mid)
    space.provision(own)
    return lo


def cluster_of(rng: np.random.Generator, n_types: tuple[int, int] = (2, 8)) -> Cluster:
    """2-8 device types (at least one GPU) with counts, PS shards and a network (module docstring)."""
    K = int(rng.integers(n_types[0], n_types[1] + 1))
    n_gpu = int(rng.integers(max(1, K - len(CPU_TYPES)), min(K, len(GPU_TYPES)) + 1))
    names = list(rng.choice(CPU_TYPES, K - n_gpu, replace=False)) + list(rng.choice(GPU_TYPES, n_gpu, replace=False))
    gbps = float(rng.choice([1, 10, 25, 100], p=[0.1, 0.3, 0.4, 0.2]))
    nic = gbps * 1e9 / 8
    devices = []
    for name in rng.permutation(names):
        prof = load_profile(str(name))
        top = 32 if prof.kind == "cpu" else 16
        for c in range(int(round(_lu(rng, 1, top)))):
            devices.append(Device(f"{name}:{c}", prof, nic))
    ps = load_profile("cpu-16c")
    shards = tuple(Device(f"ps:{s}", ps, nic) for s in range(int(rng.integers(1, 9))))
    return Cluster(tuple(devices), shards, Network(latency_s=50e-6))


def job_of(rng: np.random.Generator, model: Model, samples: float = 1e7) -> Job:
    """A job of ``model``: global batch from ``BATCHES``, pipelined with probability 0.6."""
    batch = int(rng.choice(BATCHES))
    return Job(model=model, global_batch=batch, iterations=max(1, int(samples // batch)),
               pipeline=bool(rng.random() < 0.6))


def retarget(space: PlacementSpace, problem: Problem) -> PlacementSpace:
    """``space`` (built for ``problem`` with another floor) provisioned at ``problem``'s floor:
    the same arrays a fresh ``PlacementSpace(problem)`` holds, without rebuilding them."""
    space.problem = problem
    tmin = problem.objective.throughput_min
    space.throughput_min = float(tmin) if tmin else 0.0
    space.provision(space.throughput_min)
    return space


def real_instance(seed: int, model: Model | None = None, n_types: tuple[int, int] = (2, 8),
                  floor: tuple[float, float] = (0.05, 0.95), zoo_share: float = 0.5,
                  groups: int = MAX_GROUPS) -> tuple[Problem, PlacementSpace] | None:
    """A seeded placement problem of a real model (module docstring) and its PlacementSpace;
    None when no placement meets even a tiny floor on the drawn cluster.

    The highest feasible throughput is searched on the model grouped into
    ``groups`` units (:func:`schedulers.rl.grouping.grouped`; a lower bound of
    the layer-level one, found much faster), which is what training needs.
    """
    rng = np.random.default_rng(seed)
    m = model if model is not None else real_model(rng, zoo_share)
    cluster = cluster_of(rng, n_types)
    problem = Problem(f"real-{m.name}-{seed}", seed, cluster, job_of(rng, m), Objective("cost"))
    space = PlacementSpace(problem)
    top = max_throughput(grouped(space, groups))
    if top <= 0:
        return None
    problem = replace(problem, objective=Objective("cost", throughput_min=float(rng.uniform(*floor)) * top))
    return problem, retarget(space, problem)


#: The fixed real-model suite: inventory seeds (each also draws the job's batch and pipelining)
#: and floors as fractions of the highest feasible throughput.
SUITE_SEEDS = (3_000_000_001, 3_000_000_002, 3_000_000_003, 3_000_000_004)
SUITE_FLOORS = (0.2, 0.5, 0.8)


def suite(models: tuple[str, ...] | None = None, seeds: tuple[int, ...] = SUITE_SEEDS,
          floors: tuple[float, ...] = SUITE_FLOORS) -> list[Problem]:
    """Zoo models x inventories x floors, seeds fixed: the real-model suite of bench/rl_placement.py.

    Inventory seeds lie above the training seeds; a (model, inventory) with no
    feasible placement is left out.
    """
    out = []
    for s in seeds:
        for name in models or tuple(zoo.names()):
            rng = np.random.default_rng(s)
            cluster = cluster_of(rng)
            base = Problem(f"suite-{name}-{s}", s, cluster, job_of(rng, zoo.get(name)), Objective("cost"))
            top = max_throughput(PlacementSpace(base))
            if top <= 0:
                continue
            for f in floors:
                out.append(replace(base, name=f"{base.name}-f{f:g}",
                                   objective=Objective("cost", throughput_min=f * top)))
    return out
