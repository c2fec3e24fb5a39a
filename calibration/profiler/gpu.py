"""A GPU's own benchmarks: the ``gpu``, ``micro_by_mode`` and ``layout`` benchmarks, and
the sizes of a GPU run (:func:`gpu_spec`).

On a CUDA device (``hetsim profile --device cuda:N``) the profiler times, besides the
GEMM grid in every math mode, the bandwidth copies, the dispatch loop and the
host-device copies of :mod:`calibration.profiler.ops`:

- ``gpu``: the device record ``raw["gpu"]``: compute capability, SMs, memory, L2, the
  math modes it has (:mod:`calibration.profiler.modes`) and the fallback of the others,
  what each mode sets, and what the profiler skipped on the GPU and why (:data:`SKIPPED`);
- ``micro_by_mode``: the spec's single-layer benchmarks at GPU batch sizes
  (:data:`GPU_BATCHES`) in every math mode: ``raw["micro_by_mode"][mode]``, each entry as
  a ``raw["micro"]`` entry plus its ``memory_format``. In fp16 and bf16 the
  convolutions run in channels_last, the layout tensor-core kernels take, so that their
  times are free of layout transposes (``layout`` measures those);
- ``layout``: a half-precision 3x3 convolution (:data:`LAYOUT_CONV` at batch
  :data:`LAYOUT_BATCH`), forward and backward, in contiguous and in channels_last
  layout: ``raw["layout"]``, from which ``hetsim calibrate`` fits
  ``corrections.layout_transpose`` (:mod:`calibration.gpu_fit`).

Everything is timed with CUDA events (:class:`~calibration.profiler.timing._OpTimer`),
after a warm-up, without a host sync inside the timed repeats, cuDNN's benchmark mode on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from calibration.profiler.layers import _micro_entries, _micro_layers, _ModelTimer, micro_record
from calibration.profiler.modes import HALF_MODES, SETTINGS, InMode, fallbacks
from calibration.profiler.registry import Benchmark, Run, Sampled, register
from calibration.profiler.spec import ProfileSpec, spec_for
from calibration.profiler.timing import _OpItem

#: The single-layer benchmarks a GPU times in every math mode: the GEMMs, convolutions and
#: attention of the grid (the op classes whose efficiency a GPU profile has per mode),
#: without the skinny GEMMs of 1-4 rows (memory-bound on a GPU: they measure no math mode).
GPU_MICRO = (
    "linear_1024x1024", "linear_4096x1024", "linear_512x4096",
    "conv_3x64_k7s2_224", "conv_64x64_k3_56", "conv_128x128_k3_28", "conv_256x256_k3_14",
    "conv_512x512_k3_7", "conv_64x256_k1_56", "conv_256x64_k1_56",
    "mha_512h8_seq128", "mha_768h12_seq256", "mha_768h12_seq256_drop",
)

#: Those of a ``--quick`` run (within about two minutes on a GPU with the rest: every
#: convolution pays cuDNN's algorithm search once per shape and mode).
GPU_MICRO_QUICK = ("linear_1024x1024", "linear_4096x1024", "conv_3x64_k7s2_224", "conv_64x64_k3_56",
                   "conv_256x256_k3_14", "conv_64x256_k1_56", "mha_768h12_seq256", "mha_768h12_seq256_drop")

#: Their batch sizes on a GPU (rows of a Linear, images of a convolution, sequences of an
#: attention): sizes of training, which fill a GPU as the CPU's batches of 1-8 do not.
GPU_BATCHES: dict[str, tuple[int, ...]] = {
    **{n: (512, 8192) for n in GPU_MICRO if n.startswith("linear")},
    **{n: (16, 64) for n in GPU_MICRO if n.startswith("conv")},
    **{n: (8, 64) for n in GPU_MICRO if n.startswith("mha")},
}

#: The GEMM grid on a GPU: up to 8192^3, the large-GEMM rate a GPU not in
#: calibration.gpu_fit.KNOWN_GPUS takes as its peak.
GPU_GEMM = ((256, 256, 256), (1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192),
            (64, 4096, 4096), (8192, 1024, 1024))

#: fp32 elements of the bandwidth copies on a GPU: the largest (512 MB a buffer) far past
#: any GPU's L2, whose rate is the memory's.
GPU_COPY = (1_000, 1_000_000, 16_000_000, 128_000_000)

#: Batch sizes of the zoo models on a GPU, timed only when asked for (``--models``).
GPU_MODELS: dict[str, tuple[int, ...]] = {
    "mlp": (256, 2048), "ctr_dnn": (512, 4096), "wide_deep": (512, 4096), "resnet18": (32, 128),
    "resnet50": (32, 128), "vgg16": (16, 64), "transformer": (16, 64), "bert_base": (8, 32),
    "bert_large": (4, 16),
}

#: The convolution of the layout pair and its batch (ResNet-50's first 3x3 stage).
LAYOUT_CONV = "conv_64x64_k3_56"
LAYOUT_BATCH = 64

#: What a CPU profile measures that a GPU profile does not, and why (``raw["gpu"]["skipped"]``).
SKIPPED = {
    "cold": "the cold-call benchmark measures the host CPU's caches after a pass that streamed "
            "memory; a GPU's passes do not flush them",
    "micro": "replaced by micro_by_mode: the single-layer benchmarks at GPU batch sizes in every "
             "math mode",
    "models": "per-layer tables hold one precision's times and would price every math mode alike; "
              "a GPU profile is priced by its fitted tables (zoo models run only when asked for "
              "with --models, and make no tables)",
    "network.wake": "the wake-up latency of the runtime's loopback ranks (pinned busy cores) is "
                    "a host CPU figure",
    "network.wire": "the runtime's per-byte message costs on the loopback are a host CPU figure",
    "threads": "CUDA events time the GPU: no thread clock (one intra-op thread), no thread "
               "pinning",
}


def gpu_spec(quick: bool) -> ProfileSpec:
    """The sizes of a GPU run: :func:`~calibration.profiler.spec.spec_for`'s repeats,
    rounds and network sizes, with the GPU's GEMM grid, bandwidth sizes, single-layer
    benchmarks (:data:`GPU_MICRO`, quick: :data:`GPU_MICRO_QUICK`) and their batches, and
    the zoo models' GPU batches (:data:`GPU_MODELS`; on a GPU none is timed unless asked
    for, :data:`SKIPPED`)."""
    return replace(spec_for(quick), gemm=GPU_GEMM, copy_elems=GPU_COPY,
                   micro=GPU_MICRO_QUICK if quick else GPU_MICRO, models=dict(GPU_MODELS),
                   batches=dict(GPU_BATCHES))


def _on_gpu(run: Run) -> bool:
    return bool(run.dev.type == "cuda")


def skipped(run: Run) -> dict[str, str]:
    """The entries of :data:`SKIPPED` that apply to ``run``."""
    out = {k: v for k, v in SKIPPED.items() if not k.startswith("network.") and k != "models"}
    if not run.models:
        out["models"] = SKIPPED["models"]
    if run.network:
        out.update({k: v for k, v in SKIPPED.items() if k.startswith("network.")})
    return dict(sorted(out.items()))


def describe_gpu(run: Run) -> dict[str, Any]:
    """``raw["gpu"]``: the device's record (see the module docstring)."""
    import torch

    p = torch.cuda.get_device_properties(run.dev)
    l2 = getattr(p, "L2_cache_size", None)
    return {"name": str(p.name), "capability": [int(p.major), int(p.minor)],
            "sms": int(p.multi_processor_count), "total_memory": float(p.total_memory),
            "l2_bytes": None if l2 is None else int(l2), "modes": list(run.dtypes),
            "fallback": fallbacks(run.dtypes), "settings": {m: SETTINGS[m] for m in run.dtypes},
            "cudnn_benchmark": True, "skipped": skipped(run)}


def _micro_by_mode(run: Run) -> Sampled:
    """The spec's single-layer benchmarks in every math mode, one progress group per
    (benchmark, mode), the modes of one benchmark next to each other."""
    import torch

    timers: dict[str, list[tuple[str, dict[str, Any], list[tuple[int, Any]]]]] = {m: [] for m in run.dtypes}
    formats: dict[tuple[str, str], str] = {}
    groups: list[tuple[str, Sequence[Any]]] = []
    for name in run.spec.micro:
        record = micro_record(name)
        for mode in run.dtypes:
            module, make, batches = _micro_layers(name, run.dev)
            module = module.to(run.dev).train()
            last = mode in HALF_MODES and isinstance(module, torch.nn.Conv2d)
            if last:
                module = module.to(memory_format=torch.channels_last)
            runs = []
            for b in run.spec.batches.get(name, batches):
                x = make(b)
                if last:
                    x = x.detach().to(memory_format=torch.channels_last).requires_grad_()
                runs.append((b, InMode(_ModelTimer(module, x, run.dev, run.spec), mode, run.dev.type)))
            timers[mode].append((name, record, runs))
            formats[(mode, name)] = "channels_last" if last else "contiguous"
            groups.append((f"layer {name} {mode}", [t for _, t in runs]))

    def finish(q: float) -> dict[str, Any]:
        return {"micro_by_mode": {
            mode: [{**e, "memory_format": formats[(mode, e["name"])]} for e in _micro_entries(ts, q)]
            for mode, ts in timers.items()}}

    return Sampled(groups, finish)


def _layout(run: Run) -> Sampled:
    """:data:`LAYOUT_CONV` at :data:`LAYOUT_BATCH`, forward and backward on half-precision
    activations (fp16 where the GPU has it, else bf16) under autocast, in contiguous and in
    channels_last layout: two items, one progress group."""
    import torch

    mode = "fp16" if "fp16" in run.dtypes else "bf16"
    dtype = torch.float16 if mode == "fp16" else torch.bfloat16
    items = {}
    for fmt, mf in (("contiguous", torch.contiguous_format), ("channels_last", torch.channels_last)):
        conv = _micro_layers(LAYOUT_CONV, run.dev)[0].to(run.dev).train().to(memory_format=mf)
        hw = int(LAYOUT_CONV.rsplit("_", 1)[1])  # a 3x3 at stride 1, padding 1: output hw x hw
        x = torch.randn(LAYOUT_BATCH, conv.in_channels, hw, hw, device=run.dev, dtype=dtype)
        x = x.to(memory_format=mf).requires_grad_()
        g = torch.randn(LAYOUT_BATCH, conv.out_channels, hw, hw, device=run.dev, dtype=dtype)
        g = g.to(memory_format=mf)

        def step(conv: Any = conv, x: Any = x, g: Any = g) -> None:
            x.grad, conv.weight.grad = None, None
            conv(x).backward(g)

        items[fmt] = InMode(_OpItem(run.timer, step, f"layout_{fmt}"), mode, run.dev.type)

    def finish(q: float) -> dict[str, Any]:
        out: dict[str, Any] = {"name": LAYOUT_CONV, "model": micro_record(LAYOUT_CONV),
                               "batch": LAYOUT_BATCH, "mode": mode, "phases": 2}
        for fmt, item in items.items():
            out[f"{fmt}_s"], out[f"{fmt}_rel_iqr"] = item.figures(q)
        return {"layout": out}

    return Sampled([("layout pair", list(items.values()))], finish)


register(Benchmark(
    "gpu", "the GPU's record: capability, SMs, memory, math modes and their settings, what is "
    "skipped on a GPU", ("gpu",), order=5, run=lambda run: {"gpu": describe_gpu(run)},
    label="GPU record", applies=_on_gpu))
register(Benchmark(
    "micro_by_mode", "the single-layer benchmarks at GPU batch sizes in every math mode",
    ("micro_by_mode",), order=45, build=_micro_by_mode,
    groups=lambda run: len(run.spec.micro) * len(run.dtypes), applies=_on_gpu))
register(Benchmark(
    "layout", "a half-precision 3x3 convolution in contiguous and channels_last layout",
    ("layout",), order=46, build=_layout, groups=lambda run: 1,
    applies=lambda run: _on_gpu(run) and any(m in HALF_MODES for m in run.dtypes)))
