"""Zoo models built with other sizes: the label a profile times them under, and their layers.

A profile times zoo models per layer (``raw["models"]``, keyed by name); a model
built with other sizes (``runtime.model_kwargs`` of a config, e.g. resnet18 on
32x32 images) has other layers, which a table of the default model does not
price. A *variant* is named by a label: the zoo name, then its keyword arguments
as compact JSON with sorted keys (``{}`` for the default sizes)::

    resnet18{"classes":10,"size":32}

A plain name is the zoo model as committed (:func:`sim.zoo.get`). A variant's layers are
those of the module the runtime trains (:func:`sim.torch_extract.from_torch` of
:func:`sim.zoo.torch_module`), with embedding tables dense, as
:func:`experiments.validate.exact_model` has them (the runtime moves whole tables),
so that the tables made from its timings key the layers the validation's DES prices.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from typing import Any

from sim import zoo
from sim.workload import Model


def label(name: str, kwargs: Mapping[str, Any] | None = None) -> str:
    """The label of zoo model ``name`` built with ``kwargs`` (None: the plain name)."""
    if kwargs is None:
        return name
    plain = {k: (list(v) if isinstance(v, tuple) else v) for k, v in kwargs.items()}
    return name + json.dumps(plain, sort_keys=True, separators=(",", ":"))


def parse(text: str) -> tuple[str, dict[str, Any]]:
    """``(zoo name, keyword arguments)`` of a label (:func:`label`).

    Raises:
        ValueError: not a zoo name, or arguments that are not JSON.
    """
    i = text.find("{")
    name = text if i < 0 else text[:i]
    if name not in zoo.names():
        raise ValueError(f"unknown zoo model {name!r}")
    return name, ({} if i < 0 else json.loads(text[i:]))


def torch_module(text: str, batch_size: int) -> tuple[Any, Any]:
    """The torch module of a label and an example input of ``batch_size`` (:func:`sim.zoo.torch_module`)."""
    name, kwargs = parse(text)
    sizes: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else v) for k, v in kwargs.items()}
    return zoo.torch_module(name, batch_size=batch_size, **sizes)


@functools.cache
def model(text: str) -> Model:
    """The layer list of a label: the zoo's own for a plain name, else the variant's module
    extracted, its embedding tables dense (see the module docstring)."""
    name, _ = parse(text)
    if "{" not in text:
        return zoo.get(name)
    from sim.torch_extract import from_torch

    module, example = torch_module(text, 2)
    m = from_torch(module.train(), example, name=name)
    return dataclasses.replace(m, layers=tuple(dataclasses.replace(ly, sparse=None) for ly in m.layers))
