"""Calibration data, below every stage that reads it: the model inputs samples must meet (specs.py),
image files as model inputs (images.py) and :class:`CalibrationData`, the one type every consumer of
samples takes (samples.py). Imports nothing of qnnx above ``qnnx.errors``."""

from qnnx.data.images import ImageFolder, ImagePreprocess
from qnnx.data.samples import CalibrationData, iter_samples
from qnnx.data.specs import InputSpec, input_specs

__all__ = ["CalibrationData", "ImageFolder", "ImagePreprocess", "InputSpec", "input_specs", "iter_samples"]
