"""Gradient quantization (sim/quantization.py and its costs in sim/costmodel.py), by hand.

Bytes of a piece of ``e`` fp32 values at ``q`` < 32 bits: ``ceil(e * q / 8) + 8`` (an fp32
scale and an fp32 offset); at 32 bits ``4 e``; an empty piece is 0 B. Quantizing costs the
sender one pass reading fp32 and writing packed bytes at its memory bandwidth; dequantizing
costs the shard the same bytes at the shard's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.costmodel import (
    AGG_PASSES,
    QUANT_META_BYTES,
    dequantize_time_s,
    layer_times,
    plan_costs,
    quantize_time_s,
    quantized_bytes,
)
from sim.quantization import (
    BIT_WIDTHS,
    Adaptive,
    Fixed,
    QuantizationPolicy,
    adaptive_bits,
    level_index,
    packed_bytes,
    packed_bytes_array,
    relative_loss_fall,
)
from tests.helpers_eval import build, case_specs, profile

REL = 1e-12

# -- bytes under each bit width ---------------------------------------------------------


@pytest.mark.parametrize(("elements", "bits", "expect"), [
    # 1000 values: 4000 B at fp32; 1000 * q / 8 B packed plus 8 B of metadata below it
    (1000, 32, 4000.0),
    (1000, 16, 2000.0 + 8),
    (1000, 8, 1000.0 + 8),
    (1000, 4, 500.0 + 8),
    (1000, 2, 250.0 + 8),
    # 3 values: 12 B; 48 bits = 6 B; 24 bits = 3 B; 12 bits = 1.5 -> 2 B; 6 bits = 0.75 -> 1 B
    (3, 32, 12.0),
    (3, 16, 6.0 + 8),
    (3, 8, 3.0 + 8),
    (3, 4, 2.0 + 8),
    (3, 2, 1.0 + 8),
    # 1 value at 2 bits still takes a whole byte, plus the metadata
    (1, 2, 1.0 + 8),
])
def test_packed_bytes_hand_cases(elements: int, bits: int, expect: float) -> None:
    assert QUANT_META_BYTES == 8.0
    assert packed_bytes(elements, bits) == expect
    # quantized_bytes takes the fp32 byte count of the same piece
    assert quantized_bytes(4.0 * elements, bits) == expect
    assert packed_bytes_array(np.array([4.0 * elements]), bits).tolist() == [expect]


@pytest.mark.parametrize("bits", BIT_WIDTHS)
def test_nothing_to_send_is_zero_bytes_without_metadata(bits: int) -> None:
    assert packed_bytes(0, bits) == 0.0
    assert quantized_bytes(0.0, bits) == 0.0
    assert packed_bytes_array(np.array([0.0, 4.0]), bits).tolist()[0] == 0.0


def test_fractional_pieces_round_up_but_float_noise_does_not() -> None:
    # 57.5 values (230 fp32 bytes, a shard's cut of a sparse row) at 8 bits: 57.5 -> 58 + 8
    assert packed_bytes(57.5, 8) == 66.0
    assert quantized_bytes(230.0, 8) == 66.0
    # (0.1 + 0.2) * 10 = 3.0000000000000004 values: 3 B at 8 bits, not 4 (1e-9 B slack)
    e = (0.1 + 0.2) * 10
    assert e > 3.0
    assert packed_bytes(e, 8) == 11.0
    assert quantized_bytes(4 * e, 8) == 11.0


@pytest.mark.parametrize("bad", [0, 1, 3, 12, 64, True, 8.5])
def test_only_the_listed_bit_widths_are_accepted(bad: object) -> None:
    with pytest.raises(ValueError):
        packed_bytes(10, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Fixed(bad)  # type: ignore[arg-type]


def test_negative_elements_rejected() -> None:
    with pytest.raises(ValueError):
        packed_bytes(-1, 8)


@settings(max_examples=200, deadline=None)
@given(elements=st.integers(0, 10**9), bits=st.sampled_from(BIT_WIDTHS))
def test_packed_bytes_properties(elements: int, bits: int) -> None:
    n = packed_bytes(elements, bits)
    assert n == quantized_bytes(4.0 * elements, bits)
    if elements == 0:
        assert n == 0
    elif bits == 32:
        assert n == 4 * elements
    else:
        # exact integer arithmetic: whole bytes, never fewer bits than needed, under a byte spare
        assert n - QUANT_META_BYTES == -(-elements * bits // 8)
        assert n <= 4 * elements + QUANT_META_BYTES
    # fewer bits never take more bytes
    finer = [b for b in BIT_WIDTHS if b > bits and b < 32]
    assert all(packed_bytes(elements, b) >= n for b in finer)


# -- quantize / dequantize passes -------------------------------------------------------


def test_quantize_and_dequantize_times_by_hand() -> None:
    worker = profile("w", mem_bw=1e10)
    shard = profile("ps", kind="cpu", mem_bw=2e9)
    # 1000 values = 4000 B fp32; 8 bits -> 1008 B. Pass: read 4000 + write 1008 = 5008 B.
    assert quantize_time_s(4000.0, 8, worker) == pytest.approx(5.008e-7, rel=REL)
    assert dequantize_time_s(4000.0, 8, shard) == pytest.approx(2.504e-6, rel=REL)
    # 2 bits -> 258 B: 4258 B per pass
    assert quantize_time_s(4000.0, 2, worker) == pytest.approx(4.258e-7, rel=REL)
    assert dequantize_time_s(4000.0, 2, shard) == pytest.approx(2.129e-6, rel=REL)
    # 16 bits -> 2008 B: 6008 B per pass
    assert quantize_time_s(4000.0, 16, worker) == pytest.approx(6.008e-7, rel=REL)
    # 32 bits: nothing to pack; nothing to send: nothing to do
    assert quantize_time_s(4000.0, 32, worker) == 0.0
    assert dequantize_time_s(4000.0, 32, shard) == 0.0
    assert quantize_time_s(0.0, 8, worker) == 0.0
    assert dequantize_time_s(0.0, 8, shard) == 0.0


# -- PlanCosts: 32 bits changes nothing; below, exactly the two passes are added ----------


def _unquantized_bwd(prob, pl) -> np.ndarray:
    """bwd_s as the cost model computed it before quantization had a cost."""
    job, cl = prob.job, prob.cluster
    reps = pl.stages[0].replicas
    per = [layer_times(job.model, cl.device(r.device).type, job.dtype, r.batch)[1] for r in reps]
    bwd = np.stack(per) if job.pipeline else np.stack([p.sum(keepdims=True) for p in per])
    return bwd


@settings(max_examples=60, deadline=None)
@given(spec=case_specs(max_workers=4, max_shards=3, max_layers=4, quant=(32,)),
       bits=st.sampled_from([16, 8, 4, 2]))
def test_plan_costs_at_32_bits_are_unchanged_and_below_add_exactly_the_passes(spec: dict, bits: int) -> None:
    p32, pl = build(spec, quant_bits=32)
    pq, _ = build(spec, quant_bits=bits)
    c32, cq = plan_costs(p32, pl), plan_costs(pq, pl)
    shard_mbw = np.array([p32.cluster.device(pl.ps_shards[s]).type.mem_bw_Bps for s in c32.chunk_shard])
    # 32 bits: the pre-quantization formulas, bit for bit
    assert np.array_equal(c32.bwd_s, _unquantized_bwd(p32, pl))
    assert np.array_equal(c32.push_bytes, c32.pull_bytes)
    assert np.array_equal(c32.agg_s, AGG_PASSES * c32.pull_bytes / shard_mbw[None, :])
    assert c32.quant_s is not None and c32.dequant_s is not None
    assert not c32.quant_s.any() and not c32.dequant_s.any()
    # below 32 bits: pulls, forward and applies do not change ...
    for name in ("pull_bytes", "fwd_s", "apply_s", "apply_one_s", "chunk_shard", "chunk_group"):
        assert np.array_equal(getattr(cq, name), getattr(c32, name)), name
    # ... pushes are the packed bytes of each chunk ...
    fp32 = c32.pull_bytes
    assert cq.push_bytes.tolist() == [[packed_bytes(x / 4, bits) for x in row] for row in fp32.tolist()]
    # ... the sender's pass is the chunk's quantize_time_s, summed into its group's backward ...
    devs = [pq.cluster.device(r.device).type for r in pl.stages[0].replicas]
    assert cq.quant_s is not None and cq.dequant_s is not None
    for w, d in enumerate(devs):
        for c in range(cq.n_chunks):
            # one pass reads the fp32 gradient and writes the packed one (or the reverse)
            moved = fp32[w, c] + packed_bytes(fp32[w, c] / 4, bits)
            assert cq.quant_s[w, c] == pytest.approx(moved / d.mem_bw_Bps, rel=REL)
            shard = pq.cluster.device(pl.ps_shards[int(cq.chunk_shard[c])]).type
            assert cq.dequant_s[w, c] == pytest.approx(moved / shard.mem_bw_Bps, rel=REL)
    per_group = np.zeros_like(c32.bwd_s)
    for c, g in enumerate(cq.chunk_group.tolist()):
        per_group[:, g] += cq.quant_s[:, c]
    assert cq.bwd_s == pytest.approx(c32.bwd_s + per_group, rel=REL, abs=1e-18)
    # ... and the shard's pass joins the aggregation of each arrival
    assert cq.agg_s == pytest.approx(c32.agg_s + cq.dequant_s, rel=REL, abs=1e-18)


# -- policies -----------------------------------------------------------------------------


@pytest.mark.parametrize("bits", BIT_WIDTHS)
def test_fixed_returns_its_bits(bits: int) -> None:
    pol = Fixed(bits)
    assert isinstance(pol, QuantizationPolicy)
    assert [pol.bits(k, [10.0 - k] * k) for k in range(5)] == [bits] * 5
    assert Fixed().bits(0, []) == 32


def test_relative_loss_fall() -> None:
    assert relative_loss_fall([5.0, 4.0], 3) is None  # fewer than window observations
    # the last 3 of [9, 10, 8, 5]: (10 - 5) / 10
    assert relative_loss_fall([9.0, 10.0, 8.0, 5.0], 3) == 0.5
    assert relative_loss_fall([0.0, 1.0], 2) == 0.0  # zero start: flat
    assert relative_loss_fall([-2.0, -3.0], 2) == 0.5  # |L[-window]| in the denominator
    assert relative_loss_fall([4.0, 5.0], 2) == -0.25  # a rising loss
    with pytest.raises(ValueError):
        relative_loss_fall([1.0], 1)


def test_level_index_bands() -> None:
    # coarse 0.2, fine 0.02, 5 levels: 3 middle bands of width 0.06:
    # (0.14, 0.2) -> 1, (0.08, 0.14) -> 2, (0.02, 0.08) -> 3
    idx = [level_index(r, 0.2, 0.02, 5) for r in (0.5, 0.2, 0.19, 0.15, 0.13, 0.09, 0.07, 0.03, 0.02, -1.0)]
    assert idx == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert level_index(math.nan, 0.2, 0.02, 5) == 4
    # two levels: only the coarse threshold matters
    assert [level_index(r, 0.2, 0.02, 2) for r in (0.3, 0.1, 0.01)] == [0, 1, 1]


# Scripted loss trace, window 3: r_k = (L[k-2] - L[k]) / L[k-2].
TRACE = [10.0, 8.0, 6.0, 5.0, 4.5, 4.2, 4.0, 3.9, 3.85, 3.84, 3.9, 3.0, 2.9]
#  k:     0     1     2     3     4     5     6     7     8      9     10    11    12
#  r:     -     -    0.4  0.375 0.25  0.16 0.111 0.0714 0.0375 0.0154 -0.013 0.219 0.256
# coarse 0.2, fine 0.02; with (2, 4, 8, 16, 32) the middle bands are (0.14, 0.2) -> 4,
# (0.08, 0.14] -> 8, (0.02, 0.08] -> 16; before 3 observations the coarsest (2).
RAW_5 = [2, 2, 2, 2, 2, 4, 8, 16, 16, 32, 32, 2, 2]
MONO_5 = [2, 2, 2, 2, 2, 4, 8, 16, 16, 32, 32, 32, 32]
# with (4, 8, 16, 32): two middle bands of 0.09: (0.11, 0.2) -> 8, (0.02, 0.11] -> 16;
# r_6 = 0.5 / 4.5 = 0.111.. is in the 8 band.
MONO_4 = [4, 4, 4, 4, 4, 8, 8, 16, 16, 32, 32, 32, 32]


def test_adaptive_rule_on_a_scripted_loss_trace() -> None:
    mono = Adaptive(window=3, coarse_threshold=0.2, fine_threshold=0.02, levels=(2, 4, 8, 16, 32))
    raw = Adaptive(window=3, coarse_threshold=0.2, fine_threshold=0.02, levels=(2, 4, 8, 16, 32),
                   monotone=False)
    four = Adaptive(window=3, coarse_threshold=0.2, fine_threshold=0.02, levels=(4, 8, 16, 32))
    assert isinstance(mono, QuantizationPolicy)
    assert [mono.bits(k, TRACE[:k + 1]) for k in range(len(TRACE))] == MONO_5
    assert mono.trace(TRACE) == MONO_5
    assert raw.trace(TRACE) == RAW_5
    assert four.trace(TRACE) == MONO_4
    # the monotone width is the running maximum of the raw one (from the first full window)
    assert MONO_5 == [max(RAW_5[2:k + 1]) if k >= 2 else 2 for k in range(len(TRACE))]
    # step is not used: the history alone decides
    assert mono.bits(1000, TRACE) == adaptive_bits(TRACE, mono) == 32


def test_adaptive_start_nan_and_validation() -> None:
    pol = Adaptive(window=3, coarse_threshold=0.2, fine_threshold=0.02, initial_bits=8)
    # 8 until a full window exists; the placeholder does not hold the monotone width up
    assert pol.trace([10.0, 8.0, 6.0]) == [8, 8, 2]
    # a NaN or infinite loss (diverged) anywhere in the window counts as flat: finest, and the
    # monotone width stays there; the non-monotone rule recovers once the window is clean
    assert pol.trace([10.0, math.nan, 5.0, 2.0, 1.0]) == [8, 8, 32, 32, 32]
    raw = Adaptive(window=3, coarse_threshold=0.2, fine_threshold=0.02, initial_bits=8, monotone=False)
    assert raw.trace([10.0, math.inf, 5.0, 2.0, 1.0]) == [8, 8, 32, 32, 2]
    for bad in (dict(window=1), dict(coarse_threshold=0.01, fine_threshold=0.02),
                dict(levels=(8,)), dict(levels=(8, 4)), dict(levels=(4, 4, 8)), dict(levels=(3, 8)),
                dict(initial_bits=16, levels=(2, 8, 32)), dict(fine_threshold=math.nan)):
        with pytest.raises(ValueError):
            Adaptive(**bad)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(trace=st.lists(st.floats(0.01, 100.0), min_size=0, max_size=30), window=st.integers(2, 6))
def test_monotone_adaptive_is_the_running_maximum_and_never_coarsens(trace: list[float], window: int) -> None:
    mono = Adaptive(window=window, coarse_threshold=0.1, fine_threshold=0.01)
    raw = Adaptive(window=window, coarse_threshold=0.1, fine_threshold=0.01, monotone=False)
    got, r = mono.trace(trace), raw.trace(trace)
    assert all(b in mono.levels for b in got)
    tail = got[window - 1:]
    assert tail == sorted(tail)
    assert tail == [max(r[window - 1:k + 1]) for k in range(window - 1, len(trace))]
