"""Builders for hand-made Problems and Plans shared by the evaluator tests.

Everything is built directly in Python with round numbers so that expected
times can be worked out by hand: a profile defaults to 1 TFLOP/s fp32,
1 TB/s memory, no launch overhead, a 1 GB/s NIC and efficiency 1.0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hardware_profiles import DeviceProfile
from sim.cluster import Cluster, Device, Network
from sim.dynamics import Dynamic
from sim.plan import Plan, Replica, Stage
from sim.problem import Job, Problem
from sim.workload import Layer, Model, Sparse


def profile(name: str = "gpu", *, peak: float = 1e12, mem_bw: float = 1e12, launch: float = 0.0,
            nic: float = 1e9, kind: str = "gpu", efficiency: dict[str, Any] | None = None,
            layers: dict[str, Any] | None = None, peak16: float | None = None,
            price: float = 1.0, idle_w: float = 10.0, active_w: float = 100.0) -> DeviceProfile:
    """A device profile with round numbers (validated by the real schema)."""
    peak_flops = {"fp32": peak}
    if peak16 is not None:
        peak_flops["fp16"] = peak16
    return DeviceProfile.model_validate({
        "schema": 1, "name": name, "kind": kind, "peak_flops": peak_flops,
        "mem_bw_Bps": mem_bw, "memory_bytes": 16e9, "launch_overhead_s": launch,
        "efficiency": efficiency or {}, "nic_bw_Bps": nic, "price_per_hour": price,
        "power_w": {"idle": idle_w, "active": active_w},
        "source": {"kind": "datasheet", "note": "test", "date": "2026-01-01"},
        "layers": layers,
    })


def dense(name: str, param_bytes: float, fwd_flops: float = 0.0, bwd_flops: float = 0.0,
          activation_bytes: float = 0.0, op: str = "gemm", kernels: int = 1) -> Layer:
    return Layer(name=name, op=op, fwd_flops=fwd_flops, bwd_flops=bwd_flops,  # type: ignore[arg-type]
                 param_bytes=param_bytes, activation_bytes=activation_bytes, kernels=kernels)


def sparse(name: str, param_bytes: float, rows_per_sample: float, row_bytes: float,
           activation_bytes: float = 0.0) -> Layer:
    return Layer(name=name, op="embedding", fwd_flops=0.0, bwd_flops=0.0, param_bytes=param_bytes,
                 activation_bytes=activation_bytes, sparse=Sparse(rows_per_sample, row_bytes))


def model(*layers: Layer, input_bytes: float = 0.0) -> Model:
    return Model(name="hand", layers=tuple(layers), input_bytes=input_bytes)


def problem(workers: Sequence[DeviceProfile], shards: Sequence[DeviceProfile], mdl: Model,
            global_batch: int, *, sync: str = "bsp", staleness: int = 0, pipeline: bool = False,
            quant_bits: int = 32, sharing: str = "none", latency_s: float = 0.0,
            iterations: int = 5, warmup: int = 1, failure_timeout_s: float = 5.0,
            dynamics: Sequence[Dynamic] = (), dtype: str = "fp32",
            worker_nic: Sequence[float] | None = None, shard_nic: Sequence[float] | None = None,
            name: str = "hand", seed: int = 0) -> Problem:
    """A Problem whose worker ids are 'TYPE:K' (K counts within the type) and shards 'ps:K'."""
    devs: list[Device] = []
    count: dict[str, int] = {}
    for i, p in enumerate(workers):
        k = count.get(p.name, 0)
        count[p.name] = k + 1
        nic = worker_nic[i] if worker_nic is not None else p.nic_bw_Bps
        devs.append(Device(f"{p.name}:{k}", p, nic))
    sh = tuple(Device(f"ps:{k}", p, shard_nic[k] if shard_nic is not None else p.nic_bw_Bps)
               for k, p in enumerate(shards))
    cluster = Cluster(tuple(devs), sh, Network(latency_s, sharing))
    job = Job(model=mdl, global_batch=global_batch, dtype=dtype, iterations=iterations, sync=sync,
              staleness=staleness, pipeline=pipeline, quant_bits=quant_bits,
              failure_timeout_s=failure_timeout_s, warmup_iterations=warmup)
    return Problem(name=name, seed=seed, cluster=cluster, job=job,
                   dynamics=tuple(sorted(dynamics, key=lambda d: (d.at_s, d.worker))))


def plan(prob: Problem, shares: Sequence[int], scheduler: str = "hand") -> Plan:
    """A single-stage plan over the inventory in order with the given batch shares."""
    devs = prob.cluster.devices
    assert len(shares) == len(devs)
    reps = tuple(Replica(d.id, int(b)) for d, b in zip(devs, shares))
    stage = Stage(0, len(prob.job.model.layers), reps)
    return Plan((stage,), tuple(s.id for s in prob.cluster.shards), scheduler)


# -- random small cases as plain, printable specs (hypothesis) ----------------------------

def case_specs(max_workers: int = 6, max_shards: int = 4, max_layers: int = 8,
               sparse_layer: bool = True, quant: Sequence[int] = (32, 8)) -> Any:
    """Hypothesis strategy of small heterogeneous data-parallel cases as plain dicts.

    A spec is printable and can be pasted back into :func:`build` so that a
    falsifying example becomes an explicit test.
    """
    from hypothesis import strategies as st

    dev = st.tuples(
        st.sampled_from([1e11, 3e11, 1e12, 3e12, 1e13]),  # peak FLOP/s
        st.sampled_from([1e10, 1e11, 1e12]),              # memory B/s
        st.sampled_from([0.0, 1e-5]),                      # launch overhead s
        st.sampled_from([1e8, 3e8, 1e9, 3e9, 1e10]),       # NIC B/s
    )
    layer = st.tuples(
        st.integers(1, 10**6),                             # param bytes
        st.sampled_from([0.0, 1e5, 1e6, 1e7, 1e8]),        # fwd FLOP per sample
        st.sampled_from([0.0, 2e5, 2e6, 2e7, 2e8]),        # bwd FLOP per sample
        st.integers(0, 10**4),                             # activation bytes per sample
    )

    @st.composite
    def spec(draw: Any) -> dict[str, Any]:
        types = draw(st.lists(dev, min_size=1, max_size=3))
        n = draw(st.integers(1, max_workers))
        return {
            "types": types,
            "workers": draw(st.lists(st.integers(0, len(types) - 1), min_size=n, max_size=n)),
            "shares": draw(st.lists(st.integers(1, 32), min_size=n, max_size=n)),
            "shards": draw(st.integers(1, max_shards)),
            "ps": draw(st.tuples(st.sampled_from([1e9, 1e10, 1e11]),
                                 st.sampled_from([1e8, 1e9, 3e9, 1e10]))),
            "layers": draw(st.lists(layer, min_size=1, max_size=max_layers)),
            "sparse": draw(st.none() | st.tuples(st.integers(1, 32), st.sampled_from([16.0, 64.0])))
            if sparse_layer else None,
            "pipeline": draw(st.booleans()),
            "bits": draw(st.sampled_from(list(quant))),
            "latency": draw(st.sampled_from([0.0, 5e-5])),
        }

    return spec()


def build(spec: dict[str, Any], **job: Any) -> tuple[Problem, Plan]:
    """The (Problem, Plan) of a :func:`case_specs` spec; ``job`` overrides problem() keywords."""
    types = [profile(f"t{i}", peak=p, mem_bw=m, launch=lo, nic=nic)
             for i, (p, m, lo, nic) in enumerate(spec["types"])]
    ps_mem, ps_nic = spec["ps"]
    ps = profile("ps", kind="cpu", mem_bw=ps_mem, nic=ps_nic)
    layers = [dense(f"l{j}", float(pb), fwd_flops=f, bwd_flops=b, activation_bytes=float(a))
              for j, (pb, f, b, a) in enumerate(spec["layers"])]
    if spec["sparse"] is not None:
        rows, row_bytes = spec["sparse"]
        layers.insert(0, sparse("emb", 1e8, float(rows), row_bytes, activation_bytes=256.0))
    kw: dict[str, Any] = {"pipeline": spec["pipeline"], "quant_bits": spec["bits"],
                          "latency_s": spec["latency"]}
    kw.update(job)
    prob = problem([types[t] for t in spec["workers"]], [ps] * spec["shards"], model(*layers),
                   sum(spec["shares"]), **kw)
    return prob, plan(prob, spec["shares"])


class time_limit:  # noqa: N801  (used as a context manager)
    """Raise TimeoutError if the block runs longer than ``seconds`` of wall time.

    A livelocked or runaway simulation then fails its test (and hypothesis
    shrinks it) instead of hanging the whole suite. Main thread only (SIGALRM).
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __enter__(self) -> time_limit:
        import signal

        def _raise(_sig: int, _frame: object) -> None:
            raise TimeoutError(f"simulation did not finish within {self.seconds} s of wall time")

        self._old = signal.signal(signal.SIGALRM, _raise)
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._old)
