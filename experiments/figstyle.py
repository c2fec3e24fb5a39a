"""What every figure shares: one fixed colour (and marker) per scheduler, and readable
axis labels, with units, for config paths and metrics.

Colours are fixed by name, not by order of appearance, so a scheduler looks the same in
every figure. Every registered scheduler (``schedulers.names(None)``) has its own entry
in :data:`SCHEDULER_STYLES`; the training schedulers' colours are the Tableau 10 plus a
dark olive, the DAG schedulers' are Dark2 colours (the two kinds never share a figure,
but no two registered names share a colour). Any other name (a scheduler under
parameters, such as ``energy {"margin":0.2}``, takes a shade of its scheduler's colour
and another marker; a name unknown altogether (one registered later) a colour of
:data:`EXTRA_COLORS`. Both are picked by a hash of the name, so they too are stable.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

#: name -> (colour, marker), in legend order: training schedulers, then DAG ones
SCHEDULER_STYLES: dict[str, tuple[str, str]] = {
    "equal": ("#1F77B4", "o"),
    "proportional": ("#FF7F0E", "s"),
    "cpu_only": ("#17BECF", "v"),
    "gpu_only": ("#BCBD22", "^"),
    "lbbsp": ("#2CA02C", "D"),
    "hps": ("#D62728", "P"),
    "greedy": ("#9467BD", "X"),
    "genetic": ("#8C564B", "h"),
    "exact": ("#E377C2", "*"),
    "bruteforce": ("#637939", "p"),
    "rl": ("#7F7F7F", "<"),
    "heft": ("#1B9E77", "o"),
    "energy": ("#D95F02", "s"),
    "milp": ("#7570B3", "D"),
    "rl-dag": ("#666666", "<"),
}
#: colours of names without an entry, picked by a hash of the name (stable across runs)
EXTRA_COLORS = ("#E7298A", "#66A61E", "#E6AB02", "#A6761D", "#6A3D9A", "#FB9A99", "#A6CEE3", "#00525B")
_EXTRA_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h")


def _hash(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")


#: how a variant's colour is made from its scheduler's: mixed with black (< 0) or white (> 0)
_SHADES = (-0.45, 0.45, -0.7, 0.65)


def _variant_of(name: str) -> str | None:
    """The registered scheduler a name is a variant of ("energy {...}" -> "energy"), or None."""
    base, _, rest = name.partition(" ")
    return base if rest and base in SCHEDULER_STYLES else None


def _shade(color: str, amount: float) -> str:
    rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    to = 255 if amount > 0 else 0
    return "#" + "".join(f"{round(c + (to - c) * abs(amount)):02X}" for c in rgb)


def scheduler_color(name: str) -> str:
    """The colour of a scheduler, the same in every figure (see the module docstring)."""
    if name in SCHEDULER_STYLES:
        return SCHEDULER_STYLES[name][0]
    base = _variant_of(name)
    if base is not None:
        return _shade(SCHEDULER_STYLES[base][0], _SHADES[_hash(name) % len(_SHADES)])
    return EXTRA_COLORS[_hash(name) % len(EXTRA_COLORS)]


def scheduler_marker(name: str) -> str:
    """The marker of a scheduler in line and scatter plots (told apart where lines overlap;
    a variant's differs from its scheduler's)."""
    if name in SCHEDULER_STYLES:
        return SCHEDULER_STYLES[name][1]
    base = _variant_of(name)
    others = [m for m in _EXTRA_MARKERS if base is None or m != SCHEDULER_STYLES[base][1]]
    return others[(_hash(name) // 8) % len(others)]


def scheduler_order(names: Iterable[object]) -> list[str]:
    """Distinct names in legend order: those of :data:`SCHEDULER_STYLES` in its order,
    then the others alphabetically (a scheduler under parameters right after its own)."""
    known = list(SCHEDULER_STYLES)
    uniq = {str(n) for n in names}

    def key(n: str) -> tuple[int, str]:
        base = n.split(" ", 1)[0]
        return (known.index(base) if base in known else len(known), n)

    return sorted(uniq, key=key)


# ------------------------------------------------------------------ labels
#: axis label (with its unit) of a metric column
METRIC_LABELS = {
    "throughput_sps": "throughput (samples/s)",
    "cost_usd": "cost of the run (USD)",
    "time_to_target_s": "time to target (s)",
    "iteration_time_mean_s": "mean iteration time (s)",
    "elapsed_s": "elapsed time (s)",
    "energy_j": "energy (J)",
    "plan_energy_mj": "energy per frame (mJ)",
    "des_miss_rate": "deadline misses (DES, fraction)",
    "plan_frame_ms": "planned frame time (ms)",
    "des_latency_p99_ms": "p99 frame latency (DES, ms)",
    "des_energy_mj": "energy per frame (DES, mJ)",
    "plan_s": "planning time (s)",
}

#: axis label (with its unit) of a config path, training and robotics configs
FIELD_LABELS = {
    "name": "name",
    "seed": "seed",
    "profiles": "profile folders",
    "cluster.devices": "devices",
    "cluster.network.bandwidth_gbps": "network bandwidth (Gbit/s)",
    "cluster.network.latency_us": "network latency (µs)",
    "cluster.network.sharing": "network sharing",
    "cluster.ps.shards": "PS shards",
    "cluster.ps.type": "PS shard device",
    "job.model": "model",
    "job.global_batch": "global batch (samples)",
    "job.dtype": "precision",
    "job.iterations": "iterations",
    "job.samples": "samples to process",
    "job.target_loss": "target loss",
    "job.sync": "synchronisation",
    "job.staleness": "SSP staleness (iterations)",
    "job.pipeline": "push/pull overlap",
    "job.quantization": "gradient quantization",
    "job.failure_timeout_s": "failure timeout (s)",
    "job.warmup_iterations": "warm-up iterations",
    "job.compute_noise": "compute noise (CV)",
    "objective.minimize": "objective",
    "objective.throughput_min": "throughput floor (samples/s)",
    "objective.deadline_s": "deadline (s)",
    "objective.budget_usd": "budget (USD)",
    "scheduler.name": "scheduler",
    "scheduler.params": "scheduler parameters",
    "board": "board",
    "frame_rate_hz": "frame rate (Hz)",
    "deadline_ms": "frame deadline (ms)",
    "modes": "power modes",
    "des.frames": "frames simulated",
    "des.jitter_cv": "execution-time jitter (CV)",
    "des.release_jitter_ms": "release jitter (ms)",
}
_PATTERNS = (
    (re.compile(r"cluster\.devices\[(\d+)\]\.count"), "{type} devices (count)", "devices in group {0} (count)"),
    (re.compile(r"cluster\.devices\[(\d+)\]\.type"), "device type", "device type of group {0}"),
    (re.compile(r"cluster\.devices\[(\d+)\]\.threads"), "{type} threads per process", "threads per process, group {0}"),
    (re.compile(r"cluster\.network\.overrides\.(.+)"), "", "bandwidth of {0} (Gbit/s)"),
    (re.compile(r"cluster\.hosts\[(\d+)\]\.cores"), "", "cores of host {0}"),
)
_UNIT_SUFFIXES = (("_gbps", "Gbit/s"), ("_us", "µs"), ("_ms", "ms"), ("_hz", "Hz"), ("_s", "s"),
                  ("_usd", "USD"), ("_sps", "samples/s"), ("_mj", "mJ"), ("_j", "J"), ("_w", "W"))


def field_label(path: str, device_types: dict[int, str] | None = None) -> str:
    """A readable axis label, with its unit, for a swept config path (a results.csv column).

    Known paths read as :data:`FIELD_LABELS` says; ``cluster.devices[i].count`` names the
    group's device type when ``device_types`` (group index -> type) knows it; any other
    path reads as its last part with a unit taken from its suffix (``_gbps``: Gbit/s,
    ``_ms``: ms, ...) and the path itself in brackets.
    """
    if path in FIELD_LABELS:
        return FIELD_LABELS[path]
    for pattern, with_type, generic in _PATTERNS:
        m = pattern.fullmatch(path)
        if m:
            kind = (device_types or {}).get(int(m.group(1))) if m.group(1).isdigit() else None
            return with_type.format(type=kind) if kind and with_type else generic.format(m.group(1))
    last = re.sub(r"\[\d+\]", "", path.rsplit(".", 1)[-1])
    for suffix, unit in _UNIT_SUFFIXES:
        if last.endswith(suffix):
            words = last[: -len(suffix)].replace("_", " ")
            return f"{words} ({unit}) [{path}]" if path != last else f"{words} ({unit})"
    words = last.replace("_", " ")
    return f"{words} [{path}]" if path != last else words


def metric_label(name: str) -> str:
    """The axis label, with its unit, of a metric column (the column name if unknown)."""
    return METRIC_LABELS.get(name, name)
