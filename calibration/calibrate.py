"""Fit a device's efficiency curves to its raw measurements (``hetsim calibrate``).

The cost model (``sim/costmodel.py``) prices one pass of a layer as

    t = launch_overhead_s * kernels + call_overhead[phase](key)  (+ row_cost * rows, lookups)
      (+ cold_calls[op](bytes the cold window's passes before it moved), where raw.cold is)
      + max(flops / (peak * eff[phase](key, size)), bytes / (mem_bw * mem_eff[phase](key, bytes)))

(the roofline plus the corrections ``call_overhead``, ``row_cost`` and ``cold_calls``
of :mod:`sim.corrections`, which this fit writes under the profile's ``corrections``
with ``glue`` and ``skinny_gemm``)

Calibration takes every measured layer pass of a profile's ``raw`` data (the
GEMM grid, the single-layer benchmarks and the zoo models' per-layer times,
see :mod:`calibration.profiler`) as a point ``(op, phase, flops, bytes,
kernels, t)`` with the work computed by :func:`sim.costmodel.layer_work`, and
fits, per phase:

* ``t`` is the layer's own time (its own brackets, a run's ``own``) where the
  profile records it, else the time charged to it. The charged time adds the
  glue around the layer (work of no layer: the measurement's and the
  framework's per-call dispatch, residual adds, concatenations, gradient
  accumulation, the loss on the last layer), which the layer record does not
  describe and which differs between layers of one record (a ReLU after a
  residual add against one after a BatchNorm). With own times the glue is
  fitted apart, per layer pass: ``corrections.glue`` (:func:`fit_glue`), which the
  cost model adds to every layer it prices from the curves, so that an
  iteration still comes out whole;

* compute efficiency curves, per op class and per compute kind
  (``conv/spatial``, ``conv/pointwise``, and ``gemm/rows1`` ... ``gemm/rows4`` for a
  skinny GEMM: :func:`sim.costmodel.compute_kind`),
  from the passes with FLOPs: each gives ``eff = flops / (peak * (t - launch
  * kernels))``. The curve is over FLOPs per call, or for convolutions over
  FLOPs per call or intensity (FLOPs per byte), whichever predicts a model left
  out of the curve's fit better; the same choice for GEMMs (a GEMM with few
  rows, e.g. a classifier at batch 1-4, runs far below the efficiency of one
  of equal FLOPs and many rows, and its intensity says so). The efficiency is
  of the time less a fixed per-call overhead of the op class
  (``corrections.call_overhead``, :func:`_compute_overhead`; not of a bare kernel's,
  :attr:`Point.call`): a 16 KFLOP, 1-output Linear takes 10.6-13 us forward
  here, which a curve alone reads as a low efficiency at its intensity, and
  so priced mlp's 16-row GEMMs 10-44% high. Every pass with FLOPs is a point
  of its compute curve; those whose bytes at ``mem_bw_Bps`` take at least half
  their time (memory-bound) fit the op class's bandwidth curve as well
  (:func:`_compute_points`);
* bandwidth efficiency curves over bytes per call, per op class and per layer
  kind (:func:`hardware_profiles.schema.mem_key`, 4 points or more), from the
  passes without FLOPs (activations, norms, pooling, embedding lookups and
  their gradients): ``mem_eff = bytes / (mem_bw * (t - launch * kernels -
  c - r * rows))``, where ``c`` is a fixed per-call overhead of the curve's
  passes (``corrections.call_overhead``; framework dispatch,
  which a curve over bytes, clamped below its first knot, cannot represent)
  and, for lookups (sparse layers), ``r`` a cost per row looked up
  (``corrections.row_cost``; reading, sorting or scatter-adding an
  index costs per row, not per byte: a backward's time follows the rows looked
  up at one table size and the table's bytes at one batch, which one curve over
  their sum cannot follow), chosen among fractions of the passes' 10th-percentile
  time (for ``r``: of their smallest time per row looked up) as the pair that
  predicts a source left out of the curve's fit best (:func:`_bandwidth_fit`).

Where ``raw`` has the cold-call benchmark (``raw["cold"]``, :func:`cold_curves`),
every measured pass is fitted less its cold-call seconds (at least
:data:`COLD_FLOOR` of its time kept), for each window of :data:`COLD_WINDOWS`
passes before it, at the launch overhead chosen without them; the window whose
profile prices the passes as measured with the smallest median error is kept
(``corrections.cold_calls``) if it beats the fit without them.

A curve is piecewise linear in log10(size) (the schema's form) with knots
every half decade over the data; its knot values minimise the squared error
of log(eff) (so over- and under-prediction by one factor cost the same), with
a small penalty on second differences that keeps knots without data in line,
and two reweighting rounds that discount outliers. The launch overhead is
chosen from multiples of the measured dispatch time by the smallest median
relative error. ``peak_flops`` and ``mem_bw_Bps`` stay as measured (best
effective rate, largest copy): the curves are relative to them.

A model left out of the fit (``exclude``) contributes no point: that is how
``bench/calibration_accuracy.py`` predicts a model it never saw.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from scipy.optimize import nnls

from calibration import gpu_fit, model_variants
from hardware_profiles.corrections import ColdCallsParams, ColdCurve
from hardware_profiles.schema import (
    BandwidthCurve,
    DeviceProfile,
    EfficiencyCurve,
    IntensityCurve,
    LayerTable,
    mem_key,
)
from sim.corrections import ColdCalls, Correction, PassContext, corrections_of
from sim.corrections.skinny_gemm import RATE_KINDS, SkinnyGemm
from sim.costmodel import (
    compute_kind,
    glue_time_s,
    layer_times,
    layer_work,
    looked_up_rows,
    pass_bytes,
    pass_time_s,
    streamed_window,
    table_key,
    window_sums,
)
from sim.workload import Model, model_from_dict

__all__ = [
    "CalibrationResult",
    "Point",
    "calibrate",
    "cold_curves",
    "drift_of",
    "fit",
    "fit_curve",
    "format_residuals",
    "layer_tables",
    "points_from_raw",
    "predict_layers",
    "spread_of",
]

PHASES = ("fwd", "bwd")
#: Bounds of fitted efficiencies (the schema's ranges).
EFF_RANGE = (1e-4, 1.5)
MEM_EFF_RANGE = (1e-4, 100.0)
#: Knot spacing of an automatic curve, decades of size; at most MAX_KNOTS knots.
KNOT_STEP = 0.5
MAX_KNOTS = 9
#: Fewest points for a bandwidth curve of one layer kind (else the op class's applies).
MIN_KIND_POINTS = 4
#: A pass whose bytes at mem_bw_Bps take at least this share of its time is memory-bound.
MEMORY_BOUND_SHARE = 0.5
#: What a compute class's efficiency may be a function of; cross-validation
#: across models picks the variable (FLOPs of a call, or intensity). A
#: convolution's algorithm follows its shape (Winograd for a 3x3, a GEMM for a
#: 1x1 of equal FLOPs), which intensity tells apart; a GEMM of few rows runs
#: far below the rate of one of equal FLOPs and many rows, and its intensity
#: tells that too. Other classes: FLOPs only. A compute kind's own entry where it
#: has one: a skinny GEMM's (RATE_KINDS, 1-4 rows) is over FLOPs only, since its
#: intensity is about m / 2 FLOP per byte at every size (a curve over it a curve
#: over noise).
CURVE_VARIABLES = {"conv": ("flops", "intensity"), "gemm": ("flops", "intensity"),
                   **{k: ("flops",) for k in RATE_KINDS}}
#: Candidate fixed per-call overheads of a bandwidth curve's passes, fractions of
#: the 10th percentile of their times (less launch overheads); see _bandwidth_fit.
OVERHEAD_FRACTIONS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: Candidate costs per row looked up (sparse layers), fractions of the smallest time
#: per row of their passes (less launch overheads); see _bandwidth_fit.
ROW_FRACTIONS = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
#: Candidate fixed per-call overheads of a compute class, multiples of the measured
#: dispatch time (a layer's call is a handful of dispatches: its kernels, a bias,
#: autograd's nodes); see _compute_overhead.
COMPUTE_OVERHEAD_DISPATCHES = (0, 2, 4, 8, 16, 32)
#: A larger compute call overhead is kept only if its left-out score beats the
#: smallest one's by more than this share (scores a hair apart are noise).
OVERHEAD_TIE = 0.02
#: Candidate launch overheads, multiples of the measured dispatch time.
LAUNCH_MULTIPLES = (0.5, 1.0, 1.5, 2.0, 3.0)
#: Candidate cold windows: how many passes before a pass count for its cold-call
#: seconds (``corrections.cold_calls.window``); the fit keeps the one with the smallest median error.
COLD_WINDOWS = (1, 2, 3, 5, 8)
#: A measured pass keeps at least this share of its time when its cold-call seconds
#: are taken off for the curves' fit (the benchmark's small call is not every layer).
COLD_FLOOR = 0.3
#: The cold-call benchmark's calls stand for these op classes (``raw["cold"]`` names
#: the call of each): a compute class's call is a Linear's.
COLD_OPS = {"elementwise": "relu", "gemm": "linear", "conv": "linear", "attention": "linear",
            "embedding": "embedding"}


@dataclass(frozen=True)
class Point:
    """One measured layer pass: its work and its median time."""

    op: str
    phase: str
    flops: float
    nbytes: float
    kernels: int
    t_s: float
    model: str
    layer: str
    batch: int
    kind: str = ""  # schema.mem_key of the layer: op, forward kernels, parameters or not
    ckind: str = ""  # OP/KIND of sim.costmodel.compute_kind, '' when it has none
    rows: float = 0.0  # rows a sparse layer looks up (sim.costmodel.looked_up_rows), else 0
    call: bool = True  # a layer's call (pays a compute class's call overhead); False: a bare kernel
    # bytes the 1, 2, ... max(COLD_WINDOWS) passes before this one moved (execution order)
    before: tuple[float, ...] = ()


def _zoo_model(name: str) -> Model:
    return model_variants.model(name)


def _model_points(model: Model, source: str, runs: Iterable[dict[str, Any]], dtype: str,
                  dense_sparse_grad: bool, weight_grad_only: bool = False) -> list[Point]:
    index = {ly.name: i for i, ly in enumerate(model.layers)}
    out = []
    for run in runs:
        b = int(run["batch"])
        own = run.get("own") or {}
        fwd, bwd = pass_bytes(model, b, dtype, dense_sparse_grad, weight_grad_only)
        sums = [window_sums(fwd, bwd, w) for w in range(1, max(COLD_WINDOWS) + 1)]
        for name, vals in run["layers"].items():
            i = index.get(name)
            if i is None:
                continue
            ly = model.layers[i]
            # a layer's own brackets where measured (no glue charged to it), else its charged time
            times = own.get(name, vals)
            for phase, t in zip(PHASES, times[:2], strict=True):
                flops, kernels, nbytes = layer_work(ly, phase, b, dtype, model.input_bytes_of(i),
                                                    dense_sparse_grad, weight_grad_only)
                if flops == 0 and nbytes == 0:
                    continue
                ck = compute_kind(ly, model.input_bytes_of(i), b)
                side = 0 if phase == "fwd" else 1
                out.append(Point(ly.op, phase, flops, nbytes, kernels, float(t), source, name, b,
                                 mem_key(ly.op, ly.kernels, ly.param_bytes > 0,
                                         ly.activation_bytes < model.input_bytes_of(i), ly.inplace),
                                 f"{ly.op}/{ck}" if ck else "", looked_up_rows(ly, b),
                                 before=tuple(float(x[side][i]) for x in sums)))
    return out


def points_from_raw(raw: dict[str, Any], exclude: Sequence[str] = (), dtype: str = "fp32",
                    micro: bool = True, dense_sparse_grad: bool = True,
                    weight_grad_only: bool = False) -> list[Point]:
    """Every measured layer pass in ``raw``, leaving out the zoo models in ``exclude``.

    ``dense_sparse_grad``: the profile's flag of that name (bytes of an
    embedding's backward), ``weight_grad_only`` its ``weight_grad_only_bwd`` (bytes
    of a backward computing no input gradient), as :func:`sim.costmodel.layer_work`
    takes them.
    """
    pts: list[Point] = []
    if micro:
        for entry in raw.get("micro", []):
            model = model_from_dict(entry["model"], source=f"micro:{entry['name']}")
            pts += _model_points(model, f"micro:{entry['name']}", entry["runs"], dtype,
                                 dense_sparse_grad, weight_grad_only)
        # the GEMM grid: forward passes of one kernel, bytes = both operands and the result
        for row in raw.get("gemm", []):
            if row["dtype"] != dtype:
                continue
            m, n, k = row["m"], row["n"], row["k"]
            # a bare torch.mm, not a layer's call: no module, bias or autograd to pay for
            nb = 4.0 * (m * k + k * n + m * n)  # timed back to back: itself before itself
            pts.append(Point("gemm", "fwd", float(row["flops"]), nb, 1, float(row["t_s"]),
                             "micro:gemm", f"mm{m}x{n}x{k}", m, call=False,
                             before=tuple(nb * w for w in range(1, max(COLD_WINDOWS) + 1))))
    for name, runs in raw.get("models", {}).items():
        if name in exclude:
            continue
        pts += _model_points(_zoo_model(name), name, runs, dtype, dense_sparse_grad,
                             weight_grad_only)
    return pts


# ------------------------------------------------------------------- fitting
def _median(x: Any) -> float:
    """``np.median`` of a non-empty 1-D sequence, the same value (the middle one, or the
    mean of the middle two; NaN where there is one) at a fraction of its overhead: the
    fit takes hundreds of thousands of medians of a few values each."""
    a = np.sort(np.asarray(x, dtype=float))
    if np.isnan(a[-1]):  # sorted last: np.median's NaN, not a middle value
        return math.nan
    h = len(a) // 2
    return float(a[h]) if len(a) % 2 else float((a[h - 1] + a[h]) / 2)


def _auto_knots(logx: np.ndarray) -> np.ndarray:
    lo, hi = float(logx.min()), float(logx.max())
    if hi - lo < 1e-9:
        return np.array([lo])
    n = min(MAX_KNOTS, max(2, math.ceil((hi - lo) / KNOT_STEP) + 1))
    return np.linspace(lo, hi, n)


def _hat_basis(logx: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """Rows: points; columns: knots; piecewise-linear interpolation weights, clamped."""
    n, k = len(logx), len(knots)
    B = np.zeros((n, k))
    if k == 1:
        B[:, 0] = 1.0
        return B
    x = np.clip(logx, knots[0], knots[-1])
    j = np.clip(np.searchsorted(knots, x, side="right") - 1, 0, k - 2)
    w = (x - knots[j]) / (knots[j + 1] - knots[j])
    B[np.arange(n), j] = 1.0 - w
    B[np.arange(n), j + 1] = w
    return B


def fit_curve(x: Sequence[float], y: Sequence[float], knots: Sequence[float] | None = None,
              bounds: tuple[float, float] = EFF_RANGE, smooth: float = 1e-3,
              robust_rounds: int = 2) -> tuple[list[float], list[float]]:
    """Fit a curve piecewise linear in log10(x) to points ``(x, y)``.

    The knot values are fitted in log space: minimises ``sum_i (g(x_i) -
    log y_i)^2 + smooth * n * sum (second differences of g at the knots)^2``
    where ``g`` interpolates the log knot values linearly in log10(x), so over-
    and under-prediction by the same factor cost the same; then reweights twice
    (Tukey-like: a point's weight falls with its residual over 4 median absolute
    residuals). Points at the knots of a curve are recovered exactly (with
    ``smooth=0``); between knots the stored curve interpolates the values
    themselves, not their logs.

    Args:
        x: sizes (> 0) of the points.
        y: efficiencies (> 0) at those sizes.
        knots: sizes of the knots; by default every ~0.5 decade over the data
            (at most 9).
        bounds: values are clipped into this range.
        smooth: weight of the second-difference penalty.
        robust_rounds: reweighting rounds.

    Returns:
        ``(knot sizes, values)``, sizes increasing.
    """
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(xa) == 0 or np.any(xa <= 0) or np.any(ya <= 0):
        raise ValueError("need at least one point with x > 0 and y > 0")
    logx = np.log10(xa)
    kn = np.log10(np.asarray(knots, dtype=float)) if knots is not None else _auto_knots(logx)
    B = _hat_basis(logx, kn)
    ly = np.log(ya)
    robust = np.ones_like(ya)
    k = len(kn)
    D = np.zeros((max(0, k - 2), k))
    for i in range(k - 2):
        D[i, i:i + 3] = (1.0, -2.0, 1.0)
    med = _median(ly)
    v = np.full(k, med)
    # the system's rows: the points (weighted anew each round), the smoothness
    # penalty, and a vanishing ridge towards the median that defines knots nothing
    # else does; only the points' rows change between rounds
    n, pen = len(ya), (k - 2 if k > 2 and smooth > 0 else 0)
    A = np.empty((n + pen + k, k))
    rhs = np.empty(n + pen + k)
    A[n:n + pen] = D * math.sqrt(smooth * n) if pen else 0.0
    A[n + pen:] = 1e-9 * np.eye(k)
    rhs[n:n + pen] = 0.0
    rhs[n + pen:] = 1e-9 * med
    for rnd in range(robust_rounds + 1):
        A[:n] = B * robust[:, None]
        rhs[:n] = ly * robust
        v = np.linalg.lstsq(A, rhs, rcond=None)[0]
        if rnd == robust_rounds:
            break
        r = np.abs(B @ v - ly)
        mad = _median(r) or 1e-12
        u = np.clip(r / (4.0 * mad), 0.0, 1.0)
        robust = (1.0 - u**2) ** 2 + 1e-3
    vals = np.clip(np.exp(v), *bounds)
    return [float(10**z) for z in kn], [float(z) for z in vals]


@dataclass(frozen=True)
class FitResult:
    """Fitted profile fields and the points they were fitted to."""

    launch_overhead_s: float
    efficiency: dict[str, EfficiencyCurve | IntensityCurve]
    efficiency_bwd: dict[str, EfficiencyCurve | IntensityCurve]
    mem_efficiency: dict[str, BandwidthCurve]
    mem_efficiency_bwd: dict[str, BandwidthCurve]
    points: tuple[Point, ...]
    call_overhead: dict[str, float] = field(default_factory=dict)
    call_overhead_bwd: dict[str, float] = field(default_factory=dict)
    glue: dict[str, tuple[float, float]] | None = None
    row_cost: dict[str, float] = field(default_factory=dict)
    row_cost_bwd: dict[str, float] = field(default_factory=dict)
    cold: dict[str, ColdCurve] | None = None
    cold_window: int | None = None


def _bandwidth_fit(nbytes: np.ndarray, busy: np.ndarray, sources: np.ndarray, mem_bw: float,
                   fractions: Sequence[float] | None = None, rows: np.ndarray | None = None,
                   row_fractions: Sequence[float] | None = None
                   ) -> tuple[float, float, BandwidthCurve | None]:
    """A bandwidth curve, a fixed per-call overhead and a cost per row looked up for
    passes without FLOPs.

    ``busy``: each pass's time less its launch overheads; ``rows``: the rows each
    looks up (0 for a dense layer; None: all 0). Candidate overheads are
    ``fractions`` of the 10th percentile of ``busy``, candidate row costs
    ``row_fractions`` of the smallest ``busy / rows`` over the passes with rows
    (the most any pass allows; only 0 where none has any); the pair chosen
    predicts a source (model or single-layer benchmark) left out of the curve's
    fit best: the median over sources of the median |relative time error| (ties:
    the earlier pair, smaller row costs first). With fewer than three sources
    only (0, 0) is tried (the curve alone, as before).

    Returns:
        (overhead seconds, seconds per row, curve over bytes of ``busy - overhead
        - row cost * rows``; None when no pass is left).
    """
    names = sorted(set(sources.tolist()))
    n_rows = np.zeros(len(busy)) if rows is None else np.asarray(rows, dtype=float)
    looks = n_rows > 0
    several = len(names) >= 3
    base = float(np.percentile(busy, 10))
    cands = [f * base for f in (OVERHEAD_FRACTIONS if fractions is None else fractions)] if several else [0.0]
    per_row = float(np.min(busy[looks] / n_rows[looks])) if looks.any() else 0.0
    rcands = ([f * per_row for f in (ROW_FRACTIONS if row_fractions is None else row_fractions)]
              if several and per_row > 0 else [0.0])

    def curve(c: float, r: float, keep: np.ndarray) -> BandwidthCurve | None:
        rest = busy - c - r * n_rows
        ok = keep & (rest > 0)
        if not ok.any():
            return None
        k, v = fit_curve(nbytes[ok].tolist(), (nbytes[ok] / (mem_bw * rest[ok])).tolist(), bounds=MEM_EFF_RANGE)
        return BandwidthCurve(bytes=k, eff=v)

    best: tuple[float, float, float] | None = None
    if len(cands) * len(rcands) > 1:
        for r in rcands:
            for c in cands:
                per = []
                for n in names:
                    out = sources == n
                    cv = curve(c, r, ~out)
                    if cv is None:
                        continue
                    pred = (c + r * n_rows[out]
                            + nbytes[out] / (mem_bw * np.array([cv.at(x) for x in nbytes[out]])))
                    per.append(_median(np.abs(pred / busy[out] - 1)))
                score = _median(per) if per else math.inf
                if best is None or score < best[0] - 1e-12:
                    best = (score, c, r)
    c, r = (best[1], best[2]) if best is not None else (0.0, 0.0)
    return c, r, curve(c, r, np.ones(len(busy), bool))


def _eff_curve(x: Sequence[float], effs: Sequence[float], by: str) -> EfficiencyCurve | IntensityCurve:
    """An efficiency curve over ``by`` (``"flops"`` or ``"intensity"``), fitted to ``(x, effs)``."""
    k, v = fit_curve(x, effs, bounds=EFF_RANGE)
    return EfficiencyCurve(flops=k, eff=v) if by == "flops" else IntensityCurve(intensity=k, eff=v)


def _best_compute_curve(flops: list[float], intensity: list[float], effs: list[float],
                        sources: list[str], variables: tuple[str, ...] = ("flops", "intensity")
                        ) -> EfficiencyCurve | IntensityCurve:
    """The curve over FLOPs or over intensity, whichever predicts a source (a model
    or a single-layer benchmark) left out of its fit better: the median over
    sources of the median |relative error| of the efficiency. With fewer than
    three sources, the smaller residual of the fit itself decides."""
    y = np.asarray(effs)
    src = np.asarray(sources)
    names = sorted(set(sources))

    def curve(x: np.ndarray, keep: np.ndarray, by: str) -> EfficiencyCurve | IntensityCurve:
        return _eff_curve(x[keep], y[keep], by)

    scores = {}
    candidates = (("flops", np.asarray(flops)), ("intensity", np.asarray(intensity)))
    for by, xs in candidates[:len(variables)] if variables == ("flops",) else candidates:
        if len(names) >= 3:
            per = []
            for n in names:
                out = src == n
                c = curve(xs, ~out, by)
                per.append(_median(np.abs(np.array([c.at(x) for x in xs[out]]) / y[out] - 1)))
            scores[by] = _median(per)
        else:
            c = curve(xs, np.ones(len(y), bool), by)
            scores[by] = _median(np.abs(np.array([c.at(x) for x in xs]) / y - 1))
    by = min(scores, key=lambda k: scores[k])
    xs = np.asarray(flops if by == "flops" else intensity)
    return curve(xs, np.ones(len(y), bool), by)


@dataclass(frozen=True)
class _ComputePoints:
    """The passes of a compute group, with a call overhead taken off their times."""

    flops: list[float]
    intensity: list[float]
    eff: list[float]  # flops / (peak * (t - launch * kernels - overhead))
    sources: list[str]
    mem_x: list[float]  # memory-bound passes: bytes, and their fraction of mem_bw
    mem_y: list[float]


def _compute_points(g: Sequence[Point], peak: float, mem_bw: float, launch: float,
                    overhead: float) -> _ComputePoints:
    """``g``'s passes less launches and ``overhead``: every one a point of the compute
    curve, and the memory-bound ones a point of the class's bandwidth curve too.

    A memory-bound pass (its bytes at ``mem_bw`` take MEMORY_BOUND_SHARE of its
    time or more) still measures the compute side: the cost model prices a pass
    as the larger of its compute and memory time, so a compute curve below such
    a pass's rate makes the compute side, not the memory side, decide its price.
    A GEMM of 8-16 rows is one: left out, the curve interpolates its efficiency
    between 1-output heads and GEMMs of a hundred rows, far below what it reaches.
    """
    out = _ComputePoints([], [], [], [], [], [])
    for p in g:
        busy = p.t_s - launch * p.kernels - (overhead if p.call else 0.0)
        if busy <= 0:
            continue
        if p.nbytes / mem_bw >= MEMORY_BOUND_SHARE * busy:
            out.mem_x.append(p.nbytes)
            out.mem_y.append(p.nbytes / (mem_bw * busy))
        out.flops.append(p.flops)
        out.intensity.append(p.flops / p.nbytes)
        out.sources.append(p.model)
        out.eff.append(p.flops / (peak * busy))
    return out


def _variables(op: str) -> tuple[str, ...]:
    """What the curve of ``op`` (an op class or ``OP/KIND``) may be a function of."""
    return CURVE_VARIABLES.get(op, CURVE_VARIABLES.get(op.split("/")[0], ("flops",)))


def _curve_variable(cp: _ComputePoints, variables: tuple[str, ...]) -> str:
    """The variable (``"flops"`` or ``"intensity"``) :func:`_best_compute_curve` chooses."""
    curve = _best_compute_curve(cp.flops, cp.intensity, cp.eff, cp.sources, variables)
    return "intensity" if isinstance(curve, IntensityCurve) else "flops"


def _compute_overhead(g: Sequence[Point], peak: float, mem_bw: float, launch: float,
                      variables: tuple[str, ...], candidates: Sequence[float]) -> float:
    """A compute class's fixed seconds per layer call (``corrections.call_overhead``).

    The per-call cost of a small layer (module dispatch, autograd, a bias kernel:
    a classifier's 1-output Linear takes 10-13 us forward and 35-38 us backward
    here) is not a rate: a curve alone takes it for a low efficiency at the
    layer's intensity and then prices a large call of that intensity as slow.
    Each of ``candidates`` (seconds) is taken off the class's layer passes (not
    off bare kernels, :attr:`Point.call`), the curves are fitted as
    :func:`_fit_at` fits them (the class's, its compute kinds' and its
    bandwidth curve), leaving one source (model or single-layer benchmark) out
    at a time, and every pass of the left-out source is priced as the cost model
    prices it (launches + the overhead + the larger of compute and memory time,
    each pass by its kind's curve where there is one). The score is the median
    over sources of the median |relative time error|; the smallest candidate
    within OVERHEAD_TIE of the best score is kept (a larger overhead must
    predict clearly better). Candidates above the fastest layer call of the class
    (its time less launches) are not tried: no call costs less than the
    overhead. With fewer than three sources: 0.
    """
    names = sorted({p.model for p in g})
    calls = [p.t_s - launch * p.kernels for p in g if p.call]
    if len(names) < 3 or not calls:
        return 0.0
    # no call can be cheaper than the overhead: none above the fastest layer call measured
    cap = min(calls)
    kinds = sorted({p.ckind for p in g if p.ckind})
    scores: list[tuple[float, float]] = []
    for c in (c for c in candidates if c <= cap):
        full = _compute_points(g, peak, mem_bw, launch, c)
        if len(set(full.sources)) < 3:
            continue
        by = {"": _curve_variable(full, variables)}
        # a kind's curve where _fit_at makes one: MIN_KIND_POINTS passes, one with compute time
        for kd in kinds:
            kg = [p for p in g if p.ckind == kd]
            kp = _compute_points(kg, peak, mem_bw, launch, c)
            if len(kg) >= MIN_KIND_POINTS and kp.flops:
                by[kd] = _curve_variable(kp, _variables(kd))
        per = []
        for n in names:
            train = [p for p in g if p.model != n]
            tp = _compute_points(train, peak, mem_bw, launch, c)
            curves: dict[str, EfficiencyCurve | IntensityCurve] = {}
            for kd, var in by.items():
                sub = [p for p in train if p.ckind == kd] if kd else train
                kp = _compute_points(sub, peak, mem_bw, launch, c) if kd else tp
                if kp.flops and (not kd or len(sub) >= MIN_KIND_POINTS):
                    curves[kd] = _eff_curve(kp.intensity if var == "intensity" else kp.flops,
                                            kp.eff, var)
            if "" not in curves:
                continue
            mem_curve = None
            if len(tp.mem_x) >= MIN_KIND_POINTS:
                mk, mv = fit_curve(tp.mem_x, tp.mem_y, bounds=MEM_EFF_RANGE)
                mem_curve = BandwidthCurve(bytes=mk, eff=mv)
            errs = []
            for p in g:
                if p.model != n or p.t_s <= 0:
                    continue
                cv = curves.get(p.ckind, curves[""])
                x = p.flops / p.nbytes if isinstance(cv, IntensityCurve) else p.flops
                mem_eff = mem_curve.at(p.nbytes) if mem_curve is not None else 1.0
                compute = p.flops / (peak * cv.at(x))
                memory = 0.0 if p.ckind in RATE_KINDS and p.ckind in curves else (
                    p.nbytes / (mem_bw * mem_eff))
                pred = launch * p.kernels + (c if p.call else 0.0) + max(compute, memory)
                errs.append(abs(pred / p.t_s - 1))
            if errs:
                per.append(_median(errs))
        if per:
            scores.append((_median(per), c))
    if not scores:
        return 0.0
    best = min(sc for sc, _ in scores)
    return min(c for sc, c in scores if sc <= best * (1 + OVERHEAD_TIE) + 1e-12)


def _fit_at(pts: Sequence[Point], peak: float, mem_bw: float, launch: float,
            fractions: Sequence[float] | None = None,
            compute_overheads: Sequence[float] = (0.0,)) -> FitResult:
    eff: dict[str, dict[str, EfficiencyCurve | IntensityCurve]] = {"fwd": {}, "bwd": {}}
    mem: dict[str, dict[str, BandwidthCurve]] = {"fwd": {}, "bwd": {}}
    fixed: dict[str, dict[str, float]] = {"fwd": {}, "bwd": {}}
    row_cost: dict[str, dict[str, float]] = {"fwd": {}, "bwd": {}}
    groups: dict[tuple[str, str, bool], list[Point]] = {}
    for p in pts:
        groups.setdefault((p.op, p.phase, p.flops > 0), []).append(p)
        if p.flops == 0:  # bandwidth curves per layer kind too, where there are enough points
            groups.setdefault((p.kind, p.phase, False), []).append(p)
        elif p.ckind:  # and efficiency curves per compute kind (conv/spatial, conv/pointwise)
            groups.setdefault((p.ckind, p.phase, True), []).append(p)
    for (op, phase, compute), g in sorted(groups.items()):
        if "/" in op and len(g) < MIN_KIND_POINTS:
            continue
        if compute:
            cls = op.split("/")[0]
            variables = _variables(op)
            # The op class's entry is what the cost model charges a layer with FLOPs
            # (a layer without FLOPs pays its kind's entry first, the class's as a
            # fallback): chosen here unless the class's passes without FLOPs set it
            # already; its compute kinds use it too (sorted: "conv" before
            # "conv/pointwise", (op, phase, False) before (op, phase, True)).
            c = (fixed[phase].get(cls, 0.0) if "/" in op or cls in fixed[phase]
                 else _compute_overhead(g, peak, mem_bw, launch, variables, compute_overheads))
            if "/" not in op:
                fixed[phase][op] = c
            cp = _compute_points(g, peak, mem_bw, launch, c)
            # a class's bandwidth curve fitted to its passes without operations stays
            # (the elementwise class has both kinds: its passes with operations are pools)
            if len(cp.mem_x) >= MIN_KIND_POINTS and "/" not in op and op not in mem[phase]:
                k, v = fit_curve(cp.mem_x, cp.mem_y, bounds=MEM_EFF_RANGE)
                mem[phase][op] = BandwidthCurve(bytes=k, eff=v)
            if cp.flops:
                eff[phase][op] = _best_compute_curve(cp.flops, cp.intensity, cp.eff, cp.sources,
                                                     variables)
            continue
        xs, ys, srcs, ns = [], [], [], []
        for p in g:
            busy = p.t_s - launch * p.kernels
            if busy <= 0:
                continue
            xs.append(p.nbytes)
            ys.append(busy)
            srcs.append(p.model)
            ns.append(p.rows)
        if not xs:
            continue
        c, r, bc = _bandwidth_fit(np.asarray(xs), np.asarray(ys), np.asarray(srcs), mem_bw,
                                  fractions, np.asarray(ns))
        if bc is not None:
            mem[phase][op] = bc
            fixed[phase][op] = c
            if any(ns):  # lookups: a row cost (0 included, so no op-class fallback)
                row_cost[phase][op] = r
    return FitResult(launch, eff["fwd"], eff["bwd"], mem["fwd"], mem["bwd"], tuple(pts),
                     fixed["fwd"], fixed["bwd"], row_cost=row_cost["fwd"],
                     row_cost_bwd=row_cost["bwd"])


def _with_fit(profile: DeviceProfile, f: FitResult, keep_tables: bool) -> DeviceProfile:
    # Forward curves are the base; backward-only classes stay in efficiency_bwd.
    data = profile.model_dump(by_alias=True, exclude_none=True)
    data.update(
        launch_overhead_s=f.launch_overhead_s,
        efficiency={op: c.model_dump() for op, c in f.efficiency.items()},
        efficiency_bwd={op: c.model_dump() for op, c in f.efficiency_bwd.items()} or None,
        mem_efficiency={op: c.model_dump() for op, c in f.mem_efficiency.items()} or None,
        mem_efficiency_bwd={op: c.model_dump() for op, c in f.mem_efficiency_bwd.items()} or None,
        corrections=_fitted_corrections(data.get("corrections", {}), f),
    )
    if not keep_tables:
        data.pop("layers", None)
    return DeviceProfile.model_validate({k: v for k, v in data.items() if v is not None})


def _fitted_corrections(listed: dict[str, Any], f: FitResult) -> dict[str, Any] | None:
    """The profile's ``corrections`` after the fit ``f``: ``listed`` (the profile's, dumped)
    with the ones the fit makes set anew (``call_overhead``, ``row_cost``, ``glue``,
    ``cold_calls``; ``skinny_gemm`` where it fitted a ``gemm/rowsM`` curve) and the
    others (``dense_sparse_grad``, ``weight_grad_only_bwd``) kept."""
    phases = {"call_overhead": (f.call_overhead, f.call_overhead_bwd), "row_cost": (f.row_cost, f.row_cost_bwd)}
    fitted: dict[str, Any] = {
        name: {ph: t for ph, t in zip(("fwd", "bwd"), tables, strict=True) if any(t.values())} or None
        for name, tables in phases.items()}
    fitted["glue"] = f.glue
    fitted["cold_calls"] = ({"window": f.cold_window, "curves": {op: c.model_dump() for op, c in f.cold.items()}}
                            if f.cold else None)
    rate = any(k in RATE_KINDS for k in (*f.efficiency, *f.efficiency_bwd))
    fitted[SkinnyGemm.name] = {} if rate else None
    out = {**listed, **fitted}
    return {k: v for k, v in out.items() if v is not None} or None


def _rel_errors(profile: DeviceProfile, pts: Sequence[Point]) -> np.ndarray:
    out = np.empty(len(pts))
    cs = corrections_of(profile, exclude=("glue",))
    for i, p in enumerate(pts):
        pred = _point_time(profile, p, cs)
        out[i] = (pred - p.t_s) / p.t_s if p.t_s > 0 else 0.0
    return out


def _point_time(dev: DeviceProfile, p: Point, corrections: Sequence[Correction] | None = None) -> float:
    """The cost model's time of a measured pass (:func:`sim.costmodel.pass_time_s` on the
    point's work, its bytes as counted already; without tables, and without ``glue``: a
    point is a layer's own time). ``corrections``: ``dev``'s but glue (default)."""
    cs = corrections_of(dev, exclude=("glue",)) if corrections is None else corrections
    flags = p.kind.partition("/k")[2]
    window = streamed_window(cs)
    ctx = PassContext(op=p.op, phase=p.phase, flops=p.flops, kernels=p.kernels, nbytes=p.nbytes,
                      batch=p.batch, rows=p.rows, kind=p.ckind.partition("/")[2] or None,
                      layer_kernels=int(flags.rstrip("pri")) if flags else None, has_params="p" in flags,
                      reduces="r" in flags, inplace="i" in flags, call=p.call,
                      streamed_bytes=p.before[window - 1] if window and p.before else 0.0)
    return pass_time_s(dev, ctx, cs)


def fit(profile: DeviceProfile, exclude: Sequence[str] = (), micro: bool = True
        ) -> tuple[DeviceProfile, FitResult]:
    """Fit ``profile``'s curves to its raw measurements, leaving out ``exclude``d models.

    Returns:
        (the profile with fitted ``launch_overhead_s`` and curves and **without
        per-layer tables**, so that every time comes from the curves; the fit).

    Raises:
        ValueError: when the profile has no raw measurements, or a GPU's per-mode ones.
    """
    raw = profile.measurement.raw
    if gpu_fit.is_gpu_raw(raw):
        raise ValueError("a GPU profile's per-mode measurements are fitted by calibrate() "
                         "(calibration.gpu_fit), not by curves")
    if not raw or ("models" not in raw and "micro" not in raw):
        raise ValueError("the profile has no raw layer measurements (run hetsim profile)")
    pts = [p for p in points_from_raw(raw, exclude, micro=micro,
                                      dense_sparse_grad=profile.corrections.dense_sparse_grad is not None,
                                      weight_grad_only=profile.corrections.weight_grad_only_bwd is not None)
           if p.t_s > 0]
    peak, mem_bw = profile.peak("fp32"), profile.mem_bw_Bps
    dispatch = float(raw.get("dispatch_s") or profile.launch_overhead_s or 1e-6)
    overheads = [dispatch * k for k in COMPUTE_OVERHEAD_DISPATCHES]
    best: tuple[float, DeviceProfile, FitResult] | None = None
    for m in LAUNCH_MULTIPLES:
        f = _fit_at(pts, peak, mem_bw, dispatch * m, compute_overheads=overheads)
        prof = _with_fit(profile, f, keep_tables=False)
        err = float(np.median(np.abs(_rel_errors(prof, pts))))
        if best is None or err < best[0]:
            best = (err, prof, f)
    assert best is not None
    cold = cold_curves(raw)
    if cold:
        # the curves are fitted to the passes less their cold-call seconds, at the launch
        # overhead chosen without them; the window with the smallest median error of the
        # passes as measured (cold seconds included) is kept, if it beats none at all
        launch = best[2].launch_overhead_s
        for w in COLD_WINDOWS:
            probe = ColdCalls(ColdCallsParams(window=w, curves=cold))
            warm = [replace(p, t_s=max(p.t_s - probe.at(p.op, p.before[w - 1]), COLD_FLOOR * p.t_s))
                    if p.before else p for p in pts]
            f = replace(_fit_at(warm, peak, mem_bw, launch, compute_overheads=overheads),
                        points=tuple(pts), cold=cold, cold_window=w)
            prof = _with_fit(profile, f, keep_tables=False)
            err = float(np.median(np.abs(_rel_errors(prof, pts))))
            if err < best[0]:
                best = (err, prof, f)
    glue = fit_glue(raw, exclude)
    if glue is None:
        return best[1], best[2]
    f = replace(best[2], glue=glue)
    return _with_fit(profile, f, keep_tables=False), f


def glue_rows(raw: dict[str, Any], exclude: Sequence[str] = ()) -> dict[str, list[tuple[float, ...]]]:
    """Per phase, one row per zoo-model run that has its layers' own times: (layers,
    output bytes of those layers, glue seconds, iteration seconds). The glue is what the
    profiler charged to the layers beyond their own brackets, summed over them."""
    rows: dict[str, list[tuple[float, ...]]] = {ph: [] for ph in PHASES}
    for name, runs in raw.get("models", {}).items():
        if name in exclude:
            continue
        act = {ly.name: ly.activation_bytes for ly in _zoo_model(name).layers}
        for run in runs:
            own = run.get("own")
            if not own:
                continue
            b = float(run["batch"])
            n, out_bytes, g = 0, 0.0, [0.0, 0.0]
            for lname, vals in run["layers"].items():
                if lname not in act or lname not in own:
                    continue
                n += 1
                out_bytes += b * act[lname]
                for j in (0, 1):
                    g[j] += float(vals[j]) - float(own[lname][j])
            if n:
                for j, ph in enumerate(PHASES):
                    rows[ph].append((float(n), out_bytes, max(0.0, g[j]), float(run["iter_s"])))
    return rows


def fit_glue(raw: dict[str, Any], exclude: Sequence[str] = ()) -> dict[str, tuple[float, float]] | None:
    """The glue per layer pass, ``a + c * output bytes`` per phase (``corrections.glue``).

    Fitted to the glue the profiler charged to the layers of the zoo models (not
    ``exclude``) beyond their own brackets (:func:`glue_rows`): ``a, c >= 0`` minimise
    the squared error of each run's glue relative to its iteration, ``sum ((n a + B c -
    G) / iteration)^2`` over runs (``n`` layers, ``B`` output bytes, ``G`` glue), so
    that the glue's share of each iteration is what is matched. None when no run has
    its layers' own times (an older profile: its curves were fitted to the charged
    times, glue included).
    """
    rows = glue_rows(raw, exclude)
    if not any(rows.values()):
        return None
    out = {}
    for ph, rs in rows.items():
        if not rs:
            out[ph] = (0.0, 0.0)
            continue
        r = np.asarray(rs, dtype=float)
        A = r[:, :2] / r[:, 3:4]
        scale = A.max(axis=0)
        scale[scale <= 0] = 1.0
        x = nnls(A / scale, r[:, 2] / r[:, 3])[0] / scale
        out[ph] = (float(f"{x[0]:.4g}"), float(f"{x[1]:.4g}"))
    return out


# ------------------------------------------------------------ residual report
@dataclass(frozen=True)
class CalibrationResult:
    """A calibrated profile and its residuals (one row per op class and phase)."""

    profile: DeviceProfile
    residuals: list[dict[str, Any]]


def residual_rows(profile: DeviceProfile, pts: Sequence[Point]) -> list[dict[str, Any]]:
    """Median and 90th-percentile |relative time error| per (op, phase), and overall."""
    err = _rel_errors(profile, pts)
    rows = []
    keys = sorted({(p.op, p.phase) for p in pts})
    for op, phase in keys:
        e = np.abs(np.array([x for x, p in zip(err, pts, strict=True) if (p.op, p.phase) == (op, phase)]))
        rows.append({"op": op, "phase": phase, "points": len(e), "median_abs_rel_err": float(np.median(e)),
                     "p90_abs_rel_err": float(np.percentile(e, 90))})
    e = np.abs(err)
    rows.append({"op": "all", "phase": "both", "points": len(e), "median_abs_rel_err": float(np.median(e)),
                 "p90_abs_rel_err": float(np.percentile(e, 90))})
    return rows


def calibrate(profile: DeviceProfile, exclude: Sequence[str] = ()) -> CalibrationResult:
    """Fit the curves of a measured profile and rebuild its per-layer tables from its
    raw per-layer times (:func:`layer_tables`, so that they are keyed by the layer
    signature as it is now); a profile without raw model runs keeps its tables.

    The residuals are those of the curves alone (tables not used), on the
    points fitted. A GPU profile's per-mode measurements (``raw["gpu"]``) are fitted
    by :func:`calibration.gpu_fit.fit_gpu` instead (``exclude`` does not apply), its
    residual rows per math mode.
    """
    raw = profile.measurement.raw
    if gpu_fit.is_gpu_raw(raw):
        fitted_gpu, gpu_rows = gpu_fit.fit_gpu(profile)
        data = fitted_gpu.model_dump(by_alias=True, exclude_none=True)
        spread = dict(profile.measurement.spread or {})
        spread["fit_residual_median_abs_rel"] = round(gpu_rows[-1]["median_abs_rel_err"], 4)
        data["measurement"] = {**data.get("measurement", {}), "spread": spread}
        return CalibrationResult(DeviceProfile.model_validate(data), gpu_rows)
    fitted, f = fit(profile, exclude)
    rows = residual_rows(fitted, f.points)
    data = fitted.model_dump(by_alias=True, exclude_none=True)
    tables = layer_tables(raw) if raw and raw.get("models") else None
    if tables:
        data["layers"] = {k: v.model_dump() for k, v in tables.items()}
    elif profile.layers:
        data["layers"] = {k: v.model_dump() for k, v in profile.layers.items()}
    spread = dict(profile.measurement.spread or {})
    spread["fit_residual_median_abs_rel"] = round(rows[-1]["median_abs_rel_err"], 4)
    data["measurement"] = {**data.get("measurement", {}), "spread": spread}
    return CalibrationResult(DeviceProfile.model_validate(data), rows)


def format_residuals(rows: Sequence[dict[str, Any]]) -> str:
    """The residual table as text (with a math mode column where the rows have one: a
    GPU profile's)."""
    modes = any("mode" in r for r in rows)
    lines = [f"{'op':<12}{'phase':<7}{'mode  ' if modes else ''}{'points':>7}{'median |err|':>14}"
             f"{'p90 |err|':>11}"]
    for r in rows:
        mode = f"{r.get('mode', ''):<6}" if modes else ""
        lines.append(f"{r['op']:<12}{r['phase']:<7}{mode}{r['points']:>7}"
                     f"{100 * r['median_abs_rel_err']:>13.1f}%{100 * r['p90_abs_rel_err']:>10.1f}%")
    return "\n".join(lines)


def cold_curves(raw: dict[str, Any]) -> dict[str, ColdCurve] | None:
    """The cold-call seconds per op class from ``raw["cold"]`` (the profiler's cold-call
    benchmark), or None without it.

    Per call of the benchmark (:data:`COLD_OPS`: a ReLU for elementwise layers, a
    Linear for the compute classes, an embedding lookup for lookups): at each size,
    its time right after the copy less its time again at once (0 where smaller),
    then never falling as the bytes grow (the running maximum: more bytes moved
    flush no less).

    Raises:
        ValueError: ``raw["cold"]`` lacks ``moved_bytes``, ``cold_s`` or ``warm_s``, its
            sizes are not positive and increasing, or a call's lists are not one value
            per size in both.
    """
    c = raw.get("cold")
    if not c:
        return None
    if not (isinstance(c.get("moved_bytes"), list) and isinstance(c.get("cold_s"), dict)
            and isinstance(c.get("warm_s"), dict)):
        raise ValueError("raw.cold needs moved_bytes, cold_s and warm_s")
    sizes = [float(x) for x in c["moved_bytes"]]
    if not sizes or sizes[0] <= 0 or any(b <= a for a, b in zip(sizes, sizes[1:], strict=False)):
        raise ValueError("raw.cold.moved_bytes must be positive and increasing")
    out = {}
    for op, call in COLD_OPS.items():
        if call not in c["cold_s"]:
            continue
        cold, warm = c["cold_s"][call], c["warm_s"].get(call)
        if warm is None or len(cold) != len(sizes) or len(warm) != len(sizes):
            raise ValueError(f"raw.cold: {call!r} needs one cold_s and one warm_s value per size")
        extra = np.maximum(np.asarray(cold, float) - np.asarray(warm, float), 0.0)
        out[op] = ColdCurve(bytes=sizes, s=[min(float(x), 0.01) for x in np.maximum.accumulate(extra)])
    return out or None


# --------------------------------------------------------------- predictions
def predict_layers(profile: DeviceProfile, model: Model, batch: int, dtype: str = "fp32",
                   glue: bool = True) -> tuple[list[float], list[float]]:
    """Cost-model forward and backward seconds of each layer of ``model``
    (:func:`sim.costmodel.layer_times`); with ``glue=False`` without the glue charged
    to it (``corrections.glue``): its own time."""
    fwd, bwd = layer_times(model, profile, dtype, batch)
    if glue:
        return fwd.tolist(), bwd.tolist()
    own = [[float(t) - glue_time_s(ly, phase, batch, profile, dtype, model.input_bytes_of(i))
            for i, (ly, t) in enumerate(zip(model.layers, ts, strict=True))]
           for phase, ts in (("fwd", fwd), ("bwd", bwd))]
    return own[0], own[1]


# ------------------------------------------------------ tables and spread
def layer_tables(raw: dict[str, Any]) -> dict[str, LayerTable]:
    """Per-layer tables of the zoo models in ``raw``, keyed by :func:`sim.costmodel.table_key`.

    Layers of one signature (repeated blocks, or equal layers of two models)
    are pooled: the median over them at each batch size.
    """
    pooled: dict[str, dict[int, tuple[list[float], list[float]]]] = {}
    for name, runs in raw.get("models", {}).items():
        model = _zoo_model(name)
        sig = {ly.name: table_key(ly, model.input_bytes_of(i)) for i, ly in enumerate(model.layers)}
        for run in runs:
            b = int(run["batch"])
            for lname, vals in run["layers"].items():
                s = sig.get(lname)
                if s is None:
                    continue
                f, w = pooled.setdefault(s, {}).setdefault(b, ([], []))
                f.append(float(vals[0]))
                w.append(float(vals[1]))
    out = {}
    for s, by_b in pooled.items():
        bs = sorted(by_b)
        out[s] = LayerTable(batch=bs,
                            fwd_s=[float(f"{np.median(by_b[b][0]):.4g}") for b in bs],
                            bwd_s=[float(f"{np.median(by_b[b][1]):.4g}") for b in bs])
    return out


def spread_of(raw: dict[str, Any]) -> dict[str, Any]:
    """Spread of the repeats: relative IQR (IQR / median) summaries.

    ``layer_*``: over the zoo models' per-layer times (both phases);
    ``iteration_*``: over their whole iterations; ``gemm_median``; and where the
    profile has the drift probe's samples (``raw["drift"]``), :func:`drift_of`'s
    figures, ``drift_*``.
    """
    lay, it = [], []
    for runs in raw.get("models", {}).values():
        for run in runs:
            it.append(float(run["iter_rel_iqr"]))
            for vals in run["layers"].values():
                lay += [float(vals[2]), float(vals[3])]
    gemm = [float(r["rel_iqr"]) for r in raw.get("gemm", [])]

    def q(xs: list[float], p: float) -> float | None:
        return round(float(np.percentile(xs, p)), 4) if xs else None

    return {
        "stat": "relative IQR of repeats (IQR / median)",
        "layer_median": q(lay, 50), "layer_p90": q(lay, 90),
        "iteration_median": q(it, 50), "iteration_max": q(it, 100),
        "gemm_median": q(gemm, 50),
        **{f"drift_{k}": v for k, v in (drift_of(raw) or {}).items()},
    }


def drift_of(raw: dict[str, Any]) -> dict[str, Any] | None:
    """How far the machine's speed moved while the profile measured, from the drift
    probe's samples (the same GEMM and copy timed after every step; see
    :class:`calibration.profiler._DriftProbe`), or None without them.

    ``samples``; ``gemm_range``, ``copy_range``: (slowest - fastest) / median of
    the probe's times; ``gemm_iqr``, ``copy_iqr``: their relative IQR over the run.
    """
    samples = (raw.get("drift") or {}).get("samples") or []
    if not samples:
        return None
    out: dict[str, Any] = {"samples": len(samples)}
    for key in ("gemm", "copy"):
        t = np.array([float(s[f"{key}_s"]) for s in samples])
        med = float(np.median(t))
        q1, q3 = np.percentile(t, [25, 75])
        out[f"{key}_range"] = round(float((t.max() - t.min()) / med), 4)
        out[f"{key}_iqr"] = round(float((q3 - q1) / med), 4)
    return out
