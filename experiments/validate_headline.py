"""The headline of ``hetsim validate`` and of the validation suite: figures that cannot
hide cancelling errors.

A mean iteration time can be right while its parts are wrong (a worker's compute
too slow and its transfers too fast). So beside the error of the mean iteration
time the headline gives the median absolute error over every per-worker compute
and communication metric (``compute_s:DEVICE``, ``comm_s:DEVICE``; see
:mod:`experiments.validate`), each kind's median apart, which calibrated models
of this machine the DES used and the error of the mean iteration time without
them.

The calibrated model of this machine is the runtime CPU model of a profile
(``network.runtime_cpu``, fitted by ``python -m bench.runtime_calibration`` to
real runs on the machine the profile was measured on): a validation that uses it
says so, with the DES's error without it (``diagnostics["runtime_cpu"]``). The
profile the DES priced with (``diagnostics["profiles"]``) is named too: a fresh
one (``hetsim validate --fresh-profile FILE``) was measured on the machine that
ran the real side.

Everything here reads a run's ``metrics`` and ``diagnostics`` as
:class:`experiments.validate.SchedulerRun` holds them (and validation.json keeps
them), so reports rebuilt from older files get the headline too.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

#: The per-worker metrics of the headline's median, and each one's name in it.
COMPONENTS = {"compute_s": "compute", "comm_s": "communication"}


def _rel(sim: float | None, real: float | None) -> float | None:
    """``(sim - real) / real``; None when either is missing or not finite, or real is 0."""
    if sim is None or real is None or not (math.isfinite(sim) and math.isfinite(real)) or real == 0:
        return None
    return (sim - real) / real


def component_errors(metrics: Mapping[str, Mapping[str, Any]]) -> dict[str, list[float]]:
    """Per kind of :data:`COMPONENTS`, the absolute relative errors of its per-worker metrics
    (those with an error: both sides measured, the real one not 0), in ``metrics``' order."""
    out: dict[str, list[float]] = {k: [] for k in COMPONENTS}
    for key, m in metrics.items():
        kind = key.split(":", 1)[0]
        if ":" in key and kind in out and (e := m.get("rel_error")) is not None:
            out[kind].append(abs(e))
    return out


def median_abs(errors: Iterable[float]) -> float | None:
    """The median of ``errors`` (already absolute); None when there are none."""
    xs = list(errors)
    return statistics.median(xs) if xs else None


def calibrated_models(diagnostics: Mapping[str, Any]) -> list[str]:
    """The calibrated models of this machine the DES used, one phrase each (see the module
    docstring): the runtime CPU model of each profile that had one."""
    models = (diagnostics.get("runtime_cpu") or {}).get("models") or {}
    return [f"the runtime CPU model of profile {name} (network.runtime_cpu)" for name in models]


def without_calibrated_s(diagnostics: Mapping[str, Any]) -> float | None:
    """The DES's mean iteration time without :func:`calibrated_models` (None: it used none)."""
    rc = diagnostics.get("runtime_cpu") or {}
    return rc["sim_without_model"]["iteration_time_mean_s"] if rc.get("models") else None


def headline(metrics: Mapping[str, Mapping[str, Any]], diagnostics: Mapping[str, Any]) -> dict[str, Any]:
    """One run's headline figures (relative errors as fractions, None where not measured):
    ``iteration_time_mean_error``; ``component_median_abs_error`` over ``components``
    per-worker compute and communication metrics, and ``compute_median_abs_error`` /
    ``comm_median_abs_error`` of each kind; ``calibrated_models``; ``drift`` (the speed-now
    factor the DES ran at, ``{"compute"}``, and ``copies`` where a run recorded before there
    was one factor has it; None without a fresh profile); ``profiles``; and
    ``iteration_time_mean_error_without_calibrated``."""
    comps = component_errors(metrics)
    everything = [e for errs in comps.values() for e in errs]
    it = metrics.get("iteration_time_mean_s", {})
    return {"iteration_time_mean_error": it.get("rel_error"),
            "component_median_abs_error": median_abs(everything), "components": len(everything),
            **{f"{k}_median_abs_error": median_abs(v) for k, v in comps.items()},
            "calibrated_models": calibrated_models(diagnostics),
            "drift": ({k: diagnostics["drift"][k] for k in ("compute", "copies") if k in diagnostics["drift"]}
                      if diagnostics.get("drift") else None),
            "profiles": dict(diagnostics.get("profiles") or {}),
            "iteration_time_mean_error_without_calibrated": _rel(without_calibrated_s(diagnostics),
                                                                 it.get("real"))}


def pct(x: float | None, sign: bool = True) -> str:
    """A fraction as a percentage with one decimal, signed unless ``sign`` is false; '-' for None."""
    return "-" if x is None else (f"{100 * x:+.1f}%" if sign else f"{100 * x:.1f}%")


def headline_text(h: Mapping[str, Any]) -> str:
    """:func:`headline` as one sentence."""
    parts = [f"mean iteration time {pct(h['iteration_time_mean_error'])}"]
    if h["components"]:
        kinds = ", ".join(f"{name} {pct(h[f'{k}_median_abs_error'], False)}" for k, name in COMPONENTS.items()
                          if h[f"{k}_median_abs_error"] is not None)
        parts.append(f"median |error| over its {h['components']} per-worker compute and communication "
                     f"metrics {pct(h['component_median_abs_error'], False)} ({kinds})")
    else:
        parts.append("no per-worker compute or communication metric measured on both sides")
    if h["profiles"]:
        parts.append("priced with " + ", ".join(f"profile {n} ({src})" for n, src in h["profiles"].items()))
    if h["calibrated_models"]:
        parts.append("calibrated models of this machine used: " + "; ".join(h["calibrated_models"])
                     + f"; without them mean iteration time "
                     f"{pct(h['iteration_time_mean_error_without_calibrated'])}")
    else:
        parts.append("no calibrated model of this machine used (no runtime CPU model)")
    if h.get("drift") and "copies" in h["drift"]:  # a record from before there was one factor
        parts.append(f"this machine's speed now against its profile, as recorded: compute x{h['drift']['compute']:.3f}, "
                     f"copies x{h['drift']['copies']:.3f} (the DES of that run applied both; one rescored now "
                     f"applies the compute one to everything)")
    elif h.get("drift"):
        parts.append(f"this machine's speed now against its profile (applied to every process's work and "
                     f"the loopback links): x{h['drift']['compute']:.3f}")
    return "; ".join(parts)


def suite_lines(runs: Iterable[tuple[Mapping[str, Mapping[str, Any]], Mapping[str, Any]]]) -> list[str]:
    """The suite's headline lines over every run (``(metrics, diagnostics)`` pairs): the
    median |error| over all per-worker compute and communication metrics of the suite and
    of each kind, and the calibrated models used with the median |error| of the mean
    iteration time without them."""
    comps: dict[str, list[float]] = {k: [] for k in COMPONENTS}
    models: list[str] = []
    without: list[float] = []
    with_model: list[float] = []
    for metrics, diag in runs:
        for k, errs in component_errors(metrics).items():
            comps[k] += errs
        models += [m for m in calibrated_models(diag) if m not in models]
        e = _rel(without_calibrated_s(diag), metrics.get("iteration_time_mean_s", {}).get("real"))
        if e is not None:
            without.append(abs(e))
            if (own := metrics["iteration_time_mean_s"].get("rel_error")) is not None:
                with_model.append(abs(own))
    everything = [e for errs in comps.values() for e in errs]
    kinds = ", ".join(f"{name} {pct(median_abs(comps[k]), False)} over {len(comps[k])}"
                      for k, name in COMPONENTS.items())
    lines = [f"- median |error| over all per-worker compute and communication metrics: "
             f"{pct(median_abs(everything), False)} over {len(everything)} ({kinds})"]
    if models:
        lines.append(f"- calibrated models of this machine the DES used: {'; '.join(models)}; the median "
                     f"|error| of the mean iteration time over the {len(without)} runs that used them: "
                     f"{pct(median_abs(with_model), False)} with them, {pct(median_abs(without), False)} "
                     "without them")
    else:
        lines.append("- calibrated models of this machine the DES used: none (no runtime CPU model)")
    return lines
