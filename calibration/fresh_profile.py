"""``hetsim validate CONFIG --fresh-profile FILE``: this machine's profile, measured now.

The committed profile of a validation config (``this_machine``) was measured on
one machine; on another machine, even one of the same kind, its figures are not
this machine's. A fresh profile measures, here, what the DES needs of the
machine to simulate the runtime's ranks on it: the CPU's compute (GEMM grid,
bandwidth, dispatch, single-layer benchmarks and, per layer, the models the runs
to validate train, as built there (``runtime.model_kwargs``: variants,
:mod:`calibration.model_variants`) at half, once and twice their batch shares;
:data:`FRESH_MODELS` at the quick spec's sizes where the caller names none), with
the runtime's torch threads)
and the loopback path between two processes (point-to-point and all-reduce
latency and bandwidth, the wake-up latency of a busy host and the runtime's own
pull and push rates), fitted as ``hetsim profile`` fits any profile. It is the
quick spec of :func:`calibration.profiler.spec_for` (a few minutes on 2 cores), its
repeats taken in :data:`FRESH_ROUNDS` interleaved rounds as a full profile takes them
(each figure the 20th percentile of samples spread over the whole run): timed back to
back, one item lands in whatever speed state the machine held for those few
milliseconds, and the runtime's model, the reference of the speed factor
(:mod:`calibration.speed_now`), came out 1.2-1.6 times slow in 3 of 6 fresh profiles
(docs/notes/2026-12-08-fresh-profile-rounds.md).

What it does not measure: the runtime CPU model (``network.runtime_cpu``), fitted
to real runs of the calibration configs, which ``hetsim validate --fresh-profile``
adds to the file next (:func:`experiments.runtime_calibration.fresh_machine`).

When FILE exists it is reused as it is (a suite measures once), provided it is a
measured CPU profile taken with the threads the runtime's ranks use.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from hardware_profiles import load_profile_file
from hardware_profiles.errors import ConfigError
from hardware_profiles.schema import DeviceProfile

#: The zoo models whose layers a fresh profile times: those of the validation configs
#: (experiments/configs/validation/); another model is priced by the fitted curves.
FRESH_MODELS = ("mlp", "ctr_dnn", "wide_deep", "resnet18", "transformer")
#: interleaved rounds of a fresh profile's repeats (``ProfileSpec.rounds``)
FRESH_ROUNDS = 4


def fresh_profile(path: str | os.PathLike[str], threads: int, progress: bool = True,
                  models: dict[str, tuple[int, ...]] | None = None) -> tuple[DeviceProfile, bool]:
    """This machine's profile in ``path``: ``(profile, measured)``, ``measured`` False where
    ``path`` existed and was reused, True where it was measured now and written there.
    ``models``: the zoo models and variants (:mod:`calibration.model_variants` labels) to
    time per layer, each at its batch sizes, in place of :data:`FRESH_MODELS` at the quick
    spec's (the models the runs to validate train, at their batch shares).

    Raises:
        ConfigError: ``path`` exists but is not a profile, not a measured CPU one, or was
            measured with other torch threads than ``threads`` (the runtime's); or it cannot
            be written (one line naming the file and the field).
    """
    p = Path(path)
    if p.exists():
        prof = load_profile_file(p)
        raw = (prof.measurement.raw if prof.measurement is not None else None) or {}
        if prof.source.kind != "measured" or not str(raw.get("device", "")).startswith("cpu"):
            raise ConfigError(str(p), "measurement.raw.device", "not a CPU profile measured by hetsim profile: "
                              "give --fresh-profile a new file to measure this machine into")
        if raw.get("threads") != threads:
            raise ConfigError(str(p), "measurement.raw.threads", f"measured with {raw.get('threads')} torch "
                              f"thread(s), the runtime's ranks use {threads} (runtime.threads): give "
                              "--fresh-profile another file")
        return prof, False
    from calibration import profiler

    spec = dataclasses.replace(profiler.spec_for(True), rounds=FRESH_ROUNDS)
    if models:
        spec = dataclasses.replace(spec, models=dict(models))
    prof, _ = profiler.run_profile("cpu", p, quick=True, threads=threads,
                                   models=list(models) if models else FRESH_MODELS, progress=progress, spec=spec)
    return prof, True
