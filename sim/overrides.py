"""``--set key.path=value``: command-line overrides of a config file's fields.

The value is parsed as YAML (``3`` is an int, ``0.5`` a float, ``true`` a bool,
``[a, b]`` a list, ``null`` None, anything else a string), then set at the dotted
path in the file's data before the config is validated, so a bad value is the
same one-line error a bad field in the file is. A path part indexes a list when
the node is a list (``cluster.devices.0.count=2``); a missing mapping on the way
is created.

The command line registers the overrides of one config file (:func:`overriding`);
:func:`sim.config.read_yaml` applies them whenever it reads that file, so every
loader of a config (training, DAG, runtime) sees them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from hardware_profiles.errors import ConfigError

SOURCE = "<command line>"

#: One override: (the key as given, its path parts, the parsed value).
Override = tuple[str, tuple[str, ...], Any]

# resolved config path -> its overrides, in command-line order
_ACTIVE: dict[str, list[Override]] = {}


def parse(items: Sequence[str]) -> list[Override]:
    """``KEY.PATH=VALUE`` strings as overrides; a malformed one is a one-line error
    naming it."""
    out: list[Override] = []
    for item in items:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ConfigError(SOURCE, "--set", f"expected KEY.PATH=VALUE, got {item!r}")
        parts = tuple(key.split("."))
        if any(not p for p in parts):
            raise ConfigError(SOURCE, f"--set {key}", "empty part in the key path")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError(SOURCE, f"--set {key}",
                              f"malformed YAML value: {getattr(e, 'problem', None) or e}") from None
        out.append((key, parts, value))
    return out


_KINDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", type(None): "null"}


def _not_container(node: Any, key: str, done: str) -> ConfigError:
    kind = _KINDS.get(type(node), f"a {type(node).__name__}")
    return ConfigError(SOURCE, f"--set {key}", f"{done or 'the config'} is {kind}, not a mapping or a list")


def _step(node: Any, part: str, key: str, done: str) -> Any:
    """The child ``part`` of ``node`` (created empty when missing from a mapping)."""
    if isinstance(node, dict):
        return node.setdefault(part, {})
    if isinstance(node, list):
        return node[_index(node, part, key, done)]
    raise _not_container(node, key, done)


def _index(node: list[Any], part: str, key: str, done: str) -> int:
    try:
        i = int(part)
    except ValueError:
        raise ConfigError(SOURCE, f"--set {key}", f"{done} is a list: {part!r} is not an index") from None
    if not -len(node) <= i < len(node):
        raise ConfigError(SOURCE, f"--set {key}", f"{done} has {len(node)} item{'' if len(node) == 1 else 's'}: no index {i}")
    return i


def apply(data: Any, overrides: Sequence[Override]) -> Any:
    """``data`` (a YAML document, changed in place) with ``overrides`` set."""
    if data is None:
        data = {}
    for key, parts, value in overrides:
        node = data
        for n, part in enumerate(parts[:-1]):
            node = _step(node, part, key, ".".join(parts[:n]))
        last, done = parts[-1], ".".join(parts[:-1])
        if isinstance(node, dict):
            node[last] = value
        elif isinstance(node, list):
            node[_index(node, last, key, done)] = value
        else:
            raise _not_container(node, key, done)
    return data


def registered(path: str | os.PathLike[str]) -> list[Override]:
    """The overrides registered for the file at ``path`` (none: [])."""
    if not _ACTIVE:
        return []
    return _ACTIVE.get(str(Path(path).resolve()), [])


@contextlib.contextmanager
def overriding(paths: Sequence[str | os.PathLike[str]], items: Sequence[str]) -> Iterator[None]:
    """While inside, every read of a config file in ``paths`` gets ``items`` applied."""
    parsed = parse(items)
    keys = [str(Path(p).resolve()) for p in paths] if parsed else []
    for k in keys:
        _ACTIVE[k] = parsed
    try:
        yield
    finally:
        for k in keys:
            _ACTIVE.pop(k, None)
