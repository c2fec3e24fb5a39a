"""How the profiler times things: its clocks, timers, repeat counts, interleaved rounds,
figures as stored and progress bar.

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
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from calibration.profiler.spec import ProfileSpec

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
        """``reps`` samples of ``fn``, no warm-up. On a GPU the repeats are queued back to
        back, each between two CUDA events, and the events are read after the last one:
        no host sync inside the timed loop."""
        from torch.profiler import ProfilerActivity, profile, record_function

        if self.clock.cuda:
            marks = []
            for _ in range(reps):
                a = self.clock.mark()
                fn()
                marks.append((a, self.clock.mark()))
            return [self.clock.seconds(a, b) for a, b in marks]
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


class _OpItem:
    """One callable of the GEMM grid, bandwidth or dispatch benchmarks, sampled in
    visits as :class:`~calibration.profiler.layers._ModelTimer` samples a model:
    :meth:`start` warms it up and sets its repeat count; a visit after the first warms
    it once more."""

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


def time_callable(fn: Callable[[], Any], dev: Any, repeats: int, warmup: int = 1,
                  label: str = "call") -> tuple[float, float, list[float]]:
    """Time ``fn`` on ``dev`` the way :func:`~calibration.profiler.measure` times its
    benchmarks.

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
    """Sample every item (:class:`_OpItem`,
    :class:`~calibration.profiler.layers._ModelTimer`) of ``groups`` in ``rounds`` rounds.

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
