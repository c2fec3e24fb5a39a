"""Fit the convergence model of zoo models from small real torch runs on CPU.

Config: for each model, a student (the zoo architecture, seed 0) learns a
teacher (the same architecture with other weights, seed 1) on synthetic
Gaussian inputs with plain SGD, under a few batch sizes, gradient bit widths
(per-tensor max-abs scale, stochastic rounding to 2^(bits-1) levels per sign)
and staleness values (the gradient is computed on the parameters of ``s``
updates ago and applied to the current ones). The loss on a fixed held-out
set is recorded at log-spaced sample counts.

The targets carry label noise, so the attainable loss is above 0: mlp
regresses the teacher's standardised outputs plus Gaussian noise (MSE);
ctr_dnn learns Bernoulli clicks drawn from the teacher's click probability
(binary cross-entropy); resnet18 and vgg16 learn class labels drawn from the
teacher's softmax over 10 classes (cross-entropy). For ctr_dnn and the
classifiers the held-out loss is the expected loss over the label noise
(cross-entropy to the teacher's probabilities), whose floor is the teacher's
own loss (``teacher_loss`` in the JSON meta).

Image inputs are a smooth part (4x4 Gaussian noise upsampled) plus white
noise, and the image teachers are first trained briefly (Adam) on a hidden
rule of the input's coarse colours: a randomly initialised deep convnet maps
white noise to an output that barely depends on the input, which no student
learns in a CPU budget. The learning rate is fixed per model and scaled down
linearly below batch 32 (otherwise constant-rate SGD stalls at a noise floor
at batch 8 that the batch discount cannot describe).

vgg16 (student and teacher) is initialised differently (INIT, see build):
looks-linear weights, hidden layers scaled to unit output std, output layer
0. Its 16 ReLU layers have no normalisation and no skips, and under any
independent init the representations of different inputs become nearly
equal with depth, so SGD starts on a long plateau (measured below); the
training algorithm is the same SGD as for the other models.

The fits describe SMALL INSTANCES of the architectures, not the zoo's full
sizes (see SIZES, also written to each JSON's meta): mlp 64-128-128-10;
ctr_dnn 8 fields of 10 rows; resnet18 and vgg16 keep their layer structure
(resnet18: 4 stages of 2 basic blocks; vgg16: 13 convolutions in 5 pooled
stages and 3 fully connected layers) but take 3x32x32 inputs, 10 classes and
every hidden width multiplied by ``width`` (resnet18 1/8: 8..64 channels;
vgg16 1/8: 8..64 channels and 512-wide classifier). Each model's whole run
takes minutes on one CPU thread.

The fit's asymptote is bounded below by the teacher's own loss (fit's
``L_inf_min``): the held-out loss of ctr_dnn and the classifiers is a
cross-entropy to the teacher's probabilities, never below their entropy.
``--refit`` refits the curves stored in a JSON with that bound, without
training.

Outputs: <out>/<model>.json (default sim/convergence_fits/: the fit, its RMSE
of log-loss overall and per curve, and the curves; a degenerate fit, see
MIN_ALPHA, goes to <out>/unusable/ instead, and either replaces the model's
file on the other side) and a table of fit errors on stdout.

Fits and the vgg16 initialisation study: docs/notes/2026-11-30-convergence-fits.md.

    python -m experiments.fit_convergence [--models resnet18 vgg16] [--samples N] [--out DIR] [--refit]
"""

from __future__ import annotations

import argparse
import math
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from sim import zoo
from sim.convergence import (
    FITS_DIR,
    ConvergenceModel,
    Curve,
    Fit,
    fit,
    load,
    save,
    typical_tensor_elems,
)

#: builder arguments of each small instance; ``width`` multiplies every hidden width
SIZES: dict[str, dict[str, Any]] = {
    "mlp": {"in_features": 64, "hidden": (128, 128), "classes": 10},
    "ctr_dnn": {"fields": 8, "rows": 10, "dim": 8, "dense": 13, "hidden": (64, 32)},
    "resnet18": {"classes": 10, "size": 32, "width": 1 / 8},
    "vgg16": {"classes": 10, "size": 32, "width": 1 / 8},
}
#: SGD learning rate at batch >= LR_REF_BATCH; smaller batches take it scaled by batch / LR_REF_BATCH
LR = {"mlp": 0.2, "ctr_dnn": 0.3, "resnet18": 0.05, "vgg16": 0.003}
LR_REF_BATCH = 32
#: samples per run (``--samples`` overrides)
SAMPLES = {"mlp": 65536, "ctr_dnn": 524288, "resnet18": 49152, "vgg16": 65536}
#: Adam steps that train an image teacher on a hidden rule before it labels anything
TEACHER_STEPS = {"resnet18": 300, "vgg16": 400}
#: weight init where PyTorch's default is not used (see build)
INIT = {"vgg16": "looks-linear (Balduzzi et al. 2017), hidden layers scaled to unit output std "
                 "on 256 inputs (LSUV's data-dependent step), output layer 0"}
#: teacher logit scale: larger is less label noise (a lower attainable loss)
SHARPNESS = {"ctr_dnn": 4.0, "resnet18": 3.0, "vgg16": 3.0}
#: (batch, staleness, bits) of each run
RUNS = [(8, 0, 32), (32, 0, 32), (128, 0, 32), (32, 2, 32), (32, 8, 32),
        (32, 0, 8), (32, 0, 4), (32, 0, 2)]
#: a fit with a smaller exponent or an asymptote at 0 describes a curve still on its first
#: plateau, not a power law; it goes to <out>/unusable/ so that no time to target uses it
MIN_ALPHA = 0.1
EVAL_N = 1024
POINTS = 24


def narrow(m: nn.Module, width: float, in_channels: int = 3) -> nn.Module:
    """Multiply every hidden width of ``m`` by ``width`` in place, keeping its structure.

    Replaces each Conv2d, BatchNorm2d and Linear by a freshly initialised one
    with its channels / features scaled, except the network's input channels
    (the first convolution's) and output features (the last Linear's). Works
    on a module built on the meta device, so the full-size weights are never
    allocated.
    """
    def sc(c: int) -> int:
        return max(1, round(c * width))

    linears = [x for x in m.modules() if isinstance(x, nn.Linear)]
    last = linears[-1] if linears else None
    first = [True]

    def rec(mod: nn.Module) -> None:
        for name, ch in mod.named_children():
            if isinstance(ch, nn.Conv2d):
                cin = in_channels if first[0] else sc(ch.in_channels)
                first[0] = False
                new: nn.Module = nn.Conv2d(cin, sc(ch.out_channels), ch.kernel_size, ch.stride,  # type: ignore[arg-type]
                                           ch.padding, bias=ch.bias is not None)  # type: ignore[arg-type]
            elif isinstance(ch, nn.BatchNorm2d):
                new = nn.BatchNorm2d(sc(ch.num_features))
            elif isinstance(ch, nn.Linear):
                out = ch.out_features if ch is last else sc(ch.out_features)
                new = nn.Linear(sc(ch.in_features), out, bias=ch.bias is not None)
            else:
                rec(ch)
                continue
            setattr(mod, name, new)

    rec(m)
    return m


def build(name: str, seed: int) -> nn.Module:
    """The small instance of zoo model ``name`` (SIZES), weights seeded by ``seed``."""
    kw = dict(SIZES[name])
    width = kw.pop("width", 1.0)
    if width == 1.0:
        return zoo.torch_module(name, seed=seed, **kw)[0]
    with torch.device("meta"):
        m, _ = zoo.torch_module(name, seed=seed, **kw)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        narrow(m, width)
        if name == "vgg16":
            # 16 ReLU layers without normalisation or skips: under any independent init (PyTorch's,
            # He fan-in or fan-out, LSUV) the last convolution's output is 95% the same for every
            # input and the logits 99.8%, so SGD sits on a plateau; see init_looks_linear
            init_looks_linear(m, torch.Generator().manual_seed(10_000 + seed))
            scale_to_unit_output(m, data(name, 256, torch.Generator().manual_seed(1_000 + seed)))
            # output layer at 0: uniform first predictions (loss ln 10, where the other models
            # start too) instead of logits of std ~1.8 (loss ~3.5); its gradient is not 0,
            # since the features below it depend on the input
            nn.init.zeros_(_weighted(m)[-1].weight)
    assert not any(t.is_meta for t in [*m.parameters(), *m.buffers()])
    return m


def _weighted(m: nn.Module) -> list[nn.Conv2d | nn.Linear]:
    return [x for x in m.modules() if isinstance(x, (nn.Conv2d, nn.Linear))]


def init_looks_linear(m: nn.Module, gen: torch.Generator) -> None:
    """Looks-linear init (Balduzzi et al. 2017, "The shattered gradients problem") of a plain
    chain of convolutions and Linears with ReLUs, in place; biases 0.

    Every hidden layer's channels come in mirrored pairs (c, c + C/2) and its weight is
    [[W, -W], [-W, W]] on them, W Gaussian with variance 1 / fan-in; the first layer takes the
    raw input ([W; -W]), the last gives the outputs ([W, -W]). Since relu(u) - relu(-u) = u,
    the network computes a linear map of its input at init, so a deep net's output still
    depends on its input (max pooling and dropout bend this only a little), where with
    independent weights the ReLUs make different inputs' representations ever more alike
    with depth. A Linear after a convolution sees the convolution's C channels each repeated
    in_features / C times (VGG's adaptive pooling), flattened channel-major.
    """
    layers = _weighted(m)
    channels = 0  # output channels of the previous layer (0: the raw input, not mirrored)
    for i, layer in enumerate(layers):
        w = layer.weight
        out, c_in = w.shape[0], (w.shape[1] if channels == 0 else channels)
        mirror_out = i < len(layers) - 1
        if (mirror_out and out % 2) or (channels and c_in % 2):
            raise ValueError(f"looks-linear needs even widths, layer {i} has {out}x{c_in}")
        per_channel = w[0].numel() // c_in  # kernel positions, or repeats of a flattened channel
        rows, cols = (out // 2 if mirror_out else out), (c_in // 2 if channels else c_in)
        half = torch.randn(rows, cols, per_channel, generator=gen) / math.sqrt(cols * per_channel)
        top = torch.cat([half, -half], 1) if channels else half
        full = torch.cat([top, -top], 0) if mirror_out else top
        with torch.no_grad():
            w.copy_(full.reshape(w.shape))
            if layer.bias is not None:
                layer.bias.zero_()
        channels = out


def scale_to_unit_output(m: nn.Module, x: torch.Tensor) -> None:
    """Scale each hidden layer's weight so that its output has standard deviation 1 on ``x``,
    first layer first (the data-dependent step of LSUV, Mishkin & Matas 2016); the output
    layer is left as it is."""
    m.eval()
    seen: list[torch.Tensor] = []
    for layer in _weighted(m)[:-1]:
        seen.clear()
        hook = layer.register_forward_hook(lambda _m, _i, o: seen.append(o))
        with torch.no_grad():
            m(x)
            layer.weight.mul_(1.0 / seen[0].std())
        hook.remove()


def data(name: str, n: int, gen: torch.Generator) -> Any:
    s = SIZES[name]
    if name == "mlp":
        return torch.randn(n, s["in_features"], generator=gen)
    if name == "ctr_dnn":
        return (torch.randint(0, s["rows"], (n, s["fields"]), generator=gen),
                torch.randn(n, s["dense"], generator=gen))
    # images: a smooth part (4x4 Gaussian upsampled) plus white noise. On white noise alone a
    # random deep convnet's output hardly depends on the input, and nothing is learnt.
    lo = torch.randn(n, 3, 4, 4, generator=gen)
    smooth = nn.functional.interpolate(lo, size=(s["size"], s["size"]), mode="bilinear", align_corners=False)
    return smooth + 0.5 * torch.randn(n, 3, s["size"], s["size"], generator=gen)


def train_teacher(name: str, teacher: nn.Module) -> None:
    """Give an image teacher an input-dependent function: Adam on a hidden rule (the class is
    the argmax of a fixed random linear map of the image's 2x2 average-pooled colours)."""
    gen = torch.Generator().manual_seed(7)
    rule = torch.randn(SIZES[name]["classes"], 12, generator=gen)
    opt = torch.optim.Adam(teacher.parameters(), lr=1e-3)
    teacher.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(8)  # dropout
        for _ in range(TEACHER_STEPS[name]):
            x = data(name, 64, gen)
            y = (nn.functional.adaptive_avg_pool2d(x, 2).flatten(1) @ rule.T).argmax(1)
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(teacher(x), y).backward()
            opt.step()


def call(m: nn.Module, x: Any) -> torch.Tensor:
    return m(*x) if isinstance(x, tuple) else m(x)


def call_chunked(m: nn.Module, x: Any, chunk: int = 512) -> torch.Tensor:
    if isinstance(x, tuple):
        return call(m, x)
    return torch.cat([m(x[i:i + chunk]) for i in range(0, x.shape[0], chunk)])


class Task:
    """Teacher, label noise and loss of one model (see the module docstring).

    ``train_targets`` are noisy labels; ``eval_targets`` are what the held-out
    loss compares to (noisy labels for mlp, the teacher's probabilities for
    the others, so the held-out loss is the expected loss over the noise).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        teacher = build(name, seed=1)
        if name in TEACHER_STEPS:
            train_teacher(name, teacher)
        gen = torch.Generator().manual_seed(2)
        probe = data(name, 4096, gen)
        with torch.no_grad():
            bns = [x for x in teacher.modules() if isinstance(x, nn.BatchNorm2d)]
            if bns:  # a random teacher's BN statistics: those of its own activations
                for bn in bns:
                    bn.reset_running_stats()
                    bn.momentum = None  # cumulative average
                teacher.train()
                call_chunked(teacher, probe)
            teacher.eval()
            out = call_chunked(teacher, probe)
        self.mu, self.sd = out.mean(0), out.std(0)
        self.teacher = teacher
        self.kind = {"mlp": "mse", "ctr_dnn": "bce"}.get(name, "ce")

    def _z(self, x: Any) -> torch.Tensor:
        with torch.no_grad():
            return (call_chunked(self.teacher, x) - self.mu) / self.sd

    def _probs(self, x: Any) -> torch.Tensor:
        z = SHARPNESS.get(self.name, 1.0) * self._z(x)
        return torch.sigmoid(z) if self.kind == "bce" else torch.softmax(z, dim=1)

    def train_targets(self, x: Any, gen: torch.Generator) -> torch.Tensor:
        if self.kind == "mse":
            z = self._z(x)
            return z + 0.1 * torch.randn(z.shape, generator=gen)
        p = self._probs(x)
        if self.kind == "bce":
            return torch.bernoulli(p, generator=gen)
        return torch.multinomial(p, 1, generator=gen).squeeze(1)

    def eval_targets(self, x: Any, gen: torch.Generator) -> torch.Tensor:
        return self.train_targets(x, gen) if self.kind == "mse" else self._probs(x)

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.kind == "bce":
            return nn.functional.binary_cross_entropy_with_logits(out, y)
        if self.kind == "ce":
            return nn.functional.cross_entropy(out, y)  # y: class ids or probabilities
        return nn.functional.mse_loss(out, y)

    def floor(self, y_eval: torch.Tensor) -> float:
        """The loss of the teacher itself on the held-out targets (the noise's entropy; 0 for mse)."""
        if self.kind == "mse":
            return 0.0
        p = y_eval.clamp_min(1e-12)
        if self.kind == "bce":
            q = (1 - y_eval).clamp_min(1e-12)
            return float(-(y_eval * p.log() + (1 - y_eval) * q.log()).mean())
        return float(-(y_eval * p.log()).sum(1).mean())


def quantize(g: torch.Tensor, bits: int, gen: torch.Generator) -> torch.Tensor:
    """Per-tensor max-abs scale, stochastic rounding to 2^(bits-1) levels per sign (unbiased)."""
    if bits >= 32:
        return g
    s = 2 ** (bits - 1)
    scale = g.abs().max()
    if scale == 0:
        return g
    v = g.abs() / scale * s
    lo = v.floor()
    up = torch.rand(v.shape, generator=gen) < (v - lo)
    return torch.sign(g) * (lo + up.float()) * scale / s


def train(task: Task, batch: int, staleness: int, bits: int, total: int, seed: int = 0) -> Curve:
    name = task.name
    student = build(name, seed=0)
    params = list(student.parameters())
    gen = torch.Generator().manual_seed(100 + seed)
    qgen = torch.Generator().manual_seed(200 + seed)  # quantization noise apart: same data in every run
    x_eval = data(name, EVAL_N, torch.Generator().manual_seed(3))
    y_eval = task.eval_targets(x_eval, torch.Generator().manual_seed(4))
    steps = total // batch
    marks = sorted({max(1, int(round(k))) for k in np.geomspace(1, steps, POINTS)})
    history: deque[list[torch.Tensor]] = deque(maxlen=staleness + 1)
    samples, losses = [], []
    lr = LR[name] * min(1.0, batch / LR_REF_BATCH)
    for step in range(1, steps + 1):
        x = data(name, batch, gen)
        y = task.train_targets(x, gen)
        history.append([p.detach().clone() for p in params])
        current = [p.detach().clone() for p in params]
        with torch.no_grad():  # evaluate the gradient on the oldest kept parameters
            for p, old in zip(params, history[0]):
                p.copy_(old)
        student.train()
        student.zero_grad(set_to_none=True)
        task.loss(call(student, x), y).backward()
        with torch.no_grad():
            for p, cur in zip(params, current):
                g = quantize(p.grad, bits, qgen) if p.grad is not None else 0.0
                p.copy_(cur - lr * g)
        if step in marks:
            student.eval()
            with torch.no_grad():
                losses.append(float(task.loss(call_chunked(student, x_eval), y_eval)))
            samples.append(float(step * batch))
    elems = typical_tensor_elems(p.numel() for p in params)
    return Curve(tuple(samples), tuple(losses), batch, float(staleness), bits, elems)


def curve_rmse(model: ConvergenceModel, cv: Curve, min_samples: float) -> float:
    """RMSE of log-loss of ``model`` on the points of ``cv`` that the fit used."""
    n = np.asarray(cv.samples)
    keep = n >= min_samples
    pred = model.loss(n[keep] * model.discount(cv.batch, cv.staleness, cv.bits, cv.tensor_elems))
    err = np.log(pred) - np.log(np.asarray(cv.loss)[keep])
    return float(np.sqrt(np.mean(err**2)))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=None, help="samples per run (default: SAMPLES)")
    ap.add_argument("--models", nargs="*", default=list(SIZES))
    ap.add_argument("--min-samples", type=float, default=2048.0, help="fit points from here on")
    ap.add_argument("--out", type=Path, default=FITS_DIR, help="where <model>.json goes")
    ap.add_argument("--refit", action="store_true",
                    help="no training: refit the curves stored in <out>/<model>.json (or unusable/) "
                         "with the asymptote bounded below by their meta's teacher_loss")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models:
        t0 = time.perf_counter()
        if args.refit:
            stored = args.out / f"{name}.json"
            if not stored.is_file():
                stored = args.out / "unusable" / f"{name}.json"
            if not stored.is_file():
                print(f"fit_convergence: {name}: no stored fit in {args.out} to refit; skipped")
                continue
            old = load(stored)
            if "teacher_loss" not in old.meta:
                # fits made before the floor was recorded (mlp.json): nothing to bound by
                print(f"fit_convergence: {name}: {stored} records no teacher_loss (an older version "
                      "of this script made it); not refitted")
                continue
            curves, floor, meta = list(old.curves), float(old.meta["teacher_loss"]), dict(old.meta)
        else:
            total = args.samples or SAMPLES[name]
            task = Task(name)
            curves = [train(task, b, s, q, total) for b, s, q in RUNS]
            floor = task.floor(task.eval_targets(data(name, EVAL_N, torch.Generator().manual_seed(3)),
                                                 torch.Generator().manual_seed(4)))
            meta = {"script": "experiments/fit_convergence.py", "sizes": SIZES[name], "lr": LR[name],
                    "lr_ref_batch": LR_REF_BATCH, "teacher_adam_steps": TEACHER_STEPS.get(name),
                    "teacher_sharpness": SHARPNESS.get(name), "teacher_loss": floor,
                    "samples_per_run": total, "eval_samples": EVAL_N, "runs_batch_staleness_bits": RUNS,
                    "init": INIT.get(name, "pytorch default"), "train_s": time.perf_counter() - t0,
                    "note": "small instances of the zoo architecture (sizes), plain SGD, synthetic "
                            "inputs, labels from a random teacher of the same architecture with noise"}
        # the held-out loss is a cross-entropy to the teacher's probabilities (or mse to noisy
        # targets, floor 0), never below the teacher's own loss: the asymptote may not be either
        model, rmse = fit(curves, min_samples=args.min_samples, L_inf_min=floor)
        per_curve = [curve_rmse(model, cv, args.min_samples) for cv in curves]
        usable = model.alpha >= MIN_ALPHA and model.L_inf > 1e-6 * min(min(cv.loss) for cv in curves)
        meta.update({"min_samples": args.min_samples, "L_inf_min": floor,
                     "rmse_log_loss_per_curve": per_curve, "usable": usable})
        out = args.out if usable else args.out / "unusable"
        out.mkdir(parents=True, exist_ok=True)
        save(out / f"{name}.json", Fit(model, rmse, tuple(curves), meta))
        # the new fit supersedes the model's fit on the other side (usable / unusable)
        (args.out / "unusable" / f"{name}.json" if usable else args.out / f"{name}.json").unlink(missing_ok=True)
        rows.append((name if usable else f"{name}*", model, rmse, per_curve, floor, time.perf_counter() - t0))
    print(f"{'model':9} {'L_inf':>7} {'teacher':>7} {'a':>9} {'alpha':>6} {'B_crit':>8} {'k_stale':>8} "
          f"{'c_quant':>9} {'rmse_log':>8} {'s':>6}")
    for name, m, rmse, _, floor, dt in rows:
        print(f"{name:9} {m.L_inf:7.4f} {floor:7.4f} {m.a:9.3g} {m.alpha:6.3f} {m.critical_batch:8.1f} "
              f"{m.staleness_penalty:8.4f} {m.quant_penalty:9.3g} {rmse:8.4f} {dt:6.1f}")
    if any(r[0].endswith("*") for r in rows):
        print(f"* degenerate (alpha < {MIN_ALPHA} or L_inf = 0): written to {args.out / 'unusable'}")
    print("\nRMSE of log-loss per curve (batch/staleness/bits):")
    print(f"{'model':9} " + " ".join(f"{f'{b}/{s}/{q}':>8}" for b, s, q in RUNS))
    for name, _, _, per_curve, _, _ in rows:
        print(f"{name:9} " + " ".join(f"{e:8.4f}" for e in per_curve))


if __name__ == "__main__":
    main()
