"""Training precision as the hardware runs it: math modes and activation sizes.

``job.dtype`` names how a job trains, as PyTorch runs it:

- ``fp32``: fp32 storage and fp32 math on the CUDA cores (or the CPU's vector units);
  ``torch.backends.cuda.matmul.allow_tf32 = False`` and the same for cuDNN.
- ``tf32``: fp32 storage, matmuls and convolutions in TF32 on the tensor cores
  (PyTorch's default for convolutions on Ampere and later GPUs); everything else as
  ``fp32``.
- ``fp16``, ``bf16``: mixed precision as ``torch.autocast`` runs it. fp32 master
  weights and optimizer state; matmuls and convolutions in half precision on the
  tensor cores, reading half-precision copies of the weights; the ops of autocast's
  fp32 list (softmax, layer and group norms, losses: :attr:`Layer.autocast_fp32`) in
  fp32; every other op in the precision of its input. Gradients on the wire stay
  fp32 (unless quantized).

A *math mode* is the ``peak_flops`` entry a pass's FLOPs run at. A matmul-class pass
(GEMM, convolution, attention with FLOPs) runs in the job's mode; any other pass
with FLOPs (a pooling window's comparisons) runs on the vector units at ``fp32``.
A device that has no peak for a mode runs that mode as its profile's
``math_fallback`` says (a T4 has no TF32: ``tf32 -> fp32``), and the run says so
(:func:`precision_notes`); a profile with neither is an error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hardware_profiles import DeviceProfile
from sim.workload import Model

#: The precisions ``job.dtype`` takes.
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
#: Mixed precision: half-precision matmuls, fp32 master weights.
HALF = frozenset({"fp16", "bf16"})
#: Op classes whose FLOPs run in the job's math mode (tensor cores where the mode has them).
MATMUL_OPS = frozenset({"gemm", "conv", "attention"})
#: The memory layouts of 4-D activations (``job.memory_format``), torch's names.
MEMORY_FORMATS = ("contiguous", "channels_last")


class PrecisionError(ValueError):
    """A device cannot run a precision: no peak for its math mode and no fallback."""


@dataclass(frozen=True)
class MathMode:
    """The math mode a device runs a precision's matmuls in.

    Attributes:
        requested: the job's precision (``job.dtype``).
        mode: the ``peak_flops`` key the matmuls run at on this device.
        note: why ``mode`` differs from ``requested`` (None where it does not).
    """

    requested: str
    mode: str
    note: str | None = None


def math_mode(dev: DeviceProfile, dtype: str) -> MathMode:
    """The math mode ``dev`` runs ``dtype``'s matmuls in: ``dtype`` where its profile has
    that peak, else its ``math_fallback`` (one step; the fallback's peak must exist).

    Raises:
        PrecisionError: no peak for ``dtype`` and no fallback rule for it.
    """
    if dtype in dev.peak_flops:
        return MathMode(dtype, dtype)
    to = (dev.math_fallback or {}).get(dtype)
    if to is None:
        raise PrecisionError(f"device type {dev.name!r} has no peak_flops.{dtype} and no "
                             f"math_fallback.{dtype}: it cannot run {dtype}")
    return MathMode(dtype, to, f"{dev.name} has no {dtype} math: {dtype} matmuls run as {to}")


def pass_mode(dev: DeviceProfile, dtype: str, op: str, flops: float) -> str:
    """The ``peak_flops`` key one pass of op class ``op`` with ``flops`` runs at:
    the job's math mode (:func:`math_mode`) for a matmul-class pass with FLOPs,
    ``fp32`` for any other."""
    if op in MATMUL_OPS and flops > 0:
        return math_mode(dev, dtype).mode
    return "fp32"


def precision_notes(devices: Sequence[DeviceProfile], dtype: str) -> list[str]:
    """One line for each device type of ``devices`` that does not run ``dtype`` as asked
    (:attr:`MathMode.note`), in order, without repeats.

    Raises:
        PrecisionError: a device cannot run ``dtype`` at all.
    """
    notes: list[str] = []
    for dev in devices:
        note = math_mode(dev, dtype).note
        if note is not None and note not in notes:
            notes.append(note)
    return notes


def activation_scales(model: Model, dtype: str) -> list[tuple[float, float]]:
    """Bytes of one activation value relative to fp32, ``(input, output)``, per layer.

    1.0 throughout for ``fp32`` and ``tf32`` (fp32 storage). Under mixed precision
    (``fp16``, ``bf16``) the model's input arrives as fp32; every layer reads its input
    as the layer before wrote it; a matmul-class layer with FLOPs writes half (an fp32
    input is read once by autocast's cast, whose half copy is not counted again); a
    layer on autocast's fp32 list (:attr:`Layer.autocast_fp32`) and an embedding (its
    table is fp32) write fp32; any other layer writes what it reads.
    """
    if dtype not in HALF:
        return [(1.0, 1.0)] * len(model.layers)
    out: list[tuple[float, float]] = []
    current = 1.0
    for ly in model.layers:
        if ly.op in MATMUL_OPS and ly.fwd_flops > 0:
            write = 0.5
        elif ly.autocast_fp32 or ly.op == "embedding":
            write = 1.0
        else:
            write = current
        out.append((current, write))
        current = write
    return out
