"""`python -m bench.calibration_accuracy`: leave-one-model-out prediction of measured
layer times (:mod:`calibration.accuracy`, where the code and its documentation live)."""

from calibration.accuracy import main

if __name__ == "__main__":
    raise SystemExit(main())
