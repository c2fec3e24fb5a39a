"""Messages between runtime ranks over torch.distributed point-to-point (gloo).

Every message is a fixed header (``HEADER_LEN`` float64: kind, then fields)
sent with tag ``TAG_HEADER``, followed, when its ``nbytes`` field is non-zero,
by one uint8 payload of that many bytes with tag ``TAG_PAYLOAD`` to the same
peer. float64 holds every integer field exactly (< 2**53).

A PS shard receives with a :class:`Receiver`: a thread that keeps one
any-source header receive posted, then reads the payload from that header's
sender, and queues ``(src, header, payload)``. The shard's main loop waits on
that queue with a timeout, which is how it notices silence (a dead worker):
gloo neither reports a dead peer to an any-source receive nor survives a
receive that times out (its timeout closes the connections), so no gloo
operation here is ever given a timeout shorter than the run's.

An all-reduce plan's coordinator and workers send the same headers over TCP
sockets instead (:class:`Channel`, :class:`ControlServer`): their messages are
control only (words, figures, reports), and the coordinator shares a core with a
worker wherever the workers take every core, where a gloo exchange spins.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from runtime import quant

HEADER_LEN = 10
TAG_HEADER = 11
TAG_PAYLOAD = 12

# kinds (header[0])
PULL = 1      # worker -> shard: [kind, iteration]
PARAMS = 2    # shard -> worker: [kind, version, share, stop, bits, nbytes]
PUSH = 3      # worker -> shard: [kind, iteration, samples, loss, compute_s, free_mem, bits, nbytes, pulled_version]
REPORT = 4    # worker -> shard 0: [kind, 0, ..., nbytes] + JSON payload (spans, totals)
COMMIT = 5    # shard 0 -> shard k: [kind, iteration, ..., nbytes] + int64 member ranks
STOP = 6      # shard 0 -> shard k: [kind]
PUSH_PART = 7  # worker -> shard (job.pipeline): [kind, iteration, first tensor index in shard, bits, samples,
#                count, nbytes]: the packed gradients of tensors first .. first + count - 1, end to end
PUSH_DONE = 8  # worker -> shard after its parts: PUSH's fields with nbytes 0
SAVED = 9     # shard k -> shard 0: [kind, version, ..., nbytes] + JSON {file, sha256} of its checkpoint
# between the stage replicas of a multi-stage plan (runtime.stages), each with the samples it carries:
ACT = 10      # stage s -> s+1: [kind, iteration, micro-batch, first sample, samples, nbytes] + activations
GRAD = 11     # stage s+1 -> s: the same fields + the gradients of those activations
TARGET = 12   # first stage -> last stage: the same fields + the targets of those samples
# pulls pipelined (runtime.pipeline_pulls, runtime.pulls):
PARAMS_PART = 13  # shard -> worker: [kind, version, nbytes] + int64 tensor indices in the shard, then
#                   one more TAG_PAYLOAD message per tensor: its fp32 values
EXPECT = 14   # shard 0 -> shard k: [kind, iteration, ..., nbytes] + int64 ranks expected to push it
# all-reduce plans (runtime.collective): rank 0 coordinates, the workers reduce among themselves
CONTROL = 15  # coordinator -> worker: [kind, iteration, share, stop, epoch, total samples of the members,
#               members]: the word for that iteration, sent two iterations ahead
FIGURES = 16  # worker -> coordinator, its update of the iteration applied: [kind, iteration, samples, loss,
#               compute_s, free_mem, the update's end (wall clock)]
ABORT = 17    # worker -> coordinator, its all-reduce of the iteration failed: [kind, iteration]
REFORM = 18   # coordinator -> worker: CONTROL's fields, then the rank the state comes from; nbytes + int64
#               member ranks: a new group, the state of that rank, and the iteration to go on from
HELLO = 19    # worker -> coordinator, first on its control channel (Channel): [kind, its rank]

# field positions
F_KIND, F_ITER, F_A, F_B, F_C, F_D, F_E, F_NBYTES = 0, 1, 2, 3, 4, 5, 6, 9


@dataclass
class Message:
    src: int
    header: list[float]
    payload: torch.Tensor | None

    @property
    def kind(self) -> int:
        return int(self.header[F_KIND])

    @property
    def iteration(self) -> int:
        return int(self.header[F_ITER])


def header(kind: int, iteration: int = 0, *fields: float, nbytes: int = 0) -> torch.Tensor:
    h = torch.zeros(HEADER_LEN, dtype=torch.float64)
    h[F_KIND] = kind
    h[F_ITER] = iteration
    for i, v in enumerate(fields):
        h[F_A + i] = float(v)
    h[F_NBYTES] = nbytes
    return h


def send(dst: int, kind: int, iteration: int = 0, *fields: float,
         payload: torch.Tensor | None = None) -> int:
    """Send a header (and payload) to ``dst``; returns the payload bytes sent."""
    n = 0 if payload is None else int(payload.numel())
    dist.send(header(kind, iteration, *fields, nbytes=n), dst=dst, tag=TAG_HEADER)
    if n:
        assert payload is not None and payload.dtype == torch.uint8
        dist.send(payload.contiguous(), dst=dst, tag=TAG_PAYLOAD)
    return n


def isend(dst: int, kind: int, iteration: int = 0, *fields: float,
          payload: torch.Tensor | None = None) -> list[Any]:
    """:func:`send` without waiting: returns the pending works, which hold the tensors
    until they complete (wait on them before the tensors may change).

    The stage replicas of a pipeline send this way: a blocking send waits for the
    matching receive, and two neighbours sending to each other (an activation one
    way, a gradient the other, as 1F1B does) would wait for ever.
    """
    n = 0 if payload is None else int(payload.numel())
    works = [dist.isend(header(kind, iteration, *fields, nbytes=n), dst=dst, tag=TAG_HEADER)]
    if n:
        assert payload is not None and payload.dtype == torch.uint8
        works.append(dist.isend(payload.contiguous(), dst=dst, tag=TAG_PAYLOAD))
    return works


def recv(src: int) -> Message:
    """The next message from ``src`` (blocking; ranks that are not PS shards receive this way)."""
    h = torch.zeros(HEADER_LEN, dtype=torch.float64)
    dist.recv(h, src=src, tag=TAG_HEADER)
    return _with_payload(src, h)


def _with_payload(src: int, header: torch.Tensor) -> Message:
    """The message whose header arrived from ``src``: receives its payload, if it has one."""
    hd = header.tolist()
    n = int(hd[F_NBYTES])
    payload = None
    if n:
        payload = torch.empty(n, dtype=torch.uint8)
        dist.recv(payload, src=src, tag=TAG_PAYLOAD)
    return Message(src, hd, payload)


def part_tensors(m: Message, numels: list[int]) -> list[tuple[int, torch.Tensor]]:
    """The gradients a ``PUSH_PART`` carries: ``(k, values)`` for each of its ``count``
    tensors ``k`` from ``first`` on (``numels[k]`` values each, unpacked from its slice).

    Raises:
        ValueError: a count below 1, tensors past ``numels``, or a payload of another size.
    """
    assert m.payload is not None
    first, bits, count = int(m.header[F_A]), int(m.header[F_B]), int(m.header[F_D])
    if count < 1 or first < 0 or first + count > len(numels):
        raise ValueError(f"push part of tensors {first} .. {first + count - 1} of {len(numels)}")
    ks = range(first, first + count)
    return list(zip(ks, quant.unpack_many(m.payload, [numels[k] for k in ks], bits)))


def json_payload(obj: object) -> torch.Tensor:
    """``obj`` as a JSON payload (REPORT, SAVED)."""
    return torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)


def json_of(m: Message) -> Any:
    """The JSON payload of ``m``."""
    assert m.payload is not None
    return json.loads(bytes(m.payload.tolist()).decode())


def _next(q: queue.Queue[Message | BaseException], timeout_s: float) -> Message | None:
    """The next message a reader thread queued, or None after ``timeout_s`` of silence; an
    error it queued is raised here, in the thread that reads the queue."""
    try:
        item = q.get(timeout=timeout_s)
    except queue.Empty:
        return None
    if isinstance(item, BaseException):
        raise item
    return item


class Receiver:
    """Background any-source receiver feeding a queue (see the module docstring)."""

    def __init__(self) -> None:
        self.q: queue.Queue[Message | BaseException] = queue.Queue()
        self.thread = threading.Thread(target=self._loop, name="hetsim-rx", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            h = torch.zeros(HEADER_LEN, dtype=torch.float64)
            try:
                work = dist.irecv(h, src=None, tag=TAG_HEADER)
                assert work is not None
                work.wait()
                msg = _with_payload(int(work._source_rank()), h)
            except BaseException as e:  # noqa: BLE001 - handed to the main loop
                if "closed by peer" in str(e).lower() or "connection reset" in str(e).lower():
                    continue  # a peer died mid-message: its silence is detected by timeout
                self.q.put(e)
                return
            self.q.put(msg)

    def get(self, timeout_s: float) -> Message | None:
        """The next message, or None after ``timeout_s`` of silence."""
        return _next(self.q, timeout_s)


# ------------------------------------------------ the all-reduce plans' control channel
class Channel:
    """Messages of :data:`HEADER_LEN` float64 (and a uint8 payload of ``nbytes``) over one
    TCP socket: the headers of the gloo path, framed by their fixed length.

    The coordinator of an all-reduce plan and its workers exchange their words and
    figures this way, not over gloo point-to-point: a gloo exchange between two ranks
    that share a core spins the waiting rank's transport thread while the other waits
    for the core (docs/guides/validation.md, "Why the shard is pinned"), and the
    coordinator shares a core with a worker wherever the workers take every core. A
    blocking socket read sleeps. ``src``: the rank at the other end.
    """

    def __init__(self, sock: socket.socket, src: int) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6):  # a word goes out at once, not batched
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock, self.src = sock, src

    def send(self, kind: int, iteration: int = 0, *fields: float, payload: torch.Tensor | None = None) -> None:
        """One message, header then payload (a uint8 tensor), written whole."""
        n = 0 if payload is None else int(payload.numel())
        data = header(kind, iteration, *fields, nbytes=n).numpy().tobytes()
        if n:
            assert payload is not None and payload.dtype == torch.uint8
            data += payload.contiguous().numpy().tobytes()
        self.sock.sendall(data)

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            got = self.sock.recv(n - len(buf))
            if not got:
                raise ConnectionError(f"the control channel of rank {self.src} closed by peer")
            buf += got
        return bytes(buf)

    def recv(self) -> Message:
        """The next message (blocking).

        Raises:
            ConnectionError: the other end closed the connection.
            TimeoutError: the socket has a timeout and nothing came within it.
        """
        hd = np.frombuffer(self._exact(8 * HEADER_LEN), dtype=np.float64).tolist()
        n = int(hd[F_NBYTES])
        payload = torch.frombuffer(bytearray(self._exact(n)), dtype=torch.uint8) if n else None
        return Message(self.src, hd, payload)

    def close(self) -> None:
        self.sock.close()


class ControlServer:
    """The coordinator's end of every worker's :class:`Channel`: a socket listening on
    ``host`` (any free port: :attr:`port`), :meth:`accept` of the workers' connections,
    a reader thread per connection feeding one queue (:meth:`get`, as :class:`Receiver`
    does; a worker stalled halfway through a message holds up only its own thread), and
    :meth:`send` to one worker. A closed connection is silence: the coordinator notices
    a dead worker by its timeout, as on the gloo path; any other error of a reader is
    raised by :meth:`get`."""

    def __init__(self, host: str) -> None:
        self.listener = socket.create_server((host, 0))
        self.port = int(self.listener.getsockname()[1])
        self.channels: dict[int, Channel] = {}
        self.q: queue.Queue[Message | BaseException] = queue.Queue()
        self.readers: list[threading.Thread] = []
        self.lock = threading.Lock()

    def accept(self, ranks: Sequence[int], timeout_s: float) -> None:
        """Accept the connections of ``ranks`` for up to ``timeout_s`` in all: each is read
        by a thread of its own from the start, which expects a :data:`HELLO` with its rank
        by the deadline and closes a connection that says nothing in time, something else,
        or a rank not in ``ranks`` or already connected. Returns once every rank has
        connected or at the deadline; a rank not connected by then is left out
        (:meth:`send` to it raises)."""
        end = time.monotonic() + timeout_s
        expected = set(ranks)
        while (left := end - time.monotonic()) > 0:
            with self.lock:
                if expected <= set(self.channels):
                    return
            self.listener.settimeout(min(left, 0.05))
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            t = threading.Thread(target=self._serve, args=(sock, expected, end), daemon=True,
                                 name="hetsim-ctl")
            t.start()
            self.readers.append(t)

    def _serve(self, sock: socket.socket, expected: set[int], end: float) -> None:
        """One connection: its HELLO by ``end``, then every message into the queue."""
        sock.settimeout(max(end - time.monotonic(), 1e-3))
        ch = Channel(sock, -1)
        try:
            hello = ch.recv()
        except OSError:  # silent past the deadline, or gone (ConnectionError included)
            ch.close()
            return
        rank = int(hello.header[F_ITER])
        with self.lock:
            ok = hello.kind == HELLO and rank in expected and rank not in self.channels
            if ok:
                ch.src = rank
                self.channels[rank] = ch
        if not ok:
            ch.close()
            return
        sock.settimeout(None)
        while True:
            try:
                m = ch.recv()
            except OSError:  # closed: the worker is gone, or close()
                return
            except BaseException as e:  # noqa: BLE001 - handed to the main loop
                self.q.put(e)
                return
            self.q.put(m)

    def send(self, rank: int, kind: int, iteration: int = 0, *fields: float,
             payload: torch.Tensor | None = None) -> None:
        """One message to ``rank``.

        Raises:
            RuntimeError: ``rank`` never connected.
            OSError: its connection is gone.
        """
        with self.lock:
            ch = self.channels.get(rank)
        if ch is None:
            raise RuntimeError(f"rank {rank} never connected to the control channel")
        ch.send(kind, iteration, *fields, payload=payload)

    def get(self, timeout_s: float) -> Message | None:
        """The next message, or None after ``timeout_s`` of silence."""
        return _next(self.q, timeout_s)

    def close(self) -> None:
        """Stop listening, end every connection and wait for its reader."""
        self.listener.close()
        with self.lock:
            channels = list(self.channels.values())
        for ch in channels:
            try:
                ch.sock.shutdown(socket.SHUT_RDWR)  # wakes its reader's recv
            except OSError:
                pass  # already gone
            ch.close()
        for t in self.readers:
            t.join(timeout=5.0)


#: MASTER_ADDR values of a run on this machine alone: the control server listens there only
_LOCAL = ("127.0.0.1", "localhost", "::1")


def serve_control(ranks: Sequence[int], timeout_s: float) -> ControlServer:
    """Rank 0's side of the control channels: a :class:`ControlServer` on this host
    (every address, or loopback alone where ``MASTER_ADDR`` is loopback), its port
    broadcast over the process group (every rank takes part: :func:`connect_control`),
    and ``ranks``' connections accepted for up to ``timeout_s``."""
    addr = os.environ["MASTER_ADDR"]
    server = ControlServer(addr if addr in _LOCAL else "")
    dist.broadcast(torch.tensor([server.port], dtype=torch.int64), src=0)
    server.accept(ranks, timeout_s)
    return server


def connect_control(rank: int, timeout_s: float) -> Channel:
    """A worker's side: the port from rank 0's broadcast, a connection to ``MASTER_ADDR``
    (the host of rank 0) there, and its :data:`HELLO`. Every read and write of the channel
    gives up after ``timeout_s`` of silence (the coordinator is gone)."""
    port = torch.zeros(1, dtype=torch.int64)
    dist.broadcast(port, src=0)
    sock = socket.create_connection((os.environ["MASTER_ADDR"], int(port)), timeout=timeout_s)
    channel = Channel(sock, 0)
    channel.send(HELLO, rank)
    return channel
