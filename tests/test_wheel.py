"""The wheel works outside the checkout: every file the code reads at run time is
package data.

The wheel is built from a copy of the source tree (a stale build/ folder cannot leak
into it), installed into a fresh venv in a temporary folder, and the commands that
read the package data run there with the working directory outside the checkout and
no PYTHONPATH: `hetsim demo` (the demo config, the datasheet profiles, the zoo),
`hetsim dag` on a shipped robotics config (the boards, the robotics profile, the DAG
RL policy), `hetsim plan` with `rl` (the placement policy) and `hetsim simulate` on a
config written in the temporary folder. The venv reuses the installed dependencies
through a .pth line (offline), not their packages' .pth files, so the checkout's
editable install does not leak in.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "results", "tests",
                                "__pycache__", ".*_cache", ".hypothesis", "docs")

CONFIG = """\
name: mine
cluster:
  devices:
    - {type: t4, count: 1}
    - {type: cpu-8c, count: 2}
  ps: {shards: 1, type: cpu-16c}
  network: {bandwidth_gbps: 10}
job: {model: mlp, global_batch: 64, iterations: 5}
scheduler: {name: proportional}
"""


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    run = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"{' '.join(cmd)} -> {run.returncode}\n{run.stdout}\n{run.stderr}"
    return run.stdout


pytestmark = pytest.mark.slow  # about a minute on 2 busy CPU cores; CI runs it (make test)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], Path]:
    """(the venv's bin folder, the environment to run it in, a work folder)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=IGNORE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "-w", str(tmp / "dist"), str(src)], tmp, env)
    wheel = next((tmp / "dist").glob("hetsim-*.whl"))
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, env)
    purelib = Path(_run([str(venv / "bin" / "python"), "-c", "import sysconfig; "
                         "print(sysconfig.get_paths()['purelib'])"], tmp, env).strip())
    # the dependencies installed here, as plain path entries after the venv's own
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (purelib / "_hetsim_test_deps.pth").write_text("\n".join(deps) + "\n")
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
          "--no-deps", "--no-index", str(wheel)], tmp, env)
    work = tmp / "work"
    work.mkdir()
    return venv / "bin", env, work


def test_installed_hetsim_runs_outside_the_checkout(installed: tuple[Path, dict[str, str], Path]) -> None:
    bindir, env, work = installed
    py, hetsim = str(bindir / "python"), str(bindir / "hetsim")
    where = _run([py, "-c", "import sim, hetsim; print(sim.__file__); print(hetsim.__version__)"], work, env)
    sim_file, version = where.split()
    assert not Path(sim_file).is_relative_to(REPO) and Path(sim_file).is_relative_to(bindir.parent)
    assert _run([hetsim, "--version"], work, env) == f"hetsim {version}\n"

    out = _run([hetsim, "demo", "--out", "demo"], work, env)
    assert "wrote demo/" in out
    assert (work / "demo" / "comparison.csv").read_text().count("\n") == 5  # header + 2 models x 2

    robotics = _run([py, "-c", "from importlib.resources import files; "
                     "print(files('experiments') / 'configs' / 'robotics' / 'pi_lite.yaml')"], work, env).strip()
    assert not Path(robotics).is_relative_to(REPO)
    out = _run([hetsim, "dag", robotics, "--schedulers", "energy,rl-dag", "--out", "dag"], work, env)
    rows = (work / "dag" / "comparison.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["energy", "rl-dag"]

    (work / "mine.yaml").write_text(CONFIG)
    plan = json.loads(_run([hetsim, "plan", "mine.yaml", "--scheduler", "rl"], work, env))
    assert plan["scheduler"] == "rl"
    out = _run([hetsim, "simulate", "mine.yaml", "--set", "job.iterations=3", "--out", "sim"], work, env)
    assert json.loads((work / "sim" / "summary.json").read_text())["iterations"] == 3
    assert "wrote sim/" in out


def test_the_wheel_contents(installed: tuple[Path, dict[str, str], Path]) -> None:
    wheel = next(installed[0].parent.parent.joinpath("dist").glob("hetsim-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ("hardware_profiles/boards/agx-orin-32.json", "hardware_profiles/measured/robotics/this_machine.json",
                   "hardware_profiles/measured/this_machine.json", "schedulers/rl/dag_default_policy.zip",
                   "schedulers/rl/default_policy.zip", "runtime/examples/two_workers.yaml",
                   "experiments/configs/demo.yaml", "hetsim/__init__.py", "hetsim/api.py"):
        assert needed in names, needed
    assert not [n for n in names if "/lab/" in n or n.startswith("bench/")]
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = [line.split(": ", 1)[1] for line in zipfile.ZipFile(wheel).read(meta).decode().splitlines()
                if line.startswith("Requires-Dist: ") and "extra ==" not in line]
    assert "psutil>=5.9" in requires
    for bounded in ("simpy<5,>=4.1", "torch<3,>=2.2", "gymnasium<2,>=0.29", "stable-baselines3<3,>=2.2",
                    "sb3-contrib<3,>=2.2"):
        assert bounded in requires, requires
