"""Measure a device: microbenchmarks, per-layer times of the zoo models, the network.

``hetsim profile --device cpu|cuda:N [--quick] --out FILE`` calls
:func:`run_profile`, which

1. times GEMMs over a grid of shapes (fp32; bf16/fp16 on GPUs), memory copies
   and elementwise adds (bandwidth), a one-element add (dispatch overhead) and,
   on GPUs, host-device copies. These are timed with ``torch.profiler``
   (one ``record_function`` range per repeat; the range's duration is the
   sample) on CPUs and with CUDA events on GPUs;
2. times single-layer modules (Linear, Conv2d, Embedding/EmbeddingBag and a
   sparse gradient scatter-add, MultiheadAttention, norms and activations) and
   every zoo model at several batch sizes, forward and backward per layer (see
   :class:`LayerTimer`);
3. measures point-to-point and all-reduce latency and bandwidth between two
   processes over ``torch.distributed`` (gloo; NCCL on GPUs), see
   :func:`network_bench`;
4. fits the efficiency curves (:mod:`hardware_profiles.calibrate`) and writes a
   :class:`~hardware_profiles.schema.DeviceProfile` with ``source.kind =
   "measured"``, the per-layer tables, the raw measurements and their spread.

An item's repeats are taken in interleaved rounds (:func:`_run_rounds`; 8 in a
full run), every round visiting every item, so that each item samples the whole
run rather than the few seconds its turn would last; each figure is then the
:data:`ROUNDS_QUANTILE`-th percentile of its samples. With one round (``--quick``,
``--rounds 1``) the repeats run back to back after a warm-up and each figure is
their median. The spread of a figure is its relative inter-quartile range (IQR /
median) over the repeats.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import math
import os
import platform
import queue as _queue
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from hardware_profiles.schema import DeviceProfile, Source
from runtime.affinity import usable_cpus
from sim.errors import ConfigError, HetsimError
from sim.fileio import atomic_write

__all__ = [
    "LayerTimer",
    "add_micro",
    "ProfileSpec",
    "check_device",
    "check_writable",
    "describe_device",
    "measure_micro",
    "network_bench",
    "wake_bench",
    "wire_bench",
    "run_profile",
    "setup_host",
    "spec_for",
    "time_callable",
]

#: Significant digits kept for raw times in the JSON (the noise is far larger).
_DIGITS = 4


def _r(x: float) -> float:
    return float(f"{x:.{_DIGITS}g}")


def _median_iqr(xs: Sequence[float]) -> tuple[float, float]:
    """(median, relative IQR) of the samples."""
    a = np.asarray(xs, dtype=float)
    med = float(np.median(a))
    q1, q3 = np.percentile(a, [25, 75])
    return med, float((q3 - q1) / med) if med > 0 else 0.0


def _figures(xs: Sequence[float], quantile: float) -> tuple[float, float]:
    """(the samples' ``quantile``-th percentile, their relative IQR), as stored."""
    return _r(float(np.percentile(xs, quantile))), _r(_median_iqr(xs)[1])


# ----------------------------------------------------------------- what to run
@dataclass(frozen=True)
class ProfileSpec:
    """Sizes and repeat counts of one profiling run (``quick`` or full).

    Attributes:
        gemm: (m, n, k) shapes of the GEMM grid.
        copy_elems: element counts of the bandwidth benchmarks (fp32).
        micro: single-layer benchmarks, names from :func:`_micro_layers`.
        models: zoo model -> batch sizes to time.
        min_reps, max_reps: repeats of one timed item (after one warm-up).
        target_s: time budget of one item's repeats; sets the repeat count
            between min_reps and max_reps from the warm-up's duration.
        net_bytes: message sizes of the network benchmark.
        net_reps: repeats per message size.
        rounds: how many interleaved rounds the repeats are taken in (see
            :func:`_run_rounds`); one: every item's repeats back to back.
        wake_rounds, wire_reps: round trips of the CPU network extras
            (:func:`wake_bench`, :func:`wire_bench`).
    """

    gemm: tuple[tuple[int, int, int], ...]
    copy_elems: tuple[int, ...]
    micro: tuple[str, ...]
    models: dict[str, tuple[int, ...]]
    min_reps: int
    max_reps: int
    target_s: float
    net_bytes: tuple[int, ...]
    net_reps: int
    warmup: int = 1
    rounds: int = 1
    wake_rounds: int = 1000
    wire_reps: int = 25
    extra: dict[str, Any] = field(default_factory=dict)


_ALL_MICRO = (
    "linear_256x256", "linear_1024x1024", "linear_4096x1024", "linear_512x4096",
    # batches 1, 2, 4 (suffix _b1): a skinny GEMM (gemm/rows1, /rows2, /rows4), a kernel
    # of its own that streams its weights (4-256 MB here: in cache to well past it)
    "linear_1024x1024_b1", "linear_2048x2048_b1", "linear_4096x4096_b1", "linear_8192x8192_b1",
    "conv_3x64_k7s2_224", "conv_64x64_k3_56", "conv_128x128_k3_28", "conv_256x256_k3_14",
    "conv_512x512_k3_7", "conv_64x256_k1_56", "conv_256x64_k1_56",
    "emb_100000x16", "emb_32000x512_seq128", "embbag_1300000x1_26",
    # small tables, 32 KB - 4 MB: the backward's dense gradient of a table this size
    # costs far less than the above's 5-74 MB, and no other benchmark measures it
    "emb_500x16", "emb_3000x8", "emb_1500x32", "emb_1000x64", "emb_8000x16", "emb_4000x64",
    "emb_32000x16", "emb_16000x64", "embbag_10000x1_8", "embbag_100000x1_26",
    "embbag_500000x1_8",
    "mha_256h4_seq64", "mha_512h8_seq128", "mha_768h12_seq256",
    # the same with dropout on the attention weights (another kernel path: attention/unfused)
    "mha_256h4_seq64_drop", "mha_512h8_seq128_drop", "mha_768h12_seq256_drop",
    "relu_1m", "bn2d_64x56", "ln_512_seq128", "maxpool_64x112", "dropout_512_seq128",
)


#: Single-layer benchmarks measured only on request (``hetsim profile --add-micro``),
#: not by a profile run nor by ``--add-micro missing``: the grid's four GEMM shapes at
#: batches 16 and 32 (suffix _b16). At one intensity their efficiencies differ by
#: shape (on the AMD EPYC, 16 rows backward: 0.40-0.60 of peak, 1024x1024 the
#: fastest at every row count), which a curve over one variable cannot price; fitted
#: with the grid they made the leave-one-model-out bench worse, not better
#: (README, "Two probes: the reweighting, and 16-row benchmarks").
_EXTRA_MICRO = (
    "linear_256x256_b16", "linear_1024x1024_b16", "linear_4096x1024_b16", "linear_512x4096_b16",
)


def spec_for(quick: bool) -> ProfileSpec:
    """The sizes of a ``--quick`` run (within 3 minutes on 2 CPU cores: fewer repeats,
    vgg16 at batch 1 alone, shorter network extras; 2 min 13 s on the AMD EPYC,
    2026-12-06) or a full one (about 10 minutes there)."""
    if quick:
        return ProfileSpec(
            gemm=((64, 64, 64), (256, 256, 256), (1024, 1024, 1024), (32, 1024, 1024),
                  (2048, 512, 512)),
            copy_elems=(1_000, 100_000, 16_000_000),
            micro=_ALL_MICRO,
            models={"mlp": (16, 128), "ctr_dnn": (32, 256), "wide_deep": (32, 256),
                    "resnet18": (1, 2), "resnet50": (1, 2), "vgg16": (1,),
                    "transformer": (1, 2)},
            min_reps=3, max_reps=10, target_s=0.6,
            net_bytes=(8, 65_536, 4_194_304), net_reps=10, wake_rounds=200, wire_reps=5,
        )
    return ProfileSpec(
        gemm=tuple((s, s, s) for s in (32, 64, 128, 256, 512, 1024, 2048))
        + ((32, 1024, 1024), (128, 4096, 1024), (2048, 512, 512), (512, 32000, 512)),
        copy_elems=(1_000, 10_000, 100_000, 1_000_000, 4_000_000, 16_000_000, 64_000_000),
        micro=_ALL_MICRO,
        models={"mlp": (16, 64, 256), "ctr_dnn": (32, 128, 512), "wide_deep": (32, 128, 512),
                "resnet18": (1, 2, 4), "resnet50": (1, 2, 4), "vgg16": (1, 2, 4),
                "transformer": (1, 2, 4)},
        min_reps=5, max_reps=40, target_s=2.0,
        net_bytes=(8, 1024, 65_536, 1_048_576, 16_777_216), net_reps=20, rounds=8,
    )


# ------------------------------------------------------------------- checks
def check_device(device: str) -> Any:
    """The ``torch.device`` for ``device`` ('cpu' or 'cuda[:N]').

    Raises:
        ConfigError: ``<command line>: --device: ...`` when the name is not a
            device or the device is not available here.
    """
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError("<command line>", "--device", f"{device!r} is not a device "
                          "(use cpu or cuda:N)") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise ConfigError("<command line>", "--device", f"device type {dev.type!r} is not "
                          "supported (use cpu or cuda:N)")
    if not torch.cuda.is_available():
        raise ConfigError("<command line>", "--device", f"{device} is not available: this "
                          f"torch ({torch.__version__}) sees no CUDA GPU")
    idx = dev.index or 0
    if idx >= torch.cuda.device_count():
        raise ConfigError("<command line>", "--device", f"{device} is not available: "
                          f"{torch.cuda.device_count()} CUDA device(s) visible")
    return torch.device("cuda", idx)


def check_writable(out: str | os.PathLike[str]) -> Path:
    """Make sure ``out`` can be written (creating its folder); return it as a Path.

    The name of a profile is its file stem, so ``out`` must end in ``.json``.

    Raises:
        ConfigError: naming ``out`` when it cannot be written.
    """
    p = Path(out)
    shown = os.fspath(out)
    if p.suffix != ".json":
        raise ConfigError(shown, "", "a profile file name must end in .json")
    if p.is_dir():
        raise ConfigError(shown, "", "is a folder; give a file name ending in .json")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        # open for append: proves the file can be written without touching its contents
        existed = p.exists()
        with p.open("a"):
            pass
        if not existed:
            p.unlink()
    except OSError as e:
        raise ConfigError(shown, "", f"cannot write: {e.strerror or e}") from None
    return p


# ------------------------------------------------------------------- timing
def clock_kind(dev: Any) -> str:
    """How times are taken on ``dev``: 'cuda' (CUDA events), 'thread' (CPU time of the
    calling thread, when torch runs single-threaded on a CPU) or 'wall' (perf_counter).

    With one intra-op thread every CPU op runs on the calling thread, so its CPU
    time is the op's time without the intervals in which another process held
    the core: on a shared machine this removes the scheduler's preemptions
    (multi-millisecond steps) from the samples. With several threads the wall
    clock is the only faithful one.
    """
    import torch

    if dev.type == "cuda":
        return "cuda"
    return "thread" if torch.get_num_threads() == 1 else "wall"


class _Clock:
    """Marks on a timeline: CUDA events on a GPU stream; on a CPU the thread's CPU
    time or perf_counter (see :func:`clock_kind`)."""

    def __init__(self, dev: Any) -> None:
        import torch

        self.kind = clock_kind(dev)
        self.cuda = self.kind == "cuda"
        self._torch = torch
        self.dev = dev
        self._now = time.thread_time if self.kind == "thread" else time.perf_counter

    def mark(self) -> Any:
        if self.cuda:
            ev = self._torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return self._now()

    def seconds(self, a: Any, b: Any) -> float:
        """Seconds from mark ``a`` to mark ``b`` (synchronises a GPU first)."""
        if self.cuda:
            b.synchronize()
            return float(a.elapsed_time(b)) / 1e3
        return float(b - a)

    def sync(self) -> None:
        if self.cuda:
            self._torch.cuda.synchronize(self.dev)


def _reps_for(first_s: float, spec: ProfileSpec) -> int:
    if first_s <= 0:
        return spec.max_reps
    return int(min(spec.max_reps, max(spec.min_reps, math.ceil(spec.target_s / first_s))))


class _OpTimer:
    """Times callables, one sample per repeat.

    On CPUs with the wall clock the repeats run under one ``torch.profiler``
    session, each inside a ``record_function`` range whose duration is the
    sample; on GPUs a pair of CUDA events brackets each repeat, and with the
    thread clock (one thread) the thread's CPU time does.
    """

    def __init__(self, dev: Any, spec: ProfileSpec) -> None:
        self.dev, self.spec = dev, spec
        self.clock = _Clock(dev)

    def reps(self, fn: Callable[[], Any]) -> int:
        """Warm ``fn`` up (``spec.warmup`` calls) and time one more call, which sets
        how many repeats it gets (:func:`_reps_for`)."""
        for _ in range(self.spec.warmup):
            fn()
        a = self.clock.mark()
        fn()
        return _reps_for(self.clock.seconds(a, self.clock.mark()), self.spec)

    def sample(self, fn: Callable[[], Any], label: str, reps: int) -> list[float]:
        """``reps`` samples of ``fn``, no warm-up."""
        from torch.profiler import ProfilerActivity, profile, record_function

        if self.clock.kind != "wall":
            out = []
            for _ in range(reps):
                a = self.clock.mark()
                fn()
                b = self.clock.mark()
                out.append(self.clock.seconds(a, b))
            return out
        tag = f"hetsim:{label}"
        with _quiet_kineto(), profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(reps):
                with record_function(tag):
                    fn()
        return [e.time_range.elapsed_us() / 1e6 for e in prof.events() if e.name == tag]

    def time(self, fn: Callable[[], Any], label: str) -> list[float]:
        """Warm-up, then the repeats :meth:`reps` chooses, back to back."""
        return self.sample(fn, label, self.reps(fn))


@contextlib.contextmanager
def _quiet_kineto() -> Iterator[None]:
    """Silence the profiler's start/stop lines that kineto writes to fd 2."""
    try:
        saved = os.dup(2)
    except OSError:  # pragma: no cover
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


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
        leaves = [c for c in self.calls if c.leaf]
        root = type(self.module).__name__.lower()
        base = [c.fqn or root for c in leaves]
        count: dict[str, int] = {}
        for b in base:
            count[b] = count.get(b, 0) + 1
        k: dict[str, int] = {}
        out: dict[_Call, str] = {}
        for c, b in zip(leaves, base, strict=True):
            if count[b] > 1:
                k[b] = k.get(b, 0) + 1
                b = f"{b}#{k[b]}"
            out[c] = b
        return out


def _tensors(obj: Any) -> list[Any]:
    from sim.torch_extract import tensors_in

    return tensors_in(obj)


def training_loss(output: Any) -> Any:
    """The loss the profiler back-propagates: the runtime's training loss
    (:func:`runtime.task.loss_fn`, a mean squared error) of every floating-point
    output that needs a gradient, against zeros, summed over the outputs. Its
    gradient reaches the model's last layer as a contiguous tensor, as a real
    loss's does. A plain ``sum()``'s gradient is a
    stride-0 expanded view, which made the last layer's backward slower than in
    training (a 1024 -> 10 or 256 -> 1 Linear at batch 16-512, one thread on the
    AMD EPYC: 11-61 us more per backward, 9-25% of forward plus backward).
    """
    import torch

    from runtime.task import loss_fn

    outs = [t for t in _tensors(output) if t.is_floating_point() and t.requires_grad]
    return torch.stack([loss_fn(t, torch.zeros_like(t, dtype=torch.float32)) for t in outs]).sum()


def _split(example: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(example, dict):
        return (), dict(example)
    if isinstance(example, (tuple, list)):
        return tuple(example), {}
    return (example,), {}


def _to(example: Any, dev: Any) -> Any:
    if isinstance(example, (tuple, list)):
        return tuple(t.to(dev) for t in example)
    return example.to(dev)


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
        self.args, self.kwargs = _split(example)
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


class _OpItem:
    """One callable of the GEMM grid, bandwidth or dispatch benchmarks, sampled in
    visits as :class:`_ModelTimer` samples a model: :meth:`start` warms it up and
    sets its repeat count; a visit after the first warms it once more."""

    def __init__(self, timer: _OpTimer, fn: Callable[[], Any], label: str) -> None:
        self.timer, self.fn, self.label = timer, fn, label
        self.samples: list[float] = []

    def start(self) -> int:
        return self.timer.reps(self.fn)

    def visit(self, n: int) -> None:
        if self.samples:  # a later visit: the first follows start()'s warm-up
            self.fn()
        self.samples += self.timer.sample(self.fn, self.label, n)

    def figures(self, quantile: float) -> tuple[float, float]:
        """(the samples' ``quantile``-th percentile, their relative IQR)."""
        return _figures(self.samples, quantile)


# -------------------------------------------------------- single-layer modules
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


# --------------------------------------------------------------- network
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _loopback_group(rank: int, port: int, backend: str = "gloo") -> None:
    """Join the two-rank process group of a benchmark (in a spawned rank). Rank 0's TCP
    store listens on 127.0.0.1 only (a socket bound here and handed over: TCPStore itself
    would listen on every interface), on the port the parent chose at run time."""
    import torch.distributed as dist

    listener = None
    if rank == 0:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", port))
        listener.listen()
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0,
                          timeout=_dt.timedelta(seconds=60),
                          master_listen_fd=listener.fileno() if listener else None)
    dist.init_process_group(backend, store=store, rank=rank, world_size=2,
                            timeout=_dt.timedelta(seconds=60))


def _run_ranks(procs: Sequence[Any], results: Any, n: int, timeout_s: float, what: str,
               stop: Any = None) -> list[Any]:
    """Start ``procs`` (spawned benchmark processes), collect ``n`` items from ``results``
    and tear every process down, on success, error and Ctrl-C alike (``stop``, an event
    the others wait on, is set first).

    Raises:
        HetsimError: a process exited with an error, or no result within ``timeout_s``.
    """
    got: list[Any] = []
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        while len(got) < n:
            try:
                got.append(results.get(timeout=0.2))
            except _queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    codes = [p.exitcode for p in procs]
                    raise HetsimError(f"{what}: a rank failed (exit codes {codes})") from None
                if time.monotonic() > deadline:
                    raise HetsimError(f"{what}: no result within {timeout_s:g} s") from None
    finally:
        if stop is not None:
            stop.set()
        for p in procs:
            if p.pid is not None:
                p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(5)
            if p.is_alive():  # pragma: no cover (terminate is ignored only when wedged)
                p.kill()
                p.join(5)
        results.close()
        results.join_thread()
    return got


def _net_worker(rank: int, port: int, backend: str, device: str, sizes: Sequence[int],
                reps: int, results: Any) -> None:
    """One rank of the network benchmark (run in a spawned process)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    _loopback_group(rank, port, backend)
    try:
        out: dict[str, list[list[float]]] = {"p2p_s": [], "allreduce_s": []}

        def sync() -> None:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        for n in sizes:
            buf = torch.zeros(max(1, n // 4), dtype=torch.float32, device=dev)
            one_way = []
            for i in range(reps + 3):
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                if rank == 0:
                    dist.send(buf, 1)
                    dist.recv(buf, 1)
                else:
                    dist.recv(buf, 0)
                    dist.send(buf, 0)
                sync()
                if i >= 3:  # the first round trips are warm-up
                    one_way.append((time.perf_counter() - t0) / 2)
            ar = []
            for i in range(reps + 3):
                dist.barrier()
                sync()
                t0 = time.perf_counter()
                dist.all_reduce(buf)
                sync()
                if i >= 3:
                    ar.append(time.perf_counter() - t0)
            out["p2p_s"].append(one_way)
            out["allreduce_s"].append(ar)
        if rank == 0:
            results.put(out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _slope_bw(small: int, t_small: float, big: int, t_big: float) -> float:
    """Bytes/s from the smallest to the largest message; when noise makes the large
    message no slower than the small one, the largest message over its own time."""
    if t_big > 1.05 * t_small:
        return (big - small) / (t_big - t_small)
    return big / t_big


def network_bench(device: str = "cpu", sizes: Sequence[int] = (8, 65_536), reps: int = 5,
                  timeout_s: float = 120.0) -> dict[str, Any]:
    """Point-to-point and all-reduce latency/bandwidth between two local processes.

    Two spawned processes join a ``torch.distributed`` group (gloo; NCCL on
    cuda:0 and cuda:1 when ``device`` is a GPU and two are visible, else gloo
    between host buffers) through a TCP store on 127.0.0.1 at a free port chosen
    at run time; gloo/NCCL sockets are bound to the loopback interface. Both
    processes are always terminated and joined before this returns or raises,
    including on KeyboardInterrupt.

    Returns:
        ``{"backend", "sizes_bytes", "p2p_s", "allreduce_s" (medians per size),
        "p2p_rel_iqr", "allreduce_rel_iqr", "p2p_latency_s", "p2p_bw_Bps",
        "allreduce_latency_s", "allreduce_bw_Bps"}``; latency is the time of the
        smallest message, bandwidth the bytes between the smallest and the
        largest message over their time difference (or, when noise makes the
        largest no slower than the smallest, the largest over its own time).

    Raises:
        HetsimError: when a rank fails or the benchmark exceeds ``timeout_s``.
    """
    import multiprocessing as mp

    backend = "gloo"
    if device.startswith("cuda"):
        import torch

        # NCCL needs one GPU per rank: ranks 0 and 1 on cuda:0 and cuda:1.
        # With one GPU the two processes measure the host path with gloo.
        if torch.cuda.device_count() >= 2:
            backend = "nccl"
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_net_worker, args=(r, port, backend, device, list(sizes), reps, results),
                         daemon=True) for r in range(2)]
    [got] = _run_ranks(procs, results, 1, timeout_s, "network benchmark")
    p2p = [_median_iqr(x) for x in got["p2p_s"]]
    ar = [_median_iqr(x) for x in got["allreduce_s"]]
    # latency: the smallest message; bandwidth: the slope from it to the largest
    small, big = sizes[0], sizes[-1]
    lat, t_big = p2p[0][0], p2p[-1][0]
    ar_lat, ar_big = ar[0][0], ar[-1][0]
    return {
        "backend": backend,
        "sizes_bytes": list(sizes),
        "p2p_s": [_r(m) for m, _ in p2p],
        "p2p_rel_iqr": [_r(i) for _, i in p2p],
        "allreduce_s": [_r(m) for m, _ in ar],
        "allreduce_rel_iqr": [_r(i) for _, i in ar],
        "p2p_latency_s": _r(lat),
        "p2p_bw_Bps": _r(_slope_bw(small, lat, big, t_big)),
        "allreduce_latency_s": _r(ar_lat),
        "allreduce_bw_Bps": _r(_slope_bw(small, ar_lat, big, ar_big)),
    }


def _wake_hog(core: int, stop: Any) -> None:
    """A busy process pinned to ``core``: a 256x256 GEMM loop on one thread until ``stop``."""
    import torch

    from runtime.affinity import pin

    pin({core})
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    while not stop.is_set():
        a @ a


def _wake_rank(rank: int, port: int, rounds: int, core: int, results: Any,
               shard_core: int | None = None, payload_bytes: int = 0) -> None:
    """Rank 0 plays a PS shard (``runtime.wire.Receiver``; unpinned, as a shard without
    ``runtime.ps_affinity`` runs, or pinned to ``shard_core``), rank 1 a worker pinned to
    ``core``: ``rounds`` round trips of a PUSH (header only, or with ``payload_bytes``
    of payload) and a header-only PARAMS. The worker reports each round trip's time;
    each rank the CPU seconds over all rounds of its process and of its gloo transport
    threads (``gloo_tcp_loop``; None where ``/proc`` has no thread names)."""

    import torch

    from runtime import wire
    from runtime.affinity import CpuMeter, pin

    if rank == 1:
        pin({core})
    elif shard_core is not None:
        pin({shard_core})
    torch.set_num_threads(1)
    _loopback_group(rank, port)
    out: list[float] = []
    rx = wire.Receiver() if rank == 0 else None
    meter = CpuMeter()
    if rx is not None:
        for _ in range(rounds):
            rx.get(60.0)
            wire.send(1, wire.PARAMS, 0)
    else:
        payload = torch.zeros(payload_bytes, dtype=torch.uint8) if payload_bytes else None
        for _ in range(rounds):
            a = time.perf_counter()
            wire.send(0, wire.PUSH, 0, payload=payload)
            wire.recv(0)
            out.append(time.perf_counter() - a)
    got = meter.read()
    results.put({"rank": rank, "rtt": out, "cpu_s": got["cpu_s"],
                 "loop_cpu_s": (got["threads_cpu_s"] or {}).get("gloo_tcp_loop")})
    time.sleep(0.5)
    os._exit(0)  # the receiver thread is blocked inside gloo


class Handoffs(NamedTuple):
    """Round trips of :func:`handoff_rtts`: their times (s, warm-up left out), and each
    rank's CPU seconds over all rounds, of the process and of its gloo transport threads
    (None where unknown): the worker-like rank's, then the shard-like one's."""

    rtts: list[float]
    cpu_s: float
    loop_cpu_s: float | None
    shard_cpu_s: float
    shard_loop_cpu_s: float | None


def handoff_rtts(hogs: int, rounds: int, warmup: int = 20, shard_core: int | None = None,
                 payload_bytes: int = 0, timeout_s: float = 120.0) -> Handoffs:
    """Round trips of the runtime's messages between a worker-like rank pinned to the
    first core this process may use and a shard-like rank (:func:`_wake_rank`), with
    a busy process (a GEMM loop) pinned to each of the first ``hogs`` of those cores;
    the ``warmup`` first rounds left out of the times."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    cores = usable_cpus() or [0]
    stop = ctx.Event()
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_wake_hog, args=(c, stop), daemon=True) for c in cores[:hogs]]
    procs += [ctx.Process(target=_wake_rank, daemon=True,
                          args=(r, port, rounds + warmup, cores[0], results, shard_core, payload_bytes))
              for r in range(2)]
    got = {g["rank"]: g for g in _run_ranks(procs, results, 2, timeout_s, "hand-off benchmark", stop=stop)}
    w, sh = got[1], got[0]
    return Handoffs(list(w["rtt"][warmup:]), w["cpu_s"], w["loop_cpu_s"], sh["cpu_s"], sh["loop_cpu_s"])


def wake_bench(rounds: int = 1000, warmup: int = 20, timeout_s: float = 120.0) -> dict[str, Any]:
    """The scheduler's wake-up latency as the runtime's messages meet it (CPU hosts).

    Round trips of two header-only messages through ``runtime.wire`` (a worker-like
    rank pinned to the first core this process may use sends PUSH and waits for
    PARAMS; a shard-like rank, unpinned (a shard without ``runtime.ps_affinity``), receives with a
    ``Receiver`` thread and answers), first on idle cores, then with one busy process
    (a GEMM loop) pinned to every core. Each message wakes its receiver, so
    ``wake_latency_s = (mean busy - mean idle) / 2``: what a message costs its
    receiver when every core is taken (``cluster.hosts[].wake_us``; ``hetsim
    validate`` uses it). Means, not medians: the DES adds it to every such message.
    """
    cores = len(usable_cpus() or [0])
    means = {label: sum(handoff_rtts(hogs, rounds, warmup, timeout_s=timeout_s).rtts) / rounds
             for label, hogs in (("idle", 0), ("busy", cores))}
    return {"wake_rtt_idle_s": _r(means["idle"]), "wake_rtt_busy_s": _r(means["busy"]),
            "wake_busy_processes": cores, "wake_rounds": rounds,
            "wake_latency_s": _r(max(0.0, (means["busy"] - means["idle"]) / 2))}


def _wire_rank(rank: int, port: int, sizes: Sequence[int], reps: int, warmup: int, core: int,
               results: Any) -> None:
    """Rank 0 plays a PS shard (unpinned, ``runtime.wire.Receiver``; fp32 pushes taken as
    a view as ``runtime.ps`` does, pulls answered with a view of its flat vector),
    rank 1 a worker pinned to ``core`` (pushes packed in one copy, pulls received
    and copied into the parameters, as ``runtime.worker.PSClient`` does). Per size and
    round: a header-only round trip, a pull and a push, each with its wall time (worker)
    and the CPU time (``time.process_time``, every thread) each rank spent on it."""

    import torch

    from runtime import quant, wire
    from runtime.affinity import pin
    from runtime.launch import keep_freed_memory

    keep_freed_memory()  # as every rank of the runtime does
    if rank == 1:
        pin({core})
    torch.set_num_threads(1)
    _loopback_group(rank, port)
    rounds = [(n, k) for n in sizes for k in range(reps + warmup)]
    if rank == 0:
        rx = wire.Receiver()
        flats = {n: torch.randn(n // 4) for n in sizes}
        cpu = []
        # a phase's CPU: the process's (every thread: the receiver's, gloo's) from the end of
        # the previous reply to the end of this one; waiting for a message costs none
        c0 = time.process_time()
        for n, _ in rounds:
            row = []
            for kind in ("rtt", "pull", "push"):
                m = rx.get(60.0)
                assert m is not None
                if kind == "push":
                    assert m.payload is not None
                    quant.unpack(m.payload, n // 4, 32)  # a view, as runtime.ps takes a whole fp32 push
                wire.send(1, wire.PARAMS, 0, payload=flats[n].view(torch.uint8) if kind == "pull" else None)
                c1 = time.process_time()
                row.append(c1 - c0)
                c0 = c1
            cpu.append(row)
            rx.get(60.0)  # the worker's "done" marker
        results.put(("shard", cpu))
    else:
        params = {n: torch.zeros(n // 4) for n in sizes}
        grads = {n: torch.randn(n // 4) for n in sizes}
        out = []
        for n, _ in rounds:
            times: list[tuple[float, float, float]] = []  # (wall, until sent, CPU) per phase
            for kind in ("rtt", "pull", "push"):
                c0, a = time.process_time(), time.perf_counter()
                if kind == "push":
                    payload = quant.pack_many([grads[n]], 32)  # one copy, as runtime.worker packs
                    wire.send(0, wire.PUSH, 0, payload=payload)
                else:
                    wire.send(0, wire.PULL, 0)
                mid = time.perf_counter()
                m = wire.recv(0)
                if kind == "pull":
                    assert m.payload is not None
                    params[n].copy_(m.payload.view(torch.float32))
                times.append((time.perf_counter() - a, mid - a, time.process_time() - c0))
            out.append(times)
            wire.send(0, wire.PULL, 0)  # this round is done (the shard's CPU count goes on)
        results.put(("worker", out))
    time.sleep(0.5)
    os._exit(0)  # the receiver thread is blocked inside gloo


def wire_bench(sizes: Sequence[int] = (4 << 20, 16 << 20, 48 << 20), reps: int = 25, warmup: int = 3,
               timeout_s: float = 120.0) -> dict[str, Any]:
    """What the runtime's own messages cost on this host (CPU hosts, fp32 payloads).

    Two ranks as :func:`_wire_rank` plays them (a shard-like and a pinned worker-like
    one, freed memory kept as every runtime rank keeps it), ``reps`` rounds per size of
    a header-only round trip, a pull and a push of ``n`` bytes. Per-byte figures are the
    least-squares slopes of the medians over the sizes (fixed costs drop out):

    - ``wire_pull_Bps`` / ``wire_push_Bps``: bytes per second of one lone message,
      wall clock (the worker's pull from request to parameters loaded, its push from
      packing to the shard having unpacked it; each less the header-only round trip);
    - ``wire_cpu_Bps``: bytes per second of CPU one end of a message spends, the mean
      CPU seconds per byte over the four (message, end) pairs: the worker packs, sends,
      receives and loads; the shard receives, unpacks and sends (every thread of each
      process, ``time.process_time``); ``wire_cpu_s_per_B`` has the four.

    Measured on the 2-core validation machine (2026-11-30): pulls 4.3 GB/s, pushes
    2.4 GB/s, the ends 3.5 (worker pushing: pack and concatenation copy the gradient
    before the socket does) to 6.6 GB/s (worker pulling), 4.8 GB/s on the mean,
    where the profile's gloo point-to-point figure (``network_bench``: round trips of
    one buffer, 1 and 16 MB) was 1.64 GB/s.
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    cores = usable_cpus() or [0]
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_wire_rank, args=(r, port, list(sizes), reps, warmup, cores[0], results),
                         daemon=True) for r in range(2)]
    got = dict(_run_ranks(procs, results, 2, timeout_s, "wire benchmark"))
    return wire_figures(sizes, got["worker"], got["shard"], reps, warmup)


def wire_figures(sizes: Sequence[int], worker: Sequence[Sequence[Sequence[float]]],
                 shard: Sequence[Sequence[float]], reps: int, warmup: int) -> dict[str, Any]:
    """:func:`wire_bench`'s figures from its ranks' rows (per round, size by size: the worker's
    ``(wall, until sent, CPU)`` of the round trip, the pull and the push; the shard's CPU of
    each): per size the medians over the ``reps`` rounds after ``warmup``, the pull and push
    less the round trip; then the least-squares slope of each over the sizes."""
    med: dict[int, dict[str, float]] = {}
    for j, n in enumerate(sizes):
        rows = range(j * (reps + warmup) + warmup, (j + 1) * (reps + warmup))
        rtt = float(np.median([worker[i][0][0] for i in rows]))
        med[n] = {"pull": float(np.median([worker[i][1][0] for i in rows])) - rtt,
                  "push": float(np.median([worker[i][2][0] for i in rows])) - rtt,
                  "w_pull": float(np.median([worker[i][1][2] for i in rows])),
                  "w_push": float(np.median([worker[i][2][2] for i in rows])),
                  "s_pull": float(np.median([shard[i][1] for i in rows])),
                  "s_push": float(np.median([shard[i][2] for i in rows]))}
    x = np.array(sizes, dtype=float)

    def slope(k: str) -> float:  # least squares over the sizes' medians
        return float(np.polyfit(x, [med[n][k] for n in sizes], 1)[0])

    cpu = {k: slope(k) for k in ("w_push", "s_push", "s_pull", "w_pull")}
    if min(slope("pull"), slope("push"), *cpu.values()) <= 0:
        raise HetsimError("wire benchmark: a time did not grow with the message size (other jobs "
                          f"on the cores?): {med}; run it again on a quieter machine")
    return {"wire_pull_Bps": _r(1.0 / slope("pull")), "wire_push_Bps": _r(1.0 / slope("push")),
            "wire_cpu_Bps": _r(len(cpu) / sum(cpu.values())),
            "wire_cpu_s_per_B": {k: _r(v) for k, v in cpu.items()},
            "wire_sizes_bytes": list(sizes), "wire_reps": reps}


# ----------------------------------------------------------------- the run
def _device_name(dev: Any) -> str:
    import torch

    if dev.type == "cuda":
        return str(torch.cuda.get_device_name(dev))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


class _Progress:
    """A tqdm bar over the run's steps (silent when disabled); ``on_step(what)`` is
    called after each step (the drift probe)."""

    def __init__(self, total: int, enabled: bool,
                 on_step: Callable[[str], None] | None = None) -> None:
        self.bar = None
        self.on_step = on_step
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="profile", unit="step", dynamic_ncols=True)

    def step(self, what: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(what, refresh=False)
            self.bar.update(1)
        if self.on_step is not None:
            self.on_step(what)

    def note(self, what: str) -> None:
        """Say what is happening between steps."""
        if self.bar is not None:
            self.bar.set_postfix_str(what)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


#: The drift probe's fixed work (raw["drift"], :class:`_DriftProbe`): an m = n = k GEMM
#: and a copy of this many fp32 elements, each timed DRIFT_REPS times after a warm-up.
DRIFT_GEMM = 256
DRIFT_COPY_ELEMS = 1 << 21
DRIFT_REPS = 9


class _DriftProbe:
    """Times the same small GEMM and copy after every step of a profiling run.

    A profile compares layers measured minutes apart; where the machine's own speed
    moves in between (a shared host: its neighbours' load, the clock frequency), the
    measurements disagree by that much whatever the cost model does. The probe's
    samples (``raw["drift"]``) say how far it moved while this profile measured;
    :func:`hardware_profiles.calibrate.spread_of` summarises them. About 15 ms a
    sample on a CPU core.
    """

    def __init__(self, dev: Any, started: float) -> None:
        import torch

        self.dev, self.started = dev, started
        self.lhs = torch.randn(DRIFT_GEMM, DRIFT_GEMM, device=dev)
        self.rhs = torch.randn(DRIFT_GEMM, DRIFT_GEMM, device=dev)
        self.src = torch.randn(DRIFT_COPY_ELEMS, device=dev)
        self.dst = torch.empty_like(self.src)
        self.samples: list[dict[str, Any]] = []

    def sample(self, after: str) -> None:
        import torch

        gemm = time_callable(functools.partial(torch.mm, self.lhs, self.rhs), self.dev,
                             DRIFT_REPS, label="drift_mm")[0]
        copy = time_callable(functools.partial(self.dst.copy_, self.src), self.dev,
                             DRIFT_REPS, label="drift_copy")[0]
        self.samples.append({"after": after, "at_s": round(time.perf_counter() - self.started, 2),
                             "gemm_s": _r(gemm), "copy_s": _r(copy)})

    def record(self) -> dict[str, Any]:
        return {"gemm": [DRIFT_GEMM] * 3, "copy_elems": DRIFT_COPY_ELEMS, "reps": DRIFT_REPS,
                "statistic": "median of reps, after each step of the run",
                "samples": self.samples}


def _steady_allocator() -> str:
    """Keep freed host memory in the process (glibc): no mmap, no trimming.

    By default glibc serves large blocks with fresh mmaps and returns freed
    memory to the OS, so whether a tensor of a few MB (an activation, an
    embedding table's dense gradient) costs page faults on first touch depends
    on the allocator's history: the same layer measured 0.2 ms or 2 ms from one
    iteration to the next. With mmap off and trimming off, every iteration
    after the warm-up reuses memory, as a caching allocator (jemalloc,
    tcmalloc, PyTorch's CUDA allocator) does in a training job. Returns what
    was done, for the profile's raw record.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "unchanged (no glibc mallopt)"
    m_trim_threshold, m_mmap_max = -1, -4
    ok = mallopt(m_mmap_max, 0) == 1 and mallopt(m_trim_threshold, 2**31 - 1) == 1
    return "glibc mallopt: M_MMAP_MAX=0, M_TRIM_THRESHOLD=2^31-1" if ok else "unchanged (mallopt failed)"


def setup_host(device: str, threads: int | None = None) -> tuple[Any, dict[str, Any]]:
    """Prepare this process for timing ``device`` as every ``hetsim profile`` suite does.

    Checks the device, sets torch's intra-op threads (default: the CPUs this
    process may use) and keeps freed host memory in the process (see
    :func:`_steady_allocator`).

    Returns:
        ``(torch.device, record)``, the record holding ``device``, ``threads``,
        ``cpus``, ``clock`` (:func:`clock_kind`) and ``host_allocator``.

    Raises:
        ConfigError: for a device that is not available.
    """
    import torch

    dev = check_device(device)
    n_threads = threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                            else os.cpu_count() or 1)
    torch.set_num_threads(int(n_threads))
    return dev, {"device": str(dev), "threads": int(n_threads), "cpus": os.cpu_count() or 1,
                 "clock": clock_kind(dev), "host_allocator": _steady_allocator()}


def describe_device(dev: Any) -> dict[str, Any]:
    """Provenance of a measurement on ``dev``: ``device_name`` (CPU model or GPU name),
    ``torch`` version, ``cpu_capability`` and ``host``."""
    import torch

    return {"device_name": _device_name(dev), "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "host": platform.node()}


def time_callable(fn: Callable[[], Any], dev: Any, repeats: int, warmup: int = 1,
                  label: str = "call") -> tuple[float, float, list[float]]:
    """Time ``fn`` on ``dev`` the way :func:`measure` times its benchmarks.

    ``warmup`` untimed calls, one more untimed call, then ``repeats`` samples
    with the clock of :func:`clock_kind` (CUDA events on a GPU; the thread's CPU
    time with one CPU thread; ``torch.profiler`` ranges otherwise).

    Returns:
        ``(median_s, rel_iqr, samples_s)``.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError("repeats must be >= 1 and warmup >= 0")
    spec = ProfileSpec(gemm=(), copy_elems=(), micro=(), models={}, min_reps=repeats,
                       max_reps=repeats, target_s=0.0, net_bytes=(), net_reps=0, warmup=warmup)
    samples = _OpTimer(dev, spec).time(fn, label)
    med, iqr = _median_iqr(samples)
    return med, iqr, samples


def measure(device: str = "cpu", quick: bool = False, threads: int | None = None,
            models: Sequence[str] | None = None, network: bool = True,
            spec: ProfileSpec | None = None, progress: bool = False,
            drift: bool = True, rounds: int | None = None) -> dict[str, Any]:
    """Run every benchmark and return the raw measurements (JSON-ready).

    Args:
        device: 'cpu' or 'cuda:N'.
        quick: the small spec (see :func:`spec_for`), unless ``spec`` is given.
        threads: torch intra-op threads (default: the CPUs this process may use).
        models: zoo models to time (default: the spec's).
        network: run the two-process network benchmark. Should it fail (it runs
            last; any exception but Ctrl-C), the rest is returned all the same,
            with its error in ``raw["network_error"]`` and the network part missing
            or partial.
        spec: sizes to use instead of :func:`spec_for`.
        progress: show a progress bar on stderr.
        drift: time the drift probe after every step (:class:`_DriftProbe`,
            ``raw["drift"]``).
        rounds: take the repeats of the GEMM grid, bandwidth, dispatch,
            single-layer benchmarks and zoo models in this many interleaved
            rounds (:func:`_run_rounds`; default the spec's), each figure then
            the :data:`ROUNDS_QUANTILE`-th percentile of its samples (the median
            with one round); the quantization, host-device, network and (on a
            CPU) cold-call benchmarks run once.
    """
    from sim import zoo

    check_device(device)  # an unavailable device is reported before a bad model name
    spec = spec or spec_for(quick)
    chosen = {m: spec.models[m] for m in (models if models is not None else spec.models)}
    unknown = sorted(set(chosen) - set(zoo.names()))
    if unknown:
        raise ConfigError("<command line>", "--models", f"unknown zoo model {unknown[0]!r}")
    rounds = spec.rounds if rounds is None else rounds
    if rounds < 1:
        raise ConfigError("<command line>", "--rounds", f"must be at least 1, got {rounds}")
    dev, host = setup_host(device, threads)
    dtypes = ["fp32"] + (["bf16", "fp16"] if dev.type == "cuda" else [])
    steps = (rounds * (len(spec.gemm) * len(dtypes) + 2 + len(spec.micro)
                       + sum(len(b) for b in chosen.values()))
             + 1 + int(network) + int(dev.type == "cuda") + int(dev.type == "cpu"))
    started = time.perf_counter()
    probe = _DriftProbe(dev, started) if drift else None
    bar = _Progress(steps, progress, probe.sample if probe is not None else None)
    timer = _OpTimer(dev, spec)
    raw: dict[str, Any] = {"device": host["device"], "threads": host["threads"], "quick": quick,
                           "clock": host["clock"], "statistic": statistic_of(rounds),
                           "host_allocator": host["host_allocator"], "cpus": host["cpus"],
                           "rounds": rounds}
    try:
        raw.update(_measure_items(dev, spec, timer, dtypes, chosen, bar, rounds))
        raw["quant"] = quant_bench(timer, 1 << (18 if quick else 20))
        bar.step("quantization")
        if dev.type == "cpu":  # a GPU's passes do not flush the host's caches
            raw["cold"] = cold_bench(dev)
            bar.step("cold calls")
        if dev.type == "cuda":
            raw["host_device"] = _host_device(timer, dev)
            bar.step("host-device copies")
        if network:
            try:
                raw["network"] = network_bench(device, spec.net_bytes, spec.net_reps)
                if dev.type == "cpu":
                    raw["network"].update(wake_bench(spec.wake_rounds))
                    raw["network"].update(wire_bench(reps=spec.wire_reps))
            except Exception as e:  # noqa: BLE001 - any failure; Ctrl-C still propagates
                # it runs last: keep the rest of the run (run_profile writes it, then
                # reports this), with the network part missing or partial
                raw["network_error"] = (str(e) if isinstance(e, HetsimError)
                                        else f"network benchmark: {type(e).__name__}: {e}")
            bar.step("network")
    finally:
        bar.close()
    if probe is not None:
        raw["drift"] = probe.record()
    raw["wall_s"] = round(time.perf_counter() - started, 1)
    return raw


#: With several rounds (``hetsim profile --rounds``), the percentile of an item's
#: pooled samples that is kept: on a host whose speed switches between a fast and a
#: slow state every few seconds, a median falls in whichever state held most of an
#: item's samples, a low percentile in the fast one for every item alike.
ROUNDS_QUANTILE = 20.0


def _rounds_quantile(rounds: int) -> float:
    """The percentile of its samples each figure keeps: the median with one round."""
    return 50.0 if rounds == 1 else ROUNDS_QUANTILE


def statistic_of(rounds: int) -> str:
    """``raw["statistic"]``: what each figure of a profile measured in ``rounds`` is."""
    if rounds == 1:
        return "median of repeats after warm-up"
    return (f"{ROUNDS_QUANTILE:g}th percentile of the repeats, taken in {rounds} interleaved "
            "rounds (each item warmed up again at each visit)")


def _run_rounds(groups: Sequence[tuple[str, Sequence[Any]]], rounds: int,
                bar: _Progress | None) -> None:
    """Sample every item (:class:`_OpItem`, :class:`_ModelTimer`) of ``groups`` in
    ``rounds`` rounds.

    Each round visits the groups in order and every item of a group for its share of
    the repeats its warm-up sets, ``ceil(reps / rounds)`` (at least 1), so an item's
    samples are spread over the whole run instead of a few seconds of it. One
    progress step per group and round (``" (round r/R)"`` appended to its label with
    several rounds). With one round this is the back-to-back timing of every item.
    """
    share: dict[int, int] = {}
    for r in range(rounds):
        tag = f" (round {r + 1}/{rounds})" if rounds > 1 else ""
        for label, items in groups:
            for item in items:
                if r == 0:
                    share[id(item)] = max(1, math.ceil(item.start() / rounds))
                item.visit(share[id(item)])
            if bar is not None:
                bar.step(label + tag)


def _micro_timers(names: Sequence[str], dev: Any, spec: ProfileSpec
                  ) -> list[tuple[str, dict[str, Any], list[tuple[int, _ModelTimer]]]]:
    """(name, the extracted one-layer model's record, [(batch, timer)]) of each
    single-layer benchmark ``names`` (:func:`_micro_layers`) on ``dev``."""
    import torch

    out = []
    for name in names:
        module, make, batches = _micro_layers(name, dev)
        module = module.to(dev).train()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            cpu_mod, cpu_make, _ = _micro_layers(name, torch.device("cpu"))
            model, _layer = _single_layer(cpu_mod, cpu_make(batches[0]))
        out.append((name, model.to_dict(),
                    [(bs, _ModelTimer(module, make(bs), dev, spec)) for bs in batches]))
    return out


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


def _measure_items(dev: Any, spec: ProfileSpec, timer: _OpTimer, dtypes: Sequence[str],
                   chosen: dict[str, tuple[int, ...]], bar: _Progress, rounds: int
                   ) -> dict[str, Any]:
    """:func:`measure`'s timed part, in ``rounds`` rounds (:func:`_run_rounds`): the
    GEMM grid, copy and add bandwidth, dispatch, the single-layer benchmarks and the
    zoo models. Every model is built first and kept until the last round."""
    import torch

    tdt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    bar.note("building the benchmarks and models")
    groups: list[tuple[str, Sequence[Any]]] = []
    gemm = []
    for dt in dtypes:
        for m, n, k in spec.gemm:
            lhs = torch.randn(m, k, device=dev, dtype=tdt[dt])
            rhs = torch.randn(k, n, device=dev, dtype=tdt[dt])
            item = _OpItem(timer, functools.partial(torch.mm, lhs, rhs), f"mm{m}x{n}x{k}")
            gemm.append(({"dtype": dt, "m": m, "n": n, "k": k, "flops": 2.0 * m * n * k}, item))
            groups.append((f"gemm {dt} {m}x{n}x{k}", [item]))
    # bandwidth: copy (read + write), add (2 reads + write); dispatch: 1-element add
    bw = []
    for n in spec.copy_elems:
        x = torch.randn(n, device=dev)
        y = torch.empty_like(x)
        bw.append(({"op": "copy", "elems": n, "bytes": 8.0 * n},
                   _OpItem(timer, functools.partial(y.copy_, x), f"copy{n}")))
        bw.append(({"op": "add", "elems": n, "bytes": 12.0 * n},
                   _OpItem(timer, functools.partial(torch.add, x, x, out=y), f"add{n}")))
    groups.append(("bandwidth", [item for _, item in bw]))
    one = torch.ones(1, device=dev)
    dispatch = _OpItem(timer, functools.partial(one.add, one), "dispatch")
    groups.append(("dispatch", [dispatch]))
    micro = _micro_timers(spec.micro, dev, spec)
    groups += [(f"layer {name}", [t for _, t in runs]) for name, _, runs in micro]
    models = _model_timers(chosen, dev, spec)
    groups += [(f"{name} b={b}", [t]) for name, b, t in models]
    _run_rounds(groups, rounds, bar)
    q = _rounds_quantile(rounds)

    def row(head: dict[str, Any], item: _OpItem) -> dict[str, Any]:
        t_s, iqr = item.figures(q)
        return {**head, "t_s": t_s, "rel_iqr": iqr}

    out: dict[str, Any] = {"gemm": [row(h, it) for h, it in gemm],
                           "bandwidth": [row(h, it) for h, it in bw]}
    out["dispatch_s"], out["dispatch_rel_iqr"] = dispatch.figures(q)
    out["micro"] = _micro_entries(micro, q)
    out["models"] = _model_entries(models, q)
    return out


def _model_timers(chosen: dict[str, tuple[int, ...]], dev: Any, spec: ProfileSpec
                  ) -> list[tuple[str, int, _ModelTimer]]:
    """A fresh zoo model (``zoo.torch_module``, in training mode on ``dev``) and its
    timer per (model, batch size) of ``chosen``."""
    from sim import zoo

    out = []
    for name, batches in chosen.items():
        for b in batches:
            module, example = zoo.torch_module(name, batch_size=b)
            out.append((name, b, _ModelTimer(module.to(dev).train(), _to(example, dev), dev, spec)))
    return out


def _model_entries(models: Sequence[tuple[str, int, _ModelTimer]], quantile: float
                   ) -> dict[str, list[dict[str, Any]]]:
    """``raw["models"]``: per model, one run per batch size (:meth:`_ModelTimer.result`)."""
    by_model: dict[str, list[dict[str, Any]]] = {}
    for name, b, t in models:
        by_model.setdefault(name, []).append({"batch": b, **t.result(quantile)})
    return by_model


def measure_models(chosen: dict[str, tuple[int, ...]], dev: Any, spec: ProfileSpec,
                   bar: _Progress | None = None, rounds: int = 1) -> dict[str, list[dict[str, Any]]]:
    """The zoo models ``chosen`` (name -> batch sizes) on ``dev``, timed as :func:`measure`
    times them with ``spec``'s repeats in ``rounds`` rounds, each built afresh: a
    ``raw["models"]`` entry. The process must be set up first (:func:`setup_host`)."""
    models = _model_timers(chosen, dev, spec)
    _run_rounds([(f"{name} b={b}", [t]) for name, b, t in models], rounds, bar)
    return _model_entries(models, _rounds_quantile(rounds))


def measure_micro(names: Sequence[str], dev: Any, spec: ProfileSpec,
                  bar: _Progress | None = None, rounds: int = 1) -> list[dict[str, Any]]:
    """The single-layer benchmarks ``names`` (:func:`_micro_layers`) on ``dev``: one
    ``raw["micro"]`` entry each, ``{"name", "model" (the extracted one-layer model),
    "runs": [{"batch", "iter_s", "layers", "own"}]}``, timed as :func:`measure` times
    them with ``spec``'s repeats in ``rounds`` rounds. The process must be set up
    first (:func:`setup_host`)."""
    timers = _micro_timers(names, dev, spec)
    _run_rounds([(f"layer {name}", [t for _, t in runs]) for name, _, runs in timers],
                rounds, bar)
    return _micro_entries(timers, _rounds_quantile(rounds))


#: Bytes (MiB, read and written by one copy) the cold-call benchmark moves before
#: each timed call: from what the caches hold to well past them.
COLD_MOVED_MIB = (0.25, 1, 4, 16, 64, 256)
#: Cases per size and call of the cold-call benchmark (the median is kept).
COLD_REPS = 15


def cold_calls(dev: Any) -> dict[str, Callable[[], Any]]:
    """The cold-call benchmark's small calls, by name: an in-place ReLU over 16 KiB
    (``relu``), an ``nn.Linear(64, 64)`` on 8 rows with autograd recording
    (``linear``), an ``nn.Embedding(10000, 16)`` lookup of 32 rows (``embedding``)."""
    import torch

    relu = torch.nn.ReLU(inplace=True)
    z = torch.randn(4096, device=dev)
    lin = torch.nn.Linear(64, 64).to(dev)
    x = torch.randn(8, 64, device=dev, requires_grad=True)
    emb = torch.nn.Embedding(10_000, 16).to(dev)
    ids = torch.randint(0, 10_000, (32,), device=dev)
    return {"relu": lambda: relu(z), "linear": lambda: lin(x), "embedding": lambda: emb(ids)}


def cold_bench(dev: Any, moved_mib: Sequence[float] = COLD_MOVED_MIB, reps: int = COLD_REPS,
               progress: Callable[[], None] | None = None) -> dict[str, Any]:
    """What a small call costs right after a pass that streamed a lot of memory.

    For each size, ``reps`` times: a ``copy_`` between two buffers that reads and
    writes ``moved_mib`` MiB (not timed), then one call of each of
    :func:`cold_calls` timed (cold), then the same call again at once (warm).
    Timed with the profile's clock (on one CPU thread its CPU time). A pass that
    streams more than the caches hold evicts the framework's code and data and
    the next call's tensors; the cost model adds the difference to the pass after
    passes that moved that much (``corrections.cold_calls``). ``progress``: called after
    each size.

    Returns:
        ``{"moved_bytes": [...], "cold_s": {call: [...]}, "warm_s": {call: [...]},
        "reps": reps, "statistic": ...}``, one median per size.
    """
    import torch

    calls = cold_calls(dev)
    for call in calls.values():  # first calls pay one-time costs
        call()
    clock = _Clock(dev)
    half = int(max(moved_mib) * 2**20 / 2 / 4)  # fp32 elements of each buffer at the largest size
    src, dst = torch.randn(half, device=dev), torch.empty(half, device=dev)
    cold: dict[str, list[float]] = {k: [] for k in calls}
    warm: dict[str, list[float]] = {k: [] for k in calls}
    for mib in moved_mib:
        n = int(mib * 2**20 / 2 / 4)
        a, b = src[:n], dst[:n]
        for name, call in calls.items():
            c, w = [], []
            for _ in range(reps):
                b.copy_(a)
                clock.sync()
                t0 = clock.mark()
                call()
                t1 = clock.mark()
                call()
                t2 = clock.mark()
                c.append(clock.seconds(t0, t1))
                w.append(clock.seconds(t1, t2))
            cold[name].append(_r(statistics.median(c)))
            warm[name].append(_r(statistics.median(w)))
        if progress is not None:
            progress()
    return {"moved_bytes": [int(m * 2**20) for m in moved_mib], "cold_s": cold, "warm_s": warm,
            "reps": reps, "statistic": "median of reps; cold: right after the copy, warm: again at once"}


def quant_bench(timer: _OpTimer, n: int) -> list[dict[str, Any]]:
    """The runtime's gradient pack and unpack (``runtime.quant``, on the host CPU where the
    runtime runs them) of ``n`` fp32 values at each bit width below 32.

    Measured with freed memory kept (:func:`runtime.launch.keep_freed_memory`, from here on
    for this process), as every rank of the runtime runs: otherwise glibc hands the
    temporaries back and each repeat faults them in again, and the figures vary 2-4x
    from run to run (measured: 8-bit pack of 2^20 values 10-11 ns per value, kept 4.8).
    """
    import torch

    from runtime import quant
    from runtime.launch import keep_freed_memory

    keep_freed_memory()

    x = torch.randn(n)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for bits in (2, 4, 8, 16):
        buf = quant.pack(x, bits, gen)
        pk = _median_iqr(timer.time(functools.partial(quant.pack, x, bits, gen), f"pack{bits}"))
        up = _median_iqr(timer.time(functools.partial(quant.unpack, buf, n, bits), f"unpack{bits}"))
        rows.append({"bits": bits, "values": n, "pack_s": _r(pk[0]), "pack_rel_iqr": _r(pk[1]),
                     "unpack_s": _r(up[0]), "unpack_rel_iqr": _r(up[1])})
    return rows


def quant_costs(raw: dict[str, Any]) -> dict[str, dict[str, float]] | None:
    """The profile's ``quant`` entry (seconds per value by bit width) from :func:`quant_bench` rows."""
    rows = raw.get("quant")
    if not rows:
        return None
    return {str(r["bits"]): {"pack_s_per_value": _r(r["pack_s"] / r["values"]),
                             "unpack_s_per_value": _r(r["unpack_s"] / r["values"])} for r in rows}


def _host_device(timer: _OpTimer, dev: Any) -> dict[str, Any]:
    import torch

    n = 16_000_000
    host = torch.empty(n, pin_memory=True)
    gpu = torch.empty(n, device=dev)
    h2d = _median_iqr(timer.time(lambda: gpu.copy_(host, non_blocking=True), "h2d"))
    d2h = _median_iqr(timer.time(lambda: host.copy_(gpu, non_blocking=True), "d2h"))
    return {"bytes": 4 * n, "h2d_s": _r(h2d[0]), "h2d_rel_iqr": _r(h2d[1]),
            "d2h_s": _r(d2h[0]), "d2h_rel_iqr": _r(d2h[1]),
            "h2d_Bps": _r(4 * n / h2d[0]), "d2h_Bps": _r(4 * n / d2h[0])}


def build_profile(raw: dict[str, Any], name: str, fit: bool = True) -> DeviceProfile:
    """The measured :class:`DeviceProfile` of ``raw`` (from :func:`measure`).

    Per-layer tables come from the zoo models' runs, keyed by
    :func:`sim.costmodel.table_key` (layers of equal key pooled by
    median); the efficiency curves, memory bandwidth and dispatch overhead are
    fitted by :func:`hardware_profiles.calibrate.fit` when ``fit`` is true.
    """
    import torch

    from hardware_profiles import calibrate

    dev_s = raw["device"]
    cuda = dev_s.startswith("cuda")
    peaks: dict[str, float] = {}
    for row in raw["gemm"]:
        rate = row["flops"] / row["t_s"]
        peaks[row["dtype"]] = max(peaks.get(row["dtype"], 0.0), rate)
    # Effective rates of the single-layer GEMMs and convolutions count too: a
    # Winograd or FFT convolution beats any GEMM in FLOPs as the flop counter
    # counts them (direct convolution), and efficiencies are capped at 1.5.
    for entry in raw.get("micro", []):
        for ly in entry["model"]["layers"]:
            if ly["op"] not in ("gemm", "conv") or not ly["fwd_flops"]:
                continue
            for run in entry["runs"]:
                t = run["layers"].get(ly["name"], [0.0])[0]
                if t > 0:
                    peaks["fp32"] = max(peaks["fp32"], ly["fwd_flops"] * run["batch"] / t)
    # DRAM bandwidth: the largest copy (smaller ones run from cache; the
    # bandwidth curves of the fit carry that, with efficiencies above 1)
    big = max((r for r in raw["bandwidth"] if r["op"] == "copy"), key=lambda r: r["elems"])
    mem_bw = big["bytes"] / big["t_s"]
    if cuda:
        props = torch.cuda.get_device_properties(torch.device(dev_s))
        memory = float(props.total_memory)
    else:
        import psutil

        memory = float(psutil.virtual_memory().total)
    net = raw.get("network") or {}
    cpus = int(raw.get("cpus") or raw["threads"])  # the device is the whole machine
    source = {
        "kind": "measured",
        "date": _dt.date.today().isoformat(),
        "device": raw.get("device_name", ""),
        "torch": raw.get("torch", ""),
        "threads": raw["threads"],
        "cpus": cpus,
        "cpu_capability": raw.get("cpu_capability", ""),
        "host": raw.get("host", ""),
        "quick": bool(raw.get("quick")),
        "wall_s": raw.get("wall_s"),
        "note": (
            "Measured by `hetsim profile`. peak_flops: the best effective rate measured per dtype "
            "(GEMM grid; for fp32 also single Linear/Conv2d layers, whose FLOPs are counted as "
            "direct convolution): achieved, not nominal; mem_bw_Bps: the largest copy measured "
            "(DRAM); launch_overhead_s, efficiency, efficiency_bwd, mem_efficiency(_bwd): fitted "
            "by `hetsim calibrate` to the raw measurements (see hardware_profiles/README.md); "
            "layers: median forward/backward seconds of the zoo models' layers; nic_bw_Bps: the "
            "measured loopback point-to-point bandwidth when measured (a single-host figure, "
            "not a NIC's). "
            + ("price_per_hour and power_w: not measured (0)." if cuda else
               "price_per_hour: 0.0425 USD per vCPU-hour x cpus; power_w: 4.6875 W per vCPU "
               "active, 30% of that idle (the cpu-2c datasheet assumptions), not measured.")
        ),
    }
    data: dict[str, Any] = {
        "schema": 2,
        "name": name,
        "kind": "gpu" if cuda else "cpu",
        "peak_flops": {k: _r(v) for k, v in peaks.items()},
        "mem_bw_Bps": _r(mem_bw),
        "memory_bytes": memory,
        "launch_overhead_s": _r(raw["dispatch_s"]),
        "nic_bw_Bps": _r(net.get("p2p_bw_Bps") or 1.25e9),
        "price_per_hour": 0.0 if cuda else round(0.0425 * cpus, 4),
        "power_w": ({"idle": 0.0, "active": 0.0} if cuda else
                    {"idle": round(0.3 * 4.6875 * cpus, 4), "active": round(4.6875 * cpus, 4)}),
        "source": source,
        "corrections": {
            "dense_sparse_grad": {},  # nn.Embedding's default: a dense gradient of the table
            # a first layer's backward computes the weight gradient only (its bytes as such)
            "weight_grad_only_bwd": {},
        },
        "layers": calibrate.layer_tables(raw),
        "measurement": {"spread": calibrate.spread_of(raw), "raw": raw},
    }
    if net:
        data["network"] = {k: v for k, v in net.items()}
    if quant_costs(raw):
        data["quant"] = quant_costs(raw)
    profile = DeviceProfile.model_validate(data)
    if fit:
        profile = calibrate.calibrate(profile).profile
    return profile


def write_profile(profile: DeviceProfile, out: str | os.PathLike[str]) -> Path:
    """Write ``profile`` as compact JSON (one key per line at the top level)."""
    p = Path(out)
    data = profile.model_dump(by_alias=True, exclude_none=True, mode="json")
    lines = [f"  {json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in data.items()]
    return atomic_write(p, "{\n" + ",\n".join(lines) + "\n}\n")


def run_profile(device: str, out: str | os.PathLike[str], quick: bool = False,
                threads: int | None = None, models: Sequence[str] | None = None,
                network: bool = True, progress: bool = True,
                spec: ProfileSpec | None = None, rounds: int | None = None
                ) -> tuple[DeviceProfile, Path]:
    """``hetsim profile``: measure ``device``, fit, and write the profile to ``out``.

    The profile's name is the stem of ``out``. The device and the output path
    are checked before anything is measured.

    Raises:
        ConfigError: for an unavailable device or an unwritable ``out``.
        HetsimError: when the network benchmark fails; every other measurement is
            written to ``out`` first (fitted), the network part missing or partial.
    """
    check_device(device)
    path = check_writable(out)
    raw = measure(device, quick=quick, threads=threads, models=models, network=network,
                  spec=spec, progress=progress, rounds=rounds)
    raw.update(describe_device(check_device(device)))
    try:
        profile = build_profile(raw, path.stem)
    except Exception:
        # keep what was measured: the profile unfitted (raw data, per-layer tables),
        # which `hetsim calibrate` fits once the fault is mended
        write_profile(build_profile(raw, path.stem, fit=False), path)
        print(f"hetsim profile: the fit failed; the measurements are kept, unfitted, in {path} "
              f"(fit them with: hetsim calibrate {path})"
              + (f"; {raw['network_error']}" if raw.get("network_error") else ""), file=sys.stderr)
        raise
    write_profile(profile, path)
    if raw.get("network_error"):
        kept = ("with part of the network measurements" if "network" in raw
                else "without the network part")
        raise HetsimError(f"{raw['network_error']}; every other measurement is kept in {path}, "
                          f"fitted, {kept}")
    return profile, path


def add_micro(path: str | os.PathLike[str], names: Sequence[str], device: str | None = None,
              threads: int | None = None, progress: bool = True
              ) -> tuple[DeviceProfile, list[dict[str, Any]]]:
    """Measure single-layer benchmarks into a measured profile, refit it, write it back.

    Times ``names`` (single-layer benchmarks of the grid, :data:`_ALL_MICRO`, or of
    :data:`_EXTRA_MICRO`, and
    ``"cold"``, the cold-call benchmark :func:`cold_bench` of a CPU profile, which
    goes to ``raw.cold``; ``["missing"]``: those of the grid, and ``cold``, that the
    profile lacks) as
    :func:`measure` does, with the profile's own settings: its device, torch
    threads (hence clock) and repeat counts (``raw.quick``), on the host that
    measured it.
    Each entry replaces the one of its name in ``raw.micro`` or is added after
    them; ``raw.micro_note`` gets a line saying which entries were measured when
    (UTC), ``source.note`` a pointer to it. The curves are then re-fitted
    (:func:`hardware_profiles.calibrate.calibrate`, which keeps the per-layer
    tables); ``peak_flops`` and ``mem_bw_Bps`` stay as measured with the profile.

    Returns:
        (the written profile, the new entries: ``raw.micro``'s, and for ``"cold"``
        ``raw.cold`` with ``"name": "cold"``); with nothing to measure, (the
        profile as loaded, []), and nothing is written.

    Raises:
        ConfigError: the file is not a measured profile with raw single-layer
            benchmarks, a name is not one of the grid, ``cold`` is asked of a GPU
            profile, ``device`` or ``threads`` differ from the profile's, or this
            host, its CPU or torch are not those the profile was measured on.
    """
    from hardware_profiles import calibrate, load_profile_file

    shown = os.fspath(path)
    prof = load_profile_file(path)
    raw = dict(prof.measurement.raw or {})
    if prof.source.kind != "measured" or "micro" not in raw:
        raise ConfigError(shown, "measurement.raw.micro", "no single-layer benchmarks to add to (make the "
                          "profile with hetsim profile)")
    have = [e["name"] for e in raw["micro"]] + (["cold"] if "cold" in raw else [])
    on_cpu = str(raw["device"]).startswith("cpu")
    todo = ([n for n in (*_ALL_MICRO, *(["cold"] if on_cpu else [])) if n not in have]
            if list(names) == ["missing"] else list(dict.fromkeys(names)))
    if "cold" in todo and not on_cpu:
        raise ConfigError("<command line>", "--add-micro", "'cold' is a CPU benchmark (a GPU's "
                          "passes do not flush the host's caches)")
    unknown = [n for n in todo if n not in (*_ALL_MICRO, *_EXTRA_MICRO) and n != "cold"]
    if unknown:
        raise ConfigError("<command line>", "--add-micro", f"{unknown[0]!r} is not a single-layer "
                          "benchmark of the grid")
    for flag, given, own in (("--device", device, raw["device"]),
                             ("--threads", threads, raw["threads"])):
        if given is not None and str(given) != str(own):
            raise ConfigError("<command line>", flag, f"{given} differs from the profile's {own}")
    dev, host = setup_host(str(raw["device"]), int(raw["threads"]))
    here = {**host, **describe_device(dev)}
    for key in ("clock", "host_allocator", "device_name", "torch", "cpu_capability", "host"):
        if key in raw and here[key] != raw[key]:
            raise ConfigError(shown, f"measurement.raw.{key}", f"measured with {raw[key]!r}, here {here[key]!r}: "
                              "re-measure the whole profile instead")
    if not todo:  # nothing missing: the profile stays as it is
        return prof, []
    spec = spec_for(bool(raw.get("quick")))
    rounds = int(raw.get("rounds", 1))
    layers = [n for n in todo if n != "cold"]
    start = _dt.datetime.now(_dt.UTC)
    bar = _Progress(len(layers) * rounds + int("cold" in todo), progress)
    try:
        new = measure_micro(layers, dev, spec, bar, rounds=rounds) if layers else []
        if "cold" in todo:
            raw["cold"] = cold_bench(dev)
            bar.step("cold calls")
    finally:
        bar.close()
    end = _dt.datetime.now(_dt.UTC)
    by_name = {e["name"]: e for e in new}
    merged = [by_name.pop(e["name"], e) for e in raw["micro"]] + list(by_name.values())
    replaced = sorted(set(todo) & set(have))
    line = (f"{', '.join(todo)}: measured {start:%Y-%m-%d %H:%M} - {end:%Y-%m-%d %H:%M} UTC by "
            f"hetsim profile --add-micro ({raw['threads']} thread(s), clock {raw['clock']}, the "
            f"{'quick' if raw.get('quick') else 'full'} spec's repeats in "
            f"{rounds} round(s)) and merged into this "
            "profile's raw.micro" + (f" (cold: raw.cold, {COLD_REPS} cases a size in one pass)"
                                     if "cold" in todo else "")
            + (f", replacing the earlier {', '.join(replaced)}" if replaced else "")
            + "; the curves re-fitted.")
    raw.update(micro=merged, micro_note="\n".join(x for x in (raw.get("micro_note"), line) if x))
    source = prof.source.model_dump()
    pointer = "Single-layer benchmarks measured after the rest: see raw.micro_note."
    if pointer not in source["note"]:
        source["note"] = f"{source['note']} {pointer}".strip()
    updated = prof.model_copy(update={"measurement": prof.measurement.model_copy(update={"raw": raw}),
                                      "source": Source.model_validate(source)})
    fitted = calibrate.calibrate(updated).profile
    write_profile(fitted, path)
    return fitted, new + ([{"name": "cold", **raw["cold"]}] if "cold" in todo else [])


def summary(profile: DeviceProfile) -> str:
    """A few lines describing a measured profile."""
    from hardware_profiles import calibrate

    src = profile.source.model_dump()
    net = profile.network.model_dump() if profile.network else {}
    spread = profile.measurement.spread or {}
    lines = [
        f"{profile.name}: {src.get('device', '')} ({profile.kind}), torch {src.get('torch', '')}, "
        f"{src.get('threads')} thread(s), {src.get('wall_s')} s",
        "peak (best GEMM): " + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in profile.peak_flops.items())
        + f"; copy bandwidth {profile.mem_bw_Bps / 1e9:.1f} GB/s; launch {profile.launch_overhead_s * 1e6:.2f} us",
        f"per-layer tables: {len(profile.layers or {})} signatures",
    ]
    if net:
        lines.append(f"network ({net.get('backend')}): p2p {net.get('p2p_latency_s', 0) * 1e6:.0f} us, "
                     f"{(net.get('p2p_bw_Bps') or 0) / 1e9:.2f} GB/s; all-reduce "
                     f"{net.get('allreduce_latency_s', 0) * 1e6:.0f} us, "
                     f"{net.get('allreduce_bw_Bps', 0) / 1e9:.2f} GB/s")
    if spread:
        lines.append(f"spread (relative IQR of repeats): per layer median {spread.get('layer_median')}, "
                     f"p90 {spread.get('layer_p90')}; whole iteration median {spread.get('iteration_median')}")
    drift = calibrate.drift_of(profile.measurement.raw or {})
    if drift is not None:
        lines.append(drift_line(drift))
    cold = profile.corrections.cold_calls
    if cold is not None:
        at = 16 * 2**20
        lines.append(f"cold calls (window {cold.window} passes): after 16 MiB moved, "
                     + ", ".join(f"{op} +{cold.curves[op].at(at) * 1e6:.1f} us"
                                 for op in ("elementwise", "gemm", "embedding") if op in cold.curves))
    return "\n".join(lines)


def drift_line(drift: dict[str, Any]) -> str:
    """One line on the drift probe's figures (:func:`hardware_profiles.calibrate.drift_of`)."""
    return (f"drift (the same {DRIFT_GEMM}^3 GEMM and {8 * DRIFT_COPY_ELEMS / 2**20:.0f} MiB copy after each of "
            f"{drift['samples']} steps): GEMM times relative IQR {100 * drift['gemm_iqr']:.1f}%, "
            f"range {100 * drift['gemm_range']:.0f}%; copy relative IQR "
            f"{100 * drift['copy_iqr']:.1f}%, range {100 * drift['copy_range']:.0f}%")
