"""Fit the convergence model of zoo models from small real torch runs on CPU.

Config: for each model, a student (the zoo architecture, seed 0) learns a
teacher (the same architecture with other weights, seed 1) on synthetic
inputs with plain SGD, under a few batch sizes, gradient bit widths
(per-tensor max-abs scale, stochastic rounding to 2^(bits-1) levels per sign)
and staleness values (the gradient is computed on the parameters of ``s``
updates ago and applied to the current ones). The loss on a fixed held-out
set is recorded at log-spaced sample counts.

Sizes are shrunk (see SIZES) so that every run takes seconds: the fits
describe these small instances of the architectures, not the zoo's full
sizes. resnet18 and the other large models are left out (too slow on CPU).

Outputs: sim/convergence_fits/<model>.json (the fit, its RMSE of log-loss and
the curves) and a table of fit errors on stdout.

    python -m experiments.fit_convergence [--samples N] [--models mlp ctr_dnn]
"""

from __future__ import annotations

import argparse
import time
from collections import deque
from typing import Any

import numpy as np
import torch
from torch import nn

from sim import zoo
from sim.convergence import Curve, Fit, fit, fit_path, save, typical_tensor_elems

SIZES: dict[str, dict[str, Any]] = {
    "mlp": {"in_features": 64, "hidden": (128, 128), "classes": 10},
    "ctr_dnn": {"fields": 8, "rows": 50, "dim": 8, "dense": 13, "hidden": (64, 32)},
}
LR = {"mlp": 0.2, "ctr_dnn": 0.3}
#: (batch, staleness, bits) of each run
RUNS = [(8, 0, 32), (32, 0, 32), (128, 0, 32), (32, 2, 32), (32, 8, 32), (32, 0, 8), (32, 0, 4)]
EVAL_N = 2048
POINTS = 40


def data(name: str, n: int, gen: torch.Generator) -> Any:
    s = SIZES[name]
    if name == "mlp":
        return torch.randn(n, s["in_features"], generator=gen)
    return (torch.randint(0, s["rows"], (n, s["fields"]), generator=gen),
            torch.randn(n, s["dense"], generator=gen))


def take(x: Any, i: slice) -> Any:
    return tuple(t[i] for t in x) if isinstance(x, tuple) else x[i]


def call(m: nn.Module, x: Any) -> torch.Tensor:
    return m(*x) if isinstance(x, tuple) else m(x)


class Task:
    """Teacher targets and the loss for one model: MSE to the teacher's (standardised)
    outputs for mlp; for ctr_dnn binary cross-entropy to Bernoulli labels drawn from
    the teacher's click probability."""

    def __init__(self, name: str) -> None:
        self.name = name
        teacher, _ = zoo.torch_module(name, seed=1, **SIZES[name])
        teacher.eval()
        gen = torch.Generator().manual_seed(2)
        probe = data(name, 4096, gen)
        with torch.no_grad():
            out = call(teacher, probe)
        self.mu, self.sd = out.mean(0), out.std(0)
        self.teacher = teacher

    def targets(self, x: Any, gen: torch.Generator) -> torch.Tensor:
        with torch.no_grad():
            z = (call(self.teacher, x) - self.mu) / self.sd
        if self.name == "ctr_dnn":
            return torch.bernoulli(torch.sigmoid(4.0 * z), generator=gen)
        return z + 0.1 * torch.randn(z.shape, generator=gen)

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.name == "ctr_dnn":
            return nn.functional.binary_cross_entropy_with_logits(out, y)
        return nn.functional.mse_loss(out, y)


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
    student, _ = zoo.torch_module(name, seed=0, **SIZES[name])
    params = list(student.parameters())
    gen = torch.Generator().manual_seed(100 + seed)
    x_eval = data(name, EVAL_N, torch.Generator().manual_seed(3))
    y_eval = task.targets(x_eval, torch.Generator().manual_seed(4))
    steps = total // batch
    marks = sorted({max(1, int(round(k))) for k in np.geomspace(1, steps, POINTS)})
    history: deque[list[torch.Tensor]] = deque(maxlen=staleness + 1)
    samples, losses = [], []
    lr = LR[name]
    step = 0
    for step in range(1, steps + 1):
        x = data(name, batch, gen)
        y = task.targets(x, gen)
        history.append([p.detach().clone() for p in params])
        current = [p.detach().clone() for p in params]
        with torch.no_grad():  # evaluate the gradient on the oldest kept parameters
            for p, old in zip(params, history[0]):
                p.copy_(old)
        student.zero_grad(set_to_none=True)
        task.loss(call(student, x), y).backward()
        with torch.no_grad():
            for p, cur in zip(params, current):
                g = quantize(p.grad, bits, gen) if p.grad is not None else 0.0
                p.copy_(cur - lr * g)
        if step in marks:
            with torch.no_grad():
                losses.append(float(task.loss(call(student, x_eval), y_eval)))
            samples.append(float(step * batch))
    elems = typical_tensor_elems(p.numel() for p in params)
    return Curve(tuple(samples), tuple(losses), batch, float(staleness), bits, elems)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=65536, help="samples per run")
    ap.add_argument("--models", nargs="*", default=list(SIZES))
    ap.add_argument("--min-samples", type=float, default=2048.0, help="fit points from here on")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = []
    for name in args.models:
        t0 = time.perf_counter()
        task = Task(name)
        curves = [train(task, b, s, q, args.samples) for b, s, q in RUNS]
        model, rmse = fit(curves, min_samples=args.min_samples)
        per_curve = []
        for cv in curves:
            n = np.asarray(cv.samples)
            keep = n >= args.min_samples
            pred = model.loss(model.effective_samples(n[keep], cv.batch, cv.staleness, cv.bits, cv.tensor_elems))
            err = np.log(pred) - np.log(np.asarray(cv.loss)[keep])
            per_curve.append(float(np.sqrt(np.mean(err**2))))
        meta = {"script": "experiments/fit_convergence.py", "sizes": SIZES[name], "lr": LR[name],
                "samples_per_run": args.samples, "min_samples": args.min_samples,
                "rmse_log_loss_per_curve": per_curve,
                "note": "small instances of the zoo architecture, SGD, synthetic teacher data"}
        save(fit_path(name), Fit(model, rmse, tuple(curves), meta))
        rows.append((name, model, rmse, max(per_curve), time.perf_counter() - t0))
    print(f"{'model':10} {'L_inf':>8} {'a':>9} {'alpha':>6} {'B_crit':>8} {'k_stale':>8} {'c_quant':>8} "
          f"{'rmse_log':>9} {'worst':>7} {'s':>5}")
    for name, m, rmse, worst, dt in rows:
        print(f"{name:10} {m.L_inf:8.4f} {m.a:9.3g} {m.alpha:6.3f} {m.critical_batch:8.1f} "
              f"{m.staleness_penalty:8.4f} {m.quant_penalty:8.4f} {rmse:9.4f} {worst:7.4f} {dt:5.1f}")


if __name__ == "__main__":
    main()
