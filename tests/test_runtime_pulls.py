"""Pipelined pulls in the runtime (``runtime.pipeline_pulls``, runtime/pulls.py).

The runs are 2 workers training a tiny mlp with one torch thread per rank, as in
tests/test_runtime.py (a few seconds each, mostly process start-up).
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.pulls import Puller
from tests.test_runtime import HETSIM, ROOT, config, run


def pipelined(tmp: Path, name: str, shards: int = 2, **over: Any) -> Path:
    """The tests' mlp config with pushes and pulls pipelined over ``shards`` shards."""
    cluster = {"devices": [{"type": "this_machine", "count": 2}],
               "ps": {"shards": shards, "type": "this_machine"},
               "network": {"bandwidth_gbps": 13, "latency_us": 65}}
    job = {"pipeline": True, **over.pop("job", {})}
    runtime = {"pipeline_pulls": True, **over.pop("runtime", {})}
    return config(tmp, name=name, cluster=cluster, job=job, runtime=runtime, **over)


def receiver_spans(res: Any) -> dict[str, list[str]]:
    """Names of each worker's receiver-thread spans, in time order, by device."""
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in res.trace
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    out: dict[str, list[tuple[float, str]]] = {}
    for e in res.trace:
        tname = names.get((e.get("pid"), e.get("tid")), "")
        if e.get("ph") == "X" and tname.endswith(" receiver"):
            out.setdefault(tname.removesuffix(" receiver"), []).append((e["ts"], e["name"]))
    return {dev: [n for _, n in sorted(spans)] for dev, spans in out.items()}


def test_pipelined_pulls_give_the_same_losses_tensor_by_tensor(tmp_path: Path) -> None:
    whole = run(config(tmp_path, name="whole"))
    res = run(pipelined(tmp_path, "pulls"))
    # per-tensor application is the whole-pull arithmetic elementwise: bit-identical
    assert res.iter_loss == whole.iter_loss and len(res.iter_end_s) == 20
    assert res.extra["runtime"]["pipeline_pulls"] is True
    assert res.extra["runtime"]["pulled_bytes"] == whole.extra["runtime"]["pulled_bytes"]
    spans = receiver_spans(res)
    assert sorted(spans) == ["this_machine:0", "this_machine:1"]
    for names in spans.values():
        # every one of the mlp's 4 tensors (2 weights, 2 biases) arrives once per version 0..19,
        # in messages of the tensors a shard had ready ("pull 0,1": two in one)
        got = [int(i) for n in names for i in n.removeprefix("pull ").split(",")]
        assert sorted(got) == sorted(list(range(4)) * 20)
        assert 2 * 20 <= len(names) <= 4 * 20  # 2 shards: at least a message from each per pull


def test_a_killed_worker_with_pipelined_pulls(tmp_path: Path) -> None:
    res = run(pipelined(tmp_path, "kill", job={"iterations": 10},
                        runtime={"workers": [{}, {"fail_at_iteration": 4}]}))
    assert len(res.iter_end_s) == 10 and "incomplete" not in res.extra
    [f] = res.failures
    assert f["worker"] == "this_machine:1" and f["share"] == 16
    per = res.extra["runtime"]["worker_samples"]
    assert per[:4] == [[16, 16]] * 4 and per[4] == [16, 0] and per[5:] == [[32, 0]] * 5


@pytest.mark.parametrize("over,why", [
    ({"job": {"pipeline": False}}, "needs job.pipeline: true"),
    ({"job": {"sync": "asp"}}, "bsp only, not asp"),
])
def test_pipelined_pulls_refuse_what_they_do_not_cover(tmp_path: Path, over: dict[str, Any], why: str) -> None:
    path = pipelined(tmp_path, "bad", **over)
    proc = subprocess.run([*HETSIM, "run", str(path)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "runtime.pipeline_pulls" in proc.stderr and why in proc.stderr


def test_pipelined_pulls_refuse_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the receiver takes values straight into the parameters over gloo, which moves CPU memory
    from experiments import run as entry
    from hardware_profiles.errors import ConfigError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ConfigError, match=r"runtime\.pipeline_pulls: is built for runtime\.device: cpu only"):
        entry.prepare(pipelined(tmp_path, "gpu", runtime={"device": "cuda"}))


def test_forward_waits_for_each_layers_parameters_only() -> None:
    """No processes: the receiver thread is replaced by flagging tensors by hand."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    params = list(module.parameters())  # 0, 1: first layer; 2, 3: last layer
    totals: dict[str, Any] = {"pulled_bytes": 0}
    puller = Puller(module, params, [[0, 1, 2, 3]], totals, timeout_s=30.0, max_spans=10, receive=False)
    ran: list[str] = []
    for name, mod in module.named_children():
        mod.register_forward_hook(lambda _m, _a, _o, name=name: ran.append(name))
    out: list[torch.Tensor] = []
    th = threading.Thread(target=lambda: out.append(module(torch.ones(1, 3))))
    th.start()
    puller.ready[0].set()
    puller.ready[1].set()
    deadline = time.monotonic() + 10
    while ran != ["0", "1"] and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert ran == ["0", "1"] and th.is_alive()  # the first layer ran; the last waits for its tensors
    puller.ready[2].set()
    time.sleep(0.05)
    assert ran == ["0", "1"]  # its bias still missing
    puller.ready[3].set()
    th.join(timeout=10)
    assert ran == ["0", "1", "2"] and out[0].shape == (1, 2)
    # forward's waits are counted (left out of compute): it waited through both sleeps
    # (0.15 s), less the instant between the ReLU's hook and the wait starting
    assert puller.waited >= 0.1
