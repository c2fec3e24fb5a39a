"""Hosts (``cluster.hosts``): processes on one machine share its cores (sim.des.hosts).

Cases worked out by hand. Unless a test says otherwise: workers of profile
``cpu`` (1e12 FLOP/s, NIC 1e18 B/s: transfers take ~1e-15 s), one layer with
1e3 parameter bytes and 1e10 fwd / 9e10 bwd FLOP per sample, 10 samples per
worker, so alone a worker computes fwd = 0.1 s and bwd = 0.9 s: 1 s per
iteration. The PS shard's memory is 1e20 B/s (its work ~1e-17 s) and it is on
no host. Network: no sharing, no latency. Every time below is exact to 1e-9.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hardware_profiles.errors import ConfigError
from sim import analytic, des
from sim.cluster import Host, Placement, thread_rates
from sim.config import config_from_dict, load_config
from sim.dynamics import Dynamic
from sim.emulation import CpuScale, RuntimeEmulation, emulated_problem
from sim.problem import Problem, build_problem
from tests.helpers_eval import dense, model, plan, problem, profile, time_limit

EXACT = 1e-9
CPU = profile("cpu", kind="cpu", nic=1e18)
PS = profile("ps", kind="cpu", mem_bw=1e20, nic=1e18)
LAYER = model(dense("fc", 1e3, fwd_flops=1e10, bwd_flops=9e10))
REPO = Path(__file__).resolve().parents[1]


def _hosted(n: int, hosts: list[Host], place: list[Placement | None], shard: Placement | None = None,
            **kw: object) -> Problem:
    prob = problem([CPU] * n, [PS], LAYER, 10 * n, **kw)  # type: ignore[arg-type]
    cl = prob.cluster
    placement = [(d.id, p) for d, p in zip(cl.devices, place) if p is not None]
    if shard is not None:
        placement.append(("ps:0", shard))
    return dataclasses.replace(prob, cluster=dataclasses.replace(cl, hosts=tuple(hosts),
                                                                 placement=tuple(placement)))


def _run(prob: Problem, scheduler: object = None,  # type: ignore[no-untyped-def]
         emulation: RuntimeEmulation | None = None):
    with time_limit(60):
        return des.simulate(prob, plan(prob, [10] * len(prob.cluster.devices)), scheduler=scheduler,
                            emulation=emulation)


def _spans(r, worker: int) -> list[tuple[str, float, float]]:  # type: ignore[no-untyped-def]
    """(name, start, end) of a worker's compute spans, in seconds."""
    return [(e["name"], e["ts"] * 1e-6, (e["ts"] + e["dur"]) * 1e-6) for e in r.trace
            if e.get("ph") == "X" and e["pid"] == 0 and e["tid"] == worker]


def _approx(x: object) -> object:
    return pytest.approx(x, rel=EXACT, abs=1e-12)


# ------------------------------------------------------------------ fair shares
def test_thread_rates_by_hand() -> None:
    assert thread_rates(1, 0, [(None, 1), (None, 1)]) == [0.5, 0.5]  # 2 threads, 1 core
    assert thread_rates(2, 0, [(None, 3)]) == [pytest.approx(2 / 3)]  # 3 threads, 2 cores
    assert thread_rates(2, 0, [(None, 2)]) == [1.0]  # one core per thread at most
    assert thread_rates(2, 0, [((0,), 1), ((0,), 1), (None, 1)]) == [0.5, 0.5, 1.0]  # pinned to core 0
    assert thread_rates(1, 1.0, [(None, 1)]) == [0.5]  # one background thread
    # a pinned thread and two free ones: all three 2/3 (the free ones help out on core 0)
    assert thread_rates(2, 0, [((0,), 1), (None, 2)]) == [pytest.approx(2 / 3)] * 2
    # 3 cores, a 1-thread and a 4-thread process: 5 threads, 0.6 each (fair per thread)
    assert thread_rates(3, 0, [(None, 1), (None, 4)]) == [pytest.approx(0.6)] * 2
    with pytest.raises(ValueError, match="names no core"):
        thread_rates(2, 0, [((5,), 1)])


# ------------------------------------------------------------------ DES, by hand
def test_two_workers_on_one_core_take_twice_as_long() -> None:
    one_core = [Host("h", 1)]
    r = _run(_hosted(2, one_core, [Placement(0), Placement(0)], iterations=3))
    for w in (0, 1):  # both compute at once at half speed: fwd 0.2 s, bwd 1.8 s
        assert _spans(r, w)[:2] == [("fwd", _approx(0.0), _approx(0.2)), ("bwd", _approx(0.2), _approx(2.0))]
    assert r.iteration_times() == _approx([2.0] * 3)
    alone = _run(_hosted(2, [], [None, None], iterations=3))
    assert alone.iteration_times() == _approx([1.0] * 3)


def test_three_threads_on_two_cores_take_one_and_a_half() -> None:
    r = _run(_hosted(3, [Host("h", 2)], [Placement(0)] * 3, iterations=2))
    assert r.iteration_times() == _approx([1.5, 1.5])
    assert _spans(r, 2)[0] == ("fwd", _approx(0.0), _approx(0.15))


def test_two_threads_alone_on_two_cores_are_not_stretched() -> None:
    r = _run(_hosted(1, [Host("h", 2)], [Placement(0, threads=2)], iterations=2))
    assert r.iteration_times() == _approx([1.0, 1.0])


def test_affinity_pins_two_processes_to_one_core() -> None:
    # workers 0 and 1 on core 0 of two; worker 2 may use both, and gets core 1 to itself
    pinned = Placement(0, affinity=(0,))
    r = _run(_hosted(3, [Host("h", 2)], [pinned, pinned, Placement(0)], iterations=2))
    assert _spans(r, 0)[:2] == [("fwd", _approx(0.0), _approx(0.2)), ("bwd", _approx(0.2), _approx(2.0))]
    assert _spans(r, 2)[:2] == [("fwd", _approx(0.0), _approx(0.1)), ("bwd", _approx(0.1), _approx(1.0))]
    assert r.iteration_times() == _approx([2.0, 2.0])


def test_background_thread_halves_a_one_core_host() -> None:
    r = _run(_hosted(1, [Host("h", 1, background_threads=1.0)], [Placement(0)], iterations=2))
    assert r.iteration_times() == _approx([2.0, 2.0])


def test_shard_work_shares_the_cores() -> None:
    # the shard's aggregation and update (3e-3 s each: 3 x 1e3 B / 1e6 B/s) run while
    # the worker waits for its parameters, so with 1 core they compete with nothing
    # but the background thread: 2x each, the iteration 1 s + 2 x 2 x 3e-3 s
    slow_ps = profile("ps", kind="cpu", mem_bw=1e6, nic=1e18)
    prob = problem([CPU], [slow_ps], LAYER, 10, iterations=2)
    host = dataclasses.replace(prob.cluster, hosts=(Host("h", 1, 1.0),),
                               placement=(("cpu:0", Placement(0)), ("ps:0", Placement(0))))
    r = _run(dataclasses.replace(prob, cluster=host))
    assert r.iteration_times() == _approx([2.0 + 4 * 3e-3] * 2)
    assert r.devices[1].busy_s == _approx(2 * 2 * 2 * 3e-3)  # elapsed, not nominal


def test_emulated_slowdown_sleeps_and_leaves_the_core() -> None:
    # 2 workers on 1 core; worker 1 is 3x slower (it sleeps 2x its elapsed compute).
    # fwd: both at 1/2, done at 0.2; worker 1 sleeps 0.4 (to 0.6) while worker 0's bwd
    # runs alone (0.4 of its 0.9); then both at 1/2: worker 0 done at 0.6 + 2 x 0.5 = 1.6;
    # worker 1 has 0.4 left, alone: 2.0, then sleeps 2 x 1.4 = 2.8: done at 4.8.
    prob = _hosted(2, [Host("h", 1)], [Placement(0), Placement(0)], iterations=1, warmup=0,
                   dynamics=[Dynamic(1, 0.0, slowdown=3.0)])
    r = _run(prob)
    assert _spans(r, 0) == [("fwd", _approx(0.0), _approx(0.2)), ("bwd", _approx(0.2), _approx(1.6))]
    assert _spans(r, 1) == [("fwd", _approx(0.0), _approx(0.6)), ("bwd", _approx(0.6), _approx(4.8))]


def test_a_failed_worker_stops_competing() -> None:
    # worker 1 dies at 0.1 in its forward: worker 0 has done 0.05 of its 0.1, the rest alone
    prob = _hosted(2, [Host("h", 1)], [Placement(0), Placement(0)], iterations=1, warmup=0,
                   dynamics=[Dynamic(1, 0.1, fail=True)])
    r = _run(prob)
    assert _spans(r, 0)[:2] == [("fwd", _approx(0.0), _approx(0.15)), ("bwd", _approx(0.15), _approx(1.05))]


class _Recorder:
    """An online scheduler that keeps the plan and records what it observes."""

    name = "recorder"

    def __init__(self) -> None:
        self.compute_s: list[float] = []

    def plan(self, problem):  # type: ignore[no-untyped-def]
        return plan(problem, [10] * len(problem.cluster.devices))

    def rebalance(self, plan, obs):  # type: ignore[no-untyped-def]
        self.compute_s.append(obs.workers[0].compute_s)
        return None


def test_observation_reports_the_stretched_compute() -> None:
    rec = _Recorder()
    _run(_hosted(2, [Host("h", 1)], [Placement(0), Placement(0)], iterations=3), scheduler=rec)
    assert rec.compute_s == _approx([2.0, 2.0])  # what the runtime would measure, not 1.0


def test_asp_on_a_shared_core() -> None:
    r = _run(_hosted(2, [Host("h", 1)], [Placement(0), Placement(0)], sync="asp", iterations=4))
    # each worker's iteration takes 2 s; a global iteration (20 samples) completes per 2 s
    assert r.iteration_times()[1:] == _approx([2.0] * 3)


# ------------------------------------------------------------------ message copies
# A host with copy_Bps = 1e3: each end of a message of 1e3 bytes (the parameters pulled,
# the gradients pushed) costs its process 1 s of CPU on the host, as one more thread.
def test_message_copies_of_a_lone_worker_take_its_core() -> None:
    # pull: the worker's copy, 1 s alone on the core; fwd + bwd 1 s; push 1 s: 3 s
    r = _run(_hosted(1, [Host("h", 1, 0.0, 1e3)], [Placement(0)], iterations=3))
    assert _spans(r, 0)[:2] == [("fwd", _approx(1.0), _approx(1.1)), ("bwd", _approx(1.1), _approx(2.0))]
    assert r.iteration_times() == _approx([3.0] * 3)


def test_message_copies_share_the_core_with_the_shards() -> None:
    # the shard on the same core copies too: two copy threads at half speed, 2 s a transfer
    r = _run(_hosted(1, [Host("h", 1, 0.0, 1e3)], [Placement(0)], shard=Placement(0), iterations=3))
    assert _spans(r, 0)[:2] == [("fwd", _approx(2.0), _approx(2.1)), ("bwd", _approx(2.1), _approx(3.0))]
    assert r.iteration_times() == _approx([5.0] * 3)
    # two workers and the shard on two cores: the shard copies to both at once, so four
    # copy threads share two cores (2 s a transfer); the two computes get a core each
    r = _run(_hosted(2, [Host("h", 2, 0.0, 1e3)], [Placement(0)] * 2, shard=Placement(0), iterations=2))
    assert r.iteration_times() == _approx([5.0] * 2)


def test_cpu_given_to_each_process_and_its_transport() -> None:
    # one worker on 1 core with copy_Bps 1e3: 3 iterations of 1 s of compute (0.1 + 0.9)
    # and, for its transport, a pull and a push of 1e3 B (1 s each); the shard, off the
    # host, is not listed
    r = _run(_hosted(1, [Host("h", 1, 0.0, 1e3)], [Placement(0)], iterations=3))
    assert r.extra["host_cpu_s"] == _approx({"cpu:0": 3.0, "cpu:0 transport": 6.0})
    # on the host, the shard copies each message too: 3 x 2 x 1 s (its own work, ~1e-17 s
    # a task, is 0 to the 1e-12 the comparison allows)
    r = _run(_hosted(1, [Host("h", 1, 0.0, 1e3)], [Placement(0)], shard=Placement(0), iterations=3))
    assert r.extra["host_cpu_s"] == _approx({"cpu:0": 3.0, "cpu:0 transport": 6.0,
                                              "ps:0": 0.0, "ps:0 transport": 6.0})
    # no host: nothing to account
    assert "host_cpu_s" not in _run(_hosted(1, [], [None], iterations=2)).extra


def test_cpu_scale_stretches_every_second_of_a_process() -> None:
    # the lone worker of the test above with a CPU scale of 2: compute 2 s, each copy 2 s
    r = _run(_hosted(1, [Host("h", 1, 0.0, 1e3)], [Placement(0)], iterations=3),
             emulation=RuntimeEmulation(cpu_scales=(("cpu:0", CpuScale(2.0)),)))
    assert r.iteration_times() == _approx([6.0] * 3)
    assert r.extra["host_cpu_s"] == _approx({"cpu:0": 6.0, "cpu:0 transport": 12.0})


def test_cpu_counts_every_thread_of_a_process() -> None:
    # a two-thread worker alone on two cores computes 1 s an iteration on both: 2 CPU-s each
    r = _run(_hosted(1, [Host("h", 2)], [Placement(0, threads=2)], iterations=3))
    assert r.iteration_times() == _approx([1.0] * 3)
    assert r.extra["host_cpu_s"] == _approx({"cpu:0": 6.0})


def test_cancel_at_the_start_gives_back_all_of_it() -> None:
    import simpy

    from sim.des.hosts import HostCPU

    env = simpy.Environment()
    cpu = HostCPU(env, [Host("h", 1)], [Placement(0, threads=2)])
    handle = cpu.compute(0, 1.5, lambda: None)
    assert handle is not None and cpu.cpu_s == [3.0]
    assert cpu.cancel(handle) == 1.5  # the same instant: none of it served (its pair not bound yet)
    assert cpu.cpu_s == [0.0]
    with pytest.raises(ValueError, match="CPU scale > 0"):
        HostCPU(env, [Host("h", 1)], [Placement(0)], [0.0])


def test_cancelled_compute_keeps_only_the_cpu_it_got() -> None:
    # worker 1 fails at 0.1 during its forward (0.05 s of CPU at half a core): worker 0
    # does its full 1 s; worker 1 is charged what it got, not its 0.1 s forward
    prob = _hosted(2, [Host("h", 1)], [Placement(0), Placement(0)], iterations=1, warmup=0,
                   dynamics=[Dynamic(1, 0.1, fail=True)])
    assert _run(prob).extra["host_cpu_s"] == _approx({"cpu:0": 1.0, "cpu:1": 0.05})


def test_no_copy_rate_means_free_messages() -> None:
    r = _run(_hosted(1, [Host("h", 1)], [Placement(0)], shard=Placement(0), iterations=2))
    assert r.iteration_times() == _approx([1.0] * 2)  # the shard's work is ~1e-17 s


# ------------------------------------------------------------------ analytic
def test_analytic_caps_links_at_the_copy_threads_share() -> None:
    # a lone worker: its copy thread gets the core, so 1 s per transfer as in the DES
    prob = _hosted(1, [Host("h", 1, 0.0, 1e3)], [Placement(0)], iterations=3)
    assert analytic.evaluate(prob, plan(prob, [10])).iteration_times() == _approx([3.0] * 3)
    # two workers and the shard on two cores: transfers 2 s as in the DES; the compute is
    # stretched by 3 runnable processes on 2 cores (1.5 s; the DES: 1 s, the shard idles)
    prob = _hosted(2, [Host("h", 2, 0.0, 1e3)], [Placement(0)] * 2, shard=Placement(0), iterations=3)
    assert analytic.evaluate(prob, plan(prob, [10, 10])).iteration_times() == _approx([5.5] * 3)


# ------------------------------------------------------------------ analytic
def test_analytic_stretches_every_process_runnable_at_once() -> None:
    prob = _hosted(2, [Host("h", 1)], [Placement(0), Placement(0)], iterations=3)
    a = analytic.evaluate(prob, plan(prob, [10, 10]))
    d = _run(prob)
    assert a.iteration_times() == _approx(d.iteration_times())  # BSP, equal workers: exact
    plain = _hosted(2, [], [None, None], iterations=3)
    assert analytic.evaluate(plain, plan(plain, [10, 10])).iteration_times() == _approx([1.0] * 3)


# ------------------------------------------------------------------ config
def _cfg(cluster: dict[str, object]) -> dict[str, object]:
    return {"name": "h", "cluster": {"devices": [{"type": "cpu-8c", "count": 2}], "ps": {"type": "cpu-8c"},
                                     **cluster},
            "job": {"model": "mlp", "global_batch": 32, "iterations": 4}}


def test_config_places_devices_and_shards() -> None:
    cfg = config_from_dict(_cfg({
        "hosts": [{"name": "box", "cores": 4, "background_threads": 0.5, "copy_gbps": 8.0}],
        "devices": [{"type": "cpu-8c", "count": 2, "host": "box", "threads": 2, "affinity": [1, 3]}],
        "ps": {"type": "cpu-8c", "host": "box"}}), "c.yaml")
    cl = build_problem(cfg, REPO, "c.yaml").cluster
    assert cl.hosts == (Host("box", 4, 0.5, 1e9),)
    assert cl.placed("cpu-8c:0") == cl.placed("cpu-8c:1") == Placement(0, 2, (1, 3))
    assert cl.placed("ps:0") == Placement(0, 1, None)
    dumped = cfg.model_dump(mode="json")["cluster"]
    assert dumped["devices"][0]["host"] == "box" and "host" not in dumped["network"]


@pytest.mark.parametrize(("cluster", "field", "msg"), [
    ({"devices": [{"type": "cpu-8c", "host": "box"}]}, "cluster.devices[0].host", "no cluster.hosts"),
    ({"hosts": [{"name": "a", "cores": 2}], "devices": [{"type": "cpu-8c", "host": "box"}]},
     "cluster.devices[0].host", "no host named 'box'"),
    ({"hosts": [{"name": "a", "cores": 2}], "devices": [{"type": "cpu-8c", "host": "a", "affinity": [2]}]},
     "cluster.devices[0].affinity", "core 2 is not on host 'a'"),
    ({"hosts": [{"name": "a", "cores": 2}, {"name": "a", "cores": 1}]}, "cluster.hosts[1].name", "twice"),
    ({"hosts": [{"name": "a", "cores": 2}], "ps": {"type": "cpu-8c", "host": "b"}}, "cluster.ps.host",
     "no host named 'b'"),
])
def test_bad_host_config_is_one_line(cluster: dict[str, object], field: str, msg: str) -> None:
    with pytest.raises(ConfigError) as e:
        build_problem(config_from_dict(_cfg(cluster), "c.yaml"), REPO, "c.yaml")
    assert e.value.field == field and msg in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(("cluster", "field"), [
    ({"devices": [{"type": "cpu-8c", "threads": 2}]}, "cluster.devices[0]"),
    ({"hosts": [{"name": "a", "cores": 0}]}, "cluster.hosts[0].cores"),
    ({"hosts": [{"name": "a", "cores": 1, "background_threads": -1}]}, "cluster.hosts[0].background_threads"),
    ({"hosts": [{"name": "a", "cores": 1, "copy_gbps": 0}]}, "cluster.hosts[0].copy_gbps"),
    ({"hosts": [{"name": "a", "cores": 1, "wake_us": -1}]}, "cluster.hosts[0].wake_us"),
])
def test_bad_host_fields_are_refused(cluster: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as e:
        config_from_dict(_cfg(cluster), "c.yaml")
    assert e.value.field == field


def _outputs(cfg_data: dict[str, object]) -> tuple[str, str]:
    cfg = config_from_dict(cfg_data, "demo.yaml")
    prob = build_problem(cfg, REPO / "experiments" / "configs", "demo.yaml")
    devs = prob.cluster.devices
    share = prob.job.global_batch // len(devs)
    r = des.simulate(prob, plan(prob, [share] * len(devs)))
    return json.dumps(r.summary(), sort_keys=True), json.dumps(r.trace)


def test_no_hosts_and_empty_hosts_give_the_same_bytes() -> None:
    data = load_config(REPO / "experiments" / "configs" / "demo.yaml").model_dump(mode="json")
    assert "hosts" not in data["cluster"]  # the resolved config of a config without hosts is unchanged
    empty = json.loads(json.dumps(data))
    empty["cluster"]["hosts"] = []
    assert _outputs(data) == _outputs(empty)


def test_same_seed_same_bytes_with_hosts() -> None:
    data = load_config(REPO / "experiments" / "configs" / "demo.yaml").model_dump(mode="json")
    data["cluster"]["hosts"] = [{"name": "box", "cores": 2, "background_threads": 1.5}]
    for e in data["cluster"]["devices"]:
        e["host"] = "box"
    data["cluster"]["ps"]["host"] = "box"
    first = _outputs(data)
    assert first == _outputs(data)
    data["cluster"]["hosts"] = []
    for e in data["cluster"]["devices"]:
        del e["host"]
    del data["cluster"]["ps"]["host"]
    assert _outputs(data)[0] != first[0]  # and the hosts do change the outcome


# ------------------------------------------------------------------ hetsim validate
def test_validate_places_every_rank_on_the_measured_host() -> None:
    from experiments.validate import on_host
    from runtime.spec import parse_options

    prob = _hosted(3, [], [None, None, None])
    opts = parse_options({"threads": 2, "workers": [{"affinity": [0]}, {"threads": 1, "affinity": [1]}]}, "c")
    host = Host("local", 2, 1.25)
    emu = on_host(RuntimeEmulation(), prob, plan(prob, [10, 10, 10]), opts, host)
    assert emu.serial_messages  # the runtime's messages
    cl = emulated_problem(prob, emu).cluster
    assert cl.hosts == (host,)
    assert [cl.placed(d.id) for d in cl.devices] == [Placement(0, 2, (0,)), Placement(0, 1, (1,)),
                                                      Placement(0, 2, None)]
    assert cl.placed("ps:0") == Placement(0, 2, None)  # shards: runtime.threads, not pinned
    opts = parse_options({"threads": 2, "ps_affinity": [1]}, "c")
    cl = emulated_problem(prob, on_host(RuntimeEmulation(), prob, plan(prob, [10, 10, 10]), opts, host)).cluster
    assert cl.placed("ps:0") == Placement(0, 2, (1,))  # runtime.ps_affinity: pinned as the runtime pins it
    mine = dataclasses.replace(prob, cluster=dataclasses.replace(prob.cluster, hosts=(Host("own", 8),)))
    plain = RuntimeEmulation()
    assert on_host(plain, mine, plan(mine, [10, 10, 10]), opts, host) is plain  # the config's hosts win


def test_validate_maps_cpu_ids_to_the_hosts_core_indices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a cpuset of CPUs 2 and 3 the measured host has cores 0 and 1: CPU 3 is core 1,
    CPUs 3 and 2 (listed in any order) cores 0 and 1; an id outside the set stays as it is."""
    from experiments import validate

    monkeypatch.setattr(validate.os, "sched_getaffinity", lambda pid: {2, 3}, raising=False)
    assert validate.host_cores([3]) == (1,)
    assert validate.host_cores([3, 2]) == (0, 1)
    assert validate.host_cores([5]) == (5,)
    assert validate.host_cores(None) is None


def test_validate_takes_the_copy_rate_from_the_measured_loopback() -> None:
    from experiments.validate import on_host
    from hardware_profiles.schema import NetworkMeasurement
    from runtime.spec import parse_options

    fast = CPU.model_copy(update={"network": NetworkMeasurement(p2p_bw_Bps=3e9)})
    slow = CPU.model_copy(update={"name": "cpu-b", "network": NetworkMeasurement(p2p_bw_Bps=2e9)})
    prob = problem([fast, slow], [PS], LAYER, 20)
    opts = parse_options({"threads": 1}, "c")
    emu = on_host(RuntimeEmulation(), prob, plan(prob, [10, 10]), opts, Host("local", 2, 0.5))
    # the lowest of the ranks' (ps: none); the runtime's messages go one at a time
    assert emu.host == Host("local", 2, 0.5, 2e9) and emu.serial_messages
    emu = on_host(RuntimeEmulation(), prob, plan(prob, [10, 10]), opts, Host("local", 2, 0.5, 7.0))
    assert emu.host == Host("local", 2, 0.5, 7.0) and emu.serial_messages  # a host that has one keeps it


def test_validate_prices_messages_by_the_runtimes_measured_wire_path() -> None:
    """Profiles with the runtime's own message path measured (wire_bench): pulls at 3e9 B/s,
    pushes at 1.5e9 B/s. Every rank on the host, so every process's link and each end's
    share of a message (copy_Bps) go at the pair's rate 2 / (1/3e9 + 1/1.5e9) = 2e9 B/s
    (not the config's NIC, not gloo's p2p 1e9, not the CPU-only 4e9). One worker pinned to
    core 0 of 2, the shard unpinned, a layer of 1e8 parameter bytes: a pull takes 1e8 / 2e9
    = 0.05 s, each end having a core of its own; alone the worker computes 1 s; the push
    takes 0.05 s too, and the shard's work is ~1e-12 s. Iteration: 0.05 + 1 + 0.05 = 1.1 s."""
    from experiments.validate import on_host, wire_rate_Bps
    from hardware_profiles.schema import NetworkMeasurement
    from runtime.spec import parse_options

    net = NetworkMeasurement(p2p_bw_Bps=1e9, wire_pull_Bps=3e9, wire_push_Bps=1.5e9, wire_cpu_Bps=4e9)
    assert wire_rate_Bps([net]) == pytest.approx(2e9, rel=EXACT)
    assert wire_rate_Bps([net, NetworkMeasurement(p2p_bw_Bps=1e9)]) == 0.0  # one rank unmeasured
    cpu = CPU.model_copy(update={"network": net})
    ps = PS.model_copy(update={"network": net})
    prob = problem([cpu], [ps], model(dense("fc", 1e8, fwd_flops=1e10, bwd_flops=9e10)), 10,
                   worker_nic=[1e18], shard_nic=[1e18])
    opts = parse_options({"threads": 1, "workers": [{"affinity": [0]}]}, "c")
    p = plan(prob, [10])
    emu = on_host(RuntimeEmulation(), prob, p, opts, Host("local", 2, 0.0))
    cl = emulated_problem(prob, emu).cluster
    (h,) = cl.hosts
    assert h.copy_Bps == _approx(2e9) and emu.serial_messages
    assert [d.nic_bw_Bps for d in (*cl.devices, *cl.shards)] == _approx([2e9, 2e9])
    with time_limit(60):
        r = des.simulate(prob, p, emulation=emu)
    assert r.summary()["iteration_time_s"]["mean"] == _approx(1.1)
    # without the wire figures: gloo's p2p for the copies (1e9: 0.1 s per end, now the
    # slowest of the three) and the config's NIC; iteration 0.1 + 1 + 0.1 = 1.2 s
    old = NetworkMeasurement(p2p_bw_Bps=1e9)
    prob_old = problem([CPU.model_copy(update={"network": old})], [PS.model_copy(update={"network": old})],
                       prob.job.model, 10, worker_nic=[1e18], shard_nic=[1e18])
    emu_old = on_host(RuntimeEmulation(), prob_old, plan(prob_old, [10]), opts, Host("local", 2, 0.0))
    assert emu_old.host is not None and emu_old.host.copy_Bps == 1e9 and emu_old.wire_Bps == 0.0
    with time_limit(60):
        r = des.simulate(prob_old, plan(prob_old, [10]), emulation=emu_old)
    assert r.summary()["iteration_time_s"]["mean"] == _approx(1.2)


@pytest.mark.parametrize(("serial", "sharing", "iteration_s"),
                         [(True, "fair", 1.3), (False, "none", 1.2), (False, "fair", 1.4)])
def test_serial_messages_go_one_at_a_time_per_link(serial: bool, sharing: str, iteration_s: float) -> None:
    """Two workers pinned to cores 0 and 1 of a 3-core host, the shard unpinned (a core each,
    no contention); a layer of 1e8 parameter bytes over links of 1e9 B/s: a message alone
    takes 0.1 s. Serial messages (the runtime's ranks): after the commit the shard sends
    worker 0's parameters (0 - 0.1 s), then worker 1's (0.1 - 0.2); worker 0 computes
    0.1 - 1.1 and pushes 1.1 - 1.2, worker 1 computes 0.2 - 1.2 and pushes 1.2 - 1.3 (the
    shard's receiving link is free again just then); iteration 1.3 s. Unshared links
    ('none'): both pulls 0 - 0.1, both pushes 1.1 - 1.2: 1.2 s. Fair sharing: both pulls
    0 - 0.2, both pushes 1.2 - 1.4: 1.4 s."""
    big = model(dense("fc", 1e8, fwd_flops=1e10, bwd_flops=9e10))
    prob = problem([CPU, CPU], [PS], big, 20, sharing=sharing, worker_nic=[1e9, 1e9], shard_nic=[1e9])
    cl = prob.cluster
    host = Host("h", 3)
    placement = ((cl.devices[0].id, Placement(0, 1, (0,))), (cl.devices[1].id, Placement(0, 1, (1,))),
                 ("ps:0", Placement(0, 1, None)))
    prob = dataclasses.replace(prob, cluster=dataclasses.replace(cl, hosts=(host,), placement=placement))
    r = _run(prob, emulation=RuntimeEmulation(serial_messages=serial))
    assert r.summary()["iteration_time_s"]["mean"] == _approx(iteration_s)
    if serial:  # deliveries: pulls to worker 0 then 1, pushes from worker 0 then 1
        ends = sorted((e["ts"] * 1e-6, e["tid"]) for e in r.trace if e.get("ph") == "e" and e["pid"] == 1)
        assert [w for _, w in ends[:4]] == [0, 1, 0, 1]
        assert [t for t, _ in ends[:4]] == _approx([0.1, 0.2, 1.2, 1.3])
        # a pull is in flight from when it starts (as the runtime's pull span begins when its
        # shard starts to answer): worker 1's queued behind worker 0's (0 - 0.1) is waiting
        begins = sorted((e["ts"] * 1e-6, e["tid"]) for e in r.trace if e.get("ph") == "b" and e["pid"] == 1)
        assert begins[:4] == [(_approx(0.0), 0), (_approx(0.1), 1), (_approx(1.1), 0), (_approx(1.2), 1)]


def test_serial_pulls_are_answered_in_the_order_the_workers_asked() -> None:
    """As above, worker 1 with half the batch (compute 0.5 s). Iteration 1: pulls 0 - 0.1
    (worker 0) and 0.1 - 0.2 (worker 1); worker 1 computes 0.2 - 0.7 and pushes 0.7 - 0.8,
    worker 0 computes 0.1 - 1.1 and pushes 1.1 - 1.2: the commit at 1.2. Worker 1 asked for
    its next pull first (its push arrived at 0.8), so the shard answers it first, as the
    runtime's does: 1.2 - 1.3, then worker 0 1.3 - 1.4; worker 0 computes 1.4 - 2.4 and
    pushes 2.4 - 2.5 (in worker order it would be pulled first and end at 2.4)."""
    big = model(dense("fc", 1e8, fwd_flops=1e10, bwd_flops=9e10))
    prob = problem([CPU, CPU], [PS], big, 15, worker_nic=[1e9, 1e9], shard_nic=[1e9], iterations=3)
    cl = prob.cluster
    placement = ((cl.devices[0].id, Placement(0, 1, (0,))), (cl.devices[1].id, Placement(0, 1, (1,))),
                 ("ps:0", Placement(0, 1, None)))
    prob = dataclasses.replace(prob, cluster=dataclasses.replace(cl, hosts=(Host("h", 3),), placement=placement))
    with time_limit(60):
        r = des.simulate(prob, plan(prob, [10, 5]), emulation=RuntimeEmulation(serial_messages=True))
    assert r.iter_end_s[:2] == _approx([1.2, 2.5])
    pulls = sorted((e["ts"] * 1e-6, e["tid"]) for e in r.trace
                   if e.get("ph") == "b" and e["pid"] == 1 and e["name"].startswith("pull"))
    assert pulls[2:4] == [(_approx(1.2), 1), (_approx(1.3), 0)]


# ------------------------------------------------------------ wake-up latency
@pytest.mark.parametrize("shard_on_host", [False, True])
def test_a_message_to_a_busy_host_waits_wake_s(shard_on_host: bool) -> None:
    """One worker on a 1-core host with one background thread: its cores are always
    busy, so it computes at half speed (fwd 0.2 s, bwd 1.8 s: 2 s) and every message to a
    process on it arrives wake_s = 0.5 s late. Worker only: the pull arrives at 0.5,
    compute 0.5-2.5, the push reaches the shard (on no host) at 2.5, the next pull
    arrives at 3.0: 2.5 s per iteration. With the shard on the host too (1 thread, its
    work ~1e-17 s), the push waits 0.5 s as well: 3 s."""
    host = [Host("h", 1, background_threads=1.0, wake_s=0.5)]
    r = _run(_hosted(1, host, [Placement(0)], shard=Placement(0) if shard_on_host else None, iterations=3))
    assert _spans(r, 0)[:2] == [("fwd", _approx(0.5), _approx(0.7)), ("bwd", _approx(0.7), _approx(2.5))]
    assert r.iteration_times() == _approx([3.0 if shard_on_host else 2.5] * 3)


def test_a_message_to_an_idle_host_does_not_wait() -> None:
    """Two cores, no background, one worker: when a message arrives the worker is waiting
    and the shard is not computing, so no core is busy: wake_s costs nothing (1 s each)."""
    host = [Host("h", 2, wake_s=0.5)]
    r = _run(_hosted(1, host, [Placement(0)], shard=Placement(0), iterations=3))
    assert r.iteration_times() == _approx([1.0] * 3)


def test_wake_us_from_the_config() -> None:
    cfg = config_from_dict(_cfg({"hosts": [{"name": "box", "cores": 2, "wake_us": 1500}],
                                 "devices": [{"type": "cpu-8c", "count": 2, "host": "box"}]}), "c.yaml")
    assert build_problem(cfg, REPO, "c.yaml").cluster.hosts == (Host("box", 2, 0.0, 0.0, 1.5e-3),)


def test_wire_figures_by_hand() -> None:
    """wire_bench's arithmetic on made-up rows: sizes 1e6 and 3e6 bytes, one warm-up round
    (ignored: both sizes once) and one measured round (both sizes again), in that order.
    Round trip 0.1 ms; pulls 0.6 and 1.1 ms (less the round trip: 0.5 and 1.0 ms, so 0.5 ms per 2e6 bytes: 4e9 B/s), pushes 1.1 and 2.1 ms
    (2e9 B/s). CPU over the same 2e6 bytes: worker push 1 ms, shard push 0.5 ms, shard pull
    0.5 ms, worker pull 0.4 ms; the mean over the four, 0.6 ms per 2e6 bytes: 3.333e9 B/s.
    A time that does not grow is refused."""
    from calibration.profiler import wire_figures
    from hardware_profiles.errors import HetsimError

    junk = [(9.0, 9.0, 9.0)] * 3
    worker = [junk, junk, [(1e-4, 0, 0), (6e-4, 0, 1e-4), (1.1e-3, 0, 2e-4)],
              [(1e-4, 0, 0), (1.1e-3, 0, 5e-4), (2.1e-3, 0, 1.2e-3)]]
    shard = [[9.0] * 3, [9.0] * 3, [0.0, 2e-4, 3e-4], [0.0, 7e-4, 8e-4]]
    r = wire_figures([1_000_000, 3_000_000], worker, shard, reps=1, warmup=1)
    assert r["wire_pull_Bps"] == pytest.approx(4e9, rel=1e-3)
    assert r["wire_push_Bps"] == pytest.approx(2e9, rel=1e-3)
    per_B = {"w_push": 1e-3 / 2e6, "s_push": 0.5e-3 / 2e6, "s_pull": 0.5e-3 / 2e6, "w_pull": 0.4e-3 / 2e6}
    assert r["wire_cpu_s_per_B"] == pytest.approx(per_B, rel=1e-3)
    assert r["wire_cpu_Bps"] == pytest.approx(4 / sum(per_B.values()), rel=1e-3)
    # the rows the ranks wrote: sizes interleaved round after round, warm-up rounds first
    from calibration.profiler.network import _interleaved
    assert _interleaved(2, 1, 1) == [(0, False), (1, False), (0, True), (1, True)]
    assert _interleaved(3, 2, 0) == [(0, True), (1, True), (2, True)] * 2
    worker[3][1] = (5e-4, 0, 5e-4)  # a pull that took no longer at 3e6 bytes than at 1e6
    with pytest.raises(HetsimError, match="did not grow"):
        wire_figures([1_000_000, 3_000_000], worker, shard, reps=1, warmup=1)
    with pytest.raises(ValueError, match="3 from the worker, 4 from the shard, 4 expected"):
        wire_figures([1_000_000, 3_000_000], worker[:3], shard, reps=1, warmup=1)


def test_wire_bench_runs_and_leaves_no_process() -> None:
    """The real benchmark on two sizes: figures, or (other jobs on the cores made a time not
    grow with the size) the one-line refusal; either way no rank is left running."""
    import multiprocessing as mp

    from calibration.profiler import wire_bench
    from hardware_profiles.errors import HetsimError

    with time_limit(120):
        try:
            r = wire_bench(sizes=(1 << 20, 16 << 20), reps=5, warmup=1)
        except HetsimError as e:
            assert "did not grow" in str(e)
        else:
            assert r["wire_pull_Bps"] > 0 and r["wire_push_Bps"] > 0 and r["wire_cpu_Bps"] > 0
            assert set(r["wire_cpu_s_per_B"]) == {"w_push", "s_push", "s_pull", "w_pull"}
    assert not mp.active_children()


def test_handoff_rtts_report_both_ranks_and_leave_no_process() -> None:
    """The hand-off benchmark on the real ranks: one time per round after the warm-up,
    and each rank's CPU (gloo's thread apart where /proc names it); no rank left running."""
    import multiprocessing as mp

    from calibration.profiler import handoff_rtts

    with time_limit(120):
        got = handoff_rtts(0, 6, warmup=2, payload_bytes=64)
    assert len(got.rtts) == 6 and all(t > 0 for t in got.rtts)
    assert got.cpu_s > 0 and got.shard_cpu_s > 0  # each rank sent and received 8 messages
    if Path("/proc/self/task").is_dir():
        assert got.loop_cpu_s is not None and got.shard_loop_cpu_s is not None
    assert not mp.active_children()


def test_validate_prices_an_all_reduce_ring_by_the_measured_all_reduce() -> None:
    """A profile that measured gloo's all-reduce of two processes at L = 2 ms + S / 1e9 B/s:
    an all-reduce plan's ring steps at L / 2 = 1 ms and 1e9 B/s, so two members reduce
    4e6 bytes in 2 (1e-3 + 2e6 / 1e9) = 6 ms = L + S / B, the measurement; four take
    6 (1e-3 + 1e6 / 1e9) = 12 ms with a core each, 18 ms as four ranks on two cores. A PS
    plan on the same profiles keeps the loopback rate, and a profile without the measurement leaves the plan's own network (and the drift
    factor slows the measured rate as it slows the loopback's)."""
    from calibration.speed_now import with_drift
    from experiments.validate import on_host
    from hardware_profiles.schema import NetworkMeasurement
    from runtime.spec import parse_options
    from sim.collective import Topology

    net = NetworkMeasurement(p2p_bw_Bps=3e9, allreduce_latency_s=2e-3, allreduce_bw_Bps=1e9)
    cpu = CPU.model_copy(update={"network": net})
    opts = parse_options({"threads": 1}, "c")
    ps_prob = problem([cpu, cpu], [PS.model_copy(update={"network": net})], LAYER, 20, latency_s=5e-5)

    def ring_of(n: int) -> Problem:  # n of these CPUs, all-reduce, no shards
        p = problem([cpu] * n, [PS.model_copy(update={"network": net})], LAYER, 20, latency_s=5e-5)
        return dataclasses.replace(p, job=dataclasses.replace(p.job, sync="allreduce"),
                                   cluster=dataclasses.replace(p.cluster, shards=()))

    ar_prob = ring_of(2)
    emu = on_host(RuntimeEmulation(), ar_prob, plan(ar_prob, [10, 10]), opts, Host("local", 2, 0.0))
    assert (emu.allreduce_latency_s, emu.allreduce_Bps) == (2e-3, 1e9)
    cl = emulated_problem(ar_prob, emu).cluster
    assert [d.nic_bw_Bps for d in cl.devices] == [1e9, 1e9] and cl.network.latency_s == 1e-3
    topo = Topology(cl, [d.id for d in cl.devices])
    assert topo.allreduce_s("ring", 4e6, [0, 1]) == _approx(6e-3)
    four = dataclasses.replace(cl, devices=tuple(dataclasses.replace(d, id=f"cpu:{k}")
                                                 for k, d in enumerate(cl.devices * 2)))
    assert Topology(four, [d.id for d in four.devices]).allreduce_s("ring", 4e6, range(4)) == _approx(12e-3)
    # four ranks on the two cores: every member moves its bytes at once, each at half a
    # core, so at B / 2: 6 (1e-3 + 1e6 / 5e8) = 18 ms
    ar4 = ring_of(4)
    emu4 = on_host(RuntimeEmulation(), ar4, plan(ar4, [5, 5, 5, 5]), opts, Host("local", 2, 0.0))
    cl4 = emulated_problem(ar4, emu4).cluster
    assert [d.nic_bw_Bps for d in cl4.devices] == _approx([5e8] * 4) and cl4.network.latency_s == 1e-3
    assert Topology(cl4, [d.id for d in cl4.devices]).allreduce_s("ring", 4e6, range(4)) == _approx(18e-3)
    # pinned unevenly (two ranks on core 0, one on core 1): the shared ones at B / 2 gate
    # the ring, 4 (1e-3 + 1e6 / 5e8) = 12 ms for 3e6 bytes (a core each: 4 (1e-3 + 1e-3) = 8 ms)
    ar3 = ring_of(3)
    pins = parse_options({"threads": 1, "workers": [{"affinity": [0]}, {"affinity": [0]}, {"affinity": [1]}]}, "c")
    cl3 = emulated_problem(ar3, on_host(RuntimeEmulation(), ar3, plan(ar3, [7, 7, 6]), pins,
                                        Host("local", 2, 0.0))).cluster
    assert [d.nic_bw_Bps for d in cl3.devices] == _approx([5e8, 5e8, 1e9])
    assert Topology(cl3, [d.id for d in cl3.devices]).allreduce_s("ring", 3e6, range(3)) == _approx(12e-3)
    # a rank's ring runs on one thread whatever its compute threads: two each, still B / 2
    two = on_host(RuntimeEmulation(), ar4, plan(ar4, [5, 5, 5, 5]), parse_options({"threads": 2}, "c"),
                  Host("local", 2, 0.0))
    assert [d.nic_bw_Bps for d in emulated_problem(ar4, two).cluster.devices] == _approx([5e8] * 4)
    drifted = emulated_problem(ar_prob, with_drift(emu, 1.25)).cluster
    assert [d.nic_bw_Bps for d in drifted.devices] == _approx([8e8, 8e8])
    assert drifted.network.latency_s == 1e-3  # the drift slows the rate, not the latency
    # a tree's steps are not a ring's: the plan keeps its network
    tree = dataclasses.replace(ar_prob, job=dataclasses.replace(ar_prob.job, allreduce="tree"))
    assert emulated_problem(tree, emu).cluster.network.latency_s == 5e-5
    # two profiles measured apart: the ring at the slower one's figures, its latency with them
    slow = CPU.model_copy(update={"name": "cpu-b", "network": NetworkMeasurement(
        p2p_bw_Bps=3e9, allreduce_latency_s=1e-3, allreduce_bw_Bps=5e8)})
    mixed = dataclasses.replace(ar_prob, cluster=dataclasses.replace(ar_prob.cluster, devices=(
        ar_prob.cluster.devices[0], dataclasses.replace(ar_prob.cluster.devices[1], type=slow))))
    emu = on_host(RuntimeEmulation(), mixed, plan(mixed, [10, 10]), opts, Host("local", 2, 0.0))
    assert (emu.allreduce_latency_s, emu.allreduce_Bps) == (1e-3, 5e8)
    ps_emu = on_host(RuntimeEmulation(), ps_prob, plan(ps_prob, [10, 10]), opts, Host("local", 2, 0.0))
    assert ps_emu.allreduce_Bps == 0.0 and emulated_problem(ps_prob, ps_emu).cluster.network.latency_s == 5e-5
    bare = CPU.model_copy(update={"network": NetworkMeasurement(p2p_bw_Bps=3e9)})
    ar_bare = dataclasses.replace(ar_prob, cluster=dataclasses.replace(
        ar_prob.cluster, devices=tuple(dataclasses.replace(d, type=bare) for d in ar_prob.cluster.devices)))
    emu = on_host(RuntimeEmulation(), ar_bare, plan(ar_bare, [10, 10]), opts, Host("local", 2, 0.0))
    assert emu.allreduce_Bps == 0.0 and emulated_problem(ar_bare, emu).cluster.network.latency_s == 5e-5
