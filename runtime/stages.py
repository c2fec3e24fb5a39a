"""Multi-stage (layer-placement) plans: cutting a zoo module into stages, and the
per-iteration work of one stage replica (micro-batches, routing, 1F1B order).

**Layers and blocks.** A plan's stage is a range of the simulator's layer list
(:func:`sim.torch_extract.from_torch` of the zoo module: one layer per leaf
module call, named by its module path). The runtime cuts the real module into
*blocks*, pieces whose composition in order is the module's forward
(:func:`blocks`); every layer belongs to the block whose module path prefixes
its name, so a stage boundary maps onto the module only where it falls
between two blocks:

* ``mlp``: every child of the ``nn.Sequential`` (``0``, ``1``, ...).
* ``resnet18`` / ``resnet50``: ``conv1``, ``bn1``, ``relu``, ``maxpool``, each
  residual block ``layerK.J`` (its convolutions, norms and shortcut are one
  block: the shortcut needs the block's input), ``avgpool`` (with the flatten),
  ``fc``.
* ``vgg16``: every child of ``features``, ``avgpool`` (with the flatten), every
  child of ``classifier``.
* ``ctr_dnn``: all embedding tables with the concatenation (``emb``), then
  every child of ``mlp``.
* ``wide_deep``: the wide table and the deep tables (``wide+emb``), then every
  child of ``deep``; the wide logit rides along and is added by the last one.
* ``transformer``: token embedding with positions and dropout (``tok``, the
  layers ``tok`` and ``drop``), each ``encoder.layers.K``, ``encoder.norm``,
  ``head``.

Activations between blocks are tuples of tensors. A plan whose boundary falls
inside a block is refused (:func:`stage_blocks`).

**Samples and micro-batches.** An iteration's global batch ``B`` is split into
``M`` micro-batches of consecutive samples (sizes differ by at most one).
Replica ``r`` of a stage holds samples ``[first_r, first_r + b_r)`` (the plan's
shares in replica order, as in sim/des/pipeline.py); its *chunk* of micro-batch
``m`` is the intersection of the two ranges. Boundary tensors go from each
replica of stage ``s`` to each replica of stage ``s + 1`` whose chunk of the
same micro-batch overlaps (forward: activations; backward: their gradients);
the first stage's replicas send the targets of those samples straight to the
last stage's. Every receiver knows what to expect from the ranges alone.

**Order.** Each replica runs 1F1B: ``S - 1 - s`` forwards, then a forward and
a backward alternately, then the remaining backwards, skipping micro-batches
whose chunk is empty. Filtered this way every replica's order is a
subsequence of one valid single-replica 1F1B schedule, and sends are
non-blocking, so the stages cannot deadlock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hardware_profiles.errors import ConfigError

Acts = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Block:
    """A piece of the module: ``fn`` maps the activations before it to those after it."""

    name: str
    prefixes: tuple[str, ...]  # module paths whose layers it holds
    modules: tuple[nn.Module, ...]  # whose parameters it holds
    fn: Callable[[Acts], Acts]


def _one(name: str, m: nn.Module, fn: Callable[[torch.Tensor], torch.Tensor] | None = None) -> Block:
    f = fn or m
    return Block(name, (name,), (m,), lambda a: (f(a[0]),))


def _children(prefix: str, seq: nn.Module) -> list[Block]:
    return [_one(f"{prefix}{n}", c) for n, c in seq.named_children()]


def _flat_pool(name: str, pool: nn.Module) -> Block:
    return _one(name, pool, lambda x: torch.flatten(pool(x), 1))


def blocks(model: str, m: Any) -> list[Block]:
    """The blocks of zoo module ``m`` (built by :func:`sim.zoo.torch_module`), in forward order.

    Raises:
        KeyError: a model without a block table.
    """
    if model == "mlp":
        return _children("", m)
    if model in ("resnet18", "resnet50"):
        out = [_one("conv1", m.conv1), _one("bn1", m.bn1), _one("relu", m.relu), _one("maxpool", m.maxpool)]
        for k in range(1, 5):
            out += _children(f"layer{k}.", getattr(m, f"layer{k}"))
        return [*out, _flat_pool("avgpool", m.avgpool), _one("fc", m.fc)]
    if model == "vgg16":
        return [*_children("features.", m.features), _flat_pool("avgpool", m.avgpool),
                *_children("classifier.", m.classifier)]
    if model == "ctr_dnn":
        def emb(a: Acts) -> Acts:
            ids, dense = a
            return (torch.cat([*(e(ids[:, i]) for i, e in enumerate(m.emb)), dense], dim=1),)
        return [Block("emb", ("emb",), (m.emb,), emb), *_children("mlp.", m.mlp)]
    if model == "wide_deep":
        def wide_emb(a: Acts) -> Acts:
            ids, dense = a
            wide = m.wide(ids + m.offsets)
            return wide, torch.cat([*(e(ids[:, i]) for i, e in enumerate(m.emb)), dense], dim=1)
        deep = list(m.deep.named_children())
        out = [Block("wide+emb", ("wide", "emb"), (m.wide, m.emb), wide_emb)]
        def carry(c: nn.Module, last: bool) -> Callable[[Acts], Acts]:
            # the wide logit rides along; the last deep block adds it as WideDeep.forward does
            if last:
                return lambda a: (a[0] + c(a[1]),)
            return lambda a: (a[0], c(a[1]))

        for i, (n, c) in enumerate(deep):
            out.append(Block(f"deep.{n}", (f"deep.{n}",), (c,), carry(c, i == len(deep) - 1)))
        return out
    if model == "transformer":
        def tok(a: Acts) -> Acts:
            ids = a[0]
            return (m.drop(m.tok(ids) * m.scale + m.pos[: ids.shape[1]]),)
        out = [Block("tok", ("tok", "drop"), (m.tok,), tok)]
        out += _children("encoder.layers.", m.encoder.layers)
        return [*out, _one("encoder.norm", m.encoder.norm), _one("head", m.head)]
    raise KeyError(model)


def owner(layer: str, bs: Sequence[Block]) -> int:
    """Index of the block holding layer ``layer`` (a module path, maybe with ``#k``)."""
    for i, b in enumerate(bs):
        for p in b.prefixes:
            if layer == p or layer.startswith(p + ".") or layer.startswith(p + "#"):
                return i
    raise KeyError(layer)


def stage_blocks(model: str, module: Any, layers: Sequence[str], cuts: Sequence[tuple[int, int]],
                 source: str) -> list[tuple[int, int]]:
    """The block range ``[a, b)`` of each stage's layer range ``cuts[i]``.

    Raises:
        ConfigError: a model without a block table (field ``job.model``), or a
            boundary inside a block (field ``stages[i].layers``).
    """
    try:
        bs = blocks(model, module)
    except KeyError:
        raise ConfigError(source, "job.model", f"multi-stage plans are not built for {model!r}") from None
    of = [owner(n, bs) for n in layers]
    if of != sorted(of) or sorted(set(of)) != list(range(len(bs))):
        raise AssertionError(f"the block table of {model} does not follow its layer list")  # a bug here
    out = []
    for i, (a, b) in enumerate(cuts):
        if a > 0 and of[a] == of[a - 1]:
            blk = bs[of[a]].name
            raise ConfigError(source, f"stages[{i}].layers",
                              f"the boundary at layer {a} ({layers[a]!r}) falls inside {blk!r}, which "
                              f"the runtime cannot split (cut before {layers[of.index(of[a])]!r} or "
                              f"after the block)")
        out.append((of[a], of[b - 1] + 1))
    return out


def stage_params(module: nn.Module, bs: Sequence[Block]) -> list[int]:
    """Indices in ``module.parameters()`` of the parameters of blocks ``bs``, ascending."""
    mine = {id(p) for b in bs for mod in b.modules for p in mod.parameters()}
    return [i for i, p in enumerate(module.parameters()) if id(p) in mine]


def run_blocks(bs: Sequence[Block], a: Acts) -> Acts:
    for b in bs:
        a = b.fn(a)
    return a


def even_split(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` consecutive sizes, the first ``total % parts`` one larger."""
    return [total // parts + (1 if k < total % parts else 0) for k in range(parts)]


def starts(sizes: Sequence[int]) -> list[int]:
    out, acc = [], 0
    for n in sizes:
        out.append(acc)
        acc += n
    return out


def ranges(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive ``[lo, hi)`` ranges of the given sizes from 0."""
    return [(a, a + n) for a, n in zip(starts(sizes), sizes)]


def overlap(x: tuple[int, int], y: tuple[int, int]) -> tuple[int, int] | None:
    lo, hi = max(x[0], y[0]), min(x[1], y[1])
    return (lo, hi) if lo < hi else None


def one_f_one_b(stage: int, n_stages: int, micro: Sequence[int]) -> list[tuple[str, int]]:
    """1F1B order of the micro-batches ``micro`` (ascending) on ``stage``: ``("F", m)`` / ``("B", m)``."""
    warm = min(n_stages - 1 - stage, len(micro))
    ops = [("F", m) for m in micro[:warm]]
    f = warm
    for b in range(len(micro)):
        if f < len(micro):
            ops.append(("F", micro[f]))
            f += 1
        ops.append(("B", micro[b]))
    return ops


@dataclass(frozen=True)
class BoundarySpec:
    """Per-sample shape and dtype of each tensor crossing one stage boundary."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]

    def nbytes(self, n: int) -> int:
        return sum(n * _numel(s) * torch.empty((), dtype=getattr(torch, d)).element_size()
                   for s, d in zip(self.shapes, self.dtypes))


def _numel(shape: tuple[int, ...]) -> int:
    k = 1
    for d in shape:
        k *= d
    return k


def probe_boundaries(model: str, module: nn.Module, example: Any, cuts: Sequence[tuple[int, int]]
                     ) -> list[BoundarySpec]:
    """The tensors after each stage but the last (eval mode, no grad: BatchNorm statistics stay)."""
    bs = blocks(model, module)
    a: Acts = tuple(example) if isinstance(example, tuple) else (example,)
    out = []
    was = module.training
    module.eval()
    try:
        with torch.no_grad():
            for lo, hi in cuts[:-1]:
                a = run_blocks(bs[lo:hi], a)
                out.append(BoundarySpec(tuple(tuple(t.shape[1:]) for t in a),
                                        tuple(str(t.dtype).removeprefix("torch.") for t in a)))
    finally:
        module.train(was)
    return out


def encode(ts: Acts) -> torch.Tensor:
    """Tensors as one uint8 payload (each contiguous, in order)."""
    return torch.cat([t.detach().cpu().contiguous().reshape(-1).view(torch.uint8) for t in ts])


def decode(buf: torch.Tensor, spec: BoundarySpec, n: int) -> Acts:
    """The ``n``-sample tensors of ``spec`` out of ``encode``'s payload."""
    out, off = [], 0
    for shape, dt in zip(spec.shapes, spec.dtypes):
        dtype = getattr(torch, dt)
        k = n * _numel(shape) * torch.empty((), dtype=dtype).element_size()
        # clone first: a view of another dtype needs an aligned start
        out.append(buf[off:off + k].clone().view(dtype).reshape(n, *shape))
        off += k
    if off != buf.numel():
        raise RuntimeError(f"boundary payload of {buf.numel()} bytes, {off} expected")
    return tuple(out)


def sparse_tables(model: str, module: nn.Module) -> dict[int, int]:
    """Embedding tables read by row from the model's input ids: index in
    ``module.parameters()`` -> row length (ctr_dnn, wide_deep; empty for the rest)."""
    if model not in ("ctr_dnn", "wide_deep"):
        return {}
    m: Any = module
    tables = [*([m.wide] if model == "wide_deep" else []), *m.emb]
    index = {id(p): i for i, p in enumerate(module.parameters())}
    return {index[id(t.weight)]: int(t.embedding_dim) for t in tables}


def touched_rows(model: str, module: nn.Module, x: Acts) -> dict[int, torch.Tensor]:
    """The rows of each :func:`sparse_tables` table that the input ``x`` (ids, dense) reads:
    index in ``module.parameters()`` -> sorted unique row ids (int64, on the CPU: they go
    over gloo in the pull and index the tables wherever those are)."""
    if model not in ("ctr_dnn", "wide_deep"):
        return {}
    m: Any = module
    ids = x[0]
    index = {id(p): i for i, p in enumerate(module.parameters())}
    out = {index[id(e.weight)]: ids[:, f].unique().cpu() for f, e in enumerate(m.emb)}
    if model == "wide_deep":
        out[index[id(m.wide.weight)]] = (ids + m.offsets).unique().cpu()
    return out
