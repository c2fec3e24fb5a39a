"""The runtime's CPU per process, predicted from the DES's own figures: a model fitted to real runs.

On one machine the DES charges each process of the runtime its compute (a shard's
aggregation and update) and its messages' copies; the runtime's processes use more
(`hetsim validate`'s CPU table shows how much more):
gloo's transport threads beside the copies, Python around every message, compute
slowed by the processes it time-slices a core with. Given each process's real CPU
(`with_cpu_scaled`) the DES comes close to the real iteration, so the missing CPU is
most of the error. This module predicts it, per process and per
iteration, from four figures of a first DES run (:func:`figures`):

    cpu = a * compute + b * compute * (m - 1) + c * transport + d * messages

``compute`` and ``transport``: the CPU the DES gave the process (ms per iteration;
``extra.host_cpu_s``); ``messages``: the message ends it had (``extra.host_message_ends``);
``m``: how many processes share its cores (:func:`sharing`; 1 alone). Workers, PS
shards and the workers of an all-reduce job (their CPU goes to the collective's
buckets and DDP's reducer, not to PS messages; their compute terms are the workers'
where workers were fitted)
have coefficients of their own (:class:`RuntimeCpuModel`), fitted by
:func:`fit_configs` (non-negative least squares on relative errors, drawn towards the
DES's own figures by a ridge chosen by leaving each config out) to real runs of configs
other than those validated (``python -m bench.runtime_calibration``), and stored in
the profile (``network.runtime_cpu``). `hetsim validate` then runs the DES twice:
once as it is, and once with each process's CPU scaled to the prediction
(:meth:`RuntimeCpuModel.scales`: its compute through ``Placement.cpu_scale``, its
copies through ``Placement.copy_scale``); the second is the prediction it compares
with the real run. With BSP and a static plan the second run charges each process
exactly the prediction; where the rerun changes who does how many iterations (ASP,
SSP, an online scheduler) it charges about it (within 4% in the suite: the figures
come from the first run).

It is an empirical model of this runtime on one kind of machine, not of the
hardware: refit it when the runtime or the machine changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError
from scipy.optimize import nnls

from hardware_profiles.schema import RUNTIME_CPU_TERMS, RuntimeCpuFit
from sim.cluster import Cluster, Placement
from sim.problem import Problem
from sim.result import RunResult

ROLES = ("worker", "ps", "allreduce")  # in fitting order: "allreduce" takes the fitted "worker"'s compute terms
TERMS = RUNTIME_CPU_TERMS


@dataclass(frozen=True)
class Figures:
    """One process's DES figures per iteration: the inputs of :class:`RuntimeCpuModel`."""

    role: str  # "worker", "ps" or "allreduce" (a worker of an all-reduce job)
    compute_ms: float  # CPU of its compute (a shard: its aggregation and update)
    transport_ms: float  # CPU of its messages' copies
    messages: float  # message ends (sent or received)
    sharing: float  # m: processes on its cores, itself included (1.0 alone)

    def terms(self) -> list[float]:
        """The model's four terms: compute, compute x (m - 1), transport, messages."""
        return [self.compute_ms, self.compute_ms * (self.sharing - 1.0), self.transport_ms, self.messages]

    @property
    def sim_ms(self) -> float:
        """The CPU the DES charged: compute and transport."""
        return self.compute_ms + self.transport_ms


def sharing(cluster: Cluster, dev: str) -> float:
    """How many processes share ``dev``'s cores, itself included: 1 plus, for each other
    process on its host, its threads times the fraction of its cores that are also
    ``dev``'s, averaged over ``dev``'s cores (an affinity of None: every core of the
    host). Every process pinned to one core: the processes pinned to that core. It counts
    processes placed, not how often they run at once, and leaves out the process's own
    threads beyond one and the host's background load; for unpinned processes it is a
    density (1 + (P - 1) / cores), not a count of time slices."""
    placement = dict(cluster.placement)
    me = placement[dev]

    def cores(pl: Placement) -> set[int]:
        return set(pl.affinity) if pl.affinity else set(range(cluster.hosts[pl.host].cores))

    mine = cores(me)
    m = 1.0
    for other, pl in placement.items():
        if other == dev or pl.host != me.host:
            continue
        theirs = cores(pl)
        m += pl.threads * len(mine & theirs) / len(theirs) / len(mine)
    return m


def figures(problem: Problem, result: RunResult) -> dict[str, Figures]:
    """Per hosted process of ``result`` (a DES run of ``problem`` on hosts), its
    :class:`Figures` per iteration ({} without hosts or iterations)."""
    cpu = result.extra.get("host_cpu_s")
    msgs = result.extra.get("host_message_ends", {})
    n = len(result.iter_end_s)
    if not cpu or not n:
        return {}
    shards = {d.id for d in problem.cluster.shards}
    worker = "allreduce" if problem.job.sync == "allreduce" else "worker"
    out = {}
    for dev, _ in problem.cluster.placement:
        if dev not in cpu:
            continue
        out[dev] = Figures("ps" if dev in shards else worker, 1e3 * cpu[dev] / n,
                           1e3 * cpu.get(f"{dev} transport", 0.0) / n, msgs.get(dev, 0) / n,
                           sharing(problem.cluster, dev))
    return out


@dataclass(frozen=True)
class RuntimeCpuModel:
    """Coefficients per role, in :data:`TERMS` order (``d`` in ms per message end);
    ``allreduce`` None: an all-reduce job's workers take the workers' coefficients."""

    worker: tuple[float, float, float, float]
    ps: tuple[float, float, float, float]
    note: str = ""
    allreduce: tuple[float, float, float, float] | None = None

    def coef(self, role: str) -> tuple[float, float, float, float]:
        """The coefficients of ``role`` (:data:`ROLES`)."""
        if role == "ps":
            return self.ps
        if role == "allreduce" and self.allreduce is not None:
            return self.allreduce
        return self.worker

    def predict_ms(self, f: Figures) -> float:
        """The real CPU per iteration the model expects of a process with figures ``f``."""
        return float(np.dot(self.coef(f.role), f.terms()))

    def scales(self, figs: dict[str, Figures]) -> dict[str, tuple[float, float]]:
        """Per process, the ``(cpu_scale, copy_scale)`` of its placement that make the DES
        charge the prediction: its compute scaled to the compute terms (``a`` and ``b``),
        its copies to the transport terms (``c`` and ``d``; ``copy_scale`` applies on top
        of ``cpu_scale``). A process without copies (transport 0) has its message term
        added to its compute; one whose two parts cannot be scaled apart (either
        predicted 0) is scaled as a whole; one with no simulated CPU is left out."""
        out: dict[str, tuple[float, float]] = {}
        for dev, f in figs.items():
            a, b, c, d = self.coef(f.role)
            comp = a * f.compute_ms + b * f.compute_ms * (f.sharing - 1.0)
            trans = c * f.transport_ms + d * f.messages
            if f.compute_ms > 0 and f.transport_ms > 0 and comp > 0 and trans > 0:
                cs = comp / f.compute_ms
                out[dev] = (cs, trans / f.transport_ms / cs)
            elif f.sim_ms > 0 and comp + trans > 0:
                out[dev] = ((comp + trans) / f.sim_ms, 1.0)
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"terms": list(TERMS), "worker": list(self.worker), "ps": list(self.ps)}
        if self.allreduce is not None:
            out["allreduce"] = list(self.allreduce)
        return {**out, "note": self.note}

    @classmethod
    def from_fit(cls, fit: RuntimeCpuFit) -> RuntimeCpuModel:
        """The model of a profile's ``network.runtime_cpu`` (validated when it was loaded)."""
        return cls(tuple(fit.worker), tuple(fit.ps), fit.note,  # type: ignore[arg-type]
                   tuple(fit.allreduce) if fit.allreduce is not None else None)  # type: ignore[arg-type]

    @classmethod
    def from_json(cls, d: Any) -> RuntimeCpuModel:
        """The inverse of :meth:`to_json`.

        Raises:
            ValueError: not the format of ``network.runtime_cpu`` (the first problem, in one line).
        """
        try:
            return cls.from_fit(RuntimeCpuFit.model_validate(d))
        except ValidationError as e:
            err = e.errors()[0]
            where = ".".join(str(x) for x in err["loc"])
            raise ValueError(f"runtime_cpu{'.' + where if where else ''}: {err['msg']}") from None


#: what the fit is drawn towards: the DES's own CPU (compute and transport as charged, no more)
PRIOR = (1.0, 0.0, 1.0, 0.0)
#: the ridge strengths :func:`choose_ridge` tries (per sample, on relative errors)
RIDGE_GRID = (0.0, 0.001, 0.003, 0.01, 0.03, 0.1)


def _fit_role(rows: list[tuple[Figures, float]], lam: float,
              fixed: tuple[float, ...] | None = None) -> tuple[float, ...]:
    """One role's coefficients: non-negative least squares of ``predicted / real - 1`` over
    ``rows``, plus ``lam`` x rows x the squared distance to :data:`PRIOR` (a ridge; 0: plain
    NNLS). ``fixed``: the compute terms (``a``, ``b``) given, the others fitted to what is left."""
    real = np.array([r for _, r in rows])
    A = np.array([f.terms() for f, _ in rows]) / real[:, None]
    y = np.ones(len(rows))
    prior = np.array(PRIOR)
    if fixed is not None:
        y = y - A[:, :2] @ np.array(fixed)
        A, prior = A[:, 2:], prior[2:]
    if lam > 0:
        s = float(np.sqrt(lam * len(rows)))
        A = np.vstack([A, s * np.eye(A.shape[1])])
        y = np.concatenate([y, s * prior])
    x, _ = nnls(A, y)
    return (*fixed, *(float(v) for v in x)) if fixed is not None else tuple(float(v) for v in x)


def fit(samples: list[tuple[Figures, float]], note: str = "",
        ridge: dict[str, float] | None = None) -> RuntimeCpuModel:
    """Fit :class:`RuntimeCpuModel` to ``(figures, real CPU ms per iteration)`` pairs: per
    role, non-negative least squares of ``predicted / real - 1`` (each process counts alike,
    whatever its CPU, so a config with more processes weighs more), drawn towards
    :data:`PRIOR` by ``ridge[role]`` (absent: 0, plain NNLS; see :func:`choose_ridge`). A
    worker or PS role without samples keeps the identity (compute and transport as the DES
    charges them); all-reduce workers without samples take the workers' coefficients
    (``allreduce`` None).

    All-reduce workers share the workers' compute coefficients (``a``, ``b``) where there
    are worker samples, and only their transport and message terms are fitted, to the CPU
    left after that compute: their forward and backward are the same work as a PS
    worker's, and a process's total CPU alone cannot tell compute from copies (both grow
    with the model), so a free fit of the four trades one for the other, its total right
    and its split wrong (docs/notes/2026-12-07-fresh-profile-variants.md).

    Raises:
        ValueError: a real figure <= 0.
    """
    ridge = ridge or {}
    coef: dict[str, tuple[float, ...]] = {}
    for role in ROLES:
        rows = [(f, r) for f, r in samples if f.role == role]
        if any(r <= 0 for _, r in rows):
            raise ValueError("every real CPU figure must be > 0")
        if not rows:
            if role != "allreduce":
                coef[role] = (1.0, 0.0, 1.0, 0.0)
            continue
        shared = role == "allreduce" and any(f.role == "worker" for f, _ in samples)
        coef[role] = _fit_role(rows, ridge.get(role, 0.0), coef["worker"][:2] if shared else None)
    return RuntimeCpuModel(coef["worker"], coef["ps"], note, coef.get("allreduce"))  # type: ignore[arg-type]


def choose_ridge(samples: list[tuple[str, Figures, float]]) -> dict[str, float]:
    """Per role with samples, the ridge of :data:`RIDGE_GRID` whose fits predict each config
    left out best: ``(config, figures, real)`` samples; the median |relative error| over
    the role's processes, each predicted by the fit to the other configs (the smallest
    ridge among equals). The calibration configs are few (17) and the terms nearly
    collinear (a process's compute and copies both grow with its model), so plain NNLS
    splits a role's CPU between terms differently from one machine's runs to the next;
    drawn towards the DES's own figures it predicts configs it did not see better. The
    all-reduce role's folds take the workers' compute terms fitted to the same folds. A
    role seen in one config only has no fold to leave out: it is scored on its own
    samples, which plain NNLS fits best (0)."""
    out: dict[str, float] = {}
    for role in ROLES:
        configs = sorted({c for c, f, _ in samples if f.role == role})
        if not configs:
            continue
        scores = []
        for lam in RIDGE_GRID:
            errs = []
            for left in configs:
                if len(configs) > 1:
                    train = [(f, r) for c, f, r in samples if c != left]
                else:
                    train = [(f, r) for _, f, r in samples]
                m = fit(train, ridge={**out, role: lam})
                errs += [abs(m.predict_ms(f) / r - 1.0) for c, f, r in samples if c == left and f.role == role]
            scores.append((float(np.median(errs)), lam))
        out[role] = min(scores)[1]
    return out


def fit_configs(samples: list[tuple[str, Figures, float]], note: str = "") -> RuntimeCpuModel:
    """:func:`fit` to ``(config, figures, real)`` samples with each role's ridge from
    :func:`choose_ridge`, which the note records."""
    ridge = choose_ridge(samples)
    how = "ridge towards the DES's own CPU, by leaving each config out: " + ", ".join(
        f"{role} {lam:g}" for role, lam in ridge.items())
    return fit([(f, r) for _, f, r in samples], f"{note}; {how}" if note else how, ridge)


def models_of(problem: Problem) -> dict[str, RuntimeCpuModel]:
    """Per placed process, the model in its device type's profile (``network.runtime_cpu``);
    a process whose profile has none is absent."""
    cl = problem.cluster
    out = {}
    for dev, _ in cl.placement:
        net = cl.device(dev).type.network
        fit = getattr(net, "runtime_cpu", None) if net is not None else None
        if isinstance(fit, RuntimeCpuFit):
            out[dev] = RuntimeCpuModel.from_fit(fit)
    return out


def scales_for(problem: Problem, figs: dict[str, Figures]) -> dict[str, tuple[float, float]]:
    """Per process with figures and a model in its profile (:func:`models_of`), the
    ``(cpu_scale, copy_scale)`` of :meth:`RuntimeCpuModel.scales`."""
    models = models_of(problem)
    out: dict[str, tuple[float, float]] = {}
    for dev, f in figs.items():
        if dev in models:
            out.update(models[dev].scales({dev: f}))
    return out
