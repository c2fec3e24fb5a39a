"""Run the example sweeps in experiments/sweeps/ through the Python API.

    python -m experiments.example_sweeps [--jobs 2] [--out results/sweeps]

Each sweep writes OUT/STEM/results.csv and OUT/STEM/runs/; rerunning resumes.
Prints one line per sweep: points, ok/error, wall time.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from experiments.sweep import load_sweep, run_sweep

SWEEPS = sorted((Path(__file__).parent / "sweeps").glob("*.yaml"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default="results/sweeps")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    a = ap.parse_args()
    for path in SWEEPS:
        sweep = load_sweep(path)
        t0 = time.perf_counter()
        table = run_sweep(sweep, Path(a.out) / path.stem, jobs=a.jobs, progress=not a.quiet)
        st = table.attrs["sweep"]
        print(f"{path.stem}: {st['points']} points ({st['ok']} ok, {st['error']} error, "
              f"{st['skipped']} already done), {time.perf_counter() - t0:.2f} s -> {st['csv']}")


if __name__ == "__main__":
    main()
