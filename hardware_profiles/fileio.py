"""File helpers shared by every layer: durable writes (every output of every command,
the profiler, the sweep table, the runtime's checkpoints) and output folders made or
refused with a one-line error."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from hardware_profiles.errors import ConfigError


def _oserror(p: Path, e: OSError, option: str) -> ConfigError:
    why = e.strerror or str(e)
    if isinstance(e, (FileExistsError, NotADirectoryError)):
        why = "a file is in the way where a folder is needed"
    return ConfigError(str(p), option, f"cannot write there: {why}")


def atomic_write(path: str | os.PathLike[str], data: bytes | str, option: str = "") -> Path:
    """Write ``data`` to ``path`` so that a reader sees the old file or the whole new one:
    a temporary file in the same folder (named by this process, so concurrent writers do
    not collide), flushed and fsynced, then renamed over ``path``. Creates the folder.

    Raises:
        ConfigError: the folder cannot be made or written (a full disk, no permission,
            ``path`` a directory or under a file), naming ``path`` and ``option`` (the
            command-line option that chose it, '' for none); the temporary file is
            removed and ``path`` is left as it was.
    """
    p = Path(path)
    tmp = p.with_name(f"{p.name}.tmp{os.getpid()}")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_dir():
            raise IsADirectoryError(21, "is a directory")
        with open(tmp, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # the folder itself is gone or unreadable: nothing was left in it
        raise _oserror(p, e, option) from None
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
        raise _oserror(p, e, option) from None
    return p


def prepare_file_out(out: str | Path, option: str = "--out") -> Path:
    """Check that the file ``out`` can be written (its folder made, ``out`` not a folder)
    before any work, or fail with a one-line error naming ``option``."""
    p = Path(out)
    if p.is_dir():
        raise ConfigError(str(p), option, "is a directory (give a file name)")
    prepare_out(p.parent if str(p.parent) else Path("."), option)
    return p


def save_figure(fig: Any, path: str | os.PathLike[str], **kwargs: Any) -> Path:
    """A matplotlib figure written atomically (:func:`atomic_write`), in the format its
    suffix names; ``kwargs`` go to ``fig.savefig``."""
    buf = io.BytesIO()
    fig.savefig(buf, format=Path(path).suffix.lstrip(".") or "png", **kwargs)
    return atomic_write(path, buf.getvalue())
