"""The cost model (sim/costmodel.py) and the share-splitting schedulers, on hand-worked cases.

Every expected number below is worked out in the comment next to it from the
formula in ARCHITECTURE.md:

    time = launch_overhead_s * kernels
         + max(flops / (peak * eff), bytes / mem_bw)

with fwd bytes = touched params + b * act * (input + activation) and bwd
bytes = 2 * touched params + b * act * (input + 2 * activation), kernels
doubled for bwd.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schedulers
from schedulers.base import largest_remainder
from sim.costmodel import (
    AGG_PASSES,
    APPLY_PASSES,
    QUANT_META_BYTES,
    iteration_compute_s,
    layer_time_s,
    layer_times,
    plan_costs,
    quantized_bytes,
    shard_partition,
)
from sim.plan import check_plan
from tests.helpers_eval import dense, model, plan, problem, profile, sparse

REL = 1e-12

# -- layer_time_s: the roofline formula -----------------------------------------


def test_compute_bound_layer() -> None:
    # 10 samples x 1e9 FLOP = 1e10 FLOP at 1e12 FLOP/s -> 0.01 s; bytes 1e6 + 10*100 -> 1e-6 s.
    dev = profile(peak=1e12, mem_bw=1e12)
    ly = dense("fc", 1e6, fwd_flops=1e9, bwd_flops=2e9, activation_bytes=100)
    assert layer_time_s(ly, "fwd", 10, dev, "fp32", 0.0) == pytest.approx(0.01, rel=REL)
    # bwd: 2e10 FLOP -> 0.02 s (bytes 2e6 + 10*200 are 2e-6 s)
    assert layer_time_s(ly, "bwd", 10, dev, "fp32", 0.0) == pytest.approx(0.02, rel=REL)


def test_memory_bound_layer_counts_weights_input_and_activations() -> None:
    # fwd bytes = 1e9 (weights) + 4 * (5e5 input + 1e6 output) = 1.006e9 at 1e11 B/s -> 0.01006 s
    # bwd bytes = 2e9 (read weights, write grad) + 4 * (5e5 + 2 * 1e6) = 2.01e9 -> 0.0201 s
    # FLOPs (4 x 10) are negligible at 1e12 FLOP/s.
    dev = profile(peak=1e12, mem_bw=1e11)
    ly = dense("big", 1e9, fwd_flops=10, bwd_flops=10, activation_bytes=1e6)
    assert layer_time_s(ly, "fwd", 4, dev, "fp32", 5e5) == pytest.approx(0.01006, rel=REL)
    assert layer_time_s(ly, "bwd", 4, dev, "fp32", 5e5) == pytest.approx(0.0201, rel=REL)


def test_layer_times_feed_the_previous_activation_as_input() -> None:
    # Layer 1 reads layer 0's 1e6-byte output per sample: 2 * (1e6 + 0) bytes at 1e9 B/s = 2e-3 s;
    # layer 0 reads the model input (3e5 per sample): 2 * (3e5 + 1e6) = 2.6e6 -> 2.6e-3 s.
    dev = profile(peak=1e15, mem_bw=1e9)
    m = model(dense("a", 0, activation_bytes=1e6), dense("b", 0), input_bytes=3e5)
    fwd, bwd = layer_times(m, dev, "fp32", 2)
    assert fwd.tolist() == pytest.approx([2.6e-3, 2e-3], rel=REL)
    # bwd: layer 0: 2 * (3e5 + 2e6) = 4.6e6 -> 4.6e-3; layer 1: 2 * (1e6 + 0) -> 2e-3
    assert bwd.tolist() == pytest.approx([4.6e-3, 2e-3], rel=REL)
    assert iteration_compute_s(m, dev, "fp32", 2) == pytest.approx(2.6e-3 + 2e-3 + 4.6e-3 + 2e-3, rel=REL)


def test_launch_overhead_per_kernel_and_doubled_in_backward() -> None:
    # No work at all: only launches. 3 kernels x 1e-5 s fwd, 6 x 1e-5 s bwd.
    dev = profile(launch=1e-5)
    ly = dense("act", 0, kernels=3, op="elementwise")
    assert layer_time_s(ly, "fwd", 8, dev, "fp32", 0.0) == pytest.approx(3e-5, rel=REL)
    assert layer_time_s(ly, "bwd", 8, dev, "fp32", 0.0) == pytest.approx(6e-5, rel=REL)
    # Launches add to (not max with) the roofline term: 1e-5 + 1e10/1e12.
    ly2 = dense("fc", 0, fwd_flops=1e9)
    assert layer_time_s(ly2, "fwd", 10, dev, "fp32", 0.0) == pytest.approx(1e-5 + 0.01, rel=REL)


def test_zero_batch_costs_nothing() -> None:
    dev = profile(launch=1e-3)
    assert layer_time_s(dense("fc", 1e6, fwd_flops=1e9), "fwd", 0, dev, "fp32", 0.0) == 0.0


def test_efficiency_constant_and_curve() -> None:
    # Constant 0.5 for gemm: 1e10 FLOP at 0.5 x 1e12 -> 0.02 s; conv has no entry -> 1.0 -> 0.01 s.
    dev = profile(efficiency={"gemm": 0.5})
    assert layer_time_s(dense("g", 0, fwd_flops=1e9), "fwd", 10, dev, "fp32", 0.0) == pytest.approx(0.02, rel=REL)
    assert layer_time_s(dense("c", 0, fwd_flops=1e9, op="conv"), "fwd", 10, dev, "fp32", 0.0) == pytest.approx(
        0.01, rel=REL)
    # Curve linear in log10(flops) between (1e6, 0.2) and (1e10, 0.6): a 1e8-FLOP call sits
    # half way -> 0.4 -> 1e8 / 0.4e12 = 2.5e-4 s. Beyond the ends it is clamped.
    curve = profile(efficiency={"gemm": {"flops": [1e6, 1e10], "eff": [0.2, 0.6]}})
    ly = dense("g", 0, fwd_flops=1e7)
    assert layer_time_s(ly, "fwd", 10, curve, "fp32", 0.0) == pytest.approx(2.5e-4, rel=1e-12)
    # 1e12 FLOP call: clamped at 0.6 -> 1e12 / 0.6e12
    assert layer_time_s(ly, "fwd", 1e5, curve, "fp32", 0.0) == pytest.approx(1 / 0.6, rel=1e-12)


def test_half_precision_uses_its_peak_and_halves_activation_bytes() -> None:
    # fp16: 1e10 FLOP at 4e12 -> 2.5e-3 s. Memory: weights stay fp32 master bytes (1e6), activations
    # are scaled by 0.5: 1e6 + 10 * 0.5 * (1e5 + 1e5) = 2e6 bytes at 1e9 B/s = 2e-3 s < 2.5e-3.
    dev = profile(peak=1e12, peak16=4e12, mem_bw=1e9)
    ly = dense("fc", 1e6, fwd_flops=1e9, activation_bytes=1e5)
    assert layer_time_s(ly, "fwd", 10, dev, "fp16", 1e5) == pytest.approx(2.5e-3, rel=REL)
    # bf16 falls back to the fp16 entry; fp32 uses fp32: 1e10/1e12 = 0.01 vs 1e6 + 10*2e5 = 3e6 -> 3e-3
    assert layer_time_s(ly, "fwd", 10, dev, "bf16", 1e5) == pytest.approx(2.5e-3, rel=REL)
    assert layer_time_s(ly, "fwd", 10, dev, "fp32", 1e5) == pytest.approx(0.01, rel=REL)


def test_sparse_layer_reads_only_touched_rows() -> None:
    # 100 samples x 26 rows x 64 B = 166400 B touched of a 1e9-B table.
    # fwd: 166400 + 100 * 512 (output) = 217600 B at 1e9 B/s -> 2.176e-4 s
    # bwd: 2 * 166400 + 100 * 2 * 512 = 435200 B -> 4.352e-4 s
    dev = profile(mem_bw=1e9)
    emb = sparse("emb", 1e9, rows_per_sample=26, row_bytes=64, activation_bytes=512)
    assert layer_time_s(emb, "fwd", 100, dev, "fp32", 0.0) == pytest.approx(2.176e-4, rel=REL)
    assert layer_time_s(emb, "bwd", 100, dev, "fp32", 0.0) == pytest.approx(4.352e-4, rel=REL)
    # A small table caps the touched bytes at its size: min(1000, 166400) = 1000 -> 1e-6 s.
    small = sparse("small", 1000, rows_per_sample=26, row_bytes=64)
    assert layer_time_s(small, "fwd", 100, dev, "fp32", 0.0) == pytest.approx(1e-6, rel=REL)


# -- measured per-layer tables -------------------------------------------------

MEASURED = dense("fc", 1e6, fwd_flops=1e9, bwd_flops=2e9, activation_bytes=100)


def _measured(table: dict[str, list[float]]) -> object:
    return profile(launch=1.0, layers={MEASURED.signature: table})  # launch 1 s: formula is never used


@pytest.mark.parametrize(("b", "fwd", "bwd"), [
    (8, 1e-3, 2e-3),          # a measured point
    (12, 1.25e-3, 2.5e-3),    # half way between 8 and 16
    (32, 2.5e-3, 5e-3),       # the last point
    (64, 4.5e-3, 9e-3),       # extrapolated along 16..32: 2.5e-3 + 32 * (1e-3 / 16)
    (4, 0.75e-3, 1.5e-3),     # extrapolated along 8..16: 1e-3 - 4 * (0.5e-3 / 8)
])
def test_measured_table_is_interpolated_in_batch(b: int, fwd: float, bwd: float) -> None:
    dev = _measured({"batch": [8, 16, 32], "fwd_s": [1e-3, 1.5e-3, 2.5e-3], "bwd_s": [2e-3, 3e-3, 5e-3]})
    assert layer_time_s(MEASURED, "fwd", b, dev, "fp32", 0.0) == pytest.approx(fwd, rel=1e-12)
    assert layer_time_s(MEASURED, "bwd", b, dev, "fp32", 0.0) == pytest.approx(bwd, rel=1e-12)


def test_measured_table_edge_cases() -> None:
    # One point: proportional through the origin, 2e-3 s at 16 -> 1e-3 s at 8.
    one = _measured({"batch": [16], "fwd_s": [2e-3], "bwd_s": [4e-3]})
    assert layer_time_s(MEASURED, "fwd", 8, one, "fp32", 0.0) == pytest.approx(1e-3, rel=1e-12)
    # Extrapolation below zero is clamped: 1e-3 - 9 * 2e-4 < 0 -> 0.
    steep = _measured({"batch": [10, 20], "fwd_s": [1e-3, 3e-3], "bwd_s": [1e-3, 3e-3]})
    assert layer_time_s(MEASURED, "fwd", 1, steep, "fp32", 0.0) == 0.0
    # A layer with another signature falls back to the formula (1 s launch + 0.01 s).
    other = dense("other", 1e6, fwd_flops=1e9, bwd_flops=2e9, activation_bytes=101)
    assert layer_time_s(other, "fwd", 10, one, "fp32", 0.0) == pytest.approx(1.01, rel=1e-12)


def test_a_layer_smaller_than_its_input_has_a_table_of_its_own() -> None:
    from sim.costmodel import table_key

    # a pooling layer and a ReLU of equal output bytes: one signature, two table keys
    assert table_key(MEASURED, 400.0) == MEASURED.signature + ":r"  # 100 B out of 400 in
    assert table_key(MEASURED, 100.0) == table_key(MEASURED, 0.0) == MEASURED.signature
    dev = profile(launch=1.0, layers={MEASURED.signature + ":r": {"batch": [8], "fwd_s": [1e-3], "bwd_s": [2e-3]}})
    assert layer_time_s(MEASURED, "fwd", 8, dev, "fp32", 400.0) == pytest.approx(1e-3, rel=1e-12)
    # fed 100 B it is not the pooling layer measured: the formula (1 s launch + 0.008 s)
    assert layer_time_s(MEASURED, "fwd", 8, dev, "fp32", 100.0) == pytest.approx(1.008, rel=1e-12)


# -- quantization and shard partitioning ------------------------------------------


@pytest.mark.parametrize(("nbytes", "bits", "expect"), [
    (1000.0, 32, 1000.0),
    (1000.0, 16, 500.0 + QUANT_META_BYTES),
    (1000.0, 8, 250.0 + QUANT_META_BYTES),
    (1000.0, 2, 63.0 + QUANT_META_BYTES),  # 250 values x 2 bits = 62.5 B, rounded up to 63
    (0.0, 8, 0.0),  # nothing to send: no metadata either
])
def test_quantized_bytes(nbytes: float, bits: int, expect: float) -> None:
    assert QUANT_META_BYTES == 8.0  # an fp32 scale and an fp32 offset
    assert quantized_bytes(nbytes, bits) == expect


def test_shard_partition_dense_key_ranges() -> None:
    # Dense bytes [100, 300] laid end to end = 400, cut at 200:
    # layer 0 = [0, 100) -> all on shard 0; layer 1 = [100, 400): [100, 200) on shard 0 (1/3),
    # [200, 400) on shard 1 (2/3).
    m = model(dense("a", 100), dense("b", 300))
    frac = shard_partition(m, 2)
    assert frac.tolist() == [[1.0, 1 / 3], [0.0, 2 / 3]]
    # 4 shards, cuts at 100, 200, 300: layer 0 all on shard 0, layer 1 a third on each of 1..3.
    assert shard_partition(m, 4) == pytest.approx(
        np.array([[1.0, 0.0], [0.0, 1 / 3], [0.0, 1 / 3], [0.0, 1 / 3]]), rel=1e-12, abs=1e-15)
    # One shard holds everything.
    assert shard_partition(m, 1).tolist() == [[1.0, 1.0]]


def test_shard_partition_sparse_tables_are_hashed_evenly_and_skip_the_key_range() -> None:
    # The table does not enter the dense key range: dense [100, 300] cut at 200 as above.
    m = model(dense("a", 100), sparse("emb", 1e9, 4, 64), dense("b", 300), dense("relu", 0))
    frac = shard_partition(m, 2)
    assert frac[:, 1].tolist() == [0.5, 0.5]
    assert frac[:, 0].tolist() == [1.0, 0.0]
    assert frac[:, 2].tolist() == pytest.approx([1 / 3, 2 / 3], rel=1e-12)
    assert frac[:, 3].tolist() == [0.0, 0.0]  # no parameters, nothing to hold
    assert shard_partition(m, 3)[:, 1].tolist() == [1 / 3, 1 / 3, 1 / 3]


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(0, 10**7), min_size=1, max_size=10), shards=st.integers(1, 6))
def test_shard_partition_properties(sizes: list[int], shards: int) -> None:
    # Every layer with parameters is fully placed, and every shard holds total/S dense bytes.
    m = model(*(dense(f"l{i}", float(s)) for i, s in enumerate(sizes)))
    frac = shard_partition(m, shards)
    assert frac.shape == (shards, len(sizes))
    assert (frac >= 0).all()
    for j, s in enumerate(sizes):
        assert frac[:, j].sum() == pytest.approx(1.0 if s > 0 else 0.0, abs=1e-9)
    total = float(sum(sizes))
    if total > 0:
        per_shard = frac @ np.asarray(sizes, dtype=float)
        assert per_shard.tolist() == pytest.approx([total / shards] * shards, rel=1e-9, abs=1e-6)


# -- PlanCosts: what the evaluators consume ------------------------------------------


def test_plan_costs_chunks_bytes_and_shard_work_without_pipelining() -> None:
    # Dense 400 B + a sparse table (2 rows x 10 B per sample) over 2 shards, workers with 3 and 7
    # samples. One chunk per shard; each holds 200 dense bytes and half of each worker's touched
    # rows: worker 0 touches 3*2*10 = 60 B -> 30 per shard, worker 1 touches 140 -> 70 per shard.
    m = model(sparse("emb", 1e6, 2, 10), dense("fc", 400))
    shard = profile("ps", kind="cpu", mem_bw=1e9, nic=2e9)
    pr = problem([profile("a"), profile("b", nic=5e8)], [shard, shard], m, 10, quant_bits=8)
    c = plan_costs(pr, plan(pr, [3, 7]))
    assert c.chunk_shard.tolist() == [0, 1] and c.chunk_group.tolist() == [0, 0]
    assert c.pull_bytes.tolist() == [[230.0, 230.0], [270.0, 270.0]]
    # 8-bit push: a quarter, rounded up to a whole byte, plus 8 B of scale metadata per chunk:
    # 230 / 4 = 57.5 -> 58 + 8 = 66; 270 / 4 = 67.5 -> 68 + 8 = 76
    assert c.push_bytes.tolist() == [[66.0, 66.0], [76.0, 76.0]]
    # aggregation: AGG_PASSES passes over the fp32 gradient at the shard's memory bandwidth,
    # plus the dequantize pass (read packed, write fp32): worker 0 3*230 + (66 + 230) = 986 B,
    # worker 1 3*270 + (76 + 270) = 1156 B, at 1e9 B/s
    assert AGG_PASSES == 3.0 and APPLY_PASSES == 3.0
    assert c.agg_s == pytest.approx(np.array([[9.86e-7] * 2, [1.156e-6] * 2]), rel=REL)
    assert c.dequant_s == pytest.approx(np.array([[2.96e-7] * 2, [3.46e-7] * 2]), rel=REL)
    # the senders' quantize pass (read fp32, write packed) at the worker's 1e12 B/s joins the
    # one backward group: 2 chunks x 296 B = 5.92e-10 s and 2 x 346 B = 6.92e-10 s, on top of the
    # memory-bound backward (no FLOPs): 2 x touched params = 2 * (60 + 400) = 920 B -> 9.2e-10 s
    # and 2 * (140 + 400) = 1080 B -> 1.08e-9 s; totals 1.512e-9 and 1.772e-9 s
    assert c.quant_s == pytest.approx(np.array([[2.96e-10] * 2, [3.46e-10] * 2]), rel=REL)
    assert c.bwd_s == pytest.approx(np.array([[1.512e-9], [1.772e-9]]), rel=REL)
    # BSP apply: the dense chunk once plus every touched row (30 + 70): 3 * 300 B / 1e9
    assert c.apply_s.tolist() == pytest.approx([9e-7, 9e-7], rel=REL)
    # ASP apply of one worker's update: its own bytes
    assert c.apply_one_s == pytest.approx(np.array([[6.9e-7] * 2, [8.1e-7] * 2]), rel=REL)
    assert c.worker_bw.tolist() == [1e9, 5e8] and c.shard_bw.tolist() == [2e9, 2e9]
    assert c.batch.tolist() == [3.0, 7.0] and c.workers == ("a:0", "b:0")


def test_plan_costs_pipelined_chunks_are_layer_shard_pieces() -> None:
    # Dense [100, 300] over 2 shards: pieces (shard 0, layer 0) = 100, (0, 1) = 100, (1, 1) = 200,
    # in layer order; the zero-parameter layer has none. Each piece is its own message, so each
    # 8-bit push carries its own 8 B of metadata.
    m = model(dense("a", 100, fwd_flops=1e9), dense("relu", 0, fwd_flops=1e9), dense("b", 300, fwd_flops=1e9))
    shard = profile("ps", kind="cpu")
    pr = problem([profile()], [shard, shard], m, 1, pipeline=True, quant_bits=8)
    c = plan_costs(pr, plan(pr, [1]))
    assert c.chunk_shard.tolist() == [0, 0, 1] and c.chunk_group.tolist() == [0, 2, 2]
    assert c.pull_bytes.tolist() == [[100.0, 100.0, 200.0]]
    assert c.push_bytes.tolist() == [[33.0, 33.0, 58.0]]
    # one compute group per layer: 1e9 FLOP at 1e12 = 1e-3 s each
    assert c.fwd_s == pytest.approx(np.array([[1e-3, 1e-3, 1e-3]]), rel=REL)


# -- largest remainder --------------------------------------------------------


def test_largest_remainder_hand_cases() -> None:
    # quotas 3.33.. each; floors 3,3,3 leave 1 -> the tie goes to the lowest index
    assert largest_remainder([1, 1, 1], 10) == [4, 3, 3]
    # quotas 3.5, 2.1, 1.4; floors 3,2,1 leave 1 -> largest remainder 0.5 (index 0)
    assert largest_remainder([0.5, 0.3, 0.2], 7) == [4, 2, 1]
    # quotas 0.2, 0.8 -> [0, 1]; a zero weight gets nothing
    assert largest_remainder([1, 4], 1) == [0, 1]
    assert largest_remainder([0, 2, 2], 5) == [0, 3, 2]
    for bad in ([], [0, 0], [1, -1], [1, math.inf]):
        with pytest.raises(ValueError):
            largest_remainder(bad, 5)
    with pytest.raises(ValueError):
        largest_remainder([1], -1)


@settings(max_examples=200, deadline=None)
@given(weights=st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=12).filter(
    lambda w: sum(w) > 0), total=st.integers(0, 10_000))
def test_largest_remainder_properties(weights: list[float], total: int) -> None:
    out = largest_remainder(weights, total)
    assert sum(out) == total
    assert all(isinstance(x, int) and x >= 0 for x in out)
    w = np.asarray(weights)
    quota = w / w.sum() * total
    assert all(abs(x - q) < 1 + 1e-9 for x, q in zip(out, quota))
    assert all(x == 0 for x, wi in zip(out, weights) if wi == 0)
    assert largest_remainder(weights, total) == out  # deterministic
    assert largest_remainder(np.asarray(weights), total) == out


# -- equal and proportional on a two-type cluster -----------------------------------


def _two_type_problem(batch: int, n_fast: int = 2, n_slow: int = 1):
    fast = profile("fast", peak=3e12)
    slow = profile("slow", peak=1e12)
    m = model(dense("fc", 1e6, fwd_flops=1e9, bwd_flops=2e9))
    return problem([fast] * n_fast + [slow] * n_slow, [profile("ps", kind="cpu")], m, batch)


def test_equal_splits_evenly_first_devices_get_the_remainder() -> None:
    # 10 over 3 devices: 3 each, 1 left for the first.
    pr = _two_type_problem(10)
    p = schedulers.make("equal").plan(pr)
    assert [(r.device, r.batch) for r in p.replicas] == [("fast:0", 4), ("fast:1", 3), ("slow:0", 3)]
    assert p.ps_shards == ("ps:0",) and p.scheduler == "equal"
    assert p.stages[0].device_type is None  # two types in the stage
    check_plan(p, pr)
    # Fewer samples than devices: zero shares are left out of the plan.
    p2 = schedulers.make("equal").plan(_two_type_problem(2))
    assert [(r.device, r.batch) for r in p2.replicas] == [("fast:0", 1), ("fast:1", 1)]
    assert p2.stages[0].device_type == "fast"


def test_proportional_shares_follow_compute_rate() -> None:
    # Compute-bound with no launch overhead: rate = peak / 3e9 FLOP per sample, so shares are
    # exactly 3:3:1 -> 70 = 30 + 30 + 10.
    pr = _two_type_problem(70)
    p = schedulers.make("proportional").plan(pr)
    assert [r.batch for r in p.replicas] == [30, 30, 10]
    check_plan(p, pr)
    # 8 over one fast and one slow: 6 and 2.
    p2 = schedulers.make("proportional").plan(_two_type_problem(8, 1, 1))
    assert [r.batch for r in p2.replicas] == [6, 2]


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(3, 500), launch=st.sampled_from([0.0, 1e-4]))
def test_proportional_sums_to_batch_and_favours_the_faster(batch: int, launch: float) -> None:
    fast = profile("fast", peak=3e12, launch=launch)
    slow = profile("slow", peak=1e12, launch=launch)
    m = model(dense("fc", 1e6, fwd_flops=1e9, bwd_flops=2e9))
    pr = problem([slow, fast], [profile("ps", kind="cpu")], m, batch)
    shares = {r.device: r.batch for r in schedulers.make("proportional").plan(pr).replicas}
    assert sum(shares.values()) == batch
    assert shares["fast:0"] > shares.get("slow:0", 0)
