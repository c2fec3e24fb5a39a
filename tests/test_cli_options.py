"""The `hetsim` command's shared options: --version, help with defaults and scheduler
names, --quiet, progress bars off without a terminal, --set, --plugin, the
`hetsim.schedulers` entry-point group, and a --help that imports nothing heavy."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import hetsim
import schedulers
from experiments import cli
from experiments.sweep import BACKENDS, MAX_POINTS
from schedulers.base import ENTRY_POINT_GROUP
from sim.evaluate import EVALUATORS

REPO = Path(__file__).resolve().parents[1]
DEMO = str(REPO / "experiments" / "configs" / "demo.yaml")
PI_LITE = str(REPO / "experiments" / "configs" / "robotics" / "pi_lite.yaml")

QUIET = {"demo", "simulate", "compare", "sweep", "profile", "train-rl", "validate", "bench"}
SET = {"demo", "simulate", "plan", "compare", "dag", "train-rl", "run", "validate"}
PLUGIN = {"simulate", "plan", "compare", "dag", "sweep", "run", "validate"}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"hetsim {hetsim.__version__}\n"
    assert 'version = {attr = "hetsim.__version__"}' in (REPO / "pyproject.toml").read_text()


def test_the_cli_copies_match_their_sources() -> None:
    assert cli.EVALUATORS == EVALUATORS
    assert cli.BACKENDS == BACKENDS
    assert cli.MAX_POINTS == MAX_POINTS
    assert cli.ENTRY_POINT_GROUP == ENTRY_POINT_GROUP
    assert cli.BUILTIN_SCHEDULERS == schedulers.BUILTIN


def test_every_option_has_help_and_states_its_default() -> None:
    for verb, sub in _subparsers().items():
        text = sub.format_help()
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"hetsim {verb} {action.dest}: no help"
            if action.option_strings and cli._shows_default(action):
                shown = cli._Formatter("x")._get_help_string(action) or ""
                assert "default" in shown, f"hetsim {verb} {action.option_strings[0]}: default not stated"
        assert "%(default)" not in text
    assert "--evaluator {des,analytic}" in _subparsers()["simulate"].format_help()
    assert "(default: des)" in " ".join(_subparsers()["simulate"].format_help().split())
    assert "of PPO (default: 0)" in " ".join(_subparsers()["train-rl"].format_help().split())
    assert [cli._shows_default(argparse.Action(["--x"], "x", default=d)) for d in (0, None, False, [], "a")] == [
        True, False, False, False, True]


def test_help_lists_the_scheduler_names() -> None:
    subs = _subparsers()
    training = ", ".join(schedulers.names("training"))
    for verb in ("simulate", "plan", "compare", "run", "validate"):
        assert training in " ".join(subs[verb].format_help().split()), verb
    assert ", ".join(schedulers.names("dag")) in " ".join(subs["dag"].format_help().split())


@pytest.mark.parametrize("option, verbs", [("--quiet", QUIET), ("--set", SET), ("--plugin", PLUGIN)])
def test_which_verbs_take_the_shared_options(option: str, verbs: set[str]) -> None:
    has = {verb for verb, sub in _subparsers().items()
           if any(option in a.option_strings for a in sub._actions)}
    assert has == verbs


def test_help_imports_nothing_heavy() -> None:
    sys.path.insert(0, str(REPO))
    from bench.cli_startup import heavy_imports

    assert heavy_imports(["--help"]) == []
    assert heavy_imports(["simulate", "--help"]) == []
    assert heavy_imports(["--version"]) == []


def test_progress_bars_need_a_terminal_and_no_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert cli._progress(argparse.Namespace(quiet=False)) is True
    assert cli._progress(argparse.Namespace(quiet=True)) is False
    assert cli._progress(argparse.Namespace()) is True  # a verb without --quiet
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert cli._progress(argparse.Namespace(quiet=False)) is False


def test_set_overrides_the_config_of_simulate(tmp_path: Path) -> None:
    out = tmp_path / "o"
    assert cli.main(["simulate", DEMO, "--set", "job.iterations=3", "--set", "cluster.devices.0.count=2",
                     "--set", "scheduler.name=equal", "--out", str(out), "--quiet"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["job"]["iterations"] == 3
    assert config["cluster"]["devices"][0] == {"type": "v100", "count": 2}
    assert json.loads((out / "plan.json").read_text())["scheduler"] == "equal"
    assert json.loads((out / "summary.json").read_text())["iterations"] == 3


def test_set_overrides_a_dag_config(tmp_path: Path) -> None:
    out = tmp_path / "d"
    assert cli.main(["dag", PI_LITE, "--set", "des.frames=20", "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["des"]["frames"] == 20


@pytest.mark.parametrize("item, line", [
    ("job.iterations=abc", f"hetsim: error: {DEMO}: job.iterations: Input should be a valid integer"),
    ("job.bogus=1", f"hetsim: error: {DEMO}: job.bogus: unknown field"),
    ("job.iterations.x=1", "hetsim: error: <command line>: --set job.iterations.x: job.iterations is an "
                           "integer, not a mapping or a list"),
    ("job", "hetsim: error: <command line>: --set: expected KEY.PATH=VALUE, got 'job'"),
])
def test_set_errors_name_the_key(item: str, line: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", DEMO, "--set", item]) == 2
    assert capsys.readouterr().err == line + "\n"


PLUGIN_MODULE = """\
import hetsim


@hetsim.register_scheduler("{name}")
class FirstOnly:
    def plan(self, problem):
        shares = [0] * len(problem.cluster.devices)
        shares[0] = problem.job.global_batch
        return hetsim.data_parallel_plan(problem, shares, "{name}")
"""


def test_plugin_module_from_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "cli_plugin_first.py").write_text(PLUGIN_MODULE.format(name="cli_plugin_first"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert cli.main(["plan", DEMO, "--scheduler", "cli_plugin_first"]) == 2
    assert "unknown scheduler 'cli_plugin_first'" in capsys.readouterr().err
    assert cli.main(["plan", DEMO, "--scheduler", "cli_plugin_first", "--plugin", "cli_plugin_first"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["scheduler"] == "cli_plugin_first"
    assert [r["device"] for r in plan["stages"][0]["replicas"]] == ["v100:0"]


def test_plugin_that_cannot_be_imported(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["plan", DEMO, "--plugin", "no_such_module_here"]) == 2
    assert capsys.readouterr().err == ("hetsim: error: <command line>: --plugin: cannot import "
                                       "'no_such_module_here': No module named 'no_such_module_here'\n")


def _distribution(root: Path, entry_points: str) -> None:
    info = root / "hetsim_test_plugin-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hetsim-test-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\n{entry_points}")


def test_entry_point_group(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "ep_pkg").mkdir(parents=True)
    (site / "ep_pkg" / "__init__.py").write_text("")
    (site / "ep_pkg" / "by_class.py").write_text(textwrap.dedent("""\
        import hetsim

        class ByClass:
            def plan(self, problem):
                return hetsim.data_parallel_plan(problem, [problem.job.global_batch] + [0] * (
                    len(problem.cluster.devices) - 1), "ep_by_class")
        """))
    (site / "ep_pkg" / "by_module.py").write_text(PLUGIN_MODULE.format(name="ep_by_module"))
    _distribution(site, "ep_by_class = ep_pkg.by_class:ByClass\nep_pkg = ep_pkg.by_module\n")
    env = {**_env(), "PYTHONPATH": os.pathsep.join((str(REPO), str(site)))}
    for name in ("ep_by_class", "ep_by_module"):
        run = subprocess.run([sys.executable, "-m", "experiments.cli", "plan", DEMO, "--scheduler", name],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["scheduler"] == name


def test_a_broken_entry_point_is_one_line(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _distribution(site, "broken = no_such_plugin_module:Nothing\n")
    env = {**_env(), "PYTHONPATH": os.pathsep.join((str(REPO), str(site)))}
    run = subprocess.run([sys.executable, "-m", "experiments.cli", "plan", DEMO], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert run.stderr == ("hetsim: error: entry point hetsim.schedulers:broken: no_such_plugin_module:Nothing: "
                          "cannot load: ModuleNotFoundError: No module named 'no_such_plugin_module'\n")
