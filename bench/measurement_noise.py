"""`python -m bench.measurement_noise`: how far repeated measurements of one zoo model
differ on this machine (:mod:`calibration.measurement_noise`, where the code and its
documentation live)."""

from calibration.measurement_noise import main

if __name__ == "__main__":
    raise SystemExit(main())
