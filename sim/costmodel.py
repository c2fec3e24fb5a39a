"""The cost model shared by the analytic evaluator and the DES.

A pass of a layer (forward or backward on ``b`` samples) is priced by the roofline
plus the corrections the device's profile lists (``docs/modelling/cost_model.md``)::

    roofline_s(pass) = d.launch_overhead_s * kernels
                     + max(flops / (peak[dtype] * eff(op, kind, size)),
                           bytes / (mem_bw * mem_eff(op, layer kind, bytes)))
    layer_time_s     = roofline_s(pass after the corrections' changes)
                     + sum(c.extra_s(pass) for c in corrections_of(d))

The efficiency tables (``efficiency``, ``efficiency_bwd``, ``mem_efficiency``,
``mem_efficiency_bwd``) are the roofline's parameters; each correction is a class of
:mod:`sim.corrections` with its formula and the profile subsection it reads (a
datasheet profile lists none: the roofline alone). A measured per-layer table for the
layer's signature replaces both; it is interpolated in batch size. A message of n
bytes on a link takes latency_s + n / bw_Bps (bandwidth shared among concurrent flows
in the DES when the network's sharing is 'fair').

:class:`PlanCosts` turns a (Problem, data-parallel Plan) pair into the arrays
both evaluators consume: per-worker compute per layer group, and per-chunk
message bytes and PS work. Sharing this seam is what makes the evaluators
agree exactly where they model the same thing.

Quantization (``job.quant_bits`` < 32). A push carries
:func:`sim.quantization.packed_bytes` of the chunk's fp32 gradient:
``ceil(fp32_bytes * q / 32) + QUANT_META_BYTES`` (scale metadata once per chunk,
i.e. per message piece; a chunk with nothing to send sends nothing). Pulls
stay fp32. The pack/unpack work is charged as memory passes:

- the sender quantizes: where its profile has a measured cost (``quant``, from
  ``hetsim profile``: the runtime's own pack and unpack, per value and bit width),
  ``fp32_bytes / 4`` values at that cost; otherwise one pass reading the fp32
  gradient and writing the packed one,
  ``quantize_time_s = (fp32_bytes + packed_bytes) / worker mem_bw``. This is
  added, per (worker, chunk), to the backward compute of the group that
  produces the chunk (``bwd_s[w, chunk_group[c]]``), so the push leaves after
  it and slowdowns stretch it like any compute; it shows in ``compute_s``.
- the shard dequantizes each arriving gradient: the measured unpack cost per value
  where it has one, else reading the packed bytes and writing fp32,
  ``dequantize_time_s = (packed_bytes + fp32_bytes) / shard mem_bw``,
  added per (worker, chunk) to ``agg_s`` (the shard's FIFO work per arrival).

No kernel-launch overhead is charged for either pass. At 32 bits both are 0
and nothing is added, so every array is exactly what it is without
quantization. ``quant_s`` and ``dequant_s`` keep the two parts for reporting.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from hardware_profiles import DeviceProfile
from hardware_profiles.errors import ConfigError
from sim.corrections import (
    Correction,
    DenseSparseGrad,
    Glue,
    PassContext,
    WeightGradOnlyBwd,
    corrections_of,
)
from sim.corrections.skinny_gemm import rows_kind
from sim.plan import Plan
from sim.precision import HALF, MATMUL_OPS, activation_scales, pass_mode
from sim.problem import Problem
from sim.quantization import QUANT_META_BYTES as QUANT_META_BYTES  # re-exported
from sim.quantization import packed_bytes_array
from sim.workload import Layer, Model

#: Memory passes of a PS shard per gradient byte aggregated (read sum, read grad, write sum).
AGG_PASSES = 3.0
#: Memory passes per parameter byte updated (read param, read grad, write param).
APPLY_PASSES = 3.0
# QUANT_META_BYTES (bytes of scale metadata per quantized piece) lives in sim.quantization
# and is re-exported here.

_ACT_SCALE = {"fp32": 1.0, "fp16": 0.5, "bf16": 0.5}

#: How far an attention layer's FLOPs must exceed its projections' to count the
#: attention itself (:func:`compute_kind`): the scores and weighted sum add seq / (2 d)
#: of the projections' (1/8 for the zoo's transformer); without biases the width is
#: read 0.5 low, which puts a fused layer's ratio below 1.
ATTENTION_FLOPS_MARGIN = 1e-3

#: The byte-accounting corrections ``layer_work``'s flags name.
_DENSE_SPARSE_GRAD, _WEIGHT_GRAD_ONLY = DenseSparseGrad(), WeightGradOnlyBwd()


def _table_time(batch: list[int], times: list[float], b: float) -> float:
    """Piecewise-linear in batch; linear extrapolation through the end segments."""
    if len(batch) == 1:
        return times[0] * b / batch[0]
    i = int(np.searchsorted(batch, b))
    i = min(max(i, 1), len(batch) - 1)
    x0, x1, y0, y1 = batch[i - 1], batch[i], times[i - 1], times[i]
    return max(0.0, y0 + (y1 - y0) * (b - x0) / (x1 - x0))


def layer_time_s(layer: Layer, phase: str, b: float, dev: DeviceProfile, dtype: str,
                 input_bytes: float, streamed_bytes: float = 0.0,
                 corrections: Sequence[Correction] | None = None,
                 scales: tuple[float, float] | None = None,
                 memory_format: str = "contiguous") -> float:
    """Seconds for one layer's forward ('fwd') or backward ('bwd') pass on ``b`` samples.

    The layer's measured table where the profile has one (:func:`table_key`), else
    :func:`pass_time_s` of the pass (:func:`pass_context`) with ``corrections``
    (default: :func:`sim.corrections.corrections_of` ``dev``). ``streamed_bytes``: what
    the passes before it moved (:func:`streamed_before`), which a correction with a
    window reads (``cold_calls``); a measured table holds their cost already.
    ``scales``: its (input, output) activation sizes relative to fp32
    (:func:`sim.precision.activation_scales`; default: both by ``dtype``).
    """
    if b <= 0:
        return 0.0
    if dev.layers and (key := table_key(layer, input_bytes)) in dev.layers:
        t = dev.layers[key]
        return _table_time(t.batch, t.fwd_s if phase == "fwd" else t.bwd_s, b)
    cs = corrections_of(dev) if corrections is None else corrections
    return pass_time_s(dev, pass_context(layer, phase, b, dtype, input_bytes, cs, streamed_bytes, scales,
                                         memory_format), cs)


def pass_context(layer: Layer, phase: str, b: float, dtype: str, input_bytes: float,
                 corrections: Sequence[Correction] = (), streamed_bytes: float = 0.0,
                 scales: tuple[float, float] | None = None,
                 memory_format: str = "contiguous") -> PassContext:
    """The pass of ``layer`` on ``b`` samples as the roofline and the corrections read it:
    its work (:func:`plain_work`) changed by the ``work`` of each of ``corrections``.
    ``scales``: (input, output) activation sizes relative to fp32 (default: both
    ``dtype``'s, :data:`_ACT_SCALE`)."""
    if scales is None:
        act = _ACT_SCALE.get(dtype, 1.0)
        scales = (act, act)
    flops, kernels, nbytes = plain_work(layer, phase, b, dtype, input_bytes, scales)
    ctx = PassContext(
        op=layer.op, phase=phase, flops=flops, kernels=kernels, nbytes=nbytes, dtype=dtype, batch=b,
        layer=layer, input_bytes=input_bytes, weight_bytes=_weight_scale(layer, dtype) * _touched_param_bytes(
            layer, b), act_scale=scales[1], in_scale=scales[0],
        out_bytes=b * scales[1] * layer.activation_bytes, rows=looked_up_rows(layer, b),
        kind=compute_kind(layer, input_bytes, b), layer_kernels=layer.kernels,
        has_params=layer.param_bytes > 0, reduces=layer.activation_bytes < input_bytes,
        inplace=layer.inplace, streamed_bytes=streamed_bytes, memory_format=memory_format)
    for c in corrections:
        ctx = c.work(ctx)
    return ctx


def pass_terms(dev: DeviceProfile, ctx: PassContext, corrections: Sequence[Correction] = ()) -> PassContext:
    """The pass ``ctx`` (its work final: the corrections' ``work`` applied) with its
    roofline terms on ``dev`` (``compute_s``: its FLOPs in the math mode
    :func:`sim.precision.pass_mode` gives; ``memory_s``; ``mode``; ``eff_key``), each
    correction's ``terms`` applied in the order of ``corrections``: what
    :func:`pass_time_s` adds up."""
    mem_eff = dev.mem_eff(ctx.op, ctx.nbytes, ctx.phase, ctx.layer_kernels, ctx.has_params, ctx.reduces,
                          ctx.inplace)
    mode = pass_mode(dev, ctx.dtype, ctx.op, ctx.flops)
    compute, memory = roofline_terms(dev, ctx.op, ctx.flops, ctx.nbytes, ctx.dtype, mem_eff, ctx.phase,
                                     ctx.kind, mode)
    ctx = ctx.replace(compute_s=compute, memory_s=memory, mode=mode,
                      eff_key=dev.eff_key(ctx.op, ctx.phase, ctx.kind, mode))
    for c in corrections:
        ctx = c.terms(ctx)
    return ctx


def pass_time_s(dev: DeviceProfile, ctx: PassContext, corrections: Sequence[Correction] = ()) -> float:
    """Seconds of the pass ``ctx`` (its work final: the corrections' ``work`` applied) on
    ``dev``: the roofline of its work with each correction's ``terms``
    (:func:`pass_terms`), plus each one's ``extra_s``, summed in the order of
    ``corrections``.

    :mod:`calibration.calibrate` and :mod:`calibration.gpu_fit` price their measured
    points with it too."""
    ctx = pass_terms(dev, ctx, corrections)
    return dev.launch_overhead_s * ctx.kernels + max(ctx.compute_s, ctx.memory_s) + sum(
        c.extra_s(ctx) for c in corrections)


def table_key(layer: Layer, input_bytes: float) -> str:
    """The key of a layer's measured per-layer table (``DeviceProfile.layers``): its
    :attr:`~sim.workload.Layer.signature`, plus ``:r`` where its output is smaller than
    its input (a pooling layer runs another kernel than a ReLU of equal output bytes)."""
    return layer.signature + (":r" if layer.activation_bytes < input_bytes else "")


def glue_time_s(layer: Layer, phase: str, b: float, dev: DeviceProfile, dtype: str,
                input_bytes: float = 0.0) -> float:
    """The part of :func:`layer_time_s` that is glue (the ``glue`` correction,
    :mod:`sim.corrections.glue`): 0 where the profile lists none, for ``b <= 0`` and for
    a layer priced by a measured table (which holds its glue already; ``input_bytes``
    as :func:`table_key` takes them)."""
    glue = [c for c in corrections_of(dev) if isinstance(c, Glue)]
    if not glue or b <= 0 or (dev.layers and table_key(layer, input_bytes) in dev.layers):
        return 0.0
    return glue[0].extra_s(pass_context(layer, phase, b, dtype, input_bytes))


def roofline_terms(dev: DeviceProfile, op: str, flops: float, nbytes: float, dtype: str,
                   mem_eff: float = 1.0, phase: str = "fwd", kind: str | None = None,
                   mode: str | None = None) -> tuple[float, float]:
    """The roofline's (compute seconds, memory seconds) of a piece of work:
    ``flops / (peak[mode] * eff(op, kind, size, mode))`` (0 without FLOPs) and
    ``nbytes / (mem_bw * mem_eff)``. ``mode``: the math mode (default: the one
    :func:`sim.precision.pass_mode` gives for ``dtype`` and ``op``)."""
    if flops <= 0:
        return 0.0, nbytes / (dev.mem_bw_Bps * mem_eff)
    m = pass_mode(dev, dtype, op, flops) if mode is None else mode
    compute = flops / (dev.peak(m) * dev.eff(op, flops, phase, nbytes, kind, m))
    return compute, nbytes / (dev.mem_bw_Bps * mem_eff)


def roofline_s(dev: DeviceProfile, op: str, flops: float, nbytes: float, kernels: int, dtype: str,
               mem_eff: float = 1.0, phase: str = "fwd", kind: str | None = None) -> float:
    """The roofline for any piece of work (a layer pass, a robotics task): launch
    overhead per kernel plus the larger of compute and memory time
    (:func:`roofline_terms`), without corrections."""
    return dev.launch_overhead_s * kernels + max(*roofline_terms(dev, op, flops, nbytes, dtype, mem_eff,
                                                                 phase, kind))


def compute_kind(layer: Layer, input_bytes: float, b: float | None = None) -> str | None:
    """A finer class than the op class where the layer record tells one: for a
    convolution, ``"spatial"`` (a window of several pixels per output at stride 1,
    e.g. 3x3: Winograd/direct kernels) or ``"pointwise"`` (1x1, or a window no
    larger than its stride: a GEMM); for a GEMM with parameters called on ``b``
    samples, :func:`sim.corrections.skinny_gemm.rows_kind` of its rows (``b`` times its
    positions): ``"rowsM"`` for a skinny GEMM of M <= SKINNY_ROWS rows (a classifier's
    Linear at batch 1-4), another kernel (matrix-vector products, or a GEMM kernel far
    below its rate per byte at many rows); for an attention layer with parameters (``nn.MultiheadAttention``),
    ``"unfused"`` where its record counts the FLOPs of the attention itself (the
    scores and the weighted sum, beyond the four projections: torch's math path,
    which training with dropout on the attention weights takes) and ``"fused"``
    where it counts the projections' alone (a fused scaled-dot-product kernel,
    whose FLOPs the counter does not see): their efficiencies over the counted
    FLOPs are of different work; None otherwise (and for a GEMM when ``b`` is
    not given).

    Derived from the per-sample figures of a dense layer: positions = fwd_flops /
    (2 * weights), and for a 2-D convolution window / stride^2 = weights *
    positions^2 / (output elements * input elements); >= 2 is spatial. For
    attention of width ``d`` (weights 4 d^2 + 4 d with biases) the positions are
    output elements / d and the projections' FLOPs 2 * weights * positions.
    """
    if layer.op not in ("conv", "gemm", "attention") or layer.param_bytes <= 0 or layer.fwd_flops <= 0:
        return None
    weights = layer.param_bytes / 4.0
    if layer.op == "attention":
        d = (math.sqrt(1.0 + weights) - 1.0) / 2.0
        projections = 2.0 * weights * (layer.activation_bytes / 4.0) / d
        return "unfused" if layer.fwd_flops > (1.0 + ATTENTION_FLOPS_MARGIN) * projections else "fused"
    positions = layer.fwd_flops / (2.0 * weights)
    if layer.op == "gemm":
        return rows_kind(b * positions) if b is not None else None
    out_el, in_el = layer.activation_bytes / 4.0, input_bytes / 4.0
    if out_el <= 0 or in_el <= 0:
        return None
    return "spatial" if weights * positions**2 / (out_el * in_el) >= 2.0 else "pointwise"


def layer_work(layer: Layer, phase: str, b: float, dtype: str, input_bytes: float,
               dense_sparse_grad: bool = False, weight_grad_only: bool = False
               ) -> tuple[float, int, float]:
    """(FLOPs, kernel launches, bytes moved) of one pass of ``layer`` on ``b`` samples.

    The quantities the cost model prices; :mod:`calibration.calibrate` fits
    efficiencies against the same ones. :func:`plain_work`, changed by the
    byte-accounting corrections the flags name, as a profile listing them prices the
    pass: ``dense_sparse_grad`` (:mod:`sim.corrections.dense_sparse_grad`: the backward
    of a sparse layer also writes a dense gradient of its whole table) and
    ``weight_grad_only`` (:mod:`sim.corrections.weight_grad_only_bwd`: the backward of
    a layer that computes no input gradient moves only what its weight gradient needs).
    """
    cs = ((_DENSE_SPARSE_GRAD,) if dense_sparse_grad else ()) + ((_WEIGHT_GRAD_ONLY,) if weight_grad_only
                                                                 else ())
    if not cs:
        return plain_work(layer, phase, b, dtype, input_bytes)
    ctx = pass_context(layer, phase, b, dtype, input_bytes, cs)
    return ctx.flops, ctx.kernels, ctx.nbytes


def plain_work(layer: Layer, phase: str, b: float, dtype: str, input_bytes: float,
               scales: tuple[float, float] | None = None) -> tuple[float, int, float]:
    """(FLOPs, kernel launches, bytes moved) of one pass of ``layer`` on ``b`` samples,
    before any correction: the forward reads the weights (a sparse table's touched
    rows), its input and writes its output; the backward reads the weights and writes
    their gradient, reads its input and the output gradient and writes the input
    gradient, in twice the forward's kernels. The forward of a pooling layer counts
    :func:`pool_ops` among its FLOPs. Activations scale by ``scales`` (input, output;
    default: both ``dtype``'s, fp16/bf16: half); under mixed precision a matmul-class
    layer reads half-precision copies of its weights (:func:`_weight_scale`).
    """
    if scales is None:
        act = _ACT_SCALE.get(dtype, 1.0)
        scales = (act, act)
    s_in, s_out = scales
    weights = _weight_scale(layer, dtype) * _touched_param_bytes(layer, b)
    if phase == "fwd":
        flops = (layer.fwd_flops + pool_ops(layer)) * b
        kernels = layer.kernels
        nbytes = weights + b * (s_in * input_bytes + s_out * layer.activation_bytes)
    else:
        flops = layer.bwd_flops * b
        kernels = 2 * layer.kernels
        # read weights, write their gradient; read the input and the output gradient,
        # write the input gradient
        nbytes = 2.0 * weights + b * (s_in * input_bytes + 2.0 * s_out * layer.activation_bytes)
    return flops, kernels, nbytes


def _weight_scale(layer: Layer, dtype: str) -> float:
    """Bytes of a weight as a pass reads it, relative to fp32: 0.5 for a matmul-class
    layer with FLOPs under mixed precision (autocast's half-precision copy), else 1."""
    return 0.5 if dtype in HALF and layer.op in MATMUL_OPS and layer.fwd_flops > 0 else 1.0


def pool_ops(layer: Layer) -> float:
    """Operations per sample of a pooling layer's forward, 0 for any other layer
    (``window`` 1): for each output element one per window element it reads and two
    for what it writes (the value and, for a max pool, the index autograd keeps),
    ``(window + 2)`` times the output elements.

    Torch's FLOP counter counts none for pooling, but a CPU max pool's time follows
    this count, not its bytes (pools whose outputs have equal bytes but different
    windows take time in proportion to the window). Priced by the elementwise class's compute curve where a
    profile has one (calibration fits it to pools, the class's only passes with
    operations), by its bytes otherwise.
    """
    return (layer.window + 2) * layer.activation_bytes / 4.0 if layer.window > 1 else 0.0


def sparse_touched_bytes(layer: Layer, b: float) -> float:
    """Bytes of a sparse table that ``b`` samples touch, capped at the table (0 for a dense
    layer): what travels to and from the PS for it (each table capped on its own)."""
    return 0.0 if layer.sparse is None else _touched_param_bytes(layer, b)


def looked_up_rows(layer: Layer, b: float) -> float:
    """Rows of a sparse table that ``b`` samples look up, repeats included (0 for a dense layer)."""
    return 0.0 if layer.sparse is None else b * layer.sparse.rows_per_sample


def _touched_param_bytes(layer: Layer, b: float) -> float:
    """Parameter bytes a pass reads: the whole layer, or the touched rows of a sparse table."""
    if layer.sparse is None:
        return layer.param_bytes
    return min(layer.param_bytes, looked_up_rows(layer, b) * layer.sparse.row_bytes)


def window_sums(fwd_bytes: Sequence[float], bwd_bytes: Sequence[float], window: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """What the ``window`` passes before each pass moved, in an iteration's execution
    order (forward of layers 0 .. n-1, then backward of n-1 .. 0, one iteration after
    another: the first forward follows the last backward): ``(before each forward,
    before each backward)``, given each pass's bytes."""
    n = len(fwd_bytes)
    order = np.concatenate([np.asarray(fwd_bytes, float), np.asarray(bwd_bytes, float)[::-1]])
    before = np.zeros(2 * n)
    for d in range(1, window + 1):
        before += np.roll(order, d)
    return before[:n], before[n:][::-1]


def pass_bytes(model: Model, b: float, dtype: str, dense_sparse_grad: bool = False,
               weight_grad_only: bool = False) -> tuple[list[float], list[float]]:
    """Bytes each layer's forward and backward pass moves on ``b`` samples
    (:func:`layer_work`, with the byte-accounting corrections of those names)."""
    fwd, bwd = ([layer_work(ly, ph, b, dtype, model.input_bytes_of(i), dense_sparse_grad,
                            weight_grad_only)[2] for i, ly in enumerate(model.layers)]
                for ph in ("fwd", "bwd"))
    return fwd, bwd


def streamed_window(corrections: Sequence[Correction]) -> int:
    """How many passes before a pass ``corrections`` read the bytes of (0: none)."""
    return max((c.streamed_window for c in corrections), default=0)


def streamed_before(model: Model, dev: DeviceProfile, dtype: str, b: float
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Bytes the passes before each layer's forward and backward pass moved, over the
    window of ``dev``'s corrections (:func:`streamed_window`, at least 1), each pass's
    bytes as its work corrections count them (:func:`window_sums`)."""
    cs = corrections_of(dev)
    scales = activation_scales(model, dtype)
    fwd, bwd = ([pass_context(ly, ph, b, dtype, model.input_bytes_of(i), cs, scales=scales[i]).nbytes
                 for i, ly in enumerate(model.layers)] for ph in ("fwd", "bwd"))
    return window_sums(fwd, bwd, streamed_window(cs) or 1)


def _layer_times(model: Model, dev: DeviceProfile, dtype: str, b: int, memory_format: str
                 ) -> tuple[np.ndarray, np.ndarray]:
    n = len(model.layers)
    cs = corrections_of(dev)
    sf, sb = streamed_before(model, dev, dtype, b) if streamed_window(cs) else (np.zeros(n), np.zeros(n))
    scales = activation_scales(model, dtype)
    fwd = np.array([layer_time_s(ly, "fwd", b, dev, dtype, model.input_bytes_of(i), float(sf[i]), cs,
                                 scales[i], memory_format) for i, ly in enumerate(model.layers)])
    bwd = np.array([layer_time_s(ly, "bwd", b, dev, dtype, model.input_bytes_of(i), float(sb[i]), cs,
                                 scales[i], memory_format) for i, ly in enumerate(model.layers)])
    fwd.flags.writeable = False
    bwd.flags.writeable = False
    return fwd, bwd


_CACHE: dict[tuple[int, int, str, int, str], tuple[Model, DeviceProfile, np.ndarray, np.ndarray]] = {}


def layer_times(model: Model, dev: DeviceProfile, dtype: str, b: int, memory_format: str = "contiguous"
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer forward and backward seconds of ``model`` on ``b`` samples in precision
    ``dtype`` (:mod:`sim.precision`) and activation layout ``memory_format`` (cached,
    read-only)."""
    key = (id(model), id(dev), dtype, int(b), memory_format)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is model and hit[1] is dev:
        return hit[2], hit[3]
    if len(_CACHE) > 8192:
        _CACHE.clear()
    fwd, bwd = _layer_times(model, dev, dtype, int(b), memory_format)
    _CACHE[key] = (model, dev, fwd, bwd)  # holding the objects keeps their ids unique
    return fwd, bwd


def iteration_compute_s(model: Model, dev: DeviceProfile, dtype: str, b: int,
                        memory_format: str = "contiguous") -> float:
    """Forward plus backward seconds of one iteration on ``b`` samples."""
    f, w = layer_times(model, dev, dtype, b, memory_format)
    return float(f.sum() + w.sum())


def quantized_bytes(fp32_bytes: float, bits: int) -> float:
    """Bytes on the wire of ``fp32_bytes`` of gradient sent with ``bits`` bits per value:
    ``packed_bytes(fp32_bytes / 4, bits)``, i.e. ``ceil(fp32_bytes * bits / 32) + 8`` below
    32 bits (rounded up to a whole byte), ``fp32_bytes`` at 32, 0 for nothing."""
    return float(packed_bytes_array(np.asarray(float(fp32_bytes)), bits))


def _pass_time(fp32_bytes: np.ndarray, bits: int, mem_bw: np.ndarray | float,
               per_value_s: np.ndarray | float = np.nan) -> np.ndarray:
    """Seconds to (de)quantize: ``fp32_bytes / 4 * per_value_s`` where a measured cost is
    given (not NaN), else one memory pass, (fp32 + packed) bytes over ``mem_bw``; 0 at
    32 bits and where nothing is sent."""
    fp32 = np.asarray(fp32_bytes, dtype=float)
    if bits >= 32:
        return np.zeros_like(fp32)
    passes = (fp32 + packed_bytes_array(fp32, bits)) / mem_bw
    measured = fp32 / 4.0 * np.nan_to_num(per_value_s)
    return np.where(fp32 > 0, np.where(np.isnan(per_value_s), passes, measured), 0.0)


def _per_value(dev: DeviceProfile, bits: int, side: str) -> float:
    v = dev.quant_s_per_value(bits, side) if bits < 32 else None
    return np.nan if v is None else v


def quantize_time_s(fp32_bytes: float, bits: int, dev: DeviceProfile) -> float:
    """Seconds the sender ``dev`` spends quantizing ``fp32_bytes`` of gradient to ``bits``:
    the profile's measured pack cost per value where it has one, else one pass reading
    fp32 and writing the packed bytes, ``(fp32 + packed) / mem_bw``; 0 at 32 bits."""
    return float(_pass_time(np.asarray(float(fp32_bytes)), bits, dev.mem_bw_Bps,
                            _per_value(dev, bits, "pack")))


def dequantize_time_s(fp32_bytes: float, bits: int, dev: DeviceProfile) -> float:
    """Seconds a PS shard ``dev`` spends dequantizing one arriving gradient of ``fp32_bytes``
    (fp32 size) sent at ``bits``: the measured unpack cost per value where the profile has
    one, else reading the packed bytes and writing fp32, ``(packed + fp32) / mem_bw``; 0 at
    32 bits."""
    return float(_pass_time(np.asarray(float(fp32_bytes)), bits, dev.mem_bw_Bps,
                            _per_value(dev, bits, "unpack")))


def shard_partition(model: Model, n_shards: int) -> np.ndarray:
    """Fraction of each layer's parameters held by each shard, shape (shards, layers).

    Dense parameters are laid end to end in layer order and cut into equal
    byte ranges (key-range partitioning); sparse tables are hash-partitioned,
    so each shard holds 1/S of every table and of its touched rows.
    """
    L = len(model.layers)
    frac = np.zeros((n_shards, L))
    dense_total = model.dense_param_bytes
    cut = dense_total / n_shards if dense_total > 0 else 0.0
    offset = 0.0
    for j, ly in enumerate(model.layers):
        if ly.sparse is not None:
            frac[:, j] = 1.0 / n_shards
            continue
        if ly.param_bytes <= 0:
            continue
        lo, hi = offset, offset + ly.param_bytes
        for s in range(n_shards):
            a, b = s * cut, (s + 1) * cut if s < n_shards - 1 else float("inf")
            overlap = min(hi, b) - max(lo, a)
            if overlap > 0:
                frac[s, j] = overlap / ly.param_bytes
        offset = hi
    return frac


@dataclass(frozen=True)
class PlanCosts:
    """Everything an evaluator needs about a data-parallel plan, as arrays.

    Work is cut into groups (compute) and chunks (messages). Without
    pipelining there is one group holding every layer and one chunk per
    shard; with pipelining a group per layer and a chunk per (layer, shard)
    piece, so a layer's gradient leaves as soon as its backward is done.

    Attributes:
        workers: device ids, plan order; ``batch`` their shares.
        fwd_s, bwd_s: (workers, groups) compute seconds at nominal speed.
        chunk_shard, chunk_group: (chunks,) owner shard and group of each chunk.
        pull_bytes, push_bytes: (workers, chunks) bytes on the wire per iteration.
        agg_s: (workers, chunks) shard seconds to aggregate one worker's gradient.
        apply_s: (chunks,) shard seconds to apply the update once all arrived (BSP).
        apply_one_s: (workers, chunks) shard seconds to apply one worker's update (ASP/SSP).
        worker_bw, shard_bw: NIC bytes/s; ``latency_s`` per message.
        quant_s: (workers, chunks) sender seconds quantizing each chunk, already
            included in ``bwd_s`` (summed into the chunk's group); zeros at 32 bits.
        dequant_s: (workers, chunks) shard seconds dequantizing each worker's chunk,
            already included in ``agg_s``; zeros at 32 bits.
    """

    workers: tuple[str, ...]
    batch: np.ndarray
    fwd_s: np.ndarray
    bwd_s: np.ndarray
    chunk_shard: np.ndarray
    chunk_group: np.ndarray
    pull_bytes: np.ndarray
    push_bytes: np.ndarray
    agg_s: np.ndarray
    apply_s: np.ndarray
    apply_one_s: np.ndarray
    worker_bw: np.ndarray
    shard_bw: np.ndarray
    latency_s: float
    shards: tuple[str, ...]
    quant_s: np.ndarray | None = field(default=None, compare=False)
    dequant_s: np.ndarray | None = field(default=None, compare=False)

    @property
    def n_groups(self) -> int:
        return int(self.fwd_s.shape[1])

    @property
    def n_chunks(self) -> int:
        return int(self.chunk_shard.shape[0])


def _distinct_layer_times(model: Model, dtype: str, workers: list[tuple[DeviceProfile, int]],
                          memory_format: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-layer forward and backward times once per distinct (device type, batch), cheap
    for 1e5 workers: each worker's index into the distinct rows, and the (distinct, L)
    forward and backward tables (indexed per worker only at the end)."""
    keys: dict[tuple[str, int], int] = {}
    uniq: list[tuple[np.ndarray, np.ndarray]] = []
    kidx_list = []
    for dt, b in workers:
        k = (dt.name, b)
        i = keys.get(k)
        if i is None:
            i = keys[k] = len(uniq)
            uniq.append(layer_times(model, dt, dtype, b, memory_format))
        kidx_list.append(i)
    return np.asarray(kidx_list), np.stack([u[0] for u in uniq]), np.stack([u[1] for u in uniq])


def _quant_times(fp32: np.ndarray, bits: int, worker_types: list[DeviceProfile],
                 shard_types: list[DeviceProfile], shard_mbw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Seconds each worker spends packing its chunks to ``bits`` and each chunk's shard
    spends unpacking them, (workers, chunks) each (zeros at 32 bits)."""
    worker_mbw = np.array([t.mem_bw_Bps for t in worker_types], dtype=float)
    worker_pv = np.array([_per_value(t, bits, "pack") for t in worker_types], dtype=float)
    shard_pv = np.array([_per_value(t, bits, "unpack") for t in shard_types], dtype=float)
    quant = _pass_time(fp32, bits, worker_mbw[:, None], worker_pv[:, None])
    dequant = _pass_time(fp32, bits, shard_mbw[None, :], shard_pv[None, :])
    return quant, dequant


def _sparse_touched(model: Model, sparse_cols: list[int], batch: np.ndarray) -> np.ndarray:
    """(workers, layers) bytes of each sparse table the workers' batches touch, capped at
    the table (0 in every dense layer's column)."""
    touch = np.zeros((len(batch), len(model.layers)))
    for j in sparse_cols:
        ly = model.layers[j]
        assert ly.sparse is not None
        touch[:, j] = np.minimum(ly.param_bytes, batch * ly.sparse.rows_per_sample * ly.sparse.row_bytes)
    return touch


def plan_costs(problem: Problem, plan: Plan) -> PlanCosts:
    """Build the :class:`PlanCosts` of a single-stage (data-parallel) plan."""
    if len(plan.stages) != 1:
        raise ConfigError("<plan>", "stages", "multi-stage (layer placement) plans are not supported "
                          "by this evaluator yet; give a single data-parallel stage")
    job, model, cl = problem.job, problem.job.model, problem.cluster
    reps = plan.stages[0].replicas
    shards = [cl.device(s) for s in plan.ps_shards]
    S, L, N = len(shards), len(model.layers), len(reps)
    devs = [cl.device(r.device) for r in reps]
    batch = np.array([r.batch for r in reps], dtype=float)

    kidx, fwd_u, bwd_u = _distinct_layer_times(model, job.dtype, [(d.type, r.batch) for r, d in zip(reps, devs)],
                                                 job.memory_format)
    frac = shard_partition(model, S)  # (S, L)
    dense = np.array([0.0 if ly.sparse else ly.param_bytes for ly in model.layers])
    sparse_cols = [j for j, ly in enumerate(model.layers) if ly.sparse is not None]
    if job.pipeline:
        has = (frac > 0) & ((dense > 0) | np.isin(np.arange(L), sparse_cols))[None, :]
        pairs = [(s, j) for j in range(L) for s in range(S) if has[s, j]]
        chunk_shard = np.array([s for s, _ in pairs], dtype=int)
        chunk_group = np.array([j for _, j in pairs], dtype=int)
        fwd_s, bwd_s = fwd_u[kidx], bwd_u[kidx]
        dense_chunk = np.array([frac[s, j] * dense[j] for s, j in pairs])
        # layer -> chunk incidence, weighted by the shard's fraction
        M = np.zeros((L, len(pairs)))
        for c_, (s, j) in enumerate(pairs):
            M[j, c_] = frac[s, j]
    else:
        chunk_shard = np.arange(S, dtype=int)
        chunk_group = np.zeros(S, dtype=int)
        fwd_s = fwd_u.sum(axis=1, keepdims=True)[kidx]
        bwd_s = bwd_u.sum(axis=1, keepdims=True)[kidx]
        dense_chunk = (frac * dense[None, :]).sum(axis=1)
        M = frac.T.copy()
    # fp32 bytes each worker exchanges per chunk: the dense part is the same for
    # everyone; sparse tables move only the rows this worker's batch touches.
    fp32 = np.repeat(dense_chunk[None, :], N, axis=0)
    if sparse_cols:
        fp32 = fp32 + _sparse_touched(model, sparse_cols, batch) @ M
    if not job.pipeline:  # shards holding nothing exchange nothing
        keep = np.flatnonzero(fp32.max(axis=0) > 0)
        chunk_shard, chunk_group, dense_chunk, fp32 = chunk_shard[keep], chunk_group[keep], dense_chunk[keep], fp32[:, keep]

    bits = job.quant_bits
    push = fp32 if bits >= 32 else packed_bytes_array(fp32, bits)
    shard_mbw = np.array([shards[s].type.mem_bw_Bps for s in chunk_shard]) if len(chunk_shard) else np.zeros(0)
    agg = AGG_PASSES * fp32 / shard_mbw[None, :] if fp32.size else fp32
    quant, dequant = _quant_times(fp32, bits, [d.type for d in devs], [shards[s].type for s in chunk_shard],
                                  shard_mbw)
    if bits < 32 and fp32.size:
        # the sender's pack pass joins the backward of the group producing the chunk
        onehot = np.zeros((len(chunk_group), bwd_s.shape[1]))
        onehot[np.arange(len(chunk_group)), chunk_group] = 1.0
        bwd_s = bwd_s + quant @ onehot
        agg = agg + dequant
    sparse_chunk = fp32.sum(axis=0) - N * dense_chunk if fp32.size else np.zeros(0)
    apply_s = APPLY_PASSES * (dense_chunk + sparse_chunk) / shard_mbw if fp32.size else np.zeros(0)
    apply_one = APPLY_PASSES * fp32 / shard_mbw[None, :] if fp32.size else fp32
    for a in (batch, fwd_s, bwd_s, fp32, push, agg, apply_s, apply_one, quant, dequant):
        a.flags.writeable = False
    return PlanCosts(
        workers=tuple(r.device for r in reps),
        batch=batch,
        fwd_s=np.ascontiguousarray(fwd_s),
        bwd_s=np.ascontiguousarray(bwd_s),
        chunk_shard=chunk_shard,
        chunk_group=chunk_group,
        pull_bytes=fp32,
        push_bytes=push,
        agg_s=agg,
        apply_s=apply_s,
        apply_one_s=apply_one,
        worker_bw=np.array([d.nic_bw_Bps for d in devs]),
        shard_bw=np.array([s.nic_bw_Bps for s in shards]),
        latency_s=cl.network.latency_s,
        shards=tuple(plan.ps_shards),
        quant_s=quant,
        dequant_s=dequant,
    )


def fixed_memory_bytes(model: Model, optimizer_state_copies: int = 1) -> float:
    """Bytes a training worker holds whatever its batch: parameters, their
    gradients and ``optimizer_state_copies`` copies of optimizer state (1 for
    momentum SGD, 2 for Adam): ``param_bytes * (2 + copies)``."""
    if optimizer_state_copies < 0:
        raise ValueError("optimizer_state_copies must be >= 0")
    return model.param_bytes * (2 + optimizer_state_copies)


def activation_memory_per_sample_bytes(model: Model, dtype: str = "fp32") -> float:
    """Bytes of activations one sample keeps for the backward pass: training
    keeps every layer's output, so the sum of ``activation_bytes`` over layers,
    scaled by the compute dtype (fp16/bf16 halve it)."""
    return sum(ly.activation_bytes for ly in model.layers) * _ACT_SCALE.get(dtype, 1.0)


def max_batch_in_memory(model: Model, dtype: str, free_memory_bytes: float,
                        optimizer_state_copies: int = 1) -> int | None:
    """The most samples a worker with ``free_memory_bytes`` can train on:
    ``floor((free - fixed) / per_sample)``, at least 0; None when a sample needs
    no activation memory (no cap from memory)."""
    per = activation_memory_per_sample_bytes(model, dtype)
    room = free_memory_bytes - fixed_memory_bytes(model, optimizer_state_copies)
    if per <= 0:
        return None if room >= 0 else 0
    return max(0, int(np.floor(room / per)))


#: fp32 memory passes over the parameters of one optimizer step, per optimizer (read
#: and write of the weights, their gradient and the optimizer's state): SGD reads the
#: weight and gradient and writes the weight; momentum also reads and writes its
#: buffer; Adam two buffers.
OPTIMIZER_PASSES = {"sgd": 3.0, "momentum": 5.0, "adam": 7.0}
#: Mixed precision's passes per step beyond the optimizer's: the half-precision copies
#: of the weights (read fp32, write half: 1.5) and the gradient scaler's unscale and
#: finiteness check of the gradients (read and write: 2).
AMP_STEP_PASSES = 3.5


def optimizer_step_s(model: Model, dev: DeviceProfile, dtype: str = "fp32", optimizer: str = "momentum"
                     ) -> float:
    """Seconds of one optimizer step on the worker (data-parallel training without a
    parameter server): ``passes * param_bytes / (mem_bw * mem_eff)``, with
    :data:`OPTIMIZER_PASSES` of ``optimizer`` plus :data:`AMP_STEP_PASSES` under mixed
    precision, at the bandwidth of an elementwise pass over the parameters (fused
    optimizers: a handful of launches, not counted)."""
    if optimizer not in OPTIMIZER_PASSES:
        raise ValueError(f"unknown optimizer {optimizer!r} (known: {', '.join(OPTIMIZER_PASSES)})")
    passes = OPTIMIZER_PASSES[optimizer] + (AMP_STEP_PASSES if dtype in HALF else 0.0)
    nbytes = model.param_bytes
    return passes * nbytes / (dev.mem_bw_Bps * dev.mem_eff("elementwise", nbytes))


def training_step_s(model: Model, dev: DeviceProfile, dtype: str, b: int, memory_format: str = "contiguous",
                    optimizer: str = "momentum") -> float:
    """Seconds of one training step of ``model`` on ``b`` samples on one device: forward
    and backward (:func:`iteration_compute_s`) plus the optimizer step
    (:func:`optimizer_step_s`)."""
    return (iteration_compute_s(model, dev, dtype, b, memory_format)
            + optimizer_step_s(model, dev, dtype, optimizer))
