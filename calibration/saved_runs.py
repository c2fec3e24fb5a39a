"""What the measuring benches (:mod:`calibration.measurement_noise`, :mod:`calibration.gemm_shapes`)
share: their run options, the checks before measuring, saving and reloading runs, and
reading the per-layer times of a ``raw`` run as ``hetsim profile`` records them."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hardware_profiles import load_profile_file
from hardware_profiles.errors import ConfigError
from hardware_profiles.fileio import atomic_write, prepare_out


def pct(x: float) -> str:
    """A fraction as a percentage with one decimal (0.123 -> '12.3%')."""
    return f"{100 * x:.1f}%"


def half_range(xs: Sequence[float]) -> float:
    """(max - min) / (max + min): the least worst-case relative error of one value
    against all of ``xs`` (the value 2 max min / (max + min))."""
    hi, lo = max(xs), min(xs)
    return (hi - lo) / (hi + lo)


def own_times(run: dict[str, Any], name: str) -> Any:
    """A run's times of layer ``name`` ([forward s, backward s, ...]): its own brackets
    where the run has them (as the leave-one-out error takes them), else the time
    charged to it. KeyError where the run has neither."""
    own = run.get("own") or {}
    return own[name] if name in own else run["layers"][name]


def check_run(run: Any, path: str, where: str) -> None:
    """One saved ``raw`` run (``{"batch", "layers", "own"?}``), or a one-line ConfigError
    naming ``where`` in ``path``: an integer batch, ``layers`` and ``own`` (if any) as
    mappings, and every time list ``[forward s, backward s, ...]`` of 0 or more."""
    if not (isinstance(run, dict) and isinstance(run.get("batch"), int)
            and isinstance(run.get("layers"), dict) and isinstance(run.get("own", {}), dict)):
        raise ConfigError(path, where, "needs batch (an integer), layers and (if any) own as "
                          "mappings")
    for name, v in {**run["layers"], **(run.get("own") or {})}.items():
        if not (isinstance(v, list) and len(v) >= 2
                and all(isinstance(x, (int, float)) and x >= 0 for x in v[:2])):
            raise ConfigError(path, f"{where}.layers.{name}",
                              "needs [forward s, backward s, ...], each 0 or more")


def add_run_options(ap: argparse.ArgumentParser, what: str, default_out: str, rounds: int,
                    rounds_help: str, profile_help: str) -> None:
    """The options a measuring bench shares: ``--rounds``, ``--threads``, ``--profile``,
    ``--out`` (where ``what`` is saved), ``--load`` and ``--json``."""
    ap.add_argument("--rounds", type=int, default=rounds, help=rounds_help)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--profile", help=profile_help)
    ap.add_argument("--out", default=default_out,
                    help=f"where {what} are saved as JSON (default {default_out})")
    ap.add_argument("--load", metavar="JSON", help=f"report {what} saved by an earlier run "
                                                   "instead of measuring")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")


def start_run(a: argparse.Namespace) -> tuple[Any, Any]:
    """(the ``--profile`` loaded, None without one; the JSON ``--load`` names, None
    without one), and without ``--load``: ``--rounds`` and ``--threads`` checked and
    ``--out``'s folder made writable, all before anything is measured.

    Raises:
        ConfigError: a one-line error naming the file or the option: also for a
            profile without raw measurements to fit.
    """
    prof = None
    if a.profile:
        prof = load_profile_file(a.profile)
        raw = prof.measurement.raw
        if not raw or ("models" not in raw and "micro" not in raw):
            raise ConfigError(a.profile, "measurement.raw", "no raw layer measurements to fit "
                              "(a profile of hetsim profile has them)")
    if a.load:
        try:
            return prof, json.loads(Path(a.load).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(a.load, "--load", f"cannot be read as JSON ({e})") from None
    if a.rounds < 1 or a.threads < 1:
        raise ConfigError("<command line>", "--rounds" if a.rounds < 1 else "--threads",
                          "must be at least 1")

    prepare_out(Path(a.out).parent, "--out")
    return prof, None


def save_run(a: argparse.Namespace, meta: dict[str, Any], key: str, data: Any) -> None:
    """Save ``{"meta": meta, key: data}`` to ``--out`` (its folder checked by
    :func:`start_run`), and say so unless ``--json``."""
    atomic_write(a.out, json.dumps({"meta": meta, key: data}, indent=1) + "\n")
    if not a.json:
        print(f"{key} saved: {a.out}")
