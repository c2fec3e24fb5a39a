"""Checkpoints of a BSP run: every ``runtime.checkpoint_every`` committed iterations and at the end.

Files in the checkpoint folder (``OUT/checkpoint``):

* ``shard-K.vV.pt``: PS shard K's parameter slice after ``V`` applied
  iterations, its optimizer state (plain SGD keeps none beyond the learning
  rate) and busy time (``torch.save`` of tensors and plain values; read back
  with ``weights_only=True``).
* ``coordinator.vV.pkl``: rank 0's bookkeeping at ``V``: shares in force for
  iteration ``V``, live workers, bit width, every per-iteration row so far,
  failures, the online scheduler object (pickle: resume only from checkpoints
  you wrote).
* ``manifest.json``: the one complete version, its files with their sha256,
  and the fingerprint of the run (what must not change on resume).

Invariants. Every file is written to a temporary name, fsynced and
``os.replace``-d into place; a shard reports its file to rank 0 (``SAVED``)
only after that; ``manifest.json`` names ``V`` only once every shard's file
and the coordinator's file of ``V`` are in place, and is itself replaced
atomically. So wherever a run dies, the manifest names a consistent cut: every
shard at the same ``V``. Files of other versions are never read: older ones are
deleted once a newer manifest is in place; newer ones (a checkpoint cut short)
are overwritten by the resumed run.

Why the cut is consistent under BSP: a shard's version ``V`` means iterations
``0 .. V-1`` applied with the members shard 0 committed; rank 0 saves right
after committing ``V - 1`` and rebalancing, before any push of ``V`` can exist
(it needs the parameters of ``V``). Nothing of the workers is saved: worker
``w`` draws iteration ``t``'s samples and quantization noise from generators
seeded by ``(seed, w, t)`` (:func:`runtime.task.iteration_generators`), so a
resumed worker computes bit for bit what the uninterrupted one would have.
"""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hardware_profiles.errors import ConfigError
from hardware_profiles.fileio import atomic_write, fsync_dir
from runtime.spec import Manifest, RunSpec

if TYPE_CHECKING:
    import torch

MANIFEST = "manifest.json"
SCHEMA = 1
_VERSIONED = re.compile(r"^(?:shard-\d+|coordinator)\.v(\d+)\.(?:pt|pkl)$")


def shard_file(rank: int, version: int) -> str:
    return f"shard-{rank}.v{version}.pt"


def coordinator_file(version: int) -> str:
    return f"coordinator.v{version}.pkl"


def save_shard(folder: str, rank: int, version: int, flat: torch.Tensor, lr: float,
               busy_s: float) -> tuple[str, str]:
    """Write shard ``rank``'s slice at ``version``; returns (file name, sha256)."""
    import torch

    buf = io.BytesIO()
    torch.save({"version": version, "flat": flat.clone(), "busy_s": busy_s,
                "optimizer": {"kind": "sgd", "lr": lr, "state": {}}}, buf)
    return _write(folder, shard_file(rank, version), buf.getvalue())


def save_coordinator(folder: str, version: int, state: dict[str, Any]) -> tuple[str, str]:
    """Write rank 0's bookkeeping at ``version``; returns (file name, sha256)."""
    return _write(folder, coordinator_file(version), pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))


def _write(folder: str, name: str, data: bytes) -> tuple[str, str]:
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    atomic_write(d / name, data)
    return name, hashlib.sha256(data).hexdigest()


def write_manifest(folder: str, version: int, files: dict[str, str], fingerprint: dict[str, Any]) -> None:
    """Name ``version`` as the complete checkpoint, then delete older versions' files."""
    d = Path(folder)
    body = {"schema": SCHEMA, "version": version, "files": dict(sorted(files.items())),
            "fingerprint": fingerprint}
    atomic_write(d / MANIFEST, (json.dumps(body, indent=2) + "\n").encode())
    fsync_dir(d)  # the rename itself is durable before older files go
    for p in d.iterdir():
        m = _VERSIONED.match(p.name)
        if m and int(m.group(1)) < version:
            p.unlink(missing_ok=True)


def clear(folder: str) -> None:
    """Remove a previous run's checkpoint files (a fresh run must not resume into them)."""
    d = Path(folder)
    if not d.is_dir():
        return
    for p in d.iterdir():
        if p.name == MANIFEST or _VERSIONED.match(p.name) or ".tmp" in p.name:
            p.unlink(missing_ok=True)


def read_manifest(folder: str) -> Manifest:
    """The last complete checkpoint in ``folder``.

    Raises:
        ConfigError: no manifest, or one that cannot be read, or a file it names
            missing or changed (sha256).
    """
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise ConfigError(str(path), "", "no checkpoint to resume from (run first with "
                          "runtime.checkpoint_every > 0 and the same --out)")
    try:
        body = json.loads(path.read_text())
        version, files, fp = int(body["version"]), dict(body["files"]), dict(body["fingerprint"])
        if body.get("schema") != SCHEMA:
            raise ConfigError(str(path), "schema", f"unknown checkpoint schema {body.get('schema')!r}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(str(path), "", f"unreadable checkpoint manifest: {e}") from None
    for name, sha in files.items():
        f = Path(folder) / name
        if not f.is_file() or hashlib.sha256(f.read_bytes()).hexdigest() != sha:
            raise ConfigError(str(path), f"files.{name}", "missing or changed since the checkpoint was written")
    return Manifest(str(folder), version, files, fp)


def _plain(x: Any) -> Any:
    """``x`` as JSON gives it back (tuples become lists), so a fingerprint compares with a stored one."""
    return json.loads(json.dumps(x, default=repr))


def fingerprint(spec: RunSpec) -> dict[str, Any]:
    """What a resumed run must share with the run that wrote the checkpoint, by config field.

    Everything that changes the arithmetic of an iteration or the meaning of the
    saved state; not the emulation knobs, timeouts, ``job.iterations`` (a resume
    may run longer) or the checkpoint interval.
    """
    quant = spec.bits if spec.adaptive is None else {"adaptive": repr(spec.adaptive), "every": spec.quant_every}
    # multi-stage plans: where the stages cut and how an iteration is split change the
    # arithmetic too (one-stage fingerprints keep their keys)
    stages = ({"plan.stages": [list(st.layers) for st in spec.stages],
               "runtime.micro_batches": spec.micro_batches} if spec.multistage else {})
    return _plain({**stages,
        "seed": spec.seed, "job.model": spec.model, "runtime.model_kwargs": spec.model_kwargs,
        "job.global_batch": spec.global_batch, "job.sync": spec.sync, "job.staleness": spec.staleness,
        "job.quantization": quant, "runtime.lr": spec.lr, "cluster.ps": spec.shards,
        "plan.replicas": [[r.device, r.batch] for r in spec.plan.replicas],
        "scheduler.name": None if spec.scheduler is None else type(spec.scheduler).__name__,
    })


def check_fingerprint(manifest: Manifest, spec: RunSpec, source: str) -> None:
    """Raises ConfigError naming the first config field that differs from the checkpoint's."""
    mine = fingerprint(spec)
    for key in sorted(set(mine) | set(manifest.fingerprint)):
        if mine.get(key) != manifest.fingerprint.get(key):
            raise ConfigError(source, key, f"{mine.get(key)!r} differs from the checkpoint's "
                              f"{manifest.fingerprint.get(key)!r} ({Path(manifest.folder) / MANIFEST}); "
                              "resume with the config the run started with")


def _read(manifest: Manifest, name: str) -> bytes:
    data = (Path(manifest.folder) / name).read_bytes()
    if hashlib.sha256(data).hexdigest() != manifest.files.get(name):
        raise RuntimeError(f"checkpoint file {name} changed after the manifest was read")
    return data


def load_shard(manifest: Manifest, rank: int) -> dict[str, Any]:
    import torch

    state: dict[str, Any] = torch.load(io.BytesIO(_read(manifest, shard_file(rank, manifest.version))),
                                       weights_only=True)
    return state


def load_coordinator(manifest: Manifest) -> dict[str, Any]:
    state: dict[str, Any] = pickle.loads(_read(manifest, coordinator_file(manifest.version)))
    return state
