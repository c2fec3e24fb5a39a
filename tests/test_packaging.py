"""What a user installs and cleans: the LICENSE, the Makefile's torch and clean, and the
lab profiles kept out of the device types. (The wheel itself: tests/test_wheel.py.)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from hardware_profiles import MEASURED_DIR, list_profiles, load_profile, load_profile_file
from hardware_profiles.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
LAB = MEASURED_DIR / "lab"
LAB_PROFILES = ["amd_1606", "amd_cold", "amd_rounds", "amd_rounds_repeat", "xeon_vm", "xeon_vm_3pass",
                "xeon_vm_repeat", "xeon_vm_rounds", "xeon_vm_rounds_repeat"]


def test_license_is_the_apache_2_text() -> None:
    text = (REPO / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text
    assert 'license = "Apache-2.0"' in (REPO / "pyproject.toml").read_text()


def test_lab_profiles_are_not_device_types() -> None:
    assert sorted(p.stem for p in LAB.glob("*.json")) == LAB_PROFILES
    assert not set(LAB_PROFILES) & set(list_profiles())
    assert "this_machine" in list_profiles()
    with pytest.raises(ConfigError, match="unknown device type 'xeon_vm'"):
        load_profile("xeon_vm")


@pytest.mark.parametrize("name", LAB_PROFILES)
def test_lab_profiles_load_by_path(name: str) -> None:
    assert load_profile_file(LAB / f"{name}.json").name == name  # as the calibration benches read them
    assert load_profile(name, [LAB]).name == name  # and as a config listing the folder in profiles:


def test_make_setup_installs_the_cpu_torch_only_when_absent() -> None:
    run = subprocess.run(["make", "-n", "-B", "setup", "PY=python3"], cwd=REPO, capture_output=True,
                         text=True, check=True)
    commands = run.stdout.replace("\\\n", " ").splitlines()  # continued lines joined
    torch = [" ".join(c.split()) for c in commands if "torch==" in c]
    assert torch == ['.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q '
                     "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"]


@pytest.mark.skipif(shutil.which("git") is None or shutil.which("make") is None, reason="needs git and make")
def test_make_clean_removes_only_untracked_results(tmp_path: Path) -> None:
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    tracked = ["results/README.md", "results/reproduce_hps/report.md", "results/validation_suite/report.md"]
    untracked = ["results/demo/comparison.csv", "results/demo/resnet18/equal/summary.json",
                 "results/validation_suite/v1/report.md", "results/sweeps/x/results.csv"]
    for name in tracked + untracked:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    git("add", "Makefile", *tracked)
    git("commit", "-qm", "x")
    subprocess.run(["make", "clean"], cwd=tmp_path, check=True, capture_output=True)
    left = sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "results").rglob("*") if p.is_file())
    assert left == sorted(tracked)
    assert not (tmp_path / "results" / "demo").exists() and not (tmp_path / ".venv").exists()
    assert (tmp_path / "results" / "validation_suite").is_dir()


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_clean_outside_git_leaves_results_alone(tmp_path: Path) -> None:
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "report.md").write_text("x")
    run = subprocess.run(["make", "clean"], cwd=tmp_path, check=True, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "GIT_CEILING_DIRECTORIES": str(tmp_path.parent)})
    assert "not a git checkout; results/ left alone" in run.stdout
    assert (tmp_path / "results" / "report.md").read_text() == "x"
