"""The drift probe: the same small GEMM and copy timed after every step of a profiling
run (``raw["drift"]``), and its one-line summary."""

from __future__ import annotations

import functools
import time
from typing import Any

from calibration.profiler.timing import _r, time_callable

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
    :func:`calibration.calibrate.spread_of` summarises them. About 15 ms a
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


def drift_line(drift: dict[str, Any]) -> str:
    """One line on the drift probe's figures (:func:`calibration.calibrate.drift_of`)."""
    return (f"drift (the same {DRIFT_GEMM}^3 GEMM and {8 * DRIFT_COPY_ELEMS / 2**20:.0f} MiB copy after each of "
            f"{drift['samples']} steps): GEMM times relative IQR {100 * drift['gemm_iqr']:.1f}%, "
            f"range {100 * drift['gemm_range']:.0f}%; copy relative IQR "
            f"{100 * drift['copy_iqr']:.1f}%, range {100 * drift['copy_range']:.0f}%")
