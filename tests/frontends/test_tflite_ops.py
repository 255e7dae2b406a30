"""Per-op tests of the TFLite frontend against LiteRT's interpreter on its reference kernels.

Each case is a single-op full-integer model (int8, or int16 activations with int8 weights); equal
means every output element identical on qnnx.ReferenceEvaluator and on the lowered model in ONNX
Runtime, for several random inputs (every input value for the elementwise functions). Each op also
has a negative case: what the rule refuses, and the reason ``strict=True`` reports.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

pytest.importorskip("ai_edge_litert")

import qnnx  # noqa: E402
from qnnx.errors import QnnxError  # noqa: E402
from qnnx.frontends.tflite import convert, from_tflite  # noqa: E402
from qnnx.runtime import session  # noqa: E402
from tests.frontends.tflite_build import T, model, opts, random_input, run  # noqa: E402

I8, I16, I32, I64 = np.int8, np.int16, np.int32, np.int64
RNG = np.random.default_rng(26)


def _weights(rng, shape, axis):
    w = rng.integers(-127, 128, size=shape).astype(I8)
    scale = rng.uniform(0.002, 0.02, size=shape[axis]).astype(np.float32)
    return w, scale


def conv_case(dtype, depthwise=False, padding=0, stride=1, act=0, dilation=1, bias64=None):
    rng = np.random.default_rng(1)
    c, m = 4, 8 if depthwise else 6
    x = T((1, 9, 8, c), dtype, 0.05, 0 if dtype == I16 else -3)
    if depthwise:
        w, ws = _weights(rng, (1, 3, 3, m), 3)
        wt = T(w.shape, I8, ws, 0, 3, w)
        o = opts("DepthwiseConv2DOptions", padding=padding, strideW=stride, strideH=stride, depthMultiplier=m // c,
                 fusedActivationFunction=act, dilationWFactor=dilation, dilationHFactor=dilation)
        code = "DEPTHWISE_CONV_2D"
    else:
        w, ws = _weights(rng, (m, 3, 2, c), 0)
        wt = T(w.shape, I8, ws, 0, 0, w)
        o = opts("Conv2DOptions", padding=padding, strideW=stride, strideH=stride, fusedActivationFunction=act,
                 dilationWFactor=dilation, dilationHFactor=dilation)
        code = "CONV_2D"
    bias_type = I64 if (bias64 if bias64 is not None else dtype == I16) else I32
    bias = T((m,), bias_type, 0.05 * ws, 0, 0, rng.integers(-5000, 5000, m))
    oh = (9 + stride - 1) // stride if padding == 0 else (9 - 2 * dilation + stride) // stride
    ow_k = 3 if depthwise else 2
    ow = (8 + stride - 1) // stride if padding == 0 else (8 - (ow_k - 1) * dilation - 1 + stride) // stride
    y = T((1, oh, ow, m), dtype, 0.3, 0 if dtype == I16 else 5)
    return model(code, [x, wt, bias], [y], o)


def fc_case(dtype, per_channel, act=0):
    rng = np.random.default_rng(2)
    w, ws = _weights(rng, (5, 12), 0)
    if not per_channel:
        ws = ws[:1]
    x = T((16, 12), dtype, 0.04, 0 if dtype == I16 else 7)
    bias = T((5,), I64 if dtype == I16 else I32, 0.04 * ws, 0, 0, rng.integers(-3000, 3000, 5))
    y = T((16, 5), dtype, 0.2, 0 if dtype == I16 else -9)
    return model("FULLY_CONNECTED", [x, T(w.shape, I8, ws, 0, 0, w), bias], [y],
                 opts("FullyConnectedOptions", fusedActivationFunction=act))


def binary_case(code, dtype, act=0, broadcast=False):
    zp = (lambda z: 0) if dtype == I16 else (lambda z: z)
    a = T((1, 4, 5, 3), dtype, 0.031, zp(-4))
    b = T((1, 1, 1, 3) if broadcast else (1, 4, 5, 3), dtype, 0.017, zp(11))
    y = T((1, 4, 5, 3), dtype, 0.045 if code != "MUL" else 0.0007, zp(-2))
    kind = {"ADD": "AddOptions", "SUB": "SubOptions", "MUL": "MulOptions"}[code]
    return model(code, [a, b], [y], opts(kind, fusedActivationFunction=act))


def pool_case(code, dtype, padding=0, act=0):
    zp = 0 if dtype == I16 else -7
    x = T((1, 7, 6, 3), dtype, 0.05, zp)
    oh, ow = ((4, 3) if padding == 0 else (3, 2))
    return model(code, [x], [T((1, oh, ow, 3), dtype, 0.05, zp)],
                 opts("Pool2DOptions", padding=padding, strideW=2, strideH=2, filterWidth=3, filterHeight=2,
                      fusedActivationFunction=act))


def mean_case(dtype, axes, out_shape, keep=False):
    zp = (0, 0) if dtype == I16 else (-5, 3)
    return model("MEAN", [T((1, 5, 7, 6), dtype, 0.03, zp[0]), T((len(axes),), I32, data=np.array(axes))],
                 [T(out_shape, dtype, 0.011, zp[1])], opts("ReducerOptions", keepDims=keep))


def unary_case(code, dtype, x_q, y_q, options=None, shape=None):
    n = 1 << np.iinfo(dtype).bits
    shape = shape or (1, n)
    return model(code, [T(shape, dtype, *x_q)], [T(shape, dtype, *y_q)], options)


def all_values(dtype):
    info = np.iinfo(dtype)
    return [np.arange(info.min, info.max + 1).astype(dtype).reshape(1, -1)]


CASES = {
    "conv_int8_same": (lambda: conv_case(I8), None),
    "conv_int8_valid_stride2_relu6": (lambda: conv_case(I8, padding=1, stride=2, act=3), None),
    "conv_int8_dilated_relu": (lambda: conv_case(I8, act=1, dilation=2), None),
    "conv_int16x8_int64_bias": (lambda: conv_case(I16), None),
    "conv_int16x8_relu": (lambda: conv_case(I16, act=1), None),
    "depthwise_int8_same": (lambda: conv_case(I8, depthwise=True), None),
    "depthwise_int8_valid_relu6": (lambda: conv_case(I8, depthwise=True, padding=1, act=3), None),
    "depthwise_int16x8": (lambda: conv_case(I16, depthwise=True, stride=2), None),
    "fc_int8_per_tensor": (lambda: fc_case(I8, False), None),
    "fc_int8_per_channel_relu": (lambda: fc_case(I8, True, act=1), None),
    "fc_int16x8_per_tensor": (lambda: fc_case(I16, False), None),
    "fc_int16x8_per_channel": (lambda: fc_case(I16, True), None),
    "add_int8": (lambda: binary_case("ADD", I8), None),
    "add_int8_broadcast_relu": (lambda: binary_case("ADD", I8, act=1, broadcast=True), None),
    "add_int16": (lambda: binary_case("ADD", I16), None),
    "sub_int8": (lambda: binary_case("SUB", I8), None),
    "sub_int16": (lambda: binary_case("SUB", I16), None),
    "mul_int8_broadcast": (lambda: binary_case("MUL", I8, broadcast=True), None),
    "mul_int16_relu6": (lambda: binary_case("MUL", I16, act=3), None),
    "max_pool_int8_same": (lambda: pool_case("MAX_POOL_2D", I8), None),
    "max_pool_int16_valid_relu": (lambda: pool_case("MAX_POOL_2D", I16, padding=1, act=1), None),
    "avg_pool_int8_same": (lambda: pool_case("AVERAGE_POOL_2D", I8), None),
    "avg_pool_int8_valid_relu6": (lambda: pool_case("AVERAGE_POOL_2D", I8, padding=1, act=3), None),
    "avg_pool_int16_same": (lambda: pool_case("AVERAGE_POOL_2D", I16), None),
    "mean_int8_spatial": (lambda: mean_case(I8, [1, 2], (1, 6)), None),
    "mean_int8_keepdims": (lambda: mean_case(I8, [1, 2], (1, 1, 1, 6), keep=True), None),
    "mean_int8_last_axis": (lambda: mean_case(I8, [3], (1, 5, 7)), None),
    "mean_int16_spatial": (lambda: mean_case(I16, [1, 2], (1, 6)), None),
    "logistic_int8": (lambda: unary_case("LOGISTIC", I8, (0.061, 3), (1 / 256, -128)), all_values(I8)),
    "logistic_int8_fine": (lambda: unary_case("LOGISTIC", I8, (0.0123, -20), (1 / 256, -128)), all_values(I8)),
    "logistic_int16": (lambda: unary_case("LOGISTIC", I16, (0.00031, 0), (2 ** -15, 0)), all_values(I16)),
    "logistic_int16_pot": (lambda: unary_case("LOGISTIC", I16, (2 ** -12, 0), (2 ** -15, 0)), all_values(I16)),
    "tanh_int8": (lambda: unary_case("TANH", I8, (0.03, -2), (1 / 128, 0)), all_values(I8)),
    "tanh_int16": (lambda: unary_case("TANH", I16, (0.00027, 0), (2 ** -15, 0)), all_values(I16)),
    "tanh_int16_pot": (lambda: unary_case("TANH", I16, (2 ** -11, 0), (2 ** -15, 0)), all_values(I16)),
    "hard_swish_int8": (lambda: unary_case("HARD_SWISH", I8, (0.05, 3), (0.03, -20)), all_values(I8)),
    "hard_swish_int8_coarse": (lambda: unary_case("HARD_SWISH", I8, (0.11, -40), (0.09, -100)), all_values(I8)),
    "relu_int8": (lambda: unary_case("RELU", I8, (0.05, -10), (0.03, -128)), all_values(I8)),
    "relu6_int8": (lambda: unary_case("RELU6", I8, (0.07, 4), (0.025, -128)), all_values(I8)),
    "relu_n1_to_1_int8": (lambda: unary_case("RELU_N1_TO_1", I8, (0.02, 0), (0.009, 0)), all_values(I8)),
    "relu_int16": (lambda: unary_case("RELU", I16, (0.00029211, 0), (0.00020498, 0)), all_values(I16)),
    "leaky_relu_int8": (lambda: unary_case("LEAKY_RELU", I8, (0.05, 3), (0.04, -20), opts("LeakyReluOptions", alpha=0.2)),
                        all_values(I8)),
    "leaky_relu_int16": (lambda: unary_case("LEAKY_RELU", I16, (0.0004, 0), (0.0003, 0), opts("LeakyReluOptions", alpha=0.1)),
                         all_values(I16)),
}


def _prelu_case():
    alpha = np.array([[[-100, 5, 60, 127]]], I8)
    return model("PRELU", [T((2, 3, 256, 4), I8, 0.05, 4), T(alpha.shape, I8, 0.01, -3, data=alpha)],
                 [T((2, 3, 256, 4), I8, 0.04, -10)])


CASES["prelu_int8_per_channel"] = (_prelu_case, [np.broadcast_to(np.arange(-128, 128, dtype=I8)[None, None, :, None],
                                                                 (2, 3, 256, 4)).copy()])
CASES["softmax_int8"] = (lambda: model("SOFTMAX", [T((3, 7, 10), I8, 0.1, 3)], [T((3, 7, 10), I8, 1 / 256, -128)],
                                       opts("SoftmaxOptions", beta=1.0)), None)
CASES["softmax_int8_coarse"] = (lambda: model("SOFTMAX", [T((4, 300), I8, 0.71, -1)], [T((4, 300), I8, 1 / 256, -128)],
                                              opts("SoftmaxOptions", beta=1.0)), None)
CASES["softmax_int8_fine"] = (lambda: model("SOFTMAX", [T((4, 33), I8, 0.0041, 20)], [T((4, 33), I8, 1 / 256, -128)],
                                            opts("SoftmaxOptions", beta=1.0)), None)
CASES["softmax_int8_to_int16"] = (lambda: model("SOFTMAX", [T((5, 40), I8, 0.05, 0)], [T((5, 40), I16, 1 / 65536, -32768)],
                                                opts("SoftmaxOptions", beta=1.0)), None)
CASES["prelu_int16_int8_alpha"] = (lambda: model("PRELU", [T((1, 256, 3), I16, 0.0005, 0),
                                                            T((3,), I8, 0.01, 2, data=np.array([-100, 20, 90]))],
                                                  [T((1, 256, 3), I16, 0.0004, 0)]),
                                    [np.arange(-32768, 32768, dtype=I16).reshape(1, 256, 256)[:, :, :3].copy()])
CASES["relu6_int16"] = (lambda: unary_case("RELU6", I16, (0.0003, 0), (0.0002, 0)), all_values(I16))
CASES["dequantize_int16"] = (lambda: model("DEQUANTIZE", [T((1, 65536), I16, 0.0007, 0)], [T((1, 65536), np.float32)]),
                             all_values(I16))
CASES["requantize_int8_to_int16"] = (lambda: model("QUANTIZE", [T((1, 256), I8, 0.05, 2)], [T((1, 256), I16, 0.0003, 0)]),
                                     all_values(I8))
CASES["requantize_int16"] = (lambda: model("QUANTIZE", [T((1, 65536), I16, 0.0003, 0)], [T((1, 65536), I16, 0.0007, 0)]),
                             all_values(I16))
CASES["transpose_int16"] = (lambda: model("TRANSPOSE", [T((2, 4, 3), I16, 0.1, 0), T((3,), I32, data=np.array([2, 0, 1]))],
                                          [T((3, 2, 4), I16, 0.1, 0)]), None)
CASES["strided_slice_int16_negative_stride"] = (lambda: model(
    "STRIDED_SLICE", [T((1, 8, 7, 4), I16, 0.1, 0), T((4,), I32, data=np.array([0, -1, 0, 0])),
                      T((4,), I32, data=np.array([1, 0, 7, 4])), T((4,), I32, data=np.array([1, -3, 3, 2]))],
    [T((1, 3, 3, 2), I16, 0.1, 0)], opts("StridedSliceOptions", beginMask=0, endMask=1)), None)
for _k, _sx in enumerate((0.0003, 0.00004, 0.002)):
    CASES[f"softmax_int16_{_k}"] = (lambda sx=_sx: model("SOFTMAX", [T((5, 70), I16, sx, 0)], [T((5, 70), I16, 1 / 32768, 0)],
                                                        opts("SoftmaxOptions", beta=1.0)), None)
CASES["quantize_float_to_int8"] = (lambda: model("QUANTIZE", [T((3, 50), np.float32)], [T((3, 50), I8, 0.02, -4)]), None)
CASES["quantize_float_to_int16"] = (lambda: model("QUANTIZE", [T((3, 50), np.float32)], [T((3, 50), I16, 0.0002, 0)]), None)
CASES["requantize_int8"] = (lambda: model("QUANTIZE", [T((1, 256), I8, 0.037, 5)], [T((1, 256), I8, 0.05, -3)]),
                            all_values(I8))
CASES["requantize_int16_to_int8"] = (lambda: model("QUANTIZE", [T((1, 65536), I16, 0.0003, 0)], [T((1, 65536), I8, 0.05, 2)]),
                                     all_values(I16))
CASES["dequantize_int8"] = (lambda: model("DEQUANTIZE", [T((1, 256), I8, 0.037, 5)], [T((1, 256), np.float32)]),
                            all_values(I8))
CASES["reshape_int8"] = (lambda: model("RESHAPE", [T((1, 4, 6, 2), I8, 0.1, 3), T((2,), I32, data=np.array([8, 6]))],
                                       [T((8, 6), I8, 0.1, 3)]), None)
CASES["squeeze_int16"] = (lambda: model("SQUEEZE", [T((1, 1, 6, 2), I16, 0.1, 0)], [T((6, 2), I16, 0.1, 0)],
                                        opts("SqueezeOptions", squeezeDims=[0, 1])), None)
CASES["transpose_int8"] = (lambda: model("TRANSPOSE", [T((1, 4, 6, 2), I8, 0.1, 3), T((4,), I32, data=np.array([0, 3, 1, 2]))],
                                         [T((1, 2, 4, 6), I8, 0.1, 3)]), None)
CASES["concat_int8"] = (lambda: model("CONCATENATION", [T((1, 4, 3, 2), I8, 0.1, 3), T((1, 4, 3, 5), I8, 0.1, 3)],
                                      [T((1, 4, 3, 7), I8, 0.1, 3)], opts("ConcatenationOptions", axis=3)), None)
CASES["concat_int16"] = (lambda: model("CONCATENATION", [T((1, 4, 3, 2), I16, 0.1, 0), T((1, 2, 3, 2), I16, 0.1, 0)],
                                       [T((1, 6, 3, 2), I16, 0.1, 0)], opts("ConcatenationOptions", axis=1)), None)
CASES["pad_int8"] = (lambda: model("PAD", [T((1, 3, 4, 2), I8, 0.1, -5), T((4, 2), I32, data=np.array([[0, 0], [1, 2], [0, 1], [0, 0]]))],
                                   [T((1, 6, 5, 2), I8, 0.1, -5)]), None)
CASES["pad_int16"] = (lambda: model("PAD", [T((1, 3, 4, 2), I16, 0.1, 0), T((4, 2), I32, data=np.array([[0, 0], [1, 1], [2, 0], [0, 0]]))],
                                    [T((1, 5, 6, 2), I16, 0.1, 0)]), None)
CASES["padv2_int8"] = (lambda: model("PADV2", [T((1, 3, 4, 2), I8, 0.1, -5), T((4, 2), I32, data=np.array([[0, 0], [1, 2], [0, 1], [0, 0]])),
                                               T((), I8, 0.1, -5, data=np.array(17, I8))],
                                     [T((1, 6, 5, 2), I8, 0.1, -5)]), None)
CASES["strided_slice_int8"] = (lambda: model(
    "STRIDED_SLICE", [T((1, 8, 7, 4), I8, 0.1, 2), T((4,), I32, data=np.array([0, 1, -1, 3])),
                      T((4,), I32, data=np.array([1, 7, 0, 4])), T((4,), I32, data=np.array([1, 2, -2, 1]))],
    [T((1, 3, 4), I8, 0.1, 2)], opts("StridedSliceOptions", beginMask=1, endMask=4, shrinkAxisMask=8)), None)
CASES["split_int8"] = (lambda: model("SPLIT", [T((), I32, data=np.array(3)), T((1, 2, 3, 6), I8, 0.1, 1)],
                                     [T((1, 2, 3, 2), I8, 0.1, 1)] * 3, opts("SplitOptions", numSplits=3)), None)
CASES["split_v_int16"] = (lambda: model("SPLIT_V", [T((1, 5, 3, 2), I16, 0.1, 0), T((2,), I32, data=np.array([2, 3])),
                                                    T((), I32, data=np.array(1))],
                                        [T((1, 2, 3, 2), I16, 0.1, 0), T((1, 3, 3, 2), I16, 0.1, 0)],
                                        opts("SplitVOptions", numSplits=2)), None)
CASES["resize_nearest_int8"] = (lambda: model(
    "RESIZE_NEAREST_NEIGHBOR", [T((1, 3, 5, 2), I8, 0.1, 1), T((2,), I32, data=np.array([7, 8]))],
    [T((1, 7, 8, 2), I8, 0.1, 1)], opts("ResizeNearestNeighborOptions", alignCorners=False, halfPixelCenters=True)), None)
for _name, _shape, _out, _align, _half, _dtype in (("resize_bilinear_half_pixel_int8", (1, 3, 5, 2), (7, 8), False, True, I8),
                                                  ("resize_bilinear_int8", (1, 4, 3, 2), (9, 5), False, False, I8),
                                                  ("resize_bilinear_align_corners_int8", (1, 3, 4, 1), (6, 7), True, False, I8),
                                                  ("resize_bilinear_half_pixel_down_int16", (1, 9, 8, 2), (4, 5), False, True, I16)):
    CASES[_name] = (lambda s=_shape, o=_out, a=_align, h=_half, d=_dtype: model(
        "RESIZE_BILINEAR", [T(s, d, 0.1, 0 if d == I16 else -3), T((2,), I32, data=np.array(o))],
        [T((1, *o, s[3]), d, 0.1, 0 if d == I16 else -3)],
        opts("ResizeBilinearOptions", alignCorners=a, halfPixelCenters=h)), None)
CASES["resize_nearest_align_corners_int16"] = (lambda: model(
    "RESIZE_NEAREST_NEIGHBOR", [T((1, 3, 5, 2), I16, 0.1, 0), T((2,), I32, data=np.array([6, 9]))],
    [T((1, 6, 9, 2), I16, 0.1, 0)], opts("ResizeNearestNeighborOptions", alignCorners=True)), None)


def _inputs_of(data: bytes, rng) -> list[np.ndarray]:
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=data)
    return [random_input(rng, T(tuple(d["shape"]), d["dtype"])) for d in it.get_input_details()]


def assert_exact(data: bytes, feeds_list: list[list[np.ndarray]]) -> None:
    """Every output of the interpreter (reference kernels) == the canonical model's on both evaluators."""
    proto = from_tflite(data, strict=True)
    names = [i.name for i in proto.graph.input]
    ev = qnnx.ReferenceEvaluator(proto)
    sess = session(qnnx.ir.to_proto(qnnx.lower(proto)))
    for feeds in feeds_list:
        want = run(data, feeds)
        feed = dict(zip(names, feeds))
        for label, got in (("reference evaluator", ev.run(None, feed)), ("onnxruntime", sess.run(None, feed))):
            assert len(got) == len(want)
            for w, g in zip(want, got):
                assert g.dtype == w.dtype and g.shape == w.shape, label
                np.testing.assert_array_equal(g, w, err_msg=label)


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_reference_kernels(name):
    build, values = CASES[name]
    data = build()
    rng = np.random.default_rng(abs(hash(name)) % 2 ** 32)
    feeds = [values] if values is not None else [_inputs_of(data, rng) for _ in range(4)]
    assert_exact(data, feeds)


# ------------------------------------------------------------------ negative cases: what is refused, and why

def _refused(data: bytes, match: str):
    with pytest.raises(QnnxError, match=match):
        convert(data, strict=True)


NEGATIVE = {
    "conv_int16x8_int32_bias": (lambda: conv_case(I16, bias64=False), "only int64 biases"),
    "conv_asymmetric_weights": (lambda: model("CONV_2D", [T((1, 4, 4, 2), I8, 0.05, 0),
                                                          T((3, 1, 1, 2), I8, [0.01] * 3, [0, 1, 0], 0, np.ones((3, 1, 1, 2))),
                                                          None], [T((1, 4, 4, 3), I8, 0.1, 0)],
                                              opts("Conv2DOptions", padding=0, strideW=1, strideH=1)),
                                "non-zero zero points"),
    "conv_products_overflow_int32": (lambda: model("CONV_2D", [T((1, 20, 20, 64), I16, 0.05, 0),
                                                               T((2, 3, 3, 64), I8, [0.01] * 2, 0, 0, np.full((2, 3, 3, 64), 127)),
                                                               T((2,), I64, [0.0005] * 2, 0, 0, np.zeros(2))],
                                                   [T((1, 20, 20, 2), I16, 0.1, 0)],
                                                   opts("Conv2DOptions", padding=0, strideW=1, strideH=1)),
                                     "products alone may exceed int32"),
    "depthwise_weights_wrong_axis": (lambda: model("DEPTHWISE_CONV_2D", [T((1, 4, 4, 2), I8, 0.05, 0),
                                                                         T((1, 2, 1, 2), I8, [0.01] * 2, 0, 1, np.ones((1, 2, 1, 2))),
                                                                         None], [T((1, 4, 4, 2), I8, 0.1, 0)],
                                                   opts("DepthwiseConv2DOptions", padding=0, strideW=1, strideH=1,
                                                        depthMultiplier=1)),
                                     "quantized along axis"),
    "fc_float_weights": (lambda: model("FULLY_CONNECTED", [T((1, 4), I8, 0.05, 0), T((2, 4), np.float32, data=np.ones((2, 4))),
                                                           None], [T((1, 2), I8, 0.1, 0)]),
                         "int8 weights only"),
    "add_mixed_types": (lambda: model("ADD", [T((1, 4), I8, 0.05, 0), T((1, 4), I16, 0.05, 0)], [T((1, 4), I8, 0.1, 0)]),
                        "different types"),
    "mul_float_output": (lambda: model("MUL", [T((1, 4), I8, 0.05, 0), T((1, 4), I8, 0.05, 0)], [T((1, 4), np.float32)]),
                         "FLOAT32, not an integer type"),
    "mul_int16_left_shift_would_wrap": (lambda: model("MUL", [T((1, 4), I16, 0.08, 0), T((1, 4), I16, 0.006, 0)],
                                                      [T((1, 4), I16, 1.5e-5, 0)]), "would wrap around"),
    "add_output_multiplier_would_wrap": (lambda: model("ADD", [T((1, 4), I8, 0.5, 0), T((1, 4), I8, 0.4, 0)],
                                                       [T((1, 4), I8, 1e-8, 0)]), "would wrap around"),
    "sub_int16_pot_scales": (lambda: model("SUB", [T((1, 4), I16, 2 ** -10, 0), T((1, 4), I16, 2 ** -9, 0)],
                                           [T((1, 4), I16, 2 ** -8, 0)], opts("SubOptions", potScaleInt16=True)),
                             "shift-only kernel"),
    "avg_pool_rescaling": (lambda: model("AVERAGE_POOL_2D", [T((1, 4, 4, 2), I8, 0.05, 0)], [T((1, 2, 2, 2), I8, 0.1, 0)],
                                         opts("Pool2DOptions", padding=1, strideW=2, strideH=2, filterWidth=2,
                                              filterHeight=2)), "different qparams"),
    "max_pool_rescaling": (lambda: model("MAX_POOL_2D", [T((1, 4, 4, 2), I8, 0.05, 0)], [T((1, 2, 2, 2), I8, 0.05, 1)],
                                         opts("Pool2DOptions", padding=1, strideW=2, strideH=2, filterWidth=2,
                                              filterHeight=2)), "different qparams"),
    "mean_per_axis_output": (lambda: model("MEAN", [T((1, 2, 2, 2), I8, 0.05, 0), T((2,), I32, data=np.array([1, 2]))],
                                           [T((1, 2), I8, [0.1, 0.2], 0)]), "per-axis qparams"),
    "logistic_int8_wrong_output_qparams": (lambda: unary_case("LOGISTIC", I8, (0.05, 0), (1 / 128, 0)),
                                           r"output qparams \(1/256, -128\)"),
    "tanh_int16_zero_point": (lambda: unary_case("TANH", I16, (0.0003, 5), (2 ** -15, 0)), "int16 TANH needs zero points 0"),
    "hard_swish_int16": (lambda: unary_case("HARD_SWISH", I16, (0.0003, 0), (0.0003, 0)), "HARD_SWISH takes 8-bit"),
    "relu_mixed_types": (lambda: model("RELU", [T((1, 4), I8, 0.05, 0)], [T((1, 4), I16, 0.05, 0)]), "types differ"),
    "leaky_relu_int32": (lambda: model("LEAKY_RELU", [T((1, 4), I32, 0.05, 0)], [T((1, 4), I32, 0.05, 0)],
                                       opts("LeakyReluOptions", alpha=0.1)), "integer rules take int8 or int16"),
    "prelu_int16_alpha": (lambda: model("PRELU", [T((1, 2, 3, 3), I16, 0.0005, 0), T((3,), I16, 0.001, 0,
                                                                                   data=np.array([-300, 20, 900]))],
                                        [T((1, 2, 3, 3), I16, 0.0004, 0)]), "takes an int8 alpha"),
    "relu_n1_to_1_int16": (lambda: unary_case("RELU_N1_TO_1", I16, (0.0001, 0), (0.00004, 0)),
                           "no int16 RELU_N1_TO_1 kernel"),
    "prelu_alpha_per_position": (lambda: model("PRELU", [T((1, 2, 3, 2), I8, 0.05, 0),
                                                         T((2, 3, 2), I8, 0.01, 0, data=np.ones((2, 3, 2)))],
                                               [T((1, 2, 3, 2), I8, 0.05, 0)]), "varies along more than the channels"),
    "quantize_per_axis_dequantize_input": (lambda: model("DEQUANTIZE", [T((2, 3), I8, [0.1, 0.2], 0, 0)],
                                                         [T((2, 3), np.float32)]), "per-axis dequantize of a computed"),
    "concat_fused_activation": (lambda: model("CONCATENATION", [T((1, 2), I8, 0.1, 0), T((1, 2), I8, 0.1, 0)],
                                              [T((1, 4), I8, 0.1, 0)], opts("ConcatenationOptions", axis=1,
                                                                            fusedActivationFunction=1)),
                                "no fused activation"),
    "concat_rescaling": (lambda: model("CONCATENATION", [T((1, 2), I8, 0.1, 0), T((1, 2), I8, 0.2, 0)], [T((1, 4), I8, 0.1, 0)],
                                       opts("ConcatenationOptions", axis=1)), "different qparams"),
    "reshape_rescaling": (lambda: model("RESHAPE", [T((1, 4), I8, 0.1, 0), T((1,), I32, data=np.array([4]))],
                                        [T((4,), I8, 0.1, 2)]), "different qparams"),
    "transpose_rescaling": (lambda: model("TRANSPOSE", [T((2, 4), I8, 0.1, 0), T((2,), I32, data=np.array([1, 0]))],
                                          [T((4, 2), I8, 0.2, 0)]), "different qparams"),
    "pad_dynamic_paddings": (lambda: model("PAD", [T((1, 4), I8, 0.1, 0), T((2, 2), I32)], [T((3, 6), I8, 0.1, 0)]),
                             "paddings .* must be a constant"),
    "strided_slice_ellipsis": (lambda: model("STRIDED_SLICE", [T((2, 4), I8, 0.1, 0), T((2,), I32, data=np.array([0, 0])),
                                                               T((2,), I32, data=np.array([1, 2])), T((2,), I32, data=np.array([1, 1]))],
                                             [T((1, 2), I8, 0.1, 0)], opts("StridedSliceOptions", ellipsisMask=1)),
                               "ellipsis_mask"),
    "squeeze_rescaling": (lambda: model("SQUEEZE", [T((1, 4), I8, 0.1, 0)], [T((4,), I8, 0.2, 0)],
                                        opts("SqueezeOptions", squeezeDims=[0])), "different qparams"),
    "expand_dims_rescaling": (lambda: model("EXPAND_DIMS", [T((4,), I8, 0.1, 0), T((1,), I32, data=np.array([0]))],
                                            [T((1, 4), I8, 0.1, 3)]), "different qparams"),
    "padv2_dynamic_paddings": (lambda: model("PADV2", [T((1, 4), I8, 0.1, 0), T((2, 2), I32), T((), I8, 0.1, 0, data=np.array(0))],
                                             [T((3, 6), I8, 0.1, 0)]), "paddings .* must be a constant"),
    "split_v_rescaling": (lambda: model("SPLIT_V", [T((1, 4), I8, 0.1, 0), T((2,), I32, data=np.array([1, 3])),
                                                    T((), I32, data=np.array(1))],
                                        [T((1, 1), I8, 0.1, 0), T((1, 3), I8, 0.3, 0)], opts("SplitVOptions", numSplits=2)),
                          "different qparams"),
    "requantize_per_axis_output": (lambda: model("QUANTIZE", [T((2, 3), I8, 0.1, 0)], [T((2, 3), I8, [0.1, 0.2], 0, 0)]),
                                   "per-axis"),
    "relu6_int32": (lambda: model("RELU6", [T((1, 4), I32, 0.05, 0)], [T((1, 4), I32, 0.05, 0)]),
                    "integer rules take int8 or int16"),
    "relu_0_to_1_int32": (lambda: model("RELU_0_TO_1", [T((1, 4), I32, 0.05, 0)], [T((1, 4), I32, 0.05, 0)]),
                          "integer rules take int8 or int16"),
    "split_rescaling": (lambda: model("SPLIT", [T((), I32, data=np.array(1)), T((1, 4), I8, 0.1, 0)],
                                      [T((1, 2), I8, 0.1, 0), T((1, 2), I8, 0.3, 0)], opts("SplitOptions", numSplits=2)),
                        "different qparams"),
    "resize_nearest_rescaling": (lambda: model("RESIZE_NEAREST_NEIGHBOR", [T((1, 2, 2, 1), I8, 0.1, 0),
                                                                           T((2,), I32, data=np.array([4, 4]))],
                                               [T((1, 4, 4, 1), I8, 0.1, 1)]), "different qparams"),
    "softmax_int16_zero_point": (lambda: model("SOFTMAX", [T((1, 10), I16, 0.001, 3)], [T((1, 10), I16, 1 / 32768, 0)],
                                               opts("SoftmaxOptions", beta=1.0)), "x_zero_point 0"),
    "softmax_int8_to_int16_other_qparams": (lambda: model("SOFTMAX", [T((5, 12), I8, 0.05, 0)],
                                                          [T((5, 12), I16, 1 / 32768, 0)], opts("SoftmaxOptions", beta=1.0)),
                                            r"int16 \(1/65536, -32768\)"),
    "softmax_beta": (lambda: model("SOFTMAX", [T((1, 10), I8, 0.1, 0)], [T((1, 10), I8, 1 / 256, -128)],
                                   opts("SoftmaxOptions", beta=0.5)), "beta 0.5"),
    "resize_bilinear_rescaling": (lambda: model("RESIZE_BILINEAR", [T((1, 2, 2, 1), I8, 0.1, 0),
                                                                   T((2,), I32, data=np.array([4, 4]))],
                                                  [T((1, 4, 4, 1), I8, 0.2, 0)]), "different qparams"),
    "maximum_has_no_rule": (lambda: model("MAXIMUM", [T((1, 4), I8, 0.1, 0), T((1, 4), I8, 0.1, 0)],
                                          [T((1, 4), I8, 0.1, 0)]), "no integer rule for MAXIMUM"),
}


@pytest.mark.parametrize("name", sorted(NEGATIVE))
def test_op_refusal_names_the_reason(name):
    build, reason = NEGATIVE[name]
    _refused(build(), reason)


def test_op_refused_by_its_rule_stays_float_and_is_listed():
    """Not strict: a SOFTMAX with beta 0.5 (its integer rule takes beta 1) runs in float between
    dequantize and quantize, listed with the reason."""
    data = model("SOFTMAX", [T((4, 64), I8, 0.1, 0)], [T((4, 64), I8, 1 / 256, -128)], opts("SoftmaxOptions", beta=0.5))
    m, report = convert(data)
    assert report.left_in_float == [("0", "SOFTMAX", "beta 0.5: the integer rule takes beta 1")]
    proto = from_tflite(data)
    assert "SOFTMAX" in {p.key: p.value for p in proto.metadata_props}["qnnx.left_in_float"]
    x = np.arange(-128, 128, dtype=I8).reshape(4, 64)
    got = qnnx.ReferenceEvaluator(proto).run(None, {"in0": x})[0]
    assert np.abs(got.astype(int) - run(data, [x])[0].astype(int)).max() <= 1  # float, not the integer kernel


def test_opcode_read_from_the_larger_field():
    """A file that fills only deprecated_builtin_code (builtin_code left 0, ADD) is read as its real op."""
    from ai_edge_litert import schema_py_generated as s
    import flatbuffers

    data = model("RELU", [T((1, 4), I8, 0.05, 0)], [T((1, 4), I8, 0.05, 0)])
    m = s.ModelT.InitFromPackedBuf(data, 0)
    m.operatorCodes[0].builtinCode = 0
    b = flatbuffers.Builder(1024)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    proto = from_tflite(bytes(b.Output()), strict=True)
    assert [n.op_type for n in proto.graph.node] == ["lut"]


def test_not_a_tflite_file():
    with pytest.raises(QnnxError, match="not a TFLite flatbuffer"):
        from_tflite(onnx.helper.make_model(onnx.helper.make_graph([], "g", [], [])).SerializeToString())


def _sweep_case(kind: str, seed: int) -> bytes:
    """A single-op model with random qparams (scales over decades, zero points over the range)."""
    rng = np.random.default_rng(seed)
    i16 = kind.endswith("16")
    d = I16 if i16 else I8

    def zp():
        return 0 if i16 else int(rng.integers(-128, 128))

    def scale(lo=-3.0, hi=0.0):
        return float(10 ** rng.uniform(lo, hi))

    if kind.startswith("conv"):
        c, m = int(rng.integers(1, 6)), int(rng.integers(1, 7))
        w, ws = _weights(rng, (m, 3, 3, c), 0)
        sx = scale(-4 if i16 else -2, -1)
        bias = T((m,), I64 if i16 else I32, sx * ws, 0, 0, rng.integers(-20000, 20000, m))
        return model("CONV_2D", [T((1, 6, 7, c), d, sx, zp()), T(w.shape, I8, ws, 0, 0, w), bias],
                     [T((1, 3, 4, m), d, scale(-3 if i16 else -1, 0), zp())],
                     opts("Conv2DOptions", padding=0, strideW=2, strideH=2, fusedActivationFunction=int(rng.integers(0, 2))))
    if kind.startswith("fc"):
        w, ws = _weights(rng, (7, 20), 0)
        sx = scale(-4 if i16 else -2, -1)
        return model("FULLY_CONNECTED", [T((3, 20), d, sx, zp()), T(w.shape, I8, ws, 0, 0, w),
                                         T((7,), I64 if i16 else I32, sx * ws, 0, 0, rng.integers(-9000, 9000, 7))],
                     [T((3, 7), d, scale(-3 if i16 else -1, 0), zp())], opts("FullyConnectedOptions"))
    if kind.startswith(("add", "mul")):
        code = "ADD" if kind.startswith("add") else "MUL"
        sa, sb = scale(), scale()
        # MUL's output scale at least the product's (with 16 bits, anything smaller shifts int32 products left)
        sy = scale(-3, 0) if code == "ADD" else sa * sb * float(10 ** rng.uniform(0, 2 if not i16 else 4))
        return model(code, [T((2, 3, 4, 5), d, sa, zp()), T((1, 1, 4, 5), d, sb, zp())], [T((2, 3, 4, 5), d, sy, zp())],
                     opts("AddOptions" if code == "ADD" else "MulOptions"))
    if kind.startswith("mean"):
        s = scale()
        return model("MEAN", [T((1, 5, 6, 3), d, s, zp()), T((2,), I32, data=np.array([1, 2]))],
                     [T((1, 3), d, s * float(rng.uniform(0.3, 3)), zp())], opts("ReducerOptions", keepDims=False))
    if kind.startswith("dw"):
        c = int(rng.integers(1, 5))
        w, ws = _weights(rng, (1, 3, 3, 2 * c), 3)
        sx = scale(-4 if i16 else -2, -1)
        bias = T((2 * c,), I64 if i16 else I32, sx * ws, 0, 0, rng.integers(-20000, 20000, 2 * c))
        return model("DEPTHWISE_CONV_2D", [T((1, 7, 6, c), d, sx, zp()), T(w.shape, I8, ws, 0, 3, w), bias],
                     [T((1, 7, 6, 2 * c), d, scale(-3 if i16 else -1, 0), zp())],
                     opts("DepthwiseConv2DOptions", padding=0, strideW=1, strideH=1, depthMultiplier=2,
                          fusedActivationFunction=int(rng.choice([0, 1, 3]))))
    if kind.startswith("avgpool"):
        s, z = scale(), zp()
        return model("AVERAGE_POOL_2D", [T((1, 9, 8, 3), d, s, z)], [T((1, 5, 4, 3), d, s, z)],
                     opts("Pool2DOptions", padding=0, strideW=2, strideH=2, filterWidth=int(rng.integers(1, 4)),
                          filterHeight=int(rng.integers(1, 4))))
    if kind.startswith("leaky"):
        n = 1 << (16 if i16 else 8)
        return model("LEAKY_RELU", [T((1, n), d, scale(), zp())], [T((1, n), d, scale(), zp())],
                     opts("LeakyReluOptions", alpha=float(rng.uniform(-0.5, 0.9))))
    if kind.startswith("requant"):
        n = 1 << (16 if i16 else 8)
        return model("QUANTIZE", [T((1, n), d, scale(), zp())], [T((1, n), I8, scale(), int(rng.integers(-128, 128)))])
    if kind == "softmax16":
        return model("SOFTMAX", [T((4, 30), I16, scale(-5, -2), 0)], [T((4, 30), I16, 1 / 32768, 0)],
                     opts("SoftmaxOptions", beta=1.0))
    if kind.startswith("softmax"):
        return model("SOFTMAX", [T((4, 30), I8, scale(-3, 0.5), zp())], [T((4, 30), I8, 1 / 256, -128)],
                     opts("SoftmaxOptions", beta=1.0))
    raise AssertionError(kind)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kind", ["conv8", "conv16", "dw8", "dw16", "fc8", "fc16", "add8", "add16", "mul8", "mul16",
                                  "mean8", "mean16", "avgpool8", "avgpool16", "leaky8", "leaky16", "requant8",
                                  "requant16", "softmax8", "softmax16"])
def test_random_qparams_match_reference_kernels(kind, seed):
    data = _sweep_case(kind, seed)
    if kind.startswith(("leaky", "requant")):  # every input value
        feeds = [all_values(I16 if kind.endswith("16") else I8)]
    else:
        rng = np.random.default_rng(seed + 100)
        feeds = [_inputs_of(data, rng) for _ in range(3)]
    assert_exact(data, feeds)


def test_the_int16_sigmoid_table_is_the_one_litert_interpolates():
    # measured from the interpreter as bench/tflite_sigmoid_table.py does; the stored table must be that
    from bench.tflite_sigmoid_table import measured_table
    from qnnx.numerics_tflite import SIGMOID_TABLE_Q16

    np.testing.assert_array_equal(measured_table(), SIGMOID_TABLE_Q16)
