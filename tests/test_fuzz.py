"""Hostile input, fed to the `hetsim` command in-process: every input ends in exit 0 with
finite outputs, or exit 2 with one error line, within a bounded time; never a traceback,
a hang or a half-written file.

Two parts:

* hand-written hostile cases (:data:`HOSTILE`), each with the exact error it must get;
* hypothesis strategies over configs, models, profiles, plans and sweep files, derandomized
  (a fixed seed) with a bounded example count (``HETSIM_FUZZ_EXAMPLES``, default
  :data:`EXAMPLES`): ``bench/fuzz.py`` runs the same properties for longer.

Values are drawn from small sets that mix ordinary values with hostile ones (huge,
negative, zero, non-finite, of the wrong type): an ordinary value keeps each run short,
a huge one must be refused up front by the size limits (sim/limits.py).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from experiments.cli import main

ROOT = Path(__file__).resolve().parents[1]
#: examples per property in CI (fixed seed: the same inputs every run)
EXAMPLES = int(os.environ.get("HETSIM_FUZZ_EXAMPLES", "12"))
#: seconds one command may take before it counts as a hang
LIMIT_S = int(os.environ.get("HETSIM_FUZZ_LIMIT_S", "60"))

BASE: dict[str, Any] = {
    "name": "fz",
    "cluster": {"devices": [{"type": "t4", "count": 1}, {"type": "cpu-8c", "count": 2}],
                "ps": {"shards": 1, "type": "cpu-16c"}, "network": {"bandwidth_gbps": 10}},
    "job": {"model": "mlp", "global_batch": 64, "iterations": 4},
}
MODEL: dict[str, Any] = {"name": "m", "layers": [
    {"name": "fc1", "op": "gemm", "fwd_flops": 2e5, "bwd_flops": 4e5, "param_bytes": 4e5, "activation_bytes": 512},
    {"name": "relu", "op": "elementwise", "fwd_flops": 128, "bwd_flops": 128, "param_bytes": 0,
     "activation_bytes": 512},
    {"name": "fc2", "op": "gemm", "fwd_flops": 2e4, "bwd_flops": 4e4, "param_bytes": 4e4, "activation_bytes": 40},
]}


class Hang(Exception):
    """A command that ran past LIMIT_S."""


@contextlib.contextmanager
def _alarm(seconds: int) -> Iterator[None]:
    def on_alarm(signum: int, frame: Any) -> None:
        raise Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def hetsim(*argv: str) -> tuple[int, str, str]:
    """``hetsim ARGV`` in-process: (exit code, stdout, stderr). argparse's exits count as
    exit codes; any other exception escapes (a traceback is a failure)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _alarm(LIMIT_S):
        try:
            rc = main(list(argv))
        except SystemExit as e:
            rc = int(e.code) if isinstance(e.code, int) else 2
    return rc, out.getvalue(), err.getvalue()


def _strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"non-finite number {name} in an output")

    return json.loads(text, parse_constant=refuse)


def _finite_files(folder: Path) -> None:
    """Every JSON output parses without Infinity/NaN; every CSV cell that is a number is finite."""
    for p in folder.rglob("*"):
        if p.name.endswith(".json"):
            _strict_json(p.read_text())
        elif p.suffix == ".csv":
            for cell in p.read_text().replace("\n", ",").split(","):
                try:
                    x = float(cell)
                except ValueError:
                    continue
                assert math.isfinite(x), f"{p}: {cell}"
        assert ".tmp" not in p.name, f"temporary left behind: {p}"


#: outcomes seen by :func:`check_outcome`, "exit 0" and "exit 2" (bench/fuzz.py reports them)
OUTCOMES: Counter[str] = Counter()

#: stderr lines that are not errors (notes and warnings of a run that went on)
_INFO = ("hetsim: note:", "hetsim: warning:", "hetsim: skipped")


def check_outcome(rc: int, stderr: str, out: Path | None) -> None:
    """The contract: exit 0 with finite outputs, or exit 2 with one error line."""
    assert "Traceback" not in stderr, stderr
    OUTCOMES[f"exit {rc}"] += 1
    if rc == 0:
        if out is not None and out.exists():
            _finite_files(out)
        return
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith(_INFO)]
    assert rc == 2 and len(lines) == 1, f"exit {rc}, stderr:\n{stderr}"
    if out is not None and out.exists():
        assert not [p for p in out.rglob("*") if ".tmp" in p.name]


def _set(d: dict[str, Any], path: str, value: Any) -> None:
    keys = path.split(".")
    for k in keys[:-1]:
        d = d.setdefault(k, {}) if isinstance(d, dict) else d
    if value is _DELETE:
        d.pop(keys[-1], None)
    else:
        d[keys[-1]] = value


_DELETE = object()


# ------------------------------------------------------------------ hand-written hostile cases
def _edit(**paths: Any) -> Callable[[dict[str, Any]], None]:
    def f(d: dict[str, Any]) -> None:
        for p, v in paths.items():
            _set(d, p.replace("__", "."), v)
    return f


#: (id, config edit, extra argv, the error's expected tail)
HOSTILE: list[tuple[str, Callable[[dict[str, Any]], None], list[str], str]] = [
    ("global_batch_2_63", _edit(job__global_batch=2**63), [],
     "job.global_batch: at most 2^32 = 4294967296 (got 9223372036854775808): shares are computed in "
     "floating point, exact only well below 2^53"),
    ("iterations_1e12", _edit(job__iterations=10**12), [],
     "job.iterations: iterations 1e+12 exceeds the limit 1e+06 (iterations.csv and the evaluators' "
     "records hold one row per iteration); --force to run anyway"),
    ("samples_1e15", _edit(job__iterations=_DELETE, job__samples=10**15), [],
     "job.samples: iterations 1.56e+13 exceeds the limit 1e+06"),
    ("des_work", _edit(job__iterations=200_000, cluster__devices=[{"type": "cpu-8c", "count": 100}]),
     ["--evaluator", "des"], "job.iterations: DES work of iterations x processes 2.02e+07 exceeds the limit "
     "1e+07 (about 10^4 of these a second; the analytic evaluator is the fast one); --force to run anyway"),
    ("workers_1e7", _edit(cluster__devices=[{"type": "cpu-8c", "count": 10**7}]), [],
     "cluster.devices: devices plus PS shards 1e+07 exceeds the limit 2e+04 (each is a simulated "
     "process; building and simulating them would take hours); --force to run anyway"),
    ("shards_1e7", _edit(cluster__ps__shards=10**7), [],
     "cluster.ps.shards: devices plus PS shards 1e+07 exceeds the limit 2e+04"),
    ("name_escapes", _edit(name="../../x"), [],
     "name: must be a plain file name (no path separators, not '.' or '..'), got '../../x'"),
    ("name_dotdot", _edit(name=".."), [], "name: must be a plain file name"),
    ("zero_model", _edit(job__model={"file": "zero.yaml"}), [],
     "zero.yaml: layers: no layer has parameters (every param_bytes is 0): nothing to train or synchronise"),
    ("price_1e308", _edit(profiles=["prof"], cluster__devices=[{"type": "dear", "count": 2}]), [],
     "the result's cost_usd is inf (not a finite number) (the devices' price_per_hour too large)"),
]


def _fixture_files(tmp: Path) -> None:
    zero = {"name": "z", "layers": [{**ly, "param_bytes": 0} for ly in MODEL["layers"]]}
    (tmp / "zero.yaml").write_text(yaml.safe_dump(zero))
    prof = json.loads((ROOT / "hardware_profiles" / "cpu-8c.json").read_text())
    prof.update(name="dear", price_per_hour=1e308)
    (tmp / "prof").mkdir(exist_ok=True)
    (tmp / "prof" / "dear.json").write_text(json.dumps(prof))


@pytest.mark.parametrize("case", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_config_gets_its_one_line_error(tmp_path: Path, case: Any) -> None:
    _, edit, argv, expected = case
    _fixture_files(tmp_path)
    d = json.loads(json.dumps(BASE))
    edit(d)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(d))
    out = tmp_path / "out"
    args = argv if "--evaluator" in argv else ["--evaluator", "analytic", *argv]
    rc, _, err = hetsim("simulate", str(cfg), *args, "--out", str(out))
    check_outcome(rc, err, out)
    assert rc == 2 and expected in err.strip(), err
    assert not (out / "summary.json").exists()


def test_force_runs_beyond_a_limit(tmp_path: Path) -> None:
    d = json.loads(json.dumps(BASE))
    d["job"]["iterations"] = 3_000_000  # beyond MAX_ITERATIONS, refused without --force
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(d))
    rc, _, err = hetsim("plan", str(cfg))
    assert rc == 2 and "--force to run anyway" in err
    rc, out, err = hetsim("plan", str(cfg), "--force")
    assert rc == 0 and json.loads(out)["kind"] == "data_parallel", err


def test_duplicate_yaml_keys_are_an_error(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(BASE) + "name: other\n")
    rc, _, err = hetsim("simulate", str(cfg), "--evaluator", "analytic", "--out", str(tmp_path / "o"))
    assert rc == 2 and err.strip().endswith("malformed YAML: duplicate key 'name'"), err
    cfg.write_text("name: a\njob: {model: mlp, model: ctr_dnn}\n")
    rc, _, err = hetsim("plan", str(cfg))
    assert rc == 2 and err.strip() == f"hetsim: error: {cfg}: line 2: malformed YAML: duplicate key 'model'", err


def _plan_file(tmp: Path) -> tuple[Path, dict[str, Any]]:
    cfg = tmp / "c.yaml"
    cfg.write_text(yaml.safe_dump(BASE))
    rc, out, err = hetsim("plan", str(cfg))
    assert rc == 0, err
    return cfg, json.loads(out)


@pytest.mark.parametrize("batch,shown", [(31.5, "31.5"), ("31", "'31'"), (31.0, "31.0"), (True, "True")])
def test_plan_shares_must_be_exact_integers(tmp_path: Path, batch: Any, shown: str) -> None:
    cfg, plan = _plan_file(tmp_path)
    plan["stages"][0]["replicas"][0]["batch"] = batch
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(plan))
    rc, _, err = hetsim("simulate", str(cfg), "--plan", str(p), "--out", str(tmp_path / "o"))
    assert rc == 2 and err.strip() == (f"hetsim: error: {p}: stages[0].replicas[0].batch: "
                                       f"must be an integer, got {shown}"), err


def test_a_binary_plan_is_one_line(tmp_path: Path) -> None:
    cfg, _ = _plan_file(tmp_path)
    p = tmp_path / "plan.json"
    p.write_bytes(bytes(range(128, 256)))
    rc, _, err = hetsim("simulate", str(cfg), "--plan", str(p), "--out", str(tmp_path / "o"))
    assert rc == 2 and err.strip() == f"hetsim: error: {p}: not UTF-8 text (invalid start byte at byte 0)", err


def test_plan_out_a_directory_or_under_a_file_is_one_line(tmp_path: Path) -> None:
    cfg, _ = _plan_file(tmp_path)
    folder = tmp_path / "adir"
    folder.mkdir()
    rc, _, err = hetsim("plan", str(cfg), "--out", str(folder))
    assert rc == 2 and err.strip() == f"hetsim: error: {folder}: --out: is a directory (give a file name)", err
    under = cfg / "plan.json"
    rc, _, err = hetsim("plan", str(cfg), "--out", str(under))
    assert rc == 2 and err.strip() == (f"hetsim: error: {cfg}: --out: cannot write there: a file is in "
                                       "the way where a folder is needed"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "c.yaml"]


@pytest.mark.parametrize("cmd", ["run", "validate"])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_timeout_must_be_positive(tmp_path: Path, cmd: str, value: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(BASE))
    rc, _, err = hetsim(cmd, str(cfg), f"--timeout={value}")
    assert rc == 2 and err.strip() == (f"hetsim {cmd}: error: argument --timeout: must be a finite number "
                                       f"of seconds > 0, got '{value}' (see hetsim --help)"), err


ROBOTICS = ROOT / "experiments" / "configs" / "robotics" / "orin_slam.yaml"


@pytest.mark.parametrize("edit,expected", [
    ({"pipeline": {"name": "perception_slam", "params": {"detector": "nosuch"}}},
     "pipeline.params: unknown detector 'nosuch'; the zoo has mlp, "),
    ({"pipeline": {"name": "perception_slam", "params": {"calibration": "nosuch.json"}}},
     "pipeline.params: calibration 'nosuch.json': cannot read a measured robotics profile (No such file "
     "or directory)"),
    ({"des": {"frames": 10**9}},
     "des.frames: frames x tasks 1e+10 exceeds the limit 5e+07 (each task of each frame is a handful "
     "of DES events); --force to run anyway"),
])
def test_hostile_robotics_config(tmp_path: Path, edit: dict[str, Any], expected: str) -> None:
    d = yaml.safe_load(ROBOTICS.read_text())
    d.update(edit)
    cfg = tmp_path / "r.yaml"
    cfg.write_text(yaml.safe_dump(d))
    rc, _, err = hetsim("dag", str(cfg), "--out", str(tmp_path / "o"))
    assert rc == 2 and expected in err.strip() and len(err.strip().splitlines()) == 1, err


# ------------------------------------------------------------------ generated input
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))

_NUM = st.sampled_from([0, 1, 2, 3, -1, 0.5, 1e308, -1e308, float("inf"), float("nan"), 10**7, 2**63,
                        2**64 + 1, "3", "", None, True, [], {}])
_POS = st.sampled_from([1, 2, 4, 64, 0, -3, 1.5, 10**7, 10**12, 2**63, "8", None, False, float("nan")])
_TEXT = st.sampled_from(["mlp", "resnet18", "t4", "cpu-8c", "bsp", "asp", "ssp", "equal", "proportional",
                         "exact", "", "..", "../x", "a/b", "nosuch", "\x00", "é", 3, None, [1], {"a": 1}])
_CONFIG_FIELDS = {
    "name": _TEXT, "seed": _NUM,
    "cluster.devices": st.sampled_from([[{"type": "t4", "count": 2}], [], [{"type": "nosuch"}],
                                        [{"type": "t4", "count": 10**7}], [{"count": 1}], "t4", None,
                                        [{"type": "cpu-8c", "count": 2, "host": "h"}]]),
    "cluster.ps.shards": _POS, "cluster.ps.type": _TEXT,
    "cluster.network.bandwidth_gbps": _NUM, "cluster.network.latency_us": _NUM,
    "cluster.network.sharing": _TEXT, "cluster.network.overrides": st.sampled_from([{}, {"t4:0": 0},
                                                                                     {"t4:0": 1e308}, []]),
    "job.model": st.one_of(_TEXT, st.sampled_from([{"file": "m.yaml"}, {"file": "nosuch.yaml"}, {"torch": "x"},
                                                   {"file": 3}])),
    "job.global_batch": _POS, "job.iterations": _POS, "job.samples": _POS, "job.target_loss": _NUM,
    "job.sync": _TEXT, "job.staleness": _NUM, "job.pipeline": st.sampled_from([True, False, "yes", 1]),
    "job.quantization": st.sampled_from(["none", "adaptive", 8, 16, 3, "8", None]),
    "job.dtype": st.sampled_from(["fp32", "fp16", "bf16", "tf32", "fp64", 32]),
    "job.failure_timeout_s": _NUM, "job.warmup_iterations": _NUM, "job.compute_noise": _NUM,
    "objective.minimize": st.sampled_from(["time", "cost", "energy", "speed", None]),
    "objective.deadline_s": _NUM, "objective.budget_usd": _NUM, "objective.throughput_min": _NUM,
    "scheduler.name": _TEXT, "scheduler.params": st.sampled_from([{}, {"x": 1}, [], None]),
    "dynamics": st.sampled_from([[], [{"worker": 0, "at_s": 0.001, "fail": True}],
                                 [{"worker": 9, "at_s": 1, "slowdown": 2}],
                                 [{"worker": 0, "at_s": 0, "slowdown": 1e308}],
                                 [{"pattern": "steps", "workers": "all", "times_s": [0, 1e308],
                                   "slowdown": [1, 2]}], [{"pattern": "nosuch"}], {}]),
    "runtime": st.sampled_from([None, {}, {"model_kwargs": {"x": 1}}]),
    "unknown_field": st.sampled_from([_DELETE, 1]),
}
_config_edits = st.dictionaries(st.sampled_from(sorted(_CONFIG_FIELDS)), st.just(None), max_size=4).flatmap(
    lambda keys: st.fixed_dictionaries({k: _CONFIG_FIELDS[k] for k in keys}))


def _write_inputs(folder: Path, edits: dict[str, Any]) -> Path:
    (folder / "m.yaml").write_text(yaml.safe_dump(MODEL))
    d = json.loads(json.dumps(BASE))
    for k, v in edits.items():
        _set(d, k, v)
    cfg = folder / "c.yaml"
    cfg.write_text(yaml.safe_dump(d, allow_unicode=True))
    return cfg


@FUZZ
@given(edits=_config_edits, evaluator=st.sampled_from(["analytic", "des"]))
def test_fuzz_configs(edits: dict[str, Any], evaluator: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _write_inputs(Path(tmp), edits)
        out = Path(tmp) / "out"
        rc, _, err = hetsim("simulate", str(cfg), "--evaluator", evaluator, "--out", str(out))
        check_outcome(rc, err, out)


_LAYER_FIELDS = {
    "name": _TEXT, "op": st.sampled_from(["gemm", "conv", "embedding", "elementwise", "attention", "fft", 1]),
    "fwd_flops": _NUM, "bwd_flops": _NUM, "param_bytes": _NUM, "activation_bytes": _NUM,
    "kernels": _NUM, "window": _NUM, "inplace": _NUM,
    "sparse": st.sampled_from([None, {"rows_per_sample": 1, "row_bytes": 0}, {"rows_per_sample": 1e308,
                                                                            "row_bytes": 1e308}, []]),
}


@FUZZ
@given(layer=st.integers(0, 2),
       edits=st.dictionaries(st.sampled_from(sorted(_LAYER_FIELDS)), st.just(None), max_size=3).flatmap(
           lambda keys: st.fixed_dictionaries({k: _LAYER_FIELDS[k] for k in keys})),
       top=st.sampled_from([{}, {"layers": []}, {"layers": "x"}, {"input_bytes": -1}, {"input_bytes": 1e308},
                            {"extra": 1}]))
def test_fuzz_models(layer: int, edits: dict[str, Any], top: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = json.loads(json.dumps(MODEL))
        model["layers"][layer].update(edits)
        model.update(top)
        cfg = _write_inputs(Path(tmp), {"job.model": {"file": "m.yaml"}})
        (Path(tmp) / "m.yaml").write_text(yaml.safe_dump(model, allow_unicode=True))
        out = Path(tmp) / "out"
        rc, _, err = hetsim("simulate", str(cfg), "--evaluator", "analytic", "--out", str(out))
        check_outcome(rc, err, out)


_PROFILE_FIELDS = {
    "price_per_hour": _NUM, "memory_bytes": _NUM, "nic_bw_Bps": _NUM, "peak_flops": _NUM,
    "mem_bw_Bps": _NUM, "launch_overhead_s": _NUM, "kind": _TEXT, "efficiency": st.sampled_from([{}, [], 1, None]),
    "power_w": st.sampled_from([{"active": 1e308, "idle": 0}, {"active": -1}, {}, None, 300]),
    "schema": _NUM,
}


@FUZZ
@given(edits=st.dictionaries(st.sampled_from(sorted(_PROFILE_FIELDS)), st.just(None), min_size=1, max_size=3)
       .flatmap(lambda keys: st.fixed_dictionaries({k: _PROFILE_FIELDS[k] for k in keys})),
       evaluator=st.sampled_from(["analytic", "des"]))
def test_fuzz_profiles(edits: dict[str, Any], evaluator: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        prof = json.loads((ROOT / "hardware_profiles" / "cpu-8c.json").read_text())
        prof.update(edits, name="fz")
        (Path(tmp) / "prof").mkdir()
        (Path(tmp) / "prof" / "fz.json").write_text(json.dumps(prof))
        cfg = _write_inputs(Path(tmp), {"profiles": ["prof"], "cluster.devices": [{"type": "fz", "count": 2}]})
        out = Path(tmp) / "out"
        rc, _, err = hetsim("simulate", str(cfg), "--evaluator", evaluator, "--out", str(out))
        check_outcome(rc, err, out)


@FUZZ
@given(where=st.sampled_from(["batch", "device", "layers", "ps_shards", "kind", "schema", "stages", "options"]),
       value=st.one_of(_NUM, _TEXT), raw=st.one_of(st.none(), st.binary(max_size=64)))
def test_fuzz_plans(where: str, value: Any, raw: bytes | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _write_inputs(Path(tmp), {})
        rc, text, err = hetsim("plan", str(cfg))
        assert rc == 0, err
        plan = json.loads(text)
        rep = plan["stages"][0]["replicas"][0]
        if where in ("batch", "device"):
            rep[where] = value
        elif where == "layers":
            plan["stages"][0]["layers"] = [0, value]
        else:
            plan[where] = value
        p = Path(tmp) / "plan.json"
        if raw is not None:
            p.write_bytes(raw)
        else:
            p.write_text(json.dumps(plan))
        out = Path(tmp) / "out"
        rc, _, err = hetsim("simulate", str(cfg), "--plan", str(p), "--evaluator", "analytic", "--out", str(out))
        check_outcome(rc, err, out)


_SWEEP_PARTS = {
    "evaluator": st.sampled_from(["analytic", "des", "frames", "nosuch", 3]),
    "trace": st.sampled_from([True, False, "no"]),
    "grid": st.sampled_from([{"job.sync": ["bsp", "asp"]}, {"job.global_batch": [0, -1, 2**63]},
                             {"cluster.network.bandwidth_gbps": [1e308, 0]}, {"nosuch.x": [1]},
                             {"job.sync": []}, {"job.sync": "bsp"}, [], {"cluster.devices[9].count": [1]}]),
    "zip": st.sampled_from([{"name": ["a", "b"], "seed": [1]}, {"name": ["a/b"]}, {}]),
    "random": st.sampled_from([{"samples": 2, "seed": 0, "axes": {"job.global_batch": {"low": 8, "high": 64}}},
                               {"samples": -1}, {"samples": 2, "axes": {"job.sync": {"choices": []}}}]),
    "unknown": st.sampled_from([1]),
}


@FUZZ
@given(parts=st.dictionaries(st.sampled_from(sorted(_SWEEP_PARTS)), st.just(None), max_size=3).flatmap(
    lambda keys: st.fixed_dictionaries({k: _SWEEP_PARTS[k] for k in keys})))
def test_fuzz_sweep_files(parts: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = _write_inputs(Path(tmp), {})
        sweep = {"base": cfg.name, "evaluator": "analytic", **parts}
        f = Path(tmp) / "s.yaml"
        f.write_text(yaml.safe_dump(sweep, allow_unicode=True))
        out = Path(tmp) / "out"
        # a point that fails is a row with status error (exit 1 without --allow-failures)
        rc, _, err = hetsim("sweep", str(f), "--jobs", "1", "--quiet", "--allow-failures", "--out", str(out))
        check_outcome(rc, err, out)


@FUZZ
@given(text=st.one_of(st.text(max_size=80), st.binary(max_size=80).map(lambda b: b.decode("latin-1")),
                      st.sampled_from(["a: &x 1\nb: *x\n", "{a: 1, a: 2}", "- 1\n- 2\n", "!!python/object:os.system {}",
                                       "a: [1, 2\n", "\t\x00", "<<: {name: x}\nname: y\n"])))
def test_fuzz_config_text(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "c.yaml"
        cfg.write_bytes(text.encode("utf-8", "surrogateescape"))
        out = Path(tmp) / "out"
        rc, _, err = hetsim("simulate", str(cfg), "--out", str(out))
        check_outcome(rc, err, out)


MEASURED = ROOT / "hardware_profiles" / "measured" / "this_machine.json"


def _measured(tmp: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    prof = json.loads(MEASURED.read_text())
    edit(prof["measurement"]["raw"])
    p = tmp / "this_machine.json"
    p.write_text(json.dumps(prof))
    return p


def _nan_time(raw: dict[str, Any]) -> None:
    raw["models"]["mlp"][0]["layers"]["0"][0] = float("nan")


@pytest.mark.parametrize("edit,expected", [
    (_nan_time, "measurement.raw.models.mlp[0].layers.0[0]: nan is not a finite number"),
    (lambda raw: raw.update(models="abc"), "measurement.raw: malformed raw measurements, not as hetsim "
     "profile writes them (AttributeError: 'str' object has no attribute 'items')"),
])
def test_calibrate_on_malformed_raw_measurements(tmp_path: Path, edit: Any, expected: str) -> None:
    p = _measured(tmp_path, edit)
    rc, _, err = hetsim("calibrate", str(p), "--out", str(tmp_path / "out.json"))
    assert rc == 2 and err.strip() == f"hetsim: error: {p}: {expected}", err
    assert sorted(x.name for x in tmp_path.iterdir()) == ["this_machine.json"]


def test_calibrate_out_a_directory_leaves_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "adir"
    folder.mkdir()
    rc, _, err = hetsim("calibrate", str(MEASURED), "--out", str(folder))
    assert rc == 2 and err.strip() == f"hetsim: error: {folder}: --out: is a directory (give a file name)", err
    assert list(folder.iterdir()) == []
