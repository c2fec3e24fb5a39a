"""A stage replica of a multi-stage plan: one process per replica.

Iteration ``t`` (BSP, as for one-stage plans): pull this stage's parameters
from the PS shards (:class:`runtime.worker.PSClient`); run the stage's
micro-batch chunks in 1F1B order (:mod:`runtime.stages`), exchanging boundary
activations and gradients point-to-point with the neighbouring stages'
replicas; push this stage's gradients. The PS commits ``t`` once every replica
of every stage has pushed, and averages each stage's replicas by samples.

Arithmetic. The last stage scales each chunk's mean loss by ``n / B`` (its
samples over the global batch) before backward, so every replica accumulates
the sum over its samples of ``grad loss_i / B``, whatever the other stages'
shares. It pushes that times ``B / b_r`` (its share ``b_r``: exactly 1 with one
replica), which the PS's sample-weighted mean turns back into the sum: the
gradient of the global batch's mean loss, as a single process accumulating
the same micro-batches computes it.

Data. Replica ``r`` of the first stage draws its share with the generators of
worker ``r`` (:func:`runtime.task.iteration_generators`), as the ``r``-th
worker of a one-stage plan with the same shares would, and sends each sample's
target to the last-stage replica that computes its loss.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from runtime import stages, task, wire
from runtime.affinity import CpuMeter
from runtime.spec import RunSpec, StageSpec
from runtime.worker import PSClient, crash_if_due, free_memory_bytes, send_report, slowdown_at

#: What a chunk's forward leaves for its backward: inputs, outputs, loss (last stage only).
Saved = tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], torch.Tensor | None]


class Replica:
    """Stage ``s``, replica ``r`` of a run: who it talks to, and about which samples."""

    def __init__(self, spec: RunSpec, w: int) -> None:
        self.spec = spec
        self.s = spec.stage_of(w)
        self.stage: StageSpec = spec.stages[self.s]
        self.r = self.stage.workers.index(w)
        self.micro = stages.ranges(stages.even_split(spec.global_batch, spec.micro_batches))
        self.first_sample = stages.starts(self.stage.shares)[self.r]
        self.range = (self.first_sample, self.first_sample + self.stage.shares[self.r])

    def chunk(self, m: int) -> tuple[int, int] | None:
        """The samples of micro-batch ``m`` this replica computes."""
        return stages.overlap(self.range, self.micro[m])

    def peers(self, s: int, m: int) -> list[tuple[int, tuple[int, int]]]:
        """(rank, samples) of the replicas of stage ``s`` sharing samples of this replica's chunk of ``m``."""
        mine = self.chunk(m)
        st = self.spec.stages[s]
        out = []
        if mine is not None:
            for w, rng in zip(st.workers, stages.ranges(st.shares)):
                both = stages.overlap(mine, rng)
                if both is not None:
                    out.append((self.spec.n_shards + w, both))
        return out


def _expect(msg: wire.Message, kind: int, t: int, m: int, rng: tuple[int, int]) -> None:
    h = msg.header
    got = (msg.kind, msg.iteration, int(h[wire.F_A]), int(h[wire.F_B]), int(h[wire.F_C]))
    want = (kind, t, m, rng[0], rng[1] - rng[0])
    if got != want:
        raise RuntimeError(f"from rank {msg.src}: (kind, iteration, micro-batch, first, samples) {got}, "
                           f"expected {want}")


def floats_of(b: stages.BoundarySpec) -> stages.BoundarySpec:
    """The floating-point tensors of ``b``."""
    keep = [k for k, d in enumerate(b.dtypes) if getattr(torch, d).is_floating_point]
    return stages.BoundarySpec(tuple(b.shapes[k] for k in keep), tuple(b.dtypes[k] for k in keep))


def run_stage(spec: RunSpec, w: int, local_rank: int = 0) -> None:
    """Main loop of worker ``w``, a stage replica, until shard 0 says stop."""
    StageLoop(spec, w, local_rank).run()


class StageLoop:
    """Worker ``w``'s process: its stage's modules and parameters, its link to the PS, the
    point-to-point traffic with the neighbouring stages, and the totals and spans it
    reports at the end."""

    def __init__(self, spec: RunSpec, w: int, local_rank: int = 0) -> None:
        self.spec = spec
        self.ws = ws = spec.workers[w]  # its threads and CPUs were set by runtime.launch.run_rank
        self.me = me = Replica(spec, w)
        self.last = len(spec.stages) - 1
        self.device = task.bind_device(task.compute_device("cpu" if ws.cpu else spec.device, local_rank))
        module, _ = task.build(spec.model, spec.seed, spec.model_kwargs)
        self.module = module = module.to(self.device).train()
        self.blocks = stages.blocks(spec.model, module)[slice(*me.stage.blocks)]
        every = list(module.parameters())
        self.params = [every[i] for i in me.stage.params]
        self.local = local = {i: k for k, i in enumerate(me.stage.params)}
        owned = [[local[i] for i in idx if i in local] for idx in task.partition([p.numel() for p in every],
                                                                                    spec.n_shards)]
        self.teacher = task.Teacher(spec.model, spec.seed, spec.model_kwargs, self.device) if me.s == 0 else None
        self.in_spec = spec.stages[me.s - 1].boundary if me.s > 0 else None
        self.totals: dict[str, Any] = {"compute_s": 0.0, "comm_s": 0.0, "wait_s": 0.0, "pushed_bytes": 0,
                                       "pulled_bytes": 0, "boundary_sent_bytes": 0, "boundary_recv_bytes": 0}
        self.spans: list[list[object]] = []
        self.meter = CpuMeter()  # its threads' CPU from here on (validate's accounting)
        self.ps = PSClient(spec, self.params, owned, self.totals, self.span)
        # gradients travel back for the floating-point boundary tensors only (ids have none)
        self.out_grads = floats_of(me.stage.boundary) if me.stage.boundary is not None else None
        self.pending: list[Any] = []  # isend works of this iteration: their tensors live until they complete
        micro_ids = [m for m in range(len(me.micro)) if me.chunk(m) is not None]
        self.order = stages.one_f_one_b(me.s, len(spec.stages), micro_ids)

    def span(self, name: str, a: float, b: float) -> None:
        if len(self.spans) < self.spec.max_trace_spans:
            self.spans.append([name, a, b])

    def recv(self, src: int, kind: int, t: int, m: int, rng: tuple[int, int], label: str) -> torch.Tensor:
        """The payload of the next message from ``src``, checked to be the one expected."""
        a = time.time()
        msg = wire.recv(src)
        _expect(msg, kind, t, m, rng)
        b = time.time()
        self.totals["wait_s"] += b - a
        payload = msg.payload if msg.payload is not None else torch.empty(0, dtype=torch.uint8)
        self.totals["boundary_recv_bytes"] += payload.numel()
        self.span(f"recv {label} {m}", a, b)
        return payload

    def send(self, dst: int, kind: int, t: int, m: int, both: tuple[int, int], ts: tuple[torch.Tensor, ...],
             base: int) -> None:
        """Samples ``both`` of ``ts`` (whose rows start at sample ``base``) to ``dst``."""
        payload = stages.encode(tuple(v[both[0] - base:both[1] - base] for v in ts))
        self.pending.extend(wire.isend(dst, kind, t, m, both[0], both[1] - both[0], payload=payload))
        self.totals["boundary_sent_bytes"] += payload.numel()

    def run(self) -> None:
        """Iterations until shard 0 says stop, then the final report."""
        ws = self.ws
        start = time.time()
        # BSP resume: every replica continues with the checkpoint's iteration, the one the shards expect
        t = self.spec.resume.version if self.spec.resume is not None else 0
        while True:
            self.meter.tick()  # an iteration boundary: the CPU of the iterations after the warm-up (window_cpu)
            crash_if_due(ws, t, start)
            if not self.iteration(t, start):
                break
            t += 1
        send_report(ws, t, self.totals, self.spans, [], stage=self.me.s, cpu=self.meter.read())

    def iteration(self, t: int, start: float) -> bool:
        """Iteration ``t``: pull, the 1F1B chunks, push. False when shard 0 says stop instead."""
        me, spec = self.me, self.spec
        gen, qgen = task.iteration_generators(spec.seed, me.r, t)
        x: tuple[torch.Tensor, ...] = ()
        y: torch.Tensor | None = None
        rows: dict[int, torch.Tensor] = {}
        if self.teacher is not None:
            # the data before the pull (it depends on the seeds only): its ids name the table
            # rows to pull. Shares are fixed per stage, so the plan's is the PS's.
            xin, y = self.teacher.batch(me.stage.shares[me.r], gen)
            x = xin if isinstance(xin, tuple) else (xin,)
            rows = {self.local[i]: ids for i, ids in stages.touched_rows(spec.model, self.module, x).items()
                    if i in spec.sparse}
        version, share, stop, bits = self.ps.pull(t, rows)
        if stop:
            return False
        self.module.zero_grad(set_to_none=False)
        saved: dict[int, Saved] = {}
        loss_sum, comp = 0.0, 0.0
        for op, m in self.order:
            if op == "F":
                c, loss_part = self.forward(t, m, x, y, saved)
                loss_sum += loss_part
            else:
                c = self.backward(t, m, saved)
            comp += c
        self.finish(t, start, version, share, bits, qgen, loss_sum, comp)
        return True

    def forward(self, t: int, m: int, x: tuple[torch.Tensor, ...], y: torch.Tensor | None,
                saved: dict[int, Saved]) -> tuple[float, float]:
        """Forward of micro-batch ``m``'s chunk: its input (this replica's data on the first
        stage, the previous stage's activations elsewhere), the stage's blocks, the loss on
        the last stage; activations (and, from the first stage, targets) sent on. Returns
        (compute seconds, loss times samples or 0 off the last stage); the tensors
        backward needs go into ``saved``."""
        me, last, device = self.me, self.last, self.device
        rng = me.chunk(m)
        assert rng is not None
        a, c0 = time.time(), time.perf_counter()
        if me.s == 0:
            inp = tuple(v[rng[0] - me.range[0]:rng[1] - me.range[0]] for v in x)
        else:
            assert self.in_spec is not None
            in_spec = self.in_spec
            parts = [stages.decode(self.recv(src, wire.ACT, t, m, both, "act"), in_spec,
                                   both[1] - both[0]) for src, both in me.peers(me.s - 1, m)]
            inp = tuple(torch.cat([p[k] for p in parts]).to(device) for k in range(len(in_spec.shapes)))
            for v in inp:  # leaves: backward leaves the boundary gradient in .grad
                if v.is_floating_point():
                    v.requires_grad_(True)
            a, c0 = time.time(), time.perf_counter()
        # a stage may start with an in-place op (ResNet's and VGG's ReLU(inplace=True)),
        # which autograd refuses on a leaf: it gets a copy (the leaf keeps the gradient)
        out = stages.run_blocks(self.blocks, tuple(v.clone() if v.requires_grad else v for v in inp))
        loss = None
        loss_part = 0.0
        if me.s == last:
            tgt = [self.recv(src, wire.TARGET, t, m, both, "target") for src, both in me.peers(0, m)]
            yt = torch.cat([p.clone().view(torch.float32) for p in tgt])
            loss = task.loss_fn(out[0], yt.view(out[0].shape).to(device))
            loss_part = loss.item() * (rng[1] - rng[0])
        task.sync(device)  # the forward done on the GPU, not only queued
        comp = time.perf_counter() - c0
        self.span(f"forward {m}", a, time.time())
        if me.s < last:
            for dst, both in me.peers(me.s + 1, m):
                self.send(dst, wire.ACT, t, m, both, out, rng[0])
        if me.s == 0 and last > 0:
            assert y is not None
            for dst, both in me.peers(last, m):
                self.send(dst, wire.TARGET, t, m, both, (y,), me.range[0])  # y: this replica's share
        saved[m] = (inp, out, loss)
        return comp, loss_part

    def backward(self, t: int, m: int, saved: dict[int, Saved]) -> float:
        """Backward of micro-batch ``m``'s chunk: from the loss (scaled by its samples over
        the global batch) on the last stage, from the next stage's boundary gradients
        elsewhere; this stage's input gradients sent back. Returns compute seconds."""
        me = self.me
        rng = me.chunk(m)
        assert rng is not None
        a, c0 = time.time(), time.perf_counter()
        inp, out, loss = saved.pop(m)
        if loss is not None:
            (loss * ((rng[1] - rng[0]) / self.spec.global_batch)).backward()
        else:
            floats = [v for v in out if v.is_floating_point()]
            assert self.out_grads is not None  # not the last stage
            out_grads = self.out_grads
            got = [stages.decode(self.recv(src, wire.GRAD, t, m, both, "grad"), out_grads,
                                 both[1] - both[0]) for src, both in me.peers(me.s + 1, m)]
            grads = [torch.cat([g[k] for g in got]).to(self.device) for k in range(len(floats))]
            a, c0 = time.time(), time.perf_counter()
            need = [(o, g) for o, g in zip(floats, grads) if o.requires_grad]
            torch.autograd.backward([o for o, _ in need], [g for _, g in need])
        task.sync(self.device)  # the backward done on the GPU, not only queued
        comp = time.perf_counter() - c0
        self.span(f"backward {m}", a, time.time())
        if me.s > 0:
            gin = tuple(v.grad if v.grad is not None else torch.zeros_like(v)
                        for v in inp if v.is_floating_point())
            for dst, both in me.peers(me.s - 1, m):
                self.send(dst, wire.GRAD, t, m, both, gin, rng[0])
        return comp

    def finish(self, t: int, start: float, version: int, share: int, bits: int, qgen: Any, loss_sum: float,
               comp: float) -> None:
        """End of iteration ``t``: wait for the sends, emulate a slowdown, rescale the
        gradients for the PS's sample-weighted mean and push them with the iteration's
        figures."""
        ws, B, totals = self.ws, self.spec.global_batch, self.totals
        a = time.time()
        for work in self.pending:
            work.wait()
        self.pending.clear()
        self.span("send wait", a, time.time())
        totals["wait_s"] += time.time() - a
        factor = slowdown_at(ws, time.time() - start)
        if factor > 1.0:
            time.sleep((factor - 1.0) * comp)
            comp *= factor
        totals["compute_s"] += comp
        if share != B:
            # the PS weighs replicas by samples; the gradients here are already sums over B
            for p in self.params:
                if p.grad is not None:
                    p.grad.mul_(B / share)
        b = time.time()
        loss_mean = loss_sum / share if self.me.s == self.last else float("nan")
        figures = (share, loss_mean, comp, free_memory_bytes(ws, self.device), bits, version)
        self.ps.push(t, figures, bits, qgen)
        self.span("push", b, time.time())
        totals["comm_s"] += time.time() - b
