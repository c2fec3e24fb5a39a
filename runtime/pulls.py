"""Pipelined pulls (``runtime.pipeline_pulls``, with ``job.pipeline``; BSP, one-stage plans).

With ``job.pipeline`` alone a worker pushes each layer's gradients as backward
makes them (:class:`runtime.worker.Sender`) but pulls whole: shard 0 commits
iteration ``t`` once every worker's push is in, and the worker's forward of
``t + 1`` starts once all its parameters have arrived. With pipelined pulls
the pull side is layer-wise too, as the DES models ``job.pipeline`` by default
(``Job.pipeline_pulls``):

* **Shard** (:class:`ShardPulls`): a tensor is applied as soon as the
  gradient of it from every worker expected to push iteration ``t`` is in,
  and goes at once (``PARAMS_PART``) to every worker whose ``PULL(t + 1)`` is
  waiting; the tensors ready at that moment (all that were applied before
  the pull came, typically) go together: one header naming them, then each
  one's values, in model order. Shard 0 tells the other shards which
  workers are expected (``EXPECT``: the live workers with a share, after the
  rebalance that ends the previous iteration). The commit of ``t`` (shard 0's
  bookkeeping, ``COMMIT`` to the others) applies any tensor still waiting,
  with the commit's members: a worker found dead mid-iteration is left out
  of the tensors not applied yet, while tensors applied before included the
  gradients it had sent.
* **Worker** (:class:`Puller`): a receiver thread loads each arriving tensor
  into its parameter and flags it; a forward pre-hook on every module with
  parameters waits for that module's flags. The forward of ``t + 1`` thus
  starts with the first layer's parameters and overlaps the arrival of the
  rest. The hooks' waiting is left out of the worker's compute time (it is
  waiting, as in the DES). ``PARAMS`` from shard 0 (version, share, stop,
  bits) carries no payload.

The arithmetic is the whole-pull arithmetic tensor by tensor (the same
sample-weighted mean, the same SGD step, elementwise), so with the same
members a run gives bit-identical parameters and losses either way.
A worker sends ``PULL(t + 1)`` after its last push of ``t``; a tensor applied
earlier waits for that request at the shard (the DES sends it at once).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist

from runtime import wire
from runtime.spec import RunSpec


def weighted_mean(entries: dict[int, tuple[torch.Tensor, int]], members: list[int]) -> torch.Tensor:
    """Gradient of the members' whole batch: their mean gradients weighted by samples."""
    total = sum(entries[r][1] for r in members)
    first, *rest = members  # in rank order, so every run sums alike
    out = torch.mul(entries[first][0], entries[first][1] / total)
    for r in rest:
        out.add_(entries[r][0], alpha=entries[r][1] / total)
    return out


class ShardState(Protocol):
    """What :class:`ShardPulls` uses of its shard (:class:`runtime.ps.Shard`)."""

    spec: RunSpec
    owned: list[int]  # the model's tensors this shard holds
    numels: list[int]  # their sizes
    flat: torch.Tensor  # their values, one after the other
    offsets: list[int]  # where each starts in flat (and the end)
    version: int  # iterations applied
    busy_s: float  # time spent applying and serving


class ShardPulls:
    """One shard's side: per-tensor versions, the parts in, the pulls waiting."""

    def __init__(self, shard: ShardState) -> None:
        self.sh = shard
        n = len(shard.owned)
        self.tv = [shard.version] * n  # the version each tensor is at
        # (iteration, tensor) -> rank -> (gradient, samples)
        self.parts: dict[tuple[int, int], dict[int, tuple[torch.Tensor, int]]] = defaultdict(dict)
        self.expected: dict[int, list[int]] = {}  # iteration -> ranks expected to push it
        self.done: dict[int, set[int]] = defaultdict(set)  # iteration -> ranks whose PUSH_DONE is in
        self.pending: dict[int, tuple[int, set[int]]] = {}  # rank -> (version asked, tensors sent)
        self.bytes_in: dict[tuple[int, int], int] = defaultdict(int)  # (rank, iteration) -> part bytes
        self.works: list[Any] = []  # PARAMS_PART sends in flight

    # ------------------------------------------------------------ messages
    def on_part(self, m: wire.Message) -> None:
        """A ``PUSH_PART``: gradient tensors of one worker (fields: first tensor, bits, samples,
        count; :func:`runtime.wire.part_tensors`)."""
        assert m.payload is not None
        t0 = time.perf_counter()
        samples = int(m.header[wire.F_C])
        got = wire.part_tensors(m, self.sh.numels)
        for k, g in got:
            self.parts[(m.iteration, k)][m.src] = (g, samples)
        self.bytes_in[(m.src, m.iteration)] += m.payload.numel()
        self.sh.busy_s += time.perf_counter() - t0
        for k, _ in got:
            self._try(m.iteration, k)

    def on_done(self, m: wire.Message) -> int:
        """A ``PUSH_DONE``: the worker's parts of that iteration are all in; returns their bytes."""
        self.done[m.iteration].add(m.src)
        return self.bytes_in.pop((m.src, m.iteration), 0)

    def on_expect(self, t: int, ranks: list[int]) -> None:
        self.expected[t] = sorted(ranks)
        for k in range(len(self.tv)):
            self._try(t, k)

    def on_pull(self, m: wire.Message) -> None:
        self.pending[m.src] = (m.iteration, set())
        self.serve()

    def complete(self, t: int, members: list[int]) -> bool:
        """Whether every member's ``PUSH_DONE`` of ``t`` is here (its parts came before it)."""
        return all(r in self.done[t] for r in members)

    def commit(self, t: int, members: list[int]) -> None:
        """Iteration ``t`` commits with ``members``: apply every tensor still at version ``t``."""
        for k, v in enumerate(self.tv):
            if v == t:
                self._apply(t, k, members)
        for key in [key for key in self.parts if key[0] <= t]:  # parts of workers left out
            del self.parts[key]
        self.done.pop(t, None)
        self.expected.pop(t, None)
        for k in range(len(self.tv)):  # parts of t + 1 that came before this commit
            self._try(t + 1, k)
        self.serve()

    # ------------------------------------------------------------ internals
    def _try(self, t: int, k: int) -> None:
        ranks = self.expected.get(t)
        got = self.parts.get((t, k), {})  # not self.parts[...]: a look must not add an entry
        if ranks is not None and self.tv[k] == t and all(r in got for r in ranks):
            self._apply(t, k, ranks)
            self.serve()

    def _apply(self, t: int, k: int, ranks: list[int]) -> None:
        t0 = time.perf_counter()
        got = self.parts.pop((t, k), {})
        members = [r for r in sorted(ranks) if r in got]
        if members and sum(got[r][1] for r in members):
            sh = self.sh
            sh.flat[sh.offsets[k]:sh.offsets[k + 1]].add_(weighted_mean(got, members), alpha=-sh.spec.lr)
        self.tv[k] = t + 1
        self.sh.busy_s += time.perf_counter() - t0

    def serve(self) -> None:
        """Send every waiting pull the tensors that have reached its version, in model order.
        No pull of a version past the run's last iteration is served (nobody computes it:
        shard 0 answers those with stop)."""
        sh = self.sh
        self.works = [w for w in self.works if not w.is_completed()]  # sent (or failed: a dead worker)
        for rank, (t, sent) in list(self.pending.items()):
            if t >= sh.spec.iterations:
                del self.pending[rank]
                continue
            ready = [k for k, v in enumerate(self.tv) if k not in sent and v >= t]
            if not ready:
                continue
            # The tensors ready now go together: one header naming them (int64 indices), then
            # each tensor's values straight from the shard's vector, received straight into the
            # parameter (no copy at either end). Not blocking: while a worker takes a big tensor
            # in, the shard goes on taking the others' gradients. A tensor is changed again
            # only by the next iteration's update of it, which waits for the gradient of every
            # worker expected to push, each computed after receiving it; a worker with no share
            # is not waited for and may get a tensor mid-update (it computes nothing with it).
            try:
                self.works += wire.isend(rank, wire.PARAMS_PART, t,
                                         payload=torch.tensor(ready, dtype=torch.int64).view(torch.uint8))
                for k in ready:
                    self.works.append(dist.isend(sh.flat[sh.offsets[k]:sh.offsets[k + 1]], dst=rank,
                                                 tag=wire.TAG_PAYLOAD))
            except RuntimeError:  # the worker is gone: shard 0 finds out by its silence
                del self.pending[rank]
                continue
            sent.update(ready)
            if len(sent) == len(self.tv):
                del self.pending[rank]


class Puller:
    """A worker's side: a receiver thread loads arriving tensors; forward waits per module.

    Args:
        module: the model; every submodule with parameters of its own gets a
            forward pre-hook that waits for them.
        params: ``list(module.parameters())``.
        owned: the tensors (indices into ``params``) of each shard, in order.
        totals: the worker's totals (``pulled_bytes`` is added to).
        timeout_s: the longest wait for a header or a tensor.
        max_spans: receive spans kept for the trace.
        receive: start the receiver thread (false: tests flag ``ready`` themselves).
    """

    def __init__(self, module: torch.nn.Module, params: list[torch.nn.Parameter], owned: list[list[int]],
                 totals: dict[str, Any], timeout_s: float, max_spans: int, receive: bool = True) -> None:
        self.params, self.totals, self.timeout_s, self.max_spans = params, totals, timeout_s, max_spans
        self.S = len(owned)
        self.where = {(s, k): i for s, idx in enumerate(owned) for k, i in enumerate(idx)}
        self.ready = [threading.Event() for _ in params]
        self.headers: queue.Queue[list[float] | BaseException] = queue.Queue()
        self.error: BaseException | None = None
        self.asked = False  # a pull was requested (its tensors may still be arriving)
        self.waited = 0.0  # seconds the hooks waited since the last request
        self.spans: list[list[object]] = []  # ("pull K", start, end) of each tensor received
        index = {id(p): i for i, p in enumerate(params)}
        for mod in module.modules():
            mine = [index[id(p)] for p in mod.parameters(recurse=False) if id(p) in index]
            if mine:
                mod.register_forward_pre_hook(self._hook(mine))
        self.thread = threading.Thread(target=self._loop, name="hetsim-pull", daemon=True)
        if receive:
            self.thread.start()

    def _hook(self, idx: list[int]) -> Callable[..., None]:
        def wait(_mod: torch.nn.Module, _args: Any) -> None:
            self.wait_for(idx)
        return wait

    def wait_for(self, idx: list[int]) -> None:
        """Block until the parameters ``idx`` of the current version are loaded."""
        for i in idx:
            ev = self.ready[i]
            if ev.is_set():
                continue
            a = time.perf_counter()
            while not ev.wait(0.1):
                if self.error is not None:
                    raise RuntimeError("pull receiver failed") from self.error
                if time.perf_counter() - a > self.timeout_s:
                    raise TimeoutError(f"parameter tensor {i} did not arrive in {self.timeout_s} s")
            self.waited += time.perf_counter() - a

    def request(self, t: int) -> tuple[int, int, bool, int]:
        """``PULL(t)`` every shard; returns shard 0's (version, share, stop, bits) once it
        answers. The tensors keep arriving after it (forward waits for each)."""
        if self.asked:  # the last version complete: nothing may land in a parameter mid-iteration
            self.wait_for(list(range(len(self.params))))
        self.asked = True
        for ev in self.ready:
            ev.clear()
        self.waited = 0.0
        for s in range(self.S):
            wire.send(s, wire.PULL, t)
        try:
            h = self.headers.get(timeout=self.timeout_s)
        except queue.Empty:
            raise TimeoutError(f"no answer to PULL({t}) from shard 0 in {self.timeout_s} s") from None
        if isinstance(h, BaseException):
            raise RuntimeError("pull receiver failed") from h
        return int(h[wire.F_ITER]), int(h[wire.F_A]), bool(h[wire.F_B]), int(h[wire.F_C])

    def _loop(self) -> None:
        while True:
            h = torch.zeros(wire.HEADER_LEN, dtype=torch.float64)
            try:
                work = dist.irecv(h, src=None, tag=wire.TAG_HEADER)
                assert work is not None
                work.wait()
                src = int(work._source_rank())
                hd = h.tolist()
                if int(hd[wire.F_KIND]) == wire.PARAMS:
                    self.headers.put(hd)
                    continue
                a = time.time()
                buf = torch.empty(int(hd[wire.F_NBYTES]), dtype=torch.uint8)
                dist.recv(buf, src=src, tag=wire.TAG_PAYLOAD)
                idx = [self.where[(src, k)] for k in buf.view(torch.int64).tolist()]
                for i in idx:  # each tensor's values, into the parameter itself
                    p = self.params[i].detach()
                    dist.recv(p.view(-1), src=src, tag=wire.TAG_PAYLOAD)
                    self.totals["pulled_bytes"] += p.numel() * p.element_size()
                    self.ready[i].set()
                if len(self.spans) < self.max_spans:
                    self.spans.append([f"pull {','.join(map(str, idx))}", a, time.time()])
            except BaseException as e:  # noqa: BLE001 - raised in the main thread
                self.error = e
                self.headers.put(e)
                return
