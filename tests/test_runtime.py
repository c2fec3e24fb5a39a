"""The real runtime (runtime/): PS shard and worker processes over gloo on 127.0.0.1.

Every run here is 1 PS shard and 2 workers training a tiny mlp with one torch
thread per rank; each run costs a few seconds, mostly process start-up.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from experiments import run as entry
from hardware_profiles.errors import ConfigError
from runtime import quant, task
from runtime.launch import RuntimeFailure, run_local
from sim.quantization import packed_bytes

ROOT = Path(__file__).resolve().parents[1]
HETSIM = [sys.executable, "-m", "experiments.cli"]

try:
    import psutil
except ImportError:  # pragma: no cover - the dev environment has psutil
    psutil = None


def config(tmp: Path, name: str = "rt", **over: Any) -> Path:
    """A 2-worker, 1-shard config of a tiny mlp; ``over`` replaces top-level sections
    (job and runtime are merged key by key)."""
    cfg: dict[str, Any] = {
        "name": name, "seed": 0,
        "cluster": {"devices": [{"type": "this_machine", "count": 2}],
                    "ps": {"shards": 1, "type": "this_machine"},
                    "network": {"bandwidth_gbps": 13, "latency_us": 65}},
        "job": {"model": "mlp", "global_batch": 32, "iterations": 20, "sync": "bsp",
                "failure_timeout_s": 1.0},
        "scheduler": {"name": "equal"},
        "runtime": {"model_kwargs": {"in_features": 16, "hidden": [32], "classes": 4}, "lr": 0.2},
    }
    for k, v in over.items():
        if k in ("job", "runtime"):
            cfg[k].update(v)
        else:
            cfg[k] = v
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def descendants() -> list[Any]:
    """Live descendants of this process, less multiprocessing's resource tracker
    (one per interpreter, started by the first spawn, gone when pytest exits)."""
    if psutil is None:
        me = str(os.getpid())
        out = []
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    stat = (d / "stat").read_text()
                except OSError:
                    continue
                if stat.rsplit(")", 1)[1].split()[1] == me and "resource_tracker" not in \
                        (d / "cmdline").read_text(errors="replace"):
                    out.append(d.name)
        return out
    kids = []
    for k in psutil.Process().children(recursive=True):
        try:
            if k.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(k.cmdline()):
                kids.append(k)
        except psutil.NoSuchProcess:
            continue
    return kids


def run(path: Path, **kw: Any) -> Any:
    prep = entry.prepare(path, **kw)
    result = run_local(prep.spec, wall_timeout_s=60)
    assert descendants() == []
    return result


# ------------------------------------------------------------------ no processes
@pytest.mark.parametrize("bits", [2, 4, 8, 16, 32])
@pytest.mark.parametrize("n", [1, 7, 1000])
def test_pack_is_packed_bytes_and_round_trips(bits: int, n: int) -> None:
    x = torch.randn(n, generator=torch.Generator().manual_seed(n))
    buf = quant.pack(x, bits, torch.Generator().manual_seed(0))
    assert buf.dtype == torch.uint8 and buf.numel() == packed_bytes(n, bits)
    y = quant.unpack(buf, n, bits)
    step = (float(x.max() - x.min()) / ((1 << bits) - 1)) if bits < 32 else 0.0
    assert float((y - x).abs().max()) <= step * (1 + 1e-5) + 1e-6


@pytest.mark.parametrize("bits", [2, 4, 8, 16, 32])
def test_pack_many_is_the_packs_end_to_end_and_unpack_many_splits_them(bits: int) -> None:
    """Three tensors (7, 1 and 12 values): ``pack_many`` gives the bytes of their packs one
    after the other (the same noise, drawn in the same order), ``unpack_many`` each one's
    values back; one byte short is refused."""
    xs = [torch.randn(7), torch.randn(1), torch.randn(3, 4)]
    sizes = [int(packed_bytes(x.numel(), bits)) for x in xs]
    gen = torch.Generator().manual_seed(3)
    seq = torch.cat([quant.pack(x, bits, gen) for x in xs])  # one generator through all three
    assert torch.equal(quant.pack_many(xs, bits, torch.Generator().manual_seed(3)), seq)
    assert seq.numel() == sum(sizes)
    back = quant.unpack_many(seq, [7, 1, 12], bits)
    assert [b.numel() for b in back] == [7, 1, 12]
    each = [quant.unpack(p, x.numel(), bits) for p, x in zip(torch.split(seq, sizes), xs)]
    assert all(torch.equal(b, e) for b, e in zip(back, each))
    with pytest.raises(ValueError, match="expected"):
        quant.unpack_many(seq[:-1], [7, 1, 12], bits)


def test_unpack_at_32_bits_views_aligned_bytes_and_copies_the_others() -> None:
    x = torch.arange(6, dtype=torch.float32)
    buf = torch.cat([torch.zeros(1, dtype=torch.uint8), x.view(torch.uint8)])  # x's bytes at offset 1
    aligned = quant.unpack(buf[1:].clone(), 6, 32)
    assert torch.equal(aligned, x)
    view = buf[1:]  # starts off a 4-byte boundary: unpacked by copy, the same values
    assert view.storage_offset() % 4 == 1 and torch.equal(quant.unpack(view, 6, 32), x)
    whole = x.view(torch.uint8)
    assert quant.unpack(whole, 6, 32).data_ptr() == whole.data_ptr()  # aligned: a view, no copy


def test_layer_groups_put_a_shared_parameter_with_its_first_module() -> None:
    """Two Linears sharing one weight (tied), and a parameter the root holds itself:
    the shared weight goes with the first Linear, the root's parameter alone."""
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
            self.b.weight = self.a.weight
            self.scale = torch.nn.Parameter(torch.ones(1))

    from runtime import worker

    m = Tied()
    names = [n for n, _ in m.named_parameters()]
    assert names == ["scale", "a.weight", "a.bias", "b.bias"]  # the root's first; a shared one once
    assert worker.layer_groups(m) == [[0], [1, 2], [3]]
    with pytest.raises(ValueError, match="exactly once"):
        worker.Sender(list(m.parameters()), [[0, 1, 2, 3]], {}, 0, [[0, 1], [1], [2, 3]])


def test_stochastic_rounding_is_unbiased() -> None:
    x = torch.tensor([0.0, 0.3, 1.0])  # 0.3 sits between the two 2-bit levels 0 and 1/3
    gen = torch.Generator().manual_seed(1)
    mean = torch.stack([quant.unpack(quant.pack(x, 2, gen), 3, 2) for _ in range(4000)]).mean(0)
    assert torch.allclose(mean, x, atol=0.01)


def test_partition_balances_whole_tensors() -> None:
    # largest first to the lighter shard: 100 -> 0, 60 -> 1, 50 -> 1, 10 -> 0 (110 each)
    assert task.partition([100, 10, 60, 50], 2) == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="only 1 parameter tensors"):
        task.partition([5], 2)


# ---------------------------------------------------------------------- runs
@pytest.fixture(scope="module")
def bsp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The reference case: BSP, equal shares, 20 iterations (config path, result)."""
    path = config(tmp_path_factory.mktemp("bsp"))
    return path, run(path)


def test_bsp_loss_decreases_and_the_run_repeats_exactly(tmp_path: Path, bsp: tuple[Path, Any]) -> None:
    path, a = bsp
    assert a.evaluator == "runtime" and len(a.iter_end_s) == 20 and a.failures == []
    loss = a.iter_loss
    assert all(math.isfinite(v) for v in loss)
    assert sum(loss[-5:]) / 5 < 0.75 * sum(loss[:5]) / 5
    # equal shares: every iteration took 16 + 16 samples
    assert a.extra["runtime"]["worker_samples"] == [[16, 16]] * 20
    assert a.iter_samples == [32] * 20
    # BSP with fixed shares and seeded data is deterministic, and splitting the
    # parameters over two shards changes nothing but where they live
    b = run(config(tmp_path, name="two-shards",
                   cluster={**yaml.safe_load(path.read_text())["cluster"],
                            "ps": {"shards": 2, "type": "this_machine"}}))
    assert b.iter_loss == loss
    assert {p[0] for p in b.extra["runtime"]["pushes"]} == set(range(20))
    assert [d.id for d in b.devices if d.role == "ps"] == ["ps:0", "ps:1"]
    assert all(d.busy_s > 0 for d in b.devices)


def test_pipelined_push_sends_each_layer_as_backward_makes_it(bsp: tuple[Path, Any]) -> None:
    path, plain = bsp
    res = run(config(path.parent, name="pipelined", job={"pipeline": True}))
    # the same arithmetic: only when the bytes travel changes
    assert res.iter_loss == plain.iter_loss
    assert res.extra["runtime"]["pushed_bytes"] == plain.extra["runtime"]["pushed_bytes"]
    sends = [e["name"] for e in res.trace if e.get("ph") == "X" and e["pid"] == 1 and e["tid"] == 0]
    # one message per layer, the last layer's first (backward order): its weight 2 and bias 3, ...
    assert sends[:4] == ["push 2,3", "push 0,1"] * 2 and len(sends) == 2 * 20


def test_pipelined_parts_are_packed_on_the_backward_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Sender packs each gradient inside backward, on the thread running it, in the order
    backward makes them (mlp 16-32-4: bias 3, weight 2, bias 1, weight 0), and its own thread
    only sends, one message per layer: tensors 2 and 3 (the second Linear) end to end, then
    0 and 1; by the time backward returns all four are packed, at 8 bits each exactly
    ``packed_bytes(numel, 8)`` bytes."""
    import threading

    from runtime import wire, worker

    packed: list[tuple[int, int]] = []  # (numel, packing thread)
    real_pack = quant.pack

    def pack(x: torch.Tensor, bits: int, gen: torch.Generator | None = None) -> torch.Tensor:
        packed.append((x.numel(), threading.get_ident()))
        return real_pack(x, bits, gen)

    sent: list[tuple[int, int, int, int, int]] = []  # (shard, first tensor, count, bytes, sending thread)

    def send(dst: int, kind: int, iteration: int = 0, *fields: float, payload: Any = None) -> int:
        assert kind == wire.PUSH_PART and payload is not None
        sent.append((dst, int(fields[0]), int(fields[3]), payload.numel(), threading.get_ident()))
        return int(payload.numel())

    monkeypatch.setattr(quant, "pack", pack)
    monkeypatch.setattr(wire, "send", send)
    module, _ = task.build("mlp", 0, {"in_features": 16, "hidden": [32], "classes": 4})
    params = list(module.parameters())
    totals: dict[str, Any] = {"pushed_bytes": 0}
    assert worker.layer_groups(module) == [[0, 1], [2, 3]]
    sender = worker.Sender(params, [list(range(len(params)))], totals, 100, worker.layer_groups(module))
    try:
        sender.begin(0, 8, torch.Generator().manual_seed(0), 5)
        module(torch.randn(5, 16)).sum().backward()
        me = threading.get_ident()
        assert packed == [(4, me), (4 * 32, me), (32, me), (32 * 16, me)]  # before finish()
        sender.finish()
    finally:
        sender.close()
    assert [(d, k, c, n) for d, k, c, n, _ in sent] == [
        (0, 2, 2, packed_bytes(128, 8) + packed_bytes(4, 8)), (0, 0, 2, packed_bytes(512, 8) + packed_bytes(32, 8))]
    assert {t for *_, t in sent} == {sender.thread.ident} and sender.thread.ident != me
    assert totals["pushed_bytes"] == sum(n for _, _, _, n, _ in sent)


@pytest.mark.parametrize("bits", [8, 32])
def test_a_push_part_carries_its_tensors_end_to_end(bits: int) -> None:
    """A PUSH_PART of tensors 1 and 2 (of sizes 3, 5, 2) holds their packs end to end; the
    shard gets each back (8 bits: within one quantization step; 32 bits: exactly); a count
    running past the tensors or a payload of another size is refused."""
    from runtime import wire

    numels, gen = [3, 5, 2], torch.Generator().manual_seed(0)
    xs = [torch.linspace(-1, 1, 5), torch.tensor([0.5, -0.25])]
    payload = torch.cat([quant.pack(x, bits, gen) for x in xs])
    m = wire.Message(4, wire.header(wire.PUSH_PART, 7, 1, bits, 16, 2, nbytes=payload.numel()).tolist(), payload)
    got = wire.part_tensors(m, numels)
    assert [k for k, _ in got] == [1, 2]
    for (_, g), x in zip(got, xs):
        step = float(x.max() - x.min()) / 255 if bits == 8 else 0.0  # one level of that tensor
        assert g.shape == x.shape and float((g - x).abs().max()) <= step * 1.0001
    with pytest.raises(ValueError, match="tensors 1 .. 3 of 3"):
        wire.part_tensors(wire.Message(4, wire.header(wire.PUSH_PART, 7, 1, bits, 16, 3).tolist(), payload), numels)
    with pytest.raises(ValueError, match="expected"):
        wire.part_tensors(wire.Message(4, m.header, payload[:-1]), numels)


def _burn(cpu_s: float) -> None:
    """Spin this thread until it has used ``cpu_s`` more seconds of CPU."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        pass


@pytest.mark.skipif(not Path("/proc/self/task").is_dir() or not hasattr(os, "setpriority"),
                    reason="no /proc or no per-thread niceness: lower_priority does nothing here")
def test_lower_priority_nices_only_the_threads_of_that_name() -> None:
    import threading

    from runtime.affinity import lower_priority, threads_named

    ready, done = threading.Event(), threading.Event()

    def named(name: str) -> None:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
            f.write(name)
        ready.set()
        done.wait(10)

    own = os.getpriority(os.PRIO_PROCESS, 0)
    a = threading.Thread(target=named, args=("hetsim-nicetest",))
    a.start()
    ready.wait(10)
    ready.clear()
    b = threading.Thread(target=named, args=("hetsim-other",))
    b.start()
    ready.wait(10)
    try:
        assert threads_named("hetsim-nicetest") == [a.native_id]
        assert lower_priority("hetsim-nicetest", 0) == 0  # 0: left as it is
        assert os.getpriority(os.PRIO_PROCESS, a.native_id) == own
        assert lower_priority("hetsim-nicetest", min(own + 7, 19)) == 1
        assert os.getpriority(os.PRIO_PROCESS, a.native_id) == min(own + 7, 19)
        assert os.getpriority(os.PRIO_PROCESS, b.native_id) == own  # another name: untouched
        assert os.getpriority(os.PRIO_PROCESS, 0) == own  # and so is the caller
        assert lower_priority("no-such-thread", 19) == 0
    finally:
        done.set()
        a.join()
        b.join()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="no /proc: no per-thread CPU")
def test_cpu_meter_counts_every_thread_by_name() -> None:
    import threading

    from runtime.affinity import CpuMeter, thread_ids

    meter = CpuMeter()
    t = threading.Thread(target=_burn, args=(0.2,))
    t.start()
    _burn(0.1)
    t.join()
    # join returns once the thread's Python code is done; the OS thread may still be
    # listed in /proc/self/task for a moment: wait (2 s at most) until it has gone, so
    # that it has exited: its CPU stays in the total, not in its name's figure
    deadline = time.monotonic() + 2.0
    while t.native_id in thread_ids() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert t.native_id not in thread_ids()
    got = meter.read()
    assert got["cpu_s"] >= 0.3
    assert got["wall_s"] >= 0.2  # the two spun side by side at most
    assert got["threads_cpu_s"] is not None
    mine = sum(got["threads_cpu_s"].values())  # the live threads: this one's 0.1 s and a little
    assert 0.1 <= mine < 0.2


def test_window_cpu_interpolates_between_ticks_by_hand() -> None:
    from runtime.affinity import window_cpu

    ticks = [[10.0, 1.0], [12.0, 2.0], [13.0, 4.0], [15.0, 5.0]]  # wall clock, CPU so far
    assert window_cpu(ticks, 10.0, 15.0) == pytest.approx(4.0)
    # 11 s is halfway through the first step (1.5), 14 s halfway through the last (4.5)
    assert window_cpu(ticks, 11.0, 14.0) == pytest.approx(3.0)
    assert window_cpu(ticks, 12.0, 13.0) == pytest.approx(2.0)
    assert window_cpu(ticks, 12.5, 12.5) == pytest.approx(0.0)
    # an end a little past the last tick reads the last tick; further, or a start before
    # the first tick, or too few ticks: not covered
    assert window_cpu(ticks, 13.0, 15.04) == pytest.approx(1.0)
    assert window_cpu(ticks, 13.0, 15.5) is None
    assert window_cpu(ticks, 9.0, 12.0) is None
    assert window_cpu(ticks[:1], 10.0, 10.0) is None
    assert window_cpu(ticks, 13.0, 12.0) is None


def test_cpu_windows_by_hand() -> None:
    from runtime.affinity import cpu_windows

    # shard 0's clock starts at t0 = 100 s; iterations end at 1, 2, 3, 4 s after it
    ends = [1.0, 2.0, 3.0, 4.0]
    # a process created with the run (its first tick at 100 s) that used 0.5 CPU-s a second
    ticks = [[100.0 + t, 0.5 * t] for t in (0.0, 1.5, 2.5, 4.2)]
    cpu = {"w:0": {"cpu_s": 2.1, "ticks": ticks}, "w:1": None}
    got = cpu_windows(cpu, 1, 100.0, ends)
    # a warm-up of 1: the window is 1 s .. 4 s, 3 iterations, 1.5 CPU-s
    assert got["w:0"]["window"] == {"from_iteration": 1, "iterations": 3, "cpu_s": 1.5, "wall_s": 3.0}
    assert "ticks" not in got["w:0"] and got["w:0"]["cpu_s"] == 2.1 and got["w:1"] is None
    assert cpu["w:0"]["ticks"] == ticks  # the input is left as it was
    assert cpu_windows(cpu, 2, 100.0, ends)["w:0"]["window"]["cpu_s"] == pytest.approx(1.0)
    # no window: no warm-up, nothing after it, a resumed run, ticks that start too late
    for w, kw in ((0, {}), (4, {}), (1, {"resumed": True})):
        assert "window" not in cpu_windows(cpu, w, 100.0, ends, **kw)["w:0"]
    late = {"w:0": {"cpu_s": 1.0, "ticks": [[101.5, 0.0], [104.0, 1.0]]}}
    assert "window" not in cpu_windows(late, 1, 100.0, ends)["w:0"]


def test_cpu_meter_ticks_from_its_creation_and_keeps_a_bounded_record() -> None:
    from runtime.affinity import CpuMeter

    meter = CpuMeter()
    assert len(meter.ticks) == 1  # its start
    first = meter.ticks[0]
    for _ in range(2 * CpuMeter.MAX_TICKS):
        meter.tick()
    assert len(meter.ticks) <= CpuMeter.MAX_TICKS
    assert meter.ticks[0] == first  # thinned, the first kept
    times = [t for t, _ in meter.ticks]
    assert times == sorted(times)
    got = meter.read()
    assert got["ticks"][-1][0] >= times[-1]  # reading is the last tick


def test_quantized_pushes_carry_packed_bytes(tmp_path: Path) -> None:
    res = run(config(tmp_path, job={"quantization": 4, "iterations": 8},
                     runtime={"workers": [{"threads": 2, "affinity": [0]}], "ps_affinity": [0]}))
    emu = res.extra["runtime"]["emulation"]  # what the processes really ran with
    # gloo's event loop as the process made it (runtime.gloo_loop_nice 0, the default) where the OS says
    nice = [os.getpriority(os.PRIO_PROCESS, 0)] if Path("/proc/self/task").is_dir() else None
    assert emu["this_machine:0"] == {"threads": 2, "affinity": [0], "gloo_loop_nice": nice, "slowdown": []}
    assert emu["this_machine:1"]["threads"] == 1
    assert emu["ps:0"] == {"threads": 1, "affinity": [0], "gloo_loop_nice": nice}  # runtime.ps_affinity pins it
    cpu = res.extra["runtime"]["cpu"]  # every rank's CPU over its loop, gloo's threads apart
    assert set(cpu) == {"this_machine:0", "this_machine:1", "ps:0"}
    for proc, got in cpu.items():
        assert got["wall_s"] > 0 and got["cpu_s"] > 0, proc
        if Path("/proc/self/task").is_dir():
            assert "gloo_tcp_loop" in got["threads_cpu_s"], proc
    assert cpu["this_machine:0"]["compute_cpu_s"] > 0 and "compute_cpu_s" not in cpu["ps:0"]
    module, _ = task.build("mlp", 0, {"in_features": 16, "hidden": [32], "classes": 4})
    want = sum(packed_bytes(p.numel(), 4) for p in module.parameters())
    pushes = res.extra["runtime"]["pushes"]
    assert len(pushes) == 16
    assert {(bits, nbytes) for _, _, bits, nbytes in pushes} == {(4, want)}
    assert want < sum(4 * p.numel() for p in module.parameters()) / 7
    assert all(math.isfinite(v) for v in res.iter_loss)


def test_uneven_plan_through_the_cli(tmp_path: Path) -> None:
    cfg = config(tmp_path, job={"iterations": 6})
    plan = {"schema": 1, "scheduler": "by-hand", "ps_shards": ["ps:0"],
            "stages": [{"layers": [0, 5], "device_type": "this_machine",
                        "replicas": [{"device": "this_machine:0", "batch": 24},
                                     {"device": "this_machine:1", "batch": 8}]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "out"
    proc = subprocess.run([*HETSIM, "run", str(tmp_path / "plan.json"), "--config", str(cfg),
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["evaluator"] == "runtime" and summary["iterations"] == 6
    assert summary["runtime"]["worker_samples"] == [[24, 8]] * 6
    rows = (out / "iterations.csv").read_text().splitlines()
    assert rows[0] == "iteration,start_s,end_s,time_s,samples,loss" and len(rows) == 7
    assert all(r.split(",")[4] == "32" for r in rows[1:])
    names = {e["name"] for e in json.loads((out / "trace.json").read_text())["traceEvents"]}
    assert {"compute", "push", "pull", "wait", "apply"} <= names
    assert json.loads((out / "plan.json").read_text())["scheduler"] == "by-hand"
    assert json.loads((out / "config.json").read_text())["runtime"]["lr"] == 0.2


def test_the_same_entry_point_runs_under_torchrun(tmp_path: Path, bsp: tuple[Path, Any]) -> None:
    cfg, local = bsp
    out = tmp_path / "out"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3"]
    proc = subprocess.run([*torchrun, "-m", "runtime", str(cfg), "--iterations", "5", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["evaluator"] == "runtime" and summary["iterations"] == 5
    rows = (out / "iterations.csv").read_text().splitlines()[1:]
    # deterministic BSP: the first 5 iterations of the spawned 20-iteration run, bit for bit
    assert [float(r.split(",")[5]) for r in rows] == local.iter_loss[:5]


def test_hps_moves_work_off_a_slowed_worker(tmp_path: Path) -> None:
    res = run(config(tmp_path, job={"iterations": 10, "global_batch": 64},
                     scheduler={"name": "hps", "params": {"rebalance_every": 2}},
                     runtime={"model_kwargs": {"in_features": 64, "hidden": [256, 256], "classes": 8},
                              "workers": [{}, {"slowdown": 4.0}], "gloo_loop_nice": 19}))
    emu = res.extra["runtime"]["emulation"]
    assert emu["this_machine:1"]["slowdown"] == [[0.0, 4.0]]
    if Path("/proc/self/task").is_dir() and hasattr(os, "setpriority"):  # every rank's gloo loop niced
        assert {k: e["gloo_loop_nice"] for k, e in emu.items()} == dict.fromkeys(emu, [19])
    shares = res.extra["runtime"]["shares"]
    assert shares[0] == [32, 32]
    assert res.extra["rebalances"] >= 1
    fast, slow = res.extra["final_shares"].values()
    assert fast + slow == 64 and fast >= 2 * slow
    assert all(sum(s) == 64 for s in res.extra["runtime"]["worker_samples"])


@pytest.mark.parametrize("scheduler", ["equal", "hps"])
def test_a_killed_worker_is_detected_and_its_share_redistributed(tmp_path: Path, scheduler: str) -> None:
    res = run(config(tmp_path, job={"iterations": 10}, scheduler={"name": scheduler},
                     runtime={"workers": [{}, {"fail_at_iteration": 4}]}))
    assert len(res.iter_end_s) == 10 and "incomplete" not in res.extra
    [f] = res.failures
    assert f["worker"] == "this_machine:1" and f["share"] == 16
    assert f["detected_by"].startswith("no push of iteration 4 within 1.0 s")
    per = res.extra["runtime"]["worker_samples"]
    assert per[:4] == [[16, 16]] * 4
    assert per[4] == [16, 0]  # committed without the dead worker once the timeout passed
    assert per[5:] == [[32, 0]] * 5  # then the survivor takes the whole global batch
    gap = res.iter_end_s[4] - res.iter_end_s[3]
    assert gap >= 1.0  # the barrier waited the failure timeout


@pytest.mark.parametrize("sync,bound", [("asp", None), ("ssp", 1)])
def test_async_modes_apply_on_arrival_and_ssp_bounds_the_lead(tmp_path: Path, sync: str,
                                                              bound: int | None) -> None:
    res = run(config(tmp_path, job={"sync": sync, "staleness": 1, "iterations": 16},
                     runtime={"model_kwargs": {"in_features": 64, "hidden": [256, 256], "classes": 8},
                              "workers": [{}, {"slowdown": 6.0}]}))
    assert len(res.iter_end_s) == 16 and all(n >= 32 for n in res.iter_samples)
    lead = res.extra["staleness"]["max_ahead"]
    if bound is None:
        assert lead >= 3  # the fast worker runs ahead of the 6x slower one unchecked
    else:
        assert lead <= bound
    assert res.extra["staleness"]["max"] >= 1  # some pushes were computed on old parameters
    assert all(math.isfinite(v) for v in res.iter_loss)


def test_no_process_left_after_a_failed_run(tmp_path: Path) -> None:
    prep = entry.prepare(config(tmp_path))
    # kwargs the module refuses, past the launcher's check (entry.prepare refuses them):
    # every rank fails building its module
    prep.spec.model_kwargs = {"no_such_size": 3}
    with pytest.raises(RuntimeFailure, match="rank 0"):
        run_local(prep.spec, wall_timeout_s=60)
    assert descendants() == []


# ------------------------------------------------------------------ liveness
def test_runtime_sections_the_ranks_would_fail_on_are_refused_before_any_rank_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"runtime\.model_kwargs: the mlp module refuses them: .*no_such_size"):
        entry.prepare(config(tmp_path, runtime={"model_kwargs": {"no_such_size": 3}}))
    with pytest.raises(ConfigError, match=r"runtime\.model_kwargs: the mlp module refuses them: .*negative"):
        entry.prepare(config(tmp_path, runtime={"model_kwargs": {"in_features": 16, "hidden": [-5],
                                                                 "classes": 4}}))
    for bad, why in ((20, "less than or equal to 19"), (-1, "greater than or equal to 0"), ("x", "valid integer")):
        with pytest.raises(ConfigError, match=rf"runtime\.gloo_loop_nice: .*{why}"):
            entry.prepare(config(tmp_path, runtime={"gloo_loop_nice": bad}))
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"runtime\.device: cuda, but torch sees no CUDA device"):
            entry.prepare(config(tmp_path, runtime={"device": "cuda"}))
    assert descendants() == []


def test_every_worker_dead_is_detected_within_the_failure_timeout(tmp_path: Path) -> None:
    # failure_timeout_s 1.0; the run's limit is 60 s, whose expiry would be reported instead
    # ("the run took longer than 60 s") had the launcher waited for it
    prep = entry.prepare(config(tmp_path, job={"iterations": 50},
                                runtime={"workers": [{"fail_at_iteration": 2}, {"fail_at_iteration": 2}]}))
    with pytest.raises(RuntimeFailure, match=r"every worker has died \(2 of 2, worker 0 \(this_machine:0, "
                       r"rank 1\) killed by signal 9\); nobody is left to train"):
        run_local(prep.spec, wall_timeout_s=60)
    assert descendants() == []


def test_a_death_before_the_ranks_connected_is_detected_at_once(tmp_path: Path) -> None:
    prep = entry.prepare(config(tmp_path))
    # a CPU no machine has: pinning fails in worker 1 before it joins the process group,
    # where the other ranks would wait for it until the run's limit
    prep.spec.workers[1].affinity = [1 << 20]
    with pytest.raises(RuntimeFailure, match=r"worker 1 \(this_machine:1, rank 2\) exited with status 1 "
                       r"before the ranks had connected"):
        run_local(prep.spec, wall_timeout_s=60)
    assert descendants() == []


def test_ranks_that_do_not_connect_in_time_are_reported(tmp_path: Path, monkeypatch: Any) -> None:
    import runtime.launch as launch

    monkeypatch.setattr(launch, "CONNECT_TIMEOUT_S", 0.05)  # no spawned rank joins that fast
    prep = entry.prepare(config(tmp_path))
    with pytest.raises(RuntimeFailure, match=r"the ranks did not connect within 0\.05 s \(not joined: rank 0 "):
        run_local(prep.spec, wall_timeout_s=60)
    assert descendants() == []


def assert_sigint_leaves_nothing(args: list[str], ranks: int, start_s: float = 60.0,
                                 settle_s: float = 2.0) -> None:
    """Start ``hetsim ARGS``, wait for ``ranks`` child processes and ``settle_s`` more (the
    ranks are up and training), send Ctrl-C: exit 130 and no process left behind.
    SIGINT is reset to its default in the child (background shells ignore it)."""
    proc = subprocess.Popen([*HETSIM, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + start_s
    kids: list[Any] = []
    while time.monotonic() < deadline and len(kids) < ranks:
        kids = parent.children(recursive=True)
        time.sleep(0.2)
    time.sleep(settle_s)
    kids = parent.children(recursive=True)
    assert len(kids) >= ranks
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    _, alive = psutil.wait_procs(kids, timeout=5)
    assert alive == []


@pytest.mark.skipif(psutil is None, reason="needs psutil to list the run's processes")
def test_no_process_left_after_sigint(tmp_path: Path) -> None:
    assert_sigint_leaves_nothing(["run", str(config(tmp_path)), "--iterations", "1000000",
                                  "--out", str(tmp_path / "out")], ranks=3)


def test_bad_input_exits_2_with_one_line(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    proc = subprocess.run([*HETSIM, "run", str(plan)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--config" in proc.stderr
    bad = config(tmp_path, runtime={"lr": -1})
    proc = subprocess.run([*HETSIM, "run", str(bad)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "runtime.lr" in proc.stderr
    bad = config(tmp_path, runtime={"ps_affinity": [4096]})  # a CPU this machine does not have
    proc = subprocess.run([*HETSIM, "run", str(bad)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "runtime.ps_affinity" in proc.stderr and "CPU 4096 is not one" in proc.stderr


@pytest.mark.parametrize("runtime,field,message", [
    ({"workers": [{}, {"affinity": [0, 4096]}]}, "runtime.workers[1].affinity", "CPU 4096 is not one"),
    ({"ps_affinity": []}, "runtime.ps_affinity", "names no CPU"),
    ({"ps_affinity": [0, 0]}, "runtime.ps_affinity", "lists CPU 0 twice"),
])
def test_pinning_to_cpus_that_are_not_here_is_refused(tmp_path: Path, runtime: dict, field: str,
                                                       message: str) -> None:
    from hardware_profiles.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        entry.prepare(config(tmp_path, runtime=runtime))
    assert e.value.field == field and message in str(e.value)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_workers_compute_on_cuda(tmp_path: Path) -> None:
    res = run(config(tmp_path, job={"iterations": 10}, runtime={"device": "cuda"}))
    assert len(res.iter_end_s) == 10 and sum(res.iter_loss[-3:]) < sum(res.iter_loss[:3])


_FAULTS = """
import resource, sys, torch
from runtime.launch import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else False
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
counts = []
for i in range(6):  # a 64 MiB buffer, allocated, written and freed six times
    before = faults()
    torch.empty(1 << 26, dtype=torch.uint8).fill_(1)
    counts.append(faults() - before)
print(int(kept), min(counts[1:]))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_ranks_reuse_freed_memory_instead_of_faulting_it_in_again() -> None:
    """A 64 MiB block is above glibc's largest mmap threshold (32 MiB): by default every
    allocation maps fresh pages (16384 page faults of 4 KiB each time); after
    keep_freed_memory (what every rank does first) later allocations reuse the heap."""
    pages = (1 << 26) // os.sysconf("SC_PAGE_SIZE")
    got = {}
    for mode in ("default", "keep"):
        out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parents[1])
        got[mode] = [int(x) for x in out.stdout.split()]
    assert got["keep"][0] == 1
    assert got["default"][1] >= 0.9 * pages
    assert got["keep"][1] < 0.05 * pages
