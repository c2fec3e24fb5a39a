"""One plan contract: the typed plan kind, plan JSON schema 2 (and the migration of schema 1),
the single dispatch on the kind (sim.evaluate), online schedulers recognised by protocol, and
DAG runs as RunResults."""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest

import schedulers
import sim.scheduling
from experiments.dag_runner import DAG_KEYS, plan_and_simulate
from hardware_profiles.board import load_board
from hardware_profiles.errors import ConfigError
from schedulers.dag import heft_schedule, list_schedule, make_dag
from sim import analytic, des
from sim.dag import DagCosts, DagPlan, DagProblem, dag_costs
from sim.des.frames import FrameOptions, simulate_frames
from sim.evaluate import evaluate
from sim.instances import random_graph
from sim.multistage import evaluate_analytic
from sim.plan import Plan, PlanKind, Replica, Stage, check_plan, migrate_plan_dict, plan_from_dict
from sim.result import HEADLINE_KEYS, FrameResult, RunResult
from sim.scheduling import OnlineScheduler
from tests.helpers_eval import dense, model, plan, problem, profile

GPU = profile("gpu", peak=1e13, mem_bw=1e15, nic=1e9, price=4.0)
CPU = profile("cpu", peak=1e12, mem_bw=1e15, nic=1e9, kind="cpu", price=1.0)
PS = profile("ps", kind="cpu", mem_bw=1e15, nic=1e10, price=1.0)


def _problem(iterations: int = 20):  # type: ignore[no-untyped-def]
    mdl = model(dense("L0", 1e6, 1e9, 2e9, activation_bytes=1e5), dense("L1", 4e6, 1e8, 2e8, activation_bytes=1e3))
    return problem([GPU, CPU, CPU], [PS], mdl, global_batch=8, pipeline=True, iterations=iterations)


def _placement(prob, stages: int = 2, options: dict[str, Any] | None = None) -> Plan:  # type: ignore[no-untyped-def]
    if stages == 2:
        st = (Stage(0, 1, (Replica("gpu:0", 8),), "gpu"),
              Stage(1, 2, (Replica("cpu:0", 4), Replica("cpu:1", 4)), "cpu"))
    else:
        st = (Stage(0, 2, (Replica("cpu:0", 4), Replica("cpu:1", 4)), "cpu"),)
    p = Plan(st, ("ps:0",), "hand", options or {}, PlanKind.PLACEMENT)
    check_plan(p, prob)
    return p


def _schema1(p: Plan) -> dict[str, Any]:
    """``p`` as a schema-1 file wrote it: no kind."""
    d = p.to_dict()
    del d["kind"]
    return {**d, "schema": 1}


# ---------------------------------------------------------------- the kind and plan JSON


def test_the_kind_is_a_typed_field_and_a_plan_of_several_stages_must_say_placement() -> None:
    prob = _problem()
    assert plan(prob, [4, 2, 2]).kind is PlanKind.DATA_PARALLEL  # the default
    st = _placement(prob).stages
    with pytest.raises(ValueError, match="one stage, not 2"):
        Plan(st, ("ps:0",), "hand")
    assert Plan(st, ("ps:0",), "hand", kind="placement").kind is PlanKind.PLACEMENT  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="DagPlan"):
        Plan(st, ("ps:0",), "hand", kind=PlanKind.DAG)
    assert DagPlan("m", (0,), (0.0,)).kind is PlanKind.DAG
    # with_shares keeps the kind (a one-stage placement stays one)
    one = _placement(prob, stages=1)
    assert one.with_shares({"cpu:0": 8, "cpu:1": 0}).kind is PlanKind.PLACEMENT


def test_schema_2_writes_the_kind_and_reads_back_the_same_plan() -> None:
    prob = _problem()
    for p in (plan(prob, [4, 2, 2]), _placement(prob), _placement(prob, stages=1)):
        d = json.loads(p.dumps())
        assert d["schema"] == 2 and d["kind"] == p.kind.value
        assert list(d)[:2] == ["schema", "kind"]
        back = plan_from_dict(d)
        assert back == p and back.kind is p.kind


@pytest.mark.parametrize(("stages", "options", "kind"), [
    (1, {}, "data_parallel"),
    (2, {}, "placement"),                              # several stages
    (1, {"placement": {"assignment": []}}, "placement"),  # made by a placement scheduler
    (1, {"memory_short_samples": 0}, "data_parallel"),
])
def test_schema_1_migrates_to_the_kind_is_placement_gave(stages: int, options: dict[str, Any], kind: str) -> None:
    prob = _problem()
    p = _placement(prob, stages) if stages == 2 else plan(prob, [4, 2, 2])
    old = _schema1(p) | {"options": options}
    before = copy.deepcopy(old)
    new = migrate_plan_dict(old)
    assert old == before  # the input is left as it was
    assert new == {**old, "schema": 2, "kind": kind}
    assert plan_from_dict(old).kind is PlanKind(kind)
    current = {**old, "schema": 2, "kind": kind}
    assert migrate_plan_dict(current) is current  # a current dict is returned as it is


@pytest.mark.parametrize(("change", "field", "words"), [
    ({"schema": 3}, "schema", "unsupported plan schema 3"),
    ({"kind": None}, "kind", "must be one of data_parallel, placement"),
    ({"kind": "dag"}, "kind", "must be one of data_parallel, placement"),
    ({"kind": "pipeline"}, "kind", "must be one of data_parallel, placement"),
])
def test_bad_kinds_and_schemas_are_one_line_errors(change: dict[str, Any], field: str, words: str) -> None:
    d = {**plan(_problem(), [4, 2, 2]).to_dict(), **change}
    if change.get("kind", "") is None:
        del d["kind"]
    with pytest.raises(ConfigError) as e:
        plan_from_dict(d, "p.json")
    assert (e.value.file, e.value.field) == ("p.json", field) and words in e.value.message


def test_a_data_parallel_kind_on_two_stages_is_refused_naming_the_kind() -> None:
    d = _placement(_problem()).to_dict() | {"kind": "data_parallel"}
    with pytest.raises(ConfigError) as e:
        plan_from_dict(d, "p.json")
    assert e.value.field == "kind" and "one stage, not 2" in e.value.message


@pytest.mark.parametrize("evaluator", ["analytic", "des"])
def test_an_old_plan_file_gives_the_result_of_the_plan_it_was_written_from(evaluator: str) -> None:
    prob = _problem()
    opts = {"placement": {"assignment": ["cpu", "cpu"]}}
    for p in (plan(prob, [4, 2, 2]), _placement(prob), _placement(prob, stages=1, options=opts)):
        old = plan_from_dict(json.loads(json.dumps(_schema1(p))))
        assert old.kind is p.kind
        a = evaluate(prob, p, evaluator, trace=False)
        b = evaluate(prob, old, evaluator, trace=False)
        assert a.summary_json() == b.summary_json() and a.iterations_csv() == b.iterations_csv()


# ---------------------------------------------------------------- the one dispatch


def test_evaluate_dispatches_on_the_kind() -> None:
    prob = _problem()
    dp, pl = plan(prob, [4, 2, 2]), _placement(prob, stages=1)
    assert evaluate(prob, dp, "analytic").summary() == analytic.evaluate(prob, dp).summary()
    assert evaluate(prob, dp, "des", trace=False).summary() == des.simulate(prob, dp, trace=False).summary()
    # a one-stage placement runs as a pipeline of one stage, not as data-parallel training
    a = evaluate(prob, pl, "analytic")
    assert a.summary() == evaluate_analytic(prob, pl).summary() and "placement" in a.extra
    same_as_training = Plan(pl.stages, pl.ps_shards, "hand")  # the same stage, data-parallel
    assert "placement" not in evaluate(prob, same_as_training, "analytic").extra


def test_the_data_parallel_evaluators_refuse_other_kinds() -> None:
    prob = _problem()
    pl = _placement(prob)
    with pytest.raises(ValueError, match="sim.analytic.evaluate runs data_parallel plans, not placement"):
        analytic.evaluate(prob, pl)
    with pytest.raises(ValueError, match="sim.des.simulate runs data_parallel plans, not placement"):
        des.simulate(prob, pl)
    with pytest.raises(ValueError, match="unknown evaluator 'exact'"):
        evaluate(prob, pl, "exact")


# ---------------------------------------------------------------- online schedulers


class _Rebalancer:
    """rebalance alone: not an OnlineScheduler (no name, no plan)."""

    calls = 0

    def rebalance(self, plan: Plan, obs: Any) -> Plan | None:
        _Rebalancer.calls += 1
        return None


def test_online_schedulers_are_recognised_by_the_protocol() -> None:
    assert schedulers.OnlineScheduler is sim.scheduling.OnlineScheduler
    assert schedulers.Scheduler is sim.scheduling.Scheduler
    assert isinstance(schedulers.make("hps"), OnlineScheduler)
    assert isinstance(schedulers.make("lbbsp"), OnlineScheduler)
    assert not isinstance(schedulers.make("equal"), OnlineScheduler)
    assert isinstance(schedulers.make("equal"), sim.scheduling.Scheduler)
    assert isinstance(make_dag("heft"), sim.scheduling.DagScheduler)
    # an object with rebalance but without the Scheduler part is not driven
    prob = _problem()
    _Rebalancer.calls = 0
    des.simulate(prob, plan(prob, [4, 2, 2]), trace=False, scheduler=_Rebalancer())  # type: ignore[arg-type]
    analytic.evaluate(prob, plan(prob, [4, 2, 2]), scheduler=_Rebalancer())
    assert _Rebalancer.calls == 0


# ---------------------------------------------------------------- DAG runs are RunResults


def test_a_frames_run_is_a_run_result_with_the_frame_fields() -> None:
    # one 2 s task, a frame every 1 s, deadline 3 s, 4 frames: frame f is released at f and
    # finishes at 2(f + 1). Board idle 1 W, the unit 3 W more while busy (8 s busy of 8 s).
    c = DagCosts.from_tables([[2.0]], {}, busy_w=[3.0], idle_w=1.0, period_s=1.0, deadline_s=3.0)
    p = list_schedule(c, c.topo(), lambda i, opts, load: 0, "hand")
    r = simulate_frames(c, p, FrameOptions(frames=4, seed=7), name="one")
    assert isinstance(r, FrameResult) and isinstance(r, RunResult)
    assert (r.name, r.evaluator, r.scheduler, r.seed) == ("one", "des", "hand", 7)
    assert r.iter_end_s == [2.0, 4.0, 6.0, 8.0] and r.iter_samples == [1, 1, 1, 1]
    assert r.latency_s.tolist() == [2.0, 3.0, 4.0, 5.0] and r.miss_rate == 0.5
    assert r.makespan_s == 2.0 and r.elapsed_s == 8.0
    assert r.energy_j == 1.0 * 8.0 + 3.0 * 8.0 and r.energy_per_frame_j == 8.0
    assert r.throughput_sps == 3 / 6.0  # frames after the first over the time after it
    s = r.summary()
    assert s["iterations"] == s["frames"] == 4 and s["energy_j"] == 32.0 and s["cost_usd"] == 0.0
    assert s["deadline_miss_rate"] == 0.5 and s["latency_max_s"] == 5.0 and s["utilization"] == {"u0": 1.0}
    assert set(HEADLINE_KEYS) <= set(r.headline())
    assert r.frames_csv().splitlines() == ["frame,release_s,finish_s,latency_s,missed", "0,0.0,2.0,2.0,0",
                                           "1,1.0,4.0,3.0,0", "2,2.0,6.0,4.0,1", "3,3.0,8.0,5.0,1"]


def test_evaluate_runs_a_dag_plan_in_the_frames_des() -> None:
    b = load_board("orin-nano-8")
    g = random_graph(3, 6)
    c0 = dag_costs(DagProblem(g, b, 1.0, 1.0), next(iter(b.power_modes)))
    hm = heft_schedule(c0).makespan_s(c0)
    pr = DagProblem(g, b, period_s=2 * hm, deadline_s=1.5 * hm)
    p = make_dag("heft").plan(pr)
    r = evaluate(pr, p, "des", frames=FrameOptions(frames=5))
    assert isinstance(r, FrameResult) and r.name == g.name and len(r.iter_end_s) == 5
    c = dag_costs(pr, p.mode)
    assert np.allclose(r.latency_s, p.makespan_s(c), rtol=1e-12) and r.makespan_s == p.makespan_s(c)
    assert r.energy_per_frame_j == pytest.approx(p.energy_j(c), rel=1e-12)
    with pytest.raises(ValueError, match="frames DES"):
        evaluate(pr, p, "analytic")
    with pytest.raises(ValueError, match="DagProblem"):
        evaluate(_problem(), p, "des")
    # the comparison / sweep row: the DAG columns, then the headline every plan kind has
    row, files = plan_and_simulate(pr, FrameOptions(frames=5), "heft", {}, "<test>")
    assert list(row) == ["scheduler", *DAG_KEYS, *HEADLINE_KEYS]
    assert row["iterations"] == 5 and row["des_energy_mj"] == pytest.approx(1e3 * row["energy_j"] / 5)
    assert json.loads(files["plan.json"])["kind"] == "dag"
