"""`python -m bench.cold_call`: what a small layer call costs right after a pass that
streamed a lot of memory (:mod:`calibration.cold_call`, where the code and its
documentation live)."""

from calibration.cold_call import main

if __name__ == "__main__":
    raise SystemExit(main())
