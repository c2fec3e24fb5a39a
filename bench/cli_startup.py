"""`python -m bench.cli_startup`: how long `hetsim --help` (and each verb's help) takes.

Runs ``python -m experiments.cli ARGS`` in fresh processes, REPEAT times each, and
prints the median and fastest wall time, the time of a bare ``python -c pass`` for
reference, and which heavy modules the command imported (none is the goal: the
CLI defers scipy, torch, stable-baselines3, pandas, matplotlib, numpy and pydantic
to the verbs that use them). The target is under 0.5 s for ``--help``.

    python -m bench.cli_startup [--repeat 7] [--verb simulate]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("scipy", "torch", "stable_baselines3", "sb3_contrib", "pandas", "matplotlib", "numpy", "pydantic",
         "gymnasium", "simpy", "dask")


def _time(argv: list[str], repeat: int) -> list[float]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        times.append(time.perf_counter() - t0)
    return times


def heavy_imports(args: list[str]) -> list[str]:
    """The heavy modules that parsing ``args`` (a help request) imports."""
    code = ("import contextlib, io, sys\nfrom experiments import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n    try:\n"
            "        cli.build_parser().parse_args(sys.argv[1:])\n    except SystemExit:\n        pass\n"
            f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    return run.stdout.split()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cli_startup", description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7, help="runs of each command (default 7)")
    ap.add_argument("--verb", action="append", default=[], help="also time VERB --help; repeatable")
    a = ap.parse_args(argv)
    base = _time([sys.executable, "-c", "pass"], a.repeat)
    print(f"python -c pass: median {statistics.median(base):.3f} s, fastest {min(base):.3f} s")
    for args in (["--help"], ["--version"], *([v, "--help"] for v in a.verb)):
        t = _time([sys.executable, "-m", "experiments.cli", *args], a.repeat)
        heavy = heavy_imports(args)
        print(f"hetsim {' '.join(args)}: median {statistics.median(t):.3f} s, fastest {min(t):.3f} s "
              f"({a.repeat} runs); heavy modules imported: {', '.join(heavy) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
