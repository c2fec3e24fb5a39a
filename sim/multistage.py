"""Multi-stage (layer-placement) plans: the steady-state model of one plan, and its evaluator.

:class:`sim.placement.PlacementSpace` scores placements with every stage
provisioned by the model itself (``n`` replicas, the global batch split
evenly, every replica charged at the largest share ``ceil(B / n)``). A Plan
may say otherwise (a user edited it, or a scheduler split unevenly), so this
module applies the same formulas to the plan's own replicas:

* replica r of stage s (layers ``[j, i)``, share ``b_r``, NIC ``nic_r``):
  compute ``c_r = sum of fwd + bwd layer times at b_r`` (the cost model);
  PS traffic ``pull_r = dense + touched_r`` (fp32), ``push_r =
  quantized(dense + touched_r)``, ``touched_r = min(sparse_bytes * b_r,
  sparse table bytes)`` over the stage's layers; boundary traffic ``b_r *
  (act_in + act_out)`` in each NIC direction (``act_in`` = the activation of
  layer j - 1, ``act_out`` that of layer i - 1, 0 at the model's ends);
* its time per iteration ``t_r = c_r`` with ``job.pipeline`` and ``c_r +
  (pull_r + push_r) / nic_r + 2 * latency`` without (0 latency when nothing
  is exchanged), and its NIC time ``max(up_r, down_r) / nic_r`` with ``up_r
  = push_r + boundary``, ``down_r = pull_r + boundary``;
* the stage's period ``d_s = max_r max(t_r, nic time_r)``; the PS shards'
  pooled NIC capacity C (the sum of the plan's shards' NICs) carries
  ``sum_s sum_r max(pull_r, push_r)`` per iteration;
* throughput ``T = min(min_s B / d_s, B * C / ps_bytes)``.

With every replica of a stage at the stage's largest share (``largest_share``,
PlacementSpace's convention) and the type's NIC these are PlacementSpace's
numbers exactly; with the plan's own shares a smaller replica computes and
pulls (sparse rows) for its own samples only, so energy and the PS load can
only be lower. For an even split with ``B % n == 0`` the two coincide.

The evaluator's RunResult: iteration 0 is the pipeline fill (one global batch
through the empty pipeline: pulls, forwards down the stages, backwards up,
pushes; the slowest replica of each stage, no contention; at least one
period), then one iteration per period ``B / T``. Every replica is busy
``c_r`` per iteration; the PS shards are idle (the model charges them idle
power only: aggregation and update work are not modelled). So
``RunResult.cost_usd`` and ``energy_j`` are PlacementSpace's formulas over
the run's elapsed time, which includes the fill; ``extra["placement"]`` holds
the steady-state figures over ``samples / T`` as PlacementSpace reports them.

The steady state needs iterations in flight: each stage holds
:func:`default_in_flight` of them and pulls parameters with a lag of
:func:`staleness_bound` iterations (the pipeline DES, sim/des/pipeline.py, runs
plans so). Both evaluators report them (``extra["in_flight"]``,
``extra["staleness_bound"]``): a placement plan trains with stale parameters
whatever ``job.sync`` says.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hardware_profiles.errors import ConfigError
from sim.costmodel import _ACT_SCALE, layer_times, sparse_touched_bytes
from sim.placement import replica_traffic
from sim.plan import Plan
from sim.problem import Problem
from sim.result import DeviceUsage, ModelSteadyState, RunResult


@dataclass(frozen=True)
class ReplicaCost:
    """What one replica of a stage does per iteration.

    Attributes:
        device: device id.
        batch: its samples per iteration (the plan's share, or the stage's largest).
        first_sample: index of its first sample in the global batch (boundary routing).
        fwd_s, bwd_s: forward and backward compute seconds on ``batch`` samples.
        pull_bytes, push_bytes: PS traffic (parameters fp32, gradients quantized).
        nic_Bps: its NIC bandwidth, each direction.
        sync_s: PS exchange time added to its iteration without ``job.pipeline``.
        period_s: its time per iteration in steady state, ``max(t_r, NIC time)``.
    """

    device: str
    batch: int
    first_sample: int
    fwd_s: float
    bwd_s: float
    pull_bytes: float
    push_bytes: float
    nic_Bps: float
    sync_s: float
    period_s: float

    @property
    def compute_s(self) -> float:
        return self.fwd_s + self.bwd_s


@dataclass(frozen=True)
class StageCost:
    """One stage: its layers, boundary activation sizes and replicas.

    Attributes:
        act_in, act_out: bytes per sample arriving at / leaving the stage (dtype-scaled).
        period_s: the slowest replica's period.
    """

    first_layer: int
    end_layer: int
    act_in: float
    act_out: float
    replicas: tuple[ReplicaCost, ...]
    period_s: float


@dataclass(frozen=True)
class PipelineModel:
    """The steady state of one multi-stage plan.

    Attributes:
        ps_bytes: PS traffic per iteration (the larger direction per replica, summed).
        ps_capacity_Bps: pooled NIC bandwidth of the plan's PS shards.
        throughput_sps: ``min(min_s B / d_s, B * C / ps_bytes)``.
        period_s: ``B / throughput_sps``.
        bottleneck: 'stage i' or 'ps' (PlacementSpace's rule: 'ps' on a tie).
        fill_s: duration of the first iteration (the pipeline fill).
    """

    stages: tuple[StageCost, ...]
    batch: int
    ps_bytes: float
    ps_capacity_Bps: float
    latency_s: float
    pipeline: bool
    throughput_sps: float
    period_s: float
    bottleneck: str
    fill_s: float


def pipeline_model(problem: Problem, plan: Plan, largest_share: bool = False) -> PipelineModel:
    """The steady-state model of ``plan`` (see the module docstring).

    Args:
        largest_share: charge every replica at its stage's largest share and
            its type's NIC at the first device of the type in the inventory
            (PlacementSpace's convention) instead of its own share and NIC.
    """
    job, cluster = problem.job, problem.cluster
    model = job.model
    L, B = len(model.layers), job.global_batch
    scale = _ACT_SCALE.get(job.dtype, 1.0)
    act = [ly.activation_bytes * scale for ly in model.layers]
    lat = cluster.network.latency_s
    type_nic = {d.type.name: d.nic_bw_Bps for d in reversed(cluster.devices)}
    stages: list[StageCost] = []
    ps_bytes = 0.0
    for si, st in enumerate(plan.stages):
        j, i = st.first_layer, st.end_layer
        if not 0 <= j < i <= L:
            raise ConfigError("<plan>", f"stages[{si}].layers", f"bad layer range [{j}, {i})")
        layers = model.layers[j:i]
        d_bytes = sum(0.0 if ly.sparse else ly.param_bytes for ly in layers)
        act_in = act[j - 1] if j > 0 else 0.0
        act_out = act[i - 1] if i < L else 0.0
        b_max = max(r.batch for r in st.replicas)
        reps: list[ReplicaCost] = []
        first = 0
        for r in st.replicas:
            dev = cluster.device(r.device)
            b = b_max if largest_share else r.batch
            nic = type_nic.get(dev.type.name, dev.nic_bw_Bps) if largest_share else dev.nic_bw_Bps
            f, w = layer_times(model, dev.type, job.dtype, b, job.memory_format)
            fwd, bwd = float(f[j:i].sum()), float(w[j:i].sum())
            touched = sum(sparse_touched_bytes(ly, b) for ly in layers)
            pull, push, sync, wire = (float(x) for x in replica_traffic(
                d_bytes, touched, (act_in + act_out) * b, job.quant_bits, nic, lat, job.pipeline))
            reps.append(ReplicaCost(r.device, b, first, fwd, bwd, pull, push, nic, sync,
                                    max(fwd + bwd + sync, wire)))
            ps_bytes += max(pull, push)
            first += r.batch
        stages.append(StageCost(j, i, act_in, act_out, tuple(reps), max(rc.period_s for rc in reps)))
    shards = [cluster.device(s) for s in plan.ps_shards]
    cap = float(sum(s.nic_bw_Bps for s in shards))
    with np.errstate(divide="ignore"):
        t_stage = [B / s.period_s if s.period_s > 0 else np.inf for s in stages]
    t_ps = cap * B / ps_bytes if ps_bytes > 0 else np.inf
    stage_min = float(min(t_stage))
    T = float(min(stage_min, t_ps))
    bottleneck = "ps" if t_ps <= stage_min else f"stage {int(np.argmin(t_stage))}"
    period = B / T if np.isfinite(T) and T > 0 else 0.0
    m = PipelineModel(tuple(stages), B, ps_bytes, cap, lat, job.pipeline, T, period, bottleneck, 0.0)
    return _with_fill(m)


def default_in_flight(m: PipelineModel) -> list[int]:
    """Iterations each stage holds (``w_s``): enough that an iteration's round
    trip below a stage never stalls it at the steady period ``d``.

    The last stage needs one. Stage s needs ``w_{s+1}`` plus the periods
    spanned by the boundary transfers both ways (uncontended, with latency) and
    the next stage's compute and sync, plus two periods of slack for queueing
    on the links.
    """
    S, d, lat = len(m.stages), m.period_s, m.latency_s
    w = [1] * S
    for s in range(S - 2, -1, -1):
        a, b = m.stages[s], m.stages[s + 1]
        x = max(max(r.batch * a.act_out / r.nic_Bps for r in a.replicas),
                max(r.batch * b.act_in / r.nic_Bps for r in b.replicas))
        work = max(r.compute_s + r.sync_s for r in b.replicas)
        span = 2 * (x + lat) + work
        w[s] = w[s + 1] + (math.ceil(span / d) if d > 0 else 1) + 2
    return w


def staleness_bound(m: PipelineModel, in_flight: Sequence[int]) -> list[int]:
    """Per stage: the pull for iteration k waits for the update of k minus this.

    Iteration k - w_s ends its backward on the stage just before forward k
    starts; the push of an older iteration, its update and the pull must fit
    in the periods in between: ``max(w_s, w_{s-1})`` plus the periods a push
    and a pull take (uncontended, with latency), plus twice the periods the
    PS pool needs for an iteration's traffic (both may queue there), plus one
    of slack.
    """
    d, lat = m.period_s, m.latency_s
    # periods the shared PS pool needs for one iteration's traffic (1 when it is the
    # bottleneck): a push and a pull may each wait that long behind the others'
    pool = math.ceil(m.ps_bytes / m.ps_capacity_Bps / d) if d > 0 and m.ps_capacity_Bps > 0 else 1
    out = []
    for s, st in enumerate(m.stages):
        x = max((r.pull_bytes + r.push_bytes) / r.nic_Bps for r in st.replicas) + 2 * lat
        # the upstream stage sends the activations of iteration k + 1 about w_{s-1}
        # iterations after this stage's backward of k + 1 - w_{s-1}: a pull issued
        # earlier than that is not queued behind them
        w = max(in_flight[s], in_flight[s - 1] if s > 0 else 0)
        out.append(w + (math.ceil(x / d) if d > 0 else 1) + 2 * pool + 1)
    return out


def _with_fill(m: PipelineModel) -> PipelineModel:
    """The first iteration through the empty pipeline, without contention.

    Per stage the slowest replica: with ``pipeline`` every stage's first pull
    starts at 0 and overlaps the stages before it; without, the pull precedes
    the forward and the push follows the backward. A boundary transfer takes
    the larger of the two sides' bytes over their NICs, plus the latency.
    """
    lat = m.latency_s

    def xfer(a: StageCost, b: StageCost) -> float:
        t = max(max(r.batch * a.act_out / r.nic_Bps for r in a.replicas),
                max(r.batch * b.act_in / r.nic_Bps for r in b.replicas))
        return t + lat if t > 0 else 0.0

    def one_way(nbytes: float, r: ReplicaCost) -> float:
        return nbytes / r.nic_Bps + lat if nbytes > 0 else 0.0

    t = 0.0
    for s, st in enumerate(m.stages):
        if s > 0:
            t += xfer(m.stages[s - 1], st)
        pull = max(one_way(r.pull_bytes, r) for r in st.replicas)
        t = max(t, pull) if m.pipeline else t + pull
        t += max(r.fwd_s for r in st.replicas)
    end = 0.0
    for s in range(len(m.stages) - 1, -1, -1):
        st = m.stages[s]
        if s < len(m.stages) - 1:
            t += xfer(st, m.stages[s + 1])
        t += max(r.bwd_s for r in st.replicas)
        end = max(end, t + max(one_way(r.push_bytes, r) for r in st.replicas))
    fill = max(end, m.period_s)
    return PipelineModel(m.stages, m.batch, m.ps_bytes, m.ps_capacity_Bps, m.latency_s, m.pipeline,
                         m.throughput_sps, m.period_s, m.bottleneck, fill)


def steady_figures(problem: Problem, plan: Plan, m: PipelineModel) -> dict[str, object]:
    """PlacementSpace's headline figures of ``m``: throughput, price per hour, and the
    cost and energy of the job's samples at the steady rate (no fill)."""
    cl = problem.cluster
    T = m.throughput_sps
    samples = float(problem.job.iterations * m.batch)
    elapsed = samples / T if T > 0 else float("inf")
    rate = sum(cl.device(r.device).type.price_per_hour for st in m.stages for r in st.replicas)
    rate += sum(cl.device(s).type.price_per_hour for s in plan.ps_shards)
    watts = 0.0
    for st in m.stages:
        for r in st.replicas:
            p = cl.device(r.device).type.power_w
            util = min(1.0, T * r.compute_s / m.batch)
            watts += p.idle + (p.active - p.idle) * util
    watts += sum(cl.device(s).type.power_w.idle for s in plan.ps_shards)
    return {"throughput_sps": T, "rate_usd_h": rate, "cost_usd": rate * elapsed / 3600.0,
            "energy_j": watts * elapsed, "bottleneck": m.bottleneck, "period_s": m.period_s,
            "fill_s": m.fill_s}


def unsupported_note(problem: Problem) -> str:
    """What the multi-stage evaluators leave out of ``problem``, as one line ('' if nothing)."""
    job = problem.job
    out = []
    if job.sync != "bsp":
        out.append(f"sync {job.sync!r} (stages sync with the PS once per iteration)")
    if job.quant_adaptive is not None:
        out.append(f"adaptive quantization (fixed at the start width, {job.quant_bits} bits)")
    if job.target_loss is not None:
        out.append("target_loss (runs job.iterations)")
    if problem.dynamics:
        out.append("dynamics")
    if not out:
        return ""
    return "multi-stage evaluators ignore " + ", ".join(out)


def devices_of(problem: Problem, plan: Plan, compute_s: dict[str, float], comm_s: dict[str, float],
               elapsed_s: float, ps_busy_s: dict[str, float] | None = None) -> list[DeviceUsage]:
    """DeviceUsage of every replica (plan order) and PS shard."""
    cl = problem.cluster
    out = []
    for r in plan.replicas:
        t = cl.device(r.device).type
        c, m = compute_s.get(r.device, 0.0), comm_s.get(r.device, 0.0)
        out.append(DeviceUsage(r.device, "worker", t.price_per_hour, t.power_w.idle, t.power_w.active,
                               busy_s=c, compute_s=c, comm_s=m, wait_s=max(elapsed_s - c - m, 0.0)))
    for s in plan.ps_shards:
        t = cl.device(s).type
        out.append(DeviceUsage(s, "ps", t.price_per_hour, t.power_w.idle, t.power_w.active,
                               busy_s=(ps_busy_s or {}).get(s, 0.0)))
    return out


def evaluate_analytic(problem: Problem, plan: Plan) -> RunResult:
    """Evaluate a multi-stage plan with the steady-state model; RunResult as every evaluator.

    Iteration 0 ends at the pipeline fill, every later one a period ``B / T``
    after the previous; throughput and iteration times leave out the fill (a
    1-iteration run, the fill alone, reports the model's steady state). ``extra["placement"]`` carries the steady-state
    throughput, price, cost, energy and bottleneck (PlacementSpace's figures
    for the plan's replicas), ``extra["in_flight"]`` and
    ``extra["staleness_bound"]`` the pipeline's depth and staleness per stage,
    ``extra["note"]`` what is not modelled.
    """
    job = problem.job
    m = pipeline_model(problem, plan)
    n = job.iterations
    if not (m.throughput_sps > 0 and np.isfinite(m.throughput_sps)):
        raise ConfigError("<plan>", "stages", "the plan moves no work: every stage and the PS take no time")
    ends = [m.fill_s + k * m.period_s for k in range(n)]
    E = ends[-1]
    compute = {r.device: r.compute_s * n for st in m.stages for r in st.replicas}
    comm = {r.device: r.sync_s * n for st in m.stages for r in st.replicas}
    w = default_in_flight(m)
    extra: dict[str, object] = {"placement": steady_figures(problem, plan, m), "in_flight": w,
                                "staleness_bound": staleness_bound(m, w)}
    note = unsupported_note(problem)
    if note:
        extra["note"] = note
    # one iteration is the fill alone: the steady state is the model's, not the run's
    model = None if n > 1 else ModelSteadyState(
        m.throughput_sps, m.period_s, 2, f"{plan.scheduler}: a 1-iteration run is the pipeline's fill "
        "alone: throughput is the steady-state model's")
    return RunResult(
        name=problem.name, evaluator="analytic", scheduler=plan.scheduler, seed=problem.seed,
        iter_end_s=ends, iter_samples=[job.global_batch] * n,
        devices=devices_of(problem, plan, compute, comm, E),
        warmup=min(max(job.warmup_iterations, 1), max(n - 1, 0)), model_steady=model, extra=extra,
    )
