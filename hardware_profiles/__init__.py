"""Device profiles: the shipped datasheet/measured JSON files and their loader.

A device type named in a config (``cluster.devices[i].type``) is looked up as
``NAME.json`` in the config's ``profiles:`` folders first, then in this folder,
then in its ``measured/`` subfolder. Every failure is a
:class:`hardware_profiles.errors.ConfigError` naming one file and one field.

A file of schema 1 (the corrections' parameters and the measurements as top-level
fields) is read and migrated to schema 2 (:func:`hardware_profiles.migrate.migrate_v1`).

Loaded profiles are cached by resolved path and modification time and shared
between callers: treat them as read-only (they are frozen pydantic models, but
their dicts are plain dicts).

This package is the lowest import layer (docs/architecture.md): besides what a
profile is (:mod:`hardware_profiles.schema`, this loader, the JSON files,
:mod:`hardware_profiles.board`), it holds the helpers every layer shares, the
one-line errors (:mod:`hardware_profiles.errors`) and file IO
(:mod:`hardware_profiles.fileio`). How a profile is measured and fitted lives in
:mod:`calibration`.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from hardware_profiles.errors import ConfigError
from hardware_profiles.schema import (
    DTYPES,
    OP_CLASSES,
    Corrections,
    DeviceProfile,
    EfficiencyCurve,
    Measurement,
    error_field,
)

__all__ = [
    "BUILTIN_DIR",
    "DTYPES",
    "OP_CLASSES",
    "Corrections",
    "DeviceProfile",
    "EfficiencyCurve",
    "Measurement",
    "list_profiles",
    "load_profile",
    "load_profile_file",
]

BUILTIN_DIR = Path(__file__).resolve().parent
MEASURED_DIR = BUILTIN_DIR / "measured"

# A type name is a file stem: no path separators, no leading dot.
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")

_MESSAGES = {
    "missing": "required field missing",
    "extra_forbidden": "unknown field",
}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _validation_error(err: ValidationError) -> tuple[str, str]:
    """(dotted field, one-line message) of the first error."""
    errors = err.errors(include_url=False)
    first = errors[0]
    msg = _MESSAGES.get(first["type"], first["msg"])
    msg = msg.removeprefix("Value error, ")
    if len(errors) > 1:
        more = len(errors) - 1
        msg += f" (and {more} more error{'s' if more > 1 else ''})"
    return error_field(first["loc"]), _one_line(msg)


class _Bad(Exception):
    """A fault in a profile file: (field, message); the caller names the file."""


@functools.lru_cache(maxsize=256)
def _load_cached(resolved: str, mtime_ns: int, size: int) -> DeviceProfile:
    # mtime_ns and size are only part of the key, so an edited file is reread.
    # Exceptions are not cached by lru_cache, so a fixed file loads next time.
    del mtime_ns, size
    try:
        text = Path(resolved).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise _Bad("", f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise _Bad("", f"cannot read: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise _Bad(f"line {e.lineno}", f"invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(data, dict):
        raise _Bad("", f"expected a JSON object, got {type(data).__name__}")
    try:
        profile = DeviceProfile.model_validate(data)
    except ValidationError as e:
        raise _Bad(*_validation_error(e)) from None
    stem = Path(resolved).stem
    if profile.name != stem:
        raise _Bad("name", f"'{profile.name}' differs from the file name; expected '{stem}'")
    return profile


def load_profile_file(path: str | os.PathLike[str]) -> DeviceProfile:
    """Load and validate one profile file; its ``name`` must equal its file stem.

    Results are cached by resolved path, modification time and size.

    Raises:
        ConfigError: with ``file`` = ``path`` as given and ``field`` = '' for a
            missing or unreadable file, ``line N`` for malformed JSON, the dotted
            location of the first schema violation (e.g. ``power_w.idle``,
            ``efficiency.gemm``), or ``name`` when the name differs from the stem.
    """
    shown = os.fspath(path)
    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        raise ConfigError(shown, "", f"cannot read: {e.strerror or e}") from None
    if not p.is_file():
        raise ConfigError(shown, "", "not a file")
    try:
        return _load_cached(str(p.resolve()), st.st_mtime_ns, st.st_size)
    except _Bad as e:
        raise ConfigError(shown, *e.args) from None


def _dirs(search_dirs: Sequence[str | os.PathLike[str]], source: str) -> list[Path]:
    dirs: list[Path] = []
    for d in search_dirs:
        p = Path(d)
        if not p.is_dir():
            raise ConfigError(source, "profiles", f"profile folder '{os.fspath(d)}' not found")
        dirs.append(p)
    dirs.append(BUILTIN_DIR)
    if MEASURED_DIR.is_dir():
        dirs.append(MEASURED_DIR)
    return dirs


def list_profiles(search_dirs: Sequence[str | os.PathLike[str]] = ()) -> list[str]:
    """Sorted, de-duplicated type names available in ``search_dirs`` and the built-ins."""
    names: set[str] = set()
    for d in _dirs(search_dirs, "<profiles>"):
        names.update(p.stem for p in d.glob("*.json") if p.is_file() and _NAME_RE.match(p.stem))
    return sorted(names)


def load_profile(
    name: str,
    search_dirs: Sequence[str | os.PathLike[str]] = (),
    source: str = "<config>",
    field: str = "type",
) -> DeviceProfile:
    """Profile of device type ``name``.

    Looks for ``NAME.json`` in each of ``search_dirs`` in order, then in
    :data:`BUILTIN_DIR`, then in ``BUILTIN_DIR/measured``; the first found wins,
    so a user folder shadows a built-in profile of the same name.

    Args:
        name: the type name, e.g. ``"v100"``.
        search_dirs: extra profile folders (a config's ``profiles:``), searched first.
        source: the file that named the type, for error messages.
        field: the field of ``source`` that named it, for error messages.

    Raises:
        ConfigError: ``(source, field, "unknown device type ...")`` when no folder
            holds the name, ``(source, "profiles", ...)`` for a missing folder, or
            the error of :func:`load_profile_file` for a bad file.
    """
    dirs = _dirs(search_dirs, source)
    if isinstance(name, str) and _NAME_RE.match(name):
        for d in dirs:
            candidate = d / f"{name}.json"
            if candidate.is_file():
                return load_profile_file(candidate)
    known = list_profiles(search_dirs)
    raise ConfigError(
        source, field, f"unknown device type {name!r}; known: {', '.join(known) or '(none)'}"
    )
