"""The fluid network: hand-computed sharing cases, and the pair-grouped
implementation against the per-flow reference (tests/fluid_oracle.py)."""

from __future__ import annotations

import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.des.network import FlowNetwork
from tests.fluid_oracle import ReferenceFlowNetwork


def _run(net_cls, bw, latency, flows, fair=True):
    """flows: (start_s, src, dst, nbytes); returns delivery time per flow."""
    env = simpy.Environment()
    net = net_cls(env, bw, latency, fair=fair)
    out = [None] * len(flows)

    def starter(i, t0, src, dst, n):
        yield env.timeout(t0)
        net.transfer(src, dst, n, lambda: out.__setitem__(i, env.now))

    for i, f in enumerate(flows):
        env.process(starter(i, *f))
    env.run()
    return out


def test_two_flows_share_a_link_then_the_survivor_speeds_up():
    # link 0 -> link 1, both 100 B/s. Two flows of 100 and 200 bytes start at 0:
    # each gets 50 B/s; the first ends at 100/50 = 2 s; the second has 100 bytes
    # left and gets 100 B/s: ends at 3 s. Latency 0.5 s is added to both.
    t = _run(FlowNetwork, [100.0, 100.0], 0.5, [(0, 0, 1, 100.0), (0, 0, 1, 200.0)])
    assert t == [2.5, 3.5]


def test_min_share_rule_leaves_unused_capacity_idle():
    # A: link 0 (10 B/s) -> link 2 (100 B/s); B: link 1 (100 B/s) -> link 2.
    # Link 2 has two flows: share 50 each. A runs at min(10, 50) = 10, B at
    # min(100, 50) = 50 (the 40 B/s A cannot use is not handed to B).
    # B (100 bytes) ends at 2 s; A (100 bytes) then runs alone at 10 B/s: ends at 10 s.
    t = _run(FlowNetwork, [10.0, 100.0, 100.0], 0.0, [(0, 0, 2, 100.0), (0, 1, 2, 100.0)])
    assert t == [10.0, 2.0]


def test_a_late_flow_slows_an_early_one():
    # One link pair, 100 B/s. Flow 1: 300 bytes at t=0. Flow 2: 100 bytes at t=1.
    # 0..1: flow 1 alone, 100 bytes done. From 1: 50 B/s each; flow 2 ends at 3
    # (flow 1 has 300-100-100 = 100 left), then flow 1 alone ends at 4.
    t = _run(FlowNetwork, [100.0, 100.0], 0.0, [(0, 0, 1, 300.0), (1, 0, 1, 100.0)])
    assert t == [4.0, 3.0]


def test_no_sharing_gives_every_flow_its_slower_endpoint():
    t = _run(FlowNetwork, [100.0, 50.0], 0.25, [(0, 0, 1, 100.0), (0, 0, 1, 100.0)], fair=False)
    assert t == [2.25, 2.25]


# Links 0-3 stand for workers, 4-6 for shards: flows go worker->shard,
# shard->worker, and some worker->worker.
flow_lists = st.lists(
    st.tuples(
        st.sampled_from([0.0, 0.0, 0.5, 1.0, 1.7, 3.0]),
        st.integers(0, 2),
        st.integers(0, 3),
        st.integers(4, 6),
        st.floats(1.0, 1000.0),
    ).map(lambda t: (t[0], *((t[2], t[3]) if t[1] == 0 else (t[3], t[2]) if t[1] == 1
                             else (t[2], (t[2] + 1) % 4)), t[4])),
    min_size=1, max_size=30,
)


@settings(max_examples=400, deadline=None)
@given(flows=flow_lists, bw=st.lists(st.floats(10.0, 500.0), min_size=7, max_size=7),
       latency=st.sampled_from([0.0, 0.01]))
def test_grouped_network_matches_per_flow_reference(flows, bw, latency):
    fast = _run(FlowNetwork, bw, latency, flows)
    ref = _run(ReferenceFlowNetwork, bw, latency, flows)
    assert all(f is not None for f in fast)
    for a, b in zip(fast, ref, strict=True):
        assert abs(a - b) <= 1e-9 * max(abs(b), 1.0)
