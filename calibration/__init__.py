"""Everything that measures a machine or fits a profile to measurements.

This layer sits above the model (:mod:`sim`), the schedulers and the runtime, and
below :mod:`experiments`: it may use the runtime's own code to measure what the
runtime's messages cost, and the cost model to fit a profile, but nothing below it
imports it. What a profile *is* (its schema and loader) lives in
:mod:`hardware_profiles`.

- :mod:`calibration.profiler`: ``hetsim profile``, one module per benchmark behind
  one registry (:mod:`calibration.profiler.registry`);
- :mod:`calibration.calibrate`: ``hetsim calibrate``, the fit of a profile's curves
  to its raw measurements;
- :mod:`calibration.robotics_kernels`: ``hetsim profile --suite robotics``, the
  robotics kernels timed on this machine;
- :mod:`calibration.host`: what ``hetsim validate`` measures of this machine just
  before a run (cores, background load, copy speed, standalone compute);
- :mod:`calibration.runtime_cpu`: the runtime CPU model fitted to real runs;
- the calibration benches' code (:mod:`calibration.accuracy`,
  :mod:`calibration.cold_call`, :mod:`calibration.gemm_shapes`,
  :mod:`calibration.measurement_noise`, :mod:`calibration.saved_runs`), run as
  ``python -m bench.NAME``.
"""
