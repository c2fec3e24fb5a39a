"""`python -m bench.gemm_shapes`: how far Linear layers of different shapes differ in
speed at few rows (:mod:`calibration.gemm_shapes`, where the code and its documentation
live)."""

from calibration.gemm_shapes import main

if __name__ == "__main__":
    raise SystemExit(main())
