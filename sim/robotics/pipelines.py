"""Periodic robotics pipelines as task DAGs, built from the measured kernels.

``perception_slam`` (the default): one frame of a mobile robot with a camera,
an IMU/odometry and a 2-D lidar::

    detector0..N-1 (CNN per camera) --> track_update <-- track_predict (IMU)
    pf_predict (odometry) --> pf_weight (lidar) --> pf_resample --+
    icp (scan matching, lidar) -----------------------------------+--> fusion --> grid_update

* the detector is a zoo CNN's forward pass on one image, as one task (a
  convolution network: the only task a DLA can take);
* object tracking is a batch of EKFs (``track_predict``/``track_update``:
  ekf_predict/ekf_update over ``tracks`` filters);
* localisation is a particle filter (``particles``) and ICP scan matching
  (``points``); ``fusion`` is one EKF update fusing the two pose estimates;
* mapping is the occupancy-grid update of ``rays`` lidar rays from the fused pose.

Each task's FLOPs, bytes and kernel launches come from its kernel's analytic
counts (:data:`sim.robotics.kernels.KERNELS`); edge sizes from the kernels'
in/out bytes. With ``calibration`` (a measured robotics profile, ``hetsim profile
--suite robotics``), each kernel task's time on CPU units is scaled by the
measured/predicted ratio on the measured CPU at that size (interpolated in
log size): the roofline misses the same per-call overheads of eager torch on
every CPU. GPU and DLA times stay the datasheet roofline's (no measured robotics
profile of a GPU or DLA ships).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hardware_profiles import load_profile
from hardware_profiles.errors import HetsimError
from sim.costmodel import layer_work
from sim.dag import Edge, Task, TaskGraph
from sim.zoo import get as zoo_model

#: The measured robotics profile of this project's CPU machine.
THIS_MACHINE = Path(__file__).resolve().parents[2] / "hardware_profiles" / "measured" / "robotics" / \
    "this_machine.json"


def calibration_rows(path: str | Path = THIS_MACHINE) -> list[dict[str, Any]]:
    """The measured-against-predicted rows of a measured robotics profile
    (:func:`sim.robotics.kernels.compare_to_model`), predicted with the device profile
    it names (``model.profile``) as that profile is now: the rows stored when the
    kernels were measured went stale whenever the profile was refitted since (its
    curves, hence every prediction, move). The stored rows where the named profile
    cannot be loaded (or none is named)."""
    from sim.robotics.kernels import compare_to_model

    data = json.loads(Path(path).read_text(encoding="utf-8"))
    model = data.get("model", {})
    stored: list[dict[str, Any]] = model.get("rows", [])
    if not model.get("profile"):
        return stored
    try:
        profile = load_profile(model["profile"])
    except HetsimError as e:
        warnings.warn(f"{path}: ratios as stored at measurement time (the profile they were "
                      f"predicted with cannot be loaded: {e})", stacklevel=2)
        return stored
    return compare_to_model(data, profile, data.get("dtype", "fp32"))


def load_calibration(path: str | Path = THIS_MACHINE) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """kernel -> (sizes, measured/predicted ratios) from a measured robotics profile
    (:func:`calibration_rows`: against its device profile as it is now)."""
    rows = calibration_rows(path)
    out: dict[str, tuple[list[float], list[float]]] = {}
    for r in rows:
        out.setdefault(r["kernel"], ([], []))
        out[r["kernel"]][0].append(float(r["size"]))
        out[r["kernel"]][1].append(float(r["ratio"]))
    return {k: (np.array(s), np.array(v)) for k, (s, v) in out.items()}


def _ratio(cal: Mapping[str, tuple[np.ndarray, np.ndarray]], kernel: str, size: int) -> float:
    if kernel not in cal:
        return 1.0
    sizes, ratios = cal[kernel]
    order = np.argsort(sizes)
    return float(np.interp(math.log(size), np.log(sizes[order]), ratios[order]))


def kernel_task(name: str, kernel: str, size: int,
                cal: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None) -> Task:
    """A task running ``kernel`` at ``size``, priced by the kernel's analytic counts."""
    from sim.robotics.kernels import KERNELS

    spec = KERNELS[kernel]
    scale = (("cpu", _ratio(cal, kernel, size)),) if cal else ()
    return Task(name, spec.op_class, spec.flops(size), spec.bytes(size), spec.kernels(size),
                kernel=kernel, size=size, scale=scale)


def model_task(name: str, model: str, batch: int = 1) -> Task:
    """A zoo CNN's forward pass on ``batch`` images as one task (its layers' totals)."""
    m = zoo_model(model)
    work = [layer_work(ly, "fwd", batch, "fp32", m.input_bytes_of(i)) for i, ly in enumerate(m.layers)]
    return Task(name, "conv", sum(w[0] for w in work), sum(w[2] for w in work), sum(w[1] for w in work))


def perception_slam(particles: int = 100_000, rays: int = 1_440, points: int = 2_048, tracks: int = 64,
                    cameras: int = 2, detector: str = "resnet18",
                    calibration: str | Path | None = THIS_MACHINE) -> TaskGraph:
    """The default pipeline (module docstring), with ``cameras`` detectors (0: no
    camera branch, so no object tracking either)."""
    from sim.robotics.kernels import KERNELS

    cal: dict[str, Any] | None = load_calibration(calibration) if calibration else None
    k = KERNELS
    tasks: list[Task] = []
    edges: list[Edge] = []
    if cameras:
        tasks += [model_task(f"detector{j}", detector) for j in range(cameras)]
        tasks += [kernel_task("track_predict", "ekf_predict", tracks, cal),
                  kernel_task("track_update", "ekf_update", tracks, cal)]
        # one range-bearing detection per track from each camera
        edges += [Edge(f"detector{j}", "track_update", 2 * 4.0 * tracks) for j in range(cameras)]
        edges.append(Edge("track_predict", "track_update", k["ekf_predict"].out_bytes(tracks)))
    tasks += [
        kernel_task("pf_predict", "pf_predict", particles, cal),
        kernel_task("pf_weight", "pf_weight", particles, cal),
        kernel_task("pf_resample", "pf_resample", particles, cal),
        kernel_task("icp", "icp", points, cal),
        kernel_task("fusion", "ekf_update", 1, cal),
        kernel_task("grid_update", "grid_update", rays, cal),
    ]
    edges += [
        Edge("pf_predict", "pf_weight", k["pf_predict"].out_bytes(particles)),
        Edge("pf_weight", "pf_resample", k["pf_resample"].in_bytes(particles)),
        Edge("pf_resample", "fusion", 12.0),  # the particle set's mean pose
        Edge("icp", "fusion", k["icp"].out_bytes(points)),
        Edge("fusion", "grid_update", 12.0),  # the fused pose
    ]
    return TaskGraph(f"perception_slam-{cameras}c-{particles}p", tuple(tasks), tuple(edges))


def slam_lite(calibration: str | Path | None = THIS_MACHINE) -> TaskGraph:
    """Localisation and mapping without cameras, sized for a Raspberry Pi class board."""
    return perception_slam(particles=5_000, rays=360, points=512, cameras=0, calibration=calibration)


PIPELINES: dict[str, Callable[..., TaskGraph]] = {"perception_slam": perception_slam, "slam_lite": slam_lite}
