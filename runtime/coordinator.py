"""Rank 0 of an all-reduce plan (``job.sync: allreduce``): the coordinator.

It holds no parameters and reduces nothing (the workers do, :mod:`runtime.collective`);
it talks with each worker over a TCP connection of its own (:class:`runtime.wire.ControlServer`),
and decides what a PS run's shard 0 decides, with the same rules:

* iteration t is committed once every member's ``FIGURES(t)`` is in (its reduction
  succeeded and its update is applied): the samples, the loss (sample-weighted mean)
  and per-worker samples are recorded, the online scheduler's ``rebalance`` gets an
  Observation of measured compute, samples and free memory, and every member gets
  ``CONTROL(t + 2)`` with its share (``stop`` from the last iteration on). Words go two
  iterations ahead so that no worker waits for this process in the steady state; a
  rebalance therefore takes effect one iteration later than a PS run's (the DES,
  :mod:`sim.des.collective`, does the same);
* a member from which neither ``FIGURES(t)`` nor ``ABORT(t)`` arrives within
  ``job.failure_timeout_s`` of the first word of t is declared failed. Once every live
  member has answered, if one aborted or a member is gone, the survivors get
  ``REFORM``: a new group of the live members, the rank whose state they all take (the
  first survivor that applied t, else the first survivor), and the iteration to go on
  from (t + 1 if that rank had applied t, which is then committed with the samples of
  those that did; else t again, its samples by the survivors). The failed worker's
  share is then moved by the scheduler, or spread over the live shares in proportion
  when the scheduler keeps the plan or there is none.

An iteration ends when its last member has applied the update (``FIGURES`` carries the
wall clock of each update's end). The RunResult has the PS runs' schema, with workers
only.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import torch

from runtime import wire
from runtime.affinity import CpuMeter, cpu_windows, in_force
from runtime.spec import CONNECT_TIMEOUT_S, RunSpec
from sim.observation import Observation, WorkerStatus, accepted_shares, full_membership, rate_sps
from sim.result import DeviceUsage, RunResult, Trace
from sim.shares import proportional_fill

POLL_S = 0.05


class CollectiveCoordinator:
    """Rank 0 of an all-reduce run (see the module docstring)."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        W = self.W = spec.n_workers
        self.ranks = [spec.first_worker + w for w in range(W)]
        self.shares = spec.shares()
        self.alive = [True] * W
        self.devices = tuple(w.device for w in spec.workers)
        self.plan_now = full_membership(spec.plan, self.devices, self.shares)
        # the workers' control channels; every worker passed the port's broadcast, so one that
        # has not connected within the time ranks have to join is gone: it fails on its first word
        self.control = wire.serve_control(self.ranks, CONNECT_TIMEOUT_S)
        self.t = 0  # the iteration the coordinator resolves (commit or re-form)
        self.epoch = -1
        self.group: list[int] = []  # the members of the group the workers hold
        # iteration -> worker -> FIGURES fields (samples, loss, compute_s, free, update end); None: ABORT
        self.heard: dict[int, dict[int, tuple[float, ...] | None]] = defaultdict(dict)
        self.first_heard = 0.0
        self.step_end: dict[int, dict[int, float]] = defaultdict(dict)  # iteration -> worker -> wall clock
        self.commit_at: list[float] = []
        self.iter_samples: list[int] = []
        self.iter_loss: list[float] = []
        self.iter_worker_samples: list[list[int]] = []
        self.share_history: list[list[int]] = [list(self.shares)]
        self.free_mem = [0.0] * W
        self.win_compute = [0.0] * W
        self.win_samples = [0] * W
        self.failures: list[dict[str, Any]] = []
        self.reforms = 0
        self.rebalances = 0
        self.reports: dict[int, dict[str, Any]] = {}
        self.last_seen = [0.0] * W
        self.done = False
        self.t0 = time.time()

    def now(self) -> float:
        return time.time() - self.t0

    def members(self) -> list[int]:
        return [w for w in range(self.W) if self.alive[w]]

    # --------------------------------------------------------------- messages
    def send_word(self, t: int, src: int = -1) -> None:
        """The word for iteration t to every live member: CONTROL, or REFORM (the members'
        ranks, the rank of the state to take, ``src``) when the group the workers hold is not
        the live members (the first word of a run too)."""
        if t > self.spec.iterations:  # the word for the last iteration already said stop
            return
        live = self.members()
        kind, payload = wire.CONTROL, None
        if live != self.group or src >= 0:
            kind, self.epoch, self.group = wire.REFORM, self.epoch + 1, live
            payload = torch.tensor([self.ranks[w] for w in live], dtype=torch.int64).view(torch.uint8)
        total = sum(self.shares[w] for w in live)
        stop = int(t >= self.spec.iterations)
        for w in live:
            try:
                self.control.send(self.ranks[w], kind, t, self.shares[w], stop, self.epoch, total, len(live), src,
                             payload=payload)
            except (RuntimeError, OSError) as e:  # the connection is gone: the worker died
                self.fail(w, f"send failed: {str(e).splitlines()[0][:120]}")

    def on_message(self, m: wire.Message) -> None:
        w = m.src - self.spec.first_worker
        if not 0 <= w < self.W:
            return
        self.last_seen[w] = self.now()
        if m.kind == wire.REPORT:
            self.reports[w] = wire.json_of(m)
            return
        if m.kind not in (wire.FIGURES, wire.ABORT) or not self.alive[w] or m.iteration < self.t:
            return
        if m.iteration == self.t and not self.heard[self.t]:
            self.first_heard = self.now()
        fields = tuple(m.header[wire.F_A:wire.F_A + 5])
        self.heard[m.iteration][w] = fields if m.kind == wire.FIGURES else None
        if m.kind == wire.FIGURES:
            self.step_end[m.iteration][w] = fields[4]

    def fail(self, w: int, why: str) -> None:
        if not self.alive[w]:
            return
        self.alive[w] = False
        now = self.now()
        self.failures.append({"worker": self.devices[w], "failed_at_s": None, "detected_at_s": now,
                              "lost_s": now - self.last_seen[w], "detected_by": why,
                              "last_seen_s": self.last_seen[w], "share": self.shares[w]})

    def check_timeouts(self) -> None:
        heard = self.heard[self.t]
        if not heard or self.now() - self.first_heard <= self.spec.failure_timeout_s:
            return
        for w in self.members():
            if w not in heard:
                self.fail(w, f"no word of iteration {self.t} within {self.spec.failure_timeout_s} s of the first")

    # ------------------------------------------------------------- iterations
    def maybe_advance(self) -> None:
        """Commit t once every live member applied it; re-form the group when a collective
        failed or a member is gone."""
        live, heard = self.members(), self.heard[self.t]
        if self.done or not live or any(w not in heard for w in live):
            return
        applied = [w for w in live if heard[w] is not None]
        if len(applied) == len(live) and live == self.group:
            self.commit(self.t)
            self.send_word(self.t + 1)  # (t + 1's word went out with t - 1's commit)
            return
        self.reforms += 1
        src = self.ranks[(applied or live)[0]]
        if applied:
            self.commit(self.t)
        for u in [u for u in self.heard if u >= self.t]:  # the words after the re-form start afresh
            del self.heard[u]
        self.send_word(self.t, src)
        self.send_word(self.t + 1)

    def commit(self, t: int) -> None:
        """Iteration t's figures recorded; the shares for t + 2 decided (see the module docstring)."""
        figs = {w: f for w, f in self.heard.pop(t, {}).items() if f is not None and self.alive[w]}
        samples = sum(int(f[0]) for f in figs.values())
        loss = sum(f[1] * f[0] for f in figs.values()) / samples if samples else float("nan")
        for w, f in figs.items():
            self.win_compute[w] += f[2]
            self.win_samples[w] += int(f[0])
            self.free_mem[w] = f[3]
        self.commit_at.append(self.now())
        self.iter_samples.append(samples)
        self.iter_loss.append(float(loss))
        self.iter_worker_samples.append([int(figs[w][0]) if w in figs else 0 for w in range(self.W)])
        self.t = t + 1
        if self.t >= self.spec.iterations:
            self.done = True
        else:
            self.rebalance()
            self.share_history.append(list(self.shares))

    def observation(self) -> Observation:
        ws = tuple(WorkerStatus(device=self.devices[w], batch=self.shares[w], compute_s=self.win_compute[w],
                                samples=self.win_samples[w], rate_sps=rate_sps(self.win_samples[w], self.win_compute[w]),
                                free_memory_bytes=self.free_mem[w], alive=self.alive[w])
                   for w in range(self.W))
        return Observation(self.now(), self.t, ws, self.spec.global_batch)

    def rebalance(self) -> None:
        sched = self.spec.scheduler
        if sched is not None:
            obs = self.observation()
            self.win_compute, self.win_samples = [0.0] * self.W, [0] * self.W
            new = sched.rebalance(self.plan_now, obs)
            if new is not None:
                self.shares = accepted_shares(new, obs, self.spec.global_batch)
                self.plan_now = full_membership(new, self.devices, self.shares)
                self.rebalances += 1
        if any(not a and s > 0 for a, s in zip(self.alive, self.shares)):
            self.shares = proportional_fill(self.shares, self.alive, self.spec.global_batch)
            self.plan_now = full_membership(self.plan_now, self.devices, self.shares)
            for f in self.failures:
                f.setdefault("redistributed_to", {self.devices[w]: self.shares[w] for w in self.members()})

    # ------------------------------------------------------------------- loop
    def run(self) -> RunResult:
        try:
            return self._run()
        finally:
            self.control.close()

    def _run(self) -> RunResult:
        meter = CpuMeter()
        self.last_seen = [self.now()] * self.W
        self.send_word(0)
        self.send_word(1)
        while True:
            m = self.control.get(timeout_s=POLL_S)
            if m is not None:
                self.on_message(m)
            if not self.done:
                self.check_timeouts()
                self.maybe_advance()
            else:
                for w in self.members():  # after the end, silence is death too
                    if w not in self.reports and self.now() - self.last_seen[w] > self.spec.failure_timeout_s:
                        self.fail(w, f"no final report, silent for {self.spec.failure_timeout_s} s")
                if all(w in self.reports for w in self.members()):
                    break
            if not self.members():
                break
        return self.result(meter.read())

    # ----------------------------------------------------------------- result
    def iteration_ends(self) -> list[float]:
        """Each committed iteration's end: its members' latest update (the commit where none
        reported one), made non-decreasing."""
        out: list[float] = []
        for t, at in enumerate(self.commit_at):
            got = self.step_end.get(t)
            end = max(got.values()) - self.t0 if got else at
            out.append(max(end, out[-1] if out else 0.0))
        return out

    def result(self, own_cpu: dict[str, Any]) -> RunResult:
        spec = self.spec
        ends = self.iteration_ends()
        trace = Trace()
        devices = []
        for w, ws in enumerate(spec.workers):
            rep = self.reports.get(w, {})
            dev = spec.devices[w]
            devices.append(DeviceUsage(dev[0], "worker", dev[2], dev[3], dev[4], busy_s=rep.get("compute_s", 0.0),
                                       compute_s=rep.get("compute_s", 0.0), comm_s=rep.get("comm_s", 0.0),
                                       wait_s=rep.get("wait_s", 0.0)))
            for track, key in (("workers", "spans"), ("network", "send_spans")):
                for name, a, b in rep.get(key, []):
                    trace.span(track, w, ws.device, name, max(0.0, a - self.t0), max(0.0, b - self.t0))
        reported = {self.devices[w]: self.reports.get(w, {}) for w in range(self.W)}
        runtime = {
            "sync": spec.sync, "workers": list(self.devices), "coordinator": "rank 0", "lr": spec.lr,
            "optimizer": spec.optimizer, "model": spec.model, "model_kwargs": spec.model_kwargs,
            "worker_samples": self.iter_worker_samples, "shares": self.share_history,
            "final_loss": self.iter_loss[-1] if self.iter_loss else None,
            "reduced_bytes": {d: r.get("reduced_bytes") for d, r in reported.items()},
            "emulation": {**{d: r.get("emulation") for d, r in reported.items()}, "coordinator": in_force()},
            "cpu": cpu_windows({**{d: r.get("cpu") for d, r in reported.items()}, "coordinator": own_cpu},
                               spec.warmup, self.t0, ends),
            "pipeline": spec.pipeline, "ddp": spec.pipeline, "bucket_mb": spec.bucket_bytes / 2**20,
            "reforms": self.reforms,
        }
        extra: dict[str, Any] = {"runtime": runtime}
        if spec.scheduler is not None:
            extra["rebalances"] = self.rebalances
            extra["final_shares"] = {self.devices[w]: self.shares[w] for w in range(self.W)}
        if spec.ignored:
            extra["runtime_ignored"] = spec.ignored
        if len(ends) < spec.iterations:
            extra["incomplete"] = f"{len(ends)} of {spec.iterations} iterations completed"
        return RunResult(name=spec.name, evaluator="runtime", scheduler=spec.plan.scheduler, seed=spec.seed,
                         iter_end_s=ends, iter_samples=list(self.iter_samples), devices=devices,
                         warmup=spec.warmup, failures=self.failures, extra=extra, trace=trace.events,
                         iter_loss=list(self.iter_loss))
