"""The fuzz suite of tests/test_fuzz.py, run longer (`python -m bench.fuzz --examples 500`).

Each generated-input property runs ``--examples`` examples (the same fixed seed as in
CI, so a longer run extends the CI inputs); a failure (a traceback, a hang, a non-finite
output, an error of more than one line) stops with hypothesis's minimal example.
Prints, per property, the examples run, how many ended in exit 0 and in exit 2, and the
wall time. Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

PROPERTIES = ("test_fuzz_configs", "test_fuzz_models", "test_fuzz_profiles", "test_fuzz_plans",
              "test_fuzz_sweep_files", "test_fuzz_config_text")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=500, help="examples per property (default 500)")
    ap.add_argument("--only", help="comma-separated property names (default: all)")
    a = ap.parse_args(argv)
    os.environ["HETSIM_FUZZ_EXAMPLES"] = str(a.examples)  # read when tests.test_fuzz is imported
    fuzz = importlib.import_module("tests.test_fuzz")
    names = a.only.split(",") if a.only else PROPERTIES
    total = 0
    for name in names:
        before = dict(fuzz.OUTCOMES)
        t0 = time.monotonic()
        getattr(fuzz, name)()
        ok = fuzz.OUTCOMES["exit 0"] - before.get("exit 0", 0)
        refused = fuzz.OUTCOMES["exit 2"] - before.get("exit 2", 0)
        total += ok + refused
        print(f"{name}: {ok + refused} runs, {ok} exit 0 (finite outputs), {refused} exit 2 (one line); "
              f"0 tracebacks, 0 hangs; {time.monotonic() - t0:.0f} s", flush=True)
    print(f"all: {total} runs, 0 tracebacks, 0 hangs, 0 non-finite outputs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
