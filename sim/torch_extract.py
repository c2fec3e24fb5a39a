"""Extract a :class:`~sim.workload.Model` layer list from any ``torch.nn.Module``.

One forward and one backward pass of the module on an example batch are run
under a ``TorchDispatchMode`` that sees every aten op. FLOPs per op come from
the registry of ``torch.utils.flop_counter`` (the one ``FlopCounterMode``
uses), and ops without a formula are decomposed the way ``FlopCounterMode``
decomposes them, so the extracted totals equal ``FlopCounterMode``'s totals
for the same module and input.

Attribution:

* Forward ops belong to the innermost module call running when they execute
  (module forward pre/post hooks keep a stack of calls).
* Backward ops belong to the module call that created the autograd node the
  engine is executing. When a call returns, every autograd node reachable from
  its outputs that no earlier call claimed is claimed by it; when a call
  starts, the unclaimed history of its inputs is claimed by the enclosing
  call (that is work the parent did itself before calling the child).
  Backward ops of unclaimed nodes (e.g. the loss) go to the root call.

Layers, in execution order:

* one per call of a *leaf call* (a module call during which no other hooked
  module was called) that does work: has FLOPs, owns parameters or runs at
  least one kernel. ``nn.MultiheadAttention`` is a leaf call (it uses its
  ``out_proj`` weights functionally), so it becomes one ``attention`` layer.
* one ``<fqn>.self`` layer (``self`` for the root) for a non-leaf call whose
  own work has FLOPs or owns parameters, e.g. a functional matmul in a custom
  ``forward``. It is placed where its first FLOP-carrying op ran, and its
  ``activation_bytes`` are the output of its last FLOP-carrying op.

A module called several times gives one layer per call, named ``fqn#1``,
``fqn#2``, ...; its parameters go to the first. A parameter shared between
modules is counted once, on the first executed layer that holds it; a
parameter of a module that never runs as a module (``out_proj`` above) goes to
its nearest executed ancestor. ``param_bytes`` counts trainable parameters in
fp32 (4 bytes an element) whatever their dtype.

Kernel count: the number of aten ops the layer's own forward work dispatched,
not counting views and allocations (``empty*``), at least 1. It is an
estimate of launches: a fused or decomposed op may launch more or fewer.

The module's mode is used as given (train mode measures what training runs);
its buffers (e.g. BatchNorm running statistics), parameter gradients and the
RNG state are restored afterwards.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from sim.workload import Layer, Model, Sparse

__all__ = ["from_torch"]

_FP32_BYTES = 4

_aten = torch.ops.aten
# Ops that launch no kernel: allocations and scalar reads (views are detected
# through OpOverload.is_view).
_NO_KERNEL = {_aten.empty, _aten.empty_like, _aten.empty_strided, _aten.lift_fresh,
              _aten._local_scalar_dense}

_GEMM_OPS = {"mm", "addmm", "bmm", "baddbmm", "_scaled_mm"}
#: Ops on torch.autocast's fp32 list (CUDA) that a layer without FLOPs may run: under
#: mixed precision such a layer computes and writes fp32 (Layer.autocast_fp32).
_AUTOCAST_FP32_OPS = {"_softmax", "softmax", "_log_softmax", "log_softmax", "native_layer_norm",
                      "layer_norm", "native_group_norm", "group_norm", "nll_loss_forward",
                      "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
                      "binary_cross_entropy_with_logits", "kl_div", "logsumexp", "cumsum",
                      "cumprod", "prod", "norm", "linalg_vector_norm", "exp", "log", "pow", "rsqrt"}

_CONV_OPS = {"convolution", "_convolution", "cudnn_convolution", "convolution_overrideable",
             "_slow_conv2d_forward"}


def _op_class_of_aten(func_packet: Any) -> str:
    name = str(func_packet).rsplit(".", 1)[-1]
    if name in _GEMM_OPS:
        return "gemm"
    if name in _CONV_OPS:
        return "conv"
    if "attention" in name:
        return "attention"
    return "elementwise"


def _op_class_of_module(module: nn.Module) -> str | None:
    if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        return "embedding"
    if isinstance(module, nn.MultiheadAttention):
        return "attention"
    if isinstance(module, nn.modules.conv._ConvNd):
        return "conv"
    if isinstance(module, (nn.Linear, nn.Bilinear, nn.RNNBase, nn.RNNCellBase)):
        return "gemm"
    return None


def claim_history(tensors: Iterable[Any], call: Any, owner: dict[Any, Any]) -> None:
    """Make ``call`` the owner of every autograd node reachable from ``tensors`` that no
    call owns yet (the backward work those nodes will do is ``call``'s)."""
    todo: list[Any] = [t.grad_fn for t in tensors if getattr(t, "grad_fn", None) is not None]
    while todo:
        node = todo.pop()
        if node is None or node in owner:
            continue
        owner[node] = call
        todo.extend(nxt for nxt, _ in node.next_functions)


def tensors_in(obj: Any) -> list[torch.Tensor]:
    """The tensors among the leaves of a nested structure (args, kwargs, outputs)."""
    return _tensors(obj)


def _tensors(obj: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(obj)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def _nbytes(obj: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(obj))


@dataclass(eq=False)
class _Call:
    """One invocation of a hooked module and the work it did itself."""

    module: nn.Module
    fqn: str
    seq: int
    has_child_calls: bool = False
    fwd_flops: int = 0
    bwd_flops: int = 0
    kernels: int = 0
    first_flop_seq: int | None = None
    last_flop_out_bytes: int | None = None
    output_bytes: int = 0
    lookups: int = 0  # embedding indices read by this call
    flops_by_class: Counter[str] = field(default_factory=Counter)
    param_bytes: int = 0
    autocast_fp32: bool = False  # ran an op of _AUTOCAST_FP32_OPS


class _Recorder(TorchDispatchMode):
    """Counts FLOPs and kernels per module call; see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.phase: str | None = None  # "forward" | "backward" | None
        self.seq = 0
        self.calls: list[_Call] = []
        self.stack: list[_Call] = []
        # autograd node -> the call that created it. Holding the node objects
        # keeps their Python wrappers (and so their identity) alive.
        self.owner: dict[Any, _Call] = {}

    # -- dispatch ---------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        # Same rule as FlopCounterMode: try a decomposition first, so composite
        # ops are counted through the ops they are made of.
        if func not in flop_registry and func is not torch.ops.prim.device.default:
            with self:
                r = func.decompose(*args, **kwargs)
                if r is not NotImplemented:
                    return r
        out = func(*args, **kwargs)
        self._record(func, out, args, kwargs)
        return out

    def _record(self, func: Any, out: Any, args: Any, kwargs: Any) -> None:
        self.seq += 1
        packet = func._overloadpacket
        formula = flop_registry.get(packet)
        flops = int(formula(*args, **kwargs, out_val=out)) if formula is not None else 0
        if self.phase == "forward":
            if not self.stack:
                return
            call = self.stack[-1]
            if not func.is_view and packet not in _NO_KERNEL:
                call.kernels += 1
            if str(packet).rsplit(".", 1)[-1] in _AUTOCAST_FP32_OPS:
                call.autocast_fp32 = True
            if flops:
                call.fwd_flops += flops
                call.flops_by_class[_op_class_of_aten(packet)] += flops
                if call.first_flop_seq is None:
                    call.first_flop_seq = self.seq
                call.last_flop_out_bytes = _nbytes(out)
        elif self.phase == "backward" and flops:
            node = torch._C._current_autograd_node()
            owner = self.owner.get(node) if node is not None else None
            (owner or self.calls[0]).bwd_flops += flops

    # -- hooks ------------------------------------------------------------
    def _claim(self, tensors: Iterable[torch.Tensor], call: _Call) -> None:
        claim_history(tensors, call, self.owner)

    def pre_hook(self, fqn: str) -> Any:
        def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
            if self.phase != "forward":
                return
            parent = self.stack[-1] if self.stack else None
            inputs = _tensors((args, kwargs))
            if parent is not None:
                parent.has_child_calls = True
                self._claim(inputs, parent)
            self.seq += 1
            call = _Call(module=module, fqn=fqn, seq=self.seq)
            if isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and inputs:
                call.lookups = inputs[0].numel()
            self.calls.append(call)
            self.stack.append(call)

        return hook

    def post_hook(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if self.phase != "forward" or not self.stack or self.stack[-1].module is not module:
            return
        call = self.stack.pop()
        self._claim(_tensors(output), call)
        call.output_bytes = _nbytes(output)


def split_input(example_input: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A model's example input as (positional, keyword) arguments: a mapping is keywords,
    a tuple or list the positional arguments, anything else the one argument."""
    if isinstance(example_input, Mapping):
        return (), dict(example_input)
    if isinstance(example_input, (tuple, list)):
        return tuple(example_input), {}
    return (example_input,), {}


def from_torch(module: nn.Module, example_input: Any, name: str | None = None) -> Model:
    """Extract the layer list of ``module`` by running it once forward and backward.

    Args:
        module: any module; its current train/eval mode is used.
        example_input: a tensor, a tuple of positional inputs, or a mapping of
            keyword inputs. Dim 0 of its first tensor is the batch size; all
            per-sample quantities are divided by it.
        name: model name; the module's class name by default.

    Returns:
        A :class:`Model` whose layer FLOP totals times the batch size equal
        ``FlopCounterMode``'s forward total and backward total (loss = sum of
        the floating-point outputs) for the same module and input.

    Raises:
        ValueError: if ``example_input`` holds no tensor.
    """
    args, kwargs = split_input(example_input)
    inputs = _tensors((args, kwargs))
    if not inputs:
        raise ValueError("example_input must contain at least one tensor")
    batch = inputs[0].shape[0] if inputs[0].dim() > 0 else 1
    if batch < 1:
        raise ValueError("example_input has an empty batch (dim 0 is 0)")

    rec = _Recorder()
    fqns = {m: n for n, m in module.named_modules()}  # first name of a shared module
    handles = []
    for mod, fqn in fqns.items():
        handles.append(mod.register_forward_pre_hook(rec.pre_hook(fqn), with_kwargs=True))
        handles.append(
            mod.register_forward_hook(rec.post_hook, with_kwargs=True, always_call=True)
        )
    params = [p for p in module.parameters()]
    saved_grads = [p.grad for p in params]
    saved_buffers = [(b, b.detach().clone()) for b in module.buffers()]
    cuda = sorted({t.device.index or 0 for t in [*params, *inputs] if t.is_cuda})
    try:
        with torch.random.fork_rng(devices=cuda), rec:
            rec.phase = "forward"
            output = module(*args, **kwargs)
            rec.phase = None
            outs = [t for t in _tensors(output) if t.is_floating_point() and t.requires_grad]
            if outs:
                loss = torch.stack([t.float().sum() for t in outs]).sum()
                rec.phase = "backward"
                loss.backward()
            rec.phase = None
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for b, v in saved_buffers:
                b.copy_(v)
        for p, g in zip(params, saved_grads, strict=True):
            p.grad = g
    calls = rec.calls
    rec.owner.clear()
    if not calls:
        raise ValueError("the module's forward ran no module call")
    _assign_params(module, fqns, calls)
    layers = _layers(calls, batch, root=module)
    return Model(
        name=name or type(module).__name__,
        layers=tuple(layers),
        input_bytes=_nbytes(inputs) / batch,
    )


def _assign_params(module: nn.Module, fqns: dict[nn.Module, str], calls: list[_Call]) -> None:
    """Give every trainable parameter's fp32 bytes to exactly one call."""
    first_call: dict[nn.Module, _Call] = {}
    for c in calls:
        first_call.setdefault(c.module, c)
    by_fqn = dict(module.named_modules(remove_duplicate=False))
    holders: dict[int, list[str]] = {}
    tensors: dict[int, nn.Parameter] = {}
    for mfqn, mod in by_fqn.items():
        for p in mod.parameters(recurse=False):
            holders.setdefault(id(p), []).append(mfqn)
            tensors[id(p)] = p
    root_call = calls[0]
    for pid, mfqns in holders.items():
        p = tensors[pid]
        if not p.requires_grad:
            continue
        ran = [first_call[by_fqn[f]] for f in mfqns if by_fqn[f] in first_call]
        if ran:
            owner = min(ran, key=lambda c: c.seq)
        else:
            owner = root_call
            f = mfqns[0]
            while f:
                f = f.rsplit(".", 1)[0] if "." in f else ""
                if by_fqn[f] in first_call:
                    owner = first_call[by_fqn[f]]
                    break
        owner.param_bytes += p.numel() * _FP32_BYTES


def _layers(calls: list[_Call], batch: int, root: nn.Module) -> list[Layer]:
    rows: list[tuple[int, str, Layer]] = []
    for c in calls:
        leaf = not c.has_child_calls
        has_flops = c.fwd_flops > 0 or c.bwd_flops > 0
        if not (has_flops or c.param_bytes > 0 or (leaf and c.kernels > 0)):
            continue
        if leaf:
            base = c.fqn or type(root).__name__.lower()
            out_bytes = c.output_bytes
            pos = c.seq
        else:
            base = f"{c.fqn}.self" if c.fqn else "self"
            out_bytes = c.last_flop_out_bytes if c.last_flop_out_bytes is not None else c.output_bytes
            pos = c.first_flop_seq if c.first_flop_seq is not None else c.seq
        op = _op_class_of_module(c.module)
        if op is None:
            op = c.flops_by_class.most_common(1)[0][0] if c.flops_by_class else "elementwise"
        sparse = None
        if op == "embedding" and leaf and isinstance(c.module, (nn.Embedding, nn.EmbeddingBag)):
            w = c.module.weight
            sparse = Sparse(
                rows_per_sample=c.lookups / batch,
                row_bytes=float(c.module.embedding_dim * w.element_size()),
            )
        layer = Layer(
            name=base,
            op=op,  # type: ignore[arg-type]
            fwd_flops=c.fwd_flops / batch,
            bwd_flops=c.bwd_flops / batch,
            param_bytes=float(c.param_bytes),
            activation_bytes=out_bytes / batch,
            sparse=sparse,
            kernels=max(1, c.kernels),
            inplace=leaf and getattr(c.module, "inplace", False) is True,
            window=_window(c.module) if leaf else 1,
            autocast_fp32=c.autocast_fp32 and not has_flops,
        )
        rows.append((pos, base, layer))
    rows.sort(key=lambda r: r[0])
    return _unique_names([ly for _, _, ly in rows])


#: Pooling modules with a fixed window, and the dimensions of their kernel.
_POOL_DIMS = {nn.MaxPool1d: 1, nn.AvgPool1d: 1, nn.MaxPool2d: 2, nn.AvgPool2d: 2,
              nn.MaxPool3d: 3, nn.AvgPool3d: 3}


def _window(module: nn.Module) -> int:
    """Input elements per output element of a pooling module (its kernel's area or
    volume), 1 for any other module (adaptive pools included: their window follows
    from the input size, and without overlap they read each input once)."""
    dims = next((d for cls, d in _POOL_DIMS.items() if isinstance(module, cls)), None)
    if dims is None:
        return 1
    k: Any = module.kernel_size  # int or tuple, as the module was built
    return math.prod(int(x) for x in k) if isinstance(k, tuple | list) else int(k) ** dims


def unique_names(names: list[str]) -> list[str]:
    """``names`` made unique as :func:`from_torch` names layers: a name that repeats gets
    ``#1``, ``#2``, ... in order, and a suffixed name that clashes with a real one an
    ``_`` more (the profiler names its timed layers the same way)."""
    count = Counter(names)
    k: Counter[str] = Counter()
    out: list[str] = []
    taken: set[str] = set()
    for n in names:
        if count[n] > 1:
            k[n] += 1
            n = f"{n}#{k[n]}"
        while n in taken:  # a suffixed name that clashes with a real FQN
            n += "_"
        taken.add(n)
        out.append(n)
    return out


def _unique_names(layers: list[Layer]) -> list[Layer]:
    names = unique_names([ly.name for ly in layers])
    return [replace(ly, name=n) if n != ly.name else ly for ly, n in zip(layers, names, strict=True)]
