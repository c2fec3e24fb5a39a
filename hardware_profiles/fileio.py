"""File helpers shared by every layer: durable writes (the profiler, the sweep table, the
runtime's checkpoints) and output folders made or refused with a one-line error."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from hardware_profiles.errors import ConfigError


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write ``data`` to ``path`` so that a reader sees the old file or the whole new one:
    a temporary file in the same folder (``.NAME.XXXX.tmp``, unique, so concurrent writers
    do not collide), flushed and fsynced, then renamed over ``path`` and the rename made
    durable (the folder fsynced where the system allows it). Creates the folder.

    On any failure (a full disk, an unwritable folder, ``path`` a folder) the temporary
    file is removed and the error raised; ``path`` is then unchanged."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes it 0600; give it a new file's usual mode
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # folders cannot be opened for fsync everywhere
        fsync_dir(p.parent)
    return p


def atomic_write_many(folder: str | os.PathLike[str], files: Mapping[str, bytes | str]) -> Path:
    """:func:`atomic_write` each of ``files`` (name -> content) into ``folder`` (created if
    missing), the files in parallel threads: their fsyncs then share the file system's
    journal commits, several times faster than one after another. When a write fails,
    the others still finish and the first error is raised."""
    from concurrent.futures import ThreadPoolExecutor

    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    if len(files) <= 1:
        for name, data in files.items():
            atomic_write(d / name, data)
        return d
    with ThreadPoolExecutor(max_workers=min(8, len(files)), thread_name_prefix="hetsim-write") as ex:
        futures = [ex.submit(atomic_write, d / name, data) for name, data in files.items()]
    for f in futures:
        f.result()
    return d


def _read_umask() -> int:
    mask = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask


#: read once, at import (before any thread exists): setting it later would race other threads
_UMASK = _read_umask()


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
