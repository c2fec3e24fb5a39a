"""The import contracts of ``.importlinter`` (docs/architecture.md) hold.

``make lint`` runs them with ``lint-imports``; this test runs them with the suite, so
an import that breaks a layer or closes a cycle fails CI. The contracts themselves are
pinned too: weakening a layer or dropping a package from the cycle check fails here,
not silently.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from importlinter import api

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / ".importlinter"


def test_the_import_contracts_hold() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    run = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
         "sys.exit(lint_imports(config_filename=sys.argv[1], no_cache=True, no_logo=True))",
         str(CONFIG)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Contracts: 2 kept, 0 broken." in run.stdout


def test_the_contracts_are_the_documented_layers() -> None:
    contracts = {c["id"]: c for c in api.read_configuration(str(CONFIG))["contracts_options"]}
    assert set(contracts) == {"layers", "acyclic"}
    layers = contracts["layers"]
    assert layers["type"] == "layers"
    assert layers["layers"] == ["bench : tests", "hetsim", "experiments", "calibration",
                                "schedulers | runtime", "sim", "hardware_profiles"]
    # the exceptions: `python -m runtime` is the CLI's `run` under torchrun; `hetsim
    # --version` reads hetsim.__version__ (hetsim/__init__.py imports nothing)
    assert layers.get("ignore_imports") == ["runtime.__main__ -> experiments.cli",
                                            "experiments.cli -> hetsim"]
    acyclic = contracts["acyclic"]
    assert acyclic["type"] == "acyclic_siblings"
    assert sorted(acyclic["ancestors"]) == sorted(
        ["hetsim", "hardware_profiles", "sim", "schedulers", "runtime", "calibration", "experiments"])


def test_no_monoliths_in_the_model_schedulers_and_runtime() -> None:
    """No file over 800 lines and no function over 80 lines in sim/, schedulers/, runtime/
    (docs/architecture.md): a function that outgrows it is split where its concepts part."""
    import ast

    root = Path(__file__).resolve().parent.parent
    too_long = []
    for pkg in ("sim", "schedulers", "runtime"):
        for path in sorted((root / pkg).rglob("*.py")):
            src = path.read_text()
            rel = path.relative_to(root).as_posix()
            if src.count("\n") > 800:
                too_long.append(f"{rel}: {src.count(chr(10))} lines")
            for node in ast.walk(ast.parse(src)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                    if n > 80:
                        too_long.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    assert too_long == []
