"""How a sweep (:mod:`experiments.sweep`) runs its points and owns its folder.

- The backends: one point after another in this process, a local process pool, or a
  dask.distributed cluster. Each yields finished points in completion order; ``close``
  stops them (``abort``: at once, dropping what has not run).
- Worker lifetime: a pool worker dies with the sweep that started it, also when the
  sweep is killed outright (``kill -9``): on Linux the kernel sends the worker SIGKILL
  when its parent dies (``prctl(PR_SET_PDEATHSIG)``); elsewhere a watcher thread in the
  worker ends it within :data:`WATCH_S` of its parent going. Workers ignore SIGINT: a
  Ctrl-C reaches the whole process group, and the sweep stops them itself.
- The folder lock ``DIR/.sweep.lock``: held (``flock``) by the one sweep writing DIR,
  and only by it (its workers close their inherited copy), with the owner's PID and
  host written in it. A lock held although its owner is gone (by processes a killed
  sweep left behind) is stale: it is taken over, with a one-line note on stderr.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from hardware_profiles.errors import ConfigError, HetsimError

LOCK = ".sweep.lock"
#: how often a worker without a parent-death signal checks that its parent is alive (seconds)
WATCH_S = 0.5
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`experiments.sweep.run_sweep`; the workers are stopped, the
    table is intact.

    Attributes:
        done: points finished in this run.  remaining: points not run.
        csv: the results.csv path.
    """

    def __init__(self, done: int, remaining: int, csv_path: Path) -> None:
        super().__init__(f"{done} points done, {remaining} not run")
        self.done, self.remaining, self.csv = done, remaining, csv_path


# ------------------------------------------------------------------ Ctrl-C
def set_sigint(handler: Any) -> Any:
    """Set the SIGINT handler where Python allows it (the main thread) and return
    the old one; None (nothing to restore) elsewhere or for ``handler=None``."""
    if handler is None or threading.current_thread() is not threading.main_thread():
        return None
    prev = signal.signal(signal.SIGINT, handler)
    return signal.SIG_DFL if prev is None else prev


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold Ctrl-C back while worker processes are being started (main thread only): one
    arriving mid-start would leave a child that nothing stops, holding the pipes open.
    A held-back Ctrl-C is delivered when the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


# ------------------------------------------------------------------ worker lifetime
def _set_pdeathsig(sig: int) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent dies; False where
    that is not available (another system, or no libc to call)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int, interval_s: float) -> None:
    while os.getppid() == parent:
        time.sleep(interval_s)
    os._exit(1)  # orphaned: the sweep is gone, and nobody will read this point's result


def die_with_parent(parent: int, use_signal: bool = True, interval_s: float = WATCH_S) -> None:
    """Make this process end when ``parent`` (the PID that started it) dies.

    With ``use_signal`` on Linux: the kernel sends SIGKILL at the parent's death (and if
    the parent died before this call, the process ends now). Otherwise: a daemon thread
    that checks every ``interval_s`` whether the parent is still the one that started it.
    """
    if use_signal and _set_pdeathsig(signal.SIGKILL):
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)
        return
    threading.Thread(target=_watch_parent, args=(parent, interval_s), daemon=True,
                     name="hetsim-parent-watch").start()


def _worker_init(parent: int, close_fds: Sequence[int]) -> None:
    # Ctrl-C reaches the whole process group; only the parent reacts (and stops the workers).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for fd in close_fds:  # e.g. the sweep lock a forked worker inherited: only its owner holds it
        with contextlib.suppress(OSError):
            os.close(fd)
    die_with_parent(parent)


def _pool_context() -> Any:
    """Workers must be children of the sweep itself (parent-death signal, getppid watch):
    forked on Linux (before any thread of the parent exists), spawned elsewhere; never a
    fork server, whose children are not ours."""
    return multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")


# ------------------------------------------------------------------ backends
class InProcess:
    """jobs=1: run the points one after another in this process."""

    def __init__(self, tasks: list[Any], fn: Callable[[Any], Any]) -> None:
        self.tasks, self.fn = tasks, fn

    def __iter__(self) -> Iterator[Any]:
        return (self.fn(t) for t in self.tasks)

    def close(self, abort: bool) -> None:
        pass


class LocalPool:
    """A process pool; the workers are forked here (Linux), before any thread (the
    progress bar's) exists, ignore SIGINT (the parent stops them), close ``close_fds``
    and die with this process (:func:`die_with_parent`)."""

    def __init__(self, tasks: list[Any], jobs: int, fn: Callable[[Any], Any],
                 close_fds: Sequence[int] = ()) -> None:
        from concurrent.futures import ProcessPoolExecutor

        self.pool = ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=_pool_context(),
                                        initializer=_worker_init, initargs=(os.getpid(), tuple(close_fds)))
        self.futures = [self.pool.submit(fn, t) for t in tasks]

    def __iter__(self) -> Iterator[Any]:
        from concurrent.futures import as_completed
        from concurrent.futures.process import BrokenProcessPool

        try:
            for f in as_completed(self.futures):
                yield f.result()
        except BrokenProcessPool:
            raise HetsimError("a sweep worker process died (killed, or out of memory?); every "
                              "finished point is in results.csv: rerun the same command to resume") from None

    def pids(self) -> list[int]:
        """The worker processes' PIDs (for tests and diagnostics)."""
        return [p.pid for p in (getattr(self.pool, "_processes", None) or {}).values()]

    def close(self, abort: bool) -> None:
        if not abort:
            self.pool.shutdown(wait=True)
            return
        # Drop what has not started and stop the running points now rather than
        # wait for them. ProcessPoolExecutor has no public way to stop its workers
        # before Python 3.14 (terminate_workers), hence _processes, read before
        # shutdown() clears it.
        procs = list((getattr(self.pool, "_processes", None) or {}).values())
        self.pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(10)


class Dask:
    """Points as tasks on a dask.distributed cluster: the one at ``address``, or a
    LocalCluster on 127.0.0.1 with ``jobs`` single-threaded worker processes,
    closed at the end. A task that fails on the cluster (its worker killed, or lost)
    becomes ``lost(point_id, message)``."""

    def __init__(self, tasks: list[Any], jobs: int, address: str | None, fn: Callable[[Any], Any],
                 lost: Callable[[str, str], Any]) -> None:
        import logging

        from dask.distributed import Client, LocalCluster

        self.cluster = None
        self.lost = lost
        if address is None:
            # Ctrl-C reaches the whole process group; the workers must leave it to
            # us. An ignored SIGINT survives their fork+exec (a handler would not).
            prev = set_sigint(signal.SIG_IGN)
            try:
                self.cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True,
                                            host="127.0.0.1", dashboard_address="127.0.0.1:0",
                                            silence_logs=logging.CRITICAL)
            finally:
                set_sigint(prev)
            address = self.cluster.scheduler_address
        try:
            self.client = Client(address)
        except BaseException:
            if self.cluster is not None:
                self.cluster.close()
            raise
        run = uuid.uuid4().hex[:8]  # unique keys: one scheduler may serve several sweeps
        self.tasks = {f"hetsim-{t.point_id}-{run}": t for t in tasks}
        self.futures = self.client.map(fn, tasks, key=list(self.tasks), pure=False)

    def __iter__(self) -> Iterator[Any]:
        from dask.distributed import as_completed

        for f in as_completed(self.futures):
            try:
                yield f.result()
            except Exception as e:  # the point killed its workers (KilledWorker), or was lost
                yield self.lost(self.tasks[f.key].point_id, " ".join(f"{type(e).__name__}: {e}".split()))

    def close(self, abort: bool) -> None:
        try:
            if abort:
                with contextlib.suppress(Exception):
                    self.client.cancel(self.futures)
            self.client.close()
        finally:
            if self.cluster is not None:
                self.cluster.close()


# ------------------------------------------------------------------ the folder lock
def _owner_text() -> bytes:
    return f"{os.getpid()} {socket.gethostname()}\n".encode()


def _read_owner(fd: int) -> tuple[int, str] | None:
    """(PID, host) written in an open lock file; None when it names none (empty, or
    written by a hetsim that did not record its owner)."""
    try:
        pid, host = os.pread(fd, 512, 0).decode("utf-8", "replace").split()[:2]
        return int(pid), host
    except (OSError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine and has not exited (a zombie,
    dead but not yet reaped, counts as exited where /proc tells)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[:1] != ["Z"]


def _try_lock(path: Path) -> tuple[int | None, tuple[int, str] | None]:
    """(fd holding the lock on the file now at ``path``, None) or (None, the holder's owner)."""
    import fcntl

    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            owner = _read_owner(fd)
            os.close(fd)
            return None, owner
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd, None
        os.close(fd)  # replaced (taken over) between our open and flock: try the new file


def _claim(fd: int) -> int:
    os.ftruncate(fd, 0)
    os.pwrite(fd, _owner_text(), 0)
    return fd


def _refuse(out: Path, owner: tuple[int, str] | None) -> ConfigError:
    who = (f" (PID {owner[0]}{'' if owner[1] == socket.gethostname() else ' on ' + owner[1]})"
           if owner else "")
    return ConfigError(str(out), "--out", f"another hetsim sweep{who} is writing this folder")


def _stale(owner: tuple[int, str] | None) -> bool:
    return owner is not None and owner[1] == socket.gethostname() and not pid_alive(owner[0])


def acquire_lock(out: Path) -> int:
    """Take ``out/.sweep.lock`` for this process; return its descriptor (close it to release).

    Raises:
        ConfigError: a live sweep holds it (naming its PID), or a holder whose owner is
            unknown (a lock file without an owner, or on another host).
    """
    path = out / LOCK
    fd, owner = _try_lock(path)
    if fd is not None:
        return _claim(fd)
    if not _stale(owner):
        raise _refuse(out, owner)
    return _take_over(out, path)


def _take_over(out: Path, path: Path) -> int:
    """Replace a stale lock file by a new one held by us, under a short guard lock so
    that two sweeps taking over at once cannot both win."""
    import fcntl

    guard = os.open(out / (LOCK + ".takeover"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        fd, owner = _try_lock(path)  # again, under the guard: another sweep may have won
        if fd is not None:
            return _claim(fd)
        if not _stale(owner):
            raise _refuse(out, owner)
        tmp = out / f"{LOCK}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _claim(fd)
            os.replace(tmp, path)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        assert owner is not None  # _stale
        print(f"hetsim: note: {path} was held for PID {owner[0]}, which is no longer running "
              "(processes a killed sweep left behind?); taken over", file=sys.stderr)
        return fd
    finally:
        os.close(guard)
