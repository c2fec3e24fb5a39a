"""The device to profile and the process that times it: checks before anything is
measured, the host's set-up (threads, allocator) and the provenance of a measurement."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from calibration.profiler.timing import clock_kind
from hardware_profiles.errors import ConfigError


def check_device(device: str) -> Any:
    """The ``torch.device`` for ``device`` ('cpu' or 'cuda[:N]').

    Raises:
        ConfigError: ``<command line>: --device: ...`` when the name is not a
            device or the device is not available here.
    """
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ConfigError("<command line>", "--device", f"{device!r} is not a device "
                          "(use cpu or cuda:N)") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise ConfigError("<command line>", "--device", f"device type {dev.type!r} is not "
                          "supported (use cpu or cuda:N)")
    if not torch.cuda.is_available():
        raise ConfigError("<command line>", "--device", f"{device} is not available: this "
                          f"torch ({torch.__version__}) sees no CUDA GPU")
    idx = dev.index or 0
    if idx >= torch.cuda.device_count():
        raise ConfigError("<command line>", "--device", f"{device} is not available: "
                          f"{torch.cuda.device_count()} CUDA device(s) visible")
    return torch.device("cuda", idx)


def check_writable(out: str | os.PathLike[str]) -> Path:
    """Make sure ``out`` can be written (creating its folder); return it as a Path.

    The name of a profile is its file stem, so ``out`` must end in ``.json``.

    Raises:
        ConfigError: naming ``out`` when it cannot be written.
    """
    p = Path(out)
    shown = os.fspath(out)
    if p.suffix != ".json":
        raise ConfigError(shown, "", "a profile file name must end in .json")
    if p.is_dir():
        raise ConfigError(shown, "", "is a folder; give a file name ending in .json")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        # open for append: proves the file can be written without touching its contents
        existed = p.exists()
        with p.open("a"):
            pass
        if not existed:
            p.unlink()
    except OSError as e:
        raise ConfigError(shown, "", f"cannot write: {e.strerror or e}") from None
    return p


def _device_name(dev: Any) -> str:
    import torch

    if dev.type == "cuda":
        return str(torch.cuda.get_device_name(dev))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _steady_allocator() -> str:
    """Keep freed host memory in the process (glibc): no mmap, no trimming.

    By default glibc serves large blocks with fresh mmaps and returns freed
    memory to the OS, so whether a tensor of a few MB (an activation, an
    embedding table's dense gradient) costs page faults on first touch depends
    on the allocator's history: the same layer measured 0.2 ms or 2 ms from one
    iteration to the next. With mmap off and trimming off, every iteration
    after the warm-up reuses memory, as a caching allocator (jemalloc,
    tcmalloc, PyTorch's CUDA allocator) does in a training job. Returns what
    was done, for the profile's raw record.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "unchanged (no glibc mallopt)"
    m_trim_threshold, m_mmap_max = -1, -4
    ok = mallopt(m_mmap_max, 0) == 1 and mallopt(m_trim_threshold, 2**31 - 1) == 1
    return "glibc mallopt: M_MMAP_MAX=0, M_TRIM_THRESHOLD=2^31-1" if ok else "unchanged (mallopt failed)"


def setup_host(device: str, threads: int | None = None) -> tuple[Any, dict[str, Any]]:
    """Prepare this process for timing ``device`` as every ``hetsim profile`` suite does.

    Checks the device, sets torch's intra-op threads (default: the CPUs this
    process may use) and keeps freed host memory in the process (see
    :func:`_steady_allocator`).

    Returns:
        ``(torch.device, record)``, the record holding ``device``, ``threads``,
        ``cpus``, ``clock`` (:func:`clock_kind`) and ``host_allocator``.

    Raises:
        ConfigError: for a device that is not available.
    """
    import torch

    dev = check_device(device)
    if dev.type == "cuda":  # events and synchronize time the current device: make it this one
        torch.cuda.set_device(dev)
    n_threads = threads or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                            else os.cpu_count() or 1)
    torch.set_num_threads(int(n_threads))
    return dev, {"device": str(dev), "threads": int(n_threads), "cpus": os.cpu_count() or 1,
                 "clock": clock_kind(dev), "host_allocator": _steady_allocator()}


def describe_device(dev: Any) -> dict[str, Any]:
    """Provenance of a measurement on ``dev``: ``device_name`` (CPU model or GPU name),
    ``torch`` version, ``cpu_capability`` and ``host``."""
    import torch

    return {"device_name": _device_name(dev), "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "host": platform.node()}
