"""Sequential NumPy references of the robotics kernels.

Each function here is the plain, one-thing-at-a-time statement of an algorithm:
Python loops over particles, landmarks, rays, samples and points, scalar
arithmetic from :mod:`math`, and NumPy only for small linear algebra (a 2x2
inverse, a 2x2 SVD). They are the ground truth that the vectorised torch
versions in :mod:`sim.robotics.kernels` are checked against, so they favour
obviousness over speed; do not time them.

Conventions shared with the kernels (they define *the* function both compute):

- A pose is ``(x, y, theta)``: metres, metres, radians; angles are wrapped to
  ``[-pi, pi)`` by :func:`wrap_angle`.
- Randomness never happens inside a kernel: noise arrays and resampling offsets
  are inputs, so the same inputs give the same outputs.
- Occupancy grids are indexed ``grid[iy, ix]`` with cell ``(ix, iy) =
  (floor(x / res), floor(y / res))``; the world origin is the corner of cell
  ``(0, 0)``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "ekf_predict",
    "ekf_update",
    "grid_n_samples",
    "grid_update",
    "icp",
    "pf_predict",
    "pf_resample",
    "pf_weight",
    "wrap_angle",
]


def wrap_angle(a: float) -> float:
    """``a`` wrapped to ``[-pi, pi)``: ``(a + pi) mod 2 pi - pi`` with a floor modulo."""
    return (a + math.pi) % (2.0 * math.pi) - math.pi


# ----------------------------------------------------------- particle filter
def pf_predict(particles: np.ndarray, odom: np.ndarray, noise: np.ndarray,
               noise_std: np.ndarray) -> np.ndarray:
    """Odometry motion model (rotate, translate, rotate) applied to every particle.

    Particle i draws its own noisy control ``rot1 + std0 * noise[i, 0]``,
    ``trans + std1 * noise[i, 1]``, ``rot2 + std2 * noise[i, 2]`` and moves:
    ``x += t cos(theta + r1)``, ``y += t sin(theta + r1)``,
    ``theta = wrap(theta + r1 + r2)``.

    Args:
        particles: (N, 3) poses.
        odom: (3,) odometry ``(rot1, trans, rot2)``.
        noise: (N, 3) pre-drawn standard normal samples.
        noise_std: (3,) standard deviations of ``rot1, trans, rot2``.

    Returns:
        (N, 3) new poses.
    """
    out = np.empty_like(particles)
    for i in range(particles.shape[0]):
        x, y, th = particles[i]
        r1 = odom[0] + noise_std[0] * noise[i, 0]
        t = odom[1] + noise_std[1] * noise[i, 1]
        r2 = odom[2] + noise_std[2] * noise[i, 2]
        heading = th + r1
        out[i, 0] = x + t * math.cos(heading)
        out[i, 1] = y + t * math.sin(heading)
        out[i, 2] = wrap_angle(heading + r2)
    return out


def pf_weight(particles: np.ndarray, weights: np.ndarray, landmarks: np.ndarray,
              ranges: np.ndarray, sigma: float) -> np.ndarray:
    """Posterior weights from range measurements to known landmarks.

    ``w_i ∝ w_i^prior * prod_j N(ranges[j]; ||landmarks[j] - (x_i, y_i)||, sigma^2)``,
    computed in logs and shifted by the largest log-weight before exponentiating
    (the shift cancels in the normalisation and keeps the exponentials finite).

    Args:
        particles: (N, 3) poses.
        weights: (N,) prior weights, positive.
        landmarks: (L, 2) landmark positions.
        ranges: (L,) measured ranges to the landmarks.
        sigma: range noise standard deviation.

    Returns:
        (N,) normalised weights (sum 1).
    """
    n = particles.shape[0]
    logw = np.empty(n, dtype=particles.dtype)
    for i in range(n):
        acc = 0.0
        for j in range(landmarks.shape[0]):
            d = math.hypot(landmarks[j, 0] - particles[i, 0], landmarks[j, 1] - particles[i, 1])
            e = (ranges[j] - d) / sigma
            acc += e * e
        logw[i] = math.log(weights[i]) - 0.5 * acc
    top = max(logw)
    w = np.array([math.exp(v - top) for v in logw], dtype=particles.dtype)
    total = 0.0
    for v in w:
        total += v
    return w / total


def pf_resample(particles: np.ndarray, weights: np.ndarray, u: float) -> tuple[np.ndarray, np.ndarray]:
    """Systematic (low-variance) resampling with the single offset ``u`` in ``[0, 1/N)``.

    Pointer k sits at ``u + k / N`` and picks the first particle whose
    cumulative weight reaches it (``c[i] >= u + k/N``); the last particle when
    rounding leaves the total just below a pointer. This is the classic
    two-index walk: the particle index never decreases as k grows.

    Args:
        particles: (N, 3) poses.
        weights: (N,) normalised weights.
        u: the offset, in ``[0, 1/N)``.

    Returns:
        ``(new_particles (N, 3), indices (N,) int64)``.
    """
    n = weights.shape[0]
    cum = np.empty(n, dtype=weights.dtype)
    s = 0.0
    for i in range(n):
        s += weights[i]
        cum[i] = s
    idx = np.empty(n, dtype=np.int64)
    i = 0
    for k in range(n):
        pos = u + k / n
        while pos > cum[i] and i < n - 1:
            i += 1
        idx[k] = i
    return particles[idx].copy(), idx


# ----------------------------------------------------------------------- EKF
def ekf_predict(mu: np.ndarray, sigma: np.ndarray, control: np.ndarray, dt: float,
                motion_cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """EKF prediction of a batch of independent unicycle filters (Euler step).

    ``x += v dt cos(theta)``, ``y += v dt sin(theta)``, ``theta += omega dt``
    (theta is not wrapped here; bearings are wrapped where they are compared);
    ``Sigma = G Sigma G^T + R`` with the Jacobian
    ``G = [[1, 0, -v dt sin(theta)], [0, 1, v dt cos(theta)], [0, 0, 1]]``
    taken at the prior mean.

    Args:
        mu: (B, 3) means.
        sigma: (B, 3, 3) covariances.
        control: (B, 2) ``(v, omega)`` per filter.
        dt: time step, seconds.
        motion_cov: (3, 3) additive motion noise R, shared by the filters.

    Returns:
        ``(mu (B, 3), sigma (B, 3, 3))``.
    """
    mu_out = np.empty_like(mu)
    sig_out = np.empty_like(sigma)
    for b in range(mu.shape[0]):
        x, y, th = mu[b]
        v, w = control[b]
        c, s = math.cos(th), math.sin(th)
        mu_out[b] = (x + v * dt * c, y + v * dt * s, th + w * dt)
        g = np.array([[1.0, 0.0, -v * dt * s], [0.0, 1.0, v * dt * c], [0.0, 0.0, 1.0]],
                     dtype=mu.dtype)
        sig_out[b] = g @ sigma[b] @ g.T + motion_cov
    return mu_out, sig_out


def ekf_update(mu: np.ndarray, sigma: np.ndarray, z: np.ndarray, landmarks: np.ndarray,
               meas_cov: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """EKF correction with range-bearing measurements, one landmark after another.

    For each filter, landmark j (in order) updates the state left by landmark
    j - 1: with ``dx, dy`` from the pose to the landmark, ``q = dx^2 + dy^2``,
    ``zhat = (sqrt(q), atan2(dy, dx) - theta)``,
    ``H = [[-dx/r, -dy/r, 0], [dy/q, -dx/q, -1]]``, ``S = H Sigma H^T + Q``,
    ``K = Sigma H^T S^-1``, innovation ``(z_r - zhat_r, wrap(z_b - zhat_b))``,
    ``mu += K nu``, ``Sigma = (I - K H) Sigma``.

    Args:
        mu: (B, 3) means.
        sigma: (B, 3, 3) covariances.
        z: (B, L, 2) measured (range, bearing) of each landmark, per filter.
        landmarks: (L, 2) landmark positions (known map, shared).
        meas_cov: (2, 2) measurement noise Q.

    Returns:
        ``(mu (B, 3), sigma (B, 3, 3))``.
    """
    mu_out = mu.copy()
    sig_out = sigma.copy()
    eye = np.eye(3, dtype=mu.dtype)
    for b in range(mu.shape[0]):
        m = mu_out[b].copy()
        p = sig_out[b].copy()
        for j in range(landmarks.shape[0]):
            dx, dy = landmarks[j, 0] - m[0], landmarks[j, 1] - m[1]
            q = dx * dx + dy * dy
            r = math.sqrt(q)
            h = np.array([[-dx / r, -dy / r, 0.0], [dy / q, -dx / q, -1.0]], dtype=mu.dtype)
            s = h @ p @ h.T + meas_cov
            k = p @ h.T @ np.linalg.inv(s)
            nu = np.array([z[b, j, 0] - r, wrap_angle(z[b, j, 1] - (math.atan2(dy, dx) - m[2]))],
                          dtype=mu.dtype)
            m = m + k @ nu
            p = (eye - k @ h) @ p
        mu_out[b] = m
        sig_out[b] = p
    return mu_out, sig_out


# ------------------------------------------------------------ occupancy grid
def grid_n_samples(max_range: float, step: float) -> int:
    """Samples per ray, ``ceil(max_range / step)``: sample k sits at ``k * step``."""
    return int(math.ceil(max_range / step))


def grid_update(grid: np.ndarray, pose: np.ndarray, angles: np.ndarray, ranges: np.ndarray,
                res: float, step: float, max_range: float, l_free: float, l_occ: float,
                l_min: float, l_max: float) -> np.ndarray:
    """Log-odds update of an occupancy grid from one lidar scan (uniform ray sampling).

    The rule (the parallel kernel computes exactly this):

    - ray r leaves the pose at heading ``theta + angles[r]``; its sample k is
      the point ``pose + (k * step) * (cos, sin)`` for ``k = 0 .. K-1``,
      ``K = ceil(max_range / step)``, kept while ``k * step < ranges[r]``;
    - the ray *hits* the cell of ``pose + ranges[r] * (cos, sin)`` when
      ``ranges[r] < max_range`` (a max-range reading hits nothing);
    - the ray's *free* cells are the distinct cells of its kept samples, less
      its hit cell; a ray counts a cell at most once;
    - cells outside the grid are ignored;
    - every cell then gains ``l_free * (rays that found it free) + l_occ *
      (rays that hit it)``, and the result is clamped to ``[l_min, l_max]``
      once: the scan is one update, independent of ray order.

    Args:
        grid: (H, W) log-odds.
        pose: (3,) sensor pose.
        angles: (R,) ray angles relative to the heading.
        ranges: (R,) measured ranges, in ``(0, max_range]``.
        res: cell size, metres.
        step: distance between samples along a ray.
        max_range: the sensor's maximum range.
        l_free, l_occ: log-odds increments (negative and positive).
        l_min, l_max: clamp bounds.

    Returns:
        (H, W) updated log-odds (a new array).
    """
    h, w = grid.shape
    n_free = np.zeros((h, w), dtype=np.int64)
    n_hit = np.zeros((h, w), dtype=np.int64)
    n_samples = grid_n_samples(max_range, step)
    px, py, th = float(pose[0]), float(pose[1]), float(pose[2])
    for r in range(angles.shape[0]):
        a = th + angles[r]
        c, s = math.cos(a), math.sin(a)
        rng = float(ranges[r])
        hit = None
        if rng < max_range:
            hit = (math.floor((px + rng * c) / res), math.floor((py + rng * s) / res))
            if 0 <= hit[0] < w and 0 <= hit[1] < h:
                n_hit[hit[1], hit[0]] += 1
        free: set[tuple[int, int]] = set()
        for k in range(n_samples):
            d = k * step
            if not d < rng:
                break
            cell = (math.floor((px + d * c) / res), math.floor((py + d * s) / res))
            if cell != hit and 0 <= cell[0] < w and 0 <= cell[1] < h:
                free.add(cell)
        for ix, iy in free:
            n_free[iy, ix] += 1
    out = np.empty_like(grid)
    for iy in range(h):
        for ix in range(w):
            v = grid[iy, ix] + l_free * n_free[iy, ix] + l_occ * n_hit[iy, ix]
            out[iy, ix] = min(max(v, l_min), l_max)
    return out


# ----------------------------------------------------------------------- ICP
def icp(source: np.ndarray, target: np.ndarray, n_iter: int) -> tuple[np.ndarray, np.ndarray]:
    """Point-to-point ICP in 2-D: ``n_iter`` rounds of match-then-align.

    Each round matches every (currently moved) source point to its nearest
    target point by brute force (Euclidean distance; the lowest index among
    equals), then finds the rigid motion that best maps the source points onto
    their matches in least squares by Kabsch's method: cross-covariance
    ``H = sum (p - p_c)(q - q_c)^T``, ``H = U S V^T``,
    ``R = V diag(1, det(V U^T)) U^T`` (no reflections), ``t = q_c - R p_c``;
    the source moves by it and the motion is composed onto the total.

    Args:
        source: (N, 2) points to align.
        target: (M, 2) reference points.
        n_iter: rounds (fixed; no convergence test, so the work is known).

    Returns:
        ``(R (2, 2), t (2,))`` with ``R @ source_i + t`` aligned to the target.
    """
    cur = source.copy()
    rot = np.eye(2, dtype=source.dtype)
    trans = np.zeros(2, dtype=source.dtype)
    for _ in range(n_iter):
        matched = np.empty_like(cur)
        for i in range(cur.shape[0]):
            d = np.sqrt((target[:, 0] - cur[i, 0]) ** 2 + (target[:, 1] - cur[i, 1]) ** 2)
            matched[i] = target[int(np.argmin(d))]
        pc, qc = cur.mean(axis=0), matched.mean(axis=0)
        cov = (cur - pc).T @ (matched - qc)
        u, _, vt = np.linalg.svd(cov)
        v = vt.T
        d_fix = np.diag([1.0, float(np.sign(np.linalg.det(v @ u.T)))]).astype(source.dtype)
        r_i = v @ d_fix @ u.T
        t_i = qc - r_i @ pc
        cur = cur @ r_i.T + t_i
        rot = r_i @ rot
        trans = r_i @ trans + t_i
    return rot, trans
