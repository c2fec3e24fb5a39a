"""GPU profiles fitted to published training throughput.

    python -m calibration.published [--table CSV] [--write] [--predict] [--figure PNG]
                                    [--json OUT] [--quiet]

A GPU datasheet gives peaks, bandwidth and SM count; it does not say what fraction of
them training reaches. This module fits those fractions to published single-GPU
training measurements and writes them into every GPU profile, so that a GPU nobody
here has measured is priced from its datasheet and parameters shared by all GPUs:

====================  =====================================================================
parameter             profile field it is written to
====================  =====================================================================
conv_fp32, gemm_fp32  ``efficiency.conv``, ``efficiency.gemm`` (= ``attention``): CUDA cores
conv_tf32, gemm_tf32  ``math_efficiency.tf32.{conv,gemm,attention}``: TF32 tensor cores
conv_half, gemm_half  ``math_efficiency.{fp16,bf16}.{conv,gemm,attention}``: half precision
mem_eff               ``mem_efficiency.<every op class>``: achieved fraction of ``mem_bw_Bps``
layout_passes         ``corrections.layout_transpose.passes`` (fp16 and bf16 convolutions
                      in contiguous layout)
launch_us             ``launch_overhead_s`` (microseconds per kernel launch)
====================  =====================================================================

Per math mode, not per device or per row: the same nine numbers go into every GPU
profile (:data:`GPU_PROFILES`), and a device differs only by its datasheet (peaks per
mode, bandwidth, SMs for ``corrections.wave_quantization``). The model each row is
priced with is the cost model's (``sim.costmodel.training_step_s``: forward, backward
and the optimizer step; ``docs/modelling/gpu.md``).

The table (columns of ``shared/reference/gpu_training_throughput.csv``): ``id``,
``device``, ``hetsim_type`` (the profile), ``model`` (free text naming a zoo model:
"resnet50 ...", "BERT-large ... seq 384"), ``batch_per_gpu``, ``gpus``, ``precision``
(fp32, tf32, amp-fp16, amp-bf16, fp16, bf16), ``memory_format`` (contiguous,
channels_last, unknown: the framework's default, channels_last for TensorFlow, else
contiguous), ``measured`` (samples per second, all GPUs together), ``source`` and
``notes`` (read for the framework). Rows of several GPUs are not fitted: their
throughput also depends on the collective (``gpus`` > 1 rows are listed as skipped).

``--predict`` prices the rows with the profiles as they are (no fit): the check of a
table the profiles were not fitted to.
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import functools
import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from calibration.gpu_fields import with_gpu_fields
from hardware_profiles import BUILTIN_DIR, DeviceProfile, load_profile, load_profile_file
from hardware_profiles.errors import ConfigError
from hardware_profiles.fileio import atomic_write
from sim import zoo
from sim.costmodel import training_step_s
from sim.workload import Model

#: The shipped GPU profiles the fit writes (every ``kind: gpu`` file of hardware_profiles/).
GPU_PROFILES = ("t4", "l4", "a10g", "v100", "a100", "h100", "h200")

#: A table's precision names -> ``job.dtype``.
PRECISIONS = {"fp32": "fp32", "tf32": "tf32", "amp-fp16": "fp16", "amp-bf16": "bf16", "fp16": "fp16",
              "bf16": "bf16", "amp": "fp16"}

#: The optimizer each zoo model is conventionally trained with (its published runs):
#: BERT with Adam (LAMB/Adam), the rest with SGD and momentum.
OPTIMIZERS = {"bert_base": "adam", "bert_large": "adam", "transformer": "adam"}

#: The fitted parameters, their start and bounds (efficiencies in (0, 1.5]: a Winograd
#: convolution may beat the peak in counted FLOPs; mem_eff a fraction of the datasheet
#: bandwidth; layout passes over the activations; launch in microseconds).
PARAMS = ("conv_fp32", "conv_tf32", "conv_half", "gemm_fp32", "gemm_tf32", "gemm_half", "mem_eff",
          "layout_passes", "launch_us")
X0 = np.array([0.9, 0.5, 0.6, 0.9, 0.5, 0.6, 0.8, 1.0, 5.0])
LOWER = np.array([0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.3, 0.0, 0.0])
UPPER = np.array([1.5, 1.0, 1.0, 1.5, 1.0, 1.0, 1.0, 8.0, 50.0])


@dataclass(frozen=True)
class Row:
    """One published measurement as hetsim prices it."""

    id: str
    profile: str
    model: str
    seq_len: int | None
    batch: int
    gpus: int
    dtype: str
    memory_format: str
    measured_sps: float
    precision: str
    device: str


@dataclass(frozen=True)
class Skipped:
    id: str
    reason: str


def read_table(path: str | Path) -> tuple[list[Row], list[Skipped]]:
    """The rows of a published table hetsim can price, and the others with why.

    Raises:
        ConfigError: the file cannot be read, lacks a column, or a row has a bad number.
    """
    src = str(path)
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            need = ("id", "hetsim_type", "model", "batch_per_gpu", "gpus", "precision", "memory_format",
                    "measured")
            missing = [c for c in need if c not in (reader.fieldnames or [])]
            if missing:
                raise ConfigError(src, missing[0], "missing column")
            raw = list(reader)
    except OSError as e:
        raise ConfigError(src, "", f"cannot read: {e.strerror or e}") from None
    except (UnicodeDecodeError, csv.Error) as e:
        raise ConfigError(src, "", f"not a CSV table: {e}") from None
    rows: list[Row] = []
    skipped: list[Skipped] = []
    for i, r in enumerate(raw):
        rid = r.get("id") or f"row {i + 1}"
        where = f"rows[{i}]"
        batch = _positive_int(r["batch_per_gpu"], src, f"{where}.batch_per_gpu")
        gpus = _positive_int(r["gpus"], src, f"{where}.gpus")
        measured = _positive(r["measured"], src, f"{where}.measured")
        model, seq = model_of(r["model"])
        dtype = PRECISIONS.get(r["precision"].strip().lower())
        reason = (None if model is not None else f"model {r['model']!r} is not a zoo model")
        reason = reason or (None if dtype else f"precision {r['precision']!r} unknown")
        reason = reason or (None if r["hetsim_type"] in GPU_PROFILES or _is_profile(r["hetsim_type"])
                            else f"no profile {r['hetsim_type']!r}")
        if reason:
            skipped.append(Skipped(rid, reason))
            continue
        assert model is not None and dtype is not None
        rows.append(Row(rid, r["hetsim_type"], model, seq, batch, gpus, dtype,
                        memory_format(r["memory_format"], r.get("source", "") + " " + r.get("notes", "")),
                        measured, r["precision"], r.get("device", "")))
    return rows, skipped


def _is_profile(name: str) -> bool:
    try:
        load_profile(name)
    except ConfigError:
        return False
    return True


def _positive(v: str, src: str, field: str) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise ConfigError(src, field, f"must be a number, got {v!r}") from None
    if not (x > 0 and math.isfinite(x)):
        raise ConfigError(src, field, f"must be a finite number > 0, got {v!r}")
    return x


def _positive_int(v: str, src: str, field: str) -> int:
    x = _positive(v, src, field)
    if x != int(x):
        raise ConfigError(src, field, f"must be a whole number, got {v!r}")
    return int(x)


def model_of(text: str) -> tuple[str | None, int | None]:
    """The zoo model a table's model text names, and its sequence length where it gives
    one ("seq 384"): ``("bert_large", 384)``, ``("resnet50", None)``, ``(None, None)``."""
    t = text.lower()
    seq = re.search(r"seq(?:uence)?(?: length)?\s*(\d+)", t)
    seq_len = int(seq.group(1)) if seq else None
    m = re.search(r"bert[- _]?(base|large)", t)
    if m:
        return f"bert_{m.group(1)}", seq_len
    for name in sorted(zoo.names(), key=len, reverse=True):
        if re.search(rf"(?<![a-z0-9]){re.escape(name)}(?![a-z0-9])", t.replace("-", "")):
            return name, seq_len
    return None, None


def memory_format(given: str, framework_text: str) -> str:
    """A row's memory format: as given, or for ``unknown`` the framework's default
    (TensorFlow lays activations out channels-last; PyTorch contiguous)."""
    g = given.strip().lower()
    if g in ("contiguous", "nchw"):
        return "contiguous"
    if g in ("channels_last", "nhwc"):
        return "channels_last"
    return "channels_last" if re.search(r"tensorflow|\btf\b", framework_text.lower()) else "contiguous"


@functools.cache
def row_model(name: str, seq_len: int | None) -> Model:
    """The zoo model of a row: the committed layer list, or one extracted at the row's
    sequence length where that differs from the zoo's (needs torch)."""
    base = zoo.get(name)
    if seq_len is None:
        return base
    import inspect

    from sim.torch_extract import from_torch
    from sim.zoo_torch import BUILDERS

    default = inspect.signature(BUILDERS[name]).parameters.get("seq_len")
    if default is None or default.default == seq_len:
        return base

    module, example = zoo.torch_module(name, batch_size=1, seq_len=seq_len)
    return from_torch(module, example, name=f"{name}@{seq_len}")


def predict(rows: Sequence[Row], profiles: dict[str, DeviceProfile]) -> np.ndarray:
    """Samples per second of each row: ``batch / training_step_s`` on its profile."""
    out = []
    for r in rows:
        m = row_model(r.model, r.seq_len)
        t = training_step_s(m, profiles[r.profile], r.dtype, r.batch, r.memory_format,
                            OPTIMIZERS.get(r.model, "momentum"))
        out.append(r.batch / t)
    return np.array(out)


def with_parameters(base: DeviceProfile, theta: Sequence[float] | np.ndarray, note: str | None = None) -> DeviceProfile:
    """``base`` with the fitted parameters ``theta`` (in :data:`PARAMS` order) written in
    (:func:`calibration.gpu_fields.with_gpu_fields`; attention takes the GEMM values, fp16
    and bf16 the half-precision ones)."""
    p = dict(zip(PARAMS, (float(x) for x in theta), strict=True))
    half = {"conv": p["conv_half"], "gemm": p["gemm_half"], "attention": p["gemm_half"]}
    return with_gpu_fields(
        base, {"conv": p["conv_fp32"], "gemm": p["gemm_fp32"], "attention": p["gemm_fp32"]},
        {"tf32": {"conv": p["conv_tf32"], "gemm": p["gemm_tf32"], "attention": p["gemm_tf32"]},
         "fp16": half, "bf16": half},
        p["mem_eff"], p["launch_us"] * 1e-6, p["layout_passes"],
        None if note is None else {"kind": "fitted", "fit": note})


def rounded(theta: np.ndarray, digits: int = 4) -> np.ndarray:
    """``theta`` to ``digits`` significant digits: the values the profiles are written with
    (and the report is priced with, so that ``--predict`` on the written profiles prints
    the same table)."""
    return np.array([float(f"{x:.{digits}g}") for x in theta])


def fit(rows: Sequence[Row], profiles: dict[str, DeviceProfile], x0: np.ndarray = X0) -> np.ndarray:
    """The parameters (:data:`PARAMS`) that minimise the squared log error of ``rows``."""
    from scipy.optimize import least_squares

    measured = np.array([r.measured_sps for r in rows])

    def residuals(theta: np.ndarray) -> np.ndarray:
        fitted = {name: with_parameters(p, theta) for name, p in profiles.items()}
        return np.log(predict(rows, fitted) / measured)

    return np.asarray(least_squares(residuals, x0, bounds=(LOWER, UPPER), diff_step=1e-3).x)


@dataclass(frozen=True)
class Outcome:
    """A row's prediction."""

    row: Row
    predicted_sps: float

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return self.predicted_sps / self.row.measured_sps - 1.0


def summary(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Median and largest |error|, and the median signed error per precision."""
    errs = np.array([o.error for o in outcomes])
    by_precision: dict[str, list[float]] = {}
    for o in outcomes:
        by_precision.setdefault(o.row.dtype, []).append(o.error)
    return {
        "rows": len(outcomes),
        "median_abs_error": float(np.median(np.abs(errs))) if errs.size else None,
        "max_abs_error": float(np.max(np.abs(errs))) if errs.size else None,
        "median_signed_error_by_precision": {k: float(np.median(v)) for k, v in by_precision.items()},
    }


def report(outcomes: Sequence[Outcome], skipped: Sequence[Skipped], theta: np.ndarray | None) -> str:
    """The rows (predicted, measured, error), the medians and what was skipped, as text."""
    lines = []
    if theta is not None:
        lines.append("fitted: " + ", ".join(f"{k} {v:.4g}" for k, v in zip(PARAMS, theta, strict=True)))
    lines.append(f"{'id':24s} {'profile':8s} {'model':11s} {'dtype':5s} {'format':13s} {'batch':>5s} "
                 f"{'predicted':>10s} {'measured':>10s} {'error':>7s}")
    for o in outcomes:
        r = o.row
        lines.append(f"{r.id:24s} {r.profile:8s} {r.model:11s} {r.dtype:5s} {r.memory_format:13s} "
                     f"{r.batch:5d} {o.predicted_sps:10.1f} {r.measured_sps:10.1f} {o.error:+7.1%}")
    s = summary(outcomes)
    if s["rows"]:
        lines.append(f"median |error| {s['median_abs_error']:.1%} over {s['rows']} rows, "
                     f"largest {s['max_abs_error']:.1%}")
        lines.append("median signed error by precision: " + ", ".join(
            f"{k} {v:+.1%}" for k, v in s["median_signed_error_by_precision"].items()))
    for sk in skipped:
        lines.append(f"skipped {sk.id}: {sk.reason}")
    return "\n".join(lines) + "\n"


def figure(outcomes: Sequence[Outcome], path: Path, title: str, multi: Sequence[Outcome] = ()) -> None:
    """Predicted against measured throughput, log axes, one marker per precision, with
    the identity and +-10% / +-25% bands; ``multi`` (multi-GPU rows) as hollow markers
    of the same shapes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 5.6))
    meas = np.array([o.row.measured_sps for o in (*outcomes, *multi)])
    lo, hi = float(meas.min()) / 1.6, float(meas.max()) * 1.6
    xs = np.geomspace(lo, hi, 50)
    ax.plot(xs, xs, color="black", lw=1, label="predicted = measured")
    for f, style in ((0.10, ":"), (0.25, "--")):
        ax.plot(xs, xs * (1 + f), color="grey", lw=0.8, ls=style, label=f"+-{f:.0%}")
        ax.plot(xs, xs * (1 - f), color="grey", lw=0.8, ls=style)
    markers = {"fp32": ("o", "tab:blue"), "tf32": ("s", "tab:green"), "fp16": ("^", "tab:red"),
               "bf16": ("v", "tab:purple")}
    for dtype, (mk, col) in markers.items():
        sel = [o for o in outcomes if o.row.dtype == dtype]
        if sel:
            ax.scatter([o.row.measured_sps for o in sel], [o.predicted_sps for o in sel], marker=mk, color=col,
                       s=42, label=dtype if dtype in ("fp32", "tf32") else f"{dtype} (mixed precision)",
                       zorder=3)
        sel = [o for o in multi if o.row.dtype == dtype]
        if sel:
            ax.scatter([o.row.measured_sps for o in sel], [o.predicted_sps for o in sel], marker=mk,
                       facecolors="none", edgecolors=col, s=56, zorder=3,
                       label=f"{dtype}, {'/'.join(sorted({str(o.row.gpus) for o in sel}))} GPUs (all-reduce)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured throughput (samples/s, published)")
    ax.set_ylabel("predicted throughput (samples/s, hetsim)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def profile_json(p: DeviceProfile) -> str:
    """A profile as the shipped files write it: one top-level key a line."""
    data = p.model_dump(by_alias=True, exclude_none=True, mode="json")
    for k in ("measurement", "corrections"):
        if data.get(k) == {} or data.get(k) == {"spread": None, "raw": None}:
            data.pop(k)
    body = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in data.items())
    return "{\n" + body + "\n}\n"


def write_profiles(theta: np.ndarray, note: str, names: Sequence[str] = GPU_PROFILES,
                   folder: Path = BUILTIN_DIR) -> list[Path]:
    """Write ``theta`` into the shipped GPU profiles ``names`` in ``folder``."""
    written = []
    for name in names:
        path = folder / f"{name}.json"
        p = with_parameters(load_profile_file(path), theta, note)
        atomic_write(path, profile_json(p))
        written.append(path)
    return written


#: The published rows the shipped GPU profiles are fitted to (a copy of the project's
#: reference table, each row naming its source).
DEFAULT_TABLE = Path(__file__).resolve().parent / "data" / "gpu_training_throughput.csv"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m calibration.published``: fit (or with --predict check) the GPU profiles."""
    ap = argparse.ArgumentParser(prog="python -m calibration.published", description=__doc__.split("\n")[0])
    ap.add_argument("--table", default=str(DEFAULT_TABLE), help=f"published measurements (default: {DEFAULT_TABLE})")
    ap.add_argument("--predict", action="store_true", help="price the rows with the profiles as they are, no fit")
    ap.add_argument("--write", action="store_true", help="write the fitted parameters into the GPU profiles")
    ap.add_argument("--figure", help="write predicted vs measured (PNG) here")
    ap.add_argument("--json", help="write the rows, the medians and the parameters (JSON) here")
    args = ap.parse_args(argv)
    if args.predict and args.write:
        ap.error("--predict prices the profiles as they are: nothing to --write")
    try:
        rows, skipped = read_table(args.table)
        single = [r for r in rows if r.gpus == 1]
        skipped = [*skipped, *(Skipped(r.id, f"{r.gpus} GPUs: the collective is not fitted here")
                               for r in rows if r.gpus != 1)]
        if not single:
            raise ConfigError(args.table, "gpus", "no single-GPU row hetsim can price")
        base = {r.profile: load_profile(r.profile) for r in single}
        theta = None
        if args.predict:
            profiles = base
        else:
            theta = rounded(fit(single, base))
            profiles = {k: with_parameters(p, theta) for k, p in base.items()}
        outcomes = [Outcome(r, float(x)) for r, x in zip(single, predict(single, profiles), strict=True)]
    except ConfigError as e:
        print(f"hetsim: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(report(outcomes, skipped, theta))
    if args.write and theta is not None:
        note = (f"efficiency, math_efficiency, mem_efficiency, launch_overhead_s and "
                f"corrections.layout_transpose fitted by `python -m calibration.published --write` to "
                f"{len(single)} published single-GPU rows of {Path(args.table).name} "
                f"({_dt.date.today().isoformat()}); the same values in every GPU profile")
        for path in write_profiles(theta, note):
            print(f"wrote {path}", file=sys.stderr)
    if args.figure:
        figure(outcomes, Path(args.figure), "hetsim vs published single-GPU training throughput")
    if args.json:
        doc = {"table": str(args.table), "parameters": None if theta is None else dict(zip(PARAMS, map(float, theta))),
               "summary": summary(outcomes), "rows": [{**asdict(o.row), "predicted_sps": o.predicted_sps,
                                                       "error": o.error} for o in outcomes],
               "skipped": [asdict(s) for s in skipped]}
        atomic_write(Path(args.json), json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
