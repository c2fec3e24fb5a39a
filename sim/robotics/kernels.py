"""Vectorised torch versions of the robotics algorithms and their costs.

Every kernel takes tensors on any device and computes, with whole-tensor ops
and no Python loop over particles, rays or points, exactly the function that
its sequential reference in :mod:`sim.robotics.reference` states (see there for
the conventions: poses, angle wrapping, grid indexing). The only Python loops
left are the ones the algorithm itself orders: the EKF's landmark-after-landmark
updates and ICP's rounds.

Agreement with the references (``tests/test_robotics_kernels.py``): on the
same float64 inputs, outputs agree to ``rtol = atol = 1e-10`` (:data:`RTOL`,
:data:`ATOL`); integer outputs (resampling indices) agree exactly. The
residual differences are rounding: libm against torch's vectorised
transcendental functions, summation order in means and cumulative sums, an
explicit 2x2 inverse against LAPACK's, and the closed-form 2-D rotation
against an SVD. A discrete decision (a cell boundary, a nearest neighbour, a
resampling pointer) could flip only when a value lands within those few ulps
of its threshold, which seeded continuous data does not do.

:data:`KERNELS` registers each kernel as a :class:`KernelSpec`: inputs, the
torch and reference callables, and analytic counts (FLOPs, bytes moved,
kernel launches, bytes in and out of the task) as functions of the kernel's
natural parallel size. The counts follow these rules:

- FLOPs: one per add, multiply, divide, compare, floor or square root; a
  transcendental function (sin, cos, exp, log, atan2) counts
  :data:`TRANSCENDENTAL_FLOPS`, roughly the polynomial that evaluates it.
- Bytes: the traffic of the eager torch code as written, fp32 (4-byte)
  floats, int64 (8-byte) indices and 1-byte booleans: every op reads its
  operands and writes its result once (eager torch fuses nothing).
  Operands of a few elements (a 3x3 matrix shared by all) are not counted.
- Kernels: the non-view ATen ops one call dispatches (a view such as
  ``select`` launches nothing); a test counts them and checks these numbers.
- in_bytes / out_bytes: fp32 data passed into and out of the task per call
  (the edges of a pipeline DAG), shared constants (the map, the grid's
  geometry) excluded when they are a few numbers.

:func:`predicted_time_s` is the cost model's time of a kernel on a device
profile; :func:`compare_to_model` sets measured times (``hetsim profile --suite
robotics``, :mod:`calibration.robotics_kernels`) against it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sim.costmodel import roofline_s
from sim.robotics import reference as ref

__all__ = [
    "ATOL",
    "EKF_LANDMARKS",
    "GRID_CELLS",
    "ICP_ITERS",
    "KERNELS",
    "PF_LANDMARKS",
    "RTOL",
    "TRANSCENDENTAL_FLOPS",
    "KernelSpec",
    "compare_to_model",
    "ekf_predict",
    "ekf_update",
    "format_comparison",
    "grid_update",
    "icp",
    "pf_predict",
    "pf_resample",
    "pf_weight",
    "predicted_time_s",
    "to_numpy",
]

#: Tolerances of the float64 comparison with the references (relative, absolute).
RTOL = 1e-10
ATOL = 1e-10
#: FLOPs charged for one sin, cos, exp, log or atan2.
TRANSCENDENTAL_FLOPS = 10.0
#: Landmarks of the particle filter's range measurements (pf_weight inputs).
PF_LANDMARKS = 8
#: Landmarks each EKF update processes, one after the other (ekf_update inputs).
EKF_LANDMARKS = 4
#: ICP rounds (fixed; no convergence test).
ICP_ITERS = 10
#: Occupancy grid of the grid_update inputs: cells per side, cell size (m),
#: sample spacing along a ray (m), sensor range (m).
GRID_CELLS = 200
GRID_RES_M = 0.05
GRID_STEP_M = 0.025
GRID_MAX_RANGE_M = 4.0
_GRID_LOGODDS = {"l_free": -0.4, "l_occ": 0.85, "l_min": -4.0, "l_max": 4.0}

_F = 4.0  # bytes of an fp32 value
_I = 8.0  # bytes of an int64 index
_B = 1.0  # bytes of a bool
_T = TRANSCENDENTAL_FLOPS


def _wrap(a: torch.Tensor) -> torch.Tensor:
    """Angles wrapped to [-pi, pi): the reference's floor-modulo rule."""
    return torch.remainder(a + math.pi, 2.0 * math.pi) - math.pi


# ----------------------------------------------------------- particle filter
def pf_predict(particles: torch.Tensor, odom: torch.Tensor, noise: torch.Tensor,
               noise_std: torch.Tensor) -> torch.Tensor:
    """Odometry motion model on every particle at once (see :func:`reference.pf_predict`).

    Args:
        particles: (N, 3) poses.
        odom: (3,) odometry ``(rot1, trans, rot2)``.
        noise: (N, 3) pre-drawn standard normal samples.
        noise_std: (3,) standard deviations of ``rot1, trans, rot2``.

    Returns:
        (N, 3) new poses.
    """
    ctrl = odom + noise * noise_std  # (N, 3): each particle's own noisy control
    heading = particles[:, 2] + ctrl[:, 0]
    x = torch.addcmul(particles[:, 0], ctrl[:, 1], torch.cos(heading))
    y = torch.addcmul(particles[:, 1], ctrl[:, 1], torch.sin(heading))
    return torch.stack((x, y, _wrap(heading + ctrl[:, 2])), dim=1)


def pf_weight(particles: torch.Tensor, weights: torch.Tensor, landmarks: torch.Tensor,
              ranges: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Range-measurement likelihood times prior, normalised (see :func:`reference.pf_weight`).

    Args:
        particles: (N, 3) poses.
        weights: (N,) prior weights, positive.
        landmarks: (L, 2) landmark positions.
        ranges: (L,) measured ranges.
        sigma: () range noise standard deviation.

    Returns:
        (N,) normalised weights.
    """
    diff = landmarks[None, :, :] - particles[:, None, :2]  # (N, L, 2)
    err = (ranges - torch.hypot(diff[..., 0], diff[..., 1])) / sigma
    logw = torch.add(torch.log(weights), err.square().sum(dim=1), alpha=-0.5)
    # shifting by the max cancels in the normalisation and keeps exp finite
    w = torch.exp(logw - logw.max())
    return w / w.sum()


def pf_resample(particles: torch.Tensor, weights: torch.Tensor,
                u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Systematic resampling by binary search (see :func:`reference.pf_resample`).

    The sequential two-index walk picks, for pointer ``u + k/N``, the first
    particle whose cumulative weight reaches it; ``searchsorted`` (left side:
    the first ``i`` with ``cum[i] >= pos``) finds the same index for all
    pointers at once. Clamping to N - 1 is the walk's stop at the last particle.

    Args:
        particles: (N, 3) poses.
        weights: (N,) normalised weights.
        u: () offset in ``[0, 1/N)``.

    Returns:
        ``(new_particles (N, 3), indices (N,) int64)``.
    """
    n = weights.shape[0]
    cum = torch.cumsum(weights, dim=0)
    pos = u + torch.arange(n, device=weights.device, dtype=weights.dtype) / n
    idx = torch.searchsorted(cum, pos).clamp_(max=n - 1)
    return particles[idx], idx


# ----------------------------------------------------------------------- EKF
def ekf_predict(mu: torch.Tensor, sigma: torch.Tensor, control: torch.Tensor, dt: float,
                motion_cov: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """EKF prediction of B independent unicycle filters (see :func:`reference.ekf_predict`).

    Args:
        mu: (B, 3) means.
        sigma: (B, 3, 3) covariances.
        control: (B, 2) ``(v, omega)``.
        dt: time step, seconds.
        motion_cov: (3, 3) motion noise R.

    Returns:
        ``(mu (B, 3), sigma (B, 3, 3))``.
    """
    vdt = control[:, 0] * dt
    c, s = torch.cos(mu[:, 2]), torch.sin(mu[:, 2])
    mu_new = torch.stack((torch.addcmul(mu[:, 0], vdt, c), torch.addcmul(mu[:, 1], vdt, s),
                          torch.add(mu[:, 2], control[:, 1], alpha=dt)), dim=1)
    g = torch.eye(3, device=mu.device, dtype=mu.dtype).repeat(mu.shape[0], 1, 1)
    g[:, 0, 2] = -(vdt * s)
    g[:, 1, 2] = vdt * c
    return mu_new, g @ sigma @ g.transpose(1, 2) + motion_cov


def ekf_update(mu: torch.Tensor, sigma: torch.Tensor, z: torch.Tensor, landmarks: torch.Tensor,
               meas_cov: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequential range-bearing updates of B filters (see :func:`reference.ekf_update`).

    The landmarks are processed in order (each update conditions on the last);
    the filters, independent, are processed together. Two algebraic identities
    avoid work without changing the function: ``H Sigma = (Sigma H^T)^T``
    (Sigma is symmetric), so ``(I - K H) Sigma = Sigma - K (Sigma H^T)^T``; and
    the 2x2 innovation covariance is inverted by its closed form.

    Args:
        mu: (B, 3) means.
        sigma: (B, 3, 3) covariances.
        z: (B, L, 2) measured (range, bearing) per filter and landmark.
        landmarks: (L, 2) landmark positions.
        meas_cov: (2, 2) measurement noise Q.

    Returns:
        ``(mu (B, 3), sigma (B, 3, 3))``.
    """
    zero = torch.zeros_like(mu[:, 0])
    for j in range(landmarks.shape[0]):
        dx = landmarks[j, 0] - mu[:, 0]
        dy = landmarks[j, 1] - mu[:, 1]
        q = torch.addcmul(dx * dx, dy, dy)
        r = torch.sqrt(q)
        h = torch.stack((-dx / r, -dy / r, zero, dy / q, -dx / q, zero - 1.0), dim=1).view(-1, 2, 3)
        pht = sigma @ h.transpose(1, 2)  # (B, 3, 2)
        s = h @ pht + meas_cov
        a, b, c, d = s[:, 0, 0], s[:, 0, 1], s[:, 1, 0], s[:, 1, 1]
        s_inv = torch.stack((d, -b, -c, a), dim=1).view(-1, 2, 2) / (a * d - b * c)[:, None, None]
        k = pht @ s_inv  # (B, 3, 2)
        nu = torch.stack((z[:, j, 0] - r,
                          _wrap(z[:, j, 1] - (torch.atan2(dy, dx) - mu[:, 2]))), dim=1)
        mu = mu + (k @ nu[:, :, None])[:, :, 0]
        sigma = sigma - k @ pht.transpose(1, 2)
    return mu, sigma


# ------------------------------------------------------------ occupancy grid
def grid_update(grid: torch.Tensor, pose: torch.Tensor, angles: torch.Tensor,
                ranges: torch.Tensor, res: float, step: float, max_range: float,
                l_free: float, l_occ: float, l_min: float, l_max: float) -> torch.Tensor:
    """Log-odds update from one scan, all rays and samples at once.

    Computes the rule of :func:`reference.grid_update`. A ray's samples are an
    (R, K) tensor; a ray counts a cell once because a straight ray meets a
    (convex) cell in one contiguous run of samples, and the coordinates of
    successive samples move monotonically (IEEE rounding is monotone), so
    "first sample of its cell" is "cell differs from the previous sample's".
    Counts are accumulated with ``index_add_`` into a buffer with one spare
    slot that collects everything outside the grid or not counted (adding
    whole numbers is exact in any order, so the result does not depend on the
    order atomic adds run in on a GPU).

    Args:
        grid: (H, W) log-odds.
        pose: (3,) sensor pose.
        angles: (R,) ray angles relative to the heading.
        ranges: (R,) ranges in ``(0, max_range]``.
        res, step, max_range, l_free, l_occ, l_min, l_max: as in the reference.

    Returns:
        (H, W) updated log-odds (a new tensor).
    """
    hgt, wid = grid.shape
    n_samples = ref.grid_n_samples(max_range, step)
    a = pose[2] + angles
    c, s = torch.cos(a), torch.sin(a)
    dist = torch.arange(n_samples, device=grid.device, dtype=grid.dtype) * step
    ix = torch.floor((pose[0] + dist[None, :] * c[:, None]) / res)  # (R, K)
    iy = torch.floor((pose[1] + dist[None, :] * s[:, None]) / res)
    hx = torch.floor((pose[0] + ranges * c) / res)  # (R,)
    hy = torch.floor((pose[1] + ranges * s) / res)
    hits = ranges < max_range
    first = torch.ones_like(ix, dtype=torch.bool)
    first[:, 1:] = (ix[:, 1:] != ix[:, :-1]) | (iy[:, 1:] != iy[:, :-1])
    at_hit = (ix == hx[:, None]) & (iy == hy[:, None]) & hits[:, None]
    free = (dist[None, :] < ranges[:, None]) & first & ~at_hit
    spare = hgt * wid

    def cells(x: torch.Tensor, y: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        inside = keep & (x >= 0) & (x < wid) & (y >= 0) & (y < hgt)
        return torch.where(inside, y * wid + x, spare).long().flatten()

    ones = torch.ones(1, device=grid.device, dtype=grid.dtype)
    n_free = torch.zeros(spare + 1, device=grid.device, dtype=grid.dtype)
    n_free.index_add_(0, cells(ix, iy, free), ones.expand(free.numel()))
    n_hit = torch.zeros(spare + 1, device=grid.device, dtype=grid.dtype)
    n_hit.index_add_(0, cells(hx, hy, hits), ones.expand(hits.numel()))
    new = grid + l_free * n_free[:spare].view(hgt, wid) + l_occ * n_hit[:spare].view(hgt, wid)
    return new.clamp(l_min, l_max)


# ----------------------------------------------------------------------- ICP
def icp(source: torch.Tensor, target: torch.Tensor,
        n_iter: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Point-to-point 2-D ICP with brute-force matching (see :func:`reference.icp`).

    Matching: ``torch.cdist`` in its direct mode (differences, not the
    ``|a|^2 + |b|^2 - 2ab`` matrix product, whose cancellation could change a
    nearest neighbour) and ``argmin`` (the first of equal minima, as NumPy).
    Alignment: in 2-D the Kabsch rotation has a closed form, the angle
    ``atan2(H01 - H10, H00 + H11)`` of the cross-covariance H, which is the
    SVD solution with its reflection guard and needs no per-round LAPACK call.

    Args:
        source: (N, 2) points to align.
        target: (M, 2) reference points.
        n_iter: rounds.

    Returns:
        ``(R (2, 2), t (2,))``.
    """
    rot = torch.eye(2, device=source.device, dtype=source.dtype)
    trans = torch.zeros(2, device=source.device, dtype=source.dtype)
    cur = source
    for _ in range(n_iter):
        nearest = torch.cdist(cur, target, compute_mode="donot_use_mm_for_euclid_dist").argmin(dim=1)
        matched = target[nearest]
        pc, qc = cur.mean(dim=0), matched.mean(dim=0)
        cov = (cur - pc).T @ (matched - qc)
        ang = torch.atan2(cov[0, 1] - cov[1, 0], cov[0, 0] + cov[1, 1])
        c, s = torch.cos(ang), torch.sin(ang)
        r_i = torch.stack((c, -s, s, c)).view(2, 2)
        t_i = qc - r_i @ pc
        cur = torch.addmm(t_i, cur, r_i.T)
        rot = r_i @ rot
        trans = r_i @ trans + t_i
    return rot, trans


# --------------------------------------------------------------------- inputs
def _uniform(g: torch.Generator, shape: tuple[int, ...], lo: float, hi: float,
             dtype: torch.dtype) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(shape, generator=g, dtype=dtype)


def _poses(g: torch.Generator, n: int, lo: float, hi: float, dtype: torch.dtype) -> torch.Tensor:
    xy = _uniform(g, (n, 2), lo, hi, dtype)
    return torch.cat((xy, _uniform(g, (n, 1), -math.pi, math.pi, dtype)), dim=1)


def _spd(g: torch.Generator, n: int, dtype: torch.dtype) -> torch.Tensor:
    """(n, 3, 3) random covariances: A A^T / 10 + 0.01 I (well conditioned)."""
    a = torch.randn((n, 3, 3), generator=g, dtype=dtype)
    return a @ a.transpose(1, 2) / 10.0 + 0.01 * torch.eye(3, dtype=dtype)


def _pf_predict_inputs(n: int, g: torch.Generator, dtype: torch.dtype) -> tuple[Any, ...]:
    return (_poses(g, n, 0.0, 10.0, dtype), torch.tensor([0.1, 0.5, -0.05], dtype=dtype),
            torch.randn((n, 3), generator=g, dtype=dtype),
            torch.tensor([0.02, 0.05, 0.02], dtype=dtype))


def _pf_weight_inputs(n: int, g: torch.Generator, dtype: torch.dtype) -> tuple[Any, ...]:
    particles = _poses(g, n, 0.0, 10.0, dtype)
    prior = _uniform(g, (n,), 0.5, 1.5, dtype)
    landmarks = _uniform(g, (PF_LANDMARKS, 2), 0.0, 10.0, dtype)
    true_xy = torch.tensor([5.0, 5.0], dtype=dtype)
    ranges = (torch.linalg.vector_norm(landmarks - true_xy, dim=1)
              + 0.1 * torch.randn((PF_LANDMARKS,), generator=g, dtype=dtype))
    return particles, prior / prior.sum(), landmarks, ranges, torch.tensor(0.5, dtype=dtype)


def _pf_resample_inputs(n: int, g: torch.Generator, dtype: torch.dtype) -> tuple[Any, ...]:
    w = _uniform(g, (n,), 0.0, 1.0, dtype) ** 4  # skewed: some particles are copied often
    u = torch.rand((), generator=g, dtype=dtype) / n
    return _poses(g, n, 0.0, 10.0, dtype), w / w.sum(), u


def _ekf_predict_inputs(n: int, g: torch.Generator, dtype: torch.dtype) -> tuple[Any, ...]:
    control = torch.stack((_uniform(g, (n,), 0.0, 1.0, dtype),
                           _uniform(g, (n,), -0.5, 0.5, dtype)), dim=1)
    return (_poses(g, n, 0.0, 10.0, dtype), _spd(g, n, dtype), control, 0.1,
            torch.diag(torch.tensor([0.01, 0.01, 0.005], dtype=dtype)))


def _ekf_update_inputs(n: int, g: torch.Generator, dtype: torch.dtype) -> tuple[Any, ...]:
    # robots in [3, 7]^2, landmarks on a ring of radius 8 about (5, 5): every
    # landmark is at least ~5 m away, so H stays well conditioned
    mu = _poses(g, n, 3.0, 7.0, dtype)
    phi = _uniform(g, (EKF_LANDMARKS,), -math.pi, math.pi, dtype)
    landmarks = 5.0 + 8.0 * torch.stack((torch.cos(phi), torch.sin(phi)), dim=1)
    truth = mu + 0.1 * torch.randn((n, 3), generator=g, dtype=dtype)
    d = landmarks[None, :, :] - truth[:, None, :2]
    z = torch.stack((torch.linalg.vector_norm(d, dim=2),
                     torch.atan2(d[..., 1], d[..., 0]) - truth[:, 2:3]), dim=2)
    z = z + torch.randn(z.shape, generator=g, dtype=dtype) * torch.tensor([0.1, 0.03], dtype=dtype)
    return (mu, _spd(g, n, dtype), z, landmarks,
            torch.diag(torch.tensor([0.01, 0.001], dtype=dtype)))


def _grid_inputs(n: int, g: torch.Generator, dtype: torch.dtype) -> tuple[Any, ...]:
    side = GRID_CELLS * GRID_RES_M
    grid = (0.5 * torch.randn((GRID_CELLS, GRID_CELLS), generator=g, dtype=dtype)).clamp(-4, 4)
    pose = torch.cat((_uniform(g, (2,), side / 2 - 0.5, side / 2 + 0.5, dtype),
                      _uniform(g, (1,), -math.pi, math.pi, dtype)))
    angles = torch.arange(n, dtype=dtype) * (2.0 * math.pi / n) - math.pi
    ranges = _uniform(g, (n,), 0.2, GRID_MAX_RANGE_M, dtype)
    no_return = torch.rand((n,), generator=g, dtype=dtype) < 0.1  # max-range readings
    ranges = torch.where(no_return, torch.full_like(ranges, GRID_MAX_RANGE_M), ranges)
    lo = _GRID_LOGODDS
    return (grid, pose, angles, ranges, GRID_RES_M, GRID_STEP_M, GRID_MAX_RANGE_M,
            lo["l_free"], lo["l_occ"], lo["l_min"], lo["l_max"])


def _icp_inputs(n: int, g: torch.Generator, dtype: torch.dtype) -> tuple[Any, ...]:
    target = _uniform(g, (n, 2), 0.0, 10.0, dtype)
    ang = float(_uniform(g, (), -0.1, 0.1, dtype))
    rot = torch.tensor([[math.cos(ang), -math.sin(ang)], [math.sin(ang), math.cos(ang)]],
                       dtype=dtype)
    shift = _uniform(g, (2,), -0.2, 0.2, dtype)
    perm = torch.randperm(n, generator=g)
    source = (target[perm] - shift) @ rot + 0.01 * torch.randn((n, 2), generator=g, dtype=dtype)
    return source, target, ICP_ITERS


def _on(maker: Callable[[int, torch.Generator, torch.dtype], tuple[Any, ...]]
        ) -> Callable[[int, torch.Generator, torch.device | str, torch.dtype], tuple[Any, ...]]:
    """``make_inputs`` from a CPU maker: draw on the CPU (so a seed gives the same
    data on every device), then move the tensors to ``device``."""

    def make(size: int, generator: torch.Generator, device: torch.device | str,
             dtype: torch.dtype) -> tuple[Any, ...]:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        return tuple(x.to(device) if isinstance(x, torch.Tensor) else x
                     for x in maker(size, generator, dtype))

    return make


def to_numpy(inputs: Sequence[Any]) -> tuple[Any, ...]:
    """The reference's arguments: tensors as NumPy arrays (on the CPU), anything else
    as is (0-d tensors become Python scalars)."""
    out: list[Any] = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            a = x.detach().cpu().numpy()
            out.append(a.item() if a.ndim == 0 else a)
        else:
            out.append(x)
    return tuple(out)


# --------------------------------------------------------------------- costs
# Each function's docstring is its formula; the itemised op lists (in the same
# order as the kernel's ops) are what the numbers add up.
def _log2(n: int) -> float:
    return math.log2(max(n, 2))


def _pf_predict_flops(n: int) -> float:
    """``(18 + 2T) N``: noisy control 6, heading 1, cos/sin 2T, x and y 4, theta 1,
    wrap 6 (add, floor-modulo as divide-floor-multiply-subtract 4, subtract) per
    particle."""
    return (18.0 + 2 * _T) * n


def _pf_predict_bytes(n: int) -> float:
    """``168 N``: 42 fp32 values read or written per particle over 12 ops (mul 6,
    add 6, heading 3, cos 2, addcmul 4, sin 2, addcmul 4, add 3, wrap 3 x 2, stack 6)."""
    return 42 * _F * n


def _pf_weight_flops(n: int) -> float:
    """``10 N L + (6 + 2T) N``: per particle-landmark pair difference 2, hypot 4,
    residual 1, scale 1, square 1, sum 1; per particle log and exp (2T), the
    scaled add 2, max 1, shift 1, sum 1, normalise 1."""
    return 10.0 * n * PF_LANDMARKS + (6.0 + 2 * _T) * n


def _pf_weight_bytes(n: int) -> float:
    """``48 N L + 68 N``: 12 fp32 values per particle-landmark pair (difference 2,
    hypot 3, residual 2, scale 2, square 2, sum's read 1) and 17 per particle
    (the difference's reads of x, y 2, sum's write 1, log 2, scaled add 3,
    max 1, shift 2, exp 2, sum 1, normalise 3)."""
    return _F * (12.0 * n * PF_LANDMARKS + 17.0 * n)


def _pf_resample_flops(n: int) -> float:
    """``4 N + N log2 N``: cumulative sum, pointer (divide, add), clamp per
    particle; a binary search of log2 N comparisons per pointer."""
    return 4.0 * n + n * _log2(n)


def _pf_resample_bytes(n: int) -> float:
    """``88 N + 4 N log2 N``: cumsum 8, arange 4, divide 8, add 8, searchsorted
    4 (pointers) + 8 (int64 out) + 4 log2 N (probes), clamp 16 (int64 in place),
    gather 8 (indices) + 12 + 12 (poses in and out) bytes per particle."""
    return 88.0 * n + 4.0 * n * _log2(n)


def _ekf_predict_flops(n: int) -> float:
    """``(109 + 2T) B``: per filter v dt 1, cos/sin 2T, two multiply-adds 4, theta 2,
    Jacobian entries 3, two 3x3 matrix products 2 x 45, adding R 9."""
    return (109.0 + 2 * _T) * n


def _ekf_predict_bytes(n: int) -> float:
    """``464 B``: 116 fp32 values per filter over 17 ops, two batched 3x3 products
    27 each and the add of R 18 of them."""
    return 116 * _F * n


def _ekf_update_flops(n: int) -> float:
    """``(152 + T) B L``: per filter and landmark, geometry 14 (differences,
    q, r, four H entries), S = H P H^T + Q 54, closed-form inverse 9, gain 18,
    innovation 9 + atan2 T, mean update 12, covariance update 36."""
    return (152.0 + _T) * n * EKF_LANDMARKS


def _ekf_update_bytes(n: int) -> float:
    """``900 B L + 4 B``: 225 fp32 values per filter and landmark over 37 ops
    (the batched products: P H^T 21, H (P H^T) 16, gain 16, K nu 11,
    K (P H^T)^T 21, P - ... 27), plus the zeros made once."""
    return _F * (225.0 * n * EKF_LANDMARKS + n)


def _grid_samples() -> int:
    return ref.grid_n_samples(GRID_MAX_RANGE_M, GRID_STEP_M)


def _grid_flops(n: int) -> float:
    """``32 R K + (23 + 2T) R + 6 C`` (K samples per ray, C cells): per sample
    two coordinates (multiply, add, divide, floor) 8, first-of-run 3, at-hit 4,
    free 4, bounds 8, linear index 2, where 1, cast 1, count 1; per ray angle
    1, cos/sin 2T, hit cell 8, hit test 1, and the hit's bounds, index, where,
    cast and count 13; per cell two scaled adds 4 and the clamp 2."""
    k, c = _grid_samples(), GRID_CELLS * GRID_CELLS
    return 32.0 * n * k + (23.0 + 2 * _T) * n + 6.0 * c


def _grid_bytes(n: int) -> float:
    """``197 R K + 194 R + 56 C + 12 K`` bytes: per sample the two fp32
    coordinate chains 56, first-of-run 24, at-hit 15, free 9 (bool), bounds,
    index and int64 cast 73, ``index_add_`` 20 (index, source, counter); per
    ray the same chains on the hit point; per cell the two zeroed counters,
    the scaled adds and the clamp."""
    k, c = _grid_samples(), GRID_CELLS * GRID_CELLS
    return 197.0 * n * k + 194.0 * n + 56.0 * c + 12.0 * k


def _icp_flops(n: int) -> float:
    """``I (7 N^2 + 24 N + 60)`` for N source and N target points, I rounds:
    distances 6 per pair, argmin 1 per pair, per point means 4, centring 4,
    cross-covariance 8, moving 8; the rotation's atan2/cos/sin 3T and ~30."""
    return ICP_ITERS * (7.0 * n * n + 24.0 * n + 3 * _T + 30.0)


def _icp_bytes(n: int) -> float:
    """``I (8 N^2 + 128 N)``: the (N, N) fp32 distance matrix written by cdist
    and read by argmin; per point cdist's inputs 16, argmin's int64 out 8,
    gather 24, means 16, centring 32, cross-covariance 16, moving 16."""
    return ICP_ITERS * (8.0 * n * n + 128.0 * n)


@dataclass(frozen=True)
class KernelSpec:
    """One robotics kernel: how to make its inputs, run it, check it and price it.

    Attributes:
        name: registry key.
        op_class: the cost model's op class (:data:`hardware_profiles.schema.OP_CLASSES`).
        size_name: what ``size`` counts (particles, filters, rays, points).
        make_inputs: ``(size, generator, device, dtype) -> inputs``; draws from
            the CPU ``generator`` then moves tensors to ``device`` (same seed,
            same data on every device); non-tensor inputs are Python scalars.
        run_torch: the vectorised kernel, called as ``run_torch(*inputs)``.
        run_reference: the sequential reference, ``run_reference(*to_numpy(inputs))``.
        flops: FLOPs of one call at ``size`` (see the module docstring's rules).
        bytes: bytes the eager torch kernel reads and writes at ``size`` (fp32).
        kernels: ATen ops (kernel launches) of one call at ``size``.
        in_bytes: fp32 bytes handed to the task per call.
        out_bytes: fp32/int64 bytes it hands on per call.
        default_sizes: sizes :func:`calibration.robotics_kernels.profile_kernels` times by
            default.
        test_sizes: sizes the reference comparison tests use.
        description: one line on what the kernel does.
    """

    name: str
    op_class: str
    size_name: str
    make_inputs: Callable[[int, torch.Generator, torch.device | str, torch.dtype], tuple[Any, ...]]
    run_torch: Callable[..., Any]
    run_reference: Callable[..., Any]
    flops: Callable[[int], float]
    bytes: Callable[[int], float]
    kernels: Callable[[int], int]
    in_bytes: Callable[[int], float]
    out_bytes: Callable[[int], float]
    default_sizes: tuple[int, ...]
    test_sizes: tuple[int, ...]
    description: str = ""

    def inputs(self, size: int, seed: int = 0, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32) -> tuple[Any, ...]:
        """``make_inputs`` with a fresh CPU generator seeded ``seed``."""
        return self.make_inputs(size, torch.Generator().manual_seed(seed), device, dtype)

    def reference(self, inputs: Sequence[Any]) -> Any:
        """The reference's output on the same inputs (tensors converted to NumPy)."""
        return self.run_reference(*to_numpy(inputs))


def _const(k: int) -> Callable[[int], int]:
    return lambda _n: k


KERNELS: dict[str, KernelSpec] = {s.name: s for s in (
    KernelSpec(
        "pf_predict", "elementwise", "particles", _on(_pf_predict_inputs), pf_predict,
        ref.pf_predict, _pf_predict_flops, _pf_predict_bytes, _const(12),
        in_bytes=lambda n: 24.0 * n, out_bytes=lambda n: 12.0 * n,  # poses + noise in, poses out
        default_sizes=(1_000, 10_000, 100_000, 1_000_000), test_sizes=(1, 7, 100, 1000),
        description="odometry motion model with pre-drawn Gaussian noise"),
    KernelSpec(
        "pf_weight", "elementwise", "particles", _on(_pf_weight_inputs), pf_weight,
        ref.pf_weight, _pf_weight_flops, _pf_weight_bytes, _const(13),
        in_bytes=lambda n: 16.0 * n, out_bytes=lambda n: 4.0 * n,  # poses + weights in
        default_sizes=(1_000, 10_000, 100_000, 1_000_000), test_sizes=(1, 7, 100, 1000),
        description=f"Gaussian range likelihood to {PF_LANDMARKS} landmarks, normalised"),
    KernelSpec(
        "pf_resample", "elementwise", "particles", _on(_pf_resample_inputs), pf_resample,
        ref.pf_resample, _pf_resample_flops, _pf_resample_bytes, _const(7),
        in_bytes=lambda n: 16.0 * n, out_bytes=lambda n: 20.0 * n,  # poses + int64 indices out
        default_sizes=(1_000, 10_000, 100_000, 1_000_000), test_sizes=(1, 7, 100, 1000),
        description="systematic resampling (cumulative sum + binary search)"),
    KernelSpec(
        "ekf_predict", "elementwise", "filters", _on(_ekf_predict_inputs), ekf_predict,
        ref.ekf_predict, _ekf_predict_flops, _ekf_predict_bytes, _const(17),
        in_bytes=lambda n: 56.0 * n, out_bytes=lambda n: 48.0 * n,  # mean, cov (+ control in)
        default_sizes=(100, 1_000, 10_000, 100_000), test_sizes=(1, 5, 50),
        description="unicycle EKF prediction of a batch of independent filters"),
    KernelSpec(
        "ekf_update", "elementwise", "filters", _on(_ekf_update_inputs), ekf_update,
        ref.ekf_update, _ekf_update_flops, _ekf_update_bytes, _const(1 + 37 * EKF_LANDMARKS),
        in_bytes=lambda n: (48.0 + 8.0 * EKF_LANDMARKS) * n, out_bytes=lambda n: 48.0 * n,
        default_sizes=(100, 1_000, 10_000, 100_000), test_sizes=(1, 5, 50),
        description=f"sequential range-bearing updates from {EKF_LANDMARKS} landmarks"),
    KernelSpec(
        "grid_update", "embedding", "rays", _on(_grid_inputs), grid_update,
        ref.grid_update, _grid_flops, _grid_bytes, _const(71),
        # angles + ranges in; the grid (the map state) in and out
        in_bytes=lambda n: 8.0 * n + _F * GRID_CELLS**2, out_bytes=lambda n: _F * GRID_CELLS**2,
        default_sizes=(90, 360, 1_440, 5_760), test_sizes=(1, 10, 100),
        description=f"log-odds update of a {GRID_CELLS}x{GRID_CELLS} grid, uniform ray sampling"),
    KernelSpec(
        "icp", "gemm", "points", _on(_icp_inputs), icp,
        ref.icp, _icp_flops, _icp_bytes, _const(2 + 21 * ICP_ITERS),
        in_bytes=lambda n: 16.0 * n, out_bytes=lambda n: 24.0,  # two clouds in, R and t out
        default_sizes=(128, 512, 2_048, 4_096), test_sizes=(3, 20, 100),
        description=f"2-D point-to-point ICP, brute-force matching, {ICP_ITERS} rounds"),
)}


# ------------------------------------------------------------ the model's time
def predicted_time_s(spec: KernelSpec, size: int, profile: Any, dtype: str = "fp32") -> float:
    """The cost model's time for one call of ``spec`` at ``size`` on the device ``profile``.

    ``launch_overhead_s * kernels + max(flops / (peak * eff(op, flops)),
    bytes / (mem_bw * mem_eff(op, bytes)))``: :func:`sim.costmodel.roofline_s`
    with the op class's memory efficiency, exactly as :func:`sim.dag.dag_costs`
    prices a task, so a measured/predicted ratio can scale a DAG task's time.
    """
    flops, nbytes = spec.flops(size), spec.bytes(size)
    return float(roofline_s(profile, spec.op_class, flops, nbytes, spec.kernels(size), dtype,
                            profile.mem_eff(spec.op_class, nbytes)))


def _sig(x: float) -> float:
    return float(f"{x:.4g}")


def compare_to_model(result: Mapping[str, Any], profile: Any,
                     dtype: str = "fp32") -> list[dict[str, Any]]:
    """Measured against predicted time for every (kernel, size) of ``result``.

    Args:
        result: a :func:`calibration.robotics_kernels.profile_kernels` record.
        profile: the :class:`~hardware_profiles.schema.DeviceProfile` to predict with.
        dtype: the peak_flops entry to use.

    Returns:
        Rows ``{kernel, op_class, size, measured_s, predicted_s, ratio}`` with
        ``ratio = measured_s / predicted_s`` (above 1: the model is optimistic).
    """
    rows = []
    for name, entry in result["kernels"].items():
        spec = KERNELS[name]
        for run in entry["runs"]:
            pred = predicted_time_s(spec, run["size"], profile, dtype)
            rows.append({"kernel": name, "op_class": spec.op_class, "size": run["size"],
                         "measured_s": run["t_s"], "predicted_s": _sig(pred),
                         "ratio": _sig(run["t_s"] / pred) if pred > 0 else None})
    return rows


def format_comparison(rows: Sequence[Mapping[str, Any]], profile_name: str = "") -> str:
    """A fixed-width table of :func:`compare_to_model` rows."""
    head = f"measured vs cost model{f' ({profile_name})' if profile_name else ''}"
    cols = ("kernel", "op_class", "size", "measured_s", "predicted_s", "ratio")
    cells = [[_cell(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c)
              for i, c in enumerate(cols)]
    lines = [head, "  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def _cell(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.3g}"
    return "-" if x is None else str(x)
