"""Compute-time noise (``job.compute_noise``): each worker's per-iteration factors."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

#: Spawn-key namespace of the compute-noise streams under the config's root seed (b"NOI").
NOISE_STREAM = 0x4E4F49


def noise_factors(seed: int, device: int, rel_iqr: float, chunk: int = 256) -> Iterator[float]:
    """Compute-time factors of the worker on device ``device`` (its index in the cluster),
    one per iteration: lognormal with median 1 whose relative IQR (IQR / median) is
    ``rel_iqr`` (``sigma = asinh(rel_iqr / 2) / 0.6745``, 0.6745 the standard normal's
    upper quartile), drawn from ``SeedSequence(seed, spawn_key=(NOISE_STREAM, device))``:
    a worker's draws depend on neither the plan nor the other workers."""
    sigma = math.asinh(rel_iqr / 2.0) / 0.6744897501960817
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(NOISE_STREAM, device)))
    while True:
        yield from np.exp(sigma * rng.standard_normal(chunk)).tolist()
