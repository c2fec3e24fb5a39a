"""The profiler's benchmarks, registered by name: what each measures, how it runs, and
which ``raw`` keys it writes.

:func:`calibration.profiler.measure` runs every registered benchmark that
applies to the run (:attr:`Benchmark.applies`), in :attr:`Benchmark.order`.
A benchmark is one of two kinds:

- *sampled* (``build``): it builds its timed items and hands them back grouped
  (one progress step per group and round, :class:`Sampled`); the orchestrator
  samples the items of every sampled benchmark together in interleaved rounds
  (:func:`~calibration.profiler.timing._run_rounds`), then asks each for its
  raw entries (``Sampled.finish(quantile)``);
- *once* (``run``): it runs after the rounds, as one progress step
  (:attr:`Benchmark.label`), and returns its raw entries.

A module that defines a benchmark registers it when imported
(:func:`register`); :mod:`calibration.profiler` imports every such module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from calibration.profiler.spec import ProfileSpec
from calibration.profiler.timing import _OpTimer


@dataclass(frozen=True)
class Run:
    """One profiling run as its benchmarks see it.

    Attributes:
        device: the device as given ('cpu' or 'cuda:N').
        dev: its ``torch.device``.
        spec: sizes and repeat counts.
        timer: the timer of the GEMM grid, bandwidth, dispatch, quantization (on a CPU)
            and host-device benchmarks.
        dtypes: the math modes the run times (fp32; on a GPU every mode it has,
            :func:`calibration.profiler.modes.device_modes`).
        models: zoo model -> batch sizes to time.
        quick: a ``--quick`` run.
        network: the network benchmark was asked for.
    """

    device: str
    dev: Any
    spec: ProfileSpec
    timer: _OpTimer
    dtypes: tuple[str, ...]
    models: dict[str, tuple[int, ...]]
    quick: bool
    network: bool


@dataclass(frozen=True)
class Sampled:
    """A sampled benchmark's items, built: ``groups`` (progress label, items; each item
    has ``start()`` and ``visit(n)``) and ``finish(quantile)``, its raw entries once the
    rounds are over."""

    groups: list[tuple[str, Sequence[Any]]]
    finish: Callable[[float], dict[str, Any]]


def _always(run: Run) -> bool:
    return True


@dataclass(frozen=True)
class Benchmark:
    """One registered benchmark.

    Attributes:
        name: registry key.
        measures: one line on what it measures.
        writes: the ``raw`` keys it may write.
        order: its place in a run (lower first; sampled benchmarks' items are
            built, and their entries written, in this order).
        build: a sampled benchmark's items (exactly one of ``build`` and ``run``).
        groups: a sampled benchmark's progress groups per round, known before it is
            built (the progress bar's length).
        run: a once benchmark's raw entries.
        label: a once benchmark's progress label.
        applies: whether it runs in a given run (default: always).
    """

    name: str
    measures: str
    writes: tuple[str, ...]
    order: int
    build: Callable[[Run], Sampled] | None = None
    groups: Callable[[Run], int] | None = None
    run: Callable[[Run], dict[str, Any]] | None = None
    label: str = ""
    applies: Callable[[Run], bool] = _always

    def __post_init__(self) -> None:
        if (self.build is None) == (self.run is None):
            raise ValueError(f"benchmark {self.name!r}: give exactly one of build and run")
        if (self.build is None) != (self.groups is None):
            raise ValueError(f"benchmark {self.name!r}: a sampled benchmark needs groups, "
                             "and only it")

    def steps(self, run: Run, rounds: int) -> int:
        """Its progress steps in ``run`` with ``rounds`` rounds."""
        return rounds * self.groups(run) if self.groups is not None else 1

    def checked(self, entries: dict[str, Any]) -> dict[str, Any]:
        """``entries``, after checking that it writes only the keys it declares."""
        undeclared = sorted(set(entries) - set(self.writes))
        if undeclared:
            raise ValueError(f"benchmark {self.name!r} wrote {undeclared}, which it does not "
                             f"declare (writes: {list(self.writes)})")
        return entries


_REGISTRY: dict[str, Benchmark] = {}


def register(bench: Benchmark) -> Benchmark:
    """Add ``bench`` to the registry (a name registers once)."""
    if bench.name in _REGISTRY:
        raise ValueError(f"benchmark {bench.name!r} is registered already")
    _REGISTRY[bench.name] = bench
    return bench


def registered() -> list[Benchmark]:
    """Every registered benchmark, in run order."""
    return sorted(_REGISTRY.values(), key=lambda b: (b.order, b.name))
