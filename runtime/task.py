"""The learning task a runtime worker trains: a zoo model learning a teacher.

The student is zoo model ``name`` built by :func:`sim.zoo.torch_module` with
the run's ``model_kwargs`` (small sizes are fine) and weights seeded by the
run seed; the teacher is the same architecture seeded by ``seed + 1``, in eval
mode. Inputs are synthetic: Gaussian for float inputs, uniform ids below the
smallest embedding table for integer inputs. The target is the teacher's
output standardised per output unit (mean and s.d. on a fixed probe batch)
plus Gaussian noise of s.d. ``NOISE``; the loss is MSE, so a student that has
learnt nothing scores about 1 and the floor is ``NOISE**2``. This is the mlp
task of experiments/fit_convergence.py applied to every model (the fits of
the classifiers use cross-entropy instead).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from sim import zoo

NOISE = 0.1
PROBE = 256


def bind_device(device: str) -> str:
    """Make ``device`` this process's current CUDA device (a no-op for ``cpu``), so that
    what defaults to the current device (``torch.cuda.synchronize``, ``mem_get_info``, an
    nccl group's object collectives) means the rank's own GPU, not GPU 0; returns it."""
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    return device


def sync(device: str) -> None:
    """Wait for ``device``'s queued work (a no-op for ``cpu``): before a clock is read
    around GPU work, which the host only queues."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def compute_device(kind: str, local_rank: int) -> str:
    """The torch device a rank computes on: ``cpu``, or for ``cuda`` the GPU of its local
    rank, ranks sharing the GPUs in turn where there are fewer GPUs than ranks (every
    rank of a one-GPU machine on ``cuda:0``)."""
    if kind != "cuda":
        return "cpu"
    return f"cuda:{local_rank % max(1, torch.cuda.device_count())}"


def build(name: str, seed: int, model_kwargs: dict[str, Any]) -> tuple[nn.Module, Any]:
    """Zoo model ``name`` with ``model_kwargs`` and its example input (batch 2)."""
    kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in model_kwargs.items()}
    return zoo.torch_module(name, batch_size=2, seed=seed, **kw)


def call(m: nn.Module, x: Any) -> torch.Tensor:
    out: torch.Tensor = m(*x) if isinstance(x, tuple) else m(x)
    return out


class Teacher:
    """Draws (input, target) batches of the task from a seeded generator."""

    def __init__(self, name: str, seed: int, model_kwargs: dict[str, Any], device: str = "cpu") -> None:
        module, example = build(name, seed + 1, model_kwargs)
        self.device = device
        self.example = example if isinstance(example, tuple) else (example,)
        self.tuple_input = isinstance(example, tuple)
        tables = [m.num_embeddings for m in module.modules()
                  if isinstance(m, nn.Embedding | nn.EmbeddingBag)]
        self.id_bound = min(tables) if tables else 2
        self.teacher = module.to(device).eval()
        with torch.no_grad():
            probe = self.inputs(PROBE, torch.Generator().manual_seed(seed + 2))
            out = call(self.teacher, probe).float()
            dims = tuple(range(out.dim() - 1))
            self.mu = out.mean(dim=dims)
            self.sd = out.std(dim=dims).clamp_min(1e-6)

    def inputs(self, n: int, gen: torch.Generator) -> Any:
        xs = []
        for ex in self.example:
            shape = (n, *ex.shape[1:])
            if ex.dtype.is_floating_point:
                xs.append(torch.randn(shape, generator=gen))
            else:
                xs.append(torch.randint(0, self.id_bound, shape, generator=gen))
        xs = [x.to(self.device) for x in xs]
        return tuple(xs) if self.tuple_input else xs[0]

    def batch(self, n: int, gen: torch.Generator) -> tuple[Any, torch.Tensor]:
        """``n`` fresh samples and their noisy standardised teacher targets."""
        x = self.inputs(n, gen)
        with torch.no_grad():
            z = (call(self.teacher, x).float() - self.mu) / self.sd
            y = z + NOISE * torch.randn(z.shape, generator=gen).to(z.device)
        return x, y


def iteration_generators(seed: int, worker: int, iteration: int) -> tuple[torch.Generator, torch.Generator]:
    """Generators of worker ``worker``'s samples and of its quantization noise in ``iteration``.

    A pure function of ``(seed, worker, iteration)``, not a stream carried from
    one iteration to the next: a worker restarted at iteration ``t`` (resume
    from a checkpoint) draws exactly what it would have drawn without the
    restart, and nothing of a worker needs saving.
    """
    data, noise = np.random.SeedSequence(seed, spawn_key=(worker, iteration)).generate_state(2, np.uint64)
    return torch.Generator().manual_seed(int(data >> 1)), torch.Generator().manual_seed(int(noise >> 1))


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(out.float(), y)


def partition(sizes: list[int], shards: int) -> list[list[int]]:
    """Parameter tensors (by index) of each shard: largest first to the least-loaded
    shard (ties to the lower shard), each shard's list in model order.

    Raises:
        ValueError: fewer tensors than shards (a shard would hold nothing).
    """
    if len(sizes) < shards:
        raise ValueError(f"{shards} PS shards but the model has only {len(sizes)} parameter tensors")
    load = [0] * shards
    owned: list[list[int]] = [[] for _ in range(shards)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        s = min(range(shards), key=lambda k: (load[k], k))
        owned[s].append(i)
        load[s] += sizes[i]
    return [sorted(o) for o in owned]
