"""The built-in model zoo.

Each zoo model is a real ``torch.nn.Module`` built here by hand (no
torchvision); its layer list was extracted once with
:func:`sim.torch_extract.from_torch` on CPU, in train mode, with an example
batch of 2, and committed as ``sim/zoo_data/{name}.yaml``. :func:`get` reads
that YAML and never imports torch; :func:`torch_module` builds the module
itself (for the real runtime and for regenerating the YAML with
``python -m sim.zoo``).

Models (defaults; every size is a keyword argument of :func:`torch_module`):

* ``mlp``: 784-1024-1024-10 multilayer perceptron with ReLU (MNIST-sized).
* ``ctr_dnn``: click-through-rate DNN: 26 categorical fields, each an
  ``nn.Embedding(100_000, 16)`` looked up once per sample (sparse layers), and
  13 dense features, concatenated into an MLP 512-256-1.
* ``wide_deep``: Wide & Deep: the wide part is one ``nn.EmbeddingBag`` of
  scalar weights over all 26 fields' ids (a linear model over one-hot sparse
  features, 26 rows a sample); the deep part is 26 ``nn.Embedding(50_000, 32)``
  tables plus 13 dense features into an MLP 1024-512-256-1; the two logits
  are added.
* ``resnet18``, ``resnet50``: ImageNet ResNets (BasicBlock / Bottleneck with
  BatchNorm and 1x1 downsample convolutions, stride on the 3x3 conv), input
  3x224x224, 1000 classes.
* ``vgg16``: VGG-16 (configuration D, no BatchNorm), input 3x224x224, 1000
  classes.
* ``transformer``: a bidirectional (BERT-style) encoder language model:
  token ``nn.Embedding(32_000, 512)`` (a sparse layer, 128 rows a sample),
  fixed sinusoidal positions, 6 pre-norm ``nn.TransformerEncoderLayer`` of
  8 heads and feed-forward 2048, a final LayerNorm and an untied LM head
  ``nn.Linear(512, 32_000)`` over every position; sequence length 128.
  The head is untied so that the token embedding stays a pure sparse table
  (a tied head would read the whole table densely every step).
* ``bert_base``, ``bert_large``: BERT encoders (12 layers of width 768 and 12
  heads; 24 layers of width 1024 and 16 heads) with the SQuAD span head
  ``nn.Linear(hidden, 2)``, as fine-tuned on SQuAD: word, position and
  token-type embeddings (vocabulary 30,522), post-norm layers with separate Q,
  K and V projections, the attention scores, softmax and context as layers of
  their own, GELU feed-forward of 4x the width. ``seq_len`` (default 384, at
  most 512) is a size like the others: the committed layer lists are at 384.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from sim.workload import Model, load_model_file, save_model_file

ZOO_DIR = Path(__file__).with_name("zoo_data")
_NAMES = ("mlp", "ctr_dnn", "wide_deep", "resnet18", "resnet50", "vgg16", "transformer",
          "bert_base", "bert_large")


def names() -> list[str]:
    """Names of the zoo models, in a fixed order."""
    return list(_NAMES)


@functools.cache
def get(name: str) -> Model:
    """The committed layer list of zoo model ``name`` (does not import torch).

    Raises:
        KeyError: if ``name`` is not a zoo model.
    """
    if name not in _NAMES:
        raise KeyError(name)
    return load_model_file(ZOO_DIR / f"{name}.yaml")


def torch_module(name: str, *, batch_size: int = 2, seed: int = 0, **kwargs: Any) -> tuple[Any, Any]:
    """Build zoo model ``name`` as a torch module with an example input.

    Args:
        name: a zoo name.
        batch_size: dim 0 of the example input.
        seed: seeds the weights and the example input (the global torch RNG is
            left as it was).
        **kwargs: model sizes, see the module docstring and the builders
            (:data:`sim.zoo_torch.BUILDERS`).

    Returns:
        ``(module, example_input)``; the module is in train mode, the input a
        tensor or a tuple of tensors (integer ids for embedding inputs).

    Raises:
        KeyError: if ``name`` is not a zoo model.
    """
    if name not in _NAMES:
        raise KeyError(name)
    import torch

    from sim.zoo_torch import BUILDERS  # torch loads only when a module is built

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return BUILDERS[name](batch_size, **kwargs)


def regenerate(out_dir: str | Path = ZOO_DIR, only: Iterable[str] | None = None) -> list[Path]:
    """Rebuild the zoo YAML files from the torch modules.

    Args:
        out_dir: where to write ``{name}.yaml``.
        only: the models to rebuild; all by default.

    Returns:
        The paths written.
    """
    from sim.torch_extract import from_torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in only if only is not None else _NAMES:
        module, example = torch_module(name)
        path = out / f"{name}.yaml"
        save_model_file(from_torch(module, example, name=name), path)
        written.append(path)
    get.cache_clear()
    return written


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m sim.zoo [--out DIR] [NAME ...]``: rebuild the zoo YAML files."""
    ap = argparse.ArgumentParser(prog="python -m sim.zoo", description=main.__doc__)
    ap.add_argument("names", nargs="*", metavar="NAME",
                    help=f"models to rebuild (default: all of {', '.join(_NAMES)})")
    ap.add_argument("--out", default=str(ZOO_DIR), help="output folder (default: sim/zoo_data)")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.names) - set(_NAMES))
    if unknown:
        ap.error(f"unknown model {unknown[0]!r}; the zoo has {', '.join(_NAMES)}")
    for path in regenerate(args.out, args.names or None):
        m = load_model_file(path)
        print(f"{path}: {len(m.layers)} layers, {m.param_bytes / 1e6:.1f} MB params, "
              f"{m.fwd_flops / 1e9:.3f} GFLOP/sample fwd")


if __name__ == "__main__":
    main()
