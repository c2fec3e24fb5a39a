"""The robotics kernels timed on this machine: ``hetsim profile --suite robotics``.

:func:`profile_kernels` times every kernel of :data:`sim.robotics.kernels.KERNELS`
at several sizes with the profiler's own clocks
(:func:`calibration.profiler.time_callable`); :func:`run_profile` adds the cost
model's prediction for a device profile
(:func:`sim.robotics.kernels.compare_to_model`) and writes the record.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from calibration import profiler
from calibration.profiler import check_device, check_writable
from hardware_profiles import load_profile
from hardware_profiles.errors import ConfigError
from hardware_profiles.fileio import atomic_write
from sim.robotics.kernels import KERNELS, compare_to_model, format_comparison

__all__ = ["DEFAULT_OUT", "profile_kernels", "run_profile", "write_measurement"]

#: Where ``hetsim profile --suite robotics`` writes by default. Not in
#: ``measured/`` itself: every JSON file there is loaded as a device profile.
DEFAULT_OUT = Path("hardware_profiles") / "measured" / "robotics" / "local.json"


def profile_kernels(device: str = "cpu", sizes: Mapping[str, Sequence[int]] | None = None,
                    repeats: int = 5, warmup: int = 1, progress: bool = False,
                    threads: int | None = None, seed: int = 0) -> dict[str, Any]:
    """Time every kernel of :data:`KERNELS` at several sizes on ``device`` (fp32).

    The host is prepared and each call timed exactly as ``hetsim profile`` does
    for its other benchmarks (:func:`calibration.profiler.setup_host`,
    :func:`calibration.profiler.time_callable`): warm-up calls excluded,
    then ``repeats`` samples with CUDA events on a GPU, the thread's CPU time
    with one CPU thread, ``torch.profiler`` ranges otherwise; the figure is the
    median and its spread the relative inter-quartile range.

    Args:
        device: 'cpu' or 'cuda:N'.
        sizes: kernel name -> sizes; kernels not named are skipped (default:
            every kernel at its ``default_sizes``).
        repeats: timed samples per (kernel, size).
        warmup: untimed calls before them.
        progress: a progress bar on stderr.
        threads: torch intra-op threads (default: the CPUs available).
        seed: seed of the inputs.

    Returns:
        A JSON-ready record: ``suite``, ``schema``, ``source`` (provenance:
        device, its name, torch version, threads, clock, date, ...), ``dtype``,
        ``repeats``, ``warmup``, ``wall_s`` and ``kernels``: name ->
        ``{op_class, size_name, runs: [{size, t_s, rel_iqr, flops, bytes,
        kernels, in_bytes, out_bytes}]}``.

    Raises:
        ConfigError: for an unavailable device or an unknown kernel name.
    """
    chosen = {n: tuple(s.default_sizes) for n, s in KERNELS.items()} if sizes is None else \
        {n: tuple(int(x) for x in v) for n, v in sizes.items()}
    unknown = sorted(set(chosen) - set(KERNELS))
    if unknown:
        raise ConfigError("<command line>", "--sizes", f"unknown kernel {unknown[0]!r} "
                          f"(known: {', '.join(KERNELS)})")
    dev, host = profiler.setup_host(device, threads)
    # other processes' load, for the record: a wall clock would see it, the
    # thread clock (one CPU thread) mostly does not
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(len(v) for v in chosen.values()), desc="robotics", unit="run")
    started = time.perf_counter()
    out: dict[str, Any] = {}
    try:
        for name, szs in chosen.items():
            spec = KERNELS[name]
            runs = []
            for n in szs:
                inputs = spec.inputs(n, seed=seed, device=dev, dtype=torch.float32)
                with torch.inference_mode():
                    med, iqr, _ = profiler.time_callable(
                        functools.partial(spec.run_torch, *inputs), dev,
                        repeats=repeats, warmup=warmup, label=f"{name}@{n}")
                runs.append({"size": n, "t_s": _sig(med), "rel_iqr": _sig(iqr),
                             "flops": spec.flops(n), "bytes": spec.bytes(n),
                             "kernels": spec.kernels(n), "in_bytes": spec.in_bytes(n),
                             "out_bytes": spec.out_bytes(n)})
                if bar is not None:
                    bar.set_postfix_str(f"{name} {n}", refresh=False)
                    bar.update(1)
            out[name] = {"op_class": spec.op_class, "size_name": spec.size_name, "runs": runs}
    finally:
        if bar is not None:
            bar.close()
    source = {"kind": "measured", "date": _dt.date.today().isoformat(),
              **host, **profiler.describe_device(dev), "load_avg_1m": load,
              "note": "hetsim profile --suite robotics: fp32 kernels of sim.robotics.kernels, "
                      "median of repeats after warm-up; flops/bytes/kernels are the analytic "
                      "counts of each KernelSpec."}
    return {"schema": 1, "suite": "robotics", "source": source, "dtype": "fp32", "seed": seed,
            "repeats": repeats, "warmup": warmup, "statistic": "median of repeats after warm-up",
            "wall_s": round(time.perf_counter() - started, 1), "kernels": out}


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def write_measurement(result: Mapping[str, Any], out: str | os.PathLike[str],
                      comparison: Sequence[Mapping[str, Any]] | None = None,
                      profile_name: str = "") -> Path:
    """Write a :func:`profile_kernels` record as JSON (atomically), with the model
    comparison under ``model`` when given."""
    data = dict(result)
    if comparison is not None:
        data["model"] = {"profile": profile_name, "ratio": "measured_s / predicted_s",
                         "rows": list(comparison)}
    return atomic_write(out, json.dumps(data, indent=1) + "\n")


def run_profile(device: str = "cpu", out: str | os.PathLike[str] = DEFAULT_OUT,
                quick: bool = False, threads: int | None = None, compare: str | None = None,
                progress: bool = True) -> tuple[Path, str]:
    """``hetsim profile --suite robotics``: measure, compare with the cost model, write.

    Args:
        device: 'cpu' or 'cuda:N'.
        out: the JSON file to write (its folder is created).
        quick: the two smallest default sizes of each kernel, 3 repeats.
        threads: torch intra-op threads (default: the CPUs available).
        compare: device profile name to predict with (default ``this_machine``
            on a CPU, none on a GPU); the comparison is printed and stored.
        progress: a progress bar on stderr.

    Returns:
        ``(path written, report text)``.

    Raises:
        ConfigError: for an unavailable device, an unwritable ``out`` or an
            unknown ``compare`` profile, before anything is measured.
    """
    dev = check_device(device)
    path = check_writable(out)
    name = compare if compare is not None else ("this_machine" if dev.type == "cpu" else None)
    prof = load_profile(name, source="<command line>", field="--compare") if name else None
    sizes = {n: k.default_sizes[:2] for n, k in KERNELS.items()} if quick else None
    result = profile_kernels(device, sizes, repeats=3 if quick else 7, warmup=1 if quick else 2,
                             progress=progress, threads=threads)
    src = result["source"]
    text = (f"robotics kernels on {src['device_name']} ({src['device']}), torch {src['torch']}, "
            f"{src['threads']} thread(s), clock {src['clock']}, {result['wall_s']} s")
    rows = compare_to_model(result, prof) if prof is not None else None
    if rows is not None and name:
        text += "\n" + format_comparison(rows, name)
    else:
        text += "\n" + "\n".join(f"{k} {r['size']}: {r['t_s']:.3g} s" for k, e in
                                 result["kernels"].items() for r in e["runs"])
    return write_measurement(result, path, rows, name or ""), text
