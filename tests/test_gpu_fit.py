"""hetsim calibrate of a GPU profile: the per-mode fit (calibration.gpu_fit) recovers the
parameters of synthetic raw measurements made by the cost model from known ones."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from calibration import gpu_fit
from calibration.gpu_fields import fallbacks, with_gpu_fields
from calibration.profiler import build_profile, write_profile
from calibration.profiler.layers import micro_record
from calibration.published import X0, with_parameters
from hardware_profiles import load_profile, load_profile_file
from hardware_profiles.schema import DeviceProfile
from sim.costmodel import layer_time_s
from sim.precision import activation_scales
from sim.workload import model_from_dict

ROOT = Path(__file__).resolve().parents[1]

#: The known parameters the synthetic measurements are made from.
EFF = {"fp32": {"conv": 0.8, "gemm": 0.7, "attention": 0.6},
       "tf32": {"conv": 0.3, "gemm": 0.45, "attention": 0.4},
       "fp16": {"conv": 0.42, "gemm": 0.55, "attention": 0.5},
       "bf16": {"conv": 0.4, "gemm": 0.5, "attention": 0.45}}
MEM_EFF, LAUNCH, PASSES, SMS = 0.8, 6e-6, 2.5, 100
NAMES = ("linear_1024x1024", "linear_4096x1024", "conv_64x64_k3_56", "conv_256x64_k1_56", "mha_512h8_seq128")
BATCHES = {"linear_1024x1024": (512, 8192), "linear_4096x1024": (512, 8192), "conv_64x64_k3_56": (16, 64),
           "conv_256x64_k1_56": (16, 64), "mha_512h8_seq128": (8, 64)}
GRID = ((256, 256, 256), (1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192))


@pytest.fixture(scope="module")
def records() -> dict[str, dict[str, Any]]:
    return {n: micro_record(n) for n in (*NAMES, "conv_64x64_k3_56")}


def truth_profile(peaks: dict[str, float], bw: float, modes: list[str]) -> DeviceProfile:
    """A GPU profile with the known parameters, priced by the cost model as is."""
    base = DeviceProfile.model_validate({
        "schema": 2, "name": "truth", "kind": "gpu", "peak_flops": {m: peaks[m] for m in modes},
        **({"math_fallback": fallbacks(modes)} if fallbacks(modes) else {}),
        "mem_bw_Bps": bw, "memory_bytes": 4e10, "launch_overhead_s": LAUNCH, "nic_bw_Bps": 1e9,
        "price_per_hour": 0.0, "power_w": {"idle": 0, "active": 0}, "source": {"kind": "measured"},
        "corrections": {"wave_quantization": {"sms": SMS}}})
    return with_gpu_fields(base, EFF["fp32"], {m: EFF[m] for m in modes if m != "fp32"}, MEM_EFF, LAUNCH,
                           PASSES)


def micro_entries(truth: DeviceProfile, mode: str, names: tuple[str, ...],
                  records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """raw.micro_by_mode[mode] as the profiler writes it, each layer pass's time the cost
    model's on ``truth`` (half-precision convolutions in channels_last, as measured)."""
    out = []
    for name in names:
        model = model_from_dict(records[name])
        fmt = "channels_last" if mode in ("fp16", "bf16") and name.startswith("conv") else "contiguous"
        ly, scales = model.layers[0], activation_scales(model, mode)[0]
        runs = []
        for b in BATCHES[name]:
            f, w = (layer_time_s(ly, ph, b, truth, mode, model.input_bytes_of(0), scales=scales,
                                 memory_format=fmt)
                    for ph in ("fwd", "bwd"))
            # the time charged to the layer has some glue; its own time is the pass
            runs.append({"batch": b, "iter_s": 1.2 * (f + w), "layers": {ly.name: [1.1 * f, 1.1 * w, 0.01, 0.01]},
                         "own": {ly.name: [f, w]}})
        out.append({"name": name, "model": records[name], "runs": runs, "memory_format": fmt})
    return out


def synthetic_raw(device_name: str, modes: list[str], peaks: dict[str, float], bw: float,
                  records: dict[str, dict[str, Any]], names: dict[str, tuple[str, ...]],
                  grid_peak: dict[str, float]) -> dict[str, Any]:
    """A GPU profile's raw section made by the cost model from the known parameters.

    GEMM grid: the largest shape of each mode at ``grid_peak[mode]``, the others at half of
    it (a mode with no GEMM layer in ``names`` gets its rows from the cost model instead:
    the forward of a Linear of k inputs and n outputs on m rows). Bandwidth: the largest
    copy and add take ``launch + bytes / (bw * MEM_EFF)``. Layout pair: contiguous takes
    two passes' ``PASSES * moved / (bw * MEM_EFF)`` more than channels_last."""
    truth = truth_profile(peaks, bw, modes)
    gemm = []
    for m in modes:
        has_layers = any(n.startswith("linear") for n in names[m])
        for mm, n, k in GRID:
            flops = 2.0 * mm * n * k
            if has_layers:
                t = flops / grid_peak[m] * (1.0 if mm == 8192 else 2.0)
            else:
                from sim.workload import Layer

                half = 0.5 if m in ("fp16", "bf16") else 1.0
                ly = Layer("mm", "gemm", 2.0 * k * n, 4.0 * k * n, 4.0 * k * n, 4.0 * n)
                t = layer_time_s(ly, "fwd", mm, truth, m, 4.0 * k, scales=(half, half))
            gemm.append({"dtype": m, "m": mm, "n": n, "k": k, "flops": flops, "t_s": t, "rel_iqr": 0.01})
    big = 128_000_000
    bandwidth = [{"op": "copy", "elems": 1000, "bytes": 8000.0, "t_s": 8e-6, "rel_iqr": 0.0},
                 {"op": "copy", "elems": big, "bytes": 8.0 * big, "t_s": LAUNCH + 8.0 * big / (bw * MEM_EFF),
                  "rel_iqr": 0.0},
                 {"op": "add", "elems": big, "bytes": 12.0 * big, "t_s": LAUNCH + 12.0 * big / (bw * MEM_EFF),
                  "rel_iqr": 0.0}]
    conv = model_from_dict(records["conv_64x64_k3_56"])
    moved = 64 * 0.5 * (conv.input_bytes_of(0) + conv.layers[0].activation_bytes)
    layout = {"name": "conv_64x64_k3_56", "model": records["conv_64x64_k3_56"], "batch": 64, "mode": "fp16",
              "phases": 2, "channels_last_s": 1e-3, "channels_last_rel_iqr": 0.01,
              "contiguous_s": 1e-3 + 2 * PASSES * moved / (bw * MEM_EFF), "contiguous_rel_iqr": 0.01}
    return {"device": "cuda:0", "device_name": device_name, "threads": 16, "quick": True, "clock": "cuda",
            "statistic": "median of repeats after warm-up", "rounds": 1, "cpus": 16,
            "gpu": {"name": device_name, "capability": [8, 0], "sms": SMS, "total_memory": 4e10,
                    "l2_bytes": 40 << 20, "modes": modes, "fallback": fallbacks(modes)},
            "gemm": gemm, "bandwidth": bandwidth, "dispatch_s": LAUNCH, "dispatch_rel_iqr": 0.01,
            "dispatch_loop": 100, "layout": layout,
            "micro_by_mode": {m: micro_entries(truth, m, names[m], records) for m in modes}}


def test_an_identified_gpu_gets_its_datasheet_and_the_known_parameters_back(records: dict) -> None:
    a100 = load_profile("a100")
    modes = ["fp32", "tf32", "fp16", "bf16"]
    names = {m: NAMES for m in modes}
    names["bf16"] = tuple(n for n in NAMES if not n.startswith("linear"))  # bf16 GEMM: the grid's rows
    raw = synthetic_raw("NVIDIA A100-SXM4-40GB", modes, a100.peak_flops, a100.mem_bw_Bps, records, names,
                        dict.fromkeys(modes, 1e14))
    prof = build_profile(raw, "synthetic")
    assert prof.kind == "gpu" and prof.peak_flops == a100.peak_flops and prof.mem_bw_Bps == a100.mem_bw_Bps
    assert prof.math_fallback is None
    assert prof.efficiency == {"embedding": 0.3, "elementwise": 0.3, **EFF["fp32"]}  # a100's others kept
    assert prof.math_efficiency == {m: EFF[m] for m in ("tf32", "fp16", "bf16")}  # 4 significant digits
    assert prof.mem_efficiency == dict.fromkeys(("gemm", "conv", "embedding", "elementwise", "attention"),
                                                MEM_EFF)
    assert prof.launch_overhead_s == LAUNCH
    assert prof.corrections.wave_quantization is not None and prof.corrections.wave_quantization.sms == SMS
    assert prof.corrections.layout_transpose is not None and prof.corrections.layout_transpose.passes == PASSES
    assert (prof.price_per_hour, prof.power_w) == (a100.price_per_hour, a100.power_w)
    assert prof.layers is None and prof.source.kind == "measured"
    src = prof.source.model_dump()
    assert src["peak_flops"] == src["mem_bw_Bps"] == \
        "datasheet of hardware_profiles/a100.json (device 'NVIDIA A100-SXM4-40GB')"
    assert "hetsim calibrate" in src["fit"]
    # the profile prices its own passes as measured
    assert prof.measurement.spread is not None and prof.measurement.spread["fit_residual_median_abs_rel"] == 0.0
    # the fields are those the published fit writes into the shipped a100 profile
    published = with_parameters(a100, X0).model_dump(exclude_none=True)
    mine = prof.model_dump(exclude_none=True)
    for key in ("efficiency", "math_efficiency", "mem_efficiency", "corrections"):
        assert set(mine[key]) == set(published[key]), key
    assert set(mine["math_efficiency"]["tf32"]) == set(published["math_efficiency"]["tf32"])


def test_an_unknown_gpu_takes_its_best_measured_rates_and_falls_back_where_it_lacks_a_mode(
        records: dict) -> None:
    modes = ["fp32", "fp16"]  # a Volta: no tf32, no bf16
    peaks, bw = {"fp32": 14e12, "fp16": 110e12}, 850e9
    names = {"fp32": NAMES, "fp16": tuple(n for n in NAMES if not n.startswith("mha"))}  # no fp16 attention
    # the largest GEMM at the peak itself: the best rate is the peak the truth was made with
    raw = synthetic_raw("Fancy GPU 9000", modes, peaks, bw, records, names, peaks)
    prof = build_profile(raw, "fancy")
    assert prof.peak_flops == peaks
    # the largest bandwidth rows' best rate (the add's: more bytes for one launch), kept to
    # 4 significant digits; the memory efficiency is what they reach of it less launches
    best = 12.0 * 128e6 / (LAUNCH + 12.0 * 128e6 / (bw * MEM_EFF))
    assert prof.mem_bw_Bps == float(f"{best:.4g}")
    assert prof.mem_efficiency is not None
    assert prof.mem_efficiency["gemm"] == float(f"{bw * MEM_EFF / prof.mem_bw_Bps:.4g}")
    assert prof.math_fallback == {"tf32": "fp32", "bf16": "fp32"}
    assert prof.efficiency == EFF["fp32"]
    # fp16 has no attention pass: the mode's GEMM value
    assert prof.math_efficiency == {"fp16": {"conv": 0.42, "gemm": 0.55, "attention": 0.55}}
    assert prof.price_per_hour == 0.0
    src = prof.source.model_dump()
    assert src["peak_flops"].startswith("measured: the best rate of the GEMM grid")
    assert src["mem_bw_Bps"].startswith("measured: the best rate of the largest bandwidth")


def test_fit_efficiency_weights_passes_by_time_and_leaves_launch_bound_ones_out() -> None:
    # (to 1e-6: the minimiser's tolerance, far below the 4 digits a profile keeps)
    # two compute-bound passes at efficiency 0.5 (compute at 1: 1 ms and 3 ms) and one
    # launch-bound pass 10x slower than any efficiency explains: it is left out
    t = [2e-3, 6e-3, 1e-4]
    fixed, compute, memory = [0.0, 0.0, 1e-5], [1e-3, 3e-3, 1e-7], [1e-4, 1e-4, 0.0]
    assert gpu_fit.fit_efficiency(t, fixed, compute, memory) == pytest.approx(0.5, rel=1e-6)
    # with no compute-bound pass at all (compute below the fixed seconds), every pass counts
    assert gpu_fit.fit_efficiency([5e-3], [3e-3], [1e-3], [0.0]) == pytest.approx(0.5, rel=1e-6)
    with pytest.raises(ValueError):
        gpu_fit.fit_efficiency([], [], [], [])


@pytest.mark.parametrize(("name", "want"), [
    ("NVIDIA A100-SXM4-40GB", "a100"), ("NVIDIA A100-PCIE-40GB", "a100"), ("NVIDIA A100-SXM4-80GB", None),
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 PCIe", None), ("NVIDIA H200", "h200"),
    ("NVIDIA H200 NVL", None), ("Tesla V100-SXM2-16GB", "v100"), ("Tesla V100-PCIE-16GB", None),
    ("Tesla T4", "t4"), ("NVIDIA L4", "l4"), ("NVIDIA L40S", None), ("NVIDIA A10G", "a10g"),
    ("NVIDIA GeForce RTX 4090", None),
])
def test_known_gpus_are_the_variants_of_the_shipped_profiles(name: str, want: str | None) -> None:
    assert gpu_fit.identify(name) == want


def test_every_known_gpu_names_a_shipped_gpu_profile() -> None:
    for _, profile in gpu_fit.KNOWN_GPUS:
        assert load_profile(profile).kind == "gpu"


def test_hetsim_calibrate_refits_a_gpu_profile_and_names_a_missing_entry(tmp_path: Path,
                                                                          records: dict) -> None:
    a100 = load_profile("a100")
    modes = ["fp32", "fp16"]
    raw = synthetic_raw("NVIDIA A100-SXM4-40GB", modes, a100.peak_flops, a100.mem_bw_Bps, records,
                        {m: NAMES for m in modes}, dict.fromkeys(modes, 1e14))
    path = tmp_path / "gpu.json"
    write_profile(build_profile(raw, "gpu", fit=False), path)
    cmd = [sys.executable, "-m", "experiments.cli", "calibrate", str(path), "--out", str(tmp_path / "fit.json")]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].split() == ["op", "phase", "mode", "points", "median", "|err|", "p90",
                                                   "|err|"]
    fitted = load_profile_file(tmp_path / "fit.json")
    assert fitted.name == "fit" and fitted.math_efficiency == {"fp16": EFF["fp16"]}
    data = json.loads(path.read_text())
    del data["measurement"]["raw"]["micro_by_mode"]
    path.write_text(json.dumps(data))
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"hetsim: error: {path}: measurement.raw.micro_by_mode: missing (measure the profile with hetsim "
        "profile --device cuda:N)"]
