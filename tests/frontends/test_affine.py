"""qnnx.frontends.affine: the affine type FQ2I attaches to every integer value."""

from __future__ import annotations

import numpy as np

from qnnx.dtypes import int_type
from qnnx.frontends.affine import AffineType


def test_qparams_repeated_along_an_axis_are_per_tensor():
    t = AffineType(np.full(5, 0.25, np.float32), np.full(5, 7), int_type("uint8"), axis=1)
    assert t.per_tensor and t.scale.shape == () and t.zero_point.shape == ()
    assert t.same_as(AffineType(np.float32(0.25), np.int64(7), int_type("uint8")))


def test_qparams_that_vary_along_the_axis_stay_per_axis():
    scales = AffineType(np.array([0.25, 0.5], np.float32), np.array([7, 7]), int_type("uint8"), axis=0)
    zero_points = AffineType(np.array([0.25, 0.25], np.float32), np.array([7, 8]), int_type("uint8"), axis=0)
    for t in (scales, zero_points):
        assert not t.per_tensor and t.axis == 0 and t.scale.shape == (2,)
