"""The zoo's models as torch modules (:mod:`sim.zoo`'s torch side).

This module imports torch; :func:`sim.zoo.torch_module` imports it only when a
module is built, so that :func:`sim.zoo.get` stays torch-free. ``BUILDERS``
maps each zoo name to ``builder(batch, **sizes) -> (module, example_input)``;
the sizes and their defaults are the keyword arguments of each builder.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn


def mlp_stack(widths: Sequence[int]) -> nn.Sequential:
    """Linear layers of ``widths[i] -> widths[i+1]`` with ReLU between them."""
    mods: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        mods.append(nn.Linear(a, b))
        if i < len(widths) - 2:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def mlp(batch: int, in_features: int = 784, hidden: Sequence[int] = (1024, 1024),
        classes: int = 10) -> tuple[nn.Module, Any]:
    """``mlp``: the multilayer perceptron on random features."""
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
    """``ctr_dnn`` on random ids and dense features."""
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
    """``wide_deep`` on random ids and dense features."""
    m = WideDeep(fields, rows, dim, dense, hidden)
    return m, (torch.randint(0, rows, (batch, fields)), torch.randn(batch, dense))


def conv_bn(cin: int, cout: int, k: int, stride: int = 1) -> list[nn.Module]:
    """A bias-free k x k convolution (same padding) and its BatchNorm."""
    return [nn.Conv2d(cin, cout, k, stride, padding=k // 2, bias=False), nn.BatchNorm2d(cout)]


class BasicBlock(nn.Module):
    """ResNet-18/34 block: two 3x3 convolutions and the identity (or a 1x1 downsample)."""

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
    """ResNet-50 block: 1x1, 3x3 (with the stride), 1x1 x4 and the identity (or a downsample)."""

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
    """ImageNet ResNet: stem, four stages of ``blocks`` blocks, pooled classifier."""

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
    """A batch of random 3 x size x size images."""
    return torch.randn(batch, 3, size, size)


def resnet18(batch: int, classes: int = 1000, size: int = 224) -> tuple[nn.Module, Any]:
    """``resnet18`` on random images."""
    return ResNet(BasicBlock, (2, 2, 2, 2), classes), image(batch, size)


def resnet50(batch: int, classes: int = 1000, size: int = 224) -> tuple[nn.Module, Any]:
    """``resnet50`` on random images."""
    return ResNet(Bottleneck, (3, 4, 6, 3), classes), image(batch, size)


class VGG(nn.Module):
    """VGG: 3x3 convolutions and max pools as ``cfg`` lists them, then three linear layers."""

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


#: VGG-16, configuration D: output channels of each 3x3 convolution, "M" a 2x2 max pool
VGG16_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
             512, 512, 512, "M")


def vgg16(batch: int, classes: int = 1000, size: int = 224) -> tuple[nn.Module, Any]:
    """``vgg16`` on random images."""
    return VGG(VGG16_CFG, classes), image(batch, size)


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
    """``transformer`` on random token ids."""
    m = TransformerLM(vocab, d_model, heads, layers, seq_len, ff or 4 * d_model, dropout)
    return m, torch.randint(0, vocab, (batch, seq_len))


class BertScores(nn.Module):
    """Attention scores of every head: ``q k^T / sqrt(head_dim)`` plus the padding mask."""

    def __init__(self, heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads = heads
        self.scale = 1.0 / math.sqrt(head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, _ = q.shape
        q = q.view(b, s, self.heads, -1).transpose(1, 2)
        k = k.view(b, s, self.heads, -1).transpose(1, 2)
        return torch.matmul(q, k.transpose(-1, -2)) * self.scale + mask


class BertContext(nn.Module):
    """Attention-weighted values of every head, merged back to the hidden width."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.heads = heads

    def forward(self, probs: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, s, h = v.shape
        v = v.view(b, s, self.heads, -1).transpose(1, 2)
        return torch.matmul(probs, v).transpose(1, 2).reshape(b, s, h)


class BertLayer(nn.Module):
    """One post-norm encoder layer: self-attention (separate Q, K, V projections, so each
    is a layer of its own), then a GELU feed-forward; dropout after the attention
    probabilities and after each residual branch, as in the original BERT."""

    def __init__(self, hidden: int, heads: int, ff: int, dropout: float) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.scores = BertScores(heads, hidden // heads)
        self.softmax = nn.Softmax(dim=-1)
        self.attn_drop = nn.Dropout(dropout)
        self.context = BertContext(heads)
        self.out = nn.Linear(hidden, hidden)
        self.out_drop = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(hidden, eps=1e-12)
        self.ff1 = nn.Linear(hidden, ff)
        self.act = nn.GELU()
        self.ff2 = nn.Linear(ff, hidden)
        self.ff_drop = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        probs = self.attn_drop(self.softmax(self.scores(self.q(x), self.k(x), mask)))
        x = self.norm1(x + self.out_drop(self.out(self.context(probs, self.v(x)))))
        return self.norm2(x + self.ff_drop(self.ff2(self.act(self.ff1(x)))))


class BertQA(nn.Module):
    """BERT encoder with a SQuAD span head (start and end logits per token)."""

    def __init__(self, vocab: int, hidden: int, layers: int, heads: int, ff: int,
                 max_positions: int, dropout: float) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(max_positions, hidden)
        self.token_type = nn.Embedding(2, hidden)
        self.emb_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.emb_drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, ff, dropout) for _ in range(layers))
        self.qa = nn.Linear(hidden, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, s = ids.shape
        positions = torch.arange(s, device=ids.device).expand(b, s)
        x = self.word(ids) + self.position(positions) + self.token_type(torch.zeros_like(ids))
        x = self.emb_drop(self.emb_norm(x))
        mask = torch.zeros(b, 1, 1, s, device=ids.device)  # no padding: every token attends
        for layer in self.layers:
            x = layer(x, mask)
        return self.qa(x)


def _bert(batch: int, hidden: int, layers: int, heads: int, seq_len: int, vocab: int,
          dropout: float) -> tuple[nn.Module, Any]:
    if not 1 <= seq_len <= 512:
        raise ValueError(f"seq_len must be in 1..512 (BERT's position table), got {seq_len}")
    m = BertQA(vocab, hidden, layers, heads, 4 * hidden, 512, dropout)
    return m, torch.randint(0, vocab, (batch, seq_len))


def bert_base(batch: int, seq_len: int = 384, vocab: int = 30_522,
              dropout: float = 0.1) -> tuple[nn.Module, Any]:
    """``bert_base``: BERT-base (12 layers, width 768, 12 heads) with a SQuAD span head."""
    return _bert(batch, 768, 12, 12, seq_len, vocab, dropout)


def bert_large(batch: int, seq_len: int = 384, vocab: int = 30_522,
               dropout: float = 0.1) -> tuple[nn.Module, Any]:
    """``bert_large``: BERT-large (24 layers, width 1024, 16 heads) with a SQuAD span head."""
    return _bert(batch, 1024, 24, 16, seq_len, vocab, dropout)


#: zoo name -> builder(batch, **sizes) -> (module, example input)
BUILDERS: dict[str, Callable[..., tuple[nn.Module, Any]]] = {
    "mlp": mlp, "ctr_dnn": ctr_dnn, "wide_deep": wide_deep, "resnet18": resnet18,
    "resnet50": resnet50, "vgg16": vgg16, "transformer": transformer,
    "bert_base": bert_base, "bert_large": bert_large,
}
