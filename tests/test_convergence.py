"""The convergence model: discounts, inverse, JSON, and fit recovery."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from sim.convergence import (
    FITS_DIR,
    ConvergenceModel,
    Curve,
    Fit,
    fit,
    load,
    quant_variance,
    save,
    typical_tensor_elems,
)

TRUE = ConvergenceModel(L_inf=0.05, a=3.0, alpha=0.5, critical_batch=64.0,
                        staleness_penalty=0.2, quant_penalty=0.05)


def _curves(m: ConvergenceModel, noise: float, seed: int = 0) -> list[Curve]:
    rng = np.random.default_rng(seed)
    n = np.geomspace(1e2, 1e7, 40)
    out = []
    for batch, st, bits in [(8, 0, 32), (32, 0, 32), (128, 0, 32), (512, 0, 32),
                            (32, 2, 32), (32, 8, 32), (32, 0, 8), (32, 0, 4)]:
        eff = n * m.discount(batch, st, bits, 4096.0)
        y = m.loss(eff) * np.exp(noise * rng.standard_normal(n.size))
        out.append(Curve(tuple(n), tuple(y), batch, st, bits, 4096.0))
    return out


def test_fit_recovers_known_parameters() -> None:
    got, rmse = fit(_curves(TRUE, noise=0.003))
    for name in ("L_inf", "a", "alpha", "critical_batch", "staleness_penalty", "quant_penalty"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=0.02), name
    assert rmse == pytest.approx(0.003, rel=0.2)


def test_fit_exact_curves_has_zero_residual() -> None:
    got, rmse = fit(_curves(TRUE, noise=0.0))
    assert rmse < 1e-8
    assert got.alpha == pytest.approx(0.5, rel=1e-6)


def test_fit_leaves_unvaried_discounts_neutral() -> None:
    m = ConvergenceModel(0.1, 2.0, 0.7)
    n = np.geomspace(10, 1e5, 30)
    got, _ = fit([Curve(tuple(n), tuple(m.loss(n)), batch=16)])
    assert got.critical_batch == math.inf and got.staleness_penalty == 0.0 and got.quant_penalty == 0.0
    assert (got.L_inf, got.a, got.alpha) == pytest.approx((0.1, 2.0, 0.7), rel=1e-6)


def test_fit_with_a_slack_lower_bound_recovers_known_parameters() -> None:
    """A bound below the true asymptote changes nothing: the same parameters come back."""
    got, rmse = fit(_curves(TRUE, noise=0.0), L_inf_min=0.04)
    for name in ("L_inf", "a", "alpha", "critical_batch", "staleness_penalty", "quant_penalty"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=1e-4), name
    assert rmse < 1e-6


def test_fit_lower_bound_binds() -> None:
    """Curves whose tail falls to 0.1 but a floor of 0.3 the fit must respect: the asymptote
    sits on the floor (not below it, where the unbounded fit puts it)."""
    m = ConvergenceModel(L_inf=0.1, a=5.0, alpha=0.4)
    n = np.geomspace(1e2, 1e6, 30)
    # the measured tail stops at loss 0.35 (> the bound) although its asymptote is 0.1
    n = n[m.loss(n) > 0.35]
    cv = [Curve(tuple(n), tuple(m.loss(n)), batch=16)]
    free, _ = fit(cv)
    assert free.L_inf == pytest.approx(0.1, rel=1e-4)
    bound, rmse = fit(cv, L_inf_min=0.3)
    assert 0.3 <= bound.L_inf < 0.3 + 1e-3
    assert rmse > 1e-3  # the floor costs residual: the curve really goes below it


def test_fit_rejects_a_bound_at_or_above_the_measured_loss() -> None:
    m = ConvergenceModel(0.1, 2.0, 0.7)
    n = np.geomspace(10, 1e5, 30)
    with pytest.raises(ValueError, match="L_inf_min"):
        fit([Curve(tuple(n), tuple(m.loss(n)), batch=16)], L_inf_min=float(m.loss(1e5)))


def test_batch_discount() -> None:
    m = ConvergenceModel(0.0, 1.0, 1.0, critical_batch=100.0)
    # 1 / (1 + b / B_crit): b = 100 counts half, b = 300 a quarter
    assert m.effective_samples(1000, batch=100) == pytest.approx(500.0)
    assert m.effective_samples(1000, batch=300) == pytest.approx(250.0)
    assert ConvergenceModel(0.0, 1.0, 1.0).effective_samples(1000, batch=10**6) == 1000.0


def test_staleness_discount() -> None:
    m = ConvergenceModel(0.0, 1.0, 1.0, staleness_penalty=0.25)
    # 1 / (1 + 0.25 * 4) = 1/2
    assert m.effective_samples(1000, batch=1, staleness=4) == pytest.approx(500.0)


def test_quant_discount() -> None:
    # 4 bits: s = 8 levels. d = 16: min(16/64, 4/8) = 0.25; d = 4096: min(64, 8) = 8
    assert quant_variance(4, 16) == 0.25
    assert quant_variance(4, 4096) == 8.0
    assert quant_variance(8, 4096) == pytest.approx(min(4096 / 128**2, 64 / 128))  # 0.25
    assert quant_variance(32, 4096) == 0.0
    m = ConvergenceModel(0.0, 1.0, 1.0, quant_penalty=0.5)
    assert m.effective_samples(100, batch=1, bits=4, tensor_elems=4096) == pytest.approx(100 / (1 + 4))
    assert m.effective_samples(100, batch=1, bits=32, tensor_elems=4096) == 100.0


def test_typical_tensor_elems() -> None:
    # (100^2 + 300^2) / 400 = 250
    assert typical_tensor_elems([100, 300, 0]) == 250.0


@pytest.mark.parametrize("target", [0.06, 0.5, 2.0])
def test_samples_to_target_inverts_loss(target: float) -> None:
    n = TRUE.samples_to_target(target, batch=32, staleness=2, bits=8, tensor_elems=4096)
    eff = TRUE.effective_samples(n, 32, 2, 8, 4096)
    assert TRUE.loss(eff) == pytest.approx(target, rel=1e-12)


def test_target_below_asymptote_is_unreachable() -> None:
    assert TRUE.samples_to_target(0.05, batch=1) == math.inf
    assert TRUE.samples_to_target(0.01, batch=1) == math.inf


def test_json_round_trip(tmp_path: Path) -> None:
    curves = tuple(_curves(TRUE, 0.01)[:2])
    f = Fit(TRUE, 0.01, curves, {"source": "test"})
    save(tmp_path / "m.json", f)
    assert load(tmp_path / "m.json") == f
    inf = Fit(ConvergenceModel(0.1, 1.0, 0.5), 0.0, curves)
    save(tmp_path / "i.json", inf)
    assert load(tmp_path / "i.json").model.critical_batch == math.inf


# -- time to target in the evaluators ------------------------------------------------------

from dataclasses import replace  # noqa: E402

from hardware_profiles.errors import ConfigError  # noqa: E402
from sim import analytic, des, zoo  # noqa: E402
from sim.config import config_from_dict  # noqa: E402
from sim.convergence import effective_to_target_iterations  # noqa: E402
from sim.problem import build_problem  # noqa: E402
from tests.helpers_eval import dense, model, plan, problem, profile  # noqa: E402

GPU, PS = profile("gpu"), profile("ps", kind="cpu")
FC = model(dense("fc", 1e6, fwd_flops=1e10, bwd_flops=2e10))
CONV = ConvergenceModel(L_inf=0.1, a=10.0, alpha=0.5, critical_batch=100.0)


def _target_problem(target: float, sync: str = "bsp") -> tuple:
    p = problem([GPU, GPU], [PS], FC, 20, sync=sync, sharing="none", latency_s=1e-4)
    # loss 0.2 needs (10 / 0.1)^2 = 1e4 effective samples = 1e4 * (1 + 20/100) = 12000 samples:
    # 600 iterations of 20
    iters = effective_to_target_iterations(CONV, target, 20, 32, 1.0)
    p = replace(p, job=replace(p.job, target_loss=target, convergence=CONV, iterations=iters))
    return p, plan(p, [10, 10])


def test_bsp_iterations_to_target_by_hand() -> None:
    assert effective_to_target_iterations(CONV, 0.2, 20, 32, 1.0) == 600


def test_des_time_to_target_matches_analytic_on_bsp() -> None:
    p, pl = _target_problem(0.2)
    d = des.simulate(p, pl, trace=False)
    a = analytic.evaluate(p, pl)
    assert len(d.iter_end_s) == 600
    assert d.time_to_target_s == pytest.approx(d.iter_end_s[-1], rel=1e-12)
    assert d.time_to_target_s == pytest.approx(a.time_to_target_s, rel=0.02)
    assert d.summary_json() == des.simulate(p, pl, trace=False).summary_json()


def test_asp_time_to_target_is_reported_and_close_to_analytic() -> None:
    p, pl = _target_problem(0.2, sync="asp")
    d = des.simulate(p, pl, trace=False)
    a = analytic.evaluate(p, pl)
    assert d.time_to_target_s is not None and "target_not_reached" not in d.extra
    assert d.time_to_target_s == pytest.approx(a.time_to_target_s, rel=0.1)


def _cfg(model_name: str, target: float) -> dict:
    return {"cluster": {"devices": [{"type": "t4", "count": 2}]},
            "job": {"model": model_name, "global_batch": 64, "target_loss": target}}


@pytest.mark.parametrize("name", ["mlp", "ctr_dnn", "resnet18", "vgg16"])
def test_build_problem_accepts_target_loss_of_a_fitted_model(name: str) -> None:
    fit_ = load(FITS_DIR / f"{name}.json")
    target = fit_.model.L_inf + 0.5 * (fit_.curves[0].loss[-1] - fit_.model.L_inf)
    p = build_problem(config_from_dict(_cfg(name, target), "c.yaml"), Path("."), "c.yaml")
    assert p.job.convergence == fit_.model and p.job.target_loss == target
    assert p.job.iterations >= 1


def test_target_loss_without_a_fit_is_a_one_line_config_error() -> None:
    assert not (FITS_DIR / "resnet50.json").exists()
    with pytest.raises(ConfigError, match="job.target_loss") as e:
        build_problem(config_from_dict(_cfg("resnet50", 0.5), "c.yaml"), Path("."), "c.yaml")
    assert "\n" not in str(e.value) and "no convergence fit" in str(e.value)


def test_target_below_the_fitted_asymptote_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="job.target_loss"):
        build_problem(config_from_dict(_cfg("mlp", 1e-9), "c.yaml"), Path("."), "c.yaml")


# -- the shipped fits ----------------------------------------------------------------------

SHIPPED = sorted(FITS_DIR.glob("*.json"))
RECORDED = sorted(FITS_DIR.rglob("*.json"))  # with unusable/: degenerate fits kept for their curves


def _rmse_log(m: ConvergenceModel, curves: list[Curve], min_samples: float) -> float:
    err = []
    for cv in curves:
        n = np.asarray(cv.samples)
        keep = n >= min_samples
        pred = m.loss(n[keep] * m.discount(cv.batch, cv.staleness, cv.bits, cv.tensor_elems))
        err.append(np.log(pred) - np.log(np.asarray(cv.loss)[keep]))
    return float(np.sqrt(np.mean(np.concatenate(err) ** 2)))


def test_fits_ship_for_the_fitted_zoo_models() -> None:
    assert [p.stem for p in SHIPPED] == ["ctr_dnn", "mlp", "resnet18", "vgg16"]
    assert RECORDED == SHIPPED  # vgg16's degenerate fit in unusable/ was superseded


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.relative_to(FITS_DIR).as_posix())
def test_shipped_fit_is_consistent_with_its_curves(path: Path) -> None:
    f = load(path)
    m = f.model
    assert m.alpha > 0 and m.a > 0 and m.L_inf >= 0
    assert path.stat().st_size < 300_000
    # the stored errors are those of the stored model on the stored curves
    ms = float(f.meta["min_samples"])
    assert f.rmse_log == pytest.approx(_rmse_log(m, list(f.curves), ms), abs=1e-9)
    per_curve = f.meta["rmse_log_loss_per_curve"]
    assert len(per_curve) == len(f.curves)
    for cv, e in zip(f.curves, per_curve):
        assert e == pytest.approx(_rmse_log(m, [cv], ms), abs=1e-9)
    # every curve is a real run: samples increase, losses positive and finite
    for cv in f.curves:
        assert list(cv.samples) == sorted(set(cv.samples)) and all(0 < y < math.inf for y in cv.loss)


@pytest.mark.parametrize("name", ["ctr_dnn", "resnet18", "vgg16"])
def test_refitted_models_are_not_degenerate(name: str) -> None:
    """The fits made with label noise: a real exponent, an asymptote above 0, 2-bit runs."""
    f = load(FITS_DIR / f"{name}.json")
    assert f.model.alpha > 0.1 and f.model.L_inf > 0
    assert {cv.bits for cv in f.curves} >= {32, 4, 2}
    assert f.meta["sizes"] and f.meta["teacher_loss"] > 0 and f.meta["usable"] is True


@pytest.mark.parametrize("name", ["resnet18", "vgg16"])
def test_bounded_fits_keep_the_asymptote_at_or_above_the_teachers_loss(name: str) -> None:
    """resnet18 (refitted from its stored curves) and vgg16 were fitted with L_inf >= teacher_loss;
    for both the bound binds (unbounded, their asymptotes fall below the floor)."""
    f = load(FITS_DIR / f"{name}.json")
    assert f.meta["L_inf_min"] == f.meta["teacher_loss"]
    assert f.meta["teacher_loss"] <= f.model.L_inf < f.meta["teacher_loss"] * (1 + 1e-6)
    free, _ = fit(list(f.curves), min_samples=float(f.meta["min_samples"]))
    assert free.L_inf < f.meta["teacher_loss"]


@pytest.mark.parametrize(("name", "shrink"), [("resnet18", 8), ("vgg16", 8)])
def test_small_instances_keep_the_zoo_structure(name: str, shrink: int) -> None:
    torch = pytest.importorskip("torch")
    from experiments.fit_convergence import SIZES, build

    assert SIZES[name]["width"] == 1 / shrink
    with torch.device("meta"):
        full = zoo.torch_module(name, classes=10, size=32)[0]
    small = build(name, seed=0)
    assert [type(x).__name__ for x in small.modules()] == [type(x).__name__ for x in full.modules()]
    convs = [(x, y) for x, y in zip(full.modules(), small.modules())
             if isinstance(x, torch.nn.Conv2d) and isinstance(y, torch.nn.Conv2d)]
    assert convs[0][1].in_channels == 3
    assert all(y.out_channels * shrink == x.out_channels for x, y in convs)
    assert small(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_looks_linear_init_makes_a_relu_chain_linear() -> None:
    """relu(u) - relu(-u) = u on mirrored channel pairs: at init the net is a linear map of its
    input (here without max pooling or dropout, which bend it), including a Linear that reads a
    convolution's channels each repeated 4 times by an adaptive pooling, flattened channel-major."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from experiments.fit_convergence import init_looks_linear

    net = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 4, 3, padding=1), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                        nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 5))
    init_looks_linear(net, torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(2, 3, 8, 8, generator=g), torch.randn(2, 3, 8, 8, generator=g)
    with torch.no_grad():
        fx, fy, fxy = net(x), net(y), net(2.0 * x - y)
        assert torch.allclose(fxy, 2.0 * fx - fy, atol=1e-5)
        assert fx.abs().max() > 1e-2  # not the trivial linear map
        assert all(m.bias is not None and float(m.bias.abs().max()) == 0.0
                   for m in net if isinstance(m, (nn.Conv2d, nn.Linear)))
    with pytest.raises(ValueError, match="even widths"):
        init_looks_linear(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)), torch.Generator())


def test_refit_skips_fits_without_a_recorded_floor_and_missing_ones(tmp_path, capsys):
    import shutil

    from experiments import fit_convergence

    shutil.copy(FITS_DIR / "mlp.json", tmp_path / "mlp.json")  # made before teacher_loss was recorded
    before = (tmp_path / "mlp.json").read_bytes()
    fit_convergence.main(["--refit", "--out", str(tmp_path), "--models", "mlp", "vgg16"])
    out = capsys.readouterr().out
    assert "mlp:" in out and "records no teacher_loss" in out and "not refitted" in out
    assert "vgg16: no stored fit" in out
    assert (tmp_path / "mlp.json").read_bytes() == before
