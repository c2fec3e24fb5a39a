"""Measure a device: microbenchmarks, per-layer times of the zoo models, the network.

``hetsim profile --device cpu|cuda:N [--quick] --out FILE`` calls
:func:`run_profile`, which

1. times GEMMs over a grid of shapes (fp32; on GPUs in every math mode the GPU
   has, :mod:`calibration.profiler.modes`), memory copies
   and elementwise adds (bandwidth), a one-element add (dispatch overhead) and,
   on GPUs, host-device copies (:mod:`calibration.profiler.ops`). These are
   timed with ``torch.profiler`` (one ``record_function`` range per repeat; the
   range's duration is the sample) on CPUs and with CUDA events on GPUs;
2. times single-layer modules (Linear, Conv2d, Embedding/EmbeddingBag and a
   sparse gradient scatter-add, MultiheadAttention, norms and activations) and
   every zoo model at several batch sizes, forward and backward per layer (see
   :class:`~calibration.profiler.layers.LayerTimer`); on a GPU instead the GEMMs,
   convolutions and attention among them at GPU batch sizes in every math mode, a
   layout pair, and the zoo models only when asked for
   (:mod:`calibration.profiler.gpu`, which records what a GPU skips and why);
3. times the runtime's gradient quantization
   (:mod:`calibration.profiler.quantization`) and, on CPUs, small calls right
   after passes that streamed memory (:mod:`calibration.profiler.cold`);
4. measures point-to-point and all-reduce latency and bandwidth between two
   processes over ``torch.distributed`` (gloo; NCCL on GPUs), see
   :mod:`calibration.profiler.network`;
5. fits the efficiency curves (:mod:`calibration.calibrate`; a GPU's per-mode tables:
   :mod:`calibration.gpu_fit`) and writes a
   :class:`~hardware_profiles.schema.DeviceProfile` with ``source.kind =
   "measured"``, the per-layer tables, the raw measurements and their spread
   (:mod:`calibration.profiler.profile`).

Each benchmark registers itself by name in one registry
(:mod:`calibration.profiler.registry`: what it measures, how it runs, which
``raw`` keys it writes); :func:`measure` runs every registered benchmark that
applies to the run. How items are timed, in interleaved rounds, and what a
figure is: :mod:`calibration.profiler.timing`.
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from calibration import model_variants

# A benchmark module registers its benchmarks when imported: cold, gpu, layers, network
# and quantization are imported for their functions below too, ops for that alone.
from calibration.profiler import ops as _ops  # noqa: F401
from calibration.profiler.cold import COLD_MOVED_MIB, COLD_REPS, cold_bench, cold_calls
from calibration.profiler.device import check_device, check_writable, describe_device, setup_host
from calibration.profiler.drift import _DriftProbe, drift_line
from calibration.profiler.gpu import GPU_MODELS, gpu_spec
from calibration.profiler.layers import LayerTimer, measure_micro, measure_models, training_loss
from calibration.profiler.modes import device_modes
from calibration.profiler.network import (
    handoff_rtts,
    network_bench,
    wake_bench,
    wire_bench,
    wire_figures,
)
from calibration.profiler.profile import build_profile, summary, write_profile
from calibration.profiler.quantization import quant_bench, quant_costs
from calibration.profiler.registry import Benchmark, Run, registered
from calibration.profiler.spec import _ALL_MICRO, _EXTRA_MICRO, ProfileSpec, spec_for
from calibration.profiler.timing import (
    ROUNDS_QUANTILE,
    _OpTimer,
    _Progress,
    _rounds_quantile,
    _run_rounds,
    statistic_of,
    time_callable,
)
from hardware_profiles import load_profile_file
from hardware_profiles.errors import ConfigError, HetsimError
from hardware_profiles.schema import DeviceProfile, Source
from sim import zoo

__all__ = [
    "COLD_MOVED_MIB",
    "COLD_REPS",
    "ROUNDS_QUANTILE",
    "LayerTimer",
    "ProfileSpec",
    "add_micro",
    "build_profile",
    "gpu_spec",
    "check_device",
    "check_writable",
    "cold_bench",
    "cold_calls",
    "describe_device",
    "drift_line",
    "handoff_rtts",
    "measure",
    "measure_micro",
    "measure_models",
    "network_bench",
    "quant_bench",
    "quant_costs",
    "run_profile",
    "setup_host",
    "spec_for",
    "statistic_of",
    "summary",
    "time_callable",
    "training_loss",
    "wake_bench",
    "wire_bench",
    "wire_figures",
    "write_profile",
]


def _unknown_model(text: str) -> bool:
    """Whether ``text`` is neither a zoo model nor a variant of one (:mod:`calibration.model_variants`)."""
    try:
        model_variants.parse(text)
    except ValueError:
        return True
    return False


def measure(device: str = "cpu", quick: bool = False, threads: int | None = None,
            models: Sequence[str] | None = None, network: bool = True,
            spec: ProfileSpec | None = None, progress: bool = False,
            drift: bool = True, rounds: int | None = None) -> dict[str, Any]:
    """Run every registered benchmark that applies (:mod:`calibration.profiler.registry`)
    and return the raw measurements (JSON-ready).

    Args:
        device: 'cpu' or 'cuda:N'.
        quick: the small spec (see :func:`spec_for`; on a GPU :func:`gpu_spec`), unless
            ``spec`` is given.
        threads: torch intra-op threads (default: the CPUs this process may use).
        models: zoo models to time (default: the spec's; on a GPU none, as their
            per-layer tables would be of one math mode: asked for, they are timed at
            the spec's batch sizes and make no tables).
        network: run the two-process network benchmark. Should it fail (it runs
            last; any exception but Ctrl-C), the rest is returned all the same,
            with its error in ``raw["network_error"]`` and the network part missing
            or partial.
        spec: sizes to use instead of :func:`spec_for`.
        progress: show a progress bar on stderr.
        drift: time the drift probe after every step (:class:`_DriftProbe`,
            ``raw["drift"]``).
        rounds: take the repeats of the GEMM grid, bandwidth, dispatch,
            single-layer benchmarks and zoo models in this many interleaved
            rounds (:func:`_run_rounds`; default the spec's), each figure then
            the :data:`ROUNDS_QUANTILE`-th percentile of its samples (the median
            with one round); the quantization, host-device, network and (on a
            CPU) cold-call benchmarks run once.
    """
    # an unavailable device is reported before a bad model name
    cuda = check_device(device).type == "cuda"
    spec = spec or (gpu_spec(quick) if cuda else spec_for(quick))
    if cuda:
        unknown = sorted(set(models or ()) - set(zoo.names()))
        chosen = {m: spec.models.get(m) or GPU_MODELS[m] for m in models or () if not unknown}
    else:
        chosen = {m: spec.models[m] for m in (models if models is not None else spec.models)}
        unknown = sorted(m for m in chosen if _unknown_model(m))
    if unknown:
        raise ConfigError("<command line>", "--models", f"unknown zoo model {unknown[0]!r}")
    rounds = spec.rounds if rounds is None else rounds
    if rounds < 1:
        raise ConfigError("<command line>", "--rounds", f"must be at least 1, got {rounds}")
    dev, host = setup_host(device, threads)
    dtypes = device_modes(dev) if cuda else ("fp32",)
    run = Run(device, dev, spec, _OpTimer(dev, spec), dtypes, chosen, quick, network)
    benches = [b for b in registered() if b.applies(run)]
    started = time.perf_counter()
    probe = _DriftProbe(dev, started) if drift else None
    bar = _Progress(sum(b.steps(run, rounds) for b in benches), progress,
                    probe.sample if probe is not None else None)
    raw: dict[str, Any] = {"device": host["device"], "threads": host["threads"], "quick": quick,
                           "clock": host["clock"], "statistic": statistic_of(rounds),
                           "host_allocator": host["host_allocator"], "cpus": host["cpus"],
                           "rounds": rounds}
    try:
        raw.update(_sampled(run, [b for b in benches if b.build is not None], bar, rounds))
        for b in benches:
            if b.run is not None:
                raw.update(b.checked(b.run(run)))
                bar.step(b.label)
    finally:
        bar.close()
    if probe is not None:
        raw["drift"] = probe.record()
    raw["wall_s"] = round(time.perf_counter() - started, 1)
    return raw


def _sampled(run: Run, benches: Sequence[Benchmark], bar: _Progress, rounds: int) -> dict[str, Any]:
    """The sampled benchmarks' raw entries: every item of every benchmark built first
    (and kept until the last round), then sampled together in ``rounds`` rounds
    (:func:`~calibration.profiler.timing._run_rounds`)."""
    bar.note("building the benchmarks and models")
    built = [(b, b.build(run)) for b in benches if b.build is not None]
    _run_rounds([g for _, s in built for g in s.groups], rounds, bar)
    q = _rounds_quantile(rounds)
    out: dict[str, Any] = {}
    for b, s in built:
        out.update(b.checked(s.finish(q)))
    return out


def run_profile(device: str, out: str | os.PathLike[str], quick: bool = False,
                threads: int | None = None, models: Sequence[str] | None = None,
                network: bool = True, progress: bool = True,
                spec: ProfileSpec | None = None, rounds: int | None = None
                ) -> tuple[DeviceProfile, Path]:
    """``hetsim profile``: measure ``device``, fit, and write the profile to ``out``.

    The profile's name is the stem of ``out``. The device and the output path
    are checked before anything is measured.

    Raises:
        ConfigError: for an unavailable device or an unwritable ``out``.
        HetsimError: when the network benchmark fails; every other measurement is
            written to ``out`` first (fitted), the network part missing or partial.
    """
    check_device(device)
    path = check_writable(out)
    raw = measure(device, quick=quick, threads=threads, models=models, network=network,
                  spec=spec, progress=progress, rounds=rounds)
    raw.update(describe_device(check_device(device)))
    try:
        profile = build_profile(raw, path.stem)
    except Exception:
        # keep what was measured: the profile unfitted (raw data, per-layer tables),
        # which `hetsim calibrate` fits once the fault is mended
        write_profile(build_profile(raw, path.stem, fit=False), path)
        print(f"hetsim profile: the fit failed; the measurements are kept, unfitted, in {path} "
              f"(fit them with: hetsim calibrate {path})"
              + (f"; {raw['network_error']}" if raw.get("network_error") else ""), file=sys.stderr)
        raise
    write_profile(profile, path)
    if raw.get("network_error"):
        kept = ("with part of the network measurements" if "network" in raw
                else "without the network part")
        raise HetsimError(f"{raw['network_error']}; every other measurement is kept in {path}, "
                          f"fitted, {kept}")
    return profile, path


def add_micro(path: str | os.PathLike[str], names: Sequence[str], device: str | None = None,
              threads: int | None = None, progress: bool = True
              ) -> tuple[DeviceProfile, list[dict[str, Any]]]:
    """Measure single-layer benchmarks into a measured profile, refit it, write it back.

    Times ``names`` (single-layer benchmarks of the grid, :data:`_ALL_MICRO`, or of
    :data:`_EXTRA_MICRO`, and
    ``"cold"``, the cold-call benchmark :func:`cold_bench` of a CPU profile, which
    goes to ``raw.cold``; ``["missing"]``: those of the grid, and ``cold``, that the
    profile lacks) as
    :func:`measure` does, with the profile's own settings: its device, torch
    threads (hence clock) and repeat counts (``raw.quick``), on the host that
    measured it.
    Each entry replaces the one of its name in ``raw.micro`` or is added after
    them; ``raw.micro_note`` gets a line saying which entries were measured when
    (UTC), ``source.note`` a pointer to it. The curves are then re-fitted
    (:func:`calibration.calibrate.calibrate`, which keeps the per-layer
    tables); ``peak_flops`` and ``mem_bw_Bps`` stay as measured with the profile.

    Returns:
        (the written profile, the new entries: ``raw.micro``'s, and for ``"cold"``
        ``raw.cold`` with ``"name": "cold"``); with nothing to measure, (the
        profile as loaded, []), and nothing is written.

    Raises:
        ConfigError: the file is not a measured profile with raw single-layer
            benchmarks, a name is not one of the grid, ``cold`` is asked of a GPU
            profile, ``device`` or ``threads`` differ from the profile's, or this
            host, its CPU or torch are not those the profile was measured on.
    """
    from calibration import calibrate

    shown = os.fspath(path)
    prof = load_profile_file(path)
    raw = dict(prof.measurement.raw or {})
    if "gpu" in raw:
        raise ConfigError(shown, "measurement.raw.gpu", "a GPU profile's single-layer benchmarks "
                          "are per math mode: measure the profile again (hetsim profile --device cuda:N)")
    if prof.source.kind != "measured" or "micro" not in raw:
        raise ConfigError(shown, "measurement.raw.micro", "no single-layer benchmarks to add to (make the "
                          "profile with hetsim profile)")
    have = [e["name"] for e in raw["micro"]] + (["cold"] if "cold" in raw else [])
    on_cpu = str(raw["device"]).startswith("cpu")
    todo = ([n for n in (*_ALL_MICRO, *(["cold"] if on_cpu else [])) if n not in have]
            if list(names) == ["missing"] else list(dict.fromkeys(names)))
    if "cold" in todo and not on_cpu:
        raise ConfigError("<command line>", "--add-micro", "'cold' is a CPU benchmark (a GPU's "
                          "passes do not flush the host's caches)")
    unknown = [n for n in todo if n not in (*_ALL_MICRO, *_EXTRA_MICRO) and n != "cold"]
    if unknown:
        raise ConfigError("<command line>", "--add-micro", f"{unknown[0]!r} is not a single-layer "
                          "benchmark of the grid")
    for flag, given, own in (("--device", device, raw["device"]),
                             ("--threads", threads, raw["threads"])):
        if given is not None and str(given) != str(own):
            raise ConfigError("<command line>", flag, f"{given} differs from the profile's {own}")
    dev, host = setup_host(str(raw["device"]), int(raw["threads"]))
    here = {**host, **describe_device(dev)}
    for key in ("clock", "host_allocator", "device_name", "torch", "cpu_capability", "host"):
        if key in raw and here[key] != raw[key]:
            raise ConfigError(shown, f"measurement.raw.{key}", f"measured with {raw[key]!r}, here {here[key]!r}: "
                              "re-measure the whole profile instead")
    if not todo:  # nothing missing: the profile stays as it is
        return prof, []
    spec = spec_for(bool(raw.get("quick")))
    rounds = int(raw.get("rounds", 1))
    layers = [n for n in todo if n != "cold"]
    start = _dt.datetime.now(_dt.UTC)
    bar = _Progress(len(layers) * rounds + int("cold" in todo), progress)
    try:
        new = measure_micro(layers, dev, spec, bar, rounds=rounds) if layers else []
        if "cold" in todo:
            raw["cold"] = cold_bench(dev)
            bar.step("cold calls")
    finally:
        bar.close()
    end = _dt.datetime.now(_dt.UTC)
    by_name = {e["name"]: e for e in new}
    merged = [by_name.pop(e["name"], e) for e in raw["micro"]] + list(by_name.values())
    replaced = sorted(set(todo) & set(have))
    line = (f"{', '.join(todo)}: measured {start:%Y-%m-%d %H:%M} - {end:%Y-%m-%d %H:%M} UTC by "
            f"hetsim profile --add-micro ({raw['threads']} thread(s), clock {raw['clock']}, the "
            f"{'quick' if raw.get('quick') else 'full'} spec's repeats in "
            f"{rounds} round(s)) and merged into this "
            "profile's raw.micro" + (f" (cold: raw.cold, {COLD_REPS} cases a size in one pass)"
                                     if "cold" in todo else "")
            + (f", replacing the earlier {', '.join(replaced)}" if replaced else "")
            + "; the curves re-fitted.")
    raw.update(micro=merged, micro_note="\n".join(x for x in (raw.get("micro_note"), line) if x))
    source = prof.source.model_dump()
    pointer = "Single-layer benchmarks measured after the rest: see raw.micro_note."
    if pointer not in source["note"]:
        source["note"] = f"{source['note']} {pointer}".strip()
    updated = prof.model_copy(update={"measurement": prof.measurement.model_copy(update={"raw": raw}),
                                      "source": Source.model_validate(source)})
    fitted = calibrate.calibrate(updated).profile
    write_profile(fitted, path)
    return fitted, new + ([{"name": "cold", **raw["cold"]}] if "cold" in todo else [])
