"""Starting the ranks of a run, and making sure none is left behind.

Ranks: ``0 .. S-1`` are the PS shards (rank 0 also coordinates), ``S .. S+W-1``
the workers, in plan order (of a multi-stage plan: the stage replicas, stage by
stage; one that exits with an error fails the run). An all-reduce plan
(``job.sync: allreduce``) has no shards: rank 0 coordinates
(:mod:`runtime.coordinator`) and ``1 .. W`` are the workers
(:mod:`runtime.collective`). All join one gloo process group through env://
rendezvous (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).

* :func:`run_local` spawns every rank as a child process on this machine
  (127.0.0.1, a free port chosen now), waits for rank 0, and in a ``finally``
  terminates, then kills, whatever is still running; SIGINT and SIGTERM
  reach that ``finally`` (SIGTERM is turned into SystemExit). Children ignore
  SIGINT (the parent owns Ctrl-C) and ask the kernel to SIGKILL them if the
  parent dies (PR_SET_PDEATHSIG), so even a killed launcher leaves nothing.
* :func:`run_rank` is what one rank runs; under torchrun every process calls
  it with the rank from its environment (see docs/guides/runtime.md).
"""

from __future__ import annotations

import ctypes
import datetime
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from runtime.affinity import GLOO_LOOP, lower_priority, pin
from runtime.spec import CONNECT_TIMEOUT_S, RunSpec
from sim.result import RunResult

LOOPBACK = "127.0.0.1"
GRACE_S = 3.0
#: glibc mallopt parameters (malloc.h) and the value :func:`keep_freed_memory` gives them
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEEP_BYTES = 1 << 30


class RuntimeFailure(RuntimeError):
    """A rank failed in a way the run cannot survive (a PS shard, or rank 0)."""


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def run_rank(spec: RunSpec, rank: int, world: int, local_rank: int = 0,
             on_connected: Callable[[], None] | None = None) -> RunResult | None:
    """Join the process group as ``rank`` and play that role; rank 0 returns the RunResult.
    ``on_connected`` is called once the group has formed (every rank has joined)."""
    import torch
    import torch.distributed as dist

    if world != spec.world_size:
        raise RuntimeFailure(f"world size {world} != {spec.first_worker} PS shards or coordinator + "
                             f"{spec.n_workers} workers")
    keep_freed_memory()
    # the rank's emulated threads and CPUs, before gloo starts its threads: a process's
    # affinity at a thread's start is the thread's (pinning later pins the caller only)
    if rank < spec.first_worker:
        threads, cpus = spec.threads, spec.coordinator_affinity if spec.allreduce else spec.ps_affinity
    else:
        ws = spec.workers[rank - spec.first_worker]
        threads, cpus = ws.threads, ws.affinity
    torch.set_num_threads(threads)
    if cpus is not None:
        pin(cpus)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=spec.timeout_s))
    lower_priority(GLOO_LOOP, spec.gloo_loop_nice)  # its threads start with the group
    if on_connected is not None:
        on_connected()
    try:
        if spec.allreduce:
            from runtime.collective import run_collective_worker
            from runtime.coordinator import CollectiveCoordinator

            if rank == 0:
                return CollectiveCoordinator(spec).run()
            run_collective_worker(spec, rank - spec.first_worker, local_rank)
            return None
        if rank < spec.n_shards:
            from runtime.ps import Coordinator, Shard

            if rank == 0:
                return Coordinator(spec).run()
            Shard(spec, rank).serve()
            return None
        if spec.multistage:
            from runtime.stage_worker import run_stage

            run_stage(spec, rank - spec.n_shards, local_rank)
        else:
            from runtime.worker import run_worker

            run_worker(spec, rank - spec.n_shards, local_rank)
        return None
    finally:
        dist.destroy_process_group()


def keep_freed_memory() -> bool:
    """Make this process reuse the memory it frees instead of handing it back to the kernel
    (glibc; returns False, changing nothing, elsewhere).

    Every message and gradient allocates tensors as large as the model (receive buffers,
    unpacked gradients, the weighted mean). By default glibc serves such blocks with a
    fresh ``mmap`` (above its mmap threshold) or trims them off the heap when freed, so
    the next one is faulted in page by page and zeroed by the kernel again: measured on
    the 2-core validation machine, that first touch costs about as much CPU per byte as
    the copy itself (resnet18, 2 workers: 0.347 s per iteration, 0.186 s with freed
    memory kept; the mlp: 0.0365 s vs 0.0303 s). With the mmap and trim thresholds at
    1 GiB, blocks below it come from the heap and stay there once freed, so a rank's
    footprint settles at its peak and each buffer is reused warm, as the profile's
    measurements (copies, pack/unpack) were taken.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_BYTES))


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; a no-op elsewhere)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def local_rank_of(spec: RunSpec, rank: int) -> int:
    """The local rank ``hetsim run`` gives ``rank`` of one machine's run: a worker its index
    among the workers (so that ``runtime.device: cuda`` puts worker w on GPU w modulo the
    GPUs, :func:`runtime.task.compute_device`), a PS shard or the coordinator 0 (they do
    not compute on a GPU)."""
    return max(rank - spec.first_worker, 0)


def _child(spec: RunSpec, rank: int, world: int, port: int, result_path: str) -> None:
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    local = local_rank_of(spec, rank)
    os.environ.update({"MASTER_ADDR": LOOPBACK, "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(local)})
    code = 0
    try:
        marker = Path(result_path).with_name(f"connected.{rank}")
        res = run_rank(spec, rank, world, local_rank=local, on_connected=marker.touch)
        if rank == 0:
            tmp = result_path + ".tmp"
            with open(tmp, "wb") as f:
                pickle.dump(res, f)
            os.replace(tmp, result_path)
    except BaseException:  # noqa: BLE001 - reported, then the exit code says it
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # os._exit: the receiver thread of a shard is blocked inside gloo; a normal
        # interpreter exit could wait on it or crash tearing it down.
        os._exit(code)


@contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    def handler(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def reap(procs: list[Any], grace_s: float = GRACE_S) -> None:
    """Terminate, then kill, every process still alive; join them all."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()


def _check_stages(spec: RunSpec, procs: list[Any]) -> None:
    """Raise if a stage replica has exited with an error, naming the cause.

    One dead replica takes its neighbours down (their receives fail), so
    several may have exited by now: a replica killed by a signal is named
    before those that failed after it.
    """
    def failed() -> list[tuple[int, int]]:
        codes = [(w, procs[spec.n_shards + w].exitcode) for w in range(spec.n_workers)]
        return [(w, c) for w, c in codes if c is not None and c != 0]

    if not failed():
        return
    time.sleep(0.2)  # let the cause's exit show up next to its consequences
    w, code = min(failed(), key=lambda wc: (wc[1] >= 0, wc[0]))
    raise RuntimeFailure(f"stage {spec.stage_of(w)} replica {spec.workers[w].device} (rank "
                         f"{spec.n_shards + w}) exited with status {code}")


def _role(spec: RunSpec, rank: int) -> str:
    if rank < spec.first_worker:
        if rank == 0:
            return "rank 0 (the coordinator)" if spec.allreduce else "rank 0 (PS shard 0, coordinator)"
        return f"PS shard {rank} (rank {rank})"
    w = rank - spec.first_worker
    return f"worker {w} ({spec.workers[w].device}, rank {rank})"


def _status(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exited with status {code}"


class _Liveness:
    """The launcher's watch over its ranks, from the moment they are spawned.

    * Until every rank has joined the process group (each touches ``connected.RANK``
      in ``folder`` then), a rank that exits is a failure at once (the others would
      wait for it until ``spec.timeout_s``), and the group must form within
      :data:`CONNECT_TIMEOUT_S` (or the run's limit, if shorter).
    * Then a PS shard that exits with an error, a stage replica of a multi-stage plan
      (:func:`_check_stages`), or every worker dead while rank 0 waits for them,
      (each exited with an error or a signal) for longer than ``failure_timeout_s``,
      ends the run with that cause.
    * The whole run is bounded by ``limit`` seconds.
    """

    def __init__(self, spec: RunSpec, procs: list[Any], folder: Path, limit: float) -> None:
        self.spec, self.procs, self.folder, self.limit = spec, procs, folder, limit
        self.t0 = time.monotonic()
        self.connect_limit = min(CONNECT_TIMEOUT_S, limit)
        self.connected = False
        self.all_dead_at: float | None = None

    def check(self) -> None:
        spec, procs, now = self.spec, self.procs, time.monotonic()
        if not self.connected:
            self.connected = all((self.folder / f"connected.{r}").exists() for r in range(len(procs)))
        if not self.connected:
            for r, p in enumerate(procs):  # (one that joined, then died, has its marker)
                if p.exitcode is not None and not (self.folder / f"connected.{r}").exists():
                    raise RuntimeFailure(f"{_role(spec, r)} {_status(p.exitcode)} before the ranks "
                                         "had connected")
            if now - self.t0 > self.connect_limit:
                missing = [r for r in range(len(procs)) if not (self.folder / f"connected.{r}").exists()]
                raise RuntimeFailure(f"the ranks did not connect within {self.connect_limit:g} s "
                                     f"(not joined: {', '.join(_role(spec, r) for r in missing[:3])}"
                                     f"{', ...' if len(missing) > 3 else ''})")
        for k in range(1, spec.n_shards):
            if procs[k].exitcode is not None and procs[k].exitcode != 0:
                raise RuntimeFailure(f"PS shard {k} {_status(procs[k].exitcode)}")
        if spec.multistage:  # a pipeline stalls without any of its stage replicas
            _check_stages(spec, procs)
        self._check_workers(now)
        if now - self.t0 > self.limit:
            raise RuntimeFailure(f"the run took longer than {self.limit:g} s; stopped")

    def _check_workers(self, now: float) -> None:
        """Every worker dead (each exited with an error or a signal) while rank 0 still
        waits: it has nobody left to train with, whatever its own timeouts."""
        workers = self.procs[self.spec.first_worker:]
        codes = [p.exitcode for p in workers]
        if not workers or any(c is None or c == 0 for c in codes):
            self.all_dead_at = None
            return
        if self.all_dead_at is None:
            self.all_dead_at = now
        if now - self.all_dead_at > self.spec.failure_timeout_s:
            c = codes[0]
            raise RuntimeFailure(f"every worker has died ({len(workers)} of {len(workers)}, "
                                 f"{_role(self.spec, self.spec.first_worker)} {_status(c)}); nobody is left to train")


def run_local(spec: RunSpec, wall_timeout_s: float | None = None) -> RunResult:
    """Run every rank on this machine and return rank 0's RunResult.

    Raises:
        RuntimeFailure: rank 0 or a PS shard died, or the run took longer than
            ``wall_timeout_s`` (default ``spec.timeout_s``).
    """
    import multiprocessing as mp

    world = spec.world_size
    ctx = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix="hetsim-run-")
    result_path = str(Path(tmp) / "result.pkl")
    procs: list[Any] = []
    limit = wall_timeout_s if wall_timeout_s is not None else spec.timeout_s
    try:
        with _sigterm_as_exit():
            port = free_port()
            # Ctrl-C is held back while the ranks start: one arriving inside p.start() would
            # leave a child that `procs` does not know, and that `reap` cannot stop
            old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                for rank in range(world):
                    p = ctx.Process(target=_child, args=(spec, rank, world, port, result_path),
                                    name=f"hetsim-rank{rank}", daemon=False)
                    p.start()
                    procs.append(p)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
            watch = _Liveness(spec, procs, Path(tmp), limit)
            while procs[0].is_alive():
                watch.check()
                procs[0].join(0.1)
            if procs[0].exitcode != 0 or not Path(result_path).is_file():
                role = "the coordinator" if spec.allreduce else "PS shard 0, coordinator"
                raise RuntimeFailure(f"rank 0 ({role}) exited with status "
                                     f"{procs[0].exitcode}; see its traceback above")
            with open(result_path, "rb") as f:
                result: RunResult = pickle.load(f)
            for p in procs:  # the others finish on their own after rank 0
                p.join(GRACE_S)
            return result
    finally:
        reap(procs)
        shutil.rmtree(tmp, ignore_errors=True)
