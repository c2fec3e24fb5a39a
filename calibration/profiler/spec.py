"""What one profiling run measures: :class:`ProfileSpec`, the single-layer benchmark grid
and the sizes of a ``--quick`` or a full run (:func:`spec_for`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ProfileSpec:
    """Sizes and repeat counts of one profiling run (``quick`` or full).

    Attributes:
        gemm: (m, n, k) shapes of the GEMM grid.
        copy_elems: element counts of the bandwidth benchmarks (fp32).
        micro: single-layer benchmarks, names from
            :func:`~calibration.profiler.layers._micro_layers`.
        models: zoo model -> batch sizes to time.
        min_reps, max_reps: repeats of one timed item (after one warm-up).
        target_s: time budget of one item's repeats; sets the repeat count
            between min_reps and max_reps from the warm-up's duration.
        net_bytes: message sizes of the network benchmark.
        net_reps: measured rounds of the network benchmark, every message size once
            a round (after 3 warm-up rounds).
        rounds: how many interleaved rounds the repeats are taken in (see
            :func:`~calibration.profiler.timing._run_rounds`); one: every item's
            repeats back to back.
        wake_rounds, wire_reps: round trips of the wake-up benchmark
            (:func:`~calibration.profiler.network.wake_bench`), and measured rounds
            of the wire benchmark, every size once a round
            (:func:`~calibration.profiler.network.wire_bench`).
        batches: batch sizes of single-layer benchmarks in place of their own (a GPU's
            per-mode benchmarks, :mod:`calibration.profiler.gpu`; a name not here keeps
            its own).
    """

    gemm: tuple[tuple[int, int, int], ...]
    copy_elems: tuple[int, ...]
    micro: tuple[str, ...]
    models: dict[str, tuple[int, ...]]
    min_reps: int
    max_reps: int
    target_s: float
    net_bytes: tuple[int, ...]
    net_reps: int
    warmup: int = 1
    rounds: int = 1
    wake_rounds: int = 1000
    wire_reps: int = 25
    extra: dict[str, Any] = field(default_factory=dict)
    batches: dict[str, tuple[int, ...]] = field(default_factory=dict)


_ALL_MICRO = (
    "linear_256x256", "linear_1024x1024", "linear_4096x1024", "linear_512x4096",
    # batches 1, 2, 4 (suffix _b1): a skinny GEMM (gemm/rows1, /rows2, /rows4), a kernel
    # of its own that streams its weights (4-256 MB here: in cache to well past it)
    "linear_1024x1024_b1", "linear_2048x2048_b1", "linear_4096x4096_b1", "linear_8192x8192_b1",
    "conv_3x64_k7s2_224", "conv_64x64_k3_56", "conv_128x128_k3_28", "conv_256x256_k3_14",
    "conv_512x512_k3_7", "conv_64x256_k1_56", "conv_256x64_k1_56",
    "emb_100000x16", "emb_32000x512_seq128", "embbag_1300000x1_26",
    # small tables, 32 KB - 4 MB: the backward's dense gradient of a table this size
    # costs far less than the above's 5-74 MB, and no other benchmark measures it
    "emb_500x16", "emb_3000x8", "emb_1500x32", "emb_1000x64", "emb_8000x16", "emb_4000x64",
    "emb_32000x16", "emb_16000x64", "embbag_10000x1_8", "embbag_100000x1_26",
    "embbag_500000x1_8",
    "mha_256h4_seq64", "mha_512h8_seq128", "mha_768h12_seq256",
    # the same with dropout on the attention weights (another kernel path: attention/unfused)
    "mha_256h4_seq64_drop", "mha_512h8_seq128_drop", "mha_768h12_seq256_drop",
    "relu_1m", "bn2d_64x56", "ln_512_seq128", "maxpool_64x112", "dropout_512_seq128",
)


#: Single-layer benchmarks measured only on request (``hetsim profile --add-micro``),
#: not by a profile run nor by ``--add-micro missing``: the grid's four GEMM shapes at
#: batches 16 and 32 (suffix _b16). At one intensity their efficiencies differ by
#: shape, which a curve over one variable cannot price; fitted with the grid they
#: made the leave-one-model-out bench worse (docs/notes/2026-12-06-two-probes.md).
_EXTRA_MICRO = (
    "linear_256x256_b16", "linear_1024x1024_b16", "linear_4096x1024_b16", "linear_512x4096_b16",
)


def spec_for(quick: bool) -> ProfileSpec:
    """The sizes of a ``--quick`` run (within 3 minutes on 2 CPU cores: fewer repeats,
    vgg16 at batch 1 alone, shorter network extras) or a full one (about 10 minutes
    on 2 cores)."""
    if quick:
        return ProfileSpec(
            gemm=((64, 64, 64), (256, 256, 256), (1024, 1024, 1024), (32, 1024, 1024),
                  (2048, 512, 512)),
            copy_elems=(1_000, 100_000, 16_000_000),
            micro=_ALL_MICRO,
            models={"mlp": (16, 128), "ctr_dnn": (32, 256), "wide_deep": (32, 256),
                    "resnet18": (1, 2), "resnet50": (1, 2), "vgg16": (1,),
                    "transformer": (1, 2)},
            min_reps=3, max_reps=10, target_s=0.6,
            net_bytes=(8, 65_536, 1_048_576, 4_194_304, 16_777_216), net_reps=20, wake_rounds=200, wire_reps=15,
        )
    return ProfileSpec(
        gemm=tuple((s, s, s) for s in (32, 64, 128, 256, 512, 1024, 2048))
        + ((32, 1024, 1024), (128, 4096, 1024), (2048, 512, 512), (512, 32000, 512)),
        copy_elems=(1_000, 10_000, 100_000, 1_000_000, 4_000_000, 16_000_000, 64_000_000),
        micro=_ALL_MICRO,
        models={"mlp": (16, 64, 256), "ctr_dnn": (32, 128, 512), "wide_deep": (32, 128, 512),
                "resnet18": (1, 2, 4), "resnet50": (1, 2, 4), "vgg16": (1, 2, 4),
                "transformer": (1, 2, 4)},
        min_reps=5, max_reps=40, target_s=2.0,
        net_bytes=(8, 1024, 65_536, 1_048_576, 16_777_216), net_reps=20, rounds=8,
    )
