"""File helpers shared by every layer: durable writes (the profiler, the sweep table, the
runtime's checkpoints) and output folders made or refused with a one-line error."""

from __future__ import annotations

import os
from pathlib import Path

from hardware_profiles.errors import ConfigError


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write ``data`` to ``path`` so that a reader sees the old file or the whole new one:
    a temporary file in the same folder (named by this process, so concurrent writers do
    not collide), flushed and fsynced, then renamed over ``path``. Creates the folder."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f"{p.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    return p


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Make a rename inside ``folder`` durable (fsync the directory entry)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def prepare_out(out: str | Path, option: str = "--out") -> Path:
    """Create ``out`` (and parents) or fail with a one-line error naming ``option``."""
    p = Path(out)
    try:
        p.mkdir(parents=True, exist_ok=True)
        probe = p / ".hetsim-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ConfigError(str(p), option, f"cannot write there: {e.strerror or e}") from None
    return p
