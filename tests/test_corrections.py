"""The cost model's corrections (sim/corrections/): each one on a tiny profile and layer,
its seconds worked by hand in the comments, asserted exactly; their order and their
registry; and a datasheet profile, which lists none, priced by the roofline alone.

Every profile here is ``bare_profile``'s: 1 GFLOP/s fp32, 1 GB/s of memory, 1 us per
kernel launch, efficiency 1 unless given. A float is written as the cost model computes
it (launches + max(compute, memory), then the corrections' seconds in registry order),
so that equality is exact.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from pydantic import ValidationError

from hardware_profiles import BUILTIN_DIR, load_profile_file
from sim import zoo
from sim.corrections import (
    REGISTRY,
    CallOverhead,
    ColdCalls,
    DenseSparseGrad,
    Glue,
    LayoutTranspose,
    PassContext,
    RowCost,
    SkinnyGemm,
    WaveQuantization,
    WeightGradOnlyBwd,
    corrections_of,
)
from sim.corrections.wave_quantization import utilization
from sim.costmodel import compute_kind, layer_time_s, layer_times, layer_work, plain_work
from sim.workload import Layer, Model, Sparse
from tests.helpers_profiles import bare_profile

ROOT = Path(__file__).resolve().parents[1]

#: a ReLU: no FLOPs, no parameters, 1 kernel, 1e3 output bytes a sample (on 1e3 input bytes)
RELU = Layer("relu", "elementwise", 0.0, 0.0, 0.0, 1e3)
#: an embedding: a 1e4 B table, 2 rows of 64 B looked up a sample, 64 B out
EMB = Layer("emb", "embedding", 0.0, 0.0, 1e4, 64.0, Sparse(2.0, 64.0))
#: a Linear 1000 -> 1000 (1e6 weights, 4e6 B) that computes both gradients
FC = Layer("fc", "gemm", 2e6, 4e6, 4e6, 4e3)
#: a model's first GEMM: its backward computes the weight gradient only (FLOPs = forward's)
FIRST = Layer("first", "gemm", 2e3, 2e3, 4e3, 40.0)


def test_call_overhead_by_hand() -> None:
    dev = bare_profile(corrections={"call_overhead": {"fwd": {"elementwise/k1": 3e-5, "gemm": 2e-5,
                                                             "gemm/k1p": 9.0e-1}}})
    assert [type(c) for c in corrections_of(dev)] == [CallOverhead]
    # ReLU forward on 2 samples: 1 launch (1e-6) + (2e3 in + 2e3 out) B / 1e9 B/s = 4e-6;
    # its layer kind's entry, elementwise/k1: + 3e-5
    assert layer_time_s(RELU, "fwd", 2, dev, "fp32", 1e3) == (1e-6 * 1 + 4e3 / 1e9) + 3e-5
    # the backward has no table: 2 launches + (2e3 + 2 * 2e3) B / 1e9, nothing added
    assert layer_time_s(RELU, "bwd", 2, dev, "fp32", 1e3) == 1e-6 * 2 + 6e3 / 1e9 + 0.0
    # a layer with FLOPs pays its op class's entry, never its kind's (gemm/k1p): Linear on 1
    # sample, 1 launch + max(2e6 / 1e9, (4e6 + 4e3 + 4e3) / 1e9) + 2e-5
    assert layer_time_s(FC, "fwd", 1, dev, "fp32", 4e3) == (1e-6 * 1 + 4.008e6 / 1e9) + 2e-5
    # a bare kernel (a measured torch.mm, call=False) pays none
    (co,) = corrections_of(dev)
    assert co.extra_s(PassContext("gemm", "fwd", 2e6, 1, 4e6, call=False)) == 0.0


def test_row_cost_by_hand() -> None:
    dev = bare_profile(corrections={"row_cost": {"fwd": {"embedding": 1e-7}, "bwd": {"embedding/k2pr": 5e-7}}})
    # 10 samples look up 20 rows; forward: 1 launch + (1280 touched B + 10 * (16 + 64) B) / 1e9
    # = 1e-6 + 2.08e-6, plus 20 rows x 1e-7 = 2e-6
    assert layer_time_s(EMB, "fwd", 10, dev, "fp32", 16.0) == (1e-6 * 1 + 2080.0 / 1e9) + 1e-7 * 20.0
    # the backward's table has another kind only (k2pr) and no op class: nothing added
    assert layer_time_s(EMB, "bwd", 10, dev, "fp32", 16.0) == 1e-6 * 2 + 4000.0 / 1e9 + 0.0
    # a pass with FLOPs looks nothing up
    (rc,) = corrections_of(dev)
    assert isinstance(rc, RowCost)
    assert rc.extra_s(PassContext("embedding", "fwd", 1.0, 1, 0.0, rows=20.0)) == 0.0


def test_glue_by_hand() -> None:
    dev = bare_profile(corrections={"glue": {"fwd": [1e-5, 1e-9]}})
    # ReLU forward on 2 samples: roofline 1e-6 + 4e3 / 1e9; glue 1e-5 + 1e-9 x 2e3 output B
    assert layer_time_s(RELU, "fwd", 2, dev, "fp32", 1e3) == (1e-6 * 1 + 4e3 / 1e9) + (1e-5 + 1e-9 * 2e3)
    # bf16 halves the output bytes: 1e-5 + 1e-9 x 1e3
    (g,) = corrections_of(dev)
    assert isinstance(g, Glue)
    assert g.extra_s(PassContext("elementwise", "fwd", 0.0, 1, 0.0, out_bytes=2 * 0.5 * 1e3)) == 1e-5 + 1e-9 * 1e3
    # no [a, c] for the backward: none
    assert layer_time_s(RELU, "bwd", 2, dev, "fp32", 1e3) == 1e-6 * 2 + 6e3 / 1e9


def test_cold_calls_by_hand() -> None:
    # 0 s after 1e6 B, 1e-4 s after 1e8 B, log-linear: 5e-5 s after 1e7 B
    dev = bare_profile(corrections={"cold_calls": {"window": 2, "curves": {
        "elementwise": {"bytes": [1e6, 1e8], "s": [0.0, 1e-4]}}}})
    (cold,) = corrections_of(dev)
    assert isinstance(cold, ColdCalls) and cold.streamed_window == 2
    assert layer_time_s(RELU, "fwd", 2, dev, "fp32", 1e3, streamed_bytes=1e7) == (1e-6 * 1 + 4e3 / 1e9) + 5e-5
    assert layer_time_s(RELU, "fwd", 2, dev, "fp32", 1e3) == 1e-6 * 1 + 4e3 / 1e9 + 0.0  # nothing streamed
    assert cold.at("gemm", 1e7) == 0.0  # no curve for the op class
    # in a model, the window's passes before each pass (execution order f0 f1 b1 b0, then
    # the next iteration): two ReLUs of 1e3 B a sample on 1000 samples move 2e6 B forward,
    # 3e6 B backward; window 2: before f0 b1 + b0 = 6e6, before f1 b0 + f0 = 5e6, before b1
    # f1 + f0 = 4e6, before b0 b1 + f1 = 5e6. A curve of 1e-5 s at 5e6 B and 2e-5 s at 6e6 B
    # (clamped below): 2e-5, 1e-5, 1e-5, 1e-5
    dev = bare_profile(corrections={"cold_calls": {"window": 2, "curves": {
        "elementwise": {"bytes": [5e6, 6e6], "s": [1e-5, 2e-5]}}}})
    m = Model("m", (RELU, replace(RELU, name="relu2")), input_bytes=1e3)
    fwd, bwd = layer_times(m, dev, "fp32", 1000)
    assert list(fwd) == [(1e-6 * 1 + 2e6 / 1e9) + 2e-5, (1e-6 * 1 + 2e6 / 1e9) + 1e-5]
    assert list(bwd) == [(1e-6 * 2 + 3e6 / 1e9) + 1e-5, (1e-6 * 2 + 3e6 / 1e9) + 1e-5]


def test_skinny_gemm_by_hand() -> None:
    # the Linear on 1 sample makes 1 row: kind rows1, priced by its own curve gemm/rows1
    assert compute_kind(FC, 4e3, 1) == "rows1" and compute_kind(FC, 4e3, 8) is None
    eff = {"gemm": 0.5, "gemm/rows1": 1.0}
    dev = bare_profile(efficiency=eff, corrections={"skinny_gemm": {}})
    plain = bare_profile(efficiency=eff)
    # compute 2e6 / (1e9 x 1.0) = 2e-3 s, memory (4e6 + 4e3 + 4e3) / 1e9 = 4.008e-3 s: the
    # roofline takes the memory term; skinny_gemm adds -(4.008e-3 - 2e-3): compute alone
    assert layer_time_s(FC, "fwd", 1, plain, "fp32", 4e3) == 1e-6 * 1 + 4.008e6 / 1e9
    assert layer_time_s(FC, "fwd", 1, dev, "fp32", 4e3) == 1e-6 * 1 + 2e6 / (1e9 * 1.0)
    # 8 samples, 8 rows: not a skinny kind, the op class's curve and both terms (compute
    # 1.6e7 / 5e8 = 0.032 s against memory 4.064e-3 s) either way
    assert layer_time_s(FC, "fwd", 8, dev, "fp32", 4e3) == layer_time_s(FC, "fwd", 8, plain, "fp32", 4e3)
    assert layer_time_s(FC, "fwd", 8, dev, "fp32", 4e3) == 1e-6 * 1 + 1.6e7 / (1e9 * 0.5)
    assert [type(c) for c in corrections_of(dev)] == [SkinnyGemm]


#: a 3x3 convolution 64 -> 64 channels on 8 x 8 pixels (weights 64*64*9 = 36864), stride 1
CONV = Layer("conv", "conv", 2 * 64 * 36864.0, 4 * 64 * 36864.0, 4 * 36864.0, 4 * 64 * 64.0)


def test_wave_quantization_by_hand() -> None:
    # 256 x 200 output, 128 x 128 tiles: 2 x 2 = 4 tiles on 3 SMs: 2 waves of 3 slots,
    # 4 / 6 of them filled
    assert utilization(256, 200, 3, 128, 128) == 4 / 6
    assert utilization(256, 256, 4, 128, 128) == 1.0  # 4 tiles, one full wave
    assert utilization(100, 100, 80, 128, 128) == 1 / 80  # one tile on 80 SMs
    # the convolution: positions = 2*64*36864 / (2*36864) = 64 pixels, N = 64 channels;
    # on 4 samples the forward's output is M = 256 x N = 64: 2 x 1 = 2 tiles on 5 SMs
    # (util 2/5). compute 4 * 4718592 / 1e9 = 0.018874368 s; memory (147456 + 4 * (16384 +
    # 16384)) / 1e9 = 2.78528e-4 s; the compute term grows by 5/2
    dev = bare_profile(corrections={"wave_quantization": {"sms": 5}})
    fwd = layer_time_s(CONV, "fwd", 4, dev, "fp32", 16384.0)
    assert fwd == 1e-6 * 1 + (4 * 4718592.0 / (1e9 * 1.0)) / (2 / 5)
    # backward: the input gradient's M = 256 x K = 36864 / 64 = 576 (5 tiles, one wave on 5 SMs)
    bwd = layer_time_s(CONV, "bwd", 4, dev, "fp32", 16384.0)
    assert bwd == layer_time_s(CONV, "bwd", 4, bare_profile(), "fp32", 16384.0)
    # a layer without parameters (a batched matmul of attention) is left alone
    bmm = Layer("scores", "gemm", 1e6, 2e6, 0.0, 4e3)
    assert layer_time_s(bmm, "fwd", 4, dev, "fp32", 4e3) == layer_time_s(bmm, "fwd", 4, bare_profile(),
                                                                         "fp32", 4e3)
    assert [type(c) for c in corrections_of(dev)] == [WaveQuantization]


def test_layout_transpose_by_hand() -> None:
    # fp16 (mixed precision): activations are half, weights half copies
    dev = bare_profile(peak_flops={"fp32": 1e9, "fp16": 1e12},
                       corrections={"layout_transpose": {"passes": 2.0, "modes": ["fp16"]}})
    # forward on 4 samples, input and output 16384 B a sample at half: moved = 4 * (8192 +
    # 8192) = 65536 B; the pass's bytes 0.5 * 147456 + 65536 = 139264 at 1 GB/s, so
    # memory = 1.39264e-4 s > compute 0.018874368 / 1e3 s; 2 passes over 65536 B more
    plain = layer_time_s(CONV, "fwd", 4, dev, "fp16", 16384.0, scales=(0.5, 0.5),
                         memory_format="channels_last")
    assert plain == 1e-6 * 1 + 139264 / 1e9
    nchw = layer_time_s(CONV, "fwd", 4, dev, "fp16", 16384.0, scales=(0.5, 0.5))
    assert nchw == plain + 2.0 * 65536 * (139264 / 1e9) / 139264
    # fp32 math (no tensor cores): no transposes in either layout
    assert (layer_time_s(CONV, "fwd", 4, dev, "fp32", 16384.0)
            == layer_time_s(CONV, "fwd", 4, dev, "fp32", 16384.0, memory_format="channels_last"))
    # a GEMM is not a convolution
    assert (layer_time_s(FC, "fwd", 4, dev, "fp16", 4e3, scales=(0.5, 0.5))
            == layer_time_s(FC, "fwd", 4, dev, "fp16", 4e3, scales=(0.5, 0.5), memory_format="channels_last"))
    assert [type(c) for c in corrections_of(dev)] == [LayoutTranspose]


def test_dense_sparse_grad_by_hand() -> None:
    dev = bare_profile(corrections={"dense_sparse_grad": {}})
    # the embedding's backward on 10 samples: plain 2 x 1280 + 10 x (16 + 2 x 64) = 4000 B;
    # with the dense gradient of its table, + 1e4 B = 14000 B: 2 launches + 1.4e4 / 1e9 (the
    # roofline of the corrected bytes; less the plain one's, 2e-6 + 4e-6, that is +1e-5)
    assert plain_work(EMB, "bwd", 10, "fp32", 16.0) == (0.0, 2, 4000.0)
    assert layer_work(EMB, "bwd", 10, "fp32", 16.0, dense_sparse_grad=True) == (0.0, 2, 14000.0)
    assert layer_time_s(EMB, "bwd", 10, dev, "fp32", 16.0) == 1e-6 * 2 + 14000.0 / 1e9
    assert layer_time_s(EMB, "fwd", 10, dev, "fp32", 16.0) == 1e-6 * 1 + 2080.0 / 1e9  # forward: as is
    assert layer_time_s(RELU, "bwd", 2, dev, "fp32", 1e3) == 1e-6 * 2 + 6e3 / 1e9  # dense: as is
    assert [type(c) for c in corrections_of(dev)] == [DenseSparseGrad]


def test_weight_grad_only_bwd_by_hand() -> None:
    dev = bare_profile(corrections={"weight_grad_only_bwd": {}})
    # backward on 2 samples of 100 input B: weight gradient 4e3 B + 2 x (100 + 40) B read =
    # 4280 B (plain: 2 x 4e3 + 2 x (100 + 2 x 40) = 8360 B); 4e3 FLOPs take 4e-6 s, the
    # bytes 4.28e-6 s: 2 launches + 4.28e-6 (plain: + 8.36e-6)
    assert layer_time_s(FIRST, "bwd", 2, dev, "fp32", 100.0) == 1e-6 * 2 + 4280.0 / 1e9
    assert layer_time_s(FIRST, "bwd", 2, bare_profile(), "fp32", 100.0) == 1e-6 * 2 + 8360.0 / 1e9
    # a layer computing both gradients keeps its bytes
    inner = Layer("inner", "gemm", 2e3, 4e3, 4e3, 40.0)
    assert layer_time_s(inner, "bwd", 2, dev, "fp32", 100.0) == 1e-6 * 2 + 8360.0 / 1e9
    assert [type(c) for c in corrections_of(dev)] == [WeightGradOnlyBwd]


def test_the_extra_seconds_add_in_registry_order() -> None:
    # an embedding's forward with call overhead, row cost, glue and cold calls: the
    # roofline plus ((call overhead + row cost) + glue) + cold, whatever order the file
    # lists them in
    corr = {"cold_calls": {"curves": {"embedding": {"bytes": [1e6, 1e8], "s": [0.0, 1e-4]}}},
            "glue": {"fwd": [1e-5, 1e-9]}, "row_cost": {"fwd": {"embedding": 1e-7}},
            "call_overhead": {"fwd": {"embedding": 3e-5}}}
    dev = bare_profile(corrections=corr)
    assert [c.name for c in corrections_of(dev)] == ["call_overhead", "row_cost", "glue", "cold_calls"]
    # output 10 x 64 B = 640 B for the glue; 1e7 B streamed: 5e-5
    want = (1e-6 * 1 + 2080.0 / 1e9) + (((3e-5 + 1e-7 * 20.0) + (1e-5 + 1e-9 * 640.0)) + 5e-5)
    assert layer_time_s(EMB, "fwd", 10, dev, "fp32", 16.0, streamed_bytes=1e7) == want
    assert [c.name for c in REGISTRY] == ["dense_sparse_grad", "weight_grad_only_bwd", "skinny_gemm",
                                          "wave_quantization", "call_overhead", "row_cost", "glue",
                                          "cold_calls", "layout_transpose"]
    assert [c.name for c in corrections_of(dev, exclude=("glue",))] == ["call_overhead", "row_cost",
                                                                         "cold_calls"]


def test_a_measured_table_replaces_the_corrections() -> None:
    table = {RELU.signature: {"batch": [2], "fwd_s": [1e-3], "bwd_s": [2e-3]}}
    dev = bare_profile(layers=table, corrections={"call_overhead": {"fwd": {"elementwise": 1.0}},
                                                  "glue": {"fwd": [1.0, 0.0]}})
    assert layer_time_s(RELU, "fwd", 2, dev, "fp32", 1e3, streamed_bytes=1e9) == 1e-3


def test_a_correction_parameter_error_names_its_field() -> None:
    for corr, where in (({"glue": {"fwd": [-1.0, 0.0]}}, "corrections.glue.fwd.0"),
                        ({"cold_calls": {"window": 9, "curves": {}}}, "corrections.cold_calls.window"),
                        ({"skinny_gemm": {"max_rows": 4}}, "corrections.skinny_gemm.max_rows"),
                        ({"tf32": {}}, "corrections.tf32")):
        with pytest.raises(ValidationError) as info:
            bare_profile(corrections=corr)
        assert ".".join(str(x) for x in info.value.errors()[0]["loc"]) == where


DATASHEETS = sorted(p for p in BUILTIN_DIR.glob("*.json") if load_profile_file(p).source.kind == "datasheet")


@pytest.mark.parametrize("path", DATASHEETS, ids=[p.stem for p in DATASHEETS])
def test_a_datasheet_profile_lists_no_correction_and_prices_as_the_roofline(path: Path) -> None:
    dev = load_profile_file(path)
    assert dev.source.kind == "datasheet" and corrections_of(dev) == () and not dev.layers
    for name in zoo.names():
        m = zoo.get(name)
        for dtype in ("fp32",):
            fwd, bwd = layer_times(m, dev, dtype, 16)
            for i, ly in enumerate(m.layers):
                for phase, t in (("fwd", fwd[i]), ("bwd", bwd[i])):
                    flops, kernels, nbytes = plain_work(ly, phase, 16, dtype, m.input_bytes_of(i))
                    # three terms: launches, FLOPs at the op class's efficiency, bytes at mem_bw
                    compute = flops / (dev.peak(dtype) * dev.eff(ly.op, flops, phase)) if flops > 0 else 0.0
                    assert t == dev.launch_overhead_s * kernels + max(compute, nbytes / dev.mem_bw_Bps), (
                        name, ly.name, phase)
