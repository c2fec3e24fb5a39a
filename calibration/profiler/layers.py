"""Per-layer times of whole models and of single-layer modules: the ``micro`` and
``models`` benchmarks.

:class:`LayerTimer` times forward and backward of every leaf module call of a
model; :class:`_ModelTimer` samples one model (or single-layer benchmark) on one
batch in visits, as :func:`~calibration.profiler.timing._run_rounds` interleaves
them. The single-layer benchmarks (:func:`_micro_layers`: Linear, Conv2d,
Embedding/EmbeddingBag and a sparse gradient scatter-add, MultiheadAttention,
norms and activations) and every zoo model are timed at several batch sizes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from calibration import model_variants
from calibration.profiler.registry import Benchmark, Sampled, register
from calibration.profiler.spec import ProfileSpec
from calibration.profiler.timing import (
    _Clock,
    _figures,
    _Progress,
    _reps_for,
    _rounds_quantile,
    _run_rounds,
)


@dataclass(eq=False)
class _Call:
    module: Any
    fqn: str
    leaf: bool = True
    t_in: Any = None
    t_out: Any = None


class LayerTimer:
    """Forward and backward seconds of every leaf module call of a model.

    Layers are named as :func:`sim.torch_extract.from_torch` names them: the
    module's qualified name, with ``#k`` for the k-th call of a module called
    more than once. Forward: from the call's forward pre-hook to its forward
    hook, each call inside a ``torch.profiler.record_function`` range named
    ``hetsim.fwd:<layer>``. Backward: every autograd node belongs to the module
    call that created it (the rule of ``from_torch``); a pre-hook on each node
    marks the timeline, and the time from one node's start to the next node's
    start is charged to the node's owner. On CPUs the autograd engine runs the
    nodes one after the other on the calling thread, so the marks partition
    the backward pass; on GPUs the marks are CUDA events on the stream.
    Work of no leaf call (glue such as ``torch.cat``, residual adds, the loss)
    is charged to a neighbouring layer (see :meth:`iteration`) so that the layer
    times add up to the iteration, and reported as ``glue`` too. Each layer's own
    brackets alone (forward: pre-hook to hook; backward: its own nodes, without
    the glue nodes charged to it) are kept in :attr:`own` after each iteration.
    """

    def __init__(self, module: Any, dev: Any) -> None:
        self.module = module
        self.clock = _Clock(dev)
        self.calls: list[_Call] = []
        self.stack: list[_Call] = []
        self.owner: dict[Any, _Call] = {}
        self.ranges: list[Any] = []
        self.fqns = {m: n for n, m in module.named_modules()}
        self.handles: list[Any] = []
        #: after :meth:`iteration`: (forward, backward) seconds per layer inside the
        #: layer's own brackets only (no glue charged to it)
        self.own: tuple[dict[str, float], dict[str, float]] = ({}, {})

    # hooks ---------------------------------------------------------------
    def _claim(self, tensors: Sequence[Any], call: _Call) -> None:
        from sim.torch_extract import claim_history

        claim_history(tensors, call, self.owner)

    def _pre(self, fqn: str) -> Callable[..., None]:
        from torch.autograd.profiler import record_function

        def hook(module: Any, args: Any, kwargs: Any) -> None:
            inputs = _tensors((args, kwargs))
            if self.stack:
                parent = self.stack[-1]
                parent.leaf = False
                self._claim(inputs, parent)
            call = _Call(module=module, fqn=fqn)
            self.calls.append(call)
            self.stack.append(call)
            rf = record_function(f"hetsim.fwd:{fqn or 'root'}")
            rf.__enter__()
            self.ranges.append(rf)
            call.t_in = self.clock.mark()

        return hook

    def _post(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        if not self.stack or self.stack[-1].module is not module:
            return
        call = self.stack.pop()
        call.t_out = self.clock.mark()
        self.ranges.pop().__exit__(None, None, None)
        self._claim(_tensors(output), call)

    def __enter__(self) -> LayerTimer:
        for mod, fqn in self.fqns.items():
            self.handles.append(mod.register_forward_pre_hook(self._pre(fqn), with_kwargs=True))
            self.handles.append(mod.register_forward_hook(self._post, with_kwargs=True,
                                                          always_call=True))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    # one iteration --------------------------------------------------------
    def iteration(self, args: tuple[Any, ...], kwargs: dict[str, Any]
                  ) -> tuple[dict[str, float], dict[str, float], float, float]:
        """Run forward and backward once.

        Returns:
            (forward seconds per layer, backward seconds per layer, glue
            seconds (in no layer's own bracket, charged to a neighbour), whole-
            iteration seconds).
        """
        self.calls, self.stack, self.owner = [], [], {}
        self.module.zero_grad(set_to_none=True)
        self.clock.sync()
        t0 = self.clock.mark()
        loss = training_loss(self.module(*args, **kwargs))
        t_fwd = self.clock.mark()
        marks: list[tuple[Any, _Call | None]] = []
        nodes: list[Any] = []
        todo, seen = [loss.grad_fn], set()
        while todo:
            n = todo.pop()
            if n is None or n in seen:
                continue
            seen.add(n)
            nodes.append(n)
            todo.extend(m for m, _ in n.next_functions)
        hooks = []
        for n in nodes:
            owner = self.owner.get(n)
            hooks.append(n.register_prehook(
                lambda _g, owner=owner: marks.append((self.clock.mark(), owner))))
        t_b0 = self.clock.mark()
        loss.backward()
        t_end = self.clock.mark()
        for h in hooks:
            h.remove()
        self.clock.sync()
        names = self._names()
        fwd: dict[str, float] = {}
        bwd: dict[str, float] = {}
        own_f: dict[str, float] = {}
        own_b: dict[str, float] = {}
        own = 0.0  # time inside the layers' own brackets
        # Forward: a layer is charged from the end of the previous layer (the
        # iteration's start for the first) to its own end, so the framework work
        # that prepares its input (Python dispatch, views, torch.cat, residual
        # adds) is its; the loss goes to the last layer.
        prev, last = t0, None
        for c in self.calls:
            if c in names:
                own_f[names[c]] = self.clock.seconds(c.t_in, c.t_out)
                own += own_f[names[c]]
                fwd[names[c]] = self.clock.seconds(prev, c.t_out)
                prev, last = c.t_out, names[c]
        if last is not None:
            fwd[last] += self.clock.seconds(prev, t_fwd)
        # Backward: a node of no layer (the loss, a cat's split, a residual
        # add's) is charged to the next layer node to run, trailing ones to the
        # last layer that ran.
        ends = [m for m, _ in marks[1:]] + [t_end]
        pending, last = 0.0, None
        for (m, owner), e in zip(marks, ends, strict=True):
            sec = self.clock.seconds(m, e)
            if owner is not None and owner in names:
                own += sec
                own_b[names[owner]] = own_b.get(names[owner], 0.0) + sec
                bwd[names[owner]] = bwd.get(names[owner], 0.0) + sec + pending
                pending, last = 0.0, names[owner]
            else:
                pending += sec
        if last is not None:
            bwd[last] += pending
        for layer_name in names.values():
            bwd.setdefault(layer_name, 0.0)
            own_b.setdefault(layer_name, 0.0)
        self.own = (own_f, own_b)
        total = self.clock.seconds(t0, t_fwd) + self.clock.seconds(t_b0, t_end)
        del nodes, seen
        return fwd, bwd, max(0.0, total - own), total

    def _names(self) -> dict[_Call, str]:
        from sim.torch_extract import unique_names

        leaves = [c for c in self.calls if c.leaf]
        root = type(self.module).__name__.lower()
        return dict(zip(leaves, unique_names([c.fqn or root for c in leaves]), strict=True))


def _tensors(obj: Any) -> list[Any]:
    from sim.torch_extract import tensors_in

    return tensors_in(obj)


def training_loss(output: Any) -> Any:
    """The loss the profiler back-propagates: the runtime's training loss
    (:func:`runtime.task.loss_fn`, a mean squared error) of every floating-point
    output that needs a gradient, against zeros, summed over the outputs. Its
    gradient reaches the model's last layer as a contiguous tensor, as a real
    loss's does. A plain ``sum()``'s gradient is a
    stride-0 expanded view, which makes the last layer's backward slower than in
    training.
    """
    import torch

    from runtime.task import loss_fn

    outs = [t for t in _tensors(output) if t.is_floating_point() and t.requires_grad]
    return torch.stack([loss_fn(t, torch.zeros_like(t, dtype=torch.float32)) for t in outs]).sum()


def _to(example: Any, dev: Any) -> Any:
    """``example`` (a tensor, or tensors in tuples, lists and dicts) on ``dev``."""
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.to(dev) if isinstance(t, torch.Tensor) else t, example)


class _ModelTimer:
    """Samples of one model (or single-layer benchmark) on one batch, taken in visits.

    :meth:`start` warms the model up and sets its repeat count (as
    :func:`_reps_for`); each :meth:`visit` runs, with the :class:`LayerTimer`'s
    hooks on, one warm-up iteration (after which the caches hold this model
    again) and then ``n`` pairs of a hooked iteration (per-layer times) and an
    iteration without hooks (the whole-iteration reference), interleaved so that
    slow phases of a noisy host hit both. Gradients are freed after each visit.
    :meth:`result` summarises every sample so far.
    """

    def __init__(self, module: Any, example: Any, dev: Any, spec: ProfileSpec) -> None:
        self.module, self.dev, self.spec = module, dev, spec
        from sim.torch_extract import split_input

        self.args, self.kwargs = split_input(example)
        self.clock = _Clock(dev)
        self.fw: dict[str, list[float]] = {}
        self.bw: dict[str, list[float]] = {}
        self.ofw: dict[str, list[float]] = {}
        self.obw: dict[str, list[float]] = {}
        self.unattr: list[float] = []
        self.hooked: list[float] = []
        self.whole: list[float] = []

    def _plain(self) -> float:
        self.module.zero_grad(set_to_none=True)
        self.clock.sync()
        a = self.clock.mark()
        training_loss(self.module(*self.args, **self.kwargs)).backward()
        b = self.clock.mark()
        return self.clock.seconds(a, b)

    def start(self) -> int:
        for _ in range(self.spec.warmup):
            self._plain()
        return _reps_for(self._plain(), self.spec)

    def visit(self, n: int) -> None:
        with LayerTimer(self.module, self.dev) as lt:
            lt.iteration(self.args, self.kwargs)  # warm the hooks (and the caches)
            for _ in range(n):
                f, b, u, tot = lt.iteration(self.args, self.kwargs)
                for k, v in f.items():
                    self.fw.setdefault(k, []).append(v)
                for k, v in b.items():
                    self.bw.setdefault(k, []).append(v)
                for k, v in lt.own[0].items():
                    self.ofw.setdefault(k, []).append(v)
                for k, v in lt.own[1].items():
                    self.obw.setdefault(k, []).append(v)
                self.unattr.append(u)
                self.hooked.append(tot)
                self.whole.append(self._plain())
        self.module.zero_grad(set_to_none=True)

    def result(self, quantile: float = 50.0) -> dict[str, Any]:
        """Per-layer forward/backward figures and spreads of the samples so far, each
        figure their ``quantile``-th percentile (default: the median; relative IQRs
        are IQR / median either way).

        Returns:
            ``{"layers": {name: [fwd_s, bwd_s, fwd_rel_iqr, bwd_rel_iqr]},
            "own": {name: [fwd_s, bwd_s]}, "iter_s", "iter_rel_iqr", "hooked_iter_s",
            "glue_s", "reps"}``. ``layers`` holds the times charged to each layer (its
            own brackets and the glue charged to it, adding up to the hooked
            iteration); ``own`` its own brackets alone; ``iter_s`` the iteration
            timed without hooks, the reference for whole-iteration predictions;
            ``reps`` the samples taken.
        """
        def est(xs: Sequence[float]) -> float:
            return _figures(xs, quantile)[0]

        layers = {}
        for k in self.fw:
            (fv, fi), (bv, bi) = _figures(self.fw[k], quantile), _figures(self.bw.get(k, [0.0]), quantile)
            layers[k] = [fv, bv, fi, bi]
        own = {k: [est(self.ofw[k]), est(self.obw.get(k, [0.0]))] for k in self.fw if k in self.ofw}
        it, it_iqr = _figures(self.whole, quantile)
        return {"layers": layers, "own": own, "iter_s": it, "iter_rel_iqr": it_iqr,
                "hooked_iter_s": est(self.hooked), "glue_s": est(self.unattr),
                "reps": len(self.whole)}


def _micro_layers(name: str, dev: Any) -> tuple[Any, Callable[[int], Any], tuple[int, ...]]:
    """(module, batch -> example input, batch sizes) of one single-layer benchmark.

    Inputs of dense layers require grad, as inside a network, so the backward
    computes the input gradient too.
    """
    import torch
    from torch import nn

    def dense(*shape: int) -> Callable[[int], Any]:
        return lambda b: torch.randn(b, *shape, device=dev, requires_grad=True)

    def ids(rows: int, per: int) -> Callable[[int], Any]:
        return lambda b: torch.randint(0, rows, (b, per), device=dev)

    kind, _, rest = name.partition("_")
    if kind == "linear":
        dims, _, small = rest.partition("_")
        i, o = (int(x) for x in dims.split("x"))
        # _rows: the few-row range, 8 to 64 rows (bench.gemm_shapes)
        batches = {"": (8, 64, 512), "b1": (1, 2, 4), "b16": (16, 32), "rows": (8, 16, 32, 64)}
        if small not in batches:
            raise KeyError(name)
        return nn.Linear(i, o), dense(i), batches[small]
    if kind == "conv":
        chans, ks, hw = rest.split("_")
        ci, co = (int(x) for x in chans.split("x"))
        k = int(ks[1]) if "s" not in ks else int(ks[1:ks.index("s")])
        s = int(ks.split("s")[1]) if "s" in ks else 1
        m = nn.Conv2d(ci, co, k, s, padding=k // 2, bias=False)
        return m, dense(ci, int(hw), int(hw)), (1, 2)
    if kind == "emb":
        parts = rest.split("_")
        rows, dim = (int(x) for x in parts[0].split("x"))
        per = int(parts[1][3:]) if len(parts) > 1 else 1
        return nn.Embedding(rows, dim), ids(rows, per), ((2, 8) if per > 1 else (64, 1024))
    if kind == "embbag":
        dims, per_s = rest.split("_")
        rows, dim = (int(x) for x in dims.split("x"))
        return nn.EmbeddingBag(rows, dim, mode="sum"), ids(rows, int(per_s)), (64, 1024)
    if kind == "mha":
        # mha_{d}h{heads}_seq{seq}, with _drop: dropout 0.1 on the attention weights, as
        # nn.TransformerEncoderLayer's default; in training that runs another kernel
        # path (softmax, dropout and two bmm: scaled_dot_product_attention's math path)
        # than the fused attention without dropout
        shape, drop, tail = rest.partition("_drop")
        if tail:
            raise KeyError(name)
        d, h_seq = shape.split("h")
        heads, seq = h_seq.split("_seq")
        p_drop = 0.1 if drop else 0.0

        class SelfAttn(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.attn = nn.MultiheadAttention(int(d), int(heads), dropout=p_drop,
                                                  batch_first=True)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.attn(x, x, x, need_weights=False)[0]

        return SelfAttn(), dense(int(seq), int(d)), (1, 4)
    if name == "relu_1m":
        return nn.ReLU(), dense(1_000_000), (1, 4)
    if name == "bn2d_64x56":
        return nn.BatchNorm2d(64), dense(64, 56, 56), (1, 4)
    if name == "ln_512_seq128":
        return nn.LayerNorm(512), dense(128, 512), (1, 2, 4, 8)
    if name == "dropout_512_seq128":
        return nn.Dropout(0.1), dense(128, 512), (1, 4)
    if name == "maxpool_64x112":
        return nn.MaxPool2d(3, 2, padding=1), dense(64, 112, 112), (1, 4)
    raise KeyError(name)


def _single_layer(module: Any, example: Any) -> Any:
    """The one work-carrying layer ``from_torch`` extracts from a benchmark module."""
    from sim.torch_extract import from_torch

    model = from_torch(module, example, name="micro")
    work = [ly for ly in model.layers if ly.fwd_flops > 0 or ly.param_bytes > 0] or list(model.layers)
    return model, work[0]


def _micro_timers(names: Sequence[str], dev: Any, spec: ProfileSpec
                  ) -> list[tuple[str, dict[str, Any], list[tuple[int, _ModelTimer]]]]:
    """(name, the extracted one-layer model's record, [(batch, timer)]) of each
    single-layer benchmark ``names`` (:func:`_micro_layers`) on ``dev``."""
    out = []
    for name in names:
        module, make, batches = _micro_layers(name, dev)
        module = module.to(dev).train()
        out.append((name, micro_record(name),
                    [(bs, _ModelTimer(module, make(bs), dev, spec)) for bs in batches]))
    return out


def micro_record(name: str) -> dict[str, Any]:
    """The one-layer model ``from_torch`` extracts from the single-layer benchmark ``name``
    (on the CPU, seeded, at its first batch size), as a ``raw["micro"]`` entry records it."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        cpu_mod, cpu_make, batches = _micro_layers(name, torch.device("cpu"))
        model, _layer = _single_layer(cpu_mod, cpu_make(batches[0]))
    return model.to_dict()


def _micro_entries(timers: Sequence[tuple[str, dict[str, Any], list[tuple[int, _ModelTimer]]]],
                   quantile: float) -> list[dict[str, Any]]:
    entries = []
    for name, model, runs in timers:
        rows = []
        for bs, t in runs:
            r = t.result(quantile)
            rows.append({"batch": bs, "iter_s": r["iter_s"], "layers": r["layers"], "own": r["own"]})
        entries.append({"name": name, "model": model, "runs": rows})
    return entries


def _model_timers(chosen: dict[str, tuple[int, ...]], dev: Any, spec: ProfileSpec
                  ) -> list[tuple[str, int, _ModelTimer]]:
    """A fresh zoo model or variant (:func:`calibration.model_variants.torch_module`, in
    training mode on ``dev``) and its timer per (model, batch size) of ``chosen``."""
    out = []
    for name, batches in chosen.items():
        for b in batches:
            module, example = model_variants.torch_module(name, b)
            out.append((name, b, _ModelTimer(module.to(dev).train(), _to(example, dev), dev, spec)))
    return out


def _model_entries(models: Sequence[tuple[str, int, _ModelTimer]], quantile: float
                   ) -> dict[str, list[dict[str, Any]]]:
    """``raw["models"]``: per model, one run per batch size (:meth:`_ModelTimer.result`)."""
    by_model: dict[str, list[dict[str, Any]]] = {}
    for name, b, t in models:
        by_model.setdefault(name, []).append({"batch": b, **t.result(quantile)})
    return by_model


def _micro(names: Sequence[str], dev: Any, spec: ProfileSpec) -> Sampled:
    """The single-layer benchmarks ``names`` built, one progress group each; finished:
    ``{"micro": [entry, ...]}`` (:func:`_micro_entries`)."""
    timers = _micro_timers(names, dev, spec)
    return Sampled([(f"layer {name}", [t for _, t in runs]) for name, _, runs in timers],
                   lambda q: {"micro": _micro_entries(timers, q)})


def _models(chosen: dict[str, tuple[int, ...]], dev: Any, spec: ProfileSpec) -> Sampled:
    """The zoo models ``chosen`` built, one progress group per (model, batch size);
    finished: ``{"models": {name: [run, ...]}}`` (:func:`_model_entries`)."""
    models = _model_timers(chosen, dev, spec)
    return Sampled([(f"{name} b={b}", [t]) for name, b, t in models],
                   lambda q: {"models": _model_entries(models, q)})


def measure_models(chosen: dict[str, tuple[int, ...]], dev: Any, spec: ProfileSpec,
                   bar: _Progress | None = None, rounds: int = 1) -> dict[str, list[dict[str, Any]]]:
    """The zoo models ``chosen`` (name -> batch sizes) on ``dev``, timed as
    :func:`~calibration.profiler.measure` times them with ``spec``'s repeats in
    ``rounds`` rounds, each built afresh: a ``raw["models"]`` entry. The process must be
    set up first (:func:`~calibration.profiler.device.setup_host`)."""
    sampled = _models(chosen, dev, spec)
    _run_rounds(sampled.groups, rounds, bar)
    return sampled.finish(_rounds_quantile(rounds))["models"]


def measure_micro(names: Sequence[str], dev: Any, spec: ProfileSpec,
                  bar: _Progress | None = None, rounds: int = 1) -> list[dict[str, Any]]:
    """The single-layer benchmarks ``names`` (:func:`_micro_layers`) on ``dev``: one
    ``raw["micro"]`` entry each, ``{"name", "model" (the extracted one-layer model),
    "runs": [{"batch", "iter_s", "layers", "own"}]}``, timed as
    :func:`~calibration.profiler.measure` times them with ``spec``'s repeats in
    ``rounds`` rounds. The process must be set up first
    (:func:`~calibration.profiler.device.setup_host`)."""
    sampled = _micro(names, dev, spec)
    _run_rounds(sampled.groups, rounds, bar)
    return sampled.finish(_rounds_quantile(rounds))["micro"]


register(Benchmark(
    "micro", "single-layer modules (the spec's micro grid), forward and backward per batch size",
    ("micro",), order=40, build=lambda run: _micro(run.spec.micro, run.dev, run.spec),
    groups=lambda run: len(run.spec.micro),
    # a GPU times them per math mode instead (calibration.profiler.gpu, micro_by_mode)
    applies=lambda run: run.dev.type != "cuda"))
register(Benchmark(
    "models", "the chosen zoo models, forward and backward per layer and whole, per batch size",
    ("models",), order=50, build=lambda run: _models(run.models, run.dev, run.spec),
    groups=lambda run: sum(len(b) for b in run.models.values()),
    # a GPU's default spec chooses none (calibration.profiler.gpu.SKIPPED)
    applies=lambda run: run.dev.type != "cuda" or bool(run.models)))
