"""``import hetsim``: the stable API of docs/reference/python_api.md, and its snippet."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hetsim
from experiments import runner
from sim.plan import Plan
from sim.problem import Problem
from sim.result import RunResult

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "reference" / "python_api.md"
DEMO = REPO / "experiments" / "configs" / "demo.yaml"


def test_the_documented_snippet_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert len(blocks) == 1
    monkeypatch.chdir(tmp_path)  # it works from any folder
    exec(compile(blocks[0], str(DOC), "exec"), {"__name__": "python_api_doc"})
    assert capsys.readouterr().out == "equal 158.3\nproportional 666.7\nfastest_only 778.2\n"


def test_every_documented_name_is_exported() -> None:
    table = DOC.read_text().split("## Example")[0]
    documented = set(re.findall(r"`(?:@?hetsim\.)?([A-Za-z_]+)\(", table)) | set(
        re.findall(r"`([A-Z][A-Za-z]+)`", table))
    assert documented - {"config"} <= set(hetsim.__all__)
    assert set(hetsim.__all__) - {"__version__"} <= set(dir(hetsim))


def test_the_types_are_the_implementations() -> None:
    assert (hetsim.Plan, hetsim.Problem, hetsim.RunResult, hetsim.Loaded) == (Plan, Problem, RunResult,
                                                                           runner.Loaded)


def test_load_config_overrides() -> None:
    assert hetsim.load_config(DEMO, {"job.iterations": 4}).config.job.iterations == 4
    assert hetsim.load_config(DEMO, ["job.iterations=6", "job.sync=asp"]).config.job.sync == "asp"
    assert hetsim.load_config(DEMO).config.job.iterations == 30
    with pytest.raises(hetsim.ConfigError) as e:
        hetsim.load_config(DEMO, {"job.iterations": "many"})
    assert (e.value.file, e.value.field) == (str(DEMO), "job.iterations")
    with pytest.raises(hetsim.ConfigError) as e:
        hetsim.load_config(DEMO, {"job..iterations": 1})
    assert e.value.line() == "<command line>: --set job..iterations: empty part in the key path"


def test_simulate_matches_the_runner(tmp_path: Path) -> None:
    cfg = hetsim.load_config(DEMO, {"job.iterations": 4})
    ours = hetsim.simulate(cfg, scheduler="equal", evaluator="analytic", out=tmp_path / "o")
    theirs, _ = runner.run_one(runner.from_dict(cfg.config.model_dump(mode="json"), cfg.base_dir, cfg.source),
                               "analytic", "equal")
    assert ours.summary_json() == theirs.summary_json()
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        "config.json", "iterations.csv", "plan.json", "summary.json", "trace.json"]
    assert hetsim.plan(cfg, "equal").dumps() == (tmp_path / "o" / "plan.json").read_text()
    assert hetsim.problem(DEMO).job.iterations == 30


def test_compare_by_default_leaves_out_the_schedulers_that_cannot_plan() -> None:
    cfg = hetsim.load_config(DEMO, {"job.iterations": 2})
    named = hetsim.compare(cfg, ["proportional", "equal"], evaluator="analytic")
    assert list(named) == ["proportional", "equal"]
    every = hetsim.compare(cfg, evaluator="analytic")
    assert set(every) <= set(hetsim.scheduler_names()) and {"equal", "proportional"} <= set(every)
    with pytest.raises(hetsim.HetsimError):
        hetsim.compare(cfg, ["no_such_scheduler"])


def test_register_scheduler_refuses_a_duplicate() -> None:
    with pytest.raises(ValueError, match="scheduler 'equal' is already registered"):
        hetsim.register_scheduler("equal")(type("Again", (), {}))


def test_import_hetsim_is_light() -> None:
    code = ("import sys, hetsim; v = hetsim.__version__; "
            "print(sorted(m for m in ('sim', 'schedulers', 'experiments', 'numpy', 'pydantic') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert run.stdout == "[]\n"
