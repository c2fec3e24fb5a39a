"""Math modes on a CUDA GPU: which ones a device has, and the torch settings each runs in.

A math mode is a ``peak_flops`` key (:mod:`sim.precision`): the profiler times the
GEMM grid and the single-layer benchmarks in every mode the GPU has, each as training
runs it:

- ``fp32``: fp32 math on the CUDA cores, TF32 off for matmuls and cuDNN;
- ``tf32``: fp32 storage, TF32 on for matmuls and cuDNN (compute capability 8.0 on);
- ``fp16``, ``bf16``: mixed precision, the forward under ``torch.autocast`` with that
  dtype (fp16 from compute capability 7.0, the first tensor cores; bf16 from 8.0).

Every mode runs with cuDNN's benchmark mode on (convolutions take the fastest
algorithm for their shape, as a training job that sets it does). A mode the GPU lacks
falls back to fp32 (:func:`calibration.gpu_fields.fallbacks`), as the shipped profiles of such GPUs say.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from calibration.gpu_fields import GPU_MODES, fallbacks

__all__ = ["HALF_MODES", "MODES", "SETTINGS", "SINCE", "InMode", "device_modes", "fallbacks",
           "math_mode", "modes_for"]

#: Every math mode the profiler knows, in the order it times them.
MODES = GPU_MODES

#: The modes below fp32: the half-precision ones run under torch.autocast.
HALF_MODES = ("fp16", "bf16")

#: The compute capability from which a mode runs on the tensor cores.
SINCE = {"fp16": (7, 0), "tf32": (8, 0), "bf16": (8, 0)}

#: What each mode sets, as recorded in ``raw["gpu"]["settings"]``.
SETTINGS = {
    "fp32": "TF32 off for matmuls and cuDNN",
    "tf32": "TF32 on for matmuls and cuDNN",
    "fp16": "torch.autocast(cuda, float16), TF32 off; its convolutions in channels_last",
    "bf16": "torch.autocast(cuda, bfloat16), TF32 off; its convolutions in channels_last",
}


def modes_for(capability: tuple[int, int], bf16: bool = True) -> tuple[str, ...]:
    """The math modes of a GPU of compute capability ``capability``, in :data:`MODES`
    order: fp32 always, the others from :data:`SINCE` (bf16 only where ``bf16``: torch
    runs it natively there)."""
    return tuple(m for m in MODES if m == "fp32" or (tuple(capability) >= SINCE[m]
                                                       and (m != "bf16" or bf16)))


def device_modes(dev: Any) -> tuple[str, ...]:
    """The math modes of the CUDA device ``dev`` (:func:`modes_for` its capability)."""
    import torch

    try:
        bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    except TypeError:  # pragma: no cover - a torch without emulated bf16 has no such argument
        bf16 = torch.cuda.is_bf16_supported()
    return modes_for(torch.cuda.get_device_capability(dev), bf16)


def _cudnn() -> Any:
    """``torch.backends.cudnn`` (at run time a module object with per-op settings, such as
    ``conv.fp32_precision``, that its type stubs do not show)."""
    import torch

    return torch.backends.cudnn


def _tf32(on: bool) -> Any:
    """Set TF32 for matmuls and cuDNN convolutions; return what to restore.

    The ``fp32_precision`` settings where this torch has them (``"tf32"`` or
    ``"ieee"``), else the older ``allow_tf32`` flags: torch refuses to read one kind
    after the other was set, so only one kind is touched."""
    import torch

    matmul, cudnn = torch.backends.cuda.matmul, _cudnn()
    if hasattr(matmul, "fp32_precision"):
        saved = ("fp32_precision", matmul.fp32_precision, cudnn.conv.fp32_precision)
        matmul.fp32_precision = cudnn.conv.fp32_precision = "tf32" if on else "ieee"
    else:  # pragma: no cover - torch before 2.9
        saved = ("allow_tf32", matmul.allow_tf32, cudnn.allow_tf32)
        matmul.allow_tf32 = cudnn.allow_tf32 = on
    return saved


def _restore(saved: Any) -> None:
    import torch

    kind, matmul, conv = saved
    if kind == "fp32_precision":
        torch.backends.cuda.matmul.fp32_precision = matmul
        _cudnn().conv.fp32_precision = conv
    else:  # pragma: no cover - torch before 2.9
        torch.backends.cuda.matmul.allow_tf32 = matmul
        torch.backends.cudnn.allow_tf32 = conv


@contextlib.contextmanager
def math_mode(mode: str, device_type: str = "cuda") -> Iterator[None]:
    """Run the body in math mode ``mode`` (:data:`SETTINGS`), cuDNN's benchmark mode on;
    every setting is restored on the way out."""
    import torch

    if mode not in MODES:
        raise ValueError(f"unknown math mode {mode!r} (known: {', '.join(MODES)})")
    saved = _tf32(mode == "tf32")
    bench = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        if mode in HALF_MODES:
            dtype = torch.float16 if mode == "fp16" else torch.bfloat16
            with torch.autocast(device_type, dtype=dtype):
                yield
        else:
            yield
    finally:
        torch.backends.cudnn.benchmark = bench
        _restore(saved)


class InMode:
    """A timed item (:class:`~calibration.profiler.timing._OpItem`,
    :class:`~calibration.profiler.layers._ModelTimer`) whose warm-up and visits run in
    math mode ``mode`` (autocast of ``device_type``); its figures are the item's. The
    mode is entered around each visit, outside the timed repeats."""

    def __init__(self, item: Any, mode: str, device_type: str = "cuda") -> None:
        self.item, self.mode, self.device_type = item, mode, device_type

    def start(self) -> int:
        with math_mode(self.mode, self.device_type):
            return int(self.item.start())

    def visit(self, n: int) -> None:
        with math_mode(self.mode, self.device_type):
            self.item.visit(n)

    def figures(self, quantile: float) -> tuple[float, float]:
        return self.item.figures(quantile)  # type: ignore[no-any-return]

    def result(self, quantile: float = 50.0) -> dict[str, Any]:
        return self.item.result(quantile)  # type: ignore[no-any-return]
