"""A config's ``job.model`` resolved to a :class:`~sim.workload.Model`: a zoo name, a
layer-list file (``{file: PATH}``) or a torch factory (``{torch: 'pkg.mod:fn', input:
[...], kwargs: {...}}``, extracted by :func:`sim.torch_extract.from_torch`)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hardware_profiles.errors import ConfigError
from sim import zoo
from sim.workload import Model, load_model_file


def resolve_model(spec: Any, base_dir: Path, source: str = "<config>") -> Model:
    """Resolve a config's ``job.model``: zoo name, ``{file: ...}`` or ``{torch: ..., input: [...]}``."""
    if isinstance(spec, str):
        try:
            return zoo.get(spec)
        except KeyError:
            raise ConfigError(
                source, "job.model", f"unknown model {spec!r}; zoo has {', '.join(zoo.names())}"
            ) from None
    if isinstance(spec, Mapping) and set(spec) == {"file"}:
        f = Path(str(spec["file"]))
        f = f if f.is_absolute() else base_dir / f
        return load_model_file(f)
    if isinstance(spec, Mapping) and "torch" in spec:
        extra = set(spec) - {"torch", "input", "kwargs"}
        if extra:
            raise ConfigError(source, f"job.model.{sorted(extra)[0]}", "unknown field")
        model = _model_from_factory(spec, source)
        if not any(layer.param_bytes > 0 for layer in model.layers):
            raise ConfigError(source, "job.model.torch", "the module has no trainable parameters: "
                              "nothing to train or synchronise")
        return model
    raise ConfigError(
        source, "job.model", "must be a zoo name, {file: PATH} or {torch: 'pkg.mod:fn', input: [...]}"
    )


def _model_from_factory(spec: Mapping[str, Any], source: str) -> Model:
    target = str(spec["torch"])
    mod_name, _, fn_name = target.partition(":")
    if not fn_name:
        raise ConfigError(source, "job.model.torch", f"expected 'pkg.module:factory', got {target!r}")
    try:
        fn = getattr(importlib.import_module(mod_name), fn_name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(source, "job.model.torch", f"cannot import {target!r}: {e}") from None
    shape = spec.get("input")
    if not isinstance(shape, Sequence) or not shape or not all(isinstance(s, int) and s > 0 for s in shape):
        raise ConfigError(source, "job.model.input", "must be a list of positive ints (one sample's shape)")
    import torch

    from sim.torch_extract import from_torch  # imports torch

    kwargs = spec.get("kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise ConfigError(source, "job.model.kwargs", "must be a mapping of keyword arguments")
    try:
        module = fn(**dict(kwargs))
    except Exception as e:  # a user's factory may raise anything
        raise ConfigError(source, "job.model.kwargs", f"{target}(...) failed: {type(e).__name__}: {e}") from None
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(source, "job.model.torch", f"{target!r} did not return a torch.nn.Module")
    try:
        return from_torch(module, torch.randn(1, *shape), name=fn_name)
    except Exception as e:  # e.g. the input shape does not fit the module
        raise ConfigError(source, "job.model.input",
                          f"forward/backward on a {list(shape)} sample failed: {type(e).__name__}: {e}") from None
