"""A GPU profile fitted to its own measurements: ``hetsim calibrate`` of a profile that
``hetsim profile --device cuda:N`` measured (:mod:`calibration.profiler.gpu`).

It writes the fields the published fit writes (:mod:`calibration.gpu_fields`), from the
GPU's raw measurements instead of published throughput, so that a measured GPU profile
prices that GPU in place of the shipped one:

- ``peak_flops[mode]`` for every math mode the GPU has (``raw["gpu"]["modes"]``): the
  datasheet's where the device name is one of :data:`KNOWN_GPUS` (the shipped profile
  of that GPU), else the best rate of the GEMM grid in that mode; ``mem_bw_Bps``
  likewise the datasheet's or the best rate of the largest bandwidth benchmarks.
  ``source.peak_flops`` and ``source.mem_bw_Bps`` say which. An identified GPU also
  takes its shipped profile's price, power and non-matmul efficiencies;
- ``math_fallback``: fp32 for the modes the GPU lacks;
- ``launch_overhead_s``: the dispatch benchmark (a one-element add, the time per add of
  a loop);
- ``mem_efficiency`` (every op class): the geometric mean, over the largest bandwidth
  benchmarks (copy and add), of ``bytes / (mem_bw_Bps * (t - launch_overhead_s))``;
- ``corrections.wave_quantization.sms``: the device's SM count (``raw["gpu"]["sms"]``);
- ``corrections.layout_transpose.passes``: from the layout pair, ``(contiguous_s -
  channels_last_s) / phases * mem_bw_Bps * mem_efficiency / moved``, ``moved = batch *
  (input + output bytes)`` of the half-precision convolution (0 where contiguous is not
  slower); the correction's formula solved for ``passes``;
- ``efficiency[op]`` (fp32) and ``math_efficiency[mode][op]`` for op in conv, gemm,
  attention: one constant per mode and op class, fitted to that mode's layer passes
  (``raw["micro_by_mode"][mode]``; the GEMM grid's rows where a mode has no GEMM layer).
  The cost model prices a pass at efficiency ``e`` as ``fixed + max(c / e, m)`` (``c``
  its compute seconds at efficiency 1, wave quantization included; ``m`` its memory
  seconds; ``fixed`` its launches and the corrections' extra seconds); ``e`` minimises
  ``sum t * log(price / t)^2`` over the passes whose compute at ``e`` is at least their
  memory and their fixed seconds (iterated to a fixed point; all passes where none is).
  Weighted by the measured time, the long passes decide, as they decide a training
  step's time; launch-bound passes, whose time says nothing of the math rate, do not.
  An op class without a pass takes its mode's GEMM value.

Every fitted value is kept to 4 significant digits, as the published fit's.
"""

from __future__ import annotations

import datetime as _dt
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from calibration import model_variants
from calibration.gpu_fields import GPU_MODES, MATMUL_CLASSES, fallbacks, with_gpu_fields
from hardware_profiles import BUILTIN_DIR, DeviceProfile, load_profile_file
from sim.corrections import corrections_of
from sim.costmodel import iteration_compute_s, layer_time_s, pass_context, pass_terms, pass_time_s
from sim.precision import MATMUL_OPS, activation_scales
from sim.workload import Layer, model_from_dict

__all__ = ["KNOWN_GPUS", "GpuPass", "fit_efficiency", "fit_gpu", "gpu_passes", "identify", "is_gpu_raw"]

#: GPUs whose datasheet figures a shipped profile holds: a pattern of the name torch gives
#: the device (``torch.cuda.get_device_name``) and that profile. Only the variants whose
#: peaks and bandwidth are the profile's (an A100 of 80 GB or an H100 PCIe differ).
KNOWN_GPUS: tuple[tuple[str, str], ...] = (
    (r"\bTesla T4\b", "t4"),
    (r"\bL4\b", "l4"),
    (r"\bA10G\b", "a10g"),
    (r"\bV100-SXM2-(16|32)GB\b", "v100"),
    (r"\bA100-(SXM4|PCIE)-40GB\b", "a100"),
    (r"\bH100 80GB HBM3\b", "h100"),
    (r"^NVIDIA H200$", "h200"),
)

#: Bounds of a fitted efficiency (fraction of a mode's peak).
EFF_BOUNDS = (1e-3, 1.5)
#: Bounds of the memory efficiency and the layout passes (the schema's).
MEM_EFF_BOUNDS = (1e-4, 100.0)
MAX_LAYOUT_PASSES = 100.0


def _r4(x: float) -> float:
    """``x`` to 4 significant digits (as the published fit keeps its parameters)."""
    return float(f"{x:.4g}")


def is_gpu_raw(raw: dict[str, Any] | None) -> bool:
    """Whether ``raw`` holds a GPU's per-mode measurements (its ``gpu`` record)."""
    return bool(raw) and isinstance(raw.get("gpu"), dict)  # type: ignore[union-attr]


def identify(device_name: str) -> str | None:
    """The shipped profile of the GPU named ``device_name`` (:data:`KNOWN_GPUS`), or None."""
    for pattern, profile in KNOWN_GPUS:
        if re.search(pattern, device_name.strip()):
            return profile
    return None


@dataclass(frozen=True)
class GpuPass:
    """One measured pass of a matmul-class layer in a math mode, as the fit prices it."""

    mode: str
    source: str
    layer: Layer
    phase: str
    batch: int
    input_bytes: float
    scales: tuple[float, float]
    memory_format: str
    t_s: float

    def price_s(self, dev: DeviceProfile) -> float:
        """The cost model's seconds of this pass on ``dev``."""
        return layer_time_s(self.layer, self.phase, self.batch, dev, self.mode, self.input_bytes,
                            scales=self.scales, memory_format=self.memory_format)


def _grid_passes(raw: dict[str, Any], mode: str) -> list[GpuPass]:
    """The GEMM grid's rows of ``mode`` as passes: the forward of a Linear of ``k`` inputs and
    ``n`` outputs on ``m`` rows, one kernel, operands in the mode's storage."""
    half = 0.5 if mode in ("fp16", "bf16") else 1.0
    out = []
    for row in raw.get("gemm", []):
        if row["dtype"] != mode or float(row["t_s"]) <= 0:
            continue
        m, n, k = int(row["m"]), int(row["n"]), int(row["k"])
        ly = Layer(f"mm{m}x{n}x{k}", "gemm", 2.0 * k * n, 4.0 * k * n, 4.0 * k * n, 4.0 * n)
        out.append(GpuPass(mode, "gemm grid", ly, "fwd", m, 4.0 * k, (half, half), "contiguous",
                           float(row["t_s"])))
    return out


def gpu_passes(raw: dict[str, Any]) -> list[GpuPass]:
    """Every measured pass of a GEMM, convolution or attention layer with FLOPs in
    ``raw["micro_by_mode"]`` (its own time where the run has it), and for a mode with no
    GEMM layer the GEMM grid's rows of that mode (:func:`_grid_passes`)."""
    out: list[GpuPass] = []
    for mode, entries in raw.get("micro_by_mode", {}).items():
        mine = []
        for e in entries:
            model = model_from_dict(e["model"], source=f"micro:{e['name']}")
            scales = activation_scales(model, mode)
            index = {ly.name: i for i, ly in enumerate(model.layers)}
            for run in e["runs"]:
                own = run.get("own") or {}
                for name, vals in run["layers"].items():
                    i = index.get(name)
                    if i is None or model.layers[i].op not in MATMUL_OPS or model.layers[i].fwd_flops <= 0:
                        continue
                    for phase, t in zip(("fwd", "bwd"), own.get(name, vals)[:2], strict=True):
                        if float(t) > 0:
                            mine.append(GpuPass(mode, e["name"], model.layers[i], phase, int(run["batch"]),
                                                model.input_bytes_of(i), scales[i],
                                                e.get("memory_format", "contiguous"), float(t)))
        if not any(p.layer.op == "gemm" for p in mine):
            mine += _grid_passes(raw, mode)
        out += mine
    return out


def fit_efficiency(t: Sequence[float] | np.ndarray, fixed: Sequence[float] | np.ndarray,
                   compute: Sequence[float] | np.ndarray, memory: Sequence[float] | np.ndarray, bounds: tuple[float, float] = EFF_BOUNDS) -> float:
    """The efficiency ``e`` of the module docstring: minimises ``sum t * log((fixed + max(
    compute / e, memory)) / t)^2`` over the passes compute-bound at ``e`` (compute / e at
    least memory and fixed), found by iterating from all passes to a fixed point (at most
    10 rounds; all passes where none is compute-bound)."""
    from scipy.optimize import minimize_scalar

    ta, fa, ca, ma = (np.asarray(x, dtype=float) for x in (t, fixed, compute, memory))
    if len(ta) == 0:
        raise ValueError("no pass to fit an efficiency to")

    def solve(keep: np.ndarray) -> float:
        def loss(x: float) -> float:
            e = math.exp(x)
            price = fa[keep] + np.maximum(ca[keep] / e, ma[keep])
            return float(np.sum(ta[keep] * np.log(price / ta[keep]) ** 2))

        res = minimize_scalar(loss, bounds=(math.log(bounds[0]), math.log(bounds[1])), method="bounded",
                              options={"xatol": 1e-12})
        return math.exp(float(res.x))

    keep = np.ones(len(ta), bool)
    e = solve(keep)
    for _ in range(10):
        bound = (ca / e >= ma) & (ca / e >= fa)
        if not bound.any() or (bound == keep).all():
            break
        keep = bound
        e = solve(keep)
    return e


def _bandwidth(raw: dict[str, Any], sheet_bw: float | None, launch: float) -> tuple[float, float, str]:
    """(mem_bw_Bps, mem_efficiency, what mem_bw_Bps is) from the largest bandwidth benchmarks."""
    rows = raw.get("bandwidth") or []
    if not rows:
        raise ValueError("raw.bandwidth: no bandwidth benchmark")
    big = max(int(r["elems"]) for r in rows)
    sel = [r for r in rows if int(r["elems"]) == big and float(r["t_s"]) > 0]
    measured = max(float(r["bytes"]) / float(r["t_s"]) for r in sel)
    bw = sheet_bw if sheet_bw is not None else _r4(measured)
    effs = [float(r["bytes"]) / (bw * (float(r["t_s"]) - launch if float(r["t_s"]) > launch else float(r["t_s"])))
            for r in sel]
    eff = _r4(min(max(math.exp(float(np.mean(np.log(effs)))), MEM_EFF_BOUNDS[0]), MEM_EFF_BOUNDS[1]))
    what = ("measured: the best rate of the largest bandwidth benchmarks (raw.bandwidth)"
            if sheet_bw is None else "datasheet")
    return bw, eff, what


def _layout_passes(raw: dict[str, Any], achieved_Bps: float) -> float | None:
    """``corrections.layout_transpose.passes`` from ``raw["layout"]`` (None without it)."""
    lay = raw.get("layout")
    if not lay:
        return None
    model = model_from_dict(lay["model"], source=f"micro:{lay['name']}")
    i = next(j for j, ly in enumerate(model.layers) if ly.op == "conv")
    moved = float(lay["batch"]) * 0.5 * (model.input_bytes_of(i) + model.layers[i].activation_bytes)
    extra = max(0.0, float(lay["contiguous_s"]) - float(lay["channels_last_s"])) / float(lay.get("phases", 2))
    return _r4(min(extra * achieved_Bps / moved, MAX_LAYOUT_PASSES))


def _peaks(raw: dict[str, Any], modes: Sequence[str], sheet: DeviceProfile | None
           ) -> tuple[dict[str, float], str]:
    """Peak FLOP/s per mode (the datasheet's where it has the mode, else the best GEMM rate),
    and what they are."""
    best: dict[str, float] = {}
    for row in raw.get("gemm", []):
        if float(row["t_s"]) > 0:
            best[row["dtype"]] = max(best.get(row["dtype"], 0.0), float(row["flops"]) / float(row["t_s"]))
    peaks, measured = {}, []
    for m in modes:
        if sheet is not None and m in sheet.peak_flops:
            peaks[m] = sheet.peak_flops[m]
        elif m in best:
            peaks[m] = _r4(best[m])
            measured.append(m)
        else:
            raise ValueError(f"raw.gemm: no {m} row to take the {m} peak from")
    if sheet is None:
        what = "measured: the best rate of the GEMM grid per math mode (raw.gemm)"
    else:
        what = "datasheet" + (f" (measured, the best GEMM rate: {', '.join(measured)})" if measured else "")
    return peaks, what


def _check(raw: dict[str, Any]) -> None:
    """Raise ValueError naming the first raw entry the fit needs and ``raw`` lacks."""
    for key, kind in (("gemm", list), ("bandwidth", list), ("dispatch_s", (int, float)),
                      ("micro_by_mode", dict)):
        if not isinstance(raw.get(key), kind):
            raise ValueError(f"raw.{key}: missing (measure the profile with hetsim profile --device cuda:N)")
    for key in ("modes", "sms"):
        if key not in raw["gpu"]:
            raise ValueError(f"raw.gpu.{key}: missing")
    unknown = [m for m in raw["gpu"]["modes"] if m not in GPU_MODES]
    if unknown:
        raise ValueError(f"raw.gpu.modes: unknown math mode {unknown[0]!r} (known: {', '.join(GPU_MODES)})")


def _base(profile: DeviceProfile, raw: dict[str, Any]) -> tuple[DeviceProfile, dict[str, Any]]:
    """``profile`` with its datasheet-or-measured fields (peaks, bandwidth, fallbacks, SMs,
    launch) set and its fitted ones cleared; and the source entries saying what they are."""
    g = raw["gpu"]
    modes = [m for m in GPU_MODES if m in g["modes"]]
    if "fp32" not in modes:
        raise ValueError("raw.gpu.modes: must include fp32")
    name = str(raw.get("device_name") or g.get("name") or "")
    known = identify(name)
    sheet = load_profile_file(BUILTIN_DIR / f"{known}.json") if known else None
    launch = float(raw["dispatch_s"])
    peaks, peaks_are = _peaks(raw, modes, sheet)
    bw, _, bw_is = _bandwidth(raw, sheet.mem_bw_Bps if sheet else None, launch)
    data = profile.model_dump(by_alias=True, exclude_none=True, mode="json")
    for k in ("layers", "math_efficiency", "efficiency_bwd", "mem_efficiency_bwd", "math_fallback"):
        data.pop(k, None)
    data.update(peak_flops=peaks, mem_bw_Bps=bw, launch_overhead_s=launch,
                corrections={"wave_quantization": {"sms": int(g["sms"]), "tile_m": 128, "tile_n": 128}},
                efficiency={})
    if fallbacks(modes):
        data["math_fallback"] = fallbacks(modes)
    where = ""
    if sheet is not None:
        data["efficiency"] = {k: v for k, v in sheet.model_dump(mode="json")["efficiency"].items()
                              if k not in MATMUL_CLASSES}
        data["price_per_hour"], data["power_w"] = sheet.price_per_hour, sheet.power_w.model_dump()
        where = f" of hardware_profiles/{known}.json (device {name!r})"
    source = {"peak_flops": peaks_are.replace("datasheet", f"datasheet{where}", 1),
              "mem_bw_Bps": bw_is.replace("datasheet", f"datasheet{where}", 1)}
    return DeviceProfile.model_validate(data), source


def _priced(passes: Sequence[GpuPass], unit: DeviceProfile) -> np.ndarray:
    """Per pass, (fixed seconds, compute seconds at efficiency 1, memory seconds) on ``unit``
    (every efficiency 1)."""
    cs = corrections_of(unit)
    out = np.empty((len(passes), 3))
    for j, p in enumerate(passes):
        ctx = pass_context(p.layer, p.phase, p.batch, p.mode, p.input_bytes, cs, scales=p.scales,
                           memory_format=p.memory_format)
        terms = pass_terms(unit, ctx, cs)
        total = pass_time_s(unit, ctx, cs)
        out[j] = (total - max(terms.compute_s, terms.memory_s), terms.compute_s, terms.memory_s)
    return out


def _efficiencies(passes: Sequence[GpuPass], unit: DeviceProfile, modes: Sequence[str]
                  ) -> dict[str, dict[str, float]]:
    """Per mode, the fitted efficiency of each op class (:func:`fit_efficiency`)."""
    priced = _priced(passes, unit)
    out: dict[str, dict[str, float]] = {}
    for mode in modes:
        table: dict[str, float] = {}
        for op in ("gemm", "conv", "attention"):
            sel = [j for j, p in enumerate(passes) if p.mode == mode and p.layer.op == op]
            if sel:
                table[op] = _r4(fit_efficiency([passes[j].t_s for j in sel], priced[sel, 0], priced[sel, 1],
                                               priced[sel, 2]))
        if "gemm" not in table:
            raise ValueError(f"raw.micro_by_mode.{mode}: no GEMM pass (nor a GEMM grid row) to fit")
        out[mode] = {op: table.get(op, table["gemm"]) for op in MATMUL_CLASSES}
    return out


def _row(op: str, mode: str, errs: Sequence[float]) -> dict[str, Any]:
    e = np.abs(np.asarray(errs, dtype=float))
    return {"op": op, "phase": "both", "mode": mode, "points": len(e),
            "median_abs_rel_err": float(np.median(e)), "p90_abs_rel_err": float(np.percentile(e, 90))}


def residual_rows(profile: DeviceProfile, passes: Sequence[GpuPass], raw: dict[str, Any]
                  ) -> list[dict[str, Any]]:
    """|relative error| of the fitted profile's prices: per math mode and op class over its
    passes, the largest bandwidth benchmarks, the zoo models' whole iterations (fp32) where
    measured, and all of these together (the last row)."""
    rows, every = [], []
    for mode in profile.peak_flops:
        for op in ("gemm", "conv", "attention"):
            errs = [p.price_s(profile) / p.t_s - 1 for p in passes if p.mode == mode and p.layer.op == op]
            if errs:
                rows.append(_row(op, mode, errs))
                every += errs
    bw = raw.get("bandwidth") or []
    big = max((int(r["elems"]) for r in bw), default=0)
    mem = profile.mem_bw_Bps * float((profile.mem_efficiency or {}).get("elementwise", 1.0))  # type: ignore[arg-type]
    errs = [(profile.launch_overhead_s + float(r["bytes"]) / mem) / float(r["t_s"]) - 1
            for r in bw if int(r["elems"]) == big and float(r["t_s"]) > 0]
    if errs:
        rows.append(_row("bandwidth", "-", errs))
        every += errs
    errs = [iteration_compute_s(model_variants.model(name), profile, "fp32", int(run["batch"])) / float(run["iter_s"]) - 1
            for name, runs in (raw.get("models") or {}).items() for run in runs if float(run["iter_s"]) > 0]
    if errs:
        rows.append(_row("iteration", "fp32", errs))
        every += errs
    rows.append(_row("all", "-", every))
    return rows


def fit_gpu(profile: DeviceProfile) -> tuple[DeviceProfile, list[dict[str, Any]]]:
    """The GPU profile fitted to its raw measurements (the module docstring) and its
    residual rows (:func:`residual_rows`). Per-layer tables are not kept: they would price
    every math mode alike.

    Raises:
        ValueError: the raw data lacks what a field is fitted from (naming the raw key).
    """
    raw = profile.measurement.raw
    if not is_gpu_raw(raw):
        raise ValueError("raw.gpu: not a GPU profile's measurements (make it with hetsim profile "
                         "--device cuda:N)")
    assert raw is not None
    _check(raw)
    base, source = _base(profile, raw)
    modes = list(base.peak_flops)
    launch = base.launch_overhead_s
    _, mem_eff, _ = _bandwidth(raw, base.mem_bw_Bps, launch)
    layout = _layout_passes(raw, base.mem_bw_Bps * mem_eff)
    passes = gpu_passes(raw)
    ones = dict.fromkeys(MATMUL_CLASSES, 1.0)
    unit = with_gpu_fields(base, ones, {m: ones for m in modes if m != "fp32"}, mem_eff, launch, layout)
    eff = _efficiencies(passes, unit, modes)
    fitted = ("efficiency, math_efficiency, mem_efficiency, launch_overhead_s"
              + (" and corrections.layout_transpose" if layout is not None else "")
              + f" fitted by `hetsim calibrate` to this profile's raw measurements ({len(passes)} "
              f"layer passes in {', '.join(modes)}; {_dt.date.today().isoformat()}); "
              "corrections.wave_quantization.sms: raw.gpu.sms")
    prof = with_gpu_fields(base, eff["fp32"], {m: eff[m] for m in modes if m != "fp32"}, mem_eff, launch,
                           layout, {**source, "fit": fitted})
    return prof, residual_rows(prof, passes, raw)
