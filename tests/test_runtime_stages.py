"""Multi-stage (layer-placement) plans in the real runtime (runtime/stages.py, runtime/stage_worker.py).

The key case: a pipeline trained for a few iterations gives the per-iteration
losses and final parameters of one process training the same module on the
same micro-batches with the same SGD. Runs are tiny mlps (one torch thread a
rank) on 127.0.0.1; each costs a few seconds, mostly process start-up.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from experiments import run as entry
from hardware_profiles.errors import ConfigError
from runtime import checkpoint, stages, task
from runtime.launch import RuntimeFailure, run_local
from sim import zoo
from tests.test_runtime import assert_sigint_leaves_nothing, descendants, psutil

ROOT = Path(__file__).resolve().parents[1]
HETSIM = [sys.executable, "-m", "experiments.cli"]
MLP = {"in_features": 16, "hidden": [32, 32], "classes": 4}  # the zoo mlp's five layers, small


def setup(tmp: Path, stage_list: list[tuple[tuple[int, int], list[int]]], devices: int, model: str = "mlp",
          kwargs: dict[str, Any] | None = None, iterations: int = 4, micro: int = 4, shards: int = 2,
          **runtime: Any) -> tuple[Path, Path]:
    """A config (``devices`` this_machine devices, ``shards`` PS shards) and a plan of
    ``stage_list``: ((first, end) layers, each replica's batch), devices in order."""
    cfg = {
        "name": "stages", "seed": 0,
        "cluster": {"devices": [{"type": "this_machine", "count": devices}],
                    "ps": {"shards": shards, "type": "this_machine"},
                    "network": {"bandwidth_gbps": 13, "latency_us": 65}},
        "job": {"model": model, "global_batch": 32, "iterations": iterations, "sync": "bsp",
                "failure_timeout_s": 5.0},
        "scheduler": {"name": "equal"},
        "runtime": {"model_kwargs": kwargs or MLP, "lr": 0.2, "micro_batches": micro,
                    "checkpoint_every": iterations, **runtime},
    }
    path = tmp / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    k, out = 0, []
    for (a, b), batches in stage_list:
        reps = []
        for n in batches:
            reps.append({"device": f"this_machine:{k}", "batch": n})
            k += 1
        out.append({"layers": [a, b], "device_type": "this_machine", "replicas": reps})
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({"schema": 1, "scheduler": "by-hand", "ps_shards": [f"ps:{i}" for i in range(shards)],
                                "stages": out}))
    return path, plan


def run_pipeline(cfg: Path, plan: Path, out: Path) -> tuple[Any, list[torch.Tensor]]:
    """Run the plan; the result and each PS shard's final parameter slice (its last checkpoint)."""
    prep = entry.prepare(plan, config=cfg)
    entry.attach_checkpoints(prep, out, resume=False)
    result = run_local(prep.spec, wall_timeout_s=240)
    assert descendants() == []
    m = checkpoint.read_manifest(str(out / "checkpoint"))
    return result, [checkpoint.load_shard(m, k)["flat"] for k in range(prep.spec.n_shards)]


def reference(model: str, kwargs: dict[str, Any], first_shares: list[int], micro: int, iterations: int,
              lr: float = 0.2, seed: int = 0, shards: int = 2) -> tuple[list[float], list[torch.Tensor]]:
    """One process: the first stage's data (replica r's share drawn as worker r's), the global
    batch in ``micro`` micro-batches, each micro-batch's mean loss times its share of the
    batch backpropagated and accumulated, then plain SGD. Per-iteration losses and
    the final parameters as the shards hold them."""
    torch.set_num_threads(1)
    module, _ = task.build(model, seed, kwargs)
    module.train()
    teacher = task.Teacher(model, seed, kwargs)
    params = list(module.parameters())
    B = sum(first_shares)
    losses = []
    for t in range(iterations):
        xs, ys = [], []
        for r, n in enumerate(first_shares):
            x, y = teacher.batch(n, task.iteration_generators(seed, r, t)[0])
            xs.append(x if isinstance(x, tuple) else (x,))
            ys.append(y)
        xt = tuple(torch.cat(parts) for parts in zip(*xs))  # each input (ids, dense, ...) in sample order
        y = torch.cat(ys)
        module.zero_grad(set_to_none=False)
        total = 0.0
        for lo, hi in stages.ranges(stages.even_split(B, micro)):
            loss = task.loss_fn(task.call(module, tuple(v[lo:hi] for v in xt) if teacher.tuple_input
                                          else xt[0][lo:hi]), y[lo:hi])
            (loss * ((hi - lo) / B)).backward()
            total += loss.item() * (hi - lo)
        with torch.no_grad():
            for p in params:
                assert p.grad is not None
                p.add_(p.grad, alpha=-lr)
        losses.append(total / B)
    flat = [p.detach().reshape(-1) for p in params]
    return losses, [torch.cat([flat[i] for i in idx]) for idx in task.partition([f.numel() for f in flat], shards)]


# ------------------------------------------------------------------ no processes
def test_one_f_one_b_order() -> None:
    # 3 stages, 4 micro-batches: stage 0 runs 2 forwards ahead, the last alternates
    assert stages.one_f_one_b(0, 3, [0, 1, 2, 3]) == [
        ("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)]
    assert stages.one_f_one_b(2, 3, [0, 1, 2, 3]) == [
        ("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]
    # a replica without samples in micro-batch 1 skips it
    assert stages.one_f_one_b(1, 3, [0, 2]) == [("F", 0), ("F", 2), ("B", 0), ("B", 2)]


def test_layers_map_onto_blocks_and_a_cut_inside_one_is_refused() -> None:
    module, _ = task.build("resnet18", 0, {"classes": 4, "size": 16})
    names = [ly.name for ly in zoo.get("resnet18").layers]
    bs = stages.blocks("resnet18", module)
    first = names.index("layer2.0.conv1")
    # the cut before layer2.0 falls between blocks; the stage's parameters are its blocks'
    [(a0, b0), (a1, b1)] = stages.stage_blocks("resnet18", module, names, [(0, first), (first, len(names))], "p.json")
    assert bs[a1].name == "layer2.0" and (a0, b1) == (0, len(bs)) and b0 == a1
    n0 = len(stages.stage_params(module, bs[a0:b0]))
    assert n0 + len(stages.stage_params(module, bs[a1:b1])) == len(list(module.parameters()))
    # ...one layer later it would split the residual block (its shortcut needs the block's input)
    with pytest.raises(ConfigError, match=r"stages\[1\]\.layers.*inside 'layer2\.0'") as e:
        stages.stage_blocks("resnet18", module, names, [(0, first + 1), (first + 1, len(names))], "p.json")
    assert str(e.value).startswith("p.json") and "\n" not in str(e.value)


def test_routing_by_sample_ranges(tmp_path: Path) -> None:
    from runtime.stage_worker import Replica

    cfg, plan = setup(tmp_path, [((0, 2), [20, 12]), ((2, 5), [16, 16])], devices=4, micro=2)
    spec = entry.prepare(plan, config=cfg).spec
    r0, r1, q0, q1 = (Replica(spec, w) for w in range(4))
    # micro-batches [0, 16) and [16, 32); ranks: shards 0, 1, then workers 2..5
    assert [r0.chunk(0), r0.chunk(1), r1.chunk(0), r1.chunk(1)] == [(0, 16), (16, 20), None, (20, 32)]
    assert r0.peers(1, 0) == [(4, (0, 16))] and r0.peers(1, 1) == [(5, (16, 20))]
    assert q1.peers(0, 1) == [(2, (16, 20)), (3, (20, 32))] and q0.peers(0, 1) == []


# ---------------------------------------------------------------------- runs
def test_three_stage_mlp_matches_single_process_training(tmp_path: Path) -> None:
    cfg, plan = setup(tmp_path, [((0, 2), [32]), ((2, 4), [32]), ((4, 5), [32])], devices=3)
    res, shards = run_pipeline(cfg, plan, tmp_path / "out")
    check_three_stage_mlp(res, shards)
    st = res.extra["runtime"]["stages"]
    assert [s["layers"] for s in st] == [[0, 2], [2, 4], [4, 5]]
    # the middle stage, 4 iterations: activations on and gradients back, 32 samples x 32 floats
    assert st[1]["boundary_sent_bytes"] == [4 * 2 * (32 * 32 * 4)]
    names = {e["name"].split(" ")[0] for e in res.trace if e.get("ph") == "X"}
    assert {"forward", "backward", "recv", "pull", "push", "apply"} <= names


def test_a_stage_without_parameters_pulls_and_pushes_nothing(tmp_path: Path) -> None:
    # the middle stage is the first ReLU alone
    cfg, plan = setup(tmp_path, [((0, 1), [32]), ((1, 2), [32]), ((2, 5), [32])], devices=3)
    res, shards = run_pipeline(cfg, plan, tmp_path / "out")
    check_three_stage_mlp(res, shards)
    assert res.extra["runtime"]["pulled_bytes"]["this_machine:1"] == 0
    assert res.extra["runtime"]["pushed_bytes"]["this_machine:1"] == 0


def check_three_stage_mlp(res: Any, shards: list[torch.Tensor]) -> None:
    """``res`` and ``shards`` are those of one process training the mlp on the same micro-batches."""
    ref_loss, ref_shards = reference("mlp", MLP, [32], micro=4, iterations=4)
    # Bit for bit: the same kernels on the same micro-batches with one thread, each
    # parameter's gradient accumulated in the same micro-batch order, one replica a
    # stage (its B / b_r and the PS's weight are exactly 1), fp32 pushes
    assert res.iter_loss == ref_loss
    for mine, ref in zip(shards, ref_shards, strict=True):
        assert torch.equal(mine, ref)
    assert res.iter_samples == [32] * 4


def test_replicated_stages_route_samples_replica_to_replica(tmp_path: Path) -> None:
    cfg, plan = setup(tmp_path, [((0, 2), [20, 12]), ((2, 5), [16, 16])], devices=4, micro=2, iterations=3)
    res, shards = run_pipeline(cfg, plan, tmp_path / "out")
    ref_loss, ref_shards = reference("mlp", MLP, [20, 12], micro=2, iterations=3)
    # Not bit-exact: the stage-0 replicas compute parts of a micro-batch (other GEMM
    # shapes), and each replica's gradient is scaled by B / b_r and back at the PS
    assert res.iter_loss == pytest.approx(ref_loss, rel=1e-5)
    for mine, ref in zip(shards, ref_shards, strict=True):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-6)
    assert res.extra["runtime"]["worker_samples"] == [[20, 12, 16, 16]] * 3


def test_a_killed_stage_process_fails_the_run_and_leaves_nothing(tmp_path: Path) -> None:
    cfg, plan = setup(tmp_path, [((0, 2), [32]), ((2, 5), [32])], devices=2, iterations=6,
                      workers=[{}, {"fail_at_iteration": 2}])
    prep = entry.prepare(plan, config=cfg)
    with pytest.raises(RuntimeFailure, match=r"stage 1 replica this_machine:1 \(rank 3\) exited with status -9"):
        run_local(prep.spec, wall_timeout_s=120)
    assert descendants() == []
    proc = subprocess.run([*HETSIM, "run", str(plan), "--config", str(cfg), "--out", str(tmp_path / "o")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1].startswith("hetsim: run failed: stage 1 replica this_machine:1")


@pytest.mark.skipif(psutil is None, reason="needs psutil to list the run's processes")
def test_no_process_left_after_sigint(tmp_path: Path) -> None:
    cfg, plan = setup(tmp_path, [((0, 2), [32]), ((2, 5), [32])], devices=2, iterations=1_000_000,
                      checkpoint_every=0)
    assert_sigint_leaves_nothing(["run", str(plan), "--config", str(cfg), "--out", str(tmp_path / "out")],
                                 ranks=4, start_s=90.0, settle_s=3.0)


def test_unmappable_plans_exit_2_with_one_line(tmp_path: Path) -> None:
    names = [ly.name for ly in zoo.get("resnet18").layers]
    cut = names.index("layer2.0.conv1") + 1
    cfg, plan = setup(tmp_path, [((0, cut), [32]), ((cut, len(names)), [32])], devices=2, model="resnet18",
                      kwargs={"classes": 4, "size": 16})
    proc = subprocess.run([*HETSIM, "run", str(plan), "--config", str(cfg)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert str(plan) in proc.stderr and "stages[1].layers" in proc.stderr and "'layer2.0'" in proc.stderr
    # a module of another depth than the plan's model: its layer indices mean other modules
    cfg, plan = setup(tmp_path, [((0, 2), [32]), ((2, 5), [32])], devices=2, kwargs={**MLP, "hidden": [32]})
    proc = subprocess.run([*HETSIM, "run", str(plan), "--config", str(cfg)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert str(cfg) in proc.stderr and "runtime.model_kwargs" in proc.stderr


@pytest.mark.parametrize("model,kw,tables", [
    # the zoo's layer lists: 26 embeddings (+ wide_deep's wide table) then the MLP
    ("ctr_dnn", {"fields": 26, "rows": 1000, "dim": 4, "dense": 3, "hidden": [16, 8]}, 26 * 1000 * 4),
    ("wide_deep", {"fields": 26, "rows": 1000, "dim": 4, "dense": 3, "hidden": [16, 8, 8]},
     26 * 1000 * 4 + 26 * 1000),
])
def test_the_embedding_stage_pulls_and_pushes_touched_rows_only(tmp_path: Path, model: str, kw: dict[str, Any],
                                                                 tables: int) -> None:
    n_emb = 26 + (model == "wide_deep")
    n_layers = len(zoo.get(model).layers)
    cfg, plan = setup(tmp_path, [((0, n_emb), [32]), ((n_emb, n_layers), [32])], devices=2, model=model,
                      kwargs=kw, iterations=3, micro=2)
    res, shards = run_pipeline(cfg, plan, tmp_path / "out")
    ref_loss, ref_shards = reference(model, kw, [32], micro=2, iterations=3)
    # Bit for bit with dense SGD: an untouched row's gradient is 0 and p - lr * 0 == p
    assert res.iter_loss == ref_loss
    for mine, ref in zip(shards, ref_shards, strict=True):
        assert torch.equal(mine, ref)
    pulled = res.extra["runtime"]["pulled_bytes"]["this_machine:0"]
    assert pulled <= 3 * 4 * (32 * tables // 1000)  # at most 32 rows of each table an iteration
    assert pulled < 4 * tables / 10


def test_a_resnet_pipeline_matches_single_process_training(tmp_path: Path) -> None:
    kw = {"classes": 4, "size": 16}
    names = [ly.name for ly in zoo.get("resnet18").layers]
    relu, cut = names.index("relu"), names.index("layer3.0.conv1")
    # the second stage starts with the stem's in-place ReLU
    cfg, plan = setup(tmp_path, [((0, relu), [32]), ((relu, cut), [32]), ((cut, len(names)), [32])], devices=3,
                      model="resnet18", kwargs=kw, iterations=2, micro=2)
    res, shards = run_pipeline(cfg, plan, tmp_path / "out")
    ref_loss, ref_shards = reference("resnet18", kw, [32], micro=2, iterations=2)
    # BatchNorm normalises each micro-batch in both; its running statistics stay in the stages
    assert res.iter_loss == ref_loss
    for mine, ref in zip(shards, ref_shards, strict=True):
        assert torch.equal(mine, ref)


def test_a_pipeline_resumes_from_its_checkpoint_as_if_never_stopped(tmp_path: Path) -> None:
    stage_list = [((0, 2), [32]), ((2, 4), [32]), ((4, 5), [32])]
    out = tmp_path / "out"
    # rank 0 dies after committing iteration 3 and saving its part of checkpoint 4: the last
    # complete checkpoint is 2
    cfg, plan = setup(tmp_path, stage_list, devices=3, iterations=6, checkpoint_every=2, crash_after_iteration=3)
    prep = entry.prepare(plan, config=cfg)
    entry.attach_checkpoints(prep, out, resume=False)
    with pytest.raises(RuntimeFailure, match="rank 0"):
        run_local(prep.spec, wall_timeout_s=120)
    assert descendants() == []
    assert checkpoint.read_manifest(str(out / "checkpoint")).version == 2
    cfg, plan = setup(tmp_path, stage_list, devices=3, iterations=6, checkpoint_every=2)
    prep = entry.prepare(plan, config=cfg)
    entry.attach_checkpoints(prep, out, resume=True)
    res = run_local(prep.spec, wall_timeout_s=120)
    assert descendants() == []
    ref_loss, ref_shards = reference("mlp", MLP, [32], micro=4, iterations=6)
    assert res.iter_loss == ref_loss and res.extra["resumed"][0]["from_iteration"] == 2
    m = checkpoint.read_manifest(str(out / "checkpoint"))
    assert m.version == 6
    for k, ref in enumerate(ref_shards):
        assert torch.equal(checkpoint.load_shard(m, k)["flat"], ref)


def test_replicas_of_the_embedding_stage_push_their_own_rows(tmp_path: Path) -> None:
    kw = {"fields": 26, "rows": 1000, "dim": 4, "dense": 3, "hidden": [16, 8]}
    cfg, plan = setup(tmp_path, [((0, 26), [20, 12]), ((26, 31), [32])], devices=3, model="ctr_dnn", kwargs=kw,
                      iterations=3, micro=2)
    res, shards = run_pipeline(cfg, plan, tmp_path / "out")
    ref_loss, ref_shards = reference("ctr_dnn", kw, [20, 12], micro=2, iterations=3)
    # the PS averages two row-sparse gradients scaled by B / b_r: rounding only
    assert res.iter_loss == pytest.approx(ref_loss, rel=1e-5)
    for mine, ref in zip(shards, ref_shards, strict=True):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-6)
    pulled = res.extra["runtime"]["pulled_bytes"]
    assert pulled["this_machine:0"] <= 3 * 26 * 20 * 4 * 4 and pulled["this_machine:1"] <= 3 * 26 * 12 * 4 * 4


def test_a_placement_schedulers_plan_runs_through_the_cli(tmp_path: Path) -> None:
    cfg = {
        "name": "heterps", "seed": 0,
        "cluster": {"devices": [{"type": "cpu-8c", "count": 2}, {"type": "t4", "count": 2}],
                    "ps": {"shards": 1, "type": "cpu-16c"}, "network": {"bandwidth_gbps": 25, "latency_us": 50}},
        "job": {"model": "ctr_dnn", "global_batch": 64, "iterations": 3, "sync": "bsp"},
        # a floor the CPUs alone cannot meet: the dense layers go to the T4s
        "objective": {"minimize": "cost", "throughput_min": 60000},
        "scheduler": {"name": "exact", "params": {"time_limit_s": 10}},
        "runtime": {"model_kwargs": {"fields": 26, "rows": 1000, "dim": 4, "dense": 3, "hidden": [16, 8]}},
    }
    path = tmp_path / "heterps.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = tmp_path / "out"
    proc = subprocess.run([*HETSIM, "run", str(path), "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    plan = json.loads((out / "plan.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert len(plan["stages"]) > 1 and summary["iterations"] == 3
    assert [s["layers"] for s in summary["runtime"]["stages"]] == [s["layers"] for s in plan["stages"]]
    # the embedding tables went to a CPU type, with the first stage
    assert plan["stages"][0]["device_type"].startswith("cpu") and plan["stages"][0]["layers"][1] >= 26
