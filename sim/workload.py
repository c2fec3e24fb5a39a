"""Workloads: layers and models as the simulator sees them.

A :class:`Model` is an ordered chain of :class:`Layer` records carrying the
per-sample work of each layer (FLOPs, bytes), which is all the cost model
needs. Models come from three places, all producing the same type:

* the built-in zoo (``sim.zoo``): layer lists extracted once from real torch
  modules and shipped as YAML, so simulating never needs torch;
* a layer-list YAML file written by a user (format in ARCHITECTURE.md);
* any ``torch.nn.Module`` through :func:`sim.torch_extract.from_torch`.

:func:`sim.model_specs.resolve_model` turns a config's ``job.model`` into a Model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from hardware_profiles.errors import ConfigError
from hardware_profiles.fileio import atomic_write
from sim.config import read_yaml

OpClass = Literal["gemm", "conv", "embedding", "elementwise", "attention"]
OP_CLASSES: tuple[str, ...] = ("gemm", "conv", "embedding", "elementwise", "attention")


@dataclass(frozen=True)
class Sparse:
    """Sparse-access description of an embedding table.

    Attributes:
        rows_per_sample: table rows read (forward) and updated (backward) per sample.
        row_bytes: bytes of one row.
    """

    rows_per_sample: float
    row_bytes: float


@dataclass(frozen=True)
class Layer:
    """One layer's per-sample work.

    Attributes:
        name: unique within its model.
        op: op class; selects the device efficiency curve.
        fwd_flops: forward FLOPs per sample (multiply-add = 2 FLOPs).
        bwd_flops: backward FLOPs per sample (input and weight gradients).
        param_bytes: bytes of trainable parameters (fp32 master copy).
        activation_bytes: bytes of the layer's output per sample.
        sparse: set for embedding tables of which only touched rows travel.
        kernels: kernel launches of one forward pass (backward counts twice).
        inplace: the forward overwrites its input instead of writing a new tensor
            (``nn.ReLU(inplace=True)``): an in-place and an out-of-place pass over
            the same bytes are different kernels and autograd paths, timed apart
            by calibration (its own bandwidth curve, ``elementwise/k1i``).
        window: input elements each output element is computed from, for a
            pooling layer (its kernel's area: 9 for ``nn.MaxPool2d(3)``); 1 for
            any other layer. A pooling forward costs ``window + 2`` operations per
            output element (:func:`sim.costmodel.pool_ops`): a 3x3 and a 2x2 pool
            over equal bytes are different amounts of work.
        autocast_fp32: under mixed precision (``job.dtype`` fp16 or bf16) the layer
            runs in fp32, as ``torch.autocast`` runs the ops of its fp32 list
            (softmax, layer and group norm, losses, reductions): it reads and
            writes 4-byte elements where its neighbours use 2. Only set for layers
            without FLOPs; it does not change the layer's signature.
    """

    name: str
    op: OpClass
    fwd_flops: float
    bwd_flops: float
    param_bytes: float
    activation_bytes: float
    sparse: Sparse | None = None
    kernels: int = 1
    inplace: bool = False
    window: int = 1
    autocast_fp32: bool = False

    @property
    def signature(self) -> str:
        """The layer's work as a key for measured per-layer tables (with ``:r`` added for a
        layer whose output is smaller than its input: :func:`sim.costmodel.table_key`):
        identical keys cost the same. An in-place layer's ends in ``:i`` (it runs another
        kernel than an out-of-place one of equal work), a pooling layer's in ``:wN`` (its
        window). The forward kernel count is not in it."""
        sp = f":{self.sparse.rows_per_sample:g}x{self.sparse.row_bytes:g}" if self.sparse else ""
        return (
            f"{self.op}:{self.fwd_flops:.6g}:{self.bwd_flops:.6g}:"
            f"{self.param_bytes:.6g}:{self.activation_bytes:.6g}{sp}{':i' if self.inplace else ''}"
            f"{f':w{self.window}' if self.window != 1 else ''}"
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.sparse is None:
            del d["sparse"]
        if self.kernels == 1:
            del d["kernels"]
        if not self.inplace:
            del d["inplace"]
        if self.window == 1:
            del d["window"]
        if not self.autocast_fp32:
            del d["autocast_fp32"]
        return d


@dataclass(frozen=True)
class Model:
    """An ordered chain of layers.

    Attributes:
        name: model name.
        layers: layers in forward order.
        input_bytes: bytes of one input sample (read by the first layer).
    """

    name: str
    layers: tuple[Layer, ...]
    input_bytes: float = 0.0
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError(f"model {self.name!r} has no layers")
        names = [ly.name for ly in self.layers]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"model {self.name!r}: duplicate layer name {dup!r}")

    @property
    def param_bytes(self) -> float:
        return float(sum(ly.param_bytes for ly in self.layers))

    @property
    def dense_param_bytes(self) -> float:
        return float(sum(ly.param_bytes for ly in self.layers if ly.sparse is None))

    @property
    def fwd_flops(self) -> float:
        return float(sum(ly.fwd_flops for ly in self.layers))

    @property
    def bwd_flops(self) -> float:
        return float(sum(ly.bwd_flops for ly in self.layers))

    def input_bytes_of(self, i: int) -> float:
        """Per-sample bytes entering layer ``i`` (the previous layer's output)."""
        return self.input_bytes if i == 0 else self.layers[i - 1].activation_bytes

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name}
        if self.input_bytes:
            d["input_bytes"] = self.input_bytes
        d["layers"] = [ly.to_dict() for ly in self.layers]
        return d


_LAYER_KEYS = {
    "name", "op", "fwd_flops", "bwd_flops", "param_bytes", "activation_bytes", "sparse", "kernels", "inplace", "autocast_fp32",
    "window",
}


def model_from_dict(d: Any, source: str = "<model>") -> Model:
    """Build a :class:`Model` from a layer-list mapping, with one-line errors.

    Raises:
        ConfigError: naming ``source`` and the offending field.
    """
    if not isinstance(d, Mapping):
        raise ConfigError(source, "", "a model file must be a mapping with 'name' and 'layers'")
    unknown = set(d) - {"name", "layers", "input_bytes"}
    if unknown:
        raise ConfigError(source, sorted(unknown)[0], "unknown field")
    raw_layers = d.get("layers")
    if not isinstance(raw_layers, Sequence) or isinstance(raw_layers, str) or not raw_layers:
        raise ConfigError(source, "layers", "must be a non-empty list of layers")
    layers: list[Layer] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_layers):
        where = f"layers[{i}]"
        if not isinstance(raw, Mapping):
            raise ConfigError(source, where, "each layer must be a mapping")
        bad = set(raw) - _LAYER_KEYS
        if bad:
            raise ConfigError(source, f"{where}.{sorted(bad)[0]}", "unknown field")
        for key in ("name", "op", "fwd_flops", "bwd_flops", "param_bytes", "activation_bytes"):
            if key not in raw:
                raise ConfigError(source, f"{where}.{key}", "missing required field")
        name = str(raw["name"])
        if name in seen:
            raise ConfigError(source, f"{where}.name", f"duplicate layer name {name!r}")
        seen.add(name)
        if raw["op"] not in OP_CLASSES:
            raise ConfigError(
                source, f"{where}.op", f"{raw['op']!r} is not one of {', '.join(OP_CLASSES)}"
            )
        nums: dict[str, float] = {}
        for key in ("fwd_flops", "bwd_flops", "param_bytes", "activation_bytes"):
            nums[key] = _nonneg(raw[key], source, f"{where}.{key}")
        sparse = None
        if raw.get("sparse") is not None:
            sp = raw["sparse"]
            if not isinstance(sp, Mapping) or set(sp) != {"rows_per_sample", "row_bytes"}:
                raise ConfigError(
                    source, f"{where}.sparse", "must be {rows_per_sample: N, row_bytes: N}"
                )
            sparse = Sparse(
                rows_per_sample=_nonneg(sp["rows_per_sample"], source, f"{where}.sparse.rows_per_sample"),
                row_bytes=_positive(sp["row_bytes"], source, f"{where}.sparse.row_bytes"),
            )
        kernels = raw.get("kernels", 1)
        if not isinstance(kernels, int) or isinstance(kernels, bool) or kernels < 0:
            raise ConfigError(source, f"{where}.kernels", "must be a non-negative integer")
        inplace = raw.get("inplace", False)
        if not isinstance(inplace, bool):
            raise ConfigError(source, f"{where}.inplace", "must be true or false")
        autocast_fp32 = raw.get("autocast_fp32", False)
        if not isinstance(autocast_fp32, bool):
            raise ConfigError(source, f"{where}.autocast_fp32", "must be true or false")
        window = raw.get("window", 1)
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ConfigError(source, f"{where}.window", "must be a positive integer")
        layers.append(Layer(name=name, op=raw["op"], sparse=sparse, kernels=kernels, inplace=inplace,
                            window=window, autocast_fp32=autocast_fp32, **nums))
    input_bytes = _nonneg(d.get("input_bytes", 0.0), source, "input_bytes")
    return Model(name=str(d.get("name", Path(source).stem)), layers=tuple(layers), input_bytes=input_bytes)


#: the largest per-sample quantity (FLOPs, bytes) a layer may have: far above any real
#: layer (about 1e13), low enough that the cost model's products (per sample x batch x
#: iterations) stay finite floating-point numbers
MAX_QUANTITY = 1e18


def _nonneg(v: Any, source: str, field_: str) -> float:
    if isinstance(v, bool):
        raise ConfigError(source, field_, "must be a number")
    try:
        x = float(v)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(source, field_, f"must be a number, got {v!r}") from None
    if not x >= 0 or x == float("inf"):
        raise ConfigError(source, field_, f"must be a finite number >= 0, got {v!r}")
    if x > MAX_QUANTITY:
        raise ConfigError(source, field_, f"{v!r} is beyond {MAX_QUANTITY:g}, the most one layer "
                          "may have per sample")
    return x


def _positive(v: Any, source: str, field_: str) -> float:
    x = _nonneg(v, source, field_)
    if x <= 0:
        raise ConfigError(source, field_, f"must be > 0, got {v!r}")
    return x


def load_model_file(path: str | Path) -> Model:
    """Read a layer-list YAML file (see ARCHITECTURE.md, "Layer-list model file"): a model
    to train, so at least one layer must have parameters (single-layer benchmarks built
    with :func:`model_from_dict` need not)."""
    p = Path(path)
    model = model_from_dict(read_yaml(p), str(p))
    if not any(layer.param_bytes > 0 for layer in model.layers):
        raise ConfigError(str(p), "layers", "no layer has parameters (every param_bytes is 0): "
                          "nothing to train or synchronise")
    return model


def save_model_file(model: Model, path: str | Path) -> None:
    atomic_write(path, yaml.safe_dump(model.to_dict(), sort_keys=False))
