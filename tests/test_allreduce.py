"""All-reduce data parallelism (``job.sync: allreduce``): the buckets, the alpha-beta
costs of each algorithm on hand-made topologies, both evaluators on cases computed by
hand, their agreement, the DES's dynamics and the config's errors.

Hand cases: profiles of 1 TFLOP/s and 1 TB/s (``tests.helpers_eval.profile``), one
dense layer of 1 MB (1e6 bytes) with 1 GFLOP forward and 2 GFLOP backward per sample,
10 samples per worker: forward 0.01 s, backward 0.02 s; SGD (3 passes over the
parameters): 3e-6 s; links 1 GB/s, latency 100 us.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings

from hardware_profiles.errors import ConfigError
from sim import collective_analytic
from sim.cluster import Cluster, Device, Host, Network, Node, Placement
from sim.collective import Hop, Topology, make_buckets, ring_s
from sim.config import config_from_dict
from sim.des import collective as des_collective
from sim.dynamics import Dynamic
from sim.evaluate import evaluate
from sim.plan import check_plan
from sim.problem import build_problem
from tests.helpers_eval import build, case_specs, dense, model, plan, problem, profile

ROOT = Path(__file__).resolve().parents[1]
EXACT = 1e-9
GPU = profile("gpu", nic=1e9)
FC = dense("fc", 1e6, fwd_flops=1e9, bwd_flops=2e9)
SGD_1MB = 3e-6  # 3 passes x 1e6 bytes / 1e12 B/s


def _allreduce(prob, *, algorithm: str = "ring", bucket_bytes: float = 25 * 2**20, optimizer: str = "sgd"):
    return dataclasses.replace(prob, job=dataclasses.replace(prob.job, sync="allreduce", allreduce=algorithm,
                                                             bucket_bytes=bucket_bytes, optimizer=optimizer))


def _both(prob, pl):
    a = collective_analytic.evaluate(prob, pl)
    d = des_collective.simulate(prob, pl, trace=False)
    return a, d


# -- buckets -------------------------------------------------------------------------


def test_buckets_close_once_full_in_reverse_layer_order() -> None:
    # layers 0..4 of 10, 0, 30, 5, 40 bytes, buckets of 30: [4] (40), [3, 2] (35), [1, 0] (10)
    got = make_buckets([10, 0, 30, 5, 40], 30, 32)
    assert [b.layers for b in got] == [(4,), (3, 2), (0,)]
    assert [b.fp32_bytes for b in got] == [40, 35, 10]
    assert [b.lowest for b in got] == [4, 2, 0]
    # 16 bits on the wire: half the bytes plus the 8-byte scale and offset of the packing
    assert [b.wire_bytes for b in make_buckets([1000.0], 25, 16)] == [508.0]
    with pytest.raises(ValueError, match="bucket_bytes must be > 0"):
        make_buckets([1.0], 0, 32)


# -- the cost of one all-reduce ------------------------------------------------------------


def _cluster(nics: list[float], nodes: tuple[Node, ...] = (), latency_s: float = 1e-4) -> Cluster:
    devs = tuple(Device(f"gpu:{k}", GPU, b) for k, b in enumerate(nics))
    return Cluster(devs, (), Network(latency_s, "none"), nodes=nodes)


def test_ring_by_hand() -> None:
    # 2 workers, 1 MB: 2 (n - 1) (alpha + B/n / bw) = 2 (1e-4 + 5e5 / 1e9) = 1.2e-3 s
    topo = Topology(_cluster([1e9, 1e9]), ["gpu:0", "gpu:1"])
    assert topo.allreduce_s("ring", 1e6, [0, 1]) == pytest.approx(1.2e-3, rel=EXACT)
    # 4 workers, one link at 0.5 GB/s: every step waits for its slowest hop, 1e-4 + 2.5e5 / 5e8
    topo = Topology(_cluster([1e9, 1e9, 5e8, 1e9]), [f"gpu:{k}" for k in range(4)])
    assert topo.allreduce_s("ring", 1e6, range(4)) == pytest.approx(6 * 6e-4, rel=EXACT)
    # one worker, or nothing to send: nothing to pay
    assert topo.allreduce_s("ring", 1e6, [2]) == 0.0
    assert ring_s(1e6, [Hop(1e9, 1e-4)]) == 0.0


def test_tree_by_hand() -> None:
    # 2 ceil(log2 4) alpha + 2 B / bw = 4e-4 + 2e-3
    topo = Topology(_cluster([1e9] * 4), [f"gpu:{k}" for k in range(4)])
    assert topo.allreduce_s("tree", 1e6, range(4)) == pytest.approx(2.4e-3, rel=EXACT)
    # 5 workers: ceil(log2 5) = 3 levels
    topo = Topology(_cluster([1e9] * 5), [f"gpu:{k}" for k in range(5)])
    assert topo.allreduce_s("tree", 1e6, range(5)) == pytest.approx(6e-4 + 2e-3, rel=EXACT)


def test_two_nodes_by_hand() -> None:
    # two nodes of two: inside 10 GB/s and 10 us, NICs 1 GB/s and 100 us
    nodes = (Node("a", ("gpu:0", "gpu:1"), 1e10, 1e-5, 1e9, 1e-4),
             Node("b", ("gpu:2", "gpu:3"), 1e10, 1e-5, 1e9, 1e-4))
    topo = Topology(_cluster([1e9] * 4, nodes), [f"gpu:{k}" for k in range(4)])
    # ring a0 a1 b0 b1: two hops cross a NIC, 1e-4 + 2.5e5 / 1e9 a step, 6 steps
    assert topo.allreduce_s("ring", 1e6, range(4)) == pytest.approx(6 * 3.5e-4, rel=EXACT)
    # hierarchical: inside, (k - 1)(alpha + B/k / bw) + alpha + (k - 1)(B/k) / bw = 6e-5 + 6e-5,
    # twice (reduce, broadcast); across, a ring of the 2 leaders over the NICs: 1.2e-3
    assert topo.allreduce_s("hierarchical", 1e6, range(4)) == pytest.approx(2 * 1.2e-4 + 1.2e-3, rel=EXACT)
    # the ring visits node by node whatever the plan order
    assert Topology(_cluster([1e9] * 4, nodes), ["gpu:2", "gpu:0", "gpu:3", "gpu:1"]).ring(range(4)) == [1, 3, 0, 2]
    # a worker in no node is a node of its own: no NIC of a node on its hops, its own link
    flat = Topology(_cluster([1e9, 1e9, 2e8], nodes[:1]), ["gpu:0", "gpu:1", "gpu:2"])
    assert flat.hop(1, 2) == Hop(2e8, 1e-4) and flat.hop(0, 1) == Hop(1e10, 1e-5)
    with pytest.raises(ValueError, match="unknown all-reduce algorithm 'star'"):
        topo.allreduce_s("star", 1e6, range(4))


# -- both evaluators, by hand ----------------------------------------------------------------


def test_two_worker_ring_by_hand() -> None:
    # no pipelining: forward 0.01 + backward 0.02, the all-reduce 1.2e-3, then the step
    prob = _allreduce(problem([GPU, GPU], [], model(FC), 20, latency_s=1e-4, iterations=5))
    a, d = _both(prob, plan(prob, [10, 10]))
    it = 0.03 + 1.2e-3 + SGD_1MB
    assert a.iter_end_s == pytest.approx([it * k for k in range(1, 6)], rel=EXACT)
    assert d.iter_end_s == pytest.approx(a.iter_end_s, rel=EXACT)
    assert a.iter_samples == d.iter_samples == [20] * 5
    for x in (a, d):  # each worker: 0.03 s compute and the step, 1.2e-3 s of its all-reduce, no waiting
        for u in x.devices:
            assert (u.compute_s, u.comm_s, u.wait_s) == pytest.approx((5 * (0.03 + SGD_1MB), 5 * 1.2e-3, 0.0),
                                                                       abs=1e-12)
    assert a.extra["allreduce"]["buckets"] == 1 and "notes" not in a.extra


def test_the_parameter_server_evaluators_refuse_an_all_reduce_job() -> None:
    """sim.des.simulate and sim.analytic.evaluate model PS shards: an all-reduce job given to
    them directly is a ValueError naming its own evaluator (sim.evaluate.evaluate routes it)."""
    from sim import analytic, des

    prob = _allreduce(problem([GPU, GPU], [], model(FC), 20, latency_s=1e-4, iterations=5))
    pl = plan(prob, [10, 10])
    with pytest.raises(ValueError, match="sim.des.collective.simulate"):
        des.simulate(prob, pl)
    with pytest.raises(ValueError, match="sim.collective_analytic.evaluate"):
        analytic.evaluate(prob, pl)
    assert evaluate(prob, pl, "analytic").throughput_sps > 0


def test_four_worker_ring_by_hand_slowest_gates() -> None:
    # shares 10, 10, 10, 20: worker 3 computes twice as long (0.06 s) and gates the all-reduce;
    # worker 2's link of 0.5 GB/s sets every step: 6 x (1e-4 + 2.5e5 / 5e8) = 3.6e-3 s
    prob = _allreduce(problem([GPU] * 4, [], model(FC), 50, latency_s=1e-4, iterations=4,
                              worker_nic=[1e9, 1e9, 5e8, 1e9]))
    a, d = _both(prob, plan(prob, [10, 10, 10, 20]))
    it = 0.06 + 3.6e-3 + SGD_1MB
    assert a.iter_end_s == pytest.approx([it * k for k in range(1, 5)], rel=EXACT)
    assert d.iter_end_s == pytest.approx(a.iter_end_s, rel=EXACT)
    waits = [u.wait_s for u in d.devices]  # the fast ones wait 0.03 s an iteration for worker 3
    assert waits == pytest.approx([4 * 0.03] * 3 + [0.0], abs=1e-12)
    assert [u.wait_s for u in a.devices] == pytest.approx(waits, abs=1e-12)


def test_buckets_overlap_the_backward_when_pipelined() -> None:
    # two layers, a bucket each (1e6 bytes of 1e6-byte buckets). Backward of fc2 ends at
    # 0.02 + 0.02: its bucket is reduced over 0.04 .. 0.0412 while fc1's backward runs;
    # fc1's bucket then 0.06 .. 0.0612, and the step (6e-6, 2 MB) ends the iteration.
    m = model(dense("fc1", 1e6, fwd_flops=1e9, bwd_flops=2e9), dense("fc2", 1e6, fwd_flops=1e9, bwd_flops=2e9))
    for pipeline, it in ((True, 0.06 + 1.2e-3 + 6e-6), (False, 0.06 + 2 * 1.2e-3 + 6e-6)):
        prob = _allreduce(problem([GPU, GPU], [], m, 20, latency_s=1e-4, iterations=3, pipeline=pipeline),
                          bucket_bytes=1e6)
        a, d = _both(prob, plan(prob, [10, 10]))
        assert a.iter_end_s == pytest.approx([it, 2 * it, 3 * it], rel=EXACT), pipeline
        assert d.iter_end_s == pytest.approx(a.iter_end_s, rel=EXACT)
        assert a.extra["allreduce"]["buckets"] == 2


def test_a_single_worker_communicates_nothing_and_says_so() -> None:
    prob = _allreduce(problem([GPU], [], model(FC), 10, latency_s=1e-4, iterations=3), optimizer="momentum")
    r = evaluate(prob, plan(prob, [10]), "des")
    # forward, backward and the momentum step (5 passes over 1 MB)
    assert r.iteration_times().tolist() == pytest.approx([0.03 + 5e-6] * 3, rel=EXACT)
    assert r.extra["notes"] == ["all-reduce over a single worker (gpu:0): nothing is communicated"]
    assert evaluate(prob, plan(prob, [10]), "analytic").extra["notes"] == r.extra["notes"]


def test_hosted_workers_share_the_cores_once() -> None:
    # two workers on a host of 2 cores with 2 background threads: each thread gets half a
    # core, so forward + backward take 2 x 0.03 and the step 2 x 3e-6; each member's
    # reduction of the bucket (5e5 bytes summed, 3 passes at 1 TB/s: 1.5e-6 s alone) runs
    # beside the 1.2e-3 s of the ring and ends first. The DES shares the cores itself, the
    # closed form stretches by the same share: both see the host once, not twice
    prob = _allreduce(problem([GPU, GPU], [], model(FC), 20, latency_s=1e-4, iterations=3))
    cl = dataclasses.replace(prob.cluster, hosts=(Host("h", 2, background_threads=2.0),),
                             placement=(("gpu:0", Placement(0)), ("gpu:1", Placement(0))))
    prob = dataclasses.replace(prob, cluster=cl)
    a, d = _both(prob, plan(prob, [10, 10]))
    it = 2 * 0.03 + 1.2e-3 + 2 * SGD_1MB
    assert d.iter_end_s == pytest.approx([it, 2 * it, 3 * it], rel=EXACT)
    assert a.iter_end_s == pytest.approx(d.iter_end_s, rel=EXACT)


@settings(max_examples=40, deadline=None)
@given(spec=case_specs(sparse_layer=True, quant=(32, 16, 8)))
def test_des_and_closed_form_agree_on_bsp_plans(spec: dict) -> None:
    # the issue asks for 2%; without dynamics both run the same recursion: to float rounding
    prob, pl = build(spec, iterations=8, warmup=1, latency_s=spec["latency"])
    prob = _allreduce(prob, algorithm=["ring", "tree", "hierarchical"][len(spec["layers"]) % 3],
                      bucket_bytes=float(max(1, sum(x[0] for x in spec["layers"]) // 3)), optimizer="momentum")
    pl = dataclasses.replace(pl, ps_shards=())
    a, d = _both(prob, pl)
    assert a.iter_end_s == pytest.approx(d.iter_end_s, rel=EXACT)
    assert a.throughput_sps == pytest.approx(d.throughput_sps, rel=1e-8)


# -- the DES's dynamics ----------------------------------------------------------------------


def test_a_failed_worker_leaves_the_ring_after_the_timeout() -> None:
    # worker 1 dies at 0.05 s, in its second iteration; detected at 0.55 s, the survivors'
    # reduction goes on without it: the second iteration ends at 0.55 + (0.03 + 1.2e-3 + step -
    # its compute, done long ago) ... worked out: reduced at 0.55 (a ring of one costs 0), step.
    prob = _allreduce(problem([GPU, GPU], [], model(FC), 20, latency_s=1e-4, iterations=4,
                              failure_timeout_s=0.5, dynamics=[Dynamic(1, 0.05, fail=True)]))
    r = des_collective.simulate(prob, plan(prob, [10, 10]), trace=False)
    first = 0.03 + 1.2e-3 + SGD_1MB
    assert r.iter_end_s[0] == pytest.approx(first, rel=EXACT)
    assert r.iter_end_s[1] == pytest.approx(0.55 + SGD_1MB, rel=EXACT)
    assert r.iter_end_s[2] == pytest.approx(0.55 + SGD_1MB + 0.03 + SGD_1MB, rel=EXACT)
    assert r.iter_samples == [20, 10, 10, 10]  # no scheduler: the dead worker's share is lost
    [f] = r.failures
    assert (f["worker"], f["failed_at_s"], f["detected_at_s"]) == ("gpu:1", 0.05, pytest.approx(0.55))


def test_a_slowdown_stretches_compute_from_its_time_on() -> None:
    # worker 0 slows down 3x at 0.1 s, in its fourth iteration's forward (started at
    # 3 x 0.031203): what is left of it runs 3x slower, and so does everything after
    prob = _allreduce(problem([GPU, GPU], [], model(FC), 20, latency_s=1e-4, iterations=6,
                              dynamics=[Dynamic(0, 0.1, slowdown=3.0)]))
    r = des_collective.simulate(prob, plan(prob, [10, 10]), trace=False)
    it = 0.03 + 1.2e-3 + SGD_1MB
    t3 = 3 * it
    fwd_left = 0.01 - (0.1 - t3)
    assert r.iter_end_s[3] == pytest.approx(0.1 + 3 * fwd_left + 3 * 0.02 + 1.2e-3 + 3 * SGD_1MB, rel=EXACT)
    assert r.iteration_times()[-1] == pytest.approx(3 * 0.03 + 1.2e-3 + 3 * SGD_1MB, rel=EXACT)


def test_online_shares_follow_speed_two_iterations_later() -> None:
    # lbbsp moves samples to the faster device; a plan decided at the end of iteration t
    # is run from t + 2 on (as the runtime's coordinator sends its words), in both evaluators
    # the plan they settle on is the same
    fast, slow = profile("fast", peak=2e12, nic=1e9), profile("slow", peak=1e12, nic=1e9)
    prob = _allreduce(problem([fast, slow], [], model(FC), 30, latency_s=1e-4, iterations=30))
    from schedulers.lbbsp import LBBSP

    s1, s2 = LBBSP(damping=0.0), LBBSP(damping=0.0)
    d = evaluate(prob, plan(prob, [15, 15]), "des", scheduler=s1)
    a = evaluate(prob, plan(prob, [15, 15]), "analytic", scheduler=s2)
    assert d.extra["final_shares"] == a.extra["final_shares"] == {"fast:0": 20, "slow:0": 10}
    assert d.iteration_times()[-1] == pytest.approx(a.iteration_times()[-1], rel=EXACT)
    # iterations 0 and 1 ran the plan's 15 / 15: the first change came into force at 2
    assert d.iteration_times()[1] > d.iteration_times()[2]


# -- configs ----------------------------------------------------------------------------


def _cfg(**over: object) -> dict:
    cfg: dict = {"name": "ar", "cluster": {"devices": [{"type": "v100", "count": 4}],
                                           "network": {"bandwidth_gbps": 100, "latency_us": 10}},
                 "job": {"model": "mlp", "global_batch": 64, "iterations": 5, "sync": "allreduce"}}
    for k, v in over.items():
        sec, _, key = k.partition(".")
        cfg[sec][key] = v
    return cfg


def _problem(cfg: dict):
    return build_problem(config_from_dict(cfg, "ar.yaml"), ROOT, "ar.yaml")


def test_config_resolves_nodes_and_defaults() -> None:
    cfg = _cfg(**{"cluster.nodes": [{"name": "n0", "devices": ["v100:0-1"], "intra_gbps": 1200, "nic_gbps": 10},
                                    {"name": "n1", "devices": ["v100:2", "v100:3"], "intra_gbps": 1200,
                                     "nic_gbps": 10, "nic_latency_us": 30}]})
    p = _problem(cfg)
    assert p.job.allreduce == "ring" and p.job.bucket_bytes == 25 * 2**20 and p.job.optimizer == "momentum"
    assert p.cluster.shards == ()
    n0, n1 = p.cluster.nodes
    assert n0.devices == ("v100:0", "v100:1") and n0.nic_bw_Bps == 1.25e9 and n0.intra_bw_Bps == 1.5e11
    assert n0.nic_latency_s == pytest.approx(1e-5) and n1.nic_latency_s == pytest.approx(3e-5)
    # a PS worker in a node reaches the shards through its share of the node's NIC
    assert p.cluster.device("v100:0").nic_bw_Bps == 1.25e9 / 2
    dumped = config_from_dict(cfg, "x").model_dump(mode="json")
    assert "ps" not in dumped["cluster"] and dumped["job"]["bucket_mb"] == 25.0
    # a PS config resolves as before: no all-reduce fields, no nodes
    ps = config_from_dict({**cfg, "job": {**cfg["job"], "sync": "bsp"}, "cluster": _cfg()["cluster"]},
                          "x").model_dump(mode="json")
    assert "allreduce" not in ps["job"] and "nodes" not in ps["cluster"] and ps["cluster"]["ps"]["shards"] == 1


@pytest.mark.parametrize("over,field,message", [
    ({"job.allreduce": "star"}, "job.allreduce", "Input should be 'ring', 'tree' or 'hierarchical'"),
    ({"job.bucket_mb": 0}, "job.bucket_mb", "Input should be greater than 0"),
    ({"job.bucket_mb": -1.5}, "job.bucket_mb", "Input should be greater than 0"),
    ({"cluster.ps": {"shards": 2}}, "cluster.ps", "job.sync: allreduce has no parameter server"),
    ({"cluster.nodes": [{"name": "a", "devices": [], "intra_gbps": 1, "nic_gbps": 1}]},
     "cluster.nodes[0].devices", "a node needs at least one device"),
    ({"cluster.nodes": [{"name": "a", "devices": ["v100:0-1"], "intra_gbps": 1, "nic_gbps": 1},
                        {"name": "b", "devices": ["v100:1"], "intra_gbps": 1, "nic_gbps": 1}]},
     "cluster.nodes[1].devices[0]", "device 'v100:1' is in node 'a' already"),
    ({"cluster.nodes": [{"name": "a", "devices": ["v100:7"], "intra_gbps": 1, "nic_gbps": 1}]},
     "cluster.nodes[0].devices[0]", "no such device id 'v100:7'"),
    ({"cluster.nodes": [{"name": "a", "devices": ["v100:2-9"], "intra_gbps": 1, "nic_gbps": 1}]},
     "cluster.nodes[0].devices[0]", "no such device id 'v100:2-9'"),
])
def test_bad_input_is_one_line(over: dict, field: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        _problem(_cfg(**over))
    assert e.value.field == field and message in e.value.message
    assert "\n" not in str(e.value)


def test_all_reduce_fields_only_with_all_reduce() -> None:
    with pytest.raises(ConfigError, match="bucket_mb is given only with sync: allreduce"):
        _problem(_cfg(**{"job.sync": "bsp", "job.bucket_mb": 10}))


def test_plans_with_shards_or_stages_are_refused() -> None:
    p = _problem(_cfg())
    pl = plan(p, [16] * 4)
    check_plan(pl, p)
    with pytest.raises(ConfigError, match="job.sync: allreduce has no PS shards"):
        check_plan(dataclasses.replace(pl, ps_shards=("ps:0",)), p)


def test_cli_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_cfg(**{"job.allreduce": "butterfly"})))
    out = subprocess.run([sys.executable, "-m", "experiments.cli", "simulate", str(path)], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "job.allreduce" in out.stderr
