"""A worker process: pull, forward/backward on its share, push; until shard 0 says stop.

Iteration ``t``: send ``PULL(t)`` to shard 0 and wait for its ``PARAMS``
(version, this worker's share, stop flag, bit width), then pull the other
shards; load the parameters; draw ``share`` fresh samples of the teacher task
(generators seeded by the run seed, the worker and ``t``: see
:func:`runtime.task.iteration_generators`); forward and backward (timed: that is the
compute time the scheduler sees, including the emulated slowdown); pack each
gradient tensor at the bit width and push every shard its tensors (shards
1..S-1 first, shard 0 last: shard 0's push carries the measured figures).
At the end it sends shard 0 a ``REPORT``: time split and trace spans.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from runtime import quant, task, wire
from runtime.affinity import CpuMeter, in_force
from runtime.pulls import Puller
from runtime.spec import RunSpec, WorkerSpec

ASP_IDLE_S = 0.01


def free_memory_bytes(ws: WorkerSpec, device: str) -> float:
    if ws.free_memory_bytes is not None:
        return ws.free_memory_bytes
    if device.startswith("cuda"):
        return float(torch.cuda.mem_get_info()[0])
    try:
        import psutil

        return float(psutil.virtual_memory().available)
    except ImportError:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    return 0.0


def crash_if_due(ws: WorkerSpec, t: int, start: float) -> None:
    """The emulated crash of ``ws`` (``fail_at_iteration`` or ``fail_at_s`` after ``start``):
    SIGKILL this process, no goodbye, no flush, as a real crash would."""
    if ws.fail_at_iteration == t or (ws.fail_at_s is not None and time.time() - start >= ws.fail_at_s):
        os.kill(os.getpid(), signal.SIGKILL)


def slowdown_at(ws: WorkerSpec, t_s: float) -> float:
    f = 1.0
    for at, factor in ws.slowdown_events:
        if at <= t_s:
            f = factor
    return f


def layer_groups(module: torch.nn.Module) -> list[list[int]]:
    """Indices into ``list(module.parameters())`` grouped by the module that holds each
    parameter itself (a layer: a Linear's weight and bias), in parameter order; a
    parameter two modules share goes with the first."""
    index = {id(p): i for i, p in enumerate(module.parameters())}
    groups: list[list[int]] = []
    seen: set[int] = set()
    for m in module.modules():
        mine = [index[id(p)] for p in m.parameters(recurse=False) if id(p) in index and id(p) not in seen]
        seen.update(id(p) for p in m.parameters(recurse=False))
        if mine:
            groups.append(mine)
    return sorted(groups, key=lambda g: g[0])


class Sender:
    """``job.pipeline``: pushes each layer's gradients as soon as backward has accumulated them.

    A post-accumulate-grad hook on every parameter packs its gradient at once, on the
    thread running backward (between the backward of its layer and that of the layer
    below, as the simulator charges it and as DDP's communication hooks compress their
    buckets). Once every tensor of its layer (``groups``: the parameters one module holds
    itself, :func:`layer_groups`) is packed, the layer is queued, one ``PUSH_PART`` per
    shard holding its tensors (per run of consecutive tensors of that shard); this thread
    only sends them while backward goes on with the layers below. One message per layer,
    not per tensor, as the simulator's layer chunks go: each message costs its hand-offs
    between processes (``bench.handoff_bench``). :meth:`finish` packs and
    queues the tensors that got no gradient (zeros) and waits until the queue is drained;
    the worker then sends each shard ``PUSH_DONE`` with the iteration's figures. Only this
    thread sends during backward, and the main thread sends only after :meth:`finish`, so
    the messages to a shard stay in order.

    Packing happens on the main thread, not here: with one core per worker, packing on
    this thread would share the core with backward and delay the parts past its end. The
    parts are packed in the order backward makes them, with the same generator.
    """

    def __init__(self, params: list[torch.nn.Parameter], owned: list[list[int]], totals: dict[str, Any],
                 max_spans: int, groups: list[list[int]] | None = None) -> None:
        self.params, self.totals, self.max_spans = params, totals, max_spans
        self.gen = torch.Generator()
        self.where = {i: (s, k) for s, idx in enumerate(owned) for k, i in enumerate(idx)}
        self.groups = groups if groups is not None else [[i] for i in range(len(params))]
        self.group_of = {i: g for g, idx in enumerate(self.groups) for i in idx}
        if sorted(self.group_of) != list(range(len(params))) or sum(map(len, self.groups)) != len(params):
            raise ValueError("groups must hold every parameter index exactly once")
        # (shard, first tensor in the shard, parameter indices, their packed bytes) per message
        self.q: queue.Queue[tuple[int, int, list[int], list[torch.Tensor]] | None] = queue.Queue()
        self.packed: dict[int, torch.Tensor] = {}  # parameter index -> packed, its layer incomplete
        self.sent: set[int] = set()
        self.iteration, self.bits, self.samples = 0, 32, 0
        self.spans: list[list[object]] = []
        self.error: BaseException | None = None
        for i, p in enumerate(params):
            p.register_post_accumulate_grad_hook(lambda _p, i=i: self._pack(i))
        self.thread = threading.Thread(target=self._loop, name="hetsim-push", daemon=True)
        self.thread.start()

    def begin(self, iteration: int, bits: int, gen: torch.Generator, samples: int) -> None:
        self.iteration, self.bits, self.gen, self.sent, self.samples = iteration, bits, gen, set(), samples
        self.packed = {}

    def _pack(self, i: int) -> None:
        """Pack tensor i's gradient (zeros without one); queue its layer once it is all packed."""
        g = self.params[i].grad
        self.sent.add(i)
        self.packed[i] = quant.pack(g if g is not None else torch.zeros_like(self.params[i]), self.bits, self.gen)
        group = self.groups[self.group_of[i]]
        if any(j not in self.packed for j in group):
            return
        runs: list[tuple[int, int, list[int], list[torch.Tensor]]] = []
        for j in sorted(group, key=lambda j: self.where[j]):
            s, k = self.where[j]
            if runs and runs[-1][0] == s and runs[-1][1] + len(runs[-1][2]) == k:
                runs[-1][2].append(j)
                runs[-1][3].append(self.packed.pop(j))
            else:
                runs.append((s, k, [j], [self.packed.pop(j)]))
        for run in runs:
            self.q.put(run)

    def _loop(self) -> None:
        while (item := self.q.get()) is not None:
            try:
                if self.error is None:
                    a = time.time()
                    s, k, idx, pieces = item
                    payload = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
                    self.totals["pushed_bytes"] += wire.send(s, wire.PUSH_PART, self.iteration, k, self.bits,
                                                             self.samples, len(pieces), payload=payload)
                    if len(self.spans) < self.max_spans:
                        self.spans.append([f"push {','.join(map(str, idx))}", a, time.time()])
            except BaseException as e:  # noqa: BLE001 - raised again by finish()
                self.error = e
            finally:
                self.q.task_done()
        self.q.task_done()

    def finish(self) -> None:
        for i in range(len(self.params)):
            if i not in self.sent:
                self._pack(i)
        self.q.join()
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.q.put(None)
        self.thread.join(timeout=5)


class PSClient:
    """A worker's side of the PS protocol: pull and push the tensors ``owned[s]``
    (indices into ``params``, in shard ``s``'s order) of every shard ``s``.

    Times go to ``totals`` (``wait_s``, ``comm_s``, bytes) and spans to ``span``.
    """

    def __init__(self, spec: RunSpec, params: list[torch.nn.Parameter], owned: list[list[int]],
                 totals: dict[str, Any], span: Callable[[str, float, float], None]) -> None:
        self.S, self.params, self.owned, self.totals, self.span = spec.n_shards, params, owned, totals, span
        self.rows: dict[int, torch.Tensor] = {}

    def pull(self, t: int, rows: dict[int, torch.Tensor] | None = None) -> tuple[int, int, bool, int]:
        """``PULL(t)`` every shard and load the parameters; returns shard 0's
        (version, share, stop, bits). After a stop the other shards are not asked.

        ``rows``: sparse tables (index into ``params``) to pull by row, the rows to get;
        :meth:`push` then pushes those rows only.
        """
        share, stop, bits, version = 0, False, 32, 0
        self.rows = rows or {}
        for s in range(self.S):
            a = time.time()
            named = [torch.cat([torch.tensor([self.rows[i].numel()]), self.rows[i]])
                     for i in self.owned[s] if i in self.rows]
            wire.send(s, wire.PULL, t, payload=torch.cat(named).view(torch.uint8) if named else None)
            h = torch.zeros(wire.HEADER_LEN, dtype=torch.float64)
            torch.distributed.recv(h, src=s, tag=wire.TAG_HEADER)
            b = time.time()
            hd = h.tolist()
            n = int(hd[wire.F_NBYTES])
            if s == 0:
                version, share, stop, bits = (int(hd[wire.F_ITER]), int(hd[wire.F_A]), bool(hd[wire.F_B]),
                                              int(hd[wire.F_C]))
            if n:
                buf = torch.empty(n, dtype=torch.uint8)
                torch.distributed.recv(buf, src=s, tag=wire.TAG_PAYLOAD)
                flat = buf.view(torch.float32)
                off = 0
                with torch.no_grad():
                    for i in self.owned[s]:
                        p = self.params[i]
                        if i in self.rows:  # untouched rows stay stale: this iteration reads none of them
                            k = self.rows[i].numel() * p.shape[1]
                            p[self.rows[i].to(p.device)] = flat[off:off + k].view(-1, p.shape[1]).to(p.device)
                        else:
                            k = p.numel()
                            p.copy_(flat[off:off + k].view_as(p))
                        off += k
                self.totals["pulled_bytes"] += n
            c = time.time()
            self.totals["wait_s"] += b - a
            self.totals["comm_s"] += c - b
            self.span("wait", a, b)
            self.span("pull", b, c)
            if stop:
                break
        return version, share, stop, bits

    def push(self, t: int, figures: tuple[float, ...], bits: int, qgen: torch.Generator) -> None:
        """Push every shard its gradients at ``bits`` (shards 1..S-1 first, shard 0 last:
        shard 0's push carries the figures the commit waits for)."""
        for s in [*range(1, self.S), 0]:
            grads = []
            for i in self.owned[s]:
                g = self.params[i].grad
                g = g if g is not None else torch.zeros_like(self.params[i])
                grads.append(g[self.rows[i].to(g.device)] if i in self.rows else g)
            payload = quant.pack_many(grads, bits, qgen) if grads else None  # a stage may hold none of a shard's tensors
            self.totals["pushed_bytes"] += wire.send(s, wire.PUSH, t, *figures, payload=payload)


def run_worker(spec: RunSpec, w: int, local_rank: int = 0) -> None:
    ws = spec.workers[w]  # its threads and CPUs were set by runtime.launch.run_rank
    S = spec.n_shards
    device = task.bind_device(task.compute_device(spec.device, local_rank))
    module, _ = task.build(spec.model, spec.seed, spec.model_kwargs)
    module = module.to(device).train()
    teacher = task.Teacher(spec.model, spec.seed, spec.model_kwargs, device)
    params = list(module.parameters())
    owned = task.partition([p.numel() for p in params], S)
    totals = {"compute_s": 0.0, "comm_s": 0.0, "wait_s": 0.0, "pushed_bytes": 0, "pulled_bytes": 0}
    compute_cpu_s = 0.0  # this thread's CPU in forward and backward (not torch's other threads)
    spans: list[list[object]] = []

    def span(name: str, a: float, b: float) -> None:
        if len(spans) < spec.max_trace_spans:
            spans.append([name, a, b])

    ps = PSClient(spec, params, owned, totals, span)
    sender = Sender(params, owned, totals, spec.max_trace_spans, layer_groups(module)) if spec.pipeline else None
    puller = (Puller(module, params, owned, totals, spec.timeout_s, spec.max_trace_spans)
              if spec.pipeline_pulls else None)
    start = time.time()
    meter = CpuMeter()  # the CPU of its threads over the training loop (validate's accounting)
    # BSP resume: every worker continues with the checkpoint's iteration, the one the shards expect
    t = spec.resume.version if spec.resume is not None else 0
    while True:
        meter.tick()  # an iteration boundary: the CPU of the iterations after the warm-up (window_cpu)
        crash_if_due(ws, t, start)
        if puller is not None:
            a = time.time()
            version, share, stop, bits = puller.request(t)
            totals["wait_s"] += time.time() - a
            span("wait", a, time.time())
        else:
            version, share, stop, bits = ps.pull(t)
        if stop:
            break
        if share > 0:
            gen, qgen = task.iteration_generators(spec.seed, w, t)
            x, y = teacher.batch(share, gen)
            module.zero_grad(set_to_none=False)
            if sender is not None:
                sender.begin(t, bits, qgen, share)
            task.sync(device)  # the teacher's forward done: it is not the student's compute
            a, p0, c0 = time.time(), time.perf_counter(), time.thread_time()
            loss = task.loss_fn(task.call(module, x), y)
            loss.backward()
            task.sync(device)
            compute_cpu_s += time.thread_time() - c0
            # pipelined pulls: forward's waits for parameters are waiting, not compute
            waited = puller.waited if puller is not None else 0.0
            totals["wait_s"] += waited
            factor = slowdown_at(ws, time.time() - start)
            if factor > 1.0:
                time.sleep((factor - 1.0) * (time.perf_counter() - p0 - waited))
            comp = time.perf_counter() - p0 - waited
            b = time.time()
            totals["compute_s"] += comp
            span("compute", a, b)
            free = free_memory_bytes(ws, device)
            figures = (share, loss.item(), comp, free, bits, version)
            if sender is not None:
                # parts went out during backward; wait for the rest, then close every shard's push
                sender.finish()
                for s in [*range(1, S), 0]:
                    wire.send(s, wire.PUSH_DONE, t, *figures)
            else:
                ps.push(t, figures, bits, qgen)
            c = time.time()
            totals["comm_s"] += c - b
            span("push", b, c)
        elif spec.sync != "bsp":
            time.sleep(ASP_IDLE_S)  # no share: do not spin on pulls
        t += 1
    if sender is not None:
        sender.close()
    send_report(ws, t, totals, spans, sender.spans if sender is not None else [],
                recv_spans=puller.spans if puller is not None else [],
                cpu={**meter.read(), "compute_cpu_s": compute_cpu_s})


def send_report(ws: WorkerSpec, t: int, totals: dict[str, Any], spans: list[list[object]],
                send_spans: list[list[object]], channel: wire.Channel | None = None, **more: Any) -> None:
    """The final ``REPORT`` to rank 0 (over ``channel`` where given): time split, spans and
    the emulation really in force."""
    emulation = {**in_force(), "slowdown": [list(e) for e in ws.slowdown_events]}
    report = {**totals, "iterations": t, "spans": spans, "send_spans": send_spans, "emulation": emulation,
              **more}
    if channel is not None:
        channel.send(wire.REPORT, t, payload=wire.json_payload(report))
    else:
        wire.send(0, wire.REPORT, t, payload=wire.json_payload(report))
