"""A worker of an all-reduce plan (``job.sync: allreduce``): compute, reduce the gradients
with the other workers by ``torch.distributed`` collectives, apply the update itself.

Rank 0 coordinates (:mod:`runtime.coordinator`); workers are ranks 1 .. W. The
coordinator's words and the workers' figures go over a TCP connection of each worker's
to the coordinator (:class:`runtime.wire.Channel`; its port broadcast over the process
group at the start), not over gloo point-to-point, whose waits spin where the two ranks
share a core. Iteration t of a worker:

1. its word for t: ``CONTROL(t)`` (its share, the members' total samples, stop), which
   the coordinator sent when it committed t - 2, so it is there before it is needed
   (the coordinator is never waited for in the steady state); or ``REFORM`` (below);
2. it draws its share of the teacher's samples, runs forward and backward, and reduces
   the gradients with the group's other members in buckets, reverse layer order
   (``job.bucket_mb``; gloo on CPU, NCCL on GPU), each worker's gradient weighted by its
   share of the members' samples, so the sum is the sample-weighted mean:

   * ``job.pipeline: true``: ``torch.nn.parallel.DistributedDataParallel`` with
     ``bucket_cap_mb``, which starts a bucket's all-reduce as soon as backward has
     produced it. Uneven shares are weighted through the loss (scaled by
     ``n x share / total``: DDP's mean then weights each worker by its samples); a comm
     hook times each bucket (and sends it as fp16 with ``job.quantization: 16``).
   * ``job.pipeline: false``: after the whole backward, each bucket's gradients
     flattened, weighted and all-reduced in turn (queued at once on the group, which
     runs them in order);

3. it applies the update (``job.optimizer`` at ``runtime.lr``) and sends the
   coordinator ``FIGURES(t)``: samples, loss, compute seconds, free memory and the
   update's end.

A failed collective (a member died: gloo reports its closed connections) makes it send
``ABORT(t)`` and wait for
``REFORM``: the live members' ranks, the rank whose state (parameters and optimizer
state) every member takes, and the iteration to go on from (the coordinator's choice:
the next one if that rank had applied its update, else the same one, computed again).
The survivors therefore never hold different parameters, even where a ring completed
at some members and not at others.
"""

from __future__ import annotations

import datetime
import inspect
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from runtime import task, wire
from runtime.affinity import CpuMeter
from runtime.spec import RunSpec, WorkerSpec
from runtime.worker import crash_if_due, free_memory_bytes, layer_groups, send_report, slowdown_at
from sim.collective import make_buckets

#: SGD's momentum with ``job.optimizer: momentum``.
MOMENTUM = 0.9


def optimizer(params: list[torch.nn.Parameter], name: str, lr: float) -> torch.optim.Optimizer:
    """The optimizer ``job.optimizer`` names: SGD, SGD with momentum, or Adam, at ``lr``."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=MOMENTUM)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}")


def bucket_params(module: torch.nn.Module, bucket_bytes: float) -> list[list[int]]:
    """Indices into ``module.parameters()`` of each bucket, reverse layer order, cut as the
    simulator cuts them (:func:`sim.collective.make_buckets` over the parameters each
    module holds itself)."""
    params = list(module.parameters())
    groups = layer_groups(module)
    sizes = [4.0 * sum(params[i].numel() for i in g) for g in groups]
    return [sorted(i for g in b.layers for i in groups[g]) for b in make_buckets(sizes, bucket_bytes, 32)]


@dataclass
class Control:
    """The coordinator's word for an iteration (``CONTROL`` or ``REFORM``)."""

    kind: int
    iteration: int
    share: int
    stop: bool
    epoch: int
    total: int
    members: list[int] = field(default_factory=list)  # REFORM: the group's ranks
    src: int = -1  # REFORM: the rank whose state every member takes (-1: none)

    @classmethod
    def of(cls, m: wire.Message) -> Control:
        h = m.header
        ranks = m.payload.view(torch.int64).tolist() if m.payload is not None else []
        return cls(m.kind, m.iteration, int(h[wire.F_A]), bool(h[wire.F_B]), int(h[wire.F_C]), int(h[wire.F_D]),
                   ranks, int(h[wire.F_E + 1]) if m.kind == wire.REFORM else -1)


class Reform(Exception):
    """The coordinator re-formed the group (:class:`Control` of kind ``REFORM``)."""

    def __init__(self, c: Control) -> None:
        super().__init__(f"reform at iteration {c.iteration}")
        self.control = c


class Worker:
    """One worker's state: its module, group, reducer and figures (see the module docstring)."""

    def __init__(self, spec: RunSpec, w: int, local_rank: int) -> None:
        self.spec, self.w, self.ws = spec, w, spec.workers[w]
        self.rank = spec.first_worker + w
        self.device = task.bind_device(task.compute_device(spec.device, local_rank))
        module, _ = task.build(spec.model, spec.seed, spec.model_kwargs)
        self.module = module.to(self.device).train()
        self.teacher = task.Teacher(spec.model, spec.seed, spec.model_kwargs, self.device)
        self.params = list(self.module.parameters())
        for p in self.params:
            p.grad = torch.zeros_like(p)
        self.buckets = bucket_params(self.module, spec.bucket_bytes)
        self.opt = optimizer(self.params, spec.optimizer, spec.lr)
        self.group: Any = None
        self.members: list[int] = []
        self.ddp: Any = None
        self.flats: list[torch.Tensor] = []
        self.totals: dict[str, Any] = {"compute_s": 0.0, "comm_s": 0.0, "wait_s": 0.0, "reduced_bytes": 0}
        self.spans: list[list[object]] = []
        self.net_spans: list[list[object]] = []
        self.compute_cpu_s = 0.0
        self.start = time.time()
        self.grad_at = 0.0  # wall clock of the latest gradient backward produced (DDP)
        self.pace = 1.0  # the emulated slowdown in force during this backward (DDP)
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def span(self, track: list[list[object]], name: str, a: float, b: float) -> None:
        if len(track) < self.spec.max_trace_spans:
            track.append([name, a, b])

    # ------------------------------------------------------------------ group
    def regroup(self, members: list[int], src: int = -1) -> None:
        """Join the group of ``members`` (ranks): a new process group among them only (the
        dead are not asked), every member taking rank ``src``'s parameters and optimizer
        state (-1: none), and a new DDP over it on the pipelined path."""
        if self.group is not None:
            try:
                dist.destroy_process_group(self.group)
            except Exception:  # noqa: BLE001 - a broken group is dropped either way
                pass
        self.group, self.ddp, self.members = None, None, list(members)
        if len(members) < 2:
            return
        backend = "nccl" if self.device.startswith("cuda") else "gloo"
        # the run's timeout, as every gloo operation of the runtime has (runtime.wire): a dead
        # member's connections close, which fails the collectives at once
        self.group = dist.new_group(members, timeout=datetime.timedelta(seconds=self.spec.timeout_s),
                                    backend=backend, use_local_synchronization=True)
        if src >= 0:
            with torch.no_grad():
                flat = torch.cat([p.detach().reshape(-1) for p in self.params])
                dist.broadcast(flat, src, group=self.group)
                off = 0
                for p in self.params:
                    p.copy_(flat[off:off + p.numel()].view_as(p))
                    off += p.numel()
            state = [self.opt.state_dict()]
            dist.broadcast_object_list(state, src, group=self.group)
            self.opt.load_state_dict(state[0])
        if self.spec.pipeline:
            from torch.nn.parallel import DistributedDataParallel as DDP

            ids = [self.device] if self.device.startswith("cuda") else None
            # the members hold the same parameters already (same seed, same updates, or src's);
            # buffers are not synced in forward (init_sync=False: nor at the start). torch 2.13
            # renamed broadcast_buffers (deprecated) to forward_sync_buffers.
            no_sync: dict[str, Any] = ({"forward_sync_buffers": False}
                       if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
                       else {"broadcast_buffers": False})
            self.ddp = DDP(self.module, device_ids=ids, process_group=self.group, init_sync=False,
                           bucket_cap_mb=self.spec.bucket_bytes / 2**20, **no_sync)
            self.ddp.register_comm_hook(None, _comm_hook(self))

    def _hook(self, _state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        """DDP's all-reduce of one bucket, timed (and sent as fp16 at 16 bits); the mean."""
        a = time.time()
        buf = bucket.buffer()
        send = buf.to(torch.float16) if self.spec.bits == 16 else buf
        self.totals["reduced_bytes"] += send.numel() * send.element_size()
        fut = dist.all_reduce(send, group=self.group, async_op=True).get_future()
        n, k = len(self.members), bucket.index()

        def done(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            out = f.value()[0]
            self.span(self.net_spans, f"allreduce b{k}", a, time.time())
            return (out.to(buf.dtype) if out.dtype != buf.dtype else out).div_(n)

        return fut.then(done)

    def _grad_ready(self, _p: torch.Tensor) -> None:
        """A gradient is ready: the emulated slowdown stretches the backward up to here."""
        now = time.time()
        if self.pace > 1.0:
            time.sleep((self.pace - 1.0) * (now - self.grad_at))
            now = time.time()
        self.grad_at = now

    # -------------------------------------------------------------- iteration
    def compute(self, t: int, c: Control) -> tuple[float, float] | None:
        """Draw iteration t's samples at the share ``c`` gives, forward and backward (DDP:
        reducing as it goes); returns (loss, compute seconds of forward and backward, the
        emulated slowdown included), None when a collective failed."""
        share = c.share
        gen, _ = task.iteration_generators(self.spec.seed, self.w, t)
        a = time.time()
        x, y = self.teacher.batch(max(share, 1), gen)  # share 0: one sample, weighted 0
        for p in self.params:
            p.grad.zero_()  # type: ignore[union-attr]
        net = self.ddp if self.ddp is not None else self.module
        n = max(len(self.members), 1)
        # DDP averages over the members: n x share / total makes that the sample-weighted mean
        scale = (n * share / c.total if c.total else 0.0) if self.ddp is not None else 1.0
        factor = slowdown_at(self.ws, time.time() - self.start)
        task.sync(self.device)  # the teacher's forward done before the student's is timed
        f0, c0 = time.time(), time.thread_time()
        loss = task.loss_fn(task.call(net, x), y)
        if factor > 1.0:
            time.sleep((factor - 1.0) * (time.time() - f0))
        self.grad_at, self.pace = time.time(), factor if self.ddp is not None else 1.0
        try:
            (loss * scale).backward()
            task.sync(self.device)
        except RuntimeError:
            if self.ddp is None:
                raise
            return None  # a member died inside DDP's reduction: the coordinator re-forms the group
        finally:
            self.pace = 1.0
        self.compute_cpu_s += time.thread_time() - c0
        end = self.grad_at if self.ddp is not None else time.time()  # DDP: the last gradient's
        if self.ddp is None and factor > 1.0:  # the backward's share (the forward's slept above)
            time.sleep((factor - 1.0) * (end - self.grad_at))
            end = time.time()
        self.span(self.spans, "compute", a, end)
        if self.ddp is not None:
            self.totals["comm_s"] += time.time() - end
        return float(loss.item()), end - f0

    def reduce(self, c: Control) -> bool:
        """Without DDP: every bucket of the local gradients, weighted by the worker's share of
        the members' samples, all-reduced in turn (kept apart from the gradients until the
        update); False when a collective failed."""
        weight = c.share / c.total if c.total else 0.0
        self.flats = []
        if self.group is None:  # alone: its own gradient, weighted (1 unless its share is 0)
            self.flats = [torch.cat([self.params[i].grad.reshape(-1) for i in b]) * weight  # type: ignore[union-attr]
                          for b in self.buckets]
            return True
        a = time.time()
        works = []
        for b in self.buckets:
            flat = torch.cat([self.params[i].grad.reshape(-1) for i in b]).mul_(weight)  # type: ignore[union-attr]
            send = flat.to(torch.float16) if self.spec.bits == 16 else flat
            self.totals["reduced_bytes"] += send.numel() * send.element_size()
            works.append((send, dist.all_reduce(send, group=self.group, async_op=True)))
        try:
            for k, (send, work) in enumerate(works):
                work.wait()
                task.sync(self.device)  # nccl's wait only orders the stream: the bucket is reduced now
                self.span(self.net_spans, f"allreduce b{k}", a, time.time())
                self.flats.append(send.float() if send.dtype != torch.float32 else send)
        except RuntimeError:  # a member died mid-reduction: the coordinator re-forms the group
            return False
        finally:
            self.totals["comm_s"] += time.time() - a
        return True

    def update(self) -> float:
        """Apply the reduced gradients (the own reducer's flats into the gradients first);
        returns the wall clock at its end."""
        a = time.time()
        if self.ddp is None:
            for b, flat in zip(self.buckets, self.flats):
                off = 0
                for i in b:
                    g = self.params[i].grad
                    assert g is not None
                    g.copy_(flat[off:off + g.numel()].view_as(g))
                    off += g.numel()
        self.opt.step()
        task.sync(self.device)
        end = time.time()
        self.totals["compute_s"] += end - a
        self.span(self.spans, "step", a, end)
        return end


def _comm_hook(worker: Worker) -> Any:
    """DDP's comm hook calling ``worker._hook`` (DDP checks the hook's annotations, which
    postponed evaluation turns into strings: this one has none)."""

    def hook(state, bucket):  # type: ignore[no-untyped-def]
        return worker._hook(state, bucket)

    return hook


class Words:
    """The coordinator's words a worker has received, by iteration."""

    def __init__(self, worker: Worker, channel: wire.Channel) -> None:
        self.worker = worker
        self.channel = channel
        self.got: dict[int, Control] = {}

    def _recv(self) -> Control:
        a = time.time()
        c = Control.of(self.channel.recv())
        b = time.time()
        self.worker.totals["wait_s"] += b - a
        self.worker.span(self.worker.spans, "wait", a, b)
        return c

    def for_iteration(self, t: int) -> Control:
        """The word for iteration t (received earlier, or waited for); raises :class:`Reform`
        where a REFORM comes first."""
        while t not in self.got:
            c = self._recv()
            if c.kind == wire.REFORM:
                raise Reform(c)
            self.got[c.iteration] = c
        return self.got.pop(t)

    def reform(self) -> Control:
        """Wait for the REFORM after a failed collective (the words before it are void)."""
        while True:
            c = self._recv()
            if c.kind == wire.REFORM:
                return c

    def reset(self, c: Control) -> None:
        """After a REFORM: the words sent before it are void; it is the word for its iteration."""
        self.got = {c.iteration: c}


def run_collective_worker(spec: RunSpec, w: int, local_rank: int = 0) -> None:
    """The loop of worker ``w`` (see the module docstring)."""
    # the coordinator's control channel first: the broadcast of its port is a collective of
    # every rank, so it comes before anything that may fail
    channel = wire.connect_control(spec.first_worker + w, spec.timeout_s)
    wk = Worker(spec, w, local_rank)
    ws: WorkerSpec = spec.workers[w]
    meter = CpuMeter()
    words = Words(wk, channel)
    first = words.reform()  # the first word of a run forms the group
    wk.regroup(first.members)
    words.reset(first)
    t = first.iteration
    while True:
        meter.tick()
        try:
            c = words.for_iteration(t)
        except Reform as r:
            c = r.control
            wk.regroup(c.members, c.src)
            words.reset(c)
            t = c.iteration
            continue
        if c.stop:
            break
        crash_if_due(ws, t, wk.start)
        got = wk.compute(t, c)
        if got is not None and (wk.ddp is not None or wk.reduce(c)):
            step_end = wk.update()
            loss, comp = got
            wk.totals["compute_s"] += comp
            channel.send(wire.FIGURES, t, c.share, loss, comp, free_memory_bytes(ws, wk.device), step_end)
            t += 1
            continue
        channel.send(wire.ABORT, t)
        c = words.reform()
        wk.regroup(c.members, c.src)
        words.reset(c)
        t = c.iteration
    send_report(ws, t, wk.totals, wk.spans, wk.net_spans, cpu={**meter.read(), "compute_cpu_s": wk.compute_cpu_s},
                channel=channel)
