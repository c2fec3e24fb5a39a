"""RunResult: one schema for whatever produced it (analytic, des, runtime) and for every
plan kind (:class:`sim.plan.PlanKind`).

Headline metrics are derived from recorded facts (iteration boundaries, busy
times, provisioned devices), never stored twice. Throughput and iteration-time
statistics cover the run's *throughput window*: the iterations after its
fill (``warmup``) and before its drain (``drain``), or, where an evaluator
found the run too short to have such a window, the model's steady state
(``model_steady``). ``summary.json`` says which (``throughput_window``). ``summary_json``,
``iterations_csv`` and ``trace_json`` give the file contents
(experiments/runner.py writes them). A DAG plan's frames run is a
:class:`FrameResult`: a RunResult whose iterations are frames, plus the frame facts.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SUMMARY_SCHEMA = 1
#: ``throughput_window.kind``: iterations with fill and/or drain left out; the model's steady
#: state (the run had no steady window); every iteration (nothing to leave out).
WINDOW_KINDS = ("steady", "model_steady_state", "whole_run")
HEADLINE_KEYS = (
    "throughput_sps", "iteration_time_mean_s", "iteration_time_p50_s", "iteration_time_p95_s",
    "iterations", "elapsed_s", "time_to_target_s", "cost_usd", "energy_j",
)


@dataclass
class DeviceUsage:
    """A provisioned device: what it costs and how long it was busy.

    Attributes:
        id: device id.
        role: 'worker' or 'ps'.
        price_per_hour: USD per hour.
        idle_w, active_w: power draw.
        busy_s: seconds doing work (compute for workers, aggregation/apply for shards).
        compute_s, comm_s, wait_s: worker time split (compute; blocked on its own
            transfers; blocked on others, i.e. barrier wait). Shards leave them 0.
    """

    id: str
    role: str
    price_per_hour: float
    idle_w: float
    active_w: float
    busy_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    wait_s: float = 0.0


@dataclass(frozen=True)
class ModelSteadyState:
    """A model's steady state, reported in place of a run's own figures when the run
    is too short to have a steady window.

    Attributes:
        throughput_sps: samples per second in steady state.
        iteration_time_s: time per iteration in steady state.
        min_iterations: the shortest run that has a steady window.
        note: one line saying why (printed as a warning by the CLI).
    """

    throughput_sps: float
    iteration_time_s: float
    min_iterations: int
    note: str


@dataclass
class RunResult:
    """What one evaluation of a plan produced.

    Attributes:
        iter_end_s: end time of each (global) iteration; iteration i spans
            (iter_end_s[i-1], iter_end_s[i]], the first starts at 0.
        iter_samples: samples whose updates each iteration applied.
        warmup: leading iterations excluded from throughput and iteration-time stats
            (the fill).
        drain: trailing iterations excluded likewise (a pipeline's drain).
        model_steady: set where the run is too short for a steady window: throughput
            and iteration-time stats are then this model's steady state.
        iter_loss: the modelled training loss at the end of each iteration (None
            without a convergence model; adds a ``loss`` column to iterations.csv).
    """

    name: str
    evaluator: str
    scheduler: str
    seed: int
    iter_end_s: list[float]
    iter_samples: list[int]
    devices: list[DeviceUsage]
    warmup: int = 1
    drain: int = 0
    model_steady: ModelSteadyState | None = None
    time_to_target_s: float | None = None
    failures: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    trace: list[dict[str, Any]] = field(default_factory=list)
    iter_loss: list[float] | None = None

    # ---- derived metrics -------------------------------------------------
    @property
    def elapsed_s(self) -> float:
        return float(self.iter_end_s[-1]) if self.iter_end_s else 0.0

    def iteration_times(self) -> np.ndarray:
        ends = np.asarray(self.iter_end_s, dtype=float)
        return np.diff(np.concatenate([[0.0], ends]))

    def _measured(self) -> slice:
        """The throughput window: after the warm-up, before the drain (each dropped
        where it would leave no iteration)."""
        n = len(self.iter_end_s)
        w = self.warmup if n > self.warmup else 0
        d = self.drain if n - w > self.drain else 0
        return slice(w, n - d)

    def throughput_window(self) -> dict[str, Any]:
        """summary.json's ``throughput_window``: its ``kind`` (:data:`WINDOW_KINDS`) and
        the first and last iteration it covers (both included; None for the model's
        steady state, which covers none)."""
        if self.model_steady is not None:
            return {"kind": "model_steady_state", "from_iteration": None, "to_iteration": None,
                    "min_iterations": self.model_steady.min_iterations, "note": self.model_steady.note}
        sl = self._measured()
        whole = sl.start == 0 and sl.stop == len(self.iter_end_s)
        return {"kind": "whole_run" if whole else "steady", "from_iteration": sl.start,
                "to_iteration": sl.stop - 1}

    @property
    def throughput_sps(self) -> float:
        """Samples per second over the throughput window (or the model's steady state)."""
        if self.model_steady is not None:
            return self.model_steady.throughput_sps
        sl = self._measured()
        ends = np.asarray(self.iter_end_s, dtype=float)
        if len(ends) == 0:
            return 0.0
        t0 = ends[sl.start - 1] if sl.start > 0 else 0.0
        span = ends[sl.stop - 1] - t0
        samples = float(np.sum(np.asarray(self.iter_samples, dtype=float)[sl]))
        return samples / span if span > 0 else 0.0

    @property
    def cost_usd(self) -> float:
        """Price times wall time of every provisioned device and shard."""
        return float(sum(d.price_per_hour for d in self.devices) * self.elapsed_s / 3600.0)

    @property
    def energy_j(self) -> float:
        """Idle power over the run plus (active - idle) x busy time, summed over devices."""
        T = self.elapsed_s
        return float(sum(d.idle_w * T + (d.active_w - d.idle_w) * min(d.busy_s, T) for d in self.devices))

    def utilization(self) -> dict[str, float]:
        T = self.elapsed_s
        return {d.id: (min(d.busy_s, T) / T if T > 0 else 0.0) for d in self.devices}

    def summary(self) -> dict[str, Any]:
        """summary.json: the headline metrics (schema 1), then per-worker detail."""
        it = self.iteration_times()[self._measured()]
        if self.model_steady is not None:
            it = np.array([self.model_steady.iteration_time_s])
        stats = {
            "mean": float(it.mean()) if it.size else 0.0,
            "p50": float(np.percentile(it, 50)) if it.size else 0.0,
            "p95": float(np.percentile(it, 95)) if it.size else 0.0,
        }
        out: dict[str, Any] = {
            "schema": SUMMARY_SCHEMA,
            "name": self.name,
            "evaluator": self.evaluator,
            "scheduler": self.scheduler,
            "seed": self.seed,
            "throughput_sps": self.throughput_sps,
            "throughput_window": self.throughput_window(),
            "iteration_time_s": stats,
            "iterations": len(self.iter_end_s),
            "elapsed_s": self.elapsed_s,
            "time_to_target_s": self.time_to_target_s,
            "cost_usd": self.cost_usd,
            "energy_j": self.energy_j,
            "utilization": self.utilization(),
            "workers": {
                d.id: {"compute_s": d.compute_s, "comm_s": d.comm_s, "wait_s": d.wait_s}
                for d in self.devices if d.role == "worker"
            },
            "failures": self.failures,
        }
        out.update(self.extra)
        return out

    def headline(self) -> dict[str, Any]:
        """The flat row used by comparison.csv and sweep tables."""
        s = self.summary()
        return {
            "throughput_sps": s["throughput_sps"],
            "iteration_time_mean_s": s["iteration_time_s"]["mean"],
            "iteration_time_p50_s": s["iteration_time_s"]["p50"],
            "iteration_time_p95_s": s["iteration_time_s"]["p95"],
            "iterations": s["iterations"],
            "elapsed_s": s["elapsed_s"],
            "time_to_target_s": s["time_to_target_s"],
            "cost_usd": s["cost_usd"],
            "energy_j": s["energy_j"],
        }

    # ---- files ----------------------------------------------------------
    def summary_json(self) -> str:
        return json.dumps(self.summary(), indent=2) + "\n"

    def iterations_csv(self) -> str:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        loss = self.iter_loss
        w.writerow(["iteration", "start_s", "end_s", "time_s", "samples"] + (["loss"] if loss is not None else []))
        start = 0.0
        for i, (end, n) in enumerate(zip(self.iter_end_s, self.iter_samples)):
            row = [i, repr(float(start)), repr(float(end)), repr(float(end - start)), int(n)]
            if loss is not None:
                row.append(repr(float(loss[i])) if i < len(loss) else "")
            w.writerow(row)
            start = end
        return buf.getvalue()

    def trace_json(self) -> str:
        return json.dumps({"traceEvents": self.trace, "displayTimeUnit": "ms"}) + "\n"


@dataclass(kw_only=True)
class FrameResult(RunResult):
    """A run of a periodic DAG plan (:func:`sim.des.frames.simulate_frames`): one iteration per frame.

    ``iter_end_s`` holds each frame's finish and ``iter_samples`` 1 per frame, so
    the headline reads as a training run's: throughput in frames per second,
    iteration times the gaps between finishes. ``devices`` are the board's units
    (role "worker", busy for their executions; ``active_w`` the extra power of a
    busy unit, ``idle_w`` 0): the board's idle power is :attr:`board_idle_w`.

    Attributes:
        release_s: [frame] release times.
        deadline_s: the deadline each latency is judged against.
        makespan_s: the plan's frame time (its schedule, no jitter, load or contention).
        duration_s: simulated time: the last finish, or frames x period when that is later.
        board_idle_w: board power with every online unit idle.
    """

    release_s: np.ndarray
    deadline_s: float
    makespan_s: float
    duration_s: float
    board_idle_w: float

    @property
    def finish_s(self) -> np.ndarray:
        """[frame] completion times."""
        return np.asarray(self.iter_end_s, dtype=float)

    @property
    def latency_s(self) -> np.ndarray:
        """[frame] finish - release."""
        return self.finish_s - self.release_s

    @property
    def units(self) -> tuple[str, ...]:
        return tuple(d.id for d in self.devices)

    @property
    def busy_s(self) -> np.ndarray:
        """[unit] busy seconds."""
        return np.array([d.busy_s for d in self.devices])

    @property
    def elapsed_s(self) -> float:
        return self.duration_s

    @property
    def energy_j(self) -> float:
        """Board idle power over the simulated time plus each unit's busy extra power
        over its busy time (:meth:`sim.dag.DagPlan.energy_j`, frame after frame)."""
        extra_w = np.array([d.active_w - d.idle_w for d in self.devices])
        return self.board_idle_w * self.duration_s + float((self.busy_s * extra_w).sum())

    @property
    def miss_rate(self) -> float:
        """Fraction of frames finishing after their deadline."""
        return float(np.mean(self.latency_s > self.deadline_s * (1 + 1e-9)))

    @property
    def energy_per_frame_j(self) -> float:
        return self.energy_j / len(self.iter_end_s)

    def frames_summary(self) -> dict[str, Any]:
        """The frame figures: misses, latency percentiles, energy per frame, utilisation."""
        lat = self.latency_s
        return {"frames": len(lat), "deadline_miss_rate": self.miss_rate,
                "latency_mean_s": float(lat.mean()), "latency_p50_s": float(np.percentile(lat, 50)),
                "latency_p99_s": float(np.percentile(lat, 99)), "latency_max_s": float(lat.max()),
                "energy_per_frame_j": self.energy_per_frame_j, "utilization": self.utilization()}

    def summary(self) -> dict[str, Any]:
        """RunResult's summary followed by :meth:`frames_summary`."""
        return {**super().summary(), **self.frames_summary()}

    def frames_csv(self) -> str:
        """frames.csv: frame, release_s, finish_s, latency_s, missed (1 after the deadline)."""
        lines = ["frame,release_s,finish_s,latency_s,missed"]
        lines += [f"{f},{r!r},{e!r},{lat!r},{int(lat > self.deadline_s * (1 + 1e-9))}"
                  for f, (r, e, lat) in enumerate(zip(self.release_s.tolist(), self.finish_s.tolist(),
                                                      self.latency_s.tolist()))]
        return "\n".join(lines) + "\n"


class Trace:
    """Collects Chrome-trace complete events ('X'), capped so huge runs stay readable."""

    PIDS = {"workers": 0, "network": 1, "ps": 2}

    def __init__(self, max_events: int = 200_000) -> None:
        self.events: list[dict[str, Any]] = []
        self.max_events = max_events
        self._threads: set[tuple[int, int]] = set()
        self._processes: set[int] = set()
        self._async_id = 0
        self.dropped = 0

    def span(self, track: str, tid: int, tname: str, name: str, t0_s: float, t1_s: float,
             args: dict[str, Any] | None = None) -> None:
        """A complete event on thread ``tid`` (named ``tname``) of process ``track``."""
        if len(self.events) >= self.max_events:
            self.dropped += 1
            return
        pid = self._meta(track, tid, tname)
        ev: dict[str, Any] = {"name": name, "ph": "X", "pid": pid, "tid": tid,
                              "ts": t0_s * 1e6, "dur": (t1_s - t0_s) * 1e6}
        if args:
            ev["args"] = args
        self.events.append(ev)

    def async_span(self, track: str, tid: int, tname: str, name: str, t0_s: float, t1_s: float) -> None:
        """An interval that may overlap others on its thread (a message in flight)."""
        if len(self.events) + 1 >= self.max_events:
            self.dropped += 1
            return
        pid = self._meta(track, tid, tname)
        self._async_id += 1
        common = {"name": name, "cat": track, "pid": pid, "tid": tid, "id": self._async_id}
        self.events.append({**common, "ph": "b", "ts": t0_s * 1e6})
        self.events.append({**common, "ph": "e", "ts": t1_s * 1e6})

    def _meta(self, track: str, tid: int, tname: str) -> int:
        pid = self.PIDS[track]
        if pid not in self._processes:
            self._processes.add(pid)
            self.events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                                "args": {"name": track}})
        if (pid, tid) not in self._threads:
            self._threads.add((pid, tid))
            self.events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                                "args": {"name": tname}})
        return pid
