"""GPU fidelity: the shipped GPU profiles against published training throughput.

    python -m bench.gpu_fidelity [--table CSV] [--loo] [--out results/gpu_fidelity] [--quiet]

Prices every single-GPU row of a published table (default: the reference table the
profiles were fitted to, ``calibration/data/gpu_training_throughput.csv``) with the
shipped profiles as they are, and prints each row's predicted, measured and error, the
median and largest |error| and the median signed error per precision (the figures
``docs/modelling/gpu.md`` reports). ``--loo`` also refits the parameters without each
row in turn, from the fit's own start (``calibration.published.X0``, not from the
shipped values), and prices the row left out: how the method does on a row it has not
seen (about 25 s a row here). ``--lodo`` refits without each device's rows and prices
that device's rows in the precisions the other devices' rows cover: how the per-mode
parameters carry to a GPU generation the fit has not seen. Writes OUT/gpu_fidelity.json and OUT/predicted_vs_measured.png.

Another table (other GPUs, other harnesses) is checked the same way with ``--table``:
the profiles are not refitted to it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import numpy as np

from calibration import published as P
from hardware_profiles import load_profile
from hardware_profiles.errors import ConfigError
from hardware_profiles.fileio import atomic_write


def leave_one_out(rows: Sequence[P.Row], quiet: bool = False) -> list[P.Outcome]:
    """Each row priced by parameters fitted to the others (from :data:`P.X0`)."""
    base = {r.profile: load_profile(r.profile) for r in rows}
    out = []
    for i, row in enumerate(rows):
        t0 = time.perf_counter()
        theta = P.rounded(P.fit([r for j, r in enumerate(rows) if j != i], base))
        fitted = {k: P.with_parameters(p, theta) for k, p in base.items()}
        out.append(P.Outcome(row, float(P.predict([row], fitted)[0])))
        if not quiet:
            print(f"left out {row.id}: {out[-1].error:+.1%} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return out


def leave_one_device_out(rows: Sequence[P.Row], quiet: bool = False) -> tuple[list[P.Outcome], list[P.Skipped]]:
    """Each device's rows priced by parameters fitted to the other devices' rows (from
    :data:`P.X0`); a row whose precision no other device's row has is skipped (the fit
    has nothing to set that mode's efficiencies from)."""
    base = {r.profile: load_profile(r.profile) for r in rows}
    out: list[P.Outcome] = []
    skipped: list[P.Skipped] = []
    for dev in sorted(base):
        train = [r for r in rows if r.profile != dev]
        modes = {r.dtype for r in train}
        test = [r for r in rows if r.profile == dev and r.dtype in modes]
        skipped += [P.Skipped(r.id, f"no other device has a {r.dtype} row") for r in rows
                    if r.profile == dev and r.dtype not in modes]
        if not test or not train:
            continue
        t0 = time.perf_counter()
        theta = P.rounded(P.fit(train, base))
        fitted = {k: P.with_parameters(p, theta) for k, p in base.items()}
        out += [P.Outcome(r, float(x)) for r, x in zip(test, P.predict(test, fitted), strict=True)]
        if not quiet:
            print(f"left out {dev}: {len(test)} rows ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    return out, skipped


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_fidelity", description=__doc__.split("\n")[0])
    ap.add_argument("--table", default=str(P.DEFAULT_TABLE), help="published measurements (CSV)")
    ap.add_argument("--loo", action="store_true", help="also refit without each row and price it")
    ap.add_argument("--lodo", action="store_true", help="also refit without each device and price its rows")
    ap.add_argument("--out", default="results/gpu_fidelity", help="output folder")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    args = ap.parse_args(argv)
    try:
        rows, skipped = P.read_table(args.table)
    except ConfigError as e:
        print(f"hetsim: error: {e}", file=sys.stderr)
        return 2
    single = [r for r in rows if r.gpus == 1]
    skipped += [P.Skipped(r.id, f"{r.gpus} GPUs: the collective is not priced here") for r in rows if r.gpus != 1]
    if not single:
        print(f"hetsim: error: {args.table}: gpus: no single-GPU row hetsim can price", file=sys.stderr)
        return 2
    profiles = {r.profile: load_profile(r.profile) for r in single}
    shipped = [P.Outcome(r, float(x)) for r, x in zip(single, P.predict(single, profiles), strict=True)]
    print("# the shipped profiles")
    sys.stdout.write(P.report(shipped, skipped, None))
    doc: dict = {"table": args.table, "shipped": P.summary(shipped),
                 "rows": [{**asdict(o.row), "predicted_sps": o.predicted_sps, "error": o.error} for o in shipped]}
    if args.loo:
        loo = leave_one_out(single, args.quiet)
        print("\n# each row priced by a fit without it")
        sys.stdout.write(P.report(loo, [], None))
        doc["leave_one_out"] = P.summary(loo)
        doc["leave_one_out_rows"] = {o.row.id: o.error for o in loo}
    if args.lodo:
        lodo, lodo_skipped = leave_one_device_out(single, args.quiet)
        print("\n# each device's rows priced by a fit to the other devices")
        sys.stdout.write(P.report(lodo, lodo_skipped, None))
        doc["leave_one_device_out"] = P.summary(lodo)
        doc["leave_one_device_out_rows"] = {o.row.id: o.error for o in lodo}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "gpu_fidelity.json", json.dumps(doc, indent=2, default=float) + "\n")
    P.figure(shipped, out / "predicted_vs_measured.png", "hetsim vs published single-GPU training")
    errs = np.array([o.error for o in shipped])
    print(f"\nwrote {out / 'gpu_fidelity.json'}; median |error| {np.median(np.abs(errs)):.1%}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
