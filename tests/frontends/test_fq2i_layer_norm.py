"""FQ2I of layer normalization (qnnx/frontends/fq2i_layer_norm.py): the decomposed chain, ONNX
Runtime's QDQ form of it (variance quantized), and LayerNormalization (opset 17).

Compared as in test_fq2i.py (``compare_fq_to_int``): the converted model against ORT running the
QDQ model and against qnnx's reference on it, and the lowered model bit-exact against the
reference. Tolerance 1 LSB where the whole normalization is one qnnx.layer_norm: the QDQ graph
computes mean, variance, square root and division in float32 (relative error ~1e-7), the integer
op from exact sums in double, so a value lying within float32 rounding of a quantization boundary
may land on the other side. ORT's form also quantizes the variance; see that test for its tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest

import qnnx
from qnnx.frontends import convert_qdq
from test_fq2i import (I8, QDQ, U8, assert_left_in_float, compare_fq_to_int, ints, lsb_diff, op_types, run_ort,
                       run_ref)

SHAPE = (2, 6, 32)
FLOAT_CHAIN = ["ReduceMean", "Sub", "Pow", "Sqrt", "Div"]


def _chain(g: QDQ, x: str, *, axes=(-1,), var_axes=None, exponent=2.0, other=None, eps=1e-5):
    """ReduceMean -> Sub -> Pow -> ReduceMean -> Add(eps) -> Sqrt -> Div, all float; returns
    (x - mean, variance, normalized). ReduceMean axes are an input from opset 18 on."""
    def reduce_mean(v, ax, name):
        if g.opset >= 18:
            return g.node("ReduceMean", [v, g.const(np.asarray(ax, np.int64), "axes")], name=name)
        return g.node("ReduceMean", [v], axes=list(ax), name=name)

    mean = reduce_mean(x, axes, "mean")
    d = g.node("Sub", [other or x, mean], name="centered")
    sq = g.node("Pow", [d, g.const(np.float32(exponent), "two")], name="square")
    var = reduce_mean(sq, var_axes or axes, "variance")
    return d, var, g.node("Div", [d, g.node("Sqrt", [g.node("Add", [var, g.const(np.float32(eps), "eps")])])])


@pytest.mark.parametrize("dtype", [U8, I8])
@pytest.mark.parametrize("affine", ["none", "gamma", "gamma_beta"])
def test_decomposed_layer_norm(dtype, affine, rng):
    g = QDQ()
    z = dtype(128 if dtype == U8 else 0)
    x = g.dequantize(g.input("x", dtype, SHAPE), 0.05, z)
    _, _, y = _chain(g, x)
    if affine != "none":
        y = g.node("Mul", [y, g.const(rng.uniform(0.5, 1.5, SHAPE[-1]).astype(np.float32), "gamma")])
    if affine == "gamma_beta":
        y = g.node("Add", [y, g.const(rng.uniform(-0.5, 0.5, SHAPE[-1]).astype(np.float32), "beta")])
    m = g.model(g.quantize(y, 0.03, z))
    converted, report, _ = compare_fq_to_int(m, {"x": ints(rng, dtype, SHAPE)}, ops=["qnnx.layer_norm"],
                                             gone=FLOAT_CHAIN + ["Mul", "Add"], lsb=1)
    assert report.converted["ReduceMean"] == 1
    assert op_types(converted) == ["qnnx.layer_norm", "Identity"]


def test_decomposed_layer_norm_over_two_axes_with_gamma_behind_dequantize(rng):
    # gamma as an int8 weight behind DequantizeLinear (real values used exactly); 1 LSB as above
    g = QDQ()
    x = g.dequantize(g.input("x", U8, SHAPE), 0.05, U8(128))
    _, _, y = _chain(g, x, axes=(1, 2))
    y = g.node("Mul", [y, g.weight(ints(rng, I8, SHAPE[1:]), 0.01)])
    m = g.model(g.quantize(y, 0.03, U8(128)))
    compare_fq_to_int(m, {"x": ints(rng, U8, SHAPE)}, ops=["qnnx.layer_norm"], gone=FLOAT_CHAIN, lsb=1)


def test_opset13_reduce_mean_axes_attribute(rng):
    g = QDQ(opset=13)
    x = g.dequantize(g.input("x", I8, SHAPE), 0.05, I8(3))
    _, _, y = _chain(g, x)
    m = g.model(g.quantize(y, 0.03, I8(0)))
    compare_fq_to_int(m, {"x": ints(rng, I8, SHAPE)}, ops=["qnnx.layer_norm"], gone=FLOAT_CHAIN, lsb=1)


def _ort_style(g: QDQ, rng, dtype):
    """What ONNX Runtime's quantize_static emits for PP-OCRv4's decomposed LayerNorm: the variance
    quantized, epsilon added as a quantized constant and requantized, x - mean kept float, the
    division quantized, then Mul(gamma) and Add(beta) each with quantized weights and output."""
    z = dtype(128 if dtype == U8 else 0)
    x = g.dequantize(g.input("x", dtype, SHAPE), 0.05, z)
    mean = g.node("ReduceMean", [x], axes=[-1], name="mean")
    d = g.node("Sub", [x, mean], name="centered")
    var = g.node("ReduceMean", [g.node("Pow", [d, g.const(np.float32(2), "two")])], axes=[-1], name="variance")
    vq = g.dequantize(g.quantize(var, 2.2 / 255, z), 2.2 / 255, z)
    ve = g.node("Add", [vq, g.weight(np.asarray(127, np.int8), 1e-5 / 127)])
    veq = g.dequantize(g.quantize(ve, 2.2 / 255, z), 2.2 / 255, z)
    y = g.node("Div", [d, g.node("Sqrt", [veq], name="sqrt")], name="normalized")
    y = g.dequantize(g.quantize(y, 0.035, z), 0.035, z)
    y = g.node("Mul", [y, g.weight(ints(rng, I8, SHAPE[-1]), 0.012)])
    y = g.dequantize(g.quantize(y, 0.04, z), 0.04, z)
    y = g.node("Add", [y, g.weight(ints(rng, I8, SHAPE[-1]), 0.004)])
    return g.quantize(y, 0.05, z)


@pytest.mark.parametrize("dtype", [U8, I8])
def test_onnxruntime_form_with_quantized_variance(dtype, rng):
    # qnnx.variance (exact) -> qnnx.add (epsilon) -> qnnx.layer_norm(variance=...) -> qnnx.mul -> qnnx.add.
    # The variance is quantized coarsely (scale 2.2/255 for variances ~0.5-2.1): where the float32 variance
    # lies within float32 rounding of a boundary, one variance quantum moves the normalized output by up
    # to ~1/(2*var_q) relative, a few output quanta for the largest |x - mean|. So: 1 LSB at most in 99.9%
    # of elements, and the rare variance flips at most 4 LSB.
    g = QDQ(opset=13)  # PP-OCRv4 rec as ORT quantizes it: opset 13, ReduceMean axes as an attribute
    m = g.model(_ort_style(g, rng, dtype))
    x = ints(rng, dtype, SHAPE)
    converted, report = convert_qdq(m)
    assert report.left_in_float == []
    types = op_types(converted)
    for op in ("qnnx.variance", "qnnx.layer_norm", "qnnx.mul", "qnnx.add"):
        assert op in types, types
    assert not {"ReduceMean", "Sqrt", "Div", "Pow", "Sub"} & set(types)
    got = run_ref(converted, {"x": x})[0]
    assert lsb_diff(run_ort(qnnx.lower(converted), {"x": x})[0], got) == 0
    for expected in (run_ort(m, {"x": x}, optimize=False)[0], run_ref(m, {"x": x})[0]):
        diff = np.abs(got.astype(int) - expected.astype(int))
        assert (diff <= 1).mean() >= 0.999 and diff.max() <= 4, (diff.max(), (diff > 1).mean())


def test_onnxruntime_transposed_layer_norm(rng):
    # ORT's transpose optimizer (quant_pre_process) moves the Transpose in front of PP-OCRv4's first
    # layer norm between the Sub and the Pow: mean over axis 1 of (N, C, T), variance over the last
    # axis of the transposed x - mean. Converted as Transpose on the integers + qnnx.layer_norm over
    # the last axis; 1 LSB as in the module docstring.
    g = QDQ(opset=13)
    shape = (2, 32, 6)
    x = g.dequantize(g.input("x", U8, shape), 0.05, U8(128))
    mean = g.node("ReduceMean", [x], axes=[1], name="mean")
    d = g.node("Transpose", [g.node("Sub", [x, mean])], perm=[0, 2, 1])
    var = g.node("ReduceMean", [g.node("Pow", [d, g.const(np.float32(2))])], axes=[-1])
    y = g.node("Div", [d, g.node("Sqrt", [g.node("Add", [var, g.const(np.float32(1e-5))])])])
    m = g.model(g.quantize(y, 0.03, U8(128)))
    converted, _, _ = compare_fq_to_int(m, {"x": ints(rng, U8, shape)}, ops=["qnnx.layer_norm"], gone=FLOAT_CHAIN,
                                        lsb=1)
    assert op_types(converted) == ["Transpose", "qnnx.layer_norm", "Identity"]


def test_layer_normalization_op(rng):
    g = QDQ(opset=17)
    x = g.dequantize(g.input("x", U8, SHAPE), 0.05, U8(128))
    y = g.node("LayerNormalization", [x, g.const(rng.uniform(0.5, 1.5, SHAPE[-1]).astype(np.float32), "scale"),
                                      g.const(rng.uniform(-0.3, 0.3, SHAPE[-1]).astype(np.float32), "bias")],
               axis=-1, epsilon=1e-5)
    m = g.model(g.quantize(y, 0.03, U8(128)))
    converted, _, _ = compare_fq_to_int(m, {"x": ints(rng, U8, SHAPE)}, ops=["qnnx.layer_norm"],
                                        gone=["LayerNormalization"], lsb=1)
    assert op_types(converted) == ["qnnx.layer_norm", "Identity"]


def test_layer_normalization_op_per_channel_output(rng):
    # per-channel output qparams along the last axis fall out of the op's definition; 1 LSB as above
    g = QDQ(opset=17)
    x = g.dequantize(g.input("x", I8, SHAPE), 0.05, I8(0))
    y = g.node("LayerNormalization", [x, g.const(np.ones(SHAPE[-1], np.float32), "scale")], axis=2)
    scales = np.linspace(0.02, 0.05, SHAPE[-1]).astype(np.float32)
    m = g.model(g.quantize(y, scales, np.zeros(SHAPE[-1], np.int8), axis=2))
    compare_fq_to_int(m, {"x": ints(rng, I8, SHAPE)}, ops=["qnnx.layer_norm"], gone=["LayerNormalization"], lsb=1)


# --------------------------------------------------------------------------- what must not match


def _negative(**chain):
    g = QDQ()
    x = g.dequantize(g.input("x", U8, SHAPE), 0.05, U8(128))
    if chain.pop("other", False):
        chain["other"] = g.dequantize(g.input("x2", U8, SHAPE), 0.05, U8(128))
    _, _, y = _chain(g, x, **chain)
    return g.model(g.quantize(y, 0.03, U8(128)))


@pytest.mark.parametrize("chain,reason", [
    (dict(var_axes=(-2, -1)), r"the variance reduces axes \[-2, -1\], the mean \[-1\]"),
    (dict(exponent=4.0), r"Pow exponent 4.0 \(expected 2\)"),
    (dict(other=True), "the mean is subtracted from another tensor than its input"),
    (dict(axes=(1,)), r"mean over axes \[-2\]: a layer norm reduces trailing axes"),
])
def test_not_a_layer_norm(chain, reason):
    assert_left_in_float(_negative(**chain), "mean", "ReduceMean", reason)


def test_negative_epsilon_not_constant():
    g = QDQ()
    x = g.dequantize(g.input("x", U8, SHAPE), 0.05, U8(128))
    eps = g.input("eps", np.float32, [])
    axes = g.const(np.asarray([-1], np.int64))
    mean = g.node("ReduceMean", [x, axes], name="mean")
    d = g.node("Sub", [x, mean])
    var = g.node("ReduceMean", [g.node("Pow", [d, g.const(np.float32(2))]), axes])
    y = g.node("Div", [d, g.node("Sqrt", [g.node("Add", [var, eps])])])
    m = g.model(g.quantize(y, 0.03, U8(128)))
    assert_left_in_float(m, "mean", "ReduceMean", "epsilon is not a non-negative scalar constant")


def test_negative_output_not_quantized():
    g = QDQ()
    x = g.dequantize(g.input("x", U8, SHAPE), 0.05, U8(128))
    _, _, y = _chain(g, x)
    converted, _ = convert_qdq(g.model(float_outputs=[y]))
    assert "ReduceMean" in op_types(converted) and "qnnx.layer_norm" not in op_types(converted)


def test_negative_layer_normalization_mean_output_used(rng):
    g = QDQ(opset=17)
    x = g.dequantize(g.input("x", U8, SHAPE), 0.05, U8(128))
    y, mean, _ = g.node("LayerNormalization", [x, g.const(np.ones(SHAPE[-1], np.float32))], outputs=3,
                        name="ln")
    m = g.model(g.quantize(y, 0.03, U8(128)), g.quantize(mean, 0.05, U8(128)))
    assert_left_in_float(m, "ln", "LayerNormalization", "the Mean / InvStdDev outputs are used")
