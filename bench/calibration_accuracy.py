"""`python -m bench.calibration_accuracy`: leave-one-model-out prediction of measured
layer times (:mod:`calibration.accuracy`, where the code and its documentation live),
its ``--plot`` figure drawn by :func:`experiments.plots.calibration_figure`."""

from calibration.accuracy import main
from experiments.plots import calibration_figure

if __name__ == "__main__":
    raise SystemExit(main(figure=calibration_figure))
