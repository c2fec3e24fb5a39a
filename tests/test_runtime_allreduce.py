"""``hetsim run`` of all-reduce plans (runtime/collective.py, runtime/coordinator.py): a
coordinator and workers reducing over gloo on 127.0.0.1, a tiny mlp, one torch thread
per rank; each run costs a few seconds, mostly process start-up."""

from __future__ import annotations

import math
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from experiments import run as entry
from hardware_profiles.errors import ConfigError
from runtime import task, wire
from runtime.collective import bucket_params

ROOT = Path(__file__).resolve().parents[1]
KW = {"in_features": 16, "hidden": [32], "classes": 4}
PARAM_BYTES = 4 * (16 * 32 + 32 + 32 * 4 + 4)  # the tiny mlp's fp32 parameters


def config(tmp: Path, name: str = "ar", workers: int = 2, **over: Any) -> Path:
    cfg: dict[str, Any] = {
        "name": name, "seed": 0,
        "cluster": {"devices": [{"type": "this_machine", "count": workers}],
                    "network": {"bandwidth_gbps": 13, "latency_us": 65}},
        "job": {"model": "mlp", "global_batch": 16 * workers, "iterations": 12, "sync": "allreduce",
                "failure_timeout_s": 1.0},
        "scheduler": {"name": "equal"},
        "runtime": {"model_kwargs": KW, "lr": 0.2},
    }
    for k, v in over.items():
        cfg[k].update(v) if k in ("job", "runtime") else cfg.__setitem__(k, v)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(path: Path) -> Any:
    return entry.execute(entry.prepare(path, timeout_s=300), None)


def test_a_control_channel_frames_headers_and_payloads() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    tx, rx = wire.Channel(a, 0), wire.Channel(b, 5)
    tx.send(wire.FIGURES, 7, 64, 0.5, 0.0125, payload=torch.tensor([1, 2, 255], dtype=torch.uint8))
    tx.send(wire.ABORT, 8)
    m = rx.recv()
    assert (m.src, m.kind, m.iteration) == (5, wire.FIGURES, 7)
    assert m.header[wire.F_A:wire.F_A + 3] == [64.0, 0.5, 0.0125] and m.header[wire.F_NBYTES] == 3.0
    assert m.payload is not None and m.payload.tolist() == [1, 2, 255]
    m = rx.recv()
    assert (m.kind, m.iteration, m.payload) == (wire.ABORT, 8, None)
    tx.close()
    with pytest.raises(ConnectionError, match="rank 5 closed by peer"):
        rx.recv()
    rx.close()


def test_a_control_channel_reassembles_a_message_that_arrives_in_pieces() -> None:
    a, b = socket.socketpair()
    tx, rx = wire.Channel(a, 0), wire.Channel(b, 2)
    data = wire.header(wire.REPORT, 3, nbytes=5).numpy().tobytes() + bytes([9, 8, 7, 6, 5])

    def dribble() -> None:
        for i in range(0, len(data), 7):  # 85 bytes, 7 at a time
            a.sendall(data[i:i + 7])
            time.sleep(0.002)

    t = threading.Thread(target=dribble)
    t.start()
    m = rx.recv()
    t.join()
    assert (m.src, m.kind, m.iteration, m.payload.tolist()) == (2, wire.REPORT, 3, [9, 8, 7, 6, 5])
    tx.close()
    rx.close()


def _client(port: int, rank: int | None) -> wire.Channel:
    ch = wire.Channel(socket.create_connection(("127.0.0.1", port)), 0)
    if rank is not None:
        ch.send(wire.HELLO, rank)
    return ch


def test_the_control_server_hears_who_connected_and_refuses_who_did_not() -> None:
    server = wire.ControlServer("127.0.0.1")
    silent = _client(server.port, None)  # connects, never says who it is
    stranger = _client(server.port, 9)  # not one of the ranks
    one, two = _client(server.port, 3), _client(server.port, 4)
    accepting = threading.Thread(target=server.accept, args=([3, 4, 5], 1.0))  # rank 5 never connects
    accepting.start()
    accepting.join(timeout=30.0)
    assert not accepting.is_alive() and sorted(server.channels) == [3, 4]
    # rank 3 stalls halfway through a message: rank 4's still comes through
    one.sock.sendall(wire.header(wire.FIGURES, 2, 16).numpy().tobytes()[:40])
    two.send(wire.FIGURES, 2, 24)
    m = server.get(timeout_s=5.0)
    assert m is not None and (m.src, m.kind, m.iteration, m.header[wire.F_A]) == (4, wire.FIGURES, 2, 24.0)
    one.sock.sendall(wire.header(wire.FIGURES, 2, 16).numpy().tobytes()[40:])
    m = server.get(timeout_s=5.0)
    assert m is not None and (m.src, m.header[wire.F_A]) == (3, 16.0)
    server.send(3, wire.CONTROL, 4, 16)
    assert (one.recv().kind, server.get(timeout_s=0.05)) == (wire.CONTROL, None)
    with pytest.raises(RuntimeError, match="rank 5 never connected"):
        server.send(5, wire.CONTROL, 4)
    server.close()  # ends both connections and their readers
    assert not any(t.is_alive() for t in server.readers)
    with pytest.raises(ConnectionError):
        two.recv()
    for ch in (silent, stranger, one, two):
        ch.close()


def test_buckets_are_the_simulators() -> None:
    module, _ = task.build("mlp", 0, KW)
    # parameters: fc1 weight, bias, fc2 weight, bias; one bucket of 25 MiB holds them all,
    # buckets of 200 bytes cut after fc2 (528 bytes) and again after fc1 (2176)
    assert bucket_params(module, 25 * 2**20) == [[0, 1, 2, 3]]
    assert bucket_params(module, 200) == [[2, 3], [0, 1]]


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return run(config(tmp_path_factory.mktemp("ar"), job={"pipeline": False}))


def test_the_bucketed_reducer_and_ddp_train_alike(tmp_path: Path, plain: Any) -> None:
    a = plain
    assert a.evaluator == "runtime" and len(a.iter_end_s) == 12 and a.failures == []
    assert a.iter_samples == [32] * 12 and a.extra["runtime"]["worker_samples"] == [[16, 16]] * 12
    loss = a.iter_loss
    assert all(math.isfinite(v) for v in loss) and sum(loss[-4:]) < 0.75 * sum(loss[:4])
    # every worker reduced its whole gradient once an iteration, as fp32
    assert a.extra["runtime"]["reduced_bytes"] == {"this_machine:0": 12 * PARAM_BYTES,
                                                   "this_machine:1": 12 * PARAM_BYTES}
    assert {d.id for d in a.devices} == {"this_machine:0", "this_machine:1"}  # no PS
    # DDP (pipelined): the same means of the same gradients, the same training to the bit
    b = run(config(tmp_path, name="ddp", job={"pipeline": True}))
    assert b.iter_loss == loss and b.extra["runtime"]["ddp"] is True
    assert b.extra["runtime"]["reduced_bytes"] == a.extra["runtime"]["reduced_bytes"]
    spans = [e for e in b.trace if e.get("ph") == "X" and e["name"].startswith("allreduce")]
    assert len(spans) == 2 * 12  # a bucket a worker an iteration, timed by the comm hook


def test_uneven_shares_are_weighted_and_fp16_halves_the_bytes(tmp_path: Path) -> None:
    # shares 24 and 8 (a plan of the proportional scheduler on a faster first worker
    # would do the same); fp16 on the wire
    res = run(config(tmp_path, job={"pipeline": True, "quantization": 16},
                     runtime={"model_kwargs": KW, "lr": 0.2, "workers": [{}, {"slowdown": 3.0}]},
                     scheduler={"name": "hps", "params": {"rebalance_every": 1}}))
    assert len(res.iter_end_s) == 12 and all(n == 32 for n in res.iter_samples)
    shares = res.extra["runtime"]["shares"]
    assert shares[0] == [16, 16] and res.extra["final_shares"]["this_machine:0"] > 16
    assert all(math.isfinite(v) for v in res.iter_loss)
    assert all(b == 12 * PARAM_BYTES // 2 for b in res.extra["runtime"]["reduced_bytes"].values())


@pytest.mark.parametrize("pipeline", [False, True])
def test_a_killed_worker_leaves_the_group_and_its_share_is_spread(tmp_path: Path, pipeline: bool) -> None:
    res = run(config(tmp_path, workers=3, job={"pipeline": pipeline},
                     runtime={"model_kwargs": KW, "lr": 0.2, "workers": [{}, {"fail_at_iteration": 4}, {}]}))
    assert len(res.iter_end_s) == 12 and "incomplete" not in res.extra
    [f] = res.failures
    assert f["worker"] == "this_machine:1" and f["share"] == 16
    assert f["detected_by"].startswith("no word of iteration 4 within 1.0 s")
    per = res.extra["runtime"]["worker_samples"]
    assert per[:4] == [[16, 16, 16]] * 4
    # iteration 4 done again by the survivors; 5's word was out already; from 6 the spread shares
    assert per[4:6] == [[16, 0, 16]] * 2 and per[6:] == [[24, 0, 24]] * 6
    assert res.extra["runtime"]["reforms"] == 1
    assert res.iter_end_s[4] - res.iter_end_s[3] >= 1.0  # the failure timeout passed first


@pytest.mark.parametrize("over,field", [
    ({"job": {"quantization": 8}}, "job.quantization"),
    ({"runtime": {"model_kwargs": KW, "ps_affinity": [0]}}, "runtime.ps_affinity"),
])
def test_what_the_runtime_does_not_run_is_refused(tmp_path: Path, over: dict, field: str) -> None:
    out = subprocess.run([sys.executable, "-m", "experiments.cli", "run", str(config(tmp_path, **over))],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2 and field in out.stderr and out.stderr.strip().count("\n") == 0


def test_hetsim_run_gives_each_worker_its_own_local_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker w computes on GPU w modulo the GPUs (runtime.task.compute_device); the
    coordinator, rank 0, computes on none. Three workers on two GPUs: 0, 1, then 0 again."""
    from runtime.launch import local_rank_of

    spec = entry.prepare(config(tmp_path, workers=3)).spec
    assert spec.first_worker == 1
    assert [local_rank_of(spec, r) for r in range(spec.world_size)] == [0, 0, 1, 2]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [task.compute_device("cuda", local_rank_of(spec, r)) for r in range(1, 4)] == ["cuda:0", "cuda:1", "cuda:0"]


def test_an_allreduce_plan_on_cuda_wants_a_gpu_per_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # two workers, one GPU seen: nccl would refuse the group; one line naming the field
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match=r"runtime\.device: cuda with job\.sync: allreduce needs a GPU per "
                                          r"worker .*: 2 workers, 1 GPU\(s\) visible"):
        entry.prepare(config(tmp_path, runtime={"model_kwargs": KW, "device": "cuda"}))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert entry.prepare(config(tmp_path, runtime={"model_kwargs": KW, "device": "cuda"})).spec.device == "cuda"


def test_an_injected_failure_on_cuda_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # nccl collectives block on a dead peer: the group would never be re-formed
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(var, raising=False)
    cuda = {"model_kwargs": KW, "device": "cuda"}
    with pytest.raises(ConfigError, match=r"runtime\.workers\[1\]\.fail_at_iteration: .*hang the others in nccl"):
        entry.prepare(config(tmp_path, runtime={**cuda, "workers": [{}, {"fail_at_iteration": 3}]}))
    with pytest.raises(ConfigError, match=r"dynamics: a worker failure .*hang the others in nccl"):
        entry.prepare(config(tmp_path, runtime=cuda, dynamics=[{"worker": 1, "at_s": 1.0, "fail": True}]))
    # on cpu (gloo) the same failure is emulated
    assert entry.prepare(config(tmp_path, runtime={"model_kwargs": KW, "workers": [{}, {"fail_at_iteration": 3}]}))
