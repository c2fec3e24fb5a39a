"""Messages between two local processes: the ``network`` benchmark.

Point-to-point and all-reduce latency and bandwidth over ``torch.distributed``
(gloo; NCCL on GPUs, :func:`network_bench`) and, on CPU hosts, what the
runtime's own messages cost: the scheduler's wake-up latency
(:func:`wake_bench`) and the per-byte costs of pulls and pushes
(:func:`wire_bench`).
"""

from __future__ import annotations

import datetime as _dt
import os
import queue as _queue
import socket
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from calibration.profiler.registry import Benchmark, Run, register
from calibration.profiler.timing import _median_iqr, _r
from hardware_profiles.errors import HetsimError
from runtime.affinity import CpuMeter, pin, usable_cpus
from runtime.launch import free_port, keep_freed_memory


def _loopback_group(rank: int, port: int, backend: str = "gloo") -> None:
    """Join the two-rank process group of a benchmark (in a spawned rank). Rank 0's TCP
    store listens on 127.0.0.1 only (a socket bound here and handed over: TCPStore itself
    would listen on every interface), on the port the parent chose at run time."""
    import torch.distributed as dist

    listener = None
    if rank == 0:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", port))
        listener.listen()
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0,
                          timeout=_dt.timedelta(seconds=60),
                          master_listen_fd=listener.fileno() if listener else None)
    dist.init_process_group(backend, store=store, rank=rank, world_size=2,
                            timeout=_dt.timedelta(seconds=60))


def _run_ranks(procs: Sequence[Any], results: Any, n: int, timeout_s: float, what: str,
               stop: Any = None) -> list[Any]:
    """Start ``procs`` (spawned benchmark processes), collect ``n`` items from ``results``
    and tear every process down, on success, error and Ctrl-C alike (``stop``, an event
    the others wait on, is set first).

    Raises:
        HetsimError: a process exited with an error, or no result within ``timeout_s``.
    """
    got: list[Any] = []
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        while len(got) < n:
            try:
                got.append(results.get(timeout=0.2))
            except _queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    codes = [p.exitcode for p in procs]
                    raise HetsimError(f"{what}: a rank failed (exit codes {codes})") from None
                if time.monotonic() > deadline:
                    raise HetsimError(f"{what}: no result within {timeout_s:g} s") from None
    finally:
        if stop is not None:
            stop.set()
        for p in procs:
            if p.pid is not None:
                p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(5)
            if p.is_alive():  # pragma: no cover (terminate is ignored only when wedged)
                p.kill()
                p.join(5)
        results.close()
        results.join_thread()
    return got


def _interleaved(n_sizes: int, reps: int, warmup: int) -> list[tuple[int, bool]]:
    """The order a benchmark times its message sizes in: round after round, every size once
    a round, ``warmup`` rounds first; per item ``(size index, measured)``. The machine's
    speed changes every 0.1-5 s (docs/notes/2026-12-02-rounds.md): a size timed in one
    burst would carry one speed state into the slope between sizes."""
    return [(j, k >= warmup) for k in range(warmup + reps) for j in range(n_sizes)]


def _net_worker(rank: int, port: int, backend: str, device: str, sizes: Sequence[int],
                reps: int, results: Any) -> None:
    """One rank of the network benchmark (run in a spawned process)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    _loopback_group(rank, port, backend)
    try:
        def sync() -> None:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        bufs = [torch.zeros(max(1, n // 4), dtype=torch.float32, device=dev) for n in sizes]
        out: dict[str, list[list[float]]] = {"p2p_s": [[] for _ in sizes], "allreduce_s": [[] for _ in sizes]}
        for j, measured in _interleaved(len(sizes), reps, 3):  # 3 warm-up rounds
            buf = bufs[j]
            dist.barrier()
            sync()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(buf, 1)
                dist.recv(buf, 1)
            else:
                dist.recv(buf, 0)
                dist.send(buf, 0)
            sync()
            t1 = time.perf_counter()
            dist.barrier()
            sync()
            t2 = time.perf_counter()
            dist.all_reduce(buf)
            sync()
            if measured:
                out["p2p_s"][j].append((t1 - t0) / 2)
                out["allreduce_s"][j].append(time.perf_counter() - t2)
        if rank == 0:
            results.put(out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _slope_bw(small: int, t_small: float, big: int, t_big: float) -> float:
    """Bytes/s from the smallest to the largest message; when noise makes the large
    message no slower than the small one, the largest message over its own time."""
    if t_big > 1.05 * t_small:
        return (big - small) / (t_big - t_small)
    return big / t_big


def network_bench(device: str = "cpu", sizes: Sequence[int] = (8, 65_536), reps: int = 5,
                  timeout_s: float = 120.0) -> dict[str, Any]:
    """Point-to-point and all-reduce latency/bandwidth between two local processes.

    Two spawned processes join a ``torch.distributed`` group (gloo; NCCL on
    cuda:0 and cuda:1 when ``device`` is a GPU and two are visible, else gloo
    between host buffers) through a TCP store on 127.0.0.1 at a free port chosen
    at run time; gloo/NCCL sockets are bound to the loopback interface. Both
    processes are always terminated and joined before this returns or raises,
    including on KeyboardInterrupt.

    Returns:
        ``{"backend", "sizes_bytes", "p2p_s", "allreduce_s" (medians per size),
        "p2p_rel_iqr", "allreduce_rel_iqr", "p2p_latency_s", "p2p_bw_Bps",
        "allreduce_latency_s", "allreduce_bw_Bps"}``; latency is the time of the
        smallest message, bandwidth the bytes between the smallest and the
        largest message over their time difference (or, when noise makes the
        largest no slower than the smallest, the largest over its own time).

    Raises:
        HetsimError: when a rank fails or the benchmark exceeds ``timeout_s``.
    """
    import multiprocessing as mp

    backend = "gloo"
    if device.startswith("cuda"):
        import torch

        # NCCL needs one GPU per rank: ranks 0 and 1 on cuda:0 and cuda:1.
        # With one GPU the two processes measure the host path with gloo.
        if torch.cuda.device_count() >= 2:
            backend = "nccl"
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_net_worker, args=(r, port, backend, device, list(sizes), reps, results),
                         daemon=True) for r in range(2)]
    [got] = _run_ranks(procs, results, 1, timeout_s, "network benchmark")
    p2p = [_median_iqr(x) for x in got["p2p_s"]]
    ar = [_median_iqr(x) for x in got["allreduce_s"]]
    # latency: the smallest message; bandwidth: the slope from it to the largest
    small, big = sizes[0], sizes[-1]
    lat, t_big = p2p[0][0], p2p[-1][0]
    ar_lat, ar_big = ar[0][0], ar[-1][0]
    return {
        "backend": backend,
        "sizes_bytes": list(sizes),
        "p2p_s": [_r(m) for m, _ in p2p],
        "p2p_rel_iqr": [_r(i) for _, i in p2p],
        "allreduce_s": [_r(m) for m, _ in ar],
        "allreduce_rel_iqr": [_r(i) for _, i in ar],
        "p2p_latency_s": _r(lat),
        "p2p_bw_Bps": _r(_slope_bw(small, lat, big, t_big)),
        "allreduce_latency_s": _r(ar_lat),
        "allreduce_bw_Bps": _r(_slope_bw(small, ar_lat, big, ar_big)),
    }


def _wake_hog(core: int, stop: Any) -> None:
    """A busy process pinned to ``core``: a 256x256 GEMM loop on one thread until ``stop``."""
    import torch

    pin({core})
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    while not stop.is_set():
        a @ a


def _wake_rank(rank: int, port: int, rounds: int, core: int, results: Any,
               shard_core: int | None = None, payload_bytes: int = 0) -> None:
    """Rank 0 plays a PS shard (``runtime.wire.Receiver``; unpinned, as a shard without
    ``runtime.ps_affinity`` runs, or pinned to ``shard_core``), rank 1 a worker pinned to
    ``core``: ``rounds`` round trips of a PUSH (header only, or with ``payload_bytes``
    of payload) and a header-only PARAMS. The worker reports each round trip's time;
    each rank the CPU seconds over all rounds of its process and of its gloo transport
    threads (``gloo_tcp_loop``; None where ``/proc`` has no thread names)."""

    import torch

    from runtime import wire

    if rank == 1:
        pin({core})
    elif shard_core is not None:
        pin({shard_core})
    torch.set_num_threads(1)
    _loopback_group(rank, port)
    out: list[float] = []
    rx = wire.Receiver() if rank == 0 else None
    meter = CpuMeter()
    if rx is not None:
        for _ in range(rounds):
            rx.get(60.0)
            wire.send(1, wire.PARAMS, 0)
    else:
        payload = torch.zeros(payload_bytes, dtype=torch.uint8) if payload_bytes else None
        for _ in range(rounds):
            a = time.perf_counter()
            wire.send(0, wire.PUSH, 0, payload=payload)
            wire.recv(0)
            out.append(time.perf_counter() - a)
    got = meter.read()
    results.put({"rank": rank, "rtt": out, "cpu_s": got["cpu_s"],
                 "loop_cpu_s": (got["threads_cpu_s"] or {}).get("gloo_tcp_loop")})
    time.sleep(0.5)
    os._exit(0)  # the receiver thread is blocked inside gloo


class Handoffs(NamedTuple):
    """Round trips of :func:`handoff_rtts`: their times (s, warm-up left out), and each
    rank's CPU seconds over all rounds, of the process and of its gloo transport threads
    (None where unknown): the worker-like rank's, then the shard-like one's."""

    rtts: list[float]
    cpu_s: float
    loop_cpu_s: float | None
    shard_cpu_s: float
    shard_loop_cpu_s: float | None


def handoff_rtts(hogs: int, rounds: int, warmup: int = 20, shard_core: int | None = None,
                 payload_bytes: int = 0, timeout_s: float = 120.0) -> Handoffs:
    """Round trips of the runtime's messages between a worker-like rank pinned to the
    first core this process may use and a shard-like rank (:func:`_wake_rank`), with
    a busy process (a GEMM loop) pinned to each of the first ``hogs`` of those cores;
    the ``warmup`` first rounds left out of the times."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    cores = usable_cpus() or [0]
    stop = ctx.Event()
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_wake_hog, args=(c, stop), daemon=True) for c in cores[:hogs]]
    procs += [ctx.Process(target=_wake_rank, daemon=True,
                          args=(r, port, rounds + warmup, cores[0], results, shard_core, payload_bytes))
              for r in range(2)]
    got = {g["rank"]: g for g in _run_ranks(procs, results, 2, timeout_s, "hand-off benchmark", stop=stop)}
    w, sh = got[1], got[0]
    return Handoffs(list(w["rtt"][warmup:]), w["cpu_s"], w["loop_cpu_s"], sh["cpu_s"], sh["loop_cpu_s"])


def wake_bench(rounds: int = 1000, warmup: int = 20, timeout_s: float = 120.0) -> dict[str, Any]:
    """The scheduler's wake-up latency as the runtime's messages meet it (CPU hosts).

    Round trips of two header-only messages through ``runtime.wire`` (a worker-like
    rank pinned to the first core this process may use sends PUSH and waits for
    PARAMS; a shard-like rank, unpinned (a shard without ``runtime.ps_affinity``), receives with a
    ``Receiver`` thread and answers), first on idle cores, then with one busy process
    (a GEMM loop) pinned to every core. Each message wakes its receiver, so
    ``wake_latency_s = (mean busy - mean idle) / 2``: what a message costs its
    receiver when every core is taken (``cluster.hosts[].wake_us``; ``hetsim
    validate`` uses it). Means, not medians: the DES adds it to every such message.
    """
    cores = len(usable_cpus() or [0])
    means = {label: sum(handoff_rtts(hogs, rounds, warmup, timeout_s=timeout_s).rtts) / rounds
             for label, hogs in (("idle", 0), ("busy", cores))}
    return {"wake_rtt_idle_s": _r(means["idle"]), "wake_rtt_busy_s": _r(means["busy"]),
            "wake_busy_processes": cores, "wake_rounds": rounds,
            "wake_latency_s": _r(max(0.0, (means["busy"] - means["idle"]) / 2))}


def _wire_rank(rank: int, port: int, sizes: Sequence[int], reps: int, warmup: int, core: int,
               results: Any) -> None:
    """Rank 0 plays a PS shard (unpinned, ``runtime.wire.Receiver``; fp32 pushes taken as
    a view as ``runtime.ps`` does, pulls answered with a view of its flat vector),
    rank 1 a worker pinned to ``core`` (pushes packed in one copy, pulls received
    and copied into the parameters, as ``runtime.worker.PSClient`` does). Per size and
    round: a header-only round trip, a pull and a push, each with its wall time (worker)
    and the CPU time (``time.process_time``, every thread) each rank spent on it."""

    import torch

    from runtime import quant, wire

    keep_freed_memory()  # as every rank of the runtime does
    if rank == 1:
        pin({core})
    torch.set_num_threads(1)
    _loopback_group(rank, port)
    rounds = [sizes[j] for j, _ in _interleaved(len(sizes), reps, warmup)]
    if rank == 0:
        rx = wire.Receiver()
        flats = {n: torch.randn(n // 4) for n in sizes}
        cpu = []
        # a phase's CPU: the process's (every thread: the receiver's, gloo's) from the end of
        # the previous reply to the end of this one; waiting for a message costs none
        c0 = time.process_time()
        for n in rounds:
            row = []
            for kind in ("rtt", "pull", "push"):
                m = rx.get(60.0)
                assert m is not None
                if kind == "push":
                    assert m.payload is not None
                    quant.unpack(m.payload, n // 4, 32)  # a view, as runtime.ps takes a whole fp32 push
                wire.send(1, wire.PARAMS, 0, payload=flats[n].view(torch.uint8) if kind == "pull" else None)
                c1 = time.process_time()
                row.append(c1 - c0)
                c0 = c1
            cpu.append(row)
            rx.get(60.0)  # the worker's "done" marker
        results.put(("shard", cpu))
    else:
        params = {n: torch.zeros(n // 4) for n in sizes}
        grads = {n: torch.randn(n // 4) for n in sizes}
        out = []
        for n in rounds:
            times: list[tuple[float, float, float]] = []  # (wall, until sent, CPU) per phase
            for kind in ("rtt", "pull", "push"):
                c0, a = time.process_time(), time.perf_counter()
                if kind == "push":
                    payload = quant.pack_many([grads[n]], 32)  # one copy, as runtime.worker packs
                    wire.send(0, wire.PUSH, 0, payload=payload)
                else:
                    wire.send(0, wire.PULL, 0)
                mid = time.perf_counter()
                m = wire.recv(0)
                if kind == "pull":
                    assert m.payload is not None
                    params[n].copy_(m.payload.view(torch.float32))
                times.append((time.perf_counter() - a, mid - a, time.process_time() - c0))
            out.append(times)
            wire.send(0, wire.PULL, 0)  # this round is done (the shard's CPU count goes on)
        results.put(("worker", out))
    time.sleep(0.5)
    os._exit(0)  # the receiver thread is blocked inside gloo


def wire_bench(sizes: Sequence[int] = (4 << 20, 16 << 20, 48 << 20), reps: int = 25, warmup: int = 3,
               timeout_s: float = 120.0) -> dict[str, Any]:
    """What the runtime's own messages cost on this host (CPU hosts, fp32 payloads).

    Two ranks as :func:`_wire_rank` plays them (a shard-like and a pinned worker-like
    one, freed memory kept as every runtime rank keeps it), ``reps`` rounds (each size
    once a round, :func:`_interleaved`) of a header-only round trip, a pull and a push
    of ``n`` bytes. Per-byte figures are the least-squares slopes of the medians over
    the sizes (fixed costs drop out):

    - ``wire_pull_Bps`` / ``wire_push_Bps``: bytes per second of one lone message,
      wall clock (the worker's pull from request to parameters loaded, its push from
      packing to the shard having unpacked it; each less the header-only round trip);
    - ``wire_cpu_Bps``: bytes per second of CPU one end of a message spends, the mean
      CPU seconds per byte over the four (message, end) pairs: the worker packs, sends,
      receives and loads; the shard receives, unpacks and sends (every thread of each
      process, ``time.process_time``); ``wire_cpu_s_per_B`` has the four.

    Wire rates are several times the gloo point-to-point figure of ``network_bench``
    (round trips of one buffer), which is why they are measured separately.
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    cores = usable_cpus() or [0]
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_wire_rank, args=(r, port, list(sizes), reps, warmup, cores[0], results),
                         daemon=True) for r in range(2)]
    got = dict(_run_ranks(procs, results, 2, timeout_s, "wire benchmark"))
    return wire_figures(sizes, got["worker"], got["shard"], reps, warmup)


def wire_figures(sizes: Sequence[int], worker: Sequence[Sequence[Sequence[float]]],
                 shard: Sequence[Sequence[float]], reps: int, warmup: int) -> dict[str, Any]:
    """:func:`wire_bench`'s figures from its ranks' rows (in :func:`_interleaved` order: the
    worker's ``(wall, until sent, CPU)`` of the round trip, the pull and the push; the shard's
    CPU of each): per size the medians over the ``reps`` rounds after ``warmup``, the pull and push
    less the round trip; then the least-squares slope of each over the sizes."""
    order = _interleaved(len(sizes), reps, warmup)
    if not len(worker) == len(shard) == len(order):
        raise ValueError(f"wire benchmark rows: {len(worker)} from the worker, {len(shard)} from the shard, "
                         f"{len(order)} expected ({len(sizes)} sizes x {warmup + reps} rounds)")
    med: dict[int, dict[str, float]] = {}
    for j, n in enumerate(sizes):
        rows = [i for i, (jj, measured) in enumerate(order) if jj == j and measured]
        rtt = float(np.median([worker[i][0][0] for i in rows]))
        med[n] = {"pull": float(np.median([worker[i][1][0] for i in rows])) - rtt,
                  "push": float(np.median([worker[i][2][0] for i in rows])) - rtt,
                  "w_pull": float(np.median([worker[i][1][2] for i in rows])),
                  "w_push": float(np.median([worker[i][2][2] for i in rows])),
                  "s_pull": float(np.median([shard[i][1] for i in rows])),
                  "s_push": float(np.median([shard[i][2] for i in rows]))}
    x = np.array(sizes, dtype=float)

    def slope(k: str) -> float:  # least squares over the sizes' medians
        return float(np.polyfit(x, [med[n][k] for n in sizes], 1)[0])

    cpu = {k: slope(k) for k in ("w_push", "s_push", "s_pull", "w_pull")}
    if min(slope("pull"), slope("push"), *cpu.values()) <= 0:
        raise HetsimError("wire benchmark: a time did not grow with the message size (other jobs "
                          f"on the cores?): {med}; run it again on a quieter machine")
    return {"wire_pull_Bps": _r(1.0 / slope("pull")), "wire_push_Bps": _r(1.0 / slope("push")),
            "wire_cpu_Bps": _r(len(cpu) / sum(cpu.values())),
            "wire_cpu_s_per_B": {k: _r(v) for k, v in cpu.items()},
            "wire_sizes_bytes": list(sizes), "wire_reps": reps}


def _network(run: Run) -> dict[str, Any]:
    """The network benchmark of a profiling run: :func:`network_bench` with the spec's
    sizes and, on a CPU host, :func:`wake_bench` and :func:`wire_bench` added to it.
    Should any of them fail (any exception but Ctrl-C), the figures measured so far are
    kept and the error goes to ``network_error``."""
    out: dict[str, Any] = {}
    try:
        out["network"] = network_bench(run.device, run.spec.net_bytes, run.spec.net_reps)
        if run.dev.type == "cpu":
            out["network"].update(wake_bench(run.spec.wake_rounds))
            out["network"].update(wire_bench(reps=run.spec.wire_reps))
    except Exception as e:  # noqa: BLE001 - any failure; Ctrl-C still propagates
        # it runs last: keep the rest of the run (run_profile writes it, then
        # reports this), with the network part missing or partial
        out["network_error"] = (str(e) if isinstance(e, HetsimError)
                                else f"network benchmark: {type(e).__name__}: {e}")
    return out


register(Benchmark(
    "network", "point-to-point and all-reduce between two local processes; on a CPU host also "
    "the wake-up latency and the runtime's per-byte message costs",
    ("network", "network_error"), order=90, run=_network, label="network",
    applies=lambda run: run.network))
