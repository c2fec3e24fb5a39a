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
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from sim.workload import Model, load_model_file, save_model_file

ZOO_DIR = Path(__file__).with_name("zoo_data")
_NAMES = ("mlp", "ctr_dnn", "wide_deep", "resnet18", "resnet50", "vgg16", "transformer")


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
        **kwargs: model sizes, see the module docstring and the builders.

    Returns:
        ``(module, example_input)``; the module is in train mode, the input a
        tensor or a tuple of tensors (integer ids for embedding inputs).

    Raises:
        KeyError: if ``name`` is not a zoo model.
    """
    import torch

    builders = _builders()
    if name not in builders:
        raise KeyError(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return builders[name](batch_size, **kwargs)


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


# -- torch modules -------------------------------------------------------------
# Everything below imports torch lazily so that `get` stays torch-free.


@functools.cache
def _builders() -> dict[str, Callable[..., tuple[Any, Any]]]:
    import torch
    from torch import nn

    def mlp_stack(widths: Sequence[int]) -> nn.Sequential:
        mods: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
            mods.append(nn.Linear(a, b))
            if i < len(widths) - 2:
                mods.append(nn.ReLU())
        return nn.Sequential(*mods)

    def mlp(batch: int, in_features: int = 784, hidden: Sequence[int] = (1024, 1024),
            classes: int = 10) -> tuple[nn.Module, Any]:
        return mlp_stack([in_features, *hidden, classes]), torch.randn(batch, in_features)

    class CtrDnn(nn.Module):
        """Embeddings of categorical fields + dense features -> MLP -> click logit."""

        def __init__(self, fields: int, rows: int, dim: int, dense: int,
                     hidden: Sequence[int]) -> None:
            super().__init__()
            self.emb = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(fields))
            self.mlp = mlp_stack([fields * dim + dense, *hidden, 1])

        def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
            x = [e(ids[:, i]) for i, e in enumerate(self.emb)]
            return self.mlp(torch.cat([*x, dense], dim=1))

    def ctr_dnn(batch: int, fields: int = 26, rows: int = 100_000, dim: int = 16,
                dense: int = 13, hidden: Sequence[int] = (512, 256)) -> tuple[nn.Module, Any]:
        m = CtrDnn(fields, rows, dim, dense, hidden)
        return m, (torch.randint(0, rows, (batch, fields)), torch.randn(batch, dense))

    class WideDeep(nn.Module):
        """Wide (linear over sparse ids) + deep (embeddings and dense -> MLP) logits."""

        offsets: torch.Tensor

        def __init__(self, fields: int, rows: int, dim: int, dense: int,
                     hidden: Sequence[int]) -> None:
            super().__init__()
            # field i's ids live at rows [i*rows, (i+1)*rows) of the wide table
            self.register_buffer("offsets", torch.arange(fields) * rows, persistent=False)
            self.wide = nn.EmbeddingBag(fields * rows, 1, mode="sum")
            self.emb = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(fields))
            self.deep = mlp_stack([fields * dim + dense, *hidden, 1])

        def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
            wide = self.wide(ids + self.offsets)
            x = [e(ids[:, i]) for i, e in enumerate(self.emb)]
            return wide + self.deep(torch.cat([*x, dense], dim=1))

    def wide_deep(batch: int, fields: int = 26, rows: int = 50_000, dim: int = 32,
                  dense: int = 13, hidden: Sequence[int] = (1024, 512, 256)
                  ) -> tuple[nn.Module, Any]:
        m = WideDeep(fields, rows, dim, dense, hidden)
        return m, (torch.randint(0, rows, (batch, fields)), torch.randn(batch, dense))

    def conv_bn(cin: int, cout: int, k: int, stride: int = 1) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, k, stride, padding=k // 2, bias=False), nn.BatchNorm2d(cout)]

    class BasicBlock(nn.Module):
        expansion = 1

        def __init__(self, cin: int, planes: int, stride: int) -> None:
            super().__init__()
            self.conv1, self.bn1 = conv_bn(cin, planes, 3, stride)
            self.conv2, self.bn2 = conv_bn(planes, planes, 3)
            self.relu = nn.ReLU(inplace=True)
            out = planes * self.expansion
            self.downsample = (nn.Sequential(*conv_bn(cin, out, 1, stride))
                               if stride != 1 or cin != out else None)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            identity = x if self.downsample is None else self.downsample(x)
            return self.relu(out + identity)

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin: int, planes: int, stride: int) -> None:
            super().__init__()
            out = planes * self.expansion
            self.conv1, self.bn1 = conv_bn(cin, planes, 1)
            self.conv2, self.bn2 = conv_bn(planes, planes, 3, stride)
            self.conv3, self.bn3 = conv_bn(planes, out, 1)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = (nn.Sequential(*conv_bn(cin, out, 1, stride))
                               if stride != 1 or cin != out else None)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            identity = x if self.downsample is None else self.downsample(x)
            return self.relu(out + identity)

    class ResNet(nn.Module):
        def __init__(self, block: type[BasicBlock] | type[Bottleneck], blocks: Sequence[int],
                     classes: int) -> None:
            super().__init__()
            self.conv1, self.bn1 = conv_bn(3, 64, 7, 2)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, padding=1)
            self.cin = 64
            self.layer1 = self._stage(block, 64, blocks[0], 1)
            self.layer2 = self._stage(block, 128, blocks[1], 2)
            self.layer3 = self._stage(block, 256, blocks[2], 2)
            self.layer4 = self._stage(block, 512, blocks[3], 2)
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(self.cin, classes)

        def _stage(self, block: type[BasicBlock] | type[Bottleneck], planes: int, n: int,
                   stride: int) -> nn.Sequential:
            stages = []
            for j in range(n):
                stages.append(block(self.cin, planes, stride if j == 0 else 1))
                self.cin = planes * block.expansion
            return nn.Sequential(*stages)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    def image(batch: int, size: int) -> torch.Tensor:
        return torch.randn(batch, 3, size, size)

    def resnet18(batch: int, classes: int = 1000, size: int = 224) -> tuple[nn.Module, Any]:
        return ResNet(BasicBlock, (2, 2, 2, 2), classes), image(batch, size)

    def resnet50(batch: int, classes: int = 1000, size: int = 224) -> tuple[nn.Module, Any]:
        return ResNet(Bottleneck, (3, 4, 6, 3), classes), image(batch, size)

    class VGG(nn.Module):
        def __init__(self, cfg: Sequence[int | str], classes: int) -> None:
            super().__init__()
            mods: list[nn.Module] = []
            cin = 3
            for v in cfg:
                if v == "M":
                    mods.append(nn.MaxPool2d(2, 2))
                else:
                    mods += [nn.Conv2d(cin, int(v), 3, padding=1), nn.ReLU(inplace=True)]
                    cin = int(v)
            self.features = nn.Sequential(*mods)
            self.avgpool = nn.AdaptiveAvgPool2d(7)
            self.classifier = nn.Sequential(
                nn.Linear(cin * 49, 4096), nn.ReLU(inplace=True), nn.Dropout(),
                nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(),
                nn.Linear(4096, classes),
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))

    vgg16_cfg = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                 512, 512, 512, "M")

    def vgg16(batch: int, classes: int = 1000, size: int = 224) -> tuple[nn.Module, Any]:
        return VGG(vgg16_cfg, classes), image(batch, size)

    class TransformerLM(nn.Module):
        """Token embedding + sinusoidal positions -> pre-norm encoder -> LM head."""

        pos: torch.Tensor

        def __init__(self, vocab: int, d_model: int, heads: int, layers: int, seq_len: int,
                     ff: int, dropout: float) -> None:
            super().__init__()
            self.scale = math.sqrt(d_model)
            self.tok = nn.Embedding(vocab, d_model)
            pos = torch.arange(seq_len, dtype=torch.float32)[:, None]
            freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10_000.0) / d_model))
            pe = torch.zeros(seq_len, d_model)
            pe[:, 0::2] = torch.sin(pos * freq)
            pe[:, 1::2] = torch.cos(pos * freq)
            self.register_buffer("pos", pe, persistent=False)
            self.drop = nn.Dropout(dropout)
            layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout, batch_first=True,
                                               norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(d_model),
                                                 enable_nested_tensor=False)
            self.head = nn.Linear(d_model, vocab)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.tok(ids) * self.scale + self.pos[: ids.shape[1]]
            return self.head(self.encoder(self.drop(x)))

    def transformer(batch: int, vocab: int = 32_000, d_model: int = 512, heads: int = 8,
                    layers: int = 6, seq_len: int = 128, ff: int | None = None,
                    dropout: float = 0.1) -> tuple[nn.Module, Any]:
        m = TransformerLM(vocab, d_model, heads, layers, seq_len, ff or 4 * d_model, dropout)
        return m, torch.randint(0, vocab, (batch, seq_len))

    return {"mlp": mlp, "ctr_dnn": ctr_dnn, "wide_deep": wide_deep, "resnet18": resnet18,
            "resnet50": resnet50, "vgg16": vgg16, "transformer": transformer}


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
