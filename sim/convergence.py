"""Convergence model: training loss as a function of effective samples.

    L(n) = L_inf + a * n ** -alpha

``n`` counts *effective* samples: every applied update of ``samples`` samples
contributes ``samples`` times three discounts, each 1 for the ideal case
(small batch, fresh parameters, full-precision gradients):

* batch (McCandlish et al. 2018, "An empirical model of large-batch
  training"): reaching a loss takes E = E_min * (1 + b / B_crit) samples at
  batch b, so one sample of a batch b counts ``1 / (1 + b / critical_batch)``
  (about 1 well below the critical batch, about B_crit / b far above it).
* staleness: a gradient computed on parameters ``s`` updates old counts
  ``1 / (1 + staleness_penalty * s)``.
* quantization: QSGD (Alistarh et al. 2017) with ``levels = 2 ** (bits - 1)``
  levels per sign on a tensor of ``d`` elements inflates the gradient's
  second moment by at most ``q = min(d / levels**2, sqrt(d) / levels)``; a
  sample counts ``1 / (1 + quant_penalty * q)``. 32 bits means no
  quantization (q = 0).

``fit`` estimates all six constants jointly from measured loss curves (least
squares on log-loss), optionally with a known lower bound on L_inf; ``save``/``load`` keep a fit as JSON together with the
curves it came from (sim/convergence_fits/<model>.json, written by
experiments/fit_convergence.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from hardware_profiles.fileio import atomic_write

FITS_DIR = Path(__file__).with_name("convergence_fits")
SCHEMA = 1


def quant_variance(bits: int, tensor_elems: float) -> float:
    """QSGD variance bound q(s, d) = min(d / s^2, sqrt(d) / s), s = 2^(bits-1); 0 for >= 32 bits."""
    if bits >= 32:
        return 0.0
    s = 2.0 ** (bits - 1)
    d = float(tensor_elems)
    return min(d / s**2, math.sqrt(d) / s)


def typical_tensor_elems(sizes: Iterable[float]) -> float:
    """Size of the tensor a typical parameter lives in: sum(d_i^2) / sum(d_i).

    One number per model for the quantization discount (tensors are quantized
    one by one, each with its own scale).
    """
    d = np.asarray([float(x) for x in sizes if x > 0])
    return float((d**2).sum() / d.sum()) if d.size else 1.0


@dataclass(frozen=True)
class Curve:
    """A measured loss curve of one training run.

    Attributes:
        samples: samples processed at each point (increasing).
        loss: loss at each point.
        batch: samples per update.
        staleness: updates between reading the parameters and applying the gradient.
        bits: gradient bits (32 = none).
        tensor_elems: see :func:`typical_tensor_elems`.
    """

    samples: tuple[float, ...]
    loss: tuple[float, ...]
    batch: int
    staleness: float = 0.0
    bits: int = 32
    tensor_elems: float = 1.0

    def to_json(self) -> dict[str, Any]:
        return {"batch": self.batch, "staleness": self.staleness, "bits": self.bits,
                "tensor_elems": self.tensor_elems, "samples": list(self.samples), "loss": list(self.loss)}

    @staticmethod
    def from_json(d: dict[str, Any]) -> Curve:
        return Curve(tuple(float(x) for x in d["samples"]), tuple(float(x) for x in d["loss"]),
                     int(d["batch"]), float(d["staleness"]), int(d["bits"]), float(d["tensor_elems"]))


@dataclass(frozen=True)
class ConvergenceModel:
    """L(n) = L_inf + a * n^-alpha over effective samples n (see the module docstring).

    Attributes:
        L_inf: asymptotic loss.
        a: scale of the reducible loss.
        alpha: power-law exponent (> 0).
        critical_batch: B_crit of the batch discount, samples.
        staleness_penalty: k of 1 / (1 + k * staleness).
        quant_penalty: c of 1 / (1 + c * q(bits, d)).
    """

    L_inf: float
    a: float
    alpha: float
    critical_batch: float = math.inf
    staleness_penalty: float = 0.0
    quant_penalty: float = 0.0

    def discount(self, batch: float, staleness: float = 0.0, bits: int = 32,
                 tensor_elems: float = 1.0) -> float:
        """What one sample counts: the product of the batch, staleness and quantization discounts."""
        f_batch = 1.0 / (1.0 + batch / self.critical_batch)
        f_stale = 1.0 / (1.0 + self.staleness_penalty * staleness)
        f_quant = 1.0 / (1.0 + self.quant_penalty * quant_variance(bits, tensor_elems))
        return f_batch * f_stale * f_quant

    def effective_samples(self, samples: float, batch: float, staleness: float = 0.0,
                          bits: int = 32, tensor_elems: float = 1.0) -> float:
        """``samples`` processed in updates of ``batch`` samples, discounted (see :meth:`discount`)."""
        return samples * self.discount(batch, staleness, bits, tensor_elems)

    def loss(self, n_effective: float | np.ndarray) -> Any:
        """L_inf + a * n^-alpha (inf at n = 0)."""
        n = np.asarray(n_effective, dtype=float)
        with np.errstate(divide="ignore"):
            out = self.L_inf + self.a * n ** -self.alpha
        return float(out) if out.ndim == 0 else out

    def effective_to_target(self, target: float) -> float:
        """Effective samples at which the loss reaches ``target`` (inf if target <= L_inf)."""
        if target <= self.L_inf:
            return math.inf
        return float((self.a / (target - self.L_inf)) ** (1.0 / self.alpha))

    def samples_to_target(self, target: float, batch: float, staleness: float = 0.0,
                          bits: int = 32, tensor_elems: float = 1.0) -> float:
        """Raw samples to reach ``target`` at a fixed batch, staleness and bit width (closed form)."""
        return self.effective_to_target(target) / self.discount(batch, staleness, bits, tensor_elems)

    def to_json(self) -> dict[str, float | None]:
        return {k: (None if math.isinf(v) else v) for k, v in asdict(self).items()}

    @staticmethod
    def from_json(d: dict[str, Any]) -> ConvergenceModel:
        cb = d.get("critical_batch")
        return ConvergenceModel(float(d["L_inf"]), float(d["a"]), float(d["alpha"]),
                                math.inf if cb is None else float(cb),
                                float(d.get("staleness_penalty", 0.0)), float(d.get("quant_penalty", 0.0)))


@dataclass(frozen=True)
class Fit:
    """A fitted model with its residual and source curves.

    Attributes:
        model: the fitted ConvergenceModel.
        rmse_log: root-mean-square error of log(loss) over the fitted points.
        curves: the curves it was fitted to.
        meta: free-form provenance (script, sizes, seeds).
    """

    model: ConvergenceModel
    rmse_log: float
    curves: tuple[Curve, ...]
    meta: dict[str, Any] = field(default_factory=dict)


def _unpack(p: np.ndarray, free: tuple[bool, bool, bool]) -> ConvergenceModel:
    it = iter(p[3:])
    cb = math.exp(next(it)) if free[0] else math.inf
    k = math.exp(next(it)) if free[1] else 0.0
    c = math.exp(next(it)) if free[2] else 0.0
    return ConvergenceModel(math.exp(p[0]), math.exp(p[1]), math.exp(p[2]), cb, k, c)


def fit(curves: Sequence[Curve], min_samples: float = 0.0,
        L_inf_min: float = 0.0) -> tuple[ConvergenceModel, float]:
    """Fit L_inf, a, alpha and the discounts jointly to ``curves``.

    Least squares on log(loss) (every decade of the curve weighs alike) with
    all constants log-parameterised (positive). A discount is fitted only if
    the curves vary its input: the critical batch needs two batch sizes, the
    staleness penalty a stale curve, the quantization penalty a quantized one;
    otherwise it stays at its neutral value. Points with fewer than
    ``min_samples`` samples are skipped (the power law describes the tail, not
    the first steps).

    Args:
        curves: measured loss curves.
        min_samples: fit only points with at least this many samples.
        L_inf_min: a known lower bound of the loss, which the asymptote may
            not undercut: the fit takes ``L_inf = L_inf_min + exp(p)``. For a
            student learning a teacher's noisy labels under cross-entropy,
            the held-out loss is the cross-entropy to the teacher's
            probabilities, which is never below their entropy (Gibbs'
            inequality), so the teacher's own loss is such a bound. 0 (the
            default) leaves L_inf merely positive, as before.

    Returns:
        (model, rmse of log-loss over the fitted points).

    Raises:
        ValueError: fewer than 3 usable points, a measured loss at or below
            ``L_inf_min``, or no start converged.
    """
    from scipy.optimize import least_squares

    R = _fit_points(curves, min_samples)
    n, logy, b, st, q = R.T
    free = (len(set(b.tolist())) > 1, bool((st > 0).any()), bool((q > 0).any()))
    ymin = float(np.exp(logy).min())
    if not 0.0 <= L_inf_min < ymin:
        raise ValueError(f"L_inf_min {L_inf_min} must lie in [0, the lowest fitted loss {ymin:.6g})")

    def resid(p: np.ndarray) -> np.ndarray:
        return _model_logloss(p, R, free, L_inf_min) - logy

    best = None
    for p0 in _starts(R, free, L_inf_min, ymin):
        try:
            r = least_squares(resid, p0, method="trf", x_scale="jac", max_nfev=4000,
                              xtol=1e-12, ftol=1e-12, gtol=1e-12)
        except (ValueError, FloatingPointError):
            continue
        if np.all(np.isfinite(r.fun)) and (best is None or r.cost < best.cost):
            best = r
    if best is None:
        raise ValueError("the fit did not converge")
    rmse = float(np.sqrt(np.mean(best.fun**2)))
    m = _unpack(best.x, free)
    return replace(m, L_inf=L_inf_min + m.L_inf), rmse


def _fit_points(curves: Sequence[Curve], min_samples: float) -> np.ndarray:
    """The points :func:`fit` fits, one row each: samples, log(loss), batch, staleness and
    the quantization variance; points below ``min_samples`` or with a loss that is not
    positive and finite are left out (ValueError when fewer than 3 remain)."""
    rows = []
    for cv in curves:
        n = np.asarray(cv.samples, dtype=float)
        y = np.asarray(cv.loss, dtype=float)
        keep = (n >= max(min_samples, 1e-300)) & (y > 0) & np.isfinite(y)
        for ni, yi in zip(n[keep], y[keep]):
            rows.append((ni, math.log(yi), cv.batch, cv.staleness, quant_variance(cv.bits, cv.tensor_elems)))
    if len(rows) < 3:
        raise ValueError("need at least 3 points with positive loss to fit")
    return np.asarray(rows, dtype=float)


def _model_logloss(p: np.ndarray, R: np.ndarray, free: tuple[bool, bool, bool], L_inf_min: float) -> np.ndarray:
    """log L at the points ``R`` (:func:`_fit_points`) for the log-parameters ``p``:
    L_inf - L_inf_min, a, alpha, then the free discounts' constants (critical batch,
    staleness penalty, quantization penalty) in that order."""
    n, _, b, st, q = R.T
    L_inf_excess, a, alpha = np.exp(p[:3])
    L_inf = L_inf_min + L_inf_excess
    i = 3
    f = np.ones_like(n)
    if free[0]:
        f = f / (1.0 + b / np.exp(p[i]))
        i += 1
    if free[1]:
        f = f / (1.0 + np.exp(p[i]) * st)
        i += 1
    if free[2]:
        f = f / (1.0 + np.exp(p[i]) * q)
    return np.log(L_inf + a * (n * f) ** -alpha)


def _starts(R: np.ndarray, free: tuple[bool, bool, bool], L_inf_min: float, ymin: float) -> list[np.ndarray]:
    """The fit's starting points: L_inf at 10, 50 and 90% of the way from ``L_inf_min``
    to the lowest loss, alpha 0.3 and 1, a matching the median point; the free
    discounts at the median batch, a staleness penalty of 1 and a quantization penalty
    of 0.1."""
    n, logy, b, _, _ = R.T
    extra0 = ([math.log(float(np.median(b)))] if free[0] else []) + ([0.0] if free[1] else []) \
        + ([math.log(0.1)] if free[2] else [])
    out = []
    for linf_frac in (0.1, 0.5, 0.9):  # a few starts for L_inf; the fit keeps the best
        for alpha0 in (0.3, 1.0):
            L0 = L_inf_min + linf_frac * (ymin - L_inf_min)
            nmed = float(np.median(n))
            a0 = max(float(np.exp(np.median(logy))) - L0, 1e-6 * ymin) * nmed**alpha0
            out.append(np.array([math.log(L0 - L_inf_min), math.log(a0), math.log(alpha0), *extra0]))
    return out


def save(path: str | Path, f: Fit) -> None:
    """Write a fit and its curves as JSON."""
    doc = {"schema": SCHEMA, "model": f.model.to_json(), "rmse_log_loss": f.rmse_log,
           "meta": f.meta, "curves": [c.to_json() for c in f.curves]}
    atomic_write(path, json.dumps(doc, indent=1) + "\n")


def load(path: str | Path) -> Fit:
    """Read a fit written by :func:`save`."""
    doc = json.loads(Path(path).read_text())
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: unknown convergence-fit schema {doc.get('schema')!r}")
    return Fit(ConvergenceModel.from_json(doc["model"]), float(doc["rmse_log_loss"]),
               tuple(Curve.from_json(c) for c in doc["curves"]), dict(doc.get("meta", {})))


def fit_path(model_name: str) -> Path:
    """Where the stored fit of zoo model ``model_name`` lives."""
    return FITS_DIR / f"{model_name}.json"


def model_tensor_elems(model: Any) -> float:
    """:func:`typical_tensor_elems` of a :class:`sim.workload.Model`'s dense layers (fp32 master
    copies; sparse tables travel as rows and are left out)."""
    return typical_tensor_elems(ly.param_bytes / 4.0 for ly in model.layers if ly.sparse is None)


def effective_to_target_iterations(model: ConvergenceModel, target: float, batch: int, bits: int,
                                   tensor_elems: float) -> int:
    """BSP iterations of ``batch`` samples (staleness 0) to reach ``target``: the smallest k with
    k * batch * discount >= the effective samples needed (a 1e-9 relative slack absorbs rounding)."""
    per_iter = model.effective_samples(batch, batch, 0.0, bits, tensor_elems)
    return max(1, math.ceil(model.effective_to_target(target) / per_iter * (1 - 1e-9)))


def load_for(model_name: str) -> Fit | None:
    """The stored fit of ``model_name``, or None when there is none."""
    p = fit_path(model_name)
    return load(p) if p.is_file() else None
