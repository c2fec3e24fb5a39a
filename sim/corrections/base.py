"""What every correction shares: the pass it prices (:class:`PassContext`), the
:class:`Correction` base class with its three hooks, and the per-kind table lookup.

A correction changes the cost model's price of one pass beyond the roofline
(:func:`sim.costmodel.pass_time_s`)::

    ctx  = the pass's work                       (sim.costmodel.pass_context)
    ctx  = c.work(ctx)    for c in corrections   what the pass moves (bytes, ...)
    ctx  = roofline terms of ctx                 compute_s, memory_s, eff_key
    ctx  = c.terms(ctx)   for c in corrections   the roofline's compute / memory seconds
    time = launch_overhead_s * kernels + max(ctx.compute_s, ctx.memory_s)
         + sum(c.extra_s(ctx) for c in corrections)

A correction overrides the hooks it needs; the others leave the pass as it is
(``work``, ``terms``) or add nothing (``extra_s``). Corrections apply in the
registry's order (:data:`sim.corrections.REGISTRY`), which also fixes the order in
which the extra seconds are summed (floating-point sums depend on it).

A correction that changes what the roofline prices (``work``, ``terms``) adds, in
effect, the roofline of the changed pass less that of the plain one; it is applied as
a change of the pass rather than as that difference because the difference of two
rounded roofline times, added back, is not always the changed pass's time to the last
bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

from hardware_profiles.base import mem_key
from sim.workload import Layer

T = TypeVar("T")


@dataclass(frozen=True)
class PassContext:
    """One pass (a layer's forward or backward on a batch, or a measured point) as
    the roofline and the corrections read it.

    Work: ``flops``, ``kernels`` (kernel launches of the pass), ``nbytes`` (bytes it
    moves). Layer: ``layer`` (the record; None for a measured point that has none),
    ``input_bytes`` (its input per sample), ``weight_bytes`` (the parameter bytes the
    pass reads: the whole layer, or a sparse table's touched rows), ``act_scale`` and
    ``in_scale`` (bytes of a value of its output and of its input relative to fp32:
    :func:`sim.precision.activation_scales`), ``out_bytes``
    (bytes of the pass's output, ``batch * act_scale * activation_bytes``), ``rows``
    (rows of a sparse table looked up, else 0), ``kind`` (compute kind,
    :func:`sim.costmodel.compute_kind`), and the layer kind of ``mem_efficiency``
    keys (:attr:`kind_keys`): ``layer_kernels`` (its forward kernels; None: the op
    class alone), ``has_params``, ``reduces``, ``inplace``. ``call``: the pass is a
    layer's call (False: a bare kernel, as the calibration's GEMM grid times).
    ``streamed_bytes``: what the passes before it moved (the window of the correction
    that reads it, :attr:`Correction.streamed_window`). Roofline (set by
    :func:`sim.costmodel.pass_time_s` before ``terms``): ``compute_s``, ``memory_s``,
    ``eff_key`` (the efficiency entry ``compute_s`` used, None: none, 1.0) and ``mode``
    (the math mode its FLOPs ran in, :func:`sim.precision.pass_mode`).
    ``memory_format``: the job's layout of 4-D activations (``contiguous`` or
    ``channels_last``).
    """

    op: str
    phase: str
    flops: float
    kernels: int
    nbytes: float
    dtype: str = "fp32"
    batch: float = 0.0
    layer: Layer | None = None
    input_bytes: float = 0.0
    weight_bytes: float = 0.0
    act_scale: float = 1.0
    in_scale: float = 1.0
    out_bytes: float = 0.0
    rows: float = 0.0
    kind: str | None = None
    layer_kernels: int | None = None
    has_params: bool = False
    reduces: bool = False
    inplace: bool = False
    call: bool = True
    streamed_bytes: float = 0.0
    compute_s: float = 0.0
    memory_s: float = 0.0
    eff_key: str | None = None
    memory_format: str = "contiguous"
    mode: str = "fp32"

    def replace(self, **changes: Any) -> PassContext:
        """A copy with ``changes`` (fields by name): :func:`dataclasses.replace` without
        running ``__init__`` again, which the cost model's inner loop would feel."""
        new = object.__new__(PassContext)
        new.__dict__.update(self.__dict__)
        for k in changes:
            if k not in _FIELDS:
                raise TypeError(f"PassContext has no field {k!r}")
        new.__dict__.update(changes)
        return new

    @property
    def kind_keys(self) -> tuple[str, ...]:
        """Keys of the pass's entry in a per-kind table, most specific first: its layer
        kind (:func:`hardware_profiles.base.mem_key`) and its op class, or the op class
        alone without ``layer_kernels``."""
        if self.layer_kernels is None:
            return (self.op,)
        return (mem_key(self.op, self.layer_kernels, self.has_params, self.reduces, self.inplace), self.op)


_FIELDS = frozenset(f.name for f in fields(PassContext))


def of_phase(fwd: T, bwd: T, phase: str) -> T:
    """``bwd`` for a backward pass (``phase == "bwd"``), else ``fwd``: a correction's
    parameter of that phase."""
    return bwd if phase == "bwd" else fwd


def backward_layer(ctx: PassContext) -> Layer | None:
    """The layer record of a backward pass, None for a forward pass or a pass without
    one (a measured point): what a byte-accounting correction of the backward reads."""
    return ctx.layer if ctx.phase == "bwd" else None


def per_kind(table: Mapping[str, float] | None, keys: tuple[str, ...]) -> float:
    """``table``'s entry of the first of ``keys`` it has (a layer kind, then its op
    class: :attr:`PassContext.kind_keys`), else 0."""
    if not table:
        return 0.0
    for k in keys:
        if k in table:
            return float(table[k])
    return 0.0


class Correction:
    """A change of the cost model's price of a pass beyond the roofline.

    A subclass is a frozen dataclass holding its parameters (``params``: the model of
    :mod:`hardware_profiles.corrections` that the profile's ``corrections.<name>``
    holds), names itself (``name``: that key, and its module in ``sim.corrections``)
    and overrides the hooks it needs:

    - :meth:`work`: the pass as it is moved (its bytes, kernels, FLOPs);
    - :meth:`terms`: the roofline's compute and memory seconds of the pass;
    - :meth:`extra_s`: seconds added beside the roofline.

    :attr:`streamed_window`: how many passes before a pass :meth:`extra_s` reads the
    bytes of (``ctx.streamed_bytes``), 0 for none.
    """

    name: ClassVar[str]

    @property
    def streamed_window(self) -> int:
        return 0

    def work(self, ctx: PassContext) -> PassContext:
        """The pass as this correction says it is moved (default: unchanged)."""
        return ctx

    def terms(self, ctx: PassContext) -> PassContext:
        """The pass with this correction's roofline terms (default: unchanged)."""
        return ctx

    def extra_s(self, ctx: PassContext) -> float:
        """Seconds this correction adds to the pass beside the roofline (default: 0)."""
        return 0.0
