"""`python -m bench.runtime_calibration`: fit the runtime CPU model to real runs of configs
that are not validated (:mod:`experiments.runtime_calibration`, where the code and its
documentation live)."""

from experiments.runtime_calibration import main

if __name__ == "__main__":
    raise SystemExit(main())
