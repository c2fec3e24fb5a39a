"""hetsim profile --device cuda:N: math modes, the GPU's benchmarks and what a GPU run skips
(calibration.profiler.modes and .gpu). The tests marked gpu need a CUDA device."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from calibration import profiler as P
from calibration.gpu_fields import GPU_MODES
from calibration.profiler import gpu as G
from calibration.profiler.layers import _micro_layers
from calibration.profiler.modes import HALF_MODES, device_modes, fallbacks, math_mode, modes_for
from calibration.profiler.registry import Run, registered
from calibration.profiler.timing import _OpTimer
from experiments.cli import main
from sim import zoo

HAS_GPU = torch.cuda.is_available()


@pytest.mark.parametrize(("capability", "bf16", "want"), [
    ((6, 1), True, ("fp32",)),  # Pascal: no tensor cores
    ((7, 0), True, ("fp32", "fp16")),  # V100
    ((7, 5), True, ("fp32", "fp16")),  # T4
    ((8, 0), True, ("fp32", "tf32", "fp16", "bf16")),  # A100
    ((8, 0), False, ("fp32", "tf32", "fp16")),  # a torch without native bf16
    ((9, 0), True, ("fp32", "tf32", "fp16", "bf16")),  # H100
])
def test_math_modes_follow_the_compute_capability(capability: tuple[int, int], bf16: bool,
                                                   want: tuple[str, ...]) -> None:
    assert modes_for(capability, bf16) == want


def test_the_modes_a_gpu_lacks_fall_back_to_fp32() -> None:
    assert fallbacks(("fp32", "fp16")) == {"tf32": "fp32", "bf16": "fp32"}
    assert fallbacks(GPU_MODES) == {}


def _settings() -> tuple[str, str, bool]:
    return (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision,
            torch.backends.cudnn.benchmark)


def test_a_math_mode_sets_tf32_and_cudnn_benchmark_and_restores_them() -> None:
    before = _settings()
    with math_mode("fp32"):
        assert _settings() == ("ieee", "ieee", True)
    assert _settings() == before
    with math_mode("tf32"):
        assert _settings() == ("tf32", "tf32", True)
    assert _settings() == before
    with pytest.raises(RuntimeError, match="inside"), math_mode("tf32"):
        raise RuntimeError("inside")
    assert _settings() == before
    with pytest.raises(ValueError, match="unknown math mode 'fp64'"), math_mode("fp64"):
        pass


def test_a_half_mode_runs_its_matmuls_under_autocast() -> None:
    a = torch.randn(8, 8)
    for mode, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        with math_mode(mode, device_type="cpu"):
            assert torch.is_autocast_enabled("cpu") and torch.mm(a, a).dtype == dtype
            assert _settings()[:2] == ("ieee", "ieee")
        assert not torch.is_autocast_enabled("cpu")


def test_the_gpu_spec_sizes_its_benchmarks_for_a_gpu() -> None:
    quick, full = G.gpu_spec(True), G.gpu_spec(False)
    assert quick.micro == G.GPU_MICRO_QUICK and full.micro == G.GPU_MICRO
    assert set(G.GPU_MICRO_QUICK) < set(G.GPU_MICRO) and set(G.GPU_BATCHES) == set(G.GPU_MICRO)
    for name in G.GPU_MICRO:  # every one a single-layer benchmark of the grid
        assert _micro_layers(name, torch.device("cpu"))[0] is not None
    assert set(quick.models) == set(zoo.names()) and quick.gemm == full.gemm == G.GPU_GEMM
    # the largest copy's buffers (fp32) at least twice the largest GPU L2 of today (128 MiB)
    assert 4 * max(quick.copy_elems) >= 2 * 128 * 2**20
    assert (quick.rounds, full.rounds) == (1, 8)


def _run(models: dict, network: bool, dev: str = "cpu", dtypes: tuple[str, ...] = ("fp32",)) -> Run:
    spec = G.gpu_spec(True)
    return Run(dev, torch.device(dev), spec, _OpTimer(torch.device("cpu"), spec), dtypes, models, True, network)


def test_a_gpu_run_records_what_it_skips_and_why() -> None:
    assert list(G.skipped(_run({}, True))) == ["cold", "micro", "models", "network.wake", "network.wire",
                                               "threads"]
    assert list(G.skipped(_run({"mlp": (256,)}, False))) == ["cold", "micro", "threads"]
    assert all(G.skipped(_run({}, True)).values())


def test_the_gpu_benchmarks_do_not_run_on_a_cpu() -> None:
    run = _run({"mlp": (4,)}, True)
    applies = {b.name for b in registered() if b.applies(run)}
    assert {"gpu", "micro_by_mode", "layout", "host_device"}.isdisjoint(applies)
    assert {"gemm", "bandwidth", "dispatch", "micro", "models", "quant", "cold", "network"} <= applies


def test_a_cpu_profile_writes_none_of_the_gpu_entries() -> None:
    spec = replace(P.spec_for(True), gemm=((32, 32, 32),), copy_elems=(1000,), micro=(),
                   models={}, min_reps=2, max_reps=2)
    raw = P.measure("cpu", threads=1, network=False, spec=spec, drift=False)
    assert {"gpu", "micro_by_mode", "layout", "dispatch_loop"}.isdisjoint(raw)
    assert [r["dtype"] for r in raw["gemm"]] == ["fp32"]


def test_profiling_a_missing_gpu_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    if HAS_GPU:
        pytest.skip("a CUDA GPU is visible: cuda:0 is available here")
    assert main(["profile", "--device", "cuda:0", "--quick", "--out", str(tmp_path / "g.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hetsim: error: <command line>: --device: cuda:0 is not available")
    assert not (tmp_path / "g.json").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU visible to torch")
def test_each_math_mode_runs_as_training_does_on_the_gpu() -> None:
    dev = torch.device("cuda", 0)
    a, b = torch.randn(1024, 1024, device=dev), torch.randn(1024, 1024, device=dev)
    exact = a.double() @ b.double()
    err = {}
    for mode in device_modes(dev):
        with math_mode(mode):
            out = torch.mm(a, b)
            assert out.dtype == {"fp16": torch.float16, "bf16": torch.bfloat16}.get(mode, torch.float32)
            assert torch.backends.cudnn.benchmark
        err[mode] = float(((out.double() - exact).abs().max() / exact.abs().max()).item())
    # fp32 on the CUDA cores is exact to fp32's 24 bits, TF32's 11 bits are not
    assert err["fp32"] < 1e-5
    if "tf32" in err:
        assert err["tf32"] > 10 * err["fp32"]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU visible to torch")
def test_a_gpu_profile_has_the_published_fits_fields_measured(tmp_path: Path) -> None:
    dev = torch.device("cuda", 0)
    modes = device_modes(dev)
    before = _settings()
    spec = replace(G.gpu_spec(True), gemm=((1024, 1024, 1024), (4096, 4096, 4096)),
                   copy_elems=(1_000_000, 64_000_000),
                   micro=("linear_1024x1024", "conv_64x64_k3_56", "mha_512h8_seq128"), max_reps=5)
    prof, _ = P.run_profile("cuda:0", tmp_path / "gpu.json", network=False, progress=False, spec=spec)
    assert _settings() == before  # every mode's settings restored
    raw = prof.measurement.raw
    assert raw["clock"] == "cuda" and raw["dispatch_loop"] == 100
    assert raw["gpu"]["sms"] == torch.cuda.get_device_properties(dev).multi_processor_count
    assert {"cold", "micro", "models", "threads"} <= set(raw["gpu"]["skipped"])
    assert set(raw["micro_by_mode"]) == set(modes) and "models" not in raw and "micro" not in raw
    for mode, entries in raw["micro_by_mode"].items():
        conv = next(e for e in entries if e["name"] == "conv_64x64_k3_56")
        assert conv["memory_format"] == ("channels_last" if mode in HALF_MODES else "contiguous")
    assert list(prof.peak_flops) == list(modes) and prof.math_fallback == (fallbacks(modes) or None)
    for mode in modes:
        table = prof.efficiency if mode == "fp32" else (prof.math_efficiency or {})[mode]
        assert all(0 < table[op] <= 1.5 for op in ("conv", "gemm", "attention")), (mode, table)
    assert prof.mem_efficiency is not None and 0 < prof.mem_efficiency["gemm"] <= 1.5
    assert 0 < prof.launch_overhead_s < 1e-3
    assert prof.corrections.wave_quantization is not None
    assert prof.corrections.wave_quantization.sms == raw["gpu"]["sms"]
    if any(m in HALF_MODES for m in modes):
        assert prof.corrections.layout_transpose is not None and prof.corrections.layout_transpose.passes >= 0
    assert prof.source.model_dump()["peak_flops"].split(" ")[0].rstrip(":") in ("datasheet", "measured")


def test_the_gpu_benchmarks_write_what_the_fit_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    # the GPU's benchmarks, run on the CPU at tiny sizes (autocast on the CPU for bf16), and
    # the device record a GPU would give: the fit makes a GPU profile of every mode from them
    from calibration.profiler import ops
    from calibration.profiler.timing import _run_rounds

    monkeypatch.setattr(G, "LAYOUT_BATCH", 1)
    cpu = torch.device("cpu")
    names = ("linear_1024x1024", "conv_64x64_k3_56", "mha_512h8_seq128")
    spec = replace(G.gpu_spec(True), gemm=((64, 64, 64),), copy_elems=(1000, 100_000), micro=names,
                   batches={"linear_1024x1024": (8, 16), "conv_64x64_k3_56": (1,), "mha_512h8_seq128": (1,)},
                   min_reps=1, max_reps=1)
    run = Run("cpu", cpu, spec, _OpTimer(cpu, spec), ("fp32", "bf16"), {}, True, False)
    raw: dict = {"device": "cuda:0", "device_name": "Fancy GPU 9000", "threads": 1,
                 "gpu": {"name": "Fancy GPU 9000", "capability": [8, 0], "sms": 4, "total_memory": 1e9,
                         "modes": ["fp32", "bf16"]}}
    for bench in (ops._gemm, ops._bandwidth, ops._dispatch, G._micro_by_mode, G._layout):
        sampled = bench(run)
        _run_rounds(sampled.groups, 1, None)
        raw.update(sampled.finish(50.0))
    by_mode = raw["micro_by_mode"]
    assert [e["name"] for e in by_mode["bf16"]] == list(names)
    assert [e["memory_format"] for e in by_mode["bf16"]] == ["contiguous", "channels_last", "contiguous"]
    assert [r["batch"] for r in by_mode["fp32"][0]["runs"]] == [8, 16]
    assert raw["layout"]["mode"] == "bf16" and raw["layout"]["contiguous_s"] > 0
    prof = P.build_profile(raw, "cpu_as_gpu")
    assert prof.kind == "gpu" and list(prof.peak_flops) == ["fp32", "bf16"]
    assert prof.math_fallback == {"tf32": "fp32", "fp16": "fp32"}
    assert prof.math_efficiency is not None and set(prof.math_efficiency) == {"bf16"}
    assert prof.corrections.wave_quantization is not None and prof.corrections.wave_quantization.sms == 4
    assert prof.corrections.layout_transpose is not None
