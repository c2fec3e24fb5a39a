"""The fluid network: hand-computed sharing cases, and the pair-grouped
implementation against the per-flow reference (tests/fluid_oracle.py)."""

from __future__ import annotations

import pytest
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
def _flows(*extra):
    """Lists of (start_s, src, dst, nbytes, *extra) flows."""
    return st.lists(
        st.tuples(
            st.sampled_from([0.0, 0.0, 0.5, 1.0, 1.7, 3.0]),
            st.integers(0, 2),
            st.integers(0, 3),
            st.integers(4, 6),
            st.floats(1.0, 1000.0),
            *extra,
        ).map(lambda t: (t[0], *((t[2], t[3]) if t[1] == 0 else (t[3], t[2]) if t[1] == 1
                                 else (t[2], (t[2] + 1) % 4)), *t[4:])),
        min_size=1, max_size=30,
    )


flow_lists = _flows()


@settings(max_examples=400, deadline=None)
@given(flows=flow_lists, bw=st.lists(st.floats(10.0, 500.0), min_size=7, max_size=7),
       latency=st.sampled_from([0.0, 0.01]))
def test_grouped_network_matches_per_flow_reference(flows, bw, latency):
    fast = _run(FlowNetwork, bw, latency, flows)
    ref = _run(ReferenceFlowNetwork, bw, latency, flows)
    assert all(f is not None for f in fast)
    for a, b in zip(fast, ref, strict=True):
        assert abs(a - b) <= 1e-9 * max(abs(b), 1.0)


# -- the virtual clocks: a pair is served by the link that limits it, and moves when that changes --


def _run_ops(net_cls, bw, latency, flows):
    """flows: (start_s, src, dst, nbytes, cancel_after_s or None), started through the
    machinery's ``_start`` (which returns a handle). Returns (delivery time or None, what
    cancel returned or None) per flow."""
    env = simpy.Environment()
    net = net_cls(env, bw, latency, fair=True)
    out = [None] * len(flows)
    left = [None] * len(flows)

    def starter(i, t0, src, dst, n, cancel_after):
        yield env.timeout(t0)
        handle = net._start(src, dst, n, lambda: out.__setitem__(i, env.now))
        if cancel_after is not None:
            yield env.timeout(cancel_after)
            left[i] = net.cancel(handle)

    for i, f in enumerate(flows):
        env.process(starter(i, *f))
    env.run()
    return out, left


def test_a_pair_follows_its_bottleneck_from_link_to_link():
    # Links 0, 1, 2 at 120 B/s, link 3 at 1200 B/s; latency 0. X: 0 -> 2, 330 B at 0.
    #   0   .. 0.5  X, Y (1 -> 2, 60 B) on link 2: 60 each; X is bound to link 2.
    #   0.5 .. 1    Z (100 B) and W (220 B) on 0 -> 3: link 0 has 3 flows, 40 each < 60:
    #               X moves to link 0. Y (30 B left) at 60: done at 1.
    #   1   .. 3    X, Z, W at 40 (link 2 is X's alone: 120). Z: 20 + 80 = 100, done at 3.
    #   3   .. 4    link 0: X, W at 60. X has 130 + 60 = 190, W 100 + 60 = 160.
    #   4   .. 5    U1 (80 B), U2 (200 B) on 1 -> 2: link 2 has 3 flows, 40 < 60: X moves
    #               back to link 2 (the idle pair 1 -> 2 comes back). W at 60: done at 5.
    #   5   .. 6    X, U1, U2 at 40 (link 0 is X's alone now). U1 done at 6; X has 270.
    #   6   .. 7    link 2: X, U2 at 60. X done at 7 (U2: 80 + 60 = 140).
    #   7   .. 7.5  U2 alone at 120: done at 7.5.
    env = simpy.Environment()
    net = FlowNetwork(env, [120.0, 120.0, 120.0, 1200.0], 0.0)
    flows = {"X": (0.0, 0, 2, 330.0), "Y": (0.0, 1, 2, 60.0), "Z": (0.5, 0, 3, 100.0),
             "W": (0.5, 0, 3, 220.0), "U1": (4.0, 1, 2, 80.0), "U2": (4.0, 1, 2, 200.0)}
    done: dict[str, float] = {}
    bound: list[tuple[float, int]] = []

    def starter(name, t0, src, dst, n):
        yield env.timeout(t0)
        net.transfer(src, dst, n, lambda: done.__setitem__(name, env.now))

    def watch():
        for t in (0.25, 0.75, 2.0, 4.5, 6.5):
            yield env.timeout(t - env.now)
            bound.append((t, net._pairs[0 * 4 + 2].b))  # the link pair X's is bound to

    for name, f in flows.items():
        env.process(starter(name, *f))
    env.process(watch())
    env.run()
    expected = {"Y": 1.0, "Z": 3.0, "W": 5.0, "U1": 6.0, "X": 7.0, "U2": 7.5}
    assert done.keys() == expected.keys()
    for name, t in expected.items():
        assert abs(done[name] - t) <= 1e-12 * t, (name, done[name], t)
    assert bound == [(0.25, 2), (0.75, 0), (2.0, 0), (4.5, 2), (6.5, 2)]
    # the reference agrees
    ref = _run(ReferenceFlowNetwork, [120.0, 120.0, 120.0, 1200.0], 0.0, list(flows.values()))
    assert ref == pytest.approx([expected[k] for k in flows], rel=1e-12)


def test_cancel_gives_back_what_was_not_sent_across_a_rebinding():
    # Links 0, 1, 2 at 100 B/s. X: 0 -> 1, 300 B at 0, alone at 100 (bound to link 0, the
    # tie going to src). Y: 2 -> 1, 200 B at 1: link 1 has 2 flows, 50 each < 100: X moves
    # to link 1. X cancelled at 2 has been sent 100 + 50 = 150 B: 150 left. Y, 50 B sent,
    # then runs alone at 100: done at 2 + 150 / 100 = 3.5. X's callback never runs.
    out, left = _run_ops(FlowNetwork, [100.0] * 3, 0.0, [(0.0, 0, 1, 300.0, 2.0), (1.0, 2, 1, 200.0, None)])
    assert out == [None, 3.5]
    assert left == [150.0, None]
    # at the instant it starts, none of it is sent; a finished flow gives back nothing
    out, left = _run_ops(FlowNetwork, [100.0] * 3, 0.0, [(0.0, 0, 1, 300.0, 0.0), (0.0, 2, 1, 100.0, 5.0)])
    assert out == [None, 1.0]
    assert left == [300.0, 0.0]


def test_many_pairs_on_one_link_finish_together_and_move_on():
    # 64 pairs k -> 64 (the shard link, 640 B/s), each link at 100 B/s: 10 B/s each, every
    # pair bound to link 64. Each sends 10 B at 0 and 20 B at 0.5 (when the first is half
    # done): from 0.5 link 64 has 128 flows, 5 B/s each; the first ones (5 B left) end
    # together at 1.5, the second ones (15 B left) then run at 10 B/s: done at 3.
    env = simpy.Environment()
    net = FlowNetwork(env, [100.0] * 64 + [640.0], 0.0)
    first: list[float] = []
    second: list[float] = []

    def starter(k):
        net.transfer(k, 64, 10.0, lambda: first.append(env.now))
        yield env.timeout(0.5)
        net.transfer(k, 64, 20.0, lambda: second.append(env.now))

    for k in range(64):
        env.process(starter(k))
    env.run()
    assert first == pytest.approx([1.5] * 64, rel=1e-12)
    assert second == pytest.approx([3.0] * 64, rel=1e-12)
    assert {p.b for p in net._pairs.values()} == {64}


flow_ops = _flows(st.sampled_from([None, None, None, 0.0, 0.3, 1.1, 2.5]))  # with a cancel time


@settings(max_examples=300, deadline=None)
@given(flows=flow_ops, bw=st.lists(st.floats(10.0, 500.0), min_size=7, max_size=7),
       latency=st.sampled_from([0.0, 0.01]))
def test_arrivals_and_cancels_match_per_flow_reference(flows, bw, latency):
    fast, fast_left = _run_ops(FlowNetwork, bw, latency, flows)
    ref, ref_left = _run_ops(ReferenceFlowNetwork, bw, latency, flows)
    for f, a, b, la, lb in zip(flows, fast, ref, fast_left, ref_left, strict=True):
        t_cancel = None if f[4] is None else f[0] + f[4]
        if (a is None) != (b is None):
            # delivered by one, cancelled by the other: only at a tie of the two instants
            t = a if a is not None else b
            assert t_cancel is not None and abs(t - latency - t_cancel) <= 1e-9 * max(t_cancel, 1.0)
            continue
        if a is not None:
            assert abs(a - b) <= 1e-9 * max(abs(b), 1.0)
        if t_cancel is not None and a is None:
            assert abs(la - lb) <= 1e-9 * max(f[3], 1.0)


def test_small_flows_beside_a_huge_one_are_not_merged_by_the_clocks_size():
    # Link 1 (1e9 B/s) carries Q (2 -> 1, 1e15 B; link 2 at 2e9) from 0: Q is bound to it,
    # and by t0 = 1000 s its clock has run 1e12 B. A (0 -> 1, 100 B) at t0 runs at 5e8 on link 1's clock; B (100 B on the same
    # pair) at t0 + 1e-7, when A has 50 B: 3.33e8 each, A done at t0 + 2.5e-7; B, 50 B
    # left, then at 5e8: done at t0 + 3.5e-7. B's target is 50 B past A's: within 1e-9 of
    # the clock's value, but not of the pair's own service, which the tolerance follows.
    env = simpy.Environment()
    net = FlowNetwork(env, [1e9, 1e9, 2e9], 0.0)
    done: dict[str, float] = {}

    def starter(name, t0, src, dst, n):
        yield env.timeout(t0)
        net.transfer(src, dst, n, lambda: done.__setitem__(name, env.now))

    t0 = 1000.0
    for name, f in {"Q": (0.0, 2, 1, 1e15), "A": (t0, 0, 1, 100.0), "B": (t0 + 1e-7, 0, 1, 100.0)}.items():
        env.process(starter(name, *f))
    env.run(until=t0 + 1.0)
    assert done["A"] == pytest.approx(t0 + 2.5e-7, abs=1e-11)
    assert done["B"] == pytest.approx(t0 + 3.5e-7, abs=1e-11)
    assert net._pairs[2 * 3 + 1].b == 1  # (Q on link 1's clock all along)


def test_a_pair_busy_for_long_does_not_deliver_a_later_flow_early():
    # Links of 1e9, 1e9 and 1e15 B/s. Flow F (1e15 B, 0 -> 1) keeps pair 0 -> 1 busy from t = 0,
    # so by T = 1e4 s it has served 1e13 B. At T, A (1000 B) and B (5000 B) join it and 100
    # flows of 1e9 B go 2 -> 1: link 1 splits 1e9 B/s among 103 flows. A and B finish apart
    # (B 4000 B later): by hand, A at T + 1000 / (1e9 / 103) = T + 1.03e-4 s; then B alone on
    # the pair's share of link 1 (now 102 flows) for its last 4000 B: T + 1.03e-4 + 4000 x 102 / 1e9.
    # A tolerance relative to the pair's service since t = 0 (1e-9 x 1e13 B = 1e4 B) delivered
    # B with A.
    T = 1e4
    flows = [(0.0, 0, 1, 1e15), (T, 0, 1, 1000.0), (T, 0, 1, 5000.0)] + [(T, 2, 1, 1e9)] * 100
    out = _run_until(FlowNetwork, [1e9, 1e9, 1e15], flows, T + 1.0)
    a = T + 1000 * 103 / 1e9
    assert out[1] == pytest.approx(a, rel=1e-12, abs=1e-9)
    assert out[2] == pytest.approx(a + 4000 * 102 / 1e9, rel=1e-12, abs=1e-9)
    ref = _run_until(ReferenceFlowNetwork, [1e9, 1e9, 1e15], flows, T + 1.0)
    assert out[2] == pytest.approx(ref[2], rel=1e-12)


def _run_until(net_cls, bw, flows, until):
    """flows: (start_s, src, dst, nbytes); the delivery time of each flow delivered by ``until``."""
    env = simpy.Environment()
    net = net_cls(env, bw, 0.0)
    out: dict[int, float] = {}

    def starter(i, t0, src, dst, n):
        yield env.timeout(t0)
        net.transfer(src, dst, n, lambda: out.__setitem__(i, env.now))

    for i, f in enumerate(flows):
        env.process(starter(i, *f))
    env.run(until=until)
    return out


def _batched_log(seed: int, batched: bool) -> tuple[list[tuple[float, int]], int, int]:
    """Random sources each sending a batch of messages (new and repeated pairs, several to one
    destination, zero bytes) at random times: the deliveries (time, message), the flows
    started and the events scheduled, with each batch sent by FlowNetwork.transfer_many or
    by one transfer per message."""
    import random

    rng = random.Random(seed)
    env = simpy.Environment()
    R = 10
    net = FlowNetwork(env, [rng.choice([1e9, 2e9, 5e8]) for _ in range(R)], latency_s=rng.choice([0.0, 1e-5]))
    log: list[tuple[float, int]] = []

    def proc():  # type: ignore[no-untyped-def]
        k = 0
        for _ in range(40):
            yield env.timeout(rng.choice([0.0, 1e-4, 3e-4, 1e-3]))
            src = rng.randrange(R)
            msgs = []
            for _ in range(rng.randrange(1, 10)):
                dst = rng.randrange(R)
                if dst == src:
                    continue
                k += 1
                msgs.append((dst, rng.choice([0.0, 1e5, 2e5, rng.uniform(1e3, 1e6)]),
                             (lambda kk: lambda: log.append((env.now, kk)))(k)))
            if batched:
                net.transfer_many(src, msgs)
            else:
                for dst, nbytes, cb in msgs:
                    net.transfer(src, dst, nbytes, cb)

    env.process(proc())
    env.run()
    return log, net._seq, next(env._eid)


def test_transfer_many_is_one_transfer_per_message_in_order() -> None:
    # the batched start (a chunk's pull to every worker) takes _add's bound branch inline:
    # the same deliveries at the same times, flows and events as starting them one by one
    for seed in range(60):
        assert _batched_log(seed, True) == _batched_log(seed, False), seed
