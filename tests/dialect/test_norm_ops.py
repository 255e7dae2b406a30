"""qnnx.layer_norm / qnnx.variance kernels: schema defaults, optional inputs through the reference
evaluator, and agreement with a float64 layer norm of the dequantized input (<= 1 LSB: the kernel
rounds the exact real value; float64 numpy rounds a few times more)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import qnnx
from qnnx import QnnxError, numerics
from qnnx.dialect import REGISTRY


def _run(name, *inputs, **attrs):
    s = REGISTRY[name]
    return s.kernel(*inputs, **s.resolve_attributes(attrs, name))[0]


def test_defaults():
    a = REGISTRY["layer_norm"].resolve_attributes({"out_dtype": "int8"}, "n")
    assert a == {"axis": -1, "epsilon": 1e-5, "out_dtype": "int8", "rounding": "half_even"}
    with pytest.raises(QnnxError, match="requires attribute 'out_dtype'"):
        REGISTRY["variance"].resolve_attributes({}, "n")


@pytest.mark.parametrize("axis", [-1, -2, 1])
def test_layer_norm_matches_float64(axis):
    rng = np.random.default_rng(1)
    q = rng.integers(-128, 128, size=(2, 6, 10)).astype(np.int8)
    gamma = rng.uniform(0.5, 2, size=(6, 10)[axis % 3 - 1:]).astype(np.float32)
    beta = rng.uniform(-1, 1, size=gamma.shape).astype(np.float32)
    y = _run("layer_norm", q, np.float32(0.1), np.int32(-5), np.float32(0.04), np.int32(2), gamma, beta,
             axis=axis, out_dtype="int8")
    r = (q.astype(np.float64) + 5) * np.float64(np.float32(0.1))
    axes = tuple(range(axis % 3, 3))
    norm = (r - r.mean(axes, keepdims=True)) / np.sqrt(r.var(axes, keepdims=True) + np.float64(np.float32(1e-5)))
    want = np.clip(np.rint((norm * gamma + beta) / np.float64(np.float32(0.04))) + 2, -128, 127)
    assert np.abs(y.astype(int) - want).max() <= 1


def test_optional_inputs_through_the_reference_evaluator():
    """Empty input names skip gamma/beta; a variance given without gamma keeps its position."""
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, size=(3, 12)).astype(np.uint8)
    v = np.array([[40], [90], [200]], np.uint8)
    consts = dict(xs=np.float32(0.05), xz=np.int32(128), ys=np.float32(0.02), yz=np.int32(128),
                  bt=np.full(12, 0.25, np.float32), vs=np.float32(0.01), vz=np.int32(0))
    node = helper.make_node("layer_norm", ["x", "xs", "xz", "ys", "yz", "", "bt", "v", "vs", "vz"], ["y"],
                            domain="qnnx", out_dtype="uint8", epsilon=0.0)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.UINT8, x.shape),
                                        helper.make_tensor_value_info("v", onnx.TensorProto.UINT8, v.shape)],
                          [helper.make_empty_tensor_value_info("y")],
                          [onnx.numpy_helper.from_array(a, n) for n, a in consts.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("qnnx", 1)])
    got = qnnx.ReferenceEvaluator(m).run(None, {"x": x, "v": v})[0]
    want = numerics.layer_norm(x, 0.05, 128, 0.02, 128, None, consts["bt"], v, 0.01, 0, epsilon=0.0,
                               out_dtype="uint8")
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, numerics.layer_norm(x, 0.05, 128, 0.02, 128, None, consts["bt"], epsilon=0.0,
                                                       out_dtype="uint8"))


def test_variance_kernel_keeps_reduced_dims():
    q = np.arange(24, dtype=np.int8).reshape(2, 3, 4)
    y = _run("variance", q, np.float32(1.0), np.int32(0), np.float32(1.0), np.int32(0), axis=1, out_dtype="uint8")
    assert y.shape == (2, 1, 1)
    assert y.ravel().tolist() == [round(np.arange(12).var())] * 2
