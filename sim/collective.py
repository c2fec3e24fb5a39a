"""Collective data parallelism: bucketed all-reduce among the workers (``job.sync: allreduce``).

Every worker holds the whole model, computes the gradient of its share and, once the
gradients are reduced, applies the update itself: there are no PS shards. Gradients
travel in buckets, as PyTorch's DistributedDataParallel sends them. The equations
below are those of docs/modelling/allreduce.md.

**Buckets.** The layers are taken in reverse order (the order backward produces their
gradients) and packed into buckets: a bucket closes once it holds ``job.bucket_mb``
MiB of fp32 gradient or more, as DDP's assignment closes one (with ``bucket_cap_mb``
given, every bucket, the first too, has that cap), so a layer larger than a bucket is
a bucket of its own. A sparse table's gradient is all-reduced
dense (DDP's default): the whole table, not its touched rows. On the wire a bucket is
its fp32 bytes quantized at ``job.quantization`` bits
(:func:`sim.costmodel.quantized_bytes`): each worker packs the bucket after the
backward that completes it and unpacks the reduced bucket before its update.

**One iteration** (``w`` a worker, ``k`` a bucket in reverse layer order, ``K`` of them)::

    F_w     = start_w + fwd_w
    R_wk    = F_w + seg_w0 + ... + seg_wk       pipeline: as backward reaches bucket k
            = F_w + bwd_w                       no pipeline: after the whole backward
    S_k     = max(max_w R_wk, E_(k-1))          the slowest member gates each bucket; one
    E_k     = S_k + T(B_k, members)             communicator: a bucket at a time, in order
    end_w   = max(F_w + bwd_w, E_(K-1)) + unpack_w + opt_w
    start_w = end_w of the iteration before (0 for the first)

``seg_wk`` is the backward of the layers bucket k completes (those below the previous
bucket's lowest layer, down to its own lowest) plus its pack; backward below the last
bucket's lowest layer (parameter-free layers) runs after it. ``opt_w`` is
:func:`sim.costmodel.optimizer_step_s` of ``job.optimizer``. A BSP iteration ends at
the last worker's end. Uneven shares cost nothing extra: each worker weights its
gradient by its share of the samples before the sum.

**One all-reduce** of B bytes (on the wire) over n workers, alpha-beta: a hop's alpha
is its one-way latency, its bandwidth its link's per direction::

    ring          T = 2 (n - 1) max_h (alpha_h + (B / n) / bw_h)
    tree          T = 2 ceil(log2 n) alpha + 2 B / bw     alpha: the largest latency,
                                                          bw: the slowest link
    hierarchical  T = max_i reduce_i + ring(B, node leaders) + max_i bcast_i
                  reduce_i = bcast_i = (k_i - 1)(alpha_i + (B / k_i) / bw_i)
                                       + alpha_i + (k_i - 1)(B / k_i) / bw_i

The ring visits the workers node by node (``cluster.nodes`` order), then the workers in
no node, in plan order. A hop inside a node runs on its intra-node link
(``intra_gbps``, ``intra_latency_us``); a hop between two nodes on their NICs (the
slower of the two, the larger latency); a hop to or from a worker in no node on that
worker's own link (``cluster.network``: ``bandwidth_gbps`` or the profile's NIC,
``overrides``; ``latency_us``). Every hop of a step carries B/n at the same time on
links of its own (ordered so, a ring crosses each NIC once each way), so a step takes
as long as its slowest hop. ``hierarchical`` reduces inside each node of k workers
(ring reduce-scatter, then the k - 1 reduced pieces gathered at its leader), runs the
ring over the nodes' leaders, and broadcasts inside (scatter, ring all-gather); a
worker in no node is a node of one (k = 1: nothing inside). One worker: T = 0.

Both evaluators use these costs: :func:`sim.collective_analytic.evaluate` (the closed
form, vectorised over workers) and :func:`sim.des.collective.simulate` (the DES).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hardware_profiles import DeviceProfile
from sim.cluster import Cluster, Node
from sim.costmodel import (
    dequantize_time_s,
    layer_times,
    optimizer_step_s,
    quantize_time_s,
    quantized_bytes,
)
from sim.plan import Plan
from sim.problem import Problem

ALGORITHMS = ("ring", "tree", "hierarchical")


@dataclass(frozen=True)
class Bucket:
    """Gradients all-reduced together.

    Attributes:
        layers: the layers whose gradients it holds, in reverse (backward) order.
        fp32_bytes: their gradients' fp32 bytes.
        wire_bytes: the bytes an all-reduce of it moves (quantized).
    """

    layers: tuple[int, ...]
    fp32_bytes: float
    wire_bytes: float

    @property
    def lowest(self) -> int:
        """The layer whose backward completes the bucket."""
        return min(self.layers)


def make_buckets(param_bytes: Sequence[float], bucket_bytes: float, bits: int) -> tuple[Bucket, ...]:
    """The buckets of layers with ``param_bytes`` (layer order), reverse order, each closed
    once it holds ``bucket_bytes`` or more; layers without parameters belong to none."""
    if not bucket_bytes > 0:
        raise ValueError(f"bucket_bytes must be > 0, got {bucket_bytes}")
    out: list[Bucket] = []
    cur: list[int] = []
    size = 0.0
    for j in range(len(param_bytes) - 1, -1, -1):
        if param_bytes[j] <= 0:
            continue
        cur.append(j)
        size += float(param_bytes[j])
        if size >= bucket_bytes:
            out.append(Bucket(tuple(cur), size, quantized_bytes(size, bits)))
            cur, size = [], 0.0
    if cur:
        out.append(Bucket(tuple(cur), size, quantized_bytes(size, bits)))
    return tuple(out)


@dataclass(frozen=True)
class Hop:
    """A link between two workers of a collective: bytes/s per direction, one-way latency."""

    bw_Bps: float
    latency_s: float


class Topology:
    """How the plan's workers reach each other (see the module docstring).

    Args:
        cluster: the cluster (its nodes, its flat links, its network latency).
        workers: the plan's device ids, plan order; a member is an index into them.
    """

    def __init__(self, cluster: Cluster, workers: Sequence[str]) -> None:
        self.workers = tuple(workers)
        node_of: dict[str, int] = {d: i for i, n in enumerate(cluster.nodes) for d in n.devices}
        self.nodes: tuple[Node, ...] = cluster.nodes
        # a worker's group: its node's index, or a group of its own after the nodes
        self.group = [node_of.get(d, len(cluster.nodes) + w) for w, d in enumerate(self.workers)]
        self.flat_bw = [cluster.device(d).nic_bw_Bps for d in self.workers]
        self.flat_latency_s = cluster.network.latency_s

    def _node(self, w: int) -> Node | None:
        g = self.group[w]
        return self.nodes[g] if g < len(self.nodes) else None

    def out_link(self, w: int) -> Hop:
        """Worker w's link to other nodes: its node's NIC, or its own flat link."""
        n = self._node(w)
        return Hop(n.nic_bw_Bps, n.nic_latency_s) if n is not None else Hop(self.flat_bw[w], self.flat_latency_s)

    def hop(self, a: int, b: int) -> Hop:
        """The link a message from member a to member b takes."""
        n = self._node(a)
        if n is not None and self.group[a] == self.group[b]:
            return Hop(n.intra_bw_Bps, n.intra_latency_s)
        x, y = self.out_link(a), self.out_link(b)
        return Hop(min(x.bw_Bps, y.bw_Bps), max(x.latency_s, y.latency_s))

    def groups(self, members: Sequence[int]) -> list[list[int]]:
        """``members`` by group (node), in ring order: nodes in config order, then the
        workers in no node."""
        by: dict[int, list[int]] = {}
        for w in sorted(members, key=lambda w: (self.group[w], w)):
            by.setdefault(self.group[w], []).append(w)
        return list(by.values())

    def ring(self, members: Sequence[int]) -> list[int]:
        return [w for g in self.groups(members) for w in g]

    def ring_hops(self, order: Sequence[int]) -> list[Hop]:
        n = len(order)
        return [self.hop(order[i], order[(i + 1) % n]) for i in range(n)] if n > 1 else []

    def allreduce_s(self, algorithm: str, nbytes: float, members: Sequence[int]) -> float:
        """Seconds of one all-reduce of ``nbytes`` over ``members`` by ``algorithm``."""
        n = len(members)
        if n <= 1 or nbytes <= 0:
            return 0.0
        if algorithm == "ring":
            return ring_s(nbytes, self.ring_hops(self.ring(members)))
        if algorithm == "tree":
            hops = self.ring_hops(self.ring(members))
            alpha = max(h.latency_s for h in hops)
            bw = min(h.bw_Bps for h in hops)
            return 2 * math.ceil(math.log2(n)) * alpha + 2 * nbytes / bw
        if algorithm == "hierarchical":
            groups = self.groups(members)
            inside = max(_intra_reduce_s(nbytes, len(g), self.hop(g[0], g[1]) if len(g) > 1 else None)
                         for g in groups)
            leaders = [g[0] for g in groups]
            return 2 * inside + ring_s(nbytes, self.ring_hops(leaders))
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")


def ring_s(nbytes: float, hops: Sequence[Hop]) -> float:
    """A ring all-reduce of ``nbytes`` over ``len(hops)`` members: ``2 (n - 1)`` steps, each
    as long as its slowest hop carrying ``nbytes / n``; 0 for fewer than two members."""
    n = len(hops)
    if n <= 1:
        return 0.0
    chunk = nbytes / n
    return 2 * (n - 1) * max(h.latency_s + chunk / h.bw_Bps for h in hops)


def _intra_reduce_s(nbytes: float, k: int, hop: Hop | None) -> float:
    """Reducing ``nbytes`` inside a node of ``k`` workers to its leader (a ring
    reduce-scatter, then the k - 1 reduced pieces gathered at the leader); the broadcast
    back costs the same. 0 for a node of one."""
    if k <= 1 or hop is None:
        return 0.0
    piece = nbytes / k
    return (k - 1) * (hop.latency_s + piece / hop.bw_Bps) + hop.latency_s + (k - 1) * piece / hop.bw_Bps


@dataclass(frozen=True)
class CollectiveCosts:
    """Everything the evaluators need of an all-reduce plan, per worker (plan order).

    Attributes:
        workers: device ids; ``batch`` their shares.
        fwd_s: (N,) forward seconds of one iteration.
        bwd_s: (N,) backward seconds, the packs of every bucket included.
        ready_s: (N, K) seconds after its forward at which each bucket is ready on each
            worker (pipeline: as its backward reaches it; else the whole backward).
        opt_s: (N,) unpack of every bucket plus the optimizer step.
        buckets: the K buckets, reverse layer order.
        topology: the links between the workers.
        algorithm: 'ring', 'tree' or 'hierarchical'.
    """

    workers: tuple[str, ...]
    batch: np.ndarray
    fwd_s: np.ndarray
    bwd_s: np.ndarray
    ready_s: np.ndarray
    opt_s: np.ndarray
    buckets: tuple[Bucket, ...]
    topology: Topology = field(compare=False)
    algorithm: str = "ring"
    _memo: dict[tuple[int, ...], np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    @property
    def n_buckets(self) -> int:
        return len(self.buckets)

    def comm_s(self, members: Sequence[int]) -> np.ndarray:
        """(K,) seconds of each bucket's all-reduce over ``members`` (memoised, read-only)."""
        key = tuple(sorted(members))
        got = self._memo.get(key)
        if got is None:
            got = np.array([self.topology.allreduce_s(self.algorithm, b.wire_bytes, key) for b in self.buckets])
            got.flags.writeable = False
            self._memo[key] = got
        return got


def collective_costs(problem: Problem, plan: Plan, stretch_hosts: bool = True) -> CollectiveCosts:
    """The :class:`CollectiveCosts` of a data-parallel all-reduce plan: with
    ``stretch_hosts``, hosted workers' compute stretched by their share of their host's
    cores (:meth:`sim.cluster.Cluster.host_stretch`, the analytic evaluator's view); without, each worker's
    time alone, for the DES, which shares the cores itself (:class:`sim.des.hosts.HostCPU`)."""
    job, model, cl = problem.job, problem.job.model, problem.cluster
    reps = plan.replicas
    buckets = make_buckets([ly.param_bytes for ly in model.layers], job.bucket_bytes, job.quant_bits)
    rows: dict[tuple[str, int], tuple[float, float, np.ndarray, float]] = {}
    for r in reps:  # once per distinct (device type, share): cheap for thousands of workers
        dev = cl.device(r.device).type
        if (dev.name, r.batch) not in rows:
            rows[(dev.name, r.batch)] = _worker_row(problem, dev, r.batch, buckets)
    per = [rows[(cl.device(r.device).type.name, r.batch)] for r in reps]
    k = len(buckets)
    stretch = (np.array(cl.host_stretch([r.device for r in reps]), dtype=float) if stretch_hosts
               else np.ones(len(reps)))
    fwd = np.array([x[0] for x in per], dtype=float) * stretch
    bwd = np.array([x[1] for x in per], dtype=float) * stretch
    ready = np.array([x[2] for x in per], dtype=float).reshape(len(reps), k) * stretch[:, None]
    opt = np.array([x[3] for x in per], dtype=float) * stretch
    batch = np.array([r.batch for r in reps], dtype=float)
    for a in (batch, fwd, bwd, ready, opt):
        a.flags.writeable = False
    return CollectiveCosts(tuple(r.device for r in reps), batch, fwd, bwd, ready, opt, buckets,
                           Topology(cl, [r.device for r in reps]), job.allreduce)


def _worker_row(problem: Problem, dev: DeviceProfile, batch: int, buckets: Sequence[Bucket]
                ) -> tuple[float, float, np.ndarray, float]:
    """One worker's (forward, backward with packs, bucket ready times after its forward,
    unpacks + optimizer step); an idle worker (share 0) computes nothing, its zero
    gradients ready at once, and still applies the update."""
    job = problem.job
    bits = job.quant_bits
    opt = optimizer_step_s(job.model, dev, job.dtype, job.optimizer)
    opt += sum(dequantize_time_s(bk.fp32_bytes, bits, dev) for bk in buckets)
    if batch <= 0:
        return 0.0, 0.0, np.zeros(len(buckets)), opt
    f, b = layer_times(job.model, dev, job.dtype, batch, job.memory_format)
    packs = np.array([quantize_time_s(bk.fp32_bytes, bits, dev) for bk in buckets])
    bwd = float(b.sum() + packs.sum())
    if job.pipeline:
        done_at = np.cumsum(b[::-1])[::-1]  # done_at[j]: the backward of layers L-1 .. j
        ready = np.array([done_at[bk.lowest] for bk in buckets]) + np.cumsum(packs)
    else:
        ready = np.full(len(buckets), bwd)
    return float(f.sum()), bwd, ready, float(opt)


def iteration(c: CollectiveCosts, start: np.ndarray, comm: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One BSP iteration from each worker's ``start``: (each worker's end, its backward's
    end, the buckets' all-reduce starts S and ends E), with ``comm`` each bucket's
    all-reduce seconds."""
    F = start + c.fwd_s
    back = F + c.bwd_s
    K = c.n_buckets
    S, E = np.empty(K), np.empty(K)
    prev = -np.inf
    for k in range(K):
        S[k] = max(float((F + c.ready_s[:, k]).max()), prev)
        E[k] = prev = S[k] + comm[k]
    last = E[-1] if K else float(back.max())  # no gradients: a barrier all the same
    return np.maximum(back, last) + c.opt_s, back, S, E


def run_notes(c: CollectiveCosts) -> dict[str, object]:
    """What both evaluators say of an all-reduce run (``RunResult.extra``): the
    algorithm and buckets (``allreduce``), and a note where one worker communicates
    nothing."""
    out: dict[str, object] = {"allreduce": {
        "algorithm": c.algorithm, "buckets": c.n_buckets,
        "bucket_wire_bytes": [b.wire_bytes for b in c.buckets],
        "comm_s_per_iteration": float(c.comm_s(range(len(c.workers))).sum())}}
    if len(c.workers) == 1:
        out["notes"] = [f"all-reduce over a single worker ({c.workers[0]}): nothing is communicated"]
    return out
