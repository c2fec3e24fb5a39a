"""The measured :class:`~hardware_profiles.schema.DeviceProfile` made from a run's raw
measurements, written as JSON, and summarised in a few lines."""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any

from calibration.profiler.drift import drift_line
from calibration.profiler.quantization import quant_costs
from calibration.profiler.timing import _r
from hardware_profiles.fileio import atomic_write
from hardware_profiles.schema import DeviceProfile


def build_profile(raw: dict[str, Any], name: str, fit: bool = True) -> DeviceProfile:
    """The measured :class:`DeviceProfile` of ``raw`` (from :func:`~calibration.profiler.measure`).

    Per-layer tables come from the zoo models' runs, keyed by
    :func:`sim.costmodel.table_key` (layers of equal key pooled by
    median); the efficiency curves, memory bandwidth and dispatch overhead are
    fitted by :func:`calibration.calibrate.fit` when ``fit`` is true. A GPU's
    measurements (``raw["gpu"]``) make a GPU profile instead (:func:`_gpu_profile`).
    """
    from calibration import calibrate

    if "gpu" in raw:
        return _gpu_profile(raw, name, fit)
    dev_s = raw["device"]
    cuda = dev_s.startswith("cuda")
    peaks: dict[str, float] = {}
    for row in raw["gemm"]:
        rate = row["flops"] / row["t_s"]
        peaks[row["dtype"]] = max(peaks.get(row["dtype"], 0.0), rate)
    # Effective rates of the single-layer GEMMs and convolutions count too: a
    # Winograd or FFT convolution beats any GEMM in FLOPs as the flop counter
    # counts them (direct convolution), and efficiencies are capped at 1.5.
    for entry in raw.get("micro", []):
        for ly in entry["model"]["layers"]:
            if ly["op"] not in ("gemm", "conv") or not ly["fwd_flops"]:
                continue
            for run in entry["runs"]:
                t = run["layers"].get(ly["name"], [0.0])[0]
                if t > 0:
                    peaks["fp32"] = max(peaks["fp32"], ly["fwd_flops"] * run["batch"] / t)
    # DRAM bandwidth: the largest copy (smaller ones run from cache; the
    # bandwidth curves of the fit carry that, with efficiencies above 1)
    big = max((r for r in raw["bandwidth"] if r["op"] == "copy"), key=lambda r: r["elems"])
    mem_bw = big["bytes"] / big["t_s"]
    if cuda:
        import torch

        props = torch.cuda.get_device_properties(torch.device(dev_s))
        memory = float(props.total_memory)
    else:
        import psutil

        memory = float(psutil.virtual_memory().total)
    net = raw.get("network") or {}
    cpus = int(raw.get("cpus") or raw["threads"])  # the device is the whole machine
    source = {
        "kind": "measured",
        "date": _dt.date.today().isoformat(),
        "device": raw.get("device_name", ""),
        "torch": raw.get("torch", ""),
        "threads": raw["threads"],
        "cpus": cpus,
        "cpu_capability": raw.get("cpu_capability", ""),
        "host": raw.get("host", ""),
        "quick": bool(raw.get("quick")),
        "wall_s": raw.get("wall_s"),
        "note": (
            "Measured by `hetsim profile`. peak_flops: the best effective rate measured per dtype "
            "(GEMM grid; for fp32 also single Linear/Conv2d layers, whose FLOPs are counted as "
            "direct convolution): achieved, not nominal; mem_bw_Bps: the largest copy measured "
            "(DRAM); launch_overhead_s, efficiency, efficiency_bwd, mem_efficiency(_bwd): fitted "
            "by `hetsim calibrate` to the raw measurements (see hardware_profiles/README.md); "
            "layers: median forward/backward seconds of the zoo models' layers; nic_bw_Bps: the "
            "measured loopback point-to-point bandwidth when measured (a single-host figure, "
            "not a NIC's). "
            + ("price_per_hour and power_w: not measured (0)." if cuda else
               "price_per_hour: 0.0425 USD per vCPU-hour x cpus; power_w: 4.6875 W per vCPU "
               "active, 30% of that idle (the cpu-2c datasheet assumptions), not measured.")
        ),
    }
    data: dict[str, Any] = {
        "schema": 2,
        "name": name,
        "kind": "gpu" if cuda else "cpu",
        "peak_flops": {k: _r(v) for k, v in peaks.items()},
        "mem_bw_Bps": _r(mem_bw),
        "memory_bytes": memory,
        "launch_overhead_s": _r(raw["dispatch_s"]),
        "nic_bw_Bps": _r(net.get("p2p_bw_Bps") or 1.25e9),
        "price_per_hour": 0.0 if cuda else round(0.0425 * cpus, 4),
        "power_w": ({"idle": 0.0, "active": 0.0} if cuda else
                    {"idle": round(0.3 * 4.6875 * cpus, 4), "active": round(4.6875 * cpus, 4)}),
        "source": source,
        "corrections": {
            "dense_sparse_grad": {},  # nn.Embedding's default: a dense gradient of the table
            # a first layer's backward computes the weight gradient only (its bytes as such)
            "weight_grad_only_bwd": {},
        },
        "layers": calibrate.layer_tables(raw),
        "measurement": {"spread": calibrate.spread_of(raw), "raw": raw},
    }
    if net:
        data["network"] = {k: v for k, v in net.items()}
    if quant_costs(raw):
        data["quant"] = quant_costs(raw)
    profile = DeviceProfile.model_validate(data)
    if fit:
        profile = calibrate.calibrate(profile).profile
    return profile


def _gpu_profile(raw: dict[str, Any], name: str, fit: bool) -> DeviceProfile:
    """The measured GPU profile of ``raw`` (a CUDA run: :mod:`calibration.profiler.gpu`).

    Unfitted: the best GEMM rate per math mode as its peak, fp32 the fallback of the modes
    the GPU lacks, the largest copy's rate as its bandwidth, the dispatch time as its
    launch overhead, its SMs for ``corrections.wave_quantization``, no per-layer tables.
    Fitted (``fit``): :func:`calibration.calibrate.calibrate`, which for a GPU writes the
    published fit's fields from these measurements (:mod:`calibration.gpu_fit`).
    """
    from calibration import calibrate
    from calibration.gpu_fields import GPU_MODES, fallbacks

    g = raw["gpu"]
    modes = [m for m in GPU_MODES if m in g["modes"]]
    peaks: dict[str, float] = {}
    for row in raw["gemm"]:
        peaks[row["dtype"]] = max(peaks.get(row["dtype"], 0.0), row["flops"] / row["t_s"])
    big = max((r for r in raw["bandwidth"] if r["op"] == "copy"), key=lambda r: r["elems"])
    net = raw.get("network") or {}
    source = {
        "kind": "measured", "date": _dt.date.today().isoformat(), "device": raw.get("device_name", ""),
        "torch": raw.get("torch", ""), "host": raw.get("host", ""), "quick": bool(raw.get("quick")),
        "wall_s": raw.get("wall_s"),
        "note": (
            "Measured by `hetsim profile --device cuda:N`: the GEMM grid, bandwidth, dispatch and "
            "single-layer benchmarks in every math mode the GPU has (raw.gpu.modes; the others "
            "fall back to fp32), a layout pair, host-device copies. hetsim calibrate fits the "
            "published fit's fields to them (calibration.gpu_fit; source.peak_flops and "
            "source.mem_bw_Bps say whether those are datasheet or measured figures). No "
            "per-layer tables: they would price every math mode alike. nic_bw_Bps: the measured "
            "loopback point-to-point bandwidth when measured (a single-host figure, not a NIC's). "
            "price_per_hour and power_w: not measured (0) unless the GPU is one of "
            "calibration.gpu_fit.KNOWN_GPUS (its shipped profile's)."),
    }
    data: dict[str, Any] = {
        "schema": 2, "name": name, "kind": "gpu",
        "peak_flops": {m: _r(peaks[m]) for m in modes},
        **({"math_fallback": fallbacks(modes)} if fallbacks(modes) else {}),
        "mem_bw_Bps": _r(big["bytes"] / big["t_s"]),
        "memory_bytes": float(g["total_memory"]),
        "launch_overhead_s": _r(raw["dispatch_s"]),
        "nic_bw_Bps": _r(net.get("p2p_bw_Bps") or 1.25e9),
        "price_per_hour": 0.0, "power_w": {"idle": 0.0, "active": 0.0},
        "source": source,
        "corrections": {"wave_quantization": {"sms": int(g["sms"])}},
        "measurement": {"spread": calibrate.spread_of(raw), "raw": raw},
    }
    if net:
        data["network"] = dict(net)
    if quant_costs(raw):
        data["quant"] = quant_costs(raw)
    profile = DeviceProfile.model_validate(data)
    return calibrate.calibrate(profile).profile if fit else profile


def write_profile(profile: DeviceProfile, out: str | os.PathLike[str]) -> Path:
    """Write ``profile`` as compact JSON (one key per line at the top level)."""
    p = Path(out)
    data = profile.model_dump(by_alias=True, exclude_none=True, mode="json")
    lines = [f"  {json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in data.items()]
    return atomic_write(p, "{\n" + ",\n".join(lines) + "\n}\n")


def _gpu_lines(profile: DeviceProfile) -> list[str]:
    """The first lines of a GPU profile's summary: device, peaks and what they are, the
    fitted efficiencies per math mode, bandwidth, launch and layout passes."""
    src = profile.source.model_dump()
    g = (profile.measurement.raw or {})["gpu"]
    mem = (profile.mem_efficiency or {}).get("gemm")
    lines = [
        f"{profile.name}: {src.get('device', '')} (gpu, compute capability "
        f"{'.'.join(map(str, g['capability']))}, {g['sms']} SMs), torch {src.get('torch', '')}, "
        f"{src.get('wall_s')} s",
        "peak: " + ", ".join(f"{k} {v / 1e12:.1f} TFLOP/s" for k, v in profile.peak_flops.items())
        + f" ({src.get('peak_flops', 'the best GEMM rate per mode')})"
        + "".join(f"; {k} runs as {v}" for k, v in (profile.math_fallback or {}).items()),
    ]
    for mode in profile.peak_flops:
        table = profile.efficiency if mode == "fp32" else (profile.math_efficiency or {}).get(mode, {})
        lines.append(f"efficiency {mode}: " + ", ".join(
            f"{op} {table[op]}" for op in ("conv", "gemm", "attention") if op in table))
    lines.append(f"bandwidth {profile.mem_bw_Bps / 1e9:.0f} GB/s x mem_efficiency {mem}; launch "
                 f"{profile.launch_overhead_s * 1e6:.2f} us"
                 + (f"; layout transposes {profile.corrections.layout_transpose.passes} passes"
                    if profile.corrections.layout_transpose is not None else ""))
    spread = profile.measurement.spread or {}
    if spread.get("gemm_median") is not None:
        lines.append(f"spread (relative IQR of repeats): GEMM grid median {spread['gemm_median']}")
    return lines


def summary(profile: DeviceProfile) -> str:
    """A few lines describing a measured profile."""
    from calibration import calibrate

    src = profile.source.model_dump()
    net = profile.network.model_dump() if profile.network else {}
    spread = profile.measurement.spread or {}
    if "gpu" in (profile.measurement.raw or {}):
        lines = _gpu_lines(profile)
    else:
        lines = [
            f"{profile.name}: {src.get('device', '')} ({profile.kind}), torch {src.get('torch', '')}, "
            f"{src.get('threads')} thread(s), {src.get('wall_s')} s",
            "peak (best GEMM): " + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in profile.peak_flops.items())
            + f"; copy bandwidth {profile.mem_bw_Bps / 1e9:.1f} GB/s; launch {profile.launch_overhead_s * 1e6:.2f} us",
            f"per-layer tables: {len(profile.layers or {})} signatures",
        ]
    if net:
        lines.append(f"network ({net.get('backend')}): p2p {net.get('p2p_latency_s', 0) * 1e6:.0f} us, "
                     f"{(net.get('p2p_bw_Bps') or 0) / 1e9:.2f} GB/s; all-reduce "
                     f"{net.get('allreduce_latency_s', 0) * 1e6:.0f} us, "
                     f"{net.get('allreduce_bw_Bps', 0) / 1e9:.2f} GB/s")
    if spread and "gpu" not in (profile.measurement.raw or {}):
        lines.append(f"spread (relative IQR of repeats): per layer median {spread.get('layer_median')}, "
                     f"p90 {spread.get('layer_p90')}; whole iteration median {spread.get('iteration_median')}")
    drift = calibrate.drift_of(profile.measurement.raw or {})
    if drift is not None:
        lines.append(drift_line(drift))
    cold = profile.corrections.cold_calls
    if cold is not None:
        at = 16 * 2**20
        lines.append(f"cold calls (window {cold.window} passes): after 16 MiB moved, "
                     + ", ".join(f"{op} +{cold.curves[op].at(at) * 1e6:.1f} us"
                                 for op in ("elementwise", "gemm", "embedding") if op in cold.curves))
    return "\n".join(lines)
