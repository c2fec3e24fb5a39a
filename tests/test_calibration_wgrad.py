"""A backward that computes only the weight gradient (the layer's input needs none: a
model's first GEMM or convolution) and the profile's correction ``weight_grad_only_bwd``
that prices its bytes as such. Every expected figure is worked by hand."""

from __future__ import annotations

import pytest

from calibration.calibrate import points_from_raw
from hardware_profiles.schema import DeviceProfile
from sim import zoo
from sim.corrections.weight_grad_only_bwd import computes_input_grad
from sim.costmodel import layer_time_s, layer_work
from sim.workload import Layer
from tests.helpers_profiles import bare_profile

# a first layer: backward FLOPs = forward FLOPs (weight gradient only)
FIRST = Layer("first", "gemm", fwd_flops=2e3, bwd_flops=2e3, param_bytes=4e3, activation_bytes=40.0)
# the same layer inside a network: both gradients, twice the forward FLOPs
INNER = Layer("inner", "gemm", fwd_flops=2e3, bwd_flops=4e3, param_bytes=4e3, activation_bytes=40.0)


def test_which_layers_compute_an_input_gradient() -> None:
    assert not computes_input_grad(FIRST)
    assert computes_input_grad(INNER)
    assert not computes_input_grad(Layer("c", "conv", 10.0, 10.0, 4.0, 4.0))
    # no parameters, no FLOPs or another op class: always both
    assert computes_input_grad(Layer("r", "elementwise", 0.0, 0.0, 0.0, 4.0))
    assert computes_input_grad(Layer("a", "attention", 10.0, 10.0, 4.0, 4.0))
    assert computes_input_grad(Layer("g", "gemm", 10.0, 10.0, 0.0, 4.0))
    # in the zoo: exactly the first GEMM or convolution of the models fed by data
    first = {(name, ly.name) for name in zoo.names() for ly in zoo.get(name).layers
             if not computes_input_grad(ly)}
    assert first == {("mlp", "0"), ("resnet18", "conv1"), ("resnet50", "conv1"),
                     ("vgg16", "features.0")}


def test_weight_grad_only_bytes() -> None:
    # b = 2, input 100 B/sample: weight gradient written (4e3) + input and output
    # gradient read, 2 * (100 + 40) = 280 -> 4280 B; FLOPs 2 * 2e3, 2 kernels
    assert layer_work(FIRST, "bwd", 2, "fp32", 100.0, weight_grad_only=True) == (4e3, 2, 4280.0)
    # without the flag: weights read and gradient written (8e3) + 2 * (100 + 2 * 40) = 8360
    assert layer_work(FIRST, "bwd", 2, "fp32", 100.0) == (4e3, 2, 8360.0)
    # a layer computing both gradients and every forward: the flag changes nothing
    assert layer_work(INNER, "bwd", 2, "fp32", 100.0, weight_grad_only=True) == (8e3, 2, 8360.0)
    assert layer_work(FIRST, "fwd", 2, "fp32", 100.0, weight_grad_only=True) == (4e3, 1, 4e3 + 280.0)
    # mixed precision halves the activations and the weights (the GEMM reads and writes
    # half copies): 0.5 * 4e3 + 2 * 0.5 * 140
    assert layer_work(FIRST, "bwd", 2, "bf16", 100.0, weight_grad_only=True)[2] == 2140.0


def test_profile_flag_prices_it_and_old_profiles_price_as_before() -> None:
    # peak 1e9 FLOP/s, 1e9 B/s, no curves: 2 launches of 1e-6 + max(4e3 / 1e9, bytes / 1e9)
    new = bare_profile(corrections={"weight_grad_only_bwd": {}})
    old = bare_profile()
    assert layer_time_s(FIRST, "bwd", 2, new, "fp32", 100.0) == pytest.approx(2e-6 + 4.28e-6)
    assert layer_time_s(FIRST, "bwd", 2, old, "fp32", 100.0) == 2e-6 + max(4e3 / 1e9, 8360.0 / 1e9)
    assert layer_time_s(INNER, "bwd", 2, new, "fp32", 100.0) == layer_time_s(INNER, "bwd", 2, old,
                                                                               "fp32", 100.0)
    # the flag round-trips and is off by default
    assert old.corrections.weight_grad_only_bwd is None
    assert DeviceProfile.model_validate(new.model_dump(by_alias=True)).corrections.weight_grad_only_bwd is not None


def test_calibration_points_use_the_flag() -> None:
    # mlp layer 0 (784 -> 1024, 3215360 B of parameters, input 3136 B and output 4096 B
    # per sample) at batch 16: 3215360 + 16 * (3136 + 4096) = 3331072 B with the flag,
    # 2 * 3215360 + 16 * (3136 + 2 * 4096) = 6611968 B without
    run = {"batch": 16, "layers": {"0": [1e-3, 2e-3, 0.0, 0.0], "2": [1e-3, 2e-3, 0.0, 0.0]}}
    raw = {"models": {"mlp": [run]}}

    def bwd_bytes(flag: bool) -> dict[str, float]:
        return {p.layer: p.nbytes for p in points_from_raw(raw, micro=False, weight_grad_only=flag)
                if p.phase == "bwd"}

    assert bwd_bytes(True)["0"] == 3331072.0
    assert bwd_bytes(False)["0"] == 6611968.0
    # layer 2 (1024 -> 1024) computes both either way: 2 * 4198400 + 16 * (4096 + 2 * 4096)
    assert bwd_bytes(True)["2"] == bwd_bytes(False)["2"] == 2 * 4198400 + 16 * 3 * 4096
