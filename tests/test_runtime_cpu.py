"""The runtime CPU model (calibration/runtime_cpu.py) and its calibration (experiments/runtime_calibration.py).

Hand-computed cases: the sharing count, the DES's message ends, a fit that must
recover the coefficients that generated its samples, the scales, and the
profile round trip; the end-to-end use by `hetsim validate` is in
tests/test_validate.py.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from calibration import runtime_cpu
from calibration.runtime_cpu import Figures, RuntimeCpuModel
from experiments import runtime_calibration, validate
from hardware_profiles.errors import ConfigError
from sim.cluster import Host, Placement
from sim.emulation import CpuScale, RuntimeEmulation
from tests.test_hosts import _approx, _hosted, _run

REPO = Path(__file__).resolve().parents[1]


def _cluster(cores: int, placement: dict[str, Placement]):  # type: ignore[no-untyped-def]
    prob = _hosted(1, [Host("h", cores)], [Placement(0)])
    return dataclasses.replace(prob.cluster, placement=tuple(placement.items()))


def test_sharing_counts_the_processes_on_a_processs_cores() -> None:
    pinned = {"w0": Placement(0, 1, (0,)), "w1": Placement(0, 1, (1,)), "w2": Placement(0, 1, (0,)),
              "ps": Placement(0, 1, (0,))}
    cl = _cluster(2, pinned)
    # core 0 holds w0, w2 and the shard; core 1 w1 alone
    assert [runtime_cpu.sharing(cl, d) for d in pinned] == [3.0, 1.0, 3.0, 3.0]
    # an unpinned process counts half on each of two cores; seen from it, a process pinned to
    # one of its cores is there half of its cores: 1 + 1/2
    mixed = {"a": Placement(0, 1, None), "b": Placement(0, 1, (0,)), "c": Placement(0, 2, (0,))}
    cl = _cluster(2, mixed)
    assert runtime_cpu.sharing(cl, "a") == pytest.approx(1 + 0.5 + 2 * 0.5)
    assert runtime_cpu.sharing(cl, "b") == pytest.approx(1 + 0.5 + 2)
    # a process on another host shares nothing
    other = {"a": Placement(0, 1, (0,)), "b": Placement(1, 1, (0,))}
    prob = _hosted(1, [Host("h", 1), Host("g", 1)], [Placement(0)])
    cl = dataclasses.replace(prob.cluster, placement=tuple(other.items()))
    assert runtime_cpu.sharing(cl, "a") == 1.0


def test_des_counts_each_processs_message_ends() -> None:
    # one worker and the shard on a 1-core host with copy_Bps 1e3 (tests/test_hosts.py): each
    # iteration one pull and one push, so 2 ends for each of them
    prob = _hosted(1, [Host("h", 1, 0.0, 1e3)], [Placement(0)], shard=Placement(0), iterations=3)
    r = _run(prob)
    assert r.extra["host_message_ends"] == {"cpu:0": 6, "ps:0": 6}
    figs = runtime_cpu.figures(prob, r)
    # per iteration: the worker 1 s of compute and 2 s of copies; the shard ~0 s and 2 s
    assert figs["cpu:0"] == Figures("worker", _approx(1e3), _approx(2e3), 2.0, 2.0)  # type: ignore[arg-type]
    assert figs["ps:0"].role == "ps" and figs["ps:0"].transport_ms == _approx(2e3)
    assert figs["ps:0"].messages == 2.0 and figs["ps:0"].sharing == 2.0


def test_predict_and_scales_by_hand() -> None:
    m = RuntimeCpuModel(worker=(1.0, 0.5, 2.0, 0.1), ps=(0.5, 0.0, 1.0, 1.0))
    w = Figures("worker", compute_ms=10.0, transport_ms=4.0, messages=2.0, sharing=3.0)
    s = Figures("ps", compute_ms=2.0, transport_ms=8.0, messages=6.0, sharing=3.0)
    # worker: 10 + 0.5 x 10 x 2 + 2 x 4 + 0.1 x 2 = 28.2; shard: 1 + 8 + 6 = 15
    assert m.predict_ms(w) == pytest.approx(28.2)
    assert m.predict_ms(s) == pytest.approx(15.0)
    # worker: compute 10 -> 20 (x 2), copies 4 -> 8.2 (x 2.05 = 2 x 1.025); shard: compute 2 -> 1
    # (x 0.5), copies 8 -> 14 (x 1.75 = 0.5 x 3.5)
    got = m.scales({"w": w, "s": s})
    assert got["w"] == (pytest.approx(2.0), pytest.approx(1.025))
    assert got["s"] == (pytest.approx(0.5), pytest.approx(3.5))
    # no copies: the message term joins the compute (10 + 10 + 0.2 = 20.2 over 10)
    assert m.scales({"x": Figures("worker", 10.0, 0.0, 2.0, 3.0)}) == {"x": (pytest.approx(2.02), 1.0)}
    # a part predicted 0 (no compute coefficients): scaled as a whole, (0 + 8.2) / 14
    z = RuntimeCpuModel(worker=(0.0, 0.0, 2.0, 0.1), ps=(1.0, 0.0, 1.0, 0.0))
    assert z.scales({"w": w}) == {"w": (pytest.approx(8.2 / 14), 1.0)}
    # no simulated CPU: left out
    assert m.scales({"z": Figures("worker", 0.0, 0.0, 0.0, 1.0)}) == {}


def test_copy_scale_stretches_only_the_copies() -> None:
    # the lone worker of tests/test_hosts.py (1 core, copy_Bps 1e3: 1 s of compute, a 1 s copy
    # each way): a compute scale of 2 doubles both; a copies scale of 1.5 on top makes each
    # copy 3 s: 2 + 3 + 3 = 8 s an iteration
    prob = _hosted(1, [Host("h", 1, 0.0, 1e3)], [Placement(0)], iterations=3)
    r = _run(prob, emulation=RuntimeEmulation(cpu_scales=(("cpu:0", CpuScale(2.0, 1.5)),)))
    assert r.iteration_times() == _approx([8.0] * 3)
    assert r.extra["host_cpu_s"] == _approx({"cpu:0": 6.0, "cpu:0 transport": 18.0})
    scaled = RuntimeEmulation().scaled({"cpu:0": (2.0, 1.5)})
    assert scaled.cpu_scale("cpu:0") == CpuScale(2.0, 1.5) and scaled.cpu_scale("ps:0") == CpuScale(1.0, 1.0)
    with pytest.raises(ValueError, match="CPU scales of 'cpu:0' must be > 0"):
        RuntimeEmulation(cpu_scales=(("cpu:0", CpuScale(1.0, 0.0)),))


def test_fit_recovers_the_coefficients_that_made_the_samples() -> None:
    truth = RuntimeCpuModel(worker=(0.9, 0.2, 1.5, 0.05), ps=(0.6, 0.0, 0.7, 0.8), allreduce=(0.9, 0.2, 0.6, 0.3))
    figs = [Figures(role, c, t, n, m) for role in ("worker", "ps")
            for c, t, n, m in [(10, 4, 2, 1), (10, 4, 2, 3), (2, 1, 22, 3), (25, 5, 9, 2), (5, 0.5, 2, 2),
                               (27, 1.3, 2, 3)]]
    got = runtime_cpu.fit([(f, truth.predict_ms(f)) for f in figs], note="n")
    assert got.worker == pytest.approx(truth.worker, abs=1e-9)
    assert got.ps == pytest.approx(truth.ps, abs=1e-9)
    assert got.note == "n"
    # without samples of a role, that role is the DES's own accounting
    only = runtime_cpu.fit([(f, truth.predict_ms(f)) for f in figs if f.role == "worker"])
    assert only.ps == (1.0, 0.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="> 0"):
        runtime_cpu.fit([(figs[0], 0.0)])


def test_all_reduce_workers_have_coefficients_of_their_own() -> None:
    """Samples of the three roles made by three coefficient sets, the all-reduce workers'
    compute terms the workers': the fit recovers each; without all-reduce samples their
    workers are priced with the PS workers' coefficients."""
    truth = RuntimeCpuModel(worker=(0.9, 0.2, 1.5, 0.05), ps=(0.6, 0.0, 0.7, 0.8), allreduce=(0.9, 0.2, 2.5, 0.3))
    figs = [Figures(role, c, t, n, m) for role in ("worker", "ps", "allreduce")
            for c, t, n, m in [(10, 4, 2, 1), (10, 4, 2, 3), (2, 1, 22, 3), (25, 5, 9, 2), (5, 0.5, 2, 2),
                               (27, 1.3, 2, 3)]]
    got = runtime_cpu.fit([(f, truth.predict_ms(f)) for f in figs])
    assert got.allreduce == pytest.approx(truth.allreduce, abs=1e-9)
    assert got.worker == pytest.approx(truth.worker, abs=1e-9)
    f = Figures("allreduce", 10.0, 4.0, 0.0, 1.0)
    assert got.predict_ms(f) == pytest.approx(0.9 * 10 + 2.5 * 4, abs=1e-9)
    no_ar = runtime_cpu.fit([(f, truth.predict_ms(f)) for f in figs if f.role != "allreduce"])
    assert no_ar.allreduce is None and no_ar.predict_ms(f) == pytest.approx(0.9 * 10 + 1.5 * 4, abs=1e-9)
    assert RuntimeCpuModel.from_json(json.loads(json.dumps(got.to_json()))) == got
    assert "allreduce" not in no_ar.to_json()  # a profile without it reads as before


def test_all_reduce_compute_is_the_workers_and_only_the_rest_is_fitted() -> None:
    """All-reduce samples whose copies grow with their compute (transport = compute / 2) and
    cost 0.7 compute + 1.8 transport = 1.6 compute: any split fits their total, so a free fit
    cannot tell them apart. With workers measured at compute x1 (and copies x2) the
    all-reduce workers keep compute x1 and their transport takes the rest: 0.6 compute =
    c x 0.5 compute, c = 1.2."""
    workers = [(Figures("worker", c, t, 0.0, 1.0), 1.0 * c + 2.0 * t) for c, t in [(10, 2), (4, 6), (20, 1)]]
    ar = [(Figures("allreduce", c, c / 2, 0.0, 1.0), 1.6 * c) for c in (8.0, 12.0, 30.0)]
    got = runtime_cpu.fit(workers + ar)
    assert got.worker == pytest.approx((1.0, 0.0, 2.0, 0.0), abs=1e-9)
    assert got.allreduce == pytest.approx((1.0, 0.0, 1.2, 0.0), abs=1e-9)
    # without worker samples there is nothing to share: the four terms are fitted freely
    alone = runtime_cpu.fit(ar)
    assert alone.worker == (1.0, 0.0, 1.0, 0.0)
    assert alone.predict_ms(ar[0][0]) == pytest.approx(ar[0][1], rel=1e-9)


def test_leave_one_out_predicts_each_config_from_the_others_only() -> None:
    truth = RuntimeCpuModel(worker=(1.0, 0.1, 2.0, 0.0), ps=(1.0, 0.0, 1.0, 0.5))
    samples = []
    for cfg, (c, t, n, m) in enumerate([(10, 4, 2, 1), (10, 4, 2, 3), (2, 1, 22, 3), (25, 5, 9, 2),
                                        (5, 0.5, 4, 2), (27, 1.3, 2, 3)]):
        for role in ("worker", "ps"):
            f = Figures(role, c, t, n, m)
            # config 0's real CPU is twice the model's: only a fit without it predicts it at -50%
            samples.append((f"c{cfg}|equal|{role}", f, truth.predict_ms(f) * (2.0 if cfg == 0 else 1.0)))
    loo = runtime_calibration.leave_one_out(samples)
    assert set(loo) == {s[0] for s in samples}
    assert loo["c0|equal|worker"] == pytest.approx(-0.5, abs=1e-9)
    assert loo["c0|equal|ps"] == pytest.approx(-0.5, abs=1e-9)
    # the others, fitted with config 0 among their samples, are off the model
    assert max(abs(e) for lab, e in loo.items() if not lab.startswith("c0|")) > 1e-3


def test_iteration_rows_simulate_each_run_again_with_the_fit_without_its_config() -> None:
    truth = RuntimeCpuModel(worker=(0.9, 0.2, 1.5, 0.05), ps=(0.6, 0.0, 0.7, 0.8))
    cfg = "c9_mlp_2w_asp_pipe"
    # the other configs' samples follow the model exactly: the fit without c9 is the model
    samples = [(f"other{i}|equal|{role}", f, truth.predict_ms(f)) for role in ("worker", "ps")
               for i, f in enumerate(Figures(role, c, t, n, m) for c, t, n, m in
                                     [(10, 4, 2, 1), (10, 4, 2, 3), (2, 1, 22, 3), (25, 5, 9, 2), (5, 0.5, 2, 2)])]
    # c9's own sample is far off: the fit with it is not the model
    samples += [(f"{cfg}|equal|worker", Figures("worker", 9.0, 4.0, 6.0, 2.0), 100.0)]
    host = Host("local", 2, 0.0)
    again = validate.resimulate(runtime_calibration.CONFIG_DIR / f"{cfg}.yaml", "equal", host, {"t": truth})
    real = again["t"] * 1.25  # the real run 25% slower than the model's prediction
    run = {"config": cfg, "scheduler": "equal", "cores": 2, "background_threads": 0.0, "real_s": real}
    fitted = runtime_cpu.fit([(f, r) for _, f, r in samples])
    [row] = runtime_calibration.iteration_rows([run], samples, fitted)
    assert row["real_ms"] == round(1e3 * real, 2) and row["des_ms"] == round(1e3 * again[""], 2)
    assert row["left_out_ms"] == round(1e3 * again["t"], 2) and row["left_out_error"] == "-20.0%"
    des_err, fit_err, left_err = row["_errors"]
    assert left_err == pytest.approx(1 / 1.25 - 1, abs=1e-12)
    assert des_err == pytest.approx(again[""] / real - 1, abs=1e-12)
    assert fit_err != pytest.approx(left_err)  # the fit with c9's sample predicts otherwise


def test_model_json_round_trip_and_bad_fields() -> None:
    m = RuntimeCpuModel(worker=(1.0, 0.5, 2.0, 0.1), ps=(0.5, 0.0, 1.0, 1.0), note="x")
    assert RuntimeCpuModel.from_json(json.loads(json.dumps(m.to_json()))) == m
    for bad, where in [({"ps": [1.0, -1.0, 0.0, 0.0]}, "runtime_cpu.ps.1"),
                       ({"ps": [1.0, True, 0.0, 0.0]}, "runtime_cpu.ps.1"),
                       ({"worker": [1.0, float("inf"), 0.0, 0.0]}, "runtime_cpu.worker.1"),
                       ({"worker": [1.0, 2.0]}, "runtime_cpu.worker"),
                       ({"terms": ["compute"]}, "runtime_cpu.terms"),
                       ({"terms": None}, "runtime_cpu.terms"),
                       ({"extra": 1}, "runtime_cpu.extra")]:
        with pytest.raises(ValueError, match=where.replace(".", r"\.")):
            RuntimeCpuModel.from_json(m.to_json() | bad)
    for not_an_object in ([1, 2], "x", 3):
        with pytest.raises(ValueError, match="runtime_cpu"):
            RuntimeCpuModel.from_json(not_an_object)


def test_calibration_writes_the_model_into_a_profile_and_validate_reads_it(tmp_path: Path) -> None:
    src = REPO / "hardware_profiles" / "measured" / "this_machine.json"
    prof = tmp_path / "mine.json"
    shutil.copy(src, prof)
    prof.write_text(prof.read_text().replace('"name": "this_machine"', '"name": "mine"', 1))
    data = json.loads(prof.read_text())
    del data["network"]["runtime_cpu"]
    prof.write_text(json.dumps(data))
    assert runtime_cpu.models_of(_placed_problem(tmp_path)) == {}  # a profile without one
    m = RuntimeCpuModel(worker=(1.0, 0.25, 2.0, 0.0), ps=(1.0, 0.0, 1.0, 0.5), note="test")
    runtime_calibration.write_model(prof, m)
    data = json.loads(prof.read_text())
    assert data["network"]["runtime_cpu"] == m.to_json()
    # every other field as it was
    before = json.loads(src.read_text())
    assert {k: v for k, v in data.items() if k not in ("network", "name")} == {
        k: v for k, v in before.items() if k not in ("network", "name")}
    assert {k: v for k, v in data["network"].items() if k != "runtime_cpu"} == {
        k: v for k, v in before["network"].items() if k != "runtime_cpu"}
    # every process whose profile it is finds the model
    assert runtime_cpu.models_of(_placed_problem(tmp_path)) == {"mine:0": m, "ps:0": m}
    # a malformed model is a one-line error naming the file and the field, when the profile loads
    data["network"]["runtime_cpu"]["worker"] = [1, 2]
    prof.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"mine\.json: network\.runtime_cpu\.worker"):
        _placed_problem(tmp_path)


def test_bad_runtime_cpu_in_a_profile_exits_2_with_one_line(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from experiments import cli

    src = REPO / "hardware_profiles" / "measured" / "this_machine.json"
    data = json.loads(src.read_text())
    data["name"] = "mine"
    data["network"]["runtime_cpu"]["ps"] = [1.0, 0.0, float("nan"), 0.0]
    (tmp_path / "mine.json").write_text(json.dumps(data))
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: t\nprofiles: [.]\ncluster:\n  devices: [{type: mine, count: 1}]\n"
                   "  ps: {shards: 1, type: mine}\n  network: {bandwidth_gbps: 10}\n"
                   "job: {model: mlp, global_batch: 8, iterations: 2}\n")
    assert cli.main(["simulate", str(cfg), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mine.json" in err[0] and "network.runtime_cpu.ps" in err[0], err


def test_scaling_an_emulation_multiplies_its_scales() -> None:
    emu = RuntimeEmulation(cpu_scales=(("cpu:0", CpuScale(2.0, 3.0)),))
    got = emu.scaled({"cpu:0": (1.5, 0.5)})
    assert got.cpu_scale("cpu:0") == CpuScale(3.0, 1.5)
    assert validate.with_cpu_scaled(emu, {"cpu:0": 4.0}).cpu_scale("cpu:0") == CpuScale(8.0, 3.0)


def test_the_rerun_charges_each_process_the_prediction() -> None:
    # two workers and the shard on one 2-core host with copies (BSP, static plan): the DES
    # rerun with the scales gives every process exactly the CPU the model predicted
    prob = _hosted(2, [Host("h", 2, 0.0, 1e3)], [Placement(0, 1, (0,)), Placement(0, 1, (1,))],
                   shard=Placement(0, 1, (0,)), iterations=3)
    first = runtime_cpu.figures(prob, _run(prob))
    m = RuntimeCpuModel(worker=(0.9, 0.2, 1.5, 0.3), ps=(1.0, 0.0, 0.6, 2.0))
    again = runtime_cpu.figures(prob, _run(prob, emulation=RuntimeEmulation().scaled(m.scales(first))))
    for dev, f in first.items():
        assert again[dev].sim_ms == pytest.approx(m.predict_ms(f), rel=1e-9), dev
        assert again[dev].messages == f.messages


def test_messages_are_counted_only_where_they_go_through_the_host() -> None:
    # a host without copies, wake-ups or serial links: messages never touch it, none counted
    r = _run(_hosted(1, [Host("h", 1)], [Placement(0)], shard=Placement(0), iterations=2))
    assert "host_message_ends" not in r.extra


def test_a_model_with_no_coefficients_leaves_the_des_as_it_is() -> None:
    zero = RuntimeCpuModel(worker=(0.0, 0.0, 0.0, 0.0), ps=(0.0, 0.0, 0.0, 0.0))
    assert zero.scales({"w": Figures("worker", 10.0, 4.0, 2.0, 1.0)}) == {}


def _placed_problem(folder: Path):  # type: ignore[no-untyped-def]
    """A one-worker problem on profile ``mine`` (in ``folder``), both ranks on one host."""
    from sim.config import config_from_dict
    from sim.problem import build_problem

    cfg = config_from_dict({
        "name": "t", "profiles": [str(folder)],
        "cluster": {"devices": [{"type": "mine", "count": 1}], "ps": {"shards": 1, "type": "mine"},
                    "network": {"bandwidth_gbps": 10}},
        "job": {"model": "mlp", "global_batch": 8, "iterations": 2}}, "<test>")
    prob = build_problem(cfg, folder, "<test>")
    cl = prob.cluster
    return dataclasses.replace(prob, cluster=dataclasses.replace(
        cl, hosts=(Host("h", 2),), placement=((cl.devices[0].id, Placement(0)), (cl.shards[0].id, Placement(0)))))


def test_every_calibration_config_runs_its_ranks_with_the_calibration_threads() -> None:
    """fresh_machine fits the runtime CPU model only for a fresh profile measured with these
    threads; the configs must use them, and all-reduce jobs are among them."""
    from experiments.run import read_config
    from runtime.spec import parse_options

    configs = sorted(runtime_calibration.CONFIG_DIR.glob("*.yaml"))
    threads = {c.stem: parse_options(read_config(c)[1], str(c)).threads for c in configs}
    assert set(threads.values()) == {runtime_calibration.CALIBRATION_THREADS}
    assert sum(read_config(c)[0].job.sync == "allreduce" for c in configs) >= 2


def test_fresh_machine_fits_the_runtime_cpu_model_once_and_resumes(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """With the calibration runs stubbed (each config gives a worker whose real CPU is 2 x its
    compute + 1 x its transport), fresh_machine runs every config once, stores the fit in the
    profile and, asked again, runs nothing; with the model removed and two runs kept on disk,
    it runs only the others."""
    prof = tmp_path / "here.json"
    data = json.loads((REPO / "hardware_profiles" / "measured" / "this_machine.json").read_text())
    del data["network"]["runtime_cpu"]
    data["name"] = "here"
    prof.write_text(json.dumps(data))
    configs = sorted(runtime_calibration.CONFIG_DIR.glob("*.yaml"))
    ran: list[str] = []

    def fake_validate(c: Path, out: Path, fresh_profile: Path) -> validate.Validation:
        assert fresh_profile == prof
        ran.append(c.stem)
        v = validate.Validation(str(c), c.stem, [], None, {})
        validate.write_files(out, [v])
        return v

    def fake_samples(v: validate.Validation) -> list[tuple[str, Figures, float]]:
        k = 1 + configs.index(next(c for c in configs if c.stem == v.name))
        f = Figures("worker", 10.0 * k, 3.0 + k % 3, 2.0, 1.0 + k % 2)
        return [(f"{v.name}|equal|w0", f, 2.0 * f.compute_ms + f.transport_ms)]

    monkeypatch.setattr(validate, "validate", fake_validate)
    monkeypatch.setattr(runtime_calibration, "samples_of", fake_samples)
    got = runtime_calibration.fresh_machine(prof, 1)
    assert ran == [c.stem for c in configs]
    assert got.network is not None and got.network.runtime_cpu is not None
    assert got.network.runtime_cpu.worker == pytest.approx((2.0, 0.0, 1.0, 0.0), abs=1e-9)
    assert got.network.runtime_cpu.ps == (1.0, 0.0, 1.0, 0.0) and got.network.runtime_cpu.allreduce is None
    ran.clear()
    runtime_calibration.fresh_machine(prof, 1)
    assert ran == []  # complete: reused as it is
    data = json.loads(prof.read_text())
    del data["network"]["runtime_cpu"]
    prof.write_text(json.dumps(data))
    runs = tmp_path / "here.calibration"
    for c in configs[2:]:
        shutil.rmtree(runs / c.stem)
    runtime_calibration.fresh_machine(prof, 1)
    assert ran == [c.stem for c in configs[2:]]
    # other torch threads than the calibration configs': the profile without a model
    ran.clear()
    other = tmp_path / "two.json"
    data["measurement"]["raw"]["threads"] = 2
    data["name"] = "two"
    other.write_text(json.dumps(data))
    assert runtime_calibration.fresh_machine(other, 2).network.runtime_cpu is None and ran == []


def test_resimulated_samples_come_from_the_des_as_it_is_now(tmp_path: Path) -> None:
    """A recorded BSP run (c1: three workers, one shard) whose recorded figures are stale
    (one bogus process): with ``resimulate`` its samples pair the recorded real CPU with
    the DES's figures again, for every process. Its recorded drift x1.25 slows every
    process's work and copies alike, so each figure is 1.25 times the one without drift
    (BSP: every worker computes its share every iteration, whatever the timing) and the
    message ends are the same."""
    cfg = runtime_calibration.CONFIG_DIR / "c1_mlp_3w_bsp.yaml"
    devs = ["this_machine:0", "this_machine:1", "this_machine:2", "ps:0"]
    real = {d: 10.0 + k for k, d in enumerate(devs)}

    def recorded(drift: dict[str, float] | None) -> validate.Validation:
        diag = {"host": {"cores": 2, "background_threads": 0.0}, "drift": drift,
                "runtime_cpu": {"figures": {devs[0]: dataclasses.asdict(Figures("worker", 1.0, 1.0, 1.0, 1.0))}},
                "cpu_per_iteration": {"processes": {d: {"real_ms": r} for d, r in real.items()}}}
        metrics = {"iteration_time_mean_s": {"sim": 0.05, "real": 0.04, "rel_error": 0.25}}
        return validate.Validation(str(cfg), cfg.stem, [validate.SchedulerRun("equal", metrics, diag)], None, {})

    (tmp_path / cfg.stem).mkdir()
    (tmp_path / cfg.stem / "validation.json").write_text(json.dumps(recorded({"compute": 1.25}).to_json()))
    saved = runtime_calibration.saved_samples(tmp_path, [cfg.stem])
    assert saved is not None and [(lab, f.compute_ms, r) for lab, f, r in saved[0]] == [
        (f"c1_mlp_3w_bsp|equal|{devs[0]}", 1.0, 10.0)]  # as recorded
    again = runtime_calibration.saved_samples(tmp_path, [cfg.stem], resimulate=True)
    assert again is not None
    got = {lab.split("|")[2]: (f, r) for lab, f, r in again[0]}
    assert sorted(got) == sorted(devs) and all(got[d][1] == real[d] for d in devs)
    [plain] = validate.first_figures(recorded(None))
    for d in devs:
        f, p = got[d][0], plain[d]
        assert (f.role, f.messages, f.sharing) == (p.role, p.messages, p.sharing)
        assert (f.compute_ms, f.transport_ms) == (pytest.approx(1.25 * p.compute_ms), pytest.approx(1.25 * p.transport_ms))
    assert got["ps:0"][0].role == "ps" and plain[devs[0]].compute_ms > 1.0
    # without the runs' files there is nothing to resimulate
    assert runtime_calibration.saved_samples(tmp_path, ["c9_mlp_2w_asp_pipe"], resimulate=True) is None


def test_resimulate_without_its_profile_or_runs_exits_2_with_one_line(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "gone.json"
    assert runtime_calibration.main(["--out", str(tmp_path), "--report-only", "--resimulate",
                                     "--fresh-profile", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(missing) in err and "no such profile" in err
    assert runtime_calibration.main(["--out", str(tmp_path), "--report-only", "--resimulate"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "*/validation.json of every config" in err
    # not a profile: one line naming the file
    bad = tmp_path / "bad.json"
    bad.write_text("{bad")
    stems = [c.stem for c in sorted(runtime_calibration.CONFIG_DIR.glob("*.yaml"))]
    for stem in stems:  # saved runs of every config (none with a fresh profile)
        (tmp_path / stem).mkdir()
        (tmp_path / stem / "validation.json").write_text(json.dumps(validate.Validation(
            stem, stem, [validate.SchedulerRun("equal", {}, {"profiles": {"mine": "measured then"}})], None,
            {}).to_json()))
    assert runtime_calibration.main(["--out", str(tmp_path), "--report-only", "--resimulate",
                                     "--fresh-profile", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(str(bad))
    # runs priced with a fresh profile, resimulated without it: refused, naming a run's file
    (tmp_path / stems[0] / "validation.json").write_text(json.dumps(validate.Validation(
        stems[0], stems[0], [validate.SchedulerRun("equal", {}, {"profiles": {"here": "--fresh-profile x.json"}})],
        None, {}).to_json()))
    assert runtime_calibration.main(["--out", str(tmp_path), "--report-only", "--resimulate"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and stems[0] in err and "give that --fresh-profile FILE" in err
    # --resimulate without --report-only would run every calibration config for real: refused
    with pytest.raises(SystemExit) as ex:
        runtime_calibration.main(["--out", str(tmp_path), "--resimulate"])
    assert ex.value.code == 2 and "give --report-only too" in capsys.readouterr().err


def test_the_ridge_draws_a_role_towards_the_des_own_cpu() -> None:
    """One worker: compute 10 ms, nothing else, really 20 ms. Plain NNLS: a = 2. With ridge
    l the fit minimises (10 a / 20 - 1)^2 + l (a - 1)^2: a = (1/2 + l) / (1/4 + l), 1.5 at
    l = 1/4; a huge ridge leaves the DES's own figure, a = 1. The transport term, which no
    sample has, is 0 plainly and its prior 1 with any ridge. The PS role, without
    samples, keeps the identity."""
    s = [(Figures("worker", 10.0, 0.0, 0.0, 1.0), 20.0)]
    assert runtime_cpu.fit(s).worker == pytest.approx((2.0, 0.0, 0.0, 0.0))
    assert runtime_cpu.fit(s, ridge={"worker": 0.25}).worker == pytest.approx((1.5, 0.0, 1.0, 0.0))
    assert runtime_cpu.fit(s, ridge={"worker": 1e9}).worker == pytest.approx((1.0, 0.0, 1.0, 0.0), abs=1e-6)
    assert runtime_cpu.fit(s, ridge={"worker": 0.25}).ps == (1.0, 0.0, 1.0, 0.0)


def test_choose_ridge_picks_the_strength_that_predicts_left_out_configs_best() -> None:
    """Samples made exactly by a model: every fold recovers it, so the smallest strength (0)
    wins and the fit is the model. Made noisy (each config's processes off by its own
    factor): the chosen strength is, per role, the one of the grid with the smallest
    median |error| over the configs left out, recomputed here fold by fold."""
    import numpy as np

    truth = RuntimeCpuModel(worker=(0.9, 0.2, 1.5, 0.05), ps=(0.6, 0.0, 0.7, 0.8))
    grid = [(c, t, n, m) for c, t, n, m in [(10, 4, 2, 1), (10, 4, 2, 3), (2, 1, 22, 3), (25, 5, 9, 2), (5, 0.5, 2, 2),
                                             (14, 9, 4, 2), (30, 2, 2, 1), (7, 7, 12, 3)]]
    exact = [(f"c{i}", f, truth.predict_ms(f)) for role in ("worker", "ps", "allreduce")
             for i, f in enumerate(Figures(role, *g) for g in grid)]
    assert runtime_cpu.choose_ridge(exact) == {"worker": 0.0, "ps": 0.0, "allreduce": 0.0}
    got = runtime_cpu.fit_configs(exact)
    # the all-reduce role takes the workers' compute terms and fits its own two to the rest
    for role in ("worker", "ps", "allreduce"):
        assert got.coef(role) == pytest.approx(truth.coef(role), abs=1e-9)
    exact = [x for x in exact if x[1].role != "allreduce"]
    rng = np.random.default_rng(3)
    off = {f"c{i}": float(rng.uniform(0.7, 1.4)) for i in range(len(grid))}
    noisy = [(c, f, r * off[c]) for c, f, r in exact]
    chosen = runtime_cpu.choose_ridge(noisy)

    def loo(role: str, lam: float) -> float:
        errs = []
        for left in off:
            m = runtime_cpu.fit([(f, r) for c, f, r in noisy if c != left], ridge={**chosen, role: lam})
            errs += [abs(m.predict_ms(f) / r - 1) for c, f, r in noisy if c == left and f.role == role]
        return float(np.median(errs))

    for role in ("worker", "ps"):
        scores = {lam: loo(role, lam) for lam in runtime_cpu.RIDGE_GRID}
        assert scores[chosen[role]] == min(scores.values())
    model = runtime_cpu.fit_configs(noisy, "n")
    assert model == runtime_cpu.fit([(f, r) for _, f, r in noisy], model.note, chosen)
    assert model.note.startswith("n; ridge towards the DES's own CPU") and "worker" in model.note
