"""A PS shard process; shard 0 is also the coordinator of the run.

Each shard holds its partition of the parameters (whole tensors, see
:func:`runtime.task.partition`) as one flat fp32 vector, unpacks pushed
gradients, applies plain SGD and answers pulls.

BSP. Shard 0 collects iteration ``t``'s pushes from every live worker with a
share; then it *commits* ``t``: averages the gradients weighted by samples,
applies them, tells the other shards which workers were members
(``COMMIT``; they apply the same members' pushes), records the iteration,
calls the online scheduler's ``rebalance`` with an Observation of measured
compute times, samples and free memory, and answers the pulls of version
``t + 1`` with each worker's (new) share. A worker whose push is missing
``failure_timeout_s`` after the first push of the iteration arrived is
declared failed: the iteration commits without it and its share is
redistributed (by the scheduler, or in proportion to the live shares when the
scheduler keeps the plan or there is none).

ASP / SSP. Every shard applies a push on arrival, scaled by ``samples /
global_batch``. A global iteration ends each time another ``global_batch``
samples have been applied (rebalance points, rows of iterations.csv). SSP:
shard 0 holds back the pull of iteration ``t`` of a worker until every live
worker with a share has pushed ``t - staleness`` iterations; a worker silent
for ``failure_timeout_s`` is declared failed.

Checkpoints (BSP, ``runtime.checkpoint_every``; :mod:`runtime.checkpoint`):
each shard saves its slice when its version reaches a multiple of the
interval or the last iteration; shards 1..S-1 report the file to shard 0
(``SAVED``), which writes the manifest once every file of that version is
there. A resumed run starts every shard, and shard 0's bookkeeping, at the
manifest's version.
"""

from __future__ import annotations

import os
import signal
import time
from collections import defaultdict
from typing import Any

import torch

from runtime import checkpoint, quant, task, wire
from runtime.affinity import CpuMeter, cpu_windows, in_force
from runtime.pulls import ShardPulls, weighted_mean
from runtime.spec import RunSpec
from sim.observation import Observation, WorkerStatus, accepted_shares, full_membership, rate_sps
from sim.result import DeviceUsage, RunResult, Trace
from sim.shares import proportional_fill

POLL_S = 0.05
MAX_PUSH_LOG = 10_000


class Shard:
    """One PS shard (rank ``rank`` < number of shards)."""

    def __init__(self, spec: RunSpec, rank: int) -> None:
        self.spec = spec
        self.rank = rank
        self.S, self.W = spec.n_shards, spec.n_workers
        module, _ = task.build(spec.model, spec.seed, spec.model_kwargs)
        params = [p.detach().float().reshape(-1) for p in module.parameters()]
        self.owned = task.partition([p.numel() for p in params], self.S)[rank]
        self.numels = [params[i].numel() for i in self.owned]
        self.flat = torch.cat([params[i] for i in self.owned]).clone()
        # Multi-stage plans: a worker pulls and pushes only its stage's tensors. groups[g]:
        # positions in self.owned of stage g's tensors (one group of all for one-stage plans).
        offsets = [0]
        for n in self.numels:
            offsets.append(offsets[-1] + n)
        self.offsets = offsets
        if spec.multistage:
            self.groups = [[k for k, i in enumerate(self.owned) if i in set(st.params)] for st in spec.stages]
        else:
            self.groups = [list(range(len(self.owned)))]
        self.group_of = {self.S + w: spec.stage_of(w) for w in range(self.W)}
        # sparse tables (position in self.owned -> row length): a worker's PULL names the rows
        # it reads; it gets and pushes those rows only (rows[rank][k], until its next PULL)
        self.row_len = {k: spec.sparse[i] for k, i in enumerate(self.owned) if i in spec.sparse}
        self.rows: dict[int, dict[int, torch.Tensor]] = {}
        self.version = 0
        self.busy_s = 0.0
        self.rx = wire.Receiver()
        self.pending: dict[int, int] = {}  # worker rank -> iteration its pull asked for
        self.grads: dict[int, dict[int, tuple[torch.Tensor, int]]] = defaultdict(dict)
        self.parts: dict[tuple[int, int], dict[int, torch.Tensor]] = {}  # (rank, iteration) -> pieces
        self.part_bytes: dict[tuple[int, int], int] = {}
        if spec.resume is not None:
            st = checkpoint.load_shard(spec.resume, rank)
            if st["flat"].shape != self.flat.shape:
                raise RuntimeError(f"shard {rank}: checkpoint slice of {st['flat'].numel()} values, "
                                   f"{self.flat.numel()} expected")
            self.flat.copy_(st["flat"])
            self.version, self.busy_s = int(st["version"]), float(st["busy_s"])
        # runtime.pipeline_pulls: tensors applied and sent one by one (runtime.pulls)
        self.pulls = ShardPulls(self) if spec.pipeline_pulls else None

    # ------------------------------------------------------------ common
    def numels_of(self, rank: int) -> list[int]:
        """Sizes of the tensors worker ``rank`` pulls from and pushes to this shard, in order
        (of a sparse table: the rows its last PULL named)."""
        rows = self.rows.get(rank, {})
        return [rows[k].numel() * self.row_len[k] if k in rows else self.numels[k]
                for k in self.groups[self.group_of[rank]]]

    def on_pull(self, m: wire.Message) -> None:
        """Note a PULL: its iteration, and the rows of each sparse table it names
        (payload: int64 ``count, ids...`` per sparse table of the worker's group, in order)."""
        self.pending[m.src] = m.iteration
        if m.payload is None:
            return
        flat, off, rows = m.payload.view(torch.int64), 0, {}
        for k in self.groups[self.group_of[m.src]]:
            if k in self.row_len:
                n = int(flat[off])
                rows[k] = flat[off + 1:off + 1 + n].clone()
                off += 1 + n
        self.rows[m.src] = rows

    def unpack(self, m: wire.Message, bits: int) -> torch.Tensor:
        if m.payload is None:  # a stage holding none of this shard's tensors
            return torch.zeros(0)
        rows = self.rows.get(m.src, {})
        numels = self.numels_of(m.src)
        if bits == 32 and not rows:  # fp32 pieces end to end are the flat gradient: a view, no copy
            return quant.unpack(m.payload, sum(numels), 32)
        out = []
        for k, g in zip(self.groups[self.group_of[m.src]], quant.unpack_many(m.payload, numels, bits)):
            if k in rows:  # the pushed rows into a dense gradient: untouched rows get 0
                dense = torch.zeros(self.numels[k]).view(-1, self.row_len[k])
                dense[rows[k]] = g.view(-1, self.row_len[k])
                g = dense.view(-1)
            out.append(g)
        return torch.cat(out)

    def take_push(self, m: wire.Message) -> tuple[torch.Tensor, int] | None:
        """The flat gradient and its wire bytes once a push is complete: a PUSH, or
        the PUSH_DONE after a worker's PUSH_PARTs (None for a part)."""
        t0 = time.perf_counter()
        key = (m.src, m.iteration)
        try:
            if m.kind == wire.PUSH_PART:
                assert m.payload is not None
                self.parts.setdefault(key, {}).update(wire.part_tensors(m, self.numels_of(m.src)))
                self.part_bytes[key] = self.part_bytes.get(key, 0) + m.payload.numel()
                return None
            if m.kind == wire.PUSH_DONE:
                got = self.parts.pop(key, {})
                n = len(self.numels_of(m.src))
                missing = [k for k in range(n) if k not in got]
                if missing:
                    raise ValueError(f"push of rank {m.src} iteration {m.iteration} lacks tensors {missing}")
                return torch.cat([got[k] for k in range(n)]), self.part_bytes.pop(key)
            return self.unpack(m, int(m.header[wire.F_E])), 0 if m.payload is None else m.payload.numel()
        finally:
            self.busy_s += time.perf_counter() - t0

    def params_payload(self, rank: int) -> torch.Tensor | None:
        """What worker ``rank`` pulls: its stage's tensors (None when it has none here)."""
        group = self.groups[self.group_of[rank]]
        rows = self.rows.get(rank, {})
        if len(group) == len(self.owned) and not rows:
            return self.flat.view(torch.uint8)
        if not group:
            return None
        parts = []
        for k in group:
            t = self.flat[self.offsets[k]:self.offsets[k + 1]]
            parts.append(t.view(-1, self.row_len[k])[rows[k]].reshape(-1) if k in rows else t)
        return torch.cat(parts).view(torch.uint8)

    def combine(self, entries: dict[int, tuple[torch.Tensor, int]], members: list[int]) -> torch.Tensor:
        """The update direction of this shard's slice: per stage, the sample-weighted mean
        gradient of the stage's member replicas (one stage: :func:`weighted_mean`)."""
        if len(self.groups) == 1:
            return weighted_mean(entries, members)
        out = torch.zeros_like(self.flat)
        for g, group in enumerate(self.groups):
            mine = [r for r in members if self.group_of[r] == g]
            if not group or not mine or not sum(entries[r][1] for r in mine):
                continue
            mean, off = weighted_mean(entries, mine), 0
            for k in group:
                n = self.numels[k]
                out[self.offsets[k]:self.offsets[k + 1]] = mean[off:off + n]
                off += n
        return out

    def apply(self, g: torch.Tensor, scale: float) -> None:
        self.flat.add_(g, alpha=-self.spec.lr * scale)

    def checkpoint_due(self) -> bool:
        """Save now? Called once each time the version advances (BSP: one commit applied)."""
        every = self.spec.checkpoint_every
        return (every > 0 and self.spec.checkpoint_dir is not None
                and (self.version % every == 0 or self.version == self.spec.iterations))

    def save(self) -> tuple[str, str]:
        assert self.spec.checkpoint_dir is not None
        return checkpoint.save_shard(self.spec.checkpoint_dir, self.rank, self.version, self.flat,
                                     self.spec.lr, self.busy_s)

    # ------------------------------------------------------ shards 1..S-1
    def serve(self) -> None:
        """Main loop of shard k > 0: until shard 0 says STOP and every commit before it is applied."""
        bsp = self.spec.sync == "bsp"
        commits: dict[int, list[int]] = {}
        stopping = False
        meter = CpuMeter()
        while True:
            m = self.rx.get(timeout_s=self.spec.timeout_s)
            if m is None:
                raise TimeoutError(f"shard {self.rank}: no message for {self.spec.timeout_s} s")
            if m.kind == wire.STOP:
                # STOP follows the last COMMIT (same sender, in order), but a member's push
                # of that iteration may still be on its way: apply (and save) it first
                stopping = True
            elif m.kind == wire.PULL:
                if self.pulls is not None:
                    self.pulls.on_pull(m)
                else:
                    self.on_pull(m)
            elif self.pulls is not None and m.kind == wire.PUSH_PART:
                self.pulls.on_part(m)
            elif self.pulls is not None and m.kind == wire.PUSH_DONE:
                self.pulls.on_done(m)
            elif m.kind == wire.EXPECT:
                assert self.pulls is not None
                self.pulls.on_expect(m.iteration, [] if m.payload is None else m.payload.view(torch.int64).tolist())
            elif m.kind in (wire.PUSH, wire.PUSH_PART, wire.PUSH_DONE):
                push = self.take_push(m)
                if push is not None:
                    samples = int(m.header[wire.F_A])
                    if bsp:
                        self.grads[m.iteration][m.src] = (push[0], samples)
                    else:
                        t0 = time.perf_counter()
                        self.apply(push[0], samples / self.spec.global_batch)
                        self.version += 1
                        self.busy_s += time.perf_counter() - t0
                        meter.tick()
            elif m.kind == wire.COMMIT:
                assert m.payload is not None
                commits[m.iteration] = m.payload.view(torch.int64).tolist()
            # apply committed iterations whose members' pushes are all here, in order
            while bsp and self.version in commits and (
                    self.pulls.complete(self.version, commits[self.version]) if self.pulls is not None
                    else all(r in self.grads[self.version] for r in commits[self.version])):
                members = commits.pop(self.version)
                if self.pulls is not None:
                    self.pulls.commit(self.version, members)
                else:
                    t0 = time.perf_counter()
                    got = self.grads.pop(self.version)
                    if sum(got[r][1] for r in members):
                        self.apply(self.combine(got, members), 1.0)
                    self.busy_s += time.perf_counter() - t0
                self.version += 1
                meter.tick()
                if self.checkpoint_due():
                    name, sha = self.save()
                    wire.send(0, wire.SAVED, self.version, payload=wire.json_payload({"file": name, "sha256": sha}))
            if stopping and not commits:
                wire.send(0, wire.REPORT, payload=wire.json_payload(
                    {"busy_s": self.busy_s, "emulation": in_force(), "cpu": meter.read()}))
                return
            for src, it in list(self.pending.items()):
                if not bsp or it <= self.version:
                    del self.pending[src]
                    wire.send(src, wire.PARAMS, self.version, payload=self.params_payload(src))


class Coordinator(Shard):
    """Shard 0: a shard plus the run's bookkeeping, online scheduling and result."""

    # what a checkpoint keeps of the bookkeeping (BSP): enough to go on as if never stopped
    STATE = ("shares", "alive", "plan_now", "free_mem", "win_compute", "win_samples", "iter_end",
             "iter_samples", "iter_loss", "iter_worker_samples", "share_history", "failures", "push_log",
             "bits", "bits_changes", "loss_hist", "rebalances", "apply_spans", "checkpoint_spans", "resumes")

    def __init__(self, spec: RunSpec) -> None:
        super().__init__(spec, 0)
        W = self.W
        self.ranks = [self.S + w for w in range(W)]
        self.shares = spec.shares()
        self.alive = [True] * W
        self.plan_now = full_membership(spec.plan, tuple(w.device for w in spec.workers), self.shares)
        self.clock = [0] * W          # iterations pushed (ASP/SSP)
        self.last_seen = [0.0] * W
        self.free_mem = [0.0] * W
        self.win_compute = [0.0] * W
        self.win_samples = [0] * W
        self.iter_end: list[float] = []
        self.iter_samples: list[int] = []
        self.iter_loss: list[float] = []
        self.iter_worker_samples: list[list[int]] = []
        self.share_history: list[list[int]] = [list(self.shares)]
        self.failures: list[dict[str, Any]] = []
        self.reports: dict[int, dict[str, Any]] = {}
        self.push_log: list[list[int]] = []
        self.staleness: list[int] = []
        self.bits = spec.bits if spec.adaptive is None else spec.adaptive.start_bits
        self.bits_changes: list[list[int]] = [[0, self.bits]]
        self.loss_hist: list[float] = []
        self.rebalances = 0
        self.apply_spans: list[tuple[float, float]] = []
        self.checkpoint_spans: list[tuple[float, float]] = []  # shard 0 writing its checkpoint files
        self.done = False
        self.t0 = time.time()
        # ASP/SSP window of the current global iteration
        self.win_applied = 0
        self.win_loss: list[tuple[float, int]] = []
        self.win_worker = [0] * W
        self.losses: dict[int, dict[int, float]] = defaultdict(dict)
        self.shard_busy: dict[int, float] = {}
        self.shard_emulation: dict[int, dict[str, Any]] = {0: in_force()}  # threads, CPUs of each shard
        self.shard_cpu: dict[int, dict[str, Any]] = {}  # each shard's CPU over its loop (CpuMeter.read)
        self.meter: CpuMeter | None = None  # shard 0's, ticked at each iteration's end
        self.max_ahead = 0  # ASP/SSP: most iterations a served pull was ahead of the slowest
        self.fingerprint = checkpoint.fingerprint(spec)
        self.saved: dict[int, dict[str, str]] = defaultdict(dict)  # version -> {file: sha256}
        self.manifest_version = -1
        self.resumes: list[dict[str, Any]] = []
        if spec.resume is not None:
            self.restore(checkpoint.load_coordinator(spec.resume))

    def now(self) -> float:
        return time.time() - self.t0

    # ----------------------------------------------------------- checkpoints
    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint: its bookkeeping, its scheduler, and its clock (the time
        the run was down is not counted)."""
        assert self.spec.resume is not None
        for k in self.STATE:
            setattr(self, k, state[k])
        self.spec.scheduler = state["scheduler"]
        self.t0 = time.time() - state["elapsed_s"]
        self.manifest_version = self.spec.resume.version
        self.resumes.append({"from_iteration": self.spec.resume.version, "at_s": state["elapsed_s"]})

    def checkpoint(self) -> None:
        """Save this shard's slice and the bookkeeping when due; the manifest waits for every shard."""
        if not self.checkpoint_due():
            return
        assert self.spec.checkpoint_dir is not None
        a = self.now()
        state = {k: getattr(self, k) for k in self.STATE}
        state.update(scheduler=self.spec.scheduler, elapsed_s=self.now())
        for name, sha in (self.save(), checkpoint.save_coordinator(self.spec.checkpoint_dir, self.version, state)):
            self.saved[self.version][name] = sha
        # the span is not in the file it times: a resumed trace lacks the checkpoint it resumed from
        self.checkpoint_spans.append((a, self.now()))
        self.maybe_manifest(self.version)

    def on_saved(self, m: wire.Message) -> None:
        got = wire.json_of(m)
        self.saved[m.iteration][got["file"]] = got["sha256"]
        self.maybe_manifest(m.iteration)

    def maybe_manifest(self, version: int) -> None:
        # complete: the coordinator's file and one slice per shard
        if len(self.saved[version]) < self.S + 1 or version <= self.manifest_version:
            return
        assert self.spec.checkpoint_dir is not None
        checkpoint.write_manifest(self.spec.checkpoint_dir, version, self.saved.pop(version), self.fingerprint)
        self.manifest_version = version
        for v in [v for v in self.saved if v < version]:
            del self.saved[v]

    # --------------------------------------------------------------- replies
    def reply(self, w: int) -> None:
        """Answer worker w's pending pull with the current parameters and its share."""
        it = self.pending.pop(self.ranks[w])
        stop = self.done or not self.alive[w]
        live = [self.clock[v] for v in range(self.W) if self.alive[v] and self.shares[v] > 0]
        if not stop and live and self.spec.sync != "bsp":
            self.max_ahead = max(self.max_ahead, it - min(live))
        try:
            wire.send(self.ranks[w], wire.PARAMS, self.version, self.shares[w], int(stop), self.bits,
                      payload=None if stop or self.pulls is not None else self.params_payload(self.ranks[w]))
        except RuntimeError as e:  # the connection is gone: the worker died
            self.fail(w, f"send failed: {str(e).splitlines()[0][:120]}")

    def can_reply(self, w: int, it: int) -> bool:
        if self.done or not self.alive[w]:
            return True
        if self.spec.sync == "bsp":
            return it <= self.version
        if self.spec.sync == "ssp":
            live = [self.clock[v] for v in range(self.W) if self.alive[v] and self.shares[v] > 0]
            return not live or it - min(live) <= self.spec.staleness
        return True

    def serve_pending(self) -> None:
        for r, it in list(self.pending.items()):
            w = r - self.S
            if self.can_reply(w, it):
                self.reply(w)

    # -------------------------------------------------------------- failures
    def fail(self, w: int, why: str) -> None:
        if not self.alive[w]:
            return
        if self.spec.multistage:  # its neighbours wait on it: nothing to commit without it
            raise RuntimeError(f"stage replica {self.spec.workers[w].device} failed ({why}); "
                               f"a pipeline cannot go on without it")
        self.alive[w] = False
        now = self.now()
        self.failures.append({"worker": self.spec.workers[w].device, "failed_at_s": None,
                              "detected_at_s": now, "lost_s": now - self.last_seen[w], "detected_by": why,
                              "last_seen_s": self.last_seen[w],
                              "share": self.shares[w]})
        self.pending.pop(self.ranks[w], None)

    def check_timeouts(self) -> None:
        if self.spec.multistage:
            # A pipeline's pushes of an iteration are staggered by its drain (the first stage
            # pushes last), and a replica waits on its neighbours: lateness is no sign of death.
            # A dead replica is found by its process exiting (runtime.launch) or --timeout.
            return
        now = self.now()
        tmo = self.spec.failure_timeout_s
        if self.spec.sync == "bsp":
            got = self.grads.get(self.version, {})
            if not got:
                return
            first = min(self.last_seen[r - self.S] for r in got)
            if now - first <= tmo:
                return
            for w in range(self.W):
                if self.alive[w] and self.shares[w] > 0 and self.ranks[w] not in got:
                    self.fail(w, f"no push of iteration {self.version} within {tmo} s of the first")
            self.maybe_commit()
        else:
            for w in range(self.W):
                if self.alive[w] and self.shares[w] > 0 and now - self.last_seen[w] > tmo:
                    self.fail(w, f"silent for {tmo} s")
                    self.redistribute_dead()

    def redistribute_dead(self) -> None:
        """Fallback when no scheduler moved a failed worker's share: live shares scaled up."""
        if any(not a and s > 0 for a, s in zip(self.alive, self.shares)):
            self.shares = proportional_fill(self.shares, self.alive, self.spec.global_batch)
            self.plan_now = full_membership(self.plan_now, tuple(w.device for w in self.spec.workers),
                                            self.shares)
            for f in self.failures:
                f.setdefault("redistributed_to", {
                    self.spec.workers[w].device: self.shares[w] for w in range(self.W) if self.alive[w]})

    # ----------------------------------------------------------------- BSP
    def expect(self) -> None:
        """Pipelined pulls: tell every shard who is expected to push the current version
        (the live workers with a share, after the rebalance that ended the last one)."""
        if self.pulls is None or self.done:
            return
        ranks = [self.ranks[w] for w in range(self.W) if self.alive[w] and self.shares[w] > 0]
        payload = torch.tensor(ranks, dtype=torch.int64).view(torch.uint8) if ranks else None
        for k in range(1, self.S):
            wire.send(k, wire.EXPECT, self.version, payload=payload)
        self.pulls.on_expect(self.version, ranks)

    def maybe_commit(self) -> None:
        got = self.grads.get(self.version, {})
        expected = [self.ranks[w] for w in range(self.W) if self.alive[w] and self.shares[w] > 0]
        if self.done or not got or any(r not in got for r in expected):
            return
        t0, a = time.perf_counter(), self.now()
        members = sorted(r for r in got if self.alive[r - self.S])
        entries = self.grads.pop(self.version)
        total = sum(entries[r][1] for r in members)
        if self.pulls is not None:
            self.pulls.commit(self.version, members)  # the tensors not applied yet
        elif total:
            self.apply(self.combine(entries, members), 1.0)
        self.busy_s += time.perf_counter() - t0
        self.apply_spans.append((a, self.now()))
        payload = torch.tensor(members, dtype=torch.int64).view(torch.uint8)
        for k in range(1, self.S):
            wire.send(k, wire.COMMIT, self.version, payload=payload)
        losses = self.losses.pop(self.version, {})
        # a pipeline's loss and samples are its last stage's (every stage sees the global batch)
        last = len(self.groups) - 1
        scored = [r for r in members if self.group_of[r] == last]
        total = sum(entries[r][1] for r in scored)
        loss = sum(losses[r] * entries[r][1] for r in scored) / total if total else float("nan")
        per = [entries[self.ranks[w]][1] if self.ranks[w] in members else 0 for w in range(self.W)]
        self.version += 1
        self.end_iteration(total, loss, per)
        self.expect()
        self.checkpoint()
        if self.spec.crash_after_iteration == len(self.iter_end) - 1:
            os.kill(os.getpid(), signal.SIGKILL)  # fault injection: no goodbye, no flush

    # ------------------------------------------------------------- ASP/SSP
    def apply_async(self, w: int, g: torch.Tensor, samples: int, loss: float, pulled: int) -> None:
        t0 = time.perf_counter()
        self.apply(g, samples / self.spec.global_batch)
        self.busy_s += time.perf_counter() - t0
        self.staleness.append(self.version - pulled)
        self.version += 1
        self.win_applied += samples
        self.win_loss.append((loss, samples))
        self.win_worker[w] += samples
        if self.win_applied >= self.spec.global_batch:
            n = sum(s for _, s in self.win_loss)
            mean = sum(v * s for v, s in self.win_loss) / n
            per, self.win_worker = self.win_worker, [0] * self.W
            done, self.win_applied, self.win_loss = self.win_applied, 0, []
            self.end_iteration(done, mean, per)

    # ---------------------------------------------------------- iterations
    def end_iteration(self, samples: int, loss: float, per_worker: list[int]) -> None:
        self.iter_end.append(self.now())
        if self.meter is not None:
            self.meter.tick()
        self.iter_samples.append(int(samples))
        self.iter_loss.append(float(loss))
        self.iter_worker_samples.append(per_worker)
        if len(self.iter_end) >= self.spec.iterations:
            self.done = True
            return
        pol = self.spec.adaptive
        if pol is not None:
            self.loss_hist.append(float(loss))
            if len(self.iter_end) % self.spec.quant_every == 0:
                bits = pol.bits(len(self.iter_end), self.loss_hist)
                if bits != self.bits:
                    self.bits = bits
                    self.bits_changes.append([len(self.iter_end), bits])
        self.rebalance()
        self.share_history.append(list(self.shares))

    def observation(self) -> Observation:
        ws = tuple(
            WorkerStatus(device=self.spec.workers[w].device, batch=self.shares[w],
                         compute_s=self.win_compute[w], samples=self.win_samples[w],
                         rate_sps=rate_sps(self.win_samples[w], self.win_compute[w]),
                         free_memory_bytes=self.free_mem[w], alive=self.alive[w])
            for w in range(self.W))
        return Observation(self.now(), len(self.iter_end), ws, self.spec.global_batch)

    def rebalance(self) -> None:
        sched = self.spec.scheduler
        if sched is not None:
            obs = self.observation()
            self.win_compute = [0.0] * self.W
            self.win_samples = [0] * self.W
            new = sched.rebalance(self.plan_now, obs)
            if new is not None:
                self.shares = accepted_shares(new, obs, self.spec.global_batch)
                self.plan_now = full_membership(new, tuple(w.device for w in self.spec.workers),
                                                self.shares)
                self.rebalances += 1
        self.redistribute_dead()

    # ---------------------------------------------------------------- loop
    def run(self) -> RunResult:
        self.last_seen = [self.now()] * self.W
        meter = self.meter = CpuMeter()
        bsp = self.spec.sync == "bsp"
        self.expect()
        while True:
            m = self.rx.get(timeout_s=POLL_S)
            if m is not None and m.kind == wire.SAVED:
                self.on_saved(m)
            elif m is not None and m.src >= self.S:
                w = m.src - self.S
                self.last_seen[w] = self.now()
                if m.kind == wire.PULL:
                    self.on_pull(m)  # shard 0 answers with the share (and, pulled whole, the values)
                    if self.pulls is not None:
                        self.pulls.on_pull(m)
                elif m.kind in (wire.PUSH, wire.PUSH_PART, wire.PUSH_DONE):
                    self.on_push(w, m, bsp)
                elif m.kind == wire.REPORT:
                    self.reports[w] = wire.json_of(m)
            if not self.done:
                self.check_timeouts()
            if bsp:
                self.maybe_commit()
            self.serve_pending()
            if self.done:
                for w in range(self.W):  # after the end, the rule of ASP for everyone: silence
                    if (self.alive[w] and w not in self.reports
                            and self.now() - self.last_seen[w] > self.spec.failure_timeout_s):
                        self.fail(w, f"no final report, silent for {self.spec.failure_timeout_s} s")
                if all(w in self.reports or not self.alive[w] for w in range(self.W)):
                    break
            if all(not a for a in self.alive):
                break
        for k in range(1, self.S):
            wire.send(k, wire.STOP)
        deadline = time.monotonic() + self.spec.failure_timeout_s + 5
        while len(self.shard_busy) < self.S - 1 and time.monotonic() < deadline:
            m = self.rx.get(timeout_s=POLL_S)
            if m is not None and m.kind == wire.SAVED:  # a shard's last checkpoint comes before its REPORT
                self.on_saved(m)
            elif m is not None and m.kind == wire.REPORT and m.src < self.S:
                got = wire.json_of(m)
                self.shard_busy[m.src], self.shard_emulation[m.src] = got["busy_s"], got["emulation"]
                self.shard_cpu[m.src] = got.get("cpu")
        self.shard_cpu[0] = meter.read()
        return self.result()

    def on_push(self, w: int, m: wire.Message, bsp: bool) -> None:
        if self.pulls is not None:  # pipelined pulls: the parts go to the tensors, not to a flat push
            if m.kind == wire.PUSH_PART:
                self.pulls.on_part(m)
                return
            g, nbytes = torch.zeros(0), self.pulls.on_done(m)
        else:
            got = self.take_push(m)
            if got is None:
                return
            g, nbytes = got
        h = m.header
        samples, loss, comp = int(h[wire.F_A]), float(h[wire.F_B]), float(h[wire.F_C])
        free, bits, pulled = float(h[wire.F_D]), int(h[wire.F_E]), int(h[wire.F_E + 1])
        if len(self.push_log) < MAX_PUSH_LOG:
            self.push_log.append([m.iteration, w, bits, nbytes])
        if not self.alive[w] or self.done:
            return
        self.free_mem[w] = free
        self.win_compute[w] += comp
        self.win_samples[w] += samples
        if bsp:
            if m.iteration != self.version:
                return  # a late push of an iteration committed without it
            self.grads[m.iteration][m.src] = (g, samples)
            self.losses[m.iteration][m.src] = loss
        else:
            self.clock[w] = m.iteration + 1
            self.apply_async(w, g, samples, loss, pulled)

    # -------------------------------------------------------------- result
    def result(self) -> RunResult:
        spec = self.spec
        devices, trace = self.usage_and_trace()
        return RunResult(
            name=spec.name, evaluator="runtime", scheduler=spec.plan.scheduler, seed=spec.seed,
            iter_end_s=list(self.iter_end), iter_samples=list(self.iter_samples), devices=devices,
            warmup=spec.warmup, failures=self.failures, extra=self.result_extra(), trace=trace.events,
            iter_loss=list(self.iter_loss),
        )

    def usage_and_trace(self) -> tuple[list[DeviceUsage], Trace]:
        """Every worker's and shard's DeviceUsage, and the trace: the workers' spans as they
        reported them (relative to this clock), the PS's applies and checkpoints."""
        spec = self.spec
        trace = Trace()
        devices = []
        for w, ws in enumerate(spec.workers):
            rep = self.reports.get(w, {})
            dev = spec.devices[w]
            devices.append(DeviceUsage(dev[0], "worker", dev[2], dev[3], dev[4],
                                       busy_s=rep.get("compute_s", 0.0), compute_s=rep.get("compute_s", 0.0),
                                       comm_s=rep.get("comm_s", 0.0), wait_s=rep.get("wait_s", 0.0)))
            for name, a, b in rep.get("spans", []):
                # a worker's first wait can start before rank 0's clock does
                trace.span("workers", w, ws.device, name, max(0.0, a - self.t0), max(0.0, b - self.t0))
            for name, a, b in rep.get("send_spans", []):  # job.pipeline: the sender thread
                trace.span("network", w, f"{ws.device} sender", name, max(0.0, a - self.t0),
                           max(0.0, b - self.t0))
            for name, a, b in rep.get("recv_spans", []):  # runtime.pipeline_pulls: the receiver
                trace.span("network", self.W + w, f"{ws.device} receiver", name, max(0.0, a - self.t0),
                           max(0.0, b - self.t0))
        for k, sid in enumerate(spec.shards):
            dev = spec.devices[self.W + k]
            busy = self.busy_s if k == 0 else self.shard_busy.get(k, 0.0)
            devices.append(DeviceUsage(sid, "ps", dev[2], dev[3], dev[4], busy_s=busy))
        for a, b in self.apply_spans[: spec.max_trace_spans]:
            trace.span("ps", 0, spec.shards[0], "apply", a, b)
        for a, b in self.checkpoint_spans[: spec.max_trace_spans]:
            trace.span("ps", 0, spec.shards[0], "checkpoint", a, b)
        return devices, trace

    def result_extra(self) -> dict[str, Any]:
        """RunResult.extra: what the run did (``runtime``) and, where they apply, the
        scheduler's rebalances, staleness, quantisation, checkpoints, resumes and
        whether the run ended early."""
        spec = self.spec
        extra: dict[str, Any] = {"runtime": self.runtime_extra()}
        if spec.scheduler is not None:
            extra["rebalances"] = self.rebalances
            extra["final_shares"] = {spec.workers[w].device: self.shares[w] for w in range(self.W)}
        if spec.sync != "bsp" and self.staleness:
            extra["staleness"] = {"mean": sum(self.staleness) / len(self.staleness),
                                  "max": max(self.staleness), "max_ahead": self.max_ahead}
        if spec.adaptive is not None:
            extra["quant_bits"] = self.bits_changes
        if spec.ignored:
            extra["runtime_ignored"] = spec.ignored
        if spec.checkpoint_every:
            extra["checkpoint"] = {"every": spec.checkpoint_every, "folder": spec.checkpoint_dir,
                                   "last_complete": self.manifest_version if self.manifest_version >= 0 else None}
        if self.resumes:
            extra["resumed"] = self.resumes
        if len(self.iter_end) < spec.iterations:
            extra["incomplete"] = f"{len(self.iter_end)} of {spec.iterations} iterations completed"
        return extra

    def reported(self, key: str) -> dict[str, Any]:
        """Each worker's (device's) ``key`` from its final report (None if it sent none)."""
        return {self.spec.workers[w].device: self.reports.get(w, {}).get(key) for w in range(self.W)}

    def runtime_extra(self) -> dict[str, Any]:
        """extra["runtime"]: the run's set-up, per-iteration samples and shares, pushes,
        bytes moved, each process's emulation and CPU, and a pipeline's stages."""
        spec = self.spec
        reported = self.reported
        out: dict[str, Any] = {
            "sync": spec.sync, "workers": [w.device for w in spec.workers], "shards": spec.shards,
            "lr": spec.lr, "model": spec.model, "model_kwargs": spec.model_kwargs,
            "worker_samples": self.iter_worker_samples, "shares": self.share_history,
            "pushes": self.push_log, "final_loss": self.iter_loss[-1] if self.iter_loss else None,
            "pushed_bytes": reported("pushed_bytes"),
            "pulled_bytes": reported("pulled_bytes"),
            # what each worker process actually ran with (threads, CPUs, slowdown steps),
            # and each shard (threads, CPUs)
            "emulation": {**reported("emulation"),
                          **{sid: self.shard_emulation.get(k) for k, sid in enumerate(spec.shards)}},
            # each process's CPU over its loop, in all and by thread name (CpuMeter.read),
            # and over the iterations after the warm-up (runtime.affinity.cpu_windows)
            "cpu": cpu_windows(
                {**reported("cpu"), **{sid: self.shard_cpu.get(k) for k, sid in enumerate(spec.shards)}},
                spec.warmup, self.t0, self.iter_end, resumed=spec.resume is not None),
            "pipeline": spec.pipeline,
            "pipeline_pulls": spec.pipeline_pulls,
        }
        if spec.multistage:
            out["stages"] = [
                {"layers": list(st.layers), "blocks": list(st.blocks),
                 "workers": [spec.workers[w].device for w in st.workers], "shares": st.shares,
                 "boundary_sent_bytes": [self.reports.get(w, {}).get("boundary_sent_bytes") for w in st.workers]}
                for st in spec.stages]
            out["micro_batches"] = spec.micro_batches
            out["schedule"] = "1f1b"
        return out
