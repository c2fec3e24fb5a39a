"""Workloads: layer extraction from torch, the zoo, and the layer-list file format."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from hardware_profiles.errors import ConfigError
from sim import zoo
from sim.torch_extract import from_torch
from sim.workload import (
    Layer,
    Model,
    Sparse,
    load_model_file,
    model_from_dict,
    save_model_file,
)

REPO = Path(__file__).resolve().parents[1]


def _reference_flops(module: nn.Module, example: object) -> tuple[int, int]:
    """FlopCounterMode's forward total, and its backward total for loss = sum(output)."""
    args = example if isinstance(example, tuple) else (example,)
    with FlopCounterMode(display=False) as fc:
        out = module(*args)
    fwd = fc.get_total_flops()
    loss = out.float().sum()
    with FlopCounterMode(display=False) as fc:
        loss.backward()
    for p in module.parameters():
        p.grad = None
    return fwd, fc.get_total_flops()


def _trainable_bytes(module: nn.Module) -> int:
    return 4 * sum(p.numel() for p in module.parameters() if p.requires_grad)


def _encoder() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, batch_first=True)
    enc = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    return enc, torch.randn(2, 16, 64)


# -- from_torch totals against FlopCounterMode ---------------------------------


#: BERT at its committed sequence length (384) takes minutes to extract on a CPU; its
#: totals are checked at seq_len 16 here and its committed file by hand below.
_SHORT = {"bert_base": {"seq_len": 16}, "bert_large": {"seq_len": 16}}


@pytest.mark.parametrize("name", [*zoo.names(), "nn.TransformerEncoder"])
def test_from_torch_totals_match_flop_counter(name: str) -> None:
    module, example = (_encoder() if name == "nn.TransformerEncoder"
                       else zoo.torch_module(name, **_SHORT.get(name, {})))
    batch = (example[0] if isinstance(example, tuple) else example).shape[0]
    model = from_torch(module, example, name=name)
    fwd, bwd = _reference_flops(module, example)
    assert fwd > 0 and bwd > 0
    assert model.fwd_flops * batch == pytest.approx(fwd, rel=0.01)
    assert model.bwd_flops * batch == pytest.approx(bwd, rel=0.01)
    # every trainable parameter counted exactly once
    assert model.param_bytes == _trainable_bytes(module)
    assert len({ly.name for ly in model.layers}) == len(model.layers)
    if name in zoo.names() and name not in _SHORT:
        # the committed YAML is what extraction gives today
        assert zoo.get(name) == model


def test_transformer_encoder_layers() -> None:
    enc, x = _encoder()
    model = from_torch(enc, x)
    per_layer = ["self_attn", "dropout1", "norm1", "linear1", "dropout", "linear2",
                 "dropout2", "norm2"]
    assert [ly.name for ly in model.layers] == [
        f"layers.{i}.{n}" for i in range(2) for n in per_layer
    ]
    attn = model.layers[0]
    # in_proj (3*64*64 + 3*64) and the out_proj it uses functionally (64*64 + 64)
    assert (attn.op, attn.param_bytes) == ("attention", 4 * (4 * 64 * 64 + 4 * 64))
    assert model.layers[3].op == "gemm"
    assert model.layers[1].op == "elementwise"
    assert model.input_bytes == 16 * 64 * 4


# -- hand-computed cases ---------------------------------------------------------


def test_sequential_mlp_by_hand() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    model = from_torch(m, torch.randn(2, 8), name="tiny")
    assert model.name == "tiny"
    assert [ly.name for ly in model.layers] == ["0", "1", "2"]
    assert [ly.op for ly in model.layers] == ["gemm", "elementwise", "gemm"]
    # forward: 2 * in * out per sample
    assert [ly.fwd_flops for ly in model.layers] == [64, 0, 16]
    # backward, FlopCounterMode convention: grad-input mm (2*in*out) + grad-weight
    # mm (2*in*out); the bias gradient (a sum) and ReLU count 0. The input needs
    # no gradient, so layer 0 runs only its grad-weight mm.
    assert [ly.bwd_flops for ly in model.layers] == [64, 0, 32]
    assert [ly.param_bytes for ly in model.layers] == [144, 0, 40]
    assert [ly.activation_bytes for ly in model.layers] == [16, 16, 8]
    assert [ly.kernels for ly in model.layers] == [1, 1, 1]
    assert model.input_bytes == 32


def test_a_pooling_window_comes_from_the_module_and_survives_the_file(tmp_path: Path) -> None:
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.MaxPool2d(3, 2, padding=1), nn.ReLU(),
                      nn.MaxPool2d(2), nn.AvgPool2d((1, 3)), nn.AdaptiveAvgPool2d(1))
    model = from_torch(m, torch.randn(2, 3, 12, 12))
    assert [ly.window for ly in model.layers] == [1, 9, 1, 4, 3, 1]
    # only a window other than 1 is written; the signature tells equal-byte pools apart
    assert model.layers[1].to_dict()["window"] == 9 and "window" not in model.layers[2].to_dict()
    assert model.layers[1].signature.endswith(":w9") and ":w" not in model.layers[2].signature
    save_model_file(model, tmp_path / "m.yaml")
    assert load_model_file(tmp_path / "m.yaml") == model


def test_inplace_comes_from_the_module_and_survives_the_file(tmp_path: Path) -> None:
    m = nn.Sequential(nn.Linear(8, 4), nn.ReLU(inplace=True), nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4),
                      nn.Dropout(inplace=True))
    model = from_torch(m, torch.randn(2, 8))
    assert [ly.inplace for ly in model.layers] == [False, True, False, False, False, True]
    # only a True is written; a file without it reads as out of place
    assert "inplace" in model.layers[1].to_dict() and "inplace" not in model.layers[3].to_dict()
    save_model_file(model, tmp_path / "m.yaml")
    assert load_model_file(tmp_path / "m.yaml") == model
    # the calibrated profile's kinds tell the two apart: elementwise/k1 and elementwise/k1i
    from hardware_profiles.schema import mem_key

    assert [mem_key(ly.op, ly.kernels, ly.param_bytes > 0, False, ly.inplace) for ly in model.layers[1:4:2]] == [
        "elementwise/k1i", "elementwise/k1"]
    assert mem_key("elementwise", 2, True, True, True) == "elementwise/k2pri"


def test_input_that_requires_grad_adds_first_layer_grad_input() -> None:
    m = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    model = from_torch(m, torch.randn(2, 8, requires_grad=True))
    assert [ly.bwd_flops for ly in model.layers] == [128, 0, 32]


def test_embedding_is_sparse() -> None:
    emb = nn.Embedding(10, 3)
    model = from_torch(emb, torch.randint(0, 10, (2, 5)))
    (ly,) = model.layers
    assert ly == Layer(name="embedding", op="embedding", fwd_flops=0, bwd_flops=0,
                       param_bytes=10 * 3 * 4, activation_bytes=5 * 3 * 4,
                       sparse=Sparse(rows_per_sample=5, row_bytes=12))
    assert model.input_bytes == 5 * 8  # int64 ids

    bag = nn.EmbeddingBag(100, 6, mode="sum")
    (ly,) = from_torch(bag, torch.randint(0, 100, (4, 7))).layers
    assert (ly.op, ly.sparse, ly.activation_bytes) == ("embedding", Sparse(7, 24), 24)


class _Custom(nn.Module):
    """Root does a functional matmul; ReLU is called twice; c shares b's weight."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.w = nn.Parameter(torch.randn(8, 4))
        self.act = nn.ReLU()
        self.unused = nn.Linear(3, 3)
        self.b = nn.Linear(4, 4)
        self.c = nn.Linear(4, 4)
        self.c.weight = self.b.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.a(x))
        h = self.act(h @ self.w)
        return self.c(self.b(h)) @ torch.ones(4, 1)


def test_parent_self_work_shared_and_unused_modules() -> None:
    model = from_torch(_Custom(), torch.randn(2, 8))
    assert [ly.name for ly in model.layers] == ["a", "act#1", "self", "act#2", "b", "c"]
    by = {ly.name: ly for ly in model.layers}
    # root: h @ w (2*8*4) and the final @ ones (2*4*1), per sample
    assert (by["self"].op, by["self"].fwd_flops) == ("gemm", 72)
    # grad of h and of w (64 each); ones needs no gradient: grad of c's output only (8)
    assert by["self"].bwd_flops == 136
    # w plus the never-called `unused` Linear, adopted by its executed parent
    assert by["self"].param_bytes == 4 * (8 * 4) + 4 * (3 * 3 + 3)
    assert by["self"].activation_bytes == 4  # output of the last matmul, [1] fp32
    # shared weight counted once, on b, the first layer that ran with it
    assert (by["b"].param_bytes, by["c"].param_bytes) == (80, 16)


def test_from_torch_leaves_module_state_alone() -> None:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Dropout(0.5), nn.Flatten(),
                      nn.Linear(4 * 6 * 6, 2))
    x = torch.randn(2, 3, 8, 8)
    rng = torch.get_rng_state()
    first = from_torch(m, x)
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(p.grad is None for p in m.parameters())
    assert int(m[1].num_batches_tracked) == 0
    assert torch.equal(m[1].running_mean, torch.zeros(4))
    assert from_torch(m, x) == first
    # Flatten is a view: no kernel, no layer
    assert [ly.name for ly in first.layers] == ["0", "1", "2", "4"]


# -- the zoo ------------------------------------------------------------------


def test_zoo_names_and_unknown() -> None:
    assert zoo.names() == ["mlp", "ctr_dnn", "wide_deep", "resnet18", "resnet50", "vgg16",
                           "transformer", "bert_base", "bert_large"]
    with pytest.raises(KeyError):
        zoo.get("alexnet")
    with pytest.raises(KeyError):
        zoo.torch_module("alexnet")


def test_zoo_known_architecture_sizes() -> None:
    # parameter counts of the reference architectures, fp32
    assert zoo.get("resnet18").param_bytes == 4 * 11_689_512
    assert zoo.get("resnet50").param_bytes == 4 * 25_557_032
    assert zoo.get("vgg16").param_bytes == 4 * 138_357_544
    for name in ("resnet18", "resnet50", "vgg16"):
        assert zoo.get(name).input_bytes == 3 * 224 * 224 * 4
    assert zoo.get("resnet50").layers[0] == Layer(
        name="conv1", op="conv", fwd_flops=2 * 64 * 112 * 112 * 3 * 7 * 7,
        bwd_flops=2 * 64 * 112 * 112 * 3 * 7 * 7, param_bytes=4 * 64 * 3 * 7 * 7,
        activation_bytes=64 * 112 * 112 * 4)


@pytest.mark.parametrize(("name", "hidden", "layers"), [("bert_base", 768, 12),
                                                      ("bert_large", 1024, 24)])
def test_bert_by_hand(name: str, hidden: int, layers: int) -> None:
    seq, ff, vocab = 384, 4 * hidden, 30_522
    m = zoo.get(name)
    # per layer: Q, K, V, output and two feed-forward GEMMs over every token, and the
    # scores and context matmuls (seq x seq x hidden each); the span head's GEMM
    per_layer = 2 * seq * (4 * hidden * hidden + 2 * hidden * ff) + 2 * 2 * seq * seq * hidden
    assert m.fwd_flops == layers * per_layer + 2 * seq * hidden * 2
    weights = (4 * (hidden * hidden + hidden) + 2 * hidden * ff + ff + hidden + 2 * 2 * hidden)
    embeddings = (vocab + 512 + 2) * hidden + 2 * hidden
    assert m.param_bytes == 4 * (layers * weights + embeddings + hidden * 2 + 2)
    names = [ly.name for ly in m.layers]
    assert names[:5] == ["word", "position", "token_type", "emb_norm", "emb_drop"]
    first = [ly for ly in m.layers if ly.name.startswith("layers.0.")]
    assert [ly.name.split(".", 2)[2] for ly in first] == [
        "q", "k", "scores", "softmax", "attn_drop", "v", "context", "out", "out_drop", "norm1",
        "ff1", "act", "ff2", "ff_drop", "norm2"]
    # the ops torch.autocast runs in fp32 are marked: softmax and the layer norms
    assert {ly.name for ly in m.layers if ly.autocast_fp32} == {"emb_norm", *(
        f"layers.{i}.{n}" for i in range(layers) for n in ("softmax", "norm1", "norm2"))}
    assert m.layers[0].sparse == Sparse(rows_per_sample=seq, row_bytes=hidden * 4)


def test_zoo_sparse_layers() -> None:
    ctr = zoo.get("ctr_dnn")
    emb = [ly for ly in ctr.layers if ly.op == "embedding"]
    assert [ly.name for ly in emb] == [f"emb.{i}" for i in range(26)]
    assert {ly.sparse for ly in emb} == {Sparse(rows_per_sample=1, row_bytes=16 * 4)}
    assert {ly.param_bytes for ly in emb} == {100_000 * 16 * 4}
    assert [ly.op for ly in ctr.layers[26:]] == [
        "gemm", "elementwise", "gemm", "elementwise", "gemm"]

    wd = zoo.get("wide_deep")
    assert wd.layers[0].name == "wide"
    assert wd.layers[0].sparse == Sparse(rows_per_sample=26, row_bytes=4)
    assert sum(ly.sparse is not None for ly in wd.layers) == 27

    lm = zoo.get("transformer")
    assert lm.layers[0].name == "tok"
    assert lm.layers[0].sparse == Sparse(rows_per_sample=128, row_bytes=512 * 4)
    assert lm.layers[-1].name == "head" and lm.layers[-1].sparse is None
    assert sum(ly.op == "attention" for ly in lm.layers) == 6


def test_zoo_get_does_not_import_torch() -> None:
    code = ("import sys; from sim import zoo; [zoo.get(n) for n in zoo.names()]; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True,
                   env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def test_regenerate_matches_committed_yaml(tmp_path: Path) -> None:
    small = ["mlp", "ctr_dnn", "wide_deep"]
    written = zoo.regenerate(tmp_path, only=small)
    assert written == [tmp_path / f"{n}.yaml" for n in small]
    for name, path in zip(small, written, strict=True):
        assert load_model_file(path) == zoo.get(name)
    zoo.main(["--out", str(tmp_path / "cli"), "mlp"])
    assert load_model_file(tmp_path / "cli" / "mlp.yaml") == zoo.get("mlp")


# -- the layer-list file format -------------------------------------------------

_TINY = Model(
    name="tiny",
    input_bytes=104.0,
    layers=(
        Layer("emb", "embedding", 0, 0, 4.0e8, 512, Sparse(26, 64)),
        Layer("fc1", "gemm", 1.0e6, 2.0e6, 2.0e6, 1024, kernels=3),
        Layer("act", "elementwise", 0, 0, 0, 1024),
    ),
)


def test_model_round_trip(tmp_path: Path) -> None:
    assert model_from_dict(_TINY.to_dict()) == _TINY
    save_model_file(_TINY, tmp_path / "tiny.yaml")
    assert load_model_file(tmp_path / "tiny.yaml") == _TINY


def test_architecture_example_file(tmp_path: Path) -> None:
    f = tmp_path / "model.yaml"
    f.write_text(
        "name: tiny\n"
        "layers:\n"
        "  - {name: emb, op: embedding, fwd_flops: 0, bwd_flops: 0,\n"
        "     param_bytes: 4.0e8, activation_bytes: 512,\n"
        "     sparse: {rows_per_sample: 26, row_bytes: 64}}\n"
        "  - {name: fc1, op: gemm, fwd_flops: 1.0e6, bwd_flops: 2.0e6,\n"
        "     param_bytes: 2.0e6, activation_bytes: 1024}\n"
    )
    m = load_model_file(f)
    assert m.layers[0].sparse == Sparse(26, 64)
    assert (m.fwd_flops, m.bwd_flops, m.param_bytes) == (1.0e6, 2.0e6, 4.0e8 + 2.0e6)


_GOOD_LAYER = ("{name: a, op: gemm, fwd_flops: 1, bwd_flops: 2, param_bytes: 3, "
               "activation_bytes: 4}")


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("name: x\nlayers: [\n  {name: a\n", "line 4"),
        (f"name: x\nfoo: 1\nlayers: [{_GOOD_LAYER}]\n", "foo"),
        ("name: x\nlayers: [{name: a, op: gemm, fwd_flops: 1, bwd_flops: 2, param_bytes: 3,"
         " activation_bytes: 4, flops: 5}]\n", "layers[0].flops"),
        ("name: x\nlayers: [{name: a, op: gemm, fwd_flops: -1, bwd_flops: 2, param_bytes: 3,"
         " activation_bytes: 4}]\n", "layers[0].fwd_flops"),
        (f"name: x\nlayers: [{_GOOD_LAYER}, {{name: b, op: lstm, fwd_flops: 1, bwd_flops: 2,"
         " param_bytes: 3, activation_bytes: 4}]\n", "layers[1].op"),
        ("name: x\nlayers: [{name: a, op: gemm, fwd_flops: 1, bwd_flops: 2,"
         " activation_bytes: 4}]\n", "layers[0].param_bytes"),
        ("name: x\nlayers: []\n", "layers"),
        ("name: x\nlayers: [{name: a, op: elementwise, fwd_flops: 0, bwd_flops: 0, param_bytes: 0,"
         " activation_bytes: 4, inplace: 1}]\n", "layers[0].inplace"),
        ("name: x\nlayers: [{name: a, op: elementwise, fwd_flops: 0, bwd_flops: 0, param_bytes: 0,"
         " activation_bytes: 4, window: 0}]\n", "layers[0].window"),
    ],
    ids=["malformed", "unknown-top", "unknown-layer", "negative", "bad-op", "missing", "empty", "inplace-not-bool",
         "window-zero"],
)
def test_load_model_file_errors_name_file_and_field(tmp_path: Path, text: str, field: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_model_file(f)
    assert (e.value.file, e.value.field) == (str(f), field)
    assert str(e.value).startswith(f"{f}: {field}: ")


def test_load_model_file_missing(tmp_path: Path) -> None:
    f = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as e:
        load_model_file(f)
    assert (e.value.file, e.value.field, str(e.value)) == (str(f), "", f"{f}: file not found")


def test_unique_names_suffix_repeats_and_clashes() -> None:
    """The one naming rule of extracted layers and of the profiler's timed layers: a repeated
    name gets #1, #2 in order; a suffixed name that a real name already has gets an _ more."""
    from sim.torch_extract import unique_names

    assert unique_names(["a", "b", "a", "a#1"]) == ["a#1", "b", "a#2", "a#1_"]
    assert unique_names(["x", "y"]) == ["x", "y"]
