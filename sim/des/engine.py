"""The data-parallel PS training job as SimPy processes.

Workers are processes (forward/backward as timeouts, one per layer group);
messages go through :class:`FlowNetwork`; shards aggregate and apply on a
:class:`ShardServer`. The synchronisation modes differ only in when a
worker's pull of a chunk may start and when a shard applies:

* BSP: a shard applies chunk c once every live worker's gradient of the
  current iteration has arrived (aggregated on arrival), then sends the new
  parameters to every worker. The iteration ends when every chunk is applied.
* ASP: a shard applies each worker's gradient on arrival and sends that
  worker the fresh chunk; no one waits for anyone.
* SSP(s): as ASP, but a worker may start iteration k only when the slowest
  live worker has finished iteration k - s - 1.

For ASP and SSP a "global iteration" ends each time another global batch of
samples has been applied.

Online scheduling (the seam of ARCHITECTURE.md): given an
:class:`~sim.scheduling.OnlineScheduler`, the engine calls its ``rebalance`` at the end of every global
iteration with an :class:`~sim.observation.Observation` measured over the
iterations since the previous call, and applies the plan it returns. The
worker set stays fixed; a worker takes its new share from the next iteration
it starts (BSP: when its first layer group's parameters have arrived; ASP/SSP:
at the top of its loop), and everything of that iteration - compute, push
bytes, aggregation, barrier membership, samples counted - follows the share it
actually runs. Parameter pulls leave the shard before the worker knows which
share it will run; when a share grows and the model has sparse tables, the
missing rows are fetched in a top-up pull before the compute that needs them.
A worker with share 0 idles: under BSP it still receives parameters but sends
no gradient and leaves that iteration's barrier; under ASP/SSP it waits for a
rebalance that gives it work (and does not hold back the SSP bound). The BSP
update cost of a sparse table uses the shares of the latest plan (exact for
dense layers).

Time to target (``job.target_loss``): every applied update adds its samples,
discounted by the convergence model (:mod:`sim.convergence`) for its batch,
staleness (BSP: 0; ASP/SSP: the mean over its chunks of the updates applied
since the worker pulled them) and the job's gradient bits, to a count of
effective samples; the simulated time at which that count reaches the
model's target is ``time_to_target_s``, and the run stops at the end of that
global iteration. ``job.iterations`` (the BSP prediction) times
``TARGET_CAP`` bounds the run; a target not reached by then is noted in
``extra["target_not_reached"]``. Effective samples are counted whenever the
job has a convergence model (a target or adaptive quantization), each update
at the bits it was sent with, and the modelled loss at every global
iteration's end is kept (``RunResult.iter_loss``, the ``loss`` column).

Adaptive quantization (``job.quant_adaptive``): at the end of every
``job.quant_every``-th global iteration the modelled loss is appended to a
history and the policy gives the width; a new width rebuilds every worker's
cost rows (``plan_costs`` at that ``quant_bits``, for the current plan), which
each worker takes from its next iteration like a rebalanced share.
``extra["quant_bits"]`` lists the ``[iteration, bits]`` changes, from ``[0, start]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from sim.des.accounting import DONE, KEEP
from sim.des.dynamics import Dynamics
from sim.des.kernel import Process
from sim.des.kernel import run as run_events
from sim.des.noise import NOISE_STREAM, noise_factors
from sim.des.state import TARGET_CAP, rare_gc
from sim.des.worker import WorkerProcess
from sim.result import DeviceUsage, RunResult

__all__ = ["DataParallelSim", "NOISE_STREAM", "TARGET_CAP", "noise_factors", "rare_gc"]


class DataParallelSim(WorkerProcess, Dynamics):
    """One DES run of a single-stage plan. Use :func:`sim.des.simulate`.

    Its parts: the state and its set-up (:class:`~sim.des.state.RunState`), online
    scheduling and adaptive quantization (:class:`~sim.des.online.Online`), the
    parameter-server side (:class:`~sim.des.ps.ParameterServer`), the workers
    (:class:`~sim.des.worker.WorkerProcess`) and the dynamics
    (:class:`~sim.des.dynamics.Dynamics`).
    """

    __slots__ = ()

    def run(self) -> RunResult:
        env = self.env
        # The first pulls (N x C messages) and the processes, made with the collector held
        # off as in the run, whose freeze then takes them.
        with rare_gc():
            for w in range(self.N):
                for c in range(self.C):
                    self._pull(w, 0, c)
            self.slowed = self._slowed()
            self.procs = [Process(env, self._worker(w)) for w in range(self.N)]
            self._start_dynamics()
        try:
            with rare_gc():
                run_events(env, self.finished)
        except RuntimeError:
            # The event queue ran dry before the job finished. Legitimate only
            # when every worker has died; anything else is a modelling bug.
            if any(self.alive):
                raise RuntimeError(
                    f"DES stalled at t={env.now} after {len(self.iter_end)} of {self.n_iter} iterations"
                ) from None
            self.incomplete = (f"every worker failed: {len(self.iter_end)} of {self.n_iter} "
                               "iterations completed")
        end = env.now
        for a in self.acct:
            if a.state != DONE:
                a.advance(end, 0, KEEP)
        return self._result(end)

    def _result(self, end: float) -> RunResult:
        cl, job = self.problem.cluster, self.problem.job
        devices = []
        for w, dev_id in enumerate(self.c.workers):
            d = cl.device(dev_id)
            a = self.acct[w]
            devices.append(DeviceUsage(dev_id, "worker", d.type.price_per_hour, d.type.power_w.idle,
                                       d.type.power_w.active, busy_s=a.compute, compute_s=a.compute,
                                       comm_s=a.comm, wait_s=a.wait))
        for s, sid in enumerate(self.c.shards):
            d = cl.device(sid)
            devices.append(DeviceUsage(sid, "ps", d.type.price_per_hour, d.type.power_w.idle,
                                       d.type.power_w.active, busy_s=self.servers[s].busy_s))
        extra: dict[str, Any] = {}
        if self.incomplete:
            extra["incomplete"] = self.incomplete
        if self.has_target and self.conv is not None and self.time_to_target is None:
            extra["target_not_reached"] = (
                f"loss {self.conv.loss(self.eff_samples):.6g} > target {job.target_loss} after "
                f"{len(self.iter_end)} iterations (cap: {TARGET_CAP} x the {job.iterations} BSP needs)")
        if self.sync != "bsp" and self.staleness:
            st = np.asarray(self.staleness)
            extra["staleness"] = {"mean": float(st.mean()), "max": int(st.max())}
        if self.trace is not None and self.trace.dropped:
            extra["trace_events_dropped"] = self.trace.dropped
        if self.online:
            extra["rebalances"] = self.rebalances
            extra["final_shares"] = {r.device: r.batch for r in self.plan_now.replicas}
        if self.qpolicy is not None:
            extra["quant_bits"] = [list(ch) for ch in self.quant_changes]
        if self.tx.cpu is not None:
            # CPU seconds of the work handed to each hosted process over the run (HostCPU.cpu_s):
            # its compute (and a shard's work), and apart its messages' copies (its transport)
            cpu_s: dict[str, float] = {}
            for i, dev_id in enumerate((*self.c.workers, *self.c.shards)):
                if (k := self.proc[i]) is not None:
                    cpu_s[dev_id] = self.tx.cpu.cpu_s[k]
                if (k := self.tx.copier[i]) is not None:
                    cpu_s[f"{dev_id} transport"] = self.tx.cpu.cpu_s[k]
            extra["host_cpu_s"] = cpu_s
            if self.host_messages:  # else no message went through the host: none counted
                extra["host_message_ends"] = {dev_id: self.tx.msg_ends[i]
                                              for i, dev_id in enumerate((*self.c.workers, *self.c.shards))
                                              if self.proc[i] is not None}
        return RunResult(
            name=self.problem.name, evaluator="des", scheduler=self.plan.scheduler,
            seed=self.problem.seed, iter_end_s=list(self.iter_end), iter_samples=list(self.iter_samples),
            devices=devices, warmup=job.warmup_iterations, failures=self.failures, extra=extra,
            trace=self.trace.events if self.trace is not None else [], time_to_target_s=self.time_to_target,
            iter_loss=list(self.iter_loss) if self.conv is not None else None,
        )

