"""The robotics kernels against their sequential references, hand-worked cases, and
their measurement (sim.robotics.kernels, sim.robotics.reference)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from calibration import robotics_kernels as RK
from experiments.cli import main
from hardware_profiles import list_profiles, load_profile
from hardware_profiles.schema import OP_CLASSES
from sim.robotics import kernels as K
from sim.robotics import reference as ref

CASES = [(name, n) for name, spec in K.KERNELS.items() for n in spec.test_sizes]
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA GPU visible to torch")
MEASURED = Path(__file__).parents[1] / "hardware_profiles" / "measured" / "robotics" / "this_machine.json"


def _arrays(out: Any) -> list[np.ndarray]:
    """A kernel's or a reference's output as a flat list of NumPy arrays."""
    if isinstance(out, tuple | list):
        return [a for o in out for a in _arrays(o)]
    if isinstance(out, torch.Tensor):
        return [out.detach().cpu().numpy()]
    return [np.asarray(out)]


def _assert_same(got: Any, want: Any) -> None:
    g, w = _arrays(got), _arrays(want)
    assert len(g) == len(w)
    for a, b in zip(g, w, strict=True):
        assert a.shape == b.shape
        if np.issubdtype(b.dtype, np.integer):
            np.testing.assert_array_equal(a, b)
        else:
            np.testing.assert_allclose(a, b, rtol=K.RTOL, atol=K.ATOL)


# ------------------------------------------------------------------ registry
def test_registry_names_and_classes() -> None:
    assert list(K.KERNELS) == ["pf_predict", "pf_weight", "pf_resample", "ekf_predict",
                               "ekf_update", "grid_update", "icp"]
    for name, spec in K.KERNELS.items():
        assert spec.name == name
        assert spec.op_class in OP_CLASSES


@pytest.mark.parametrize("name", list(K.KERNELS))
def test_costs_positive_and_growing(name: str) -> None:
    spec = K.KERNELS[name]
    small, big = spec.default_sizes[0], spec.default_sizes[-1]
    for f in (spec.flops, spec.bytes, spec.in_bytes):
        assert 0 < f(small) < f(big)
    assert spec.out_bytes(small) > 0 and spec.kernels(small) >= 1


class _CountOps(TorchDispatchMode):
    """Counts the ATen ops that launch work: views (and _unsafe_view, a reshape of a
    fresh result) move no data."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if not func.is_view and func.overloadpacket.__name__ != "_unsafe_view":
            self.n += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", list(K.KERNELS))
def test_kernel_count_is_the_ops_dispatched(name: str) -> None:
    spec = K.KERNELS[name]
    for n in spec.test_sizes[-2:]:
        inputs = spec.inputs(n, seed=0, dtype=torch.float64)
        with _CountOps() as c:
            spec.run_torch(*inputs)
        assert c.n == spec.kernels(n)


# ------------------------------------------------------ kernel == reference
@pytest.mark.parametrize(("name", "size"), CASES)
def test_kernel_matches_reference(name: str, size: int) -> None:
    spec = K.KERNELS[name]
    inputs = spec.inputs(size, seed=size + 1, dtype=torch.float64)
    _assert_same(spec.run_torch(*inputs), spec.reference(inputs))


def test_grid_case_exercises_every_rule() -> None:
    """The random grid inputs include max-range rays, hits and free cells."""
    spec = K.KERNELS["grid_update"]
    inputs = spec.inputs(100, seed=101, dtype=torch.float64)
    grid, ranges = inputs[0], inputs[3]
    new = spec.run_torch(*inputs)
    assert bool((ranges == K.GRID_MAX_RANGE_M).any()) and bool((ranges < K.GRID_MAX_RANGE_M).any())
    assert int((new < grid).sum()) > 100 and int((new > grid).sum()) > 10


@pytest.mark.parametrize("name", list(K.KERNELS))
def test_same_seed_same_bytes(name: str) -> None:
    spec = K.KERNELS[name]
    n = spec.test_sizes[-1]
    a, b = spec.inputs(n, seed=3), spec.inputs(n, seed=3)
    other = spec.inputs(n, seed=4)
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor):
            assert x.numpy().tobytes() == y.numpy().tobytes()
    assert any(isinstance(x, torch.Tensor) and x.numpy().tobytes() != z.numpy().tobytes()
               for x, z in zip(a, other, strict=True))
    first = [x.tobytes() for x in _arrays(spec.run_torch(*a))]
    assert first == [x.tobytes() for x in _arrays(spec.run_torch(*b))]
    assert [x.tobytes() for x in _arrays(spec.reference(a))] == \
        [x.tobytes() for x in _arrays(spec.reference(b))]


# --------------------------------------------------------------- hand cases
def test_systematic_resampling_by_hand() -> None:
    # pointers 0.125, 0.375, 0.625, 0.875 against cumulative 0.1, 0.3, 0.6, 1.0:
    # the first cumulative weight reaching each is at index 1, 2, 3, 3
    w = np.array([0.1, 0.2, 0.3, 0.4])
    parts = np.arange(12, dtype=float).reshape(4, 3)
    new, idx = ref.pf_resample(parts, w, 0.5 / 4)
    assert idx.tolist() == [1, 2, 3, 3]
    np.testing.assert_array_equal(new, parts[[1, 2, 3, 3]])
    new_t, idx_t = K.pf_resample(torch.tensor(parts), torch.tensor(w),
                                 torch.tensor(0.5 / 4, dtype=torch.float64))
    assert idx_t.tolist() == [1, 2, 3, 3]
    assert new_t.tolist() == parts[[1, 2, 3, 3]].tolist()


def test_resampling_pointer_on_a_boundary_takes_that_particle() -> None:
    # u = 0: pointers 0, 0.5 with cumulative 0.5, 1.0: "first c[i] >= pointer" gives 0, 0
    w = np.array([0.5, 0.5])
    parts = np.zeros((2, 3))
    assert ref.pf_resample(parts, w, 0.0)[1].tolist() == [0, 0]
    assert K.pf_resample(torch.tensor(parts), torch.tensor(w),
                         torch.tensor(0.0, dtype=torch.float64))[1].tolist() == [0, 0]


def test_icp_recovers_a_known_motion_exactly() -> None:
    rng = np.random.default_rng(7)
    target = rng.uniform(0.0, 10.0, size=(40, 2))
    ang, t = 0.05, np.array([0.07, -0.04])
    rot = np.array([[math.cos(ang), -math.sin(ang)], [math.sin(ang), math.cos(ang)]])
    source = (target - t) @ rot  # rows: R^T (q - t), so R p + t = q exactly
    source = source[rng.permutation(40)]
    r_ref, t_ref = ref.icp(source, target, 20)
    r_k, t_k = K.icp(torch.tensor(source), torch.tensor(target), 20)
    for r_, t_ in ((r_ref, t_ref), (r_k.numpy(), t_k.numpy())):
        np.testing.assert_allclose(r_, rot, rtol=0, atol=1e-9)
        np.testing.assert_allclose(t_, t, rtol=0, atol=1e-9)


def test_ekf_predict_straight_line_without_noise() -> None:
    # heading 0, v = 1.5 m/s for 2 s: x += 3 exactly; G = [[1,0,0],[0,1,3],[0,0,1]]
    mu = np.array([[1.0, 2.0, 0.0]])
    sig = np.diag([0.1, 0.2, 0.3])[None]
    control = np.array([[1.5, 0.0]])
    want_sig = np.array([[0.1, 0.0, 0.0], [0.0, 0.2 + 9 * 0.3, 3 * 0.3], [0.0, 3 * 0.3, 0.3]])
    m_ref, s_ref = ref.ekf_predict(mu, sig, control, 2.0, np.zeros((3, 3)))
    m_k, s_k = K.ekf_predict(torch.tensor(mu), torch.tensor(sig), torch.tensor(control), 2.0,
                             torch.zeros(3, 3, dtype=torch.float64))
    for m, s in ((m_ref, s_ref), (m_k.numpy(), s_k.numpy())):
        assert m.tolist() == [[4.0, 2.0, 0.0]]
        np.testing.assert_allclose(s[0], want_sig, rtol=0, atol=1e-15)


def _one_scan(grid: np.ndarray, pose: tuple[float, float, float], angles: list[float],
              ranges: list[float]) -> list[np.ndarray]:
    """(reference, kernel) grids after one scan: res 1, step 0.5, range 4,
    l_free -0.4, l_occ 0.85, clamp [-2, 3.5]."""
    args = (1.0, 0.5, 4.0, -0.4, 0.85, -2.0, 3.5)
    a = ref.grid_update(grid, np.array(pose), np.array(angles), np.array(ranges), *args)
    b = K.grid_update(torch.tensor(grid), torch.tensor(pose, dtype=torch.float64),
                      torch.tensor(angles, dtype=torch.float64),
                      torch.tensor(ranges, dtype=torch.float64), *args)
    return [a, b.numpy()]


def test_single_ray_by_hand() -> None:
    # from (0.5, 0.5) along +x, range 3.2: samples at x = 0.5, 1.0, ..., 3.5 lie in
    # cells 0, 1, 1, 2, 2, 3, 3; the hit x = 3.7 is in cell 3, so cells 0-2 are free
    # and cell 3 (starting at 3.0) is hit and clamped at 3.5
    grid = np.zeros((2, 5))
    grid[0, 3] = 3.0
    want = np.zeros((2, 5))
    want[0] = [-0.4, -0.4, -0.4, 3.5, 0.0]
    for got in _one_scan(grid, (0.5, 0.5, 0.0), [0.0], [3.2]):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)


def test_max_range_ray_hits_nothing_and_rays_add_up() -> None:
    # range 4 = max range: samples x = 0.5 .. 4.0 (k = 0..7) cover cells 0-4, no hit;
    # two identical rays of range 3.2 (one along heading 0, the pose turned by 0):
    # each free cell twice, the hit cell twice
    for got in _one_scan(np.zeros((1, 5)), (0.5, 0.5, 0.0), [0.0], [4.0]):
        np.testing.assert_allclose(got, [[-0.4] * 5], rtol=0, atol=1e-15)
    for got in _one_scan(np.zeros((1, 5)), (0.5, 0.5, 0.0), [0.0, 0.0], [3.2, 3.2]):
        np.testing.assert_allclose(got, [[-0.8, -0.8, -0.8, 1.7, 0.0]], rtol=0, atol=1e-15)


def test_ray_leaving_the_grid_marks_only_cells_inside() -> None:
    # along -x from (0.5, 0.5): only cell 0 is inside; the hit (x = -2.7) is outside
    for got in _one_scan(np.zeros((1, 5)), (0.5, 0.5, math.pi), [0.0], [3.2]):
        np.testing.assert_allclose(got, [[-0.4, 0.0, 0.0, 0.0, 0.0]], rtol=0, atol=1e-15)


# --------------------------------------------------------------- measurement
def test_profile_kernels_small(tmp_path: Path) -> None:
    sizes = {"pf_resample": [10, 100], "icp": [8]}
    r = RK.profile_kernels("cpu", sizes, repeats=2, warmup=0, threads=1)
    assert r["suite"] == "robotics" and set(r["kernels"]) == set(sizes)
    src = r["source"]
    assert src["kind"] == "measured" and src["threads"] == 1 and src["clock"] == "thread"
    assert src["torch"] == torch.__version__ and src["device"] == "cpu" and src["date"]
    runs = r["kernels"]["pf_resample"]["runs"]
    assert [x["size"] for x in runs] == [10, 100] and all(x["t_s"] > 0 for x in runs)
    assert runs[1]["flops"] == K.KERNELS["pf_resample"].flops(100)
    prof = load_profile("this_machine")
    rows = K.compare_to_model(r, prof)
    assert len(rows) == 3
    for row in rows:
        pred = K.predicted_time_s(K.KERNELS[row["kernel"]], row["size"], prof)
        assert row["ratio"] == pytest.approx(row["measured_s"] / pred, rel=1e-3)
    assert "ratio" in K.format_comparison(rows, "this_machine")
    path = RK.write_measurement(r, tmp_path / "m.json", rows, "this_machine")
    back = json.loads(path.read_text())
    assert back["kernels"] == r["kernels"] and back["model"]["profile"] == "this_machine"


def test_predicted_time_is_the_cost_model_formula() -> None:
    # launch * kernels + max(compute, memory) on a profile without curves
    prof = load_profile("cpu-2c")
    spec = K.KERNELS["pf_predict"]
    eff = prof.eff(spec.op_class, spec.flops(1000), "fwd", spec.bytes(1000))
    want = prof.launch_overhead_s * 12 + max(spec.flops(1000) / (prof.peak("fp32") * eff),
                                             spec.bytes(1000) / (prof.mem_bw_Bps * prof.mem_eff(
                                                 spec.op_class, spec.bytes(1000))))
    assert K.predicted_time_s(spec, 1000, prof) == pytest.approx(want, rel=1e-12)


def test_unknown_kernel_is_a_config_error() -> None:
    from hardware_profiles.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown kernel 'nope'"):
        RK.profile_kernels("cpu", {"nope": [1]})


def test_cli_robotics_suite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.json"
    assert main(["profile", "--suite", "robotics", "--quick", "--quiet", "--threads", "1",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "measured vs cost model (this_machine)" in text and f"wrote {out}" in text
    data = json.loads(out.read_text())
    assert set(data["kernels"]) == set(K.KERNELS)
    assert all(len(e["runs"]) == 2 for e in data["kernels"].values())


@pytest.mark.skipif(CUDA, reason="checks the error raised when no GPU is present")
def test_cli_robotics_cuda_without_gpu_exits_2(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["profile", "--suite", "robotics", "--device", "cuda:0", "--out",
               str(tmp_path / "r.json"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and "--device" in err[0] and "cuda:0 is not available" in err[0]
    assert not (tmp_path / "r.json").exists()


def test_committed_measurement() -> None:
    data = json.loads(MEASURED.read_text())
    assert data["suite"] == "robotics" and set(data["kernels"]) == set(K.KERNELS)
    src = data["source"]
    for key in ("device_name", "torch", "threads", "date", "clock", "cpus"):
        assert src[key] not in ("", None)
    for name, entry in data["kernels"].items():
        sizes = [r["size"] for r in entry["runs"]]
        assert sizes == list(K.KERNELS[name].default_sizes)
        assert all(r["t_s"] > 0 and r["flops"] == K.KERNELS[name].flops(r["size"])
                   for r in entry["runs"])
    # not a device profile: it must lie where the profile loader does not look
    # (every JSON file directly in measured/ is loaded as one)
    for name in list_profiles():
        assert load_profile(name).peak("fp32") > 0


# ----------------------------------------------------------------------- GPU
@needs_cuda
@pytest.mark.gpu
@pytest.mark.parametrize(("name", "size"), CASES)
def test_kernel_matches_reference_on_gpu(name: str, size: int) -> None:
    spec = K.KERNELS[name]
    inputs = spec.inputs(size, seed=size + 1, device="cuda:0", dtype=torch.float64)
    _assert_same(spec.run_torch(*inputs), spec.reference(inputs))


@needs_cuda
@pytest.mark.gpu
def test_profile_kernels_on_gpu() -> None:
    r = RK.profile_kernels("cuda:0", {"pf_weight": [1000], "grid_update": [90]}, repeats=3)
    assert r["source"]["clock"] == "cuda"
    assert all(run["t_s"] > 0 for e in r["kernels"].values() for run in e["runs"])
