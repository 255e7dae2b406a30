"""The qparams rules of every qnnx op (qnnx.dialect.qparams), shared by import, from_qdq and lower."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import qnnx
from qnnx.dialect import REGISTRY
from qnnx.dialect.qparams import OPERAND_TYPES, QPARAMS, check_graph
from qnnx.errors import QnnxError
from qnnx.ir import load_model


def test_every_registered_op_has_its_rules():
    assert set(QPARAMS) == set(REGISTRY)
    assert set(OPERAND_TYPES) <= set(REGISTRY)


def _requantize(si=0.01, zi=0, so=0.1, zo=0, *, x=(T.INT32, [1, 3, 2]), axis=1, **attrs):
    inits = [numpy_helper.from_array(np.asarray(v, dtype), n) for v, dtype, n in
             ((si, np.float32, "si"), (zi, np.int32, "zi"), (so, np.float32, "so"), (zo, np.int32, "zo"))]
    attrs = {"out_dtype": "int8", "axis": axis, **attrs}
    node = helper.make_node("requantize", ["x", "si", "zi", "so", "zo"], ["y"], name="rq", domain="qnnx", **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", *x)],
                          [helper.make_tensor_value_info("y", T.INT8, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("qnnx", 1)])


def _message(model) -> str:
    with pytest.raises(QnnxError) as info:
        check_graph(load_model(model).graph)
    return str(info.value)


def test_a_valid_node_passes():
    check_graph(load_model(_requantize()).graph)
    check_graph(load_model(_requantize(so=[0.1, 0.2, 0.3], zo=[0, 1, -1])).graph)


@pytest.mark.parametrize("kw,expected", [
    (dict(so=0.0), "output_scale must be positive and finite"),
    (dict(so=-0.5), "output_scale must be positive and finite"),
    (dict(so=np.nan), "output_scale must be positive and finite"),
    (dict(so=np.inf), "output_scale must be positive and finite"),
    (dict(so=1e-40), "output_scale must be at least"),
    (dict(zo=128), "output_zero_point 128 is outside the int8 range [-128, 127]"),
    (dict(zi=5, x=(T.UINT8, [1, 3, 2]), zo=-129), "output_zero_point -129"),
    (dict(so=[0.1, 0.2], zo=[0, 0]), "output_scale has 2 values but axis 1 of x 'x' (shape [1, 3, 2]) has 3"),
    (dict(so=[0.1, 0.2, 0.3], zo=[0, 0, 0], axis=3), "axis=3 is out of range for a rank-3 tensor"),
    (dict(so=[[0.1, 0.2, 0.3]]), "output_scale must be a scalar or 1-D"),
    (dict(so=[0.1, 0.2, 0.3], zo=[0, 0]), "output_zero_point has 2 values"),
])
def test_bad_qparams_name_the_node_and_the_rule(kw, expected):
    msg = _message(_requantize(**kw))
    assert msg.startswith("node 'rq' (qnnx.requantize): ") and expected in msg, msg


def test_a_missing_required_attribute_or_input_is_refused():
    m = _requantize()
    del m.graph.node[0].attribute[:]
    assert "requires attribute 'out_dtype'" in _message(m)
    m = _requantize()
    del m.graph.node[0].input[3:]
    assert "missing its input 'output_scale'" in _message(m)


def _conv(x_dtype=T.UINT8, x_zp=np.int32(0), w_zp=np.zeros(3, np.int32)):
    inits = [numpy_helper.from_array(np.ones((3, 2, 3, 3), np.int8), "w"),
             numpy_helper.from_array(np.float32(0.1), "xs"), numpy_helper.from_array(np.asarray(x_zp), "xz"),
             numpy_helper.from_array(np.full(3, 0.1, np.float32), "ws"), numpy_helper.from_array(w_zp, "wz")]
    node = helper.make_node("conv", ["x", "w", "xs", "xz", "ws", "wz"], ["y"], name="conv", domain="qnnx")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", x_dtype, [1, 2, 4, 4])],
                          [helper.make_tensor_value_info("y", T.INT32, [1, 3, 2, 2])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("qnnx", 1)])


def test_conv_rules():
    check_graph(load_model(_conv()).graph)
    assert "x_zero_point must be an integer tensor, got dtype float32" in _message(_conv(x_zp=np.float32(1)))
    assert "per-channel x qparams need a depthwise conv" in _message(_conv(x_zp=np.zeros(2, np.int32)))
    assert "x has dtype int32; qnnx.conv takes int8/uint8/int16/uint16" in _message(_conv(x_dtype=T.INT32))
    assert "w_zero_point has 2 values but axis 0 of w 'w'" in _message(_conv(w_zp=np.zeros(2, np.int32)))


def _depthwise(x_scale, x_zp):
    inits = [numpy_helper.from_array(np.ones((4, 1, 3, 3), np.int8), "w"), numpy_helper.from_array(x_scale, "xs"),
             numpy_helper.from_array(x_zp, "xz"), numpy_helper.from_array(np.full(4, 0.1, np.float32), "ws"),
             numpy_helper.from_array(np.int32(0), "wz")]
    node = helper.make_node("conv", ["x", "w", "xs", "xz", "ws", "wz"], ["y"], name="conv", domain="qnnx", group=2)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", T.UINT8, [1, 2, 4, 4])],
                          [helper.make_tensor_value_info("y", T.INT32, [1, 4, 2, 2])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("qnnx", 1)])


def test_a_depthwise_conv_takes_per_channel_x_qparams():
    check_graph(load_model(_depthwise(np.full(2, 0.1, np.float32), np.array([3, 200], np.int32))).graph)
    assert "x_zero_point has 3 values but axis 1 of x" in _message(_depthwise(np.float32(0.1), np.zeros(3, np.int32)))
    assert "x_zero_point 300 is outside the uint8 range" in _message(_depthwise(np.float32(0.1),
                                                                              np.array([0, 300], np.int32)))


def _blocked_dequantize(scale_shape, block):
    inits = [numpy_helper.from_array(np.ones((4, 6), np.int8), "w"),
             numpy_helper.from_array(np.full(scale_shape, 0.1, np.float32), "s"),
             numpy_helper.from_array(np.int32(0), "z")]
    node = helper.make_node("dequantize", ["w", "s", "z"], ["y"], name="dq", domain="qnnx", axis=0, block_size=block)
    g = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", T.FLOAT, [4, 6])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("qnnx", 1)])


def test_blocked_rules():
    check_graph(load_model(_blocked_dequantize((2, 6), 2)).graph)
    check_graph(load_model(_blocked_dequantize((2, 6), 3)).graph)  # ceil(4 / 3) blocks: ONNX allows a short last one
    assert "block_size must be positive, got -2" in _message(_blocked_dequantize((2, 6), -2))
    assert "blocked scale has shape (2, 6), expected (4, 6)" in _message(_blocked_dequantize((2, 6), 1))
    assert "must have the input's rank" in _message(_blocked_dequantize((12,), 2))


def test_import_from_qdq_and_lower_apply_the_same_check(tmp_path):
    """One check: a bad qparam in a qnnx file is refused by all three, not only by lower."""
    path = tmp_path / "m.onnx"
    onnx.save(_requantize(zo=200), path)
    for fn in (qnnx.import_onnx, qnnx.from_qdq, qnnx.lower):
        with pytest.raises(QnnxError, match="node 'rq' .*output_zero_point 200 is outside the int8 range"):
            fn(path)
