"""Calibration: observers that turn streamed float tensors into affine qparams (see ``observers``)."""

from qnnx.calibrate.observers import (MIN_SCALE, OBSERVERS, QPARAM_DTYPES, ZERO_RANGE_SCALE, EntropyObserver,
                                      HistogramObserver, MinMaxObserver, MovingAverageObserver, MSEObserver,
                                      Observer, ObserverConfig, PercentileObserver, QParams, kl_threshold_bins,
                                      make_observer, qparams_from_range, quant_range, register_observer)

__all__ = ["MIN_SCALE", "OBSERVERS", "QPARAM_DTYPES", "ZERO_RANGE_SCALE", "EntropyObserver", "HistogramObserver",
           "MSEObserver", "MinMaxObserver", "MovingAverageObserver", "Observer", "ObserverConfig",
           "PercentileObserver", "QParams", "kl_threshold_bins", "make_observer", "qparams_from_range",
           "quant_range", "register_observer"]
