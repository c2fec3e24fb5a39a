"""Training precisions (sim/precision.py) and the GPU terms of the cost model: math modes,
activation sizes under mixed precision, the optimizer step; hand-worked cases.

Profiles are ``bare_profile``'s (1 GFLOP/s fp32, 1 GB/s, 1 us per launch) with the peaks
a case needs; every float is written as the cost model computes it, so equality is exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hardware_profiles.errors import ConfigError
from sim.config import Config
from sim.costmodel import layer_time_s, optimizer_step_s, training_step_s
from sim.precision import (
    MathMode,
    PrecisionError,
    activation_scales,
    math_mode,
    pass_mode,
    precision_notes,
)
from sim.problem import build_problem
from sim.workload import Layer, Model
from tests.helpers_profiles import bare_profile

EMB = Layer("emb", "embedding", 0.0, 0.0, 4e4, 400.0)
NORM = Layer("norm", "elementwise", 0.0, 0.0, 8.0, 400.0, autocast_fp32=True)
FC = Layer("fc", "gemm", 2e4, 4e4, 4e4, 400.0)  # 100 -> 100 features
RELU = Layer("relu", "elementwise", 0.0, 0.0, 0.0, 400.0)
SOFTMAX = Layer("softmax", "elementwise", 0.0, 0.0, 0.0, 400.0, autocast_fp32=True)
HEAD = Layer("head", "gemm", 2e3, 4e3, 4e3, 40.0)
MODEL = Model("m", (EMB, NORM, FC, RELU, SOFTMAX, HEAD), input_bytes=8.0)


def test_activation_sizes_follow_autocast() -> None:
    # fp32 and tf32 keep fp32 storage everywhere
    assert activation_scales(MODEL, "fp32") == activation_scales(MODEL, "tf32") == [(1.0, 1.0)] * 6
    # mixed precision: the embedding writes fp32 (its table is fp32), the norm stays fp32,
    # the GEMM writes half, the ReLU keeps half, the softmax goes back to fp32, the head
    # reads that fp32 and writes half
    assert activation_scales(MODEL, "fp16") == activation_scales(MODEL, "bf16") == [
        (1.0, 1.0), (1.0, 1.0), (1.0, 0.5), (0.5, 0.5), (0.5, 1.0), (1.0, 0.5)]


def test_math_modes_and_their_fallbacks() -> None:
    gpu = bare_profile(kind="gpu", peak_flops={"fp32": 1e9, "tf32": 8e9, "fp16": 16e9},
                       math_fallback={"bf16": "fp16"})
    assert math_mode(gpu, "tf32") == MathMode("tf32", "tf32")
    assert math_mode(gpu, "bf16") == MathMode("bf16", "fp16", "m has no bf16 math: bf16 matmuls run as fp16")
    # a matmul-class pass with FLOPs runs in the mode; anything else on the vector units
    assert [pass_mode(gpu, "tf32", op, 1.0) for op in ("gemm", "conv", "attention", "elementwise")] == [
        "tf32", "tf32", "tf32", "fp32"]
    assert pass_mode(gpu, "fp16", "gemm", 0.0) == "fp32"
    assert precision_notes([gpu, gpu], "bf16") == ["m has no bf16 math: bf16 matmuls run as fp16"]
    assert precision_notes([gpu], "fp16") == []
    with pytest.raises(PrecisionError, match="no peak_flops.int8 and no math_fallback.int8"):
        math_mode(gpu, "int8")


def test_a_linear_under_mixed_precision_by_hand() -> None:
    dev = bare_profile(kind="gpu", peak_flops={"fp32": 1e9, "fp16": 4e9},
                       math_efficiency={"fp16": {"gemm": 0.5}}, efficiency={"gemm": 0.25})
    # forward on 10 samples, input fp32 (1.0), output half: FLOPs 2e5 at 4e9 x 0.5 =
    # 1e-4 s; bytes: weights read as half copies 0.5 x 4e4 + 10 x (1.0 x 400 + 0.5 x 400) =
    # 26000 B at 1 GB/s = 2.6e-5 s: compute-bound
    assert layer_time_s(FC, "fwd", 10, dev, "fp16", 400.0, scales=(1.0, 0.5)) == 1e-6 * 1 + 2e5 / (4e9 * 0.5)
    # the same pass in fp32: the fp32 peak at efficiency 0.25
    assert layer_time_s(FC, "fwd", 10, dev, "fp32", 400.0) == 1e-6 * 1 + 2e5 / (1e9 * 0.25)
    # backward of the ReLU in half: 10 x (0.5 x 400 + 2 x 0.5 x 400) = 6000 B, 2 launches
    assert layer_time_s(RELU, "bwd", 10, dev, "fp16", 400.0, scales=(0.5, 0.5)) == 1e-6 * 2 + 6000 / 1e9


def test_the_optimizer_step_by_hand() -> None:
    dev = bare_profile(mem_efficiency={"elementwise": 0.5})
    # MODEL holds 4e4 + 8 + 4e4 + 4e3 = 84008 B of fp32 parameters; 0.5 GB/s for them
    assert optimizer_step_s(MODEL, dev, "fp32", "momentum") == 5.0 * 84008 / (1e9 * 0.5)
    assert optimizer_step_s(MODEL, dev, "fp32", "adam") == 7.0 * 84008 / (1e9 * 0.5)
    # mixed precision: the half copies and the gradient scaler's pass, 3.5 more
    assert optimizer_step_s(MODEL, dev, "bf16", "sgd") == (3.0 + 3.5) * 84008 / (1e9 * 0.5)
    with pytest.raises(ValueError, match="unknown optimizer 'lamb'"):
        optimizer_step_s(MODEL, dev, "fp32", "lamb")
    assert training_step_s(MODEL, dev, "fp32", 4) > optimizer_step_s(MODEL, dev, "fp32")


def _config(tmp_path: Path, dtype: str, peaks: dict, fallback: dict | None) -> tuple[Config, Path]:
    prof = {"schema": 2, "name": "gpu-x", "kind": "gpu", "peak_flops": peaks, "mem_bw_Bps": 1e12,
            "memory_bytes": 1e10, "launch_overhead_s": 5e-6, "nic_bw_Bps": 1e9, "price_per_hour": 1.0,
            "power_w": {"idle": 1, "active": 2}, "source": {"kind": "datasheet"}}
    if fallback:
        prof["math_fallback"] = fallback
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "gpu-x.json").write_text(json.dumps(prof))
    cfg = {"name": "p", "profiles": ["profiles"],
           "cluster": {"devices": [{"type": "gpu-x", "count": 2}], "ps": {"shards": 1, "type": "cpu-8c"}},
           "job": {"model": "mlp", "global_batch": 64, "dtype": dtype, "iterations": 3}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    return Config.model_validate(cfg), tmp_path / "c.yaml"


def test_a_config_says_what_a_device_does_instead(tmp_path: Path) -> None:
    cfg, path = _config(tmp_path, "tf32", {"fp32": 1e13}, {"tf32": "fp32"})
    problem = build_problem(cfg, tmp_path, str(path))
    assert problem.notes == ("gpu-x has no tf32 math: tf32 matmuls run as fp32",)


def test_a_precision_a_device_cannot_run_is_one_line_naming_job_dtype(tmp_path: Path) -> None:
    cfg, path = _config(tmp_path, "tf32", {"fp32": 1e13}, None)
    with pytest.raises(ConfigError) as info:
        build_problem(cfg, tmp_path, str(path))
    assert info.value.field == "job.dtype" and "\n" not in str(info.value)
    assert "'gpu-x' has no peak_flops.tf32 and no math_fallback.tf32" in str(info.value)


def test_job_fields_are_validated() -> None:
    base = {"name": "p", "cluster": {"devices": [{"type": "t4", "count": 1}]},
            "job": {"model": "mlp", "global_batch": 8}}
    for field, value in (("dtype", "fp8"), ("memory_format", "nhwc")):
        bad = {**base, "job": {**base["job"], field: value}}
        with pytest.raises(ValueError, match=field):
            Config.model_validate(bad)
    ok = Config.model_validate({**base, "job": {**base["job"], "dtype": "tf32", "memory_format": "channels_last"}})
    assert (ok.job.dtype, ok.job.memory_format) == ("tf32", "channels_last")


def test_job_memory_format_reaches_every_pricing(tmp_path: Path) -> None:
    """``job.memory_format`` prices a data-parallel plan: under fp16 the fitted A100's
    convolutions in contiguous layout pay the layout transposes, in channels_last they do
    not, and the plan's per-worker forward is exactly the layer tables' sum in that layout."""
    import dataclasses

    import schedulers
    from sim.costmodel import layer_times, plan_costs

    cfg = Config.model_validate({"name": "m", "cluster": {"devices": [{"type": "a100", "count": 2}],
                                                          "ps": {"shards": 1, "type": "cpu-8c"}},
                                 "job": {"model": "resnet50", "global_batch": 128, "dtype": "fp16",
                                         "memory_format": "channels_last"}})
    last = build_problem(cfg, tmp_path, "m.yaml")
    first = dataclasses.replace(last, job=dataclasses.replace(last.job, memory_format="contiguous"))
    fwd = {}
    for p in (first, last):
        plan = schedulers.make("equal").plan(p)
        dev = p.cluster.device(plan.stages[0].replicas[0].device).type
        fwd[p.job.memory_format] = float(plan_costs(p, plan).fwd_s[0].sum())
        assert fwd[p.job.memory_format] == float(layer_times(p.job.model, dev, "fp16", 64,
                                                             p.job.memory_format)[0].sum())
    assert fwd["channels_last"] < fwd["contiguous"]
