"""Output-aware rounding of conv weights (qnnx.autoquant.weight_rounding): GPTQ error feedback and
+-1 polish against the input patches' second moment (per channel for depthwise convs, shared for
ungrouped ones), the bias's mean correction, and where it applies."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from float_graphs import Graph, run_ort

import qnnx
from qnnx import QuantConfig, numerics, runtime
from qnnx.autoquant.refinements import weight_rounding as wr
from qnnx.errors import QnnxError
from qnnx.ir import const_array


def _correlated_h(rng, c, d):
    """Second moments of patches of a smooth input with a large mean: strongly correlated taps."""
    base = rng.standard_normal((c, 400, 1)) * 0.5 + 4.0
    p = base + rng.standard_normal((c, 400, d)) * 0.3
    return np.einsum("cmi,cmj->cij", p, p) / 400


def _error(q, w, scale, h):
    e = q * scale[:, None] - w
    return np.einsum("ci,cij,cj->c", e, h, e)


def test_gptq_and_polish_lower_the_output_error_of_every_channel():
    rng = np.random.default_rng(0)
    c, d = 64, 9
    w = rng.standard_normal((c, d)) * 0.2
    scale = np.abs(w).max(axis=1) / 127.5
    h = _correlated_h(rng, c, d)
    nearest = np.clip(np.round(w / scale[:, None]), -128, 127)
    fed = wr.gptq_round(w, scale, h, -128, 127)
    chosen = wr.polish(fed, w, scale, h, -128, 127)
    e_near, e_fed, e_chosen = (_error(q, w, scale, h) for q in (nearest, fed, chosen))
    assert np.all(e_chosen <= e_fed + 1e-15)  # polish only ever takes improving steps
    assert e_fed.sum() < 0.3 * e_near.sum()  # correlated taps: fed-forward errors cancel instead of adding up
    assert e_chosen.sum() < 0.3 * e_near.sum()
    assert np.all(np.abs(chosen - w / scale[:, None]) <= 2)  # still on the scale's grid, near each weight
    assert chosen.min() >= -128 and chosen.max() <= 127


def test_a_shared_second_moment_rounds_an_ungrouped_conv_for_its_output_error():
    """One H for every output row (an ungrouped conv): the same GPTQ and polish, broadcast."""
    rng = np.random.default_rng(4)
    c, d = 32, 48
    w = rng.standard_normal((c, d)) * 0.2
    scale = np.abs(w).max(axis=1) / 127.5
    p = rng.standard_normal((2000, 1)) * 0.5 + 4.0 + rng.standard_normal((2000, d)) * 0.3
    h = p.T @ p / len(p)
    nearest = np.clip(np.round(w / scale[:, None]), -128, 127)
    fed = wr.gptq_round(w, scale, h, -128, 127)
    chosen = wr.polish(fed, w, scale, h, -128, 127)
    per_row = np.broadcast_to(h, (c, d, d))
    e_near, e_fed, e_chosen = (_error(q, w, scale, per_row) for q in (nearest, fed, chosen))
    np.testing.assert_allclose(wr._output_error(chosen, w, scale, h), e_chosen, rtol=1e-10)
    assert np.all(e_chosen <= e_fed + 1e-15)
    assert e_chosen.sum() < 0.3 * e_near.sum()
    # the shared H gives what the same H repeated per row gives
    np.testing.assert_array_equal(wr.gptq_round(w, scale, per_row.copy(), -128, 127), fed)


@pytest.mark.parametrize("shared", [True, False])
def test_blocked_gptq_updates_equal_column_by_column_ones(shared, monkeypatch):
    rng = np.random.default_rng(5)
    c, d = 6, 23
    w = rng.standard_normal((c, d)) * 0.2
    scale = np.abs(w).max(axis=1) / 127.5
    h = _correlated_h(rng, 1 if shared else c, d)
    h = h[0] if shared else h
    monkeypatch.setattr(wr, "GPTQ_BLOCK", 1)  # every column's error reaches the rest at once
    one_by_one = wr.gptq_round(w, scale, h, -128, 127)
    monkeypatch.setattr(wr, "GPTQ_BLOCK", 5)  # blocks that do not divide d
    np.testing.assert_array_equal(wr.gptq_round(w, scale, h, -128, 127), one_by_one)


@pytest.mark.parametrize("one_sign", [True, False])
def test_gptq_and_polish_keep_every_pair_of_input_channels_within_the_pair_limit(one_sign):
    """On a pair-limited grid (scales from numerics.pair_limited_scale, so nearest rounding is within the
    limit) fed-forward errors push some pair a step over it; with the limit given none goes over, and
    the output error stays near the unconstrained one."""
    rng = np.random.default_rng(0)
    c, d = 64, 9  # odd: the last input channel has no partner
    w = rng.standard_normal((c, d)) * 0.2
    w = np.abs(w) if one_sign else w
    scale = numerics.pair_limited_scale(w, 0, 1).astype(np.float64)
    h = _correlated_h(rng, c, d)
    limit = numerics.U8S8_PAIR_LIMIT
    nearest = np.clip(np.round(w / scale[:, None]), -128, 127)
    free = wr.polish(wr.gptq_round(w, scale, h, -128, 127), w, scale, h, -128, 127)
    kept = wr.polish(wr.gptq_round(w, scale, h, -128, 127, limit), w, scale, h, -128, 127, pair_limit=limit)
    assert numerics.same_sign_pair_sums(nearest, 1).max() <= limit
    if one_sign:
        assert numerics.same_sign_pair_sums(free, 1).max() > limit  # what the limit is there for
    assert numerics.same_sign_pair_sums(kept, 1).max() <= limit
    assert kept.min() >= -128 and kept.max() <= 127
    e_near, e_free, e_kept = (_error(q, w, scale, h).sum() for q in (nearest, free, kept))
    assert e_kept < 0.3 * e_near and e_kept < 1.05 * e_free


def test_polish_keeps_the_grid_bounds():
    w = np.array([[1.0, 1.0, 1.0]])
    scale = np.array([1.0 / 127])  # every weight at +127: the grid's top
    h = np.ones((1, 3, 3))  # an all-ones patch: the error of the sum, which +1 steps would lower if allowed
    w_hi = w * 1.004  # a little above the grid's top: nearest clips to 127
    q = wr.polish(np.full((1, 3), 127.0), w_hi, scale, h, -128, 127)
    assert q.max() <= 127


@pytest.mark.parametrize("pads,strides,dilations,max_patches", [((1, 1, 1, 1), (1, 1), (1, 1), 1 << 14),
                                                                ((0, 2, 1, 0), (2, 1), (1, 2), 1 << 14),
                                                                ((1, 1, 1, 1), (1, 1), (1, 1), 20)])
def test_patch_moments_give_the_conv_output_error(pads, strides, dilations, max_patches, monkeypatch):
    """e^T H e / count, from the patches, equals the mean square of the conv of the input with the error
    filter ``e`` as ONNX Runtime computes it (pads, strides and dilations included; with few patches
    allowed, on every step-th output row)."""
    monkeypatch.setattr(wr, "MAX_PATCHES", max_patches)
    rng = np.random.default_rng(1)
    c = 3
    x = rng.standard_normal((2, c, 7, 9)).astype(np.float32) + 1
    e = rng.standard_normal((c, 1, 3, 3)).astype(np.float32)
    g = Graph()
    g.node("Conv", [g.input("x", x.shape), g.const(e, "e")], name="conv", out="y", group=c, pads=list(pads),
           strides=list(strides), dilations=list(dilations))
    y = run_ort(g.model("y"), {"x": x})[0]
    step = -(-y.shape[2] * y.shape[3] // max_patches)
    y = y[:, :, ::step]
    layer = wr._Layer(None, None, None, None, 1, (3, 3), pads, strides, dilations)
    h, s, n = wr._patch_moments(x, layer)
    assert n == y.shape[0] * y.shape[2] * y.shape[3] == wr._patch_count(x.shape, layer)  # counted from the shape
    ev = e.reshape(c, -1).astype(np.float64)
    mean_square = (y.astype(np.float64) ** 2).mean(axis=(0, 2, 3))
    np.testing.assert_allclose(np.einsum("ci,cij,cj->c", ev, h, ev) / n, mean_square, rtol=1e-5)
    np.testing.assert_allclose((s * ev).sum(axis=1) / n, y.mean(axis=(0, 2, 3)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("pads,strides,dilations,max_patches", [((1, 0, 1, 2), (1, 1), (1, 1), 1 << 14),
                                                                ((0, 2, 1, 0), (2, 1), (1, 2), 1 << 14),
                                                                ((1, 1, 1, 1), (1, 1), (1, 1), 20)])
def test_im2col_moments_give_the_ungrouped_conv_output_error(pads, strides, dilations, max_patches, monkeypatch):
    """As above for an ungrouped conv: one (C*k*k)^2 moment, e^T H e / count the mean square of the
    conv with one error filter ``e`` (C, k, k) in the weights' flattened order."""
    monkeypatch.setattr(wr, "MAX_PATCHES", max_patches)
    monkeypatch.setattr(wr, "PATCH_BLOCK", 200)  # several row blocks per sample
    rng = np.random.default_rng(1)
    c = 3
    x = rng.standard_normal((2, c, 7, 9)).astype(np.float32) + 1
    e = rng.standard_normal((1, c, 3, 2)).astype(np.float32)
    g = Graph()
    g.node("Conv", [g.input("x", x.shape), g.const(e, "e")], name="conv", out="y", pads=list(pads),
           strides=list(strides), dilations=list(dilations))
    y = run_ort(g.model("y"), {"x": x})[0]
    step = -(-y.shape[2] * y.shape[3] // max_patches)
    y = y[:, :, ::step].astype(np.float64)
    layer = wr._Layer(None, None, None, None, 0, (3, 2), pads, strides, dilations)
    h, s, n = wr._im2col_moments(x, layer)
    ev = e.reshape(-1).astype(np.float64)
    assert h.shape == (c * 6, c * 6) and n == y.shape[0] * y.shape[2] * y.shape[3] == wr._patch_count(x.shape, layer)
    np.testing.assert_allclose(ev @ h @ ev / n, (y ** 2).mean(), rtol=1e-5)
    np.testing.assert_allclose(s @ ev / n, y.mean(), rtol=1e-5, atol=1e-6)


def _grouped_model(rng):
    g = Graph()
    w = (rng.standard_normal((8, 4, 3, 3)) * 0.1).astype(np.float32)  # 2 groups of 4 channels
    g.node("Conv", [g.input("x", [1, 8, 10, 10]), g.const(w, "w_g")], name="grouped", group=2, pads=[1, 1, 1, 1],
           out="y")
    return g.model("y")


def test_grouped_convs_too_many_taps_or_too_few_patches_keep_nearest_rounding_with_their_reason(monkeypatch):
    rng = np.random.default_rng(8)
    qm = qnnx.quantize(_grouped_model(rng), _inputs(rng, 2), QuantConfig(progress=False, speed_fallback="off"))
    (record,) = qm.report.record("weight_rounding").layers
    assert record.node == "grouped" and not record.depthwise
    assert record.reason == "grouped conv (2 groups): only depthwise and ungrouped convs are rounded"
    monkeypatch.setattr(wr, "MAX_TAPS", 8)
    rng = np.random.default_rng(8)
    qm = qnnx.quantize(_depthwise_model(rng), _inputs(rng, 2), QuantConfig(progress=False, speed_fallback="off"))
    records = {r.node: r for r in qm.report.record("weight_rounding").layers}
    assert not records["dw"].reason and records["dw"].gain_db > 0  # 9 taps: depthwise convs are not limited
    assert records["pw"].reason == "" and records["pw"].taps == 8
    monkeypatch.setattr(wr, "MAX_TAPS", 7)
    qm = qnnx.quantize(_depthwise_model(rng), _inputs(rng, 2), QuantConfig(progress=False, speed_fallback="off"))
    records = {r.node: r for r in qm.report.record("weight_rounding").layers}
    assert records["pw"].reason == "8 taps per filter, above the 7 the rounding takes"
    assert not records["dw"].reason
    monkeypatch.setattr(wr, "MAX_TAPS", 4096)
    monkeypatch.setattr(wr, "MIN_PATCHES_PER_TAP", 100)  # 2 samples of 10x10 patches: 200 per tap
    qm = qnnx.quantize(_depthwise_model(rng), _inputs(rng, 2), QuantConfig(progress=False, speed_fallback="off"))
    assert {r.node: r.reason for r in qm.report.record("weight_rounding").layers} == {
        "dw": "200 input patches for 9 taps: too few to rank roundings by",
        "pw": "200 input patches for 8 taps: too few to rank roundings by"}


def test_layers_foreseen_thin_from_the_first_sample_gather_no_moments(monkeypatch):
    """Samples of one shape: a layer's patch count is known after the first, and one that will have too
    few only counts (no H is built), with the reason it would have had."""
    monkeypatch.setattr(wr, "MIN_PATCHES_PER_TAP", 35)  # 3 samples x 100 patches: 300 < 35 * 9, >= 35 * 8
    rng = np.random.default_rng(8)
    model, inputs = _depthwise_model(rng), _inputs(rng, 3)
    qm = qnnx.quantize(model, inputs, QuantConfig(progress=False, speed_fallback="off"))
    records = {r.node: r for r in qm.report.record("weight_rounding").layers}
    assert records["dw"].reason == "300 input patches for 9 taps: too few to rank roundings by"
    assert not records["pw"].reason and records["pw"].gain_db >= 0
    # the statistics alone, on the same samples (of the model before rounding): the depthwise conv's
    # moments are never taken
    near = qnnx.quantize(model, inputs, QuantConfig(progress=False, weight_rounding="nearest", bias_correction="off"))
    layers = wr._conv_layers(ir.from_proto(model), near.qdq, [])
    wr._gather_statistics(near.qdq, layers, [{"x": x} for x in inputs])
    by_name = {layer.node.name: layer for layer in layers}
    assert by_name["dw"].thin and by_name["dw"].h is None and by_name["dw"].count == 300
    assert not by_name["pw"].thin and by_name["pw"].h is not None


def test_samples_of_different_shapes_gather_every_layers_moments(monkeypatch):
    """Without one shape, the first sample foretells nothing: every layer's moments are gathered (here the
    third, larger sample lifts the depthwise conv above the threshold the first would have missed)."""
    monkeypatch.setattr(wr, "MIN_PATCHES_PER_TAP", 35)
    rng = np.random.default_rng(8)
    model = ir.from_proto(_depthwise_model(rng))
    model.graph.inputs[0].shape = ir.Shape([1, 8, "h", "w"])
    qm = qnnx.quantize(model, _inputs(rng, 3), QuantConfig(progress=False, speed_fallback="off",
                                                         weight_rounding="nearest", bias_correction="off"))
    layers = wr._conv_layers(model, qm.qdq, [])
    samples = [{"x": x} for x in _inputs(rng, 2)] + [{"x": np.ones((1, 8, 12, 12), np.float32)}]
    wr._gather_statistics(qm.qdq, layers, samples)
    assert [layer.count for layer in layers] == [344, 344]  # 100 + 100 + 144 patches
    assert all(layer.h is not None and not layer.thin for layer in layers)


def _depthwise_model(rng, c=8):
    """A depthwise 3x3 conv with a bias, then a 1x1 conv: only the first is depthwise."""
    g = Graph()
    w = (rng.standard_normal((c, 1, 3, 3)) * 0.1).astype(np.float32)
    w[:, 0, 1, 1] = 1.0  # a dominant centre tap (a re-parameterized identity branch) sets each scale
    dw = g.node("Conv", [g.input("x", [1, c, 10, 10]), g.const(w, "w_dw"), g.const(np.full(c, 0.1, np.float32))],
                name="dw", group=c, pads=[1, 1, 1, 1])
    g.node("Conv", [dw, g.const((rng.standard_normal((4, c, 1, 1)) * 0.3).astype(np.float32), "w_pw")],
           name="pw", out="y")
    return g.model("y")


def _inputs(rng, n):
    """Smooth inputs with a large mean per channel, as after PP-OCRv4's hard-swish."""
    out = []
    for _ in range(n):
        base = rng.standard_normal((1, 8, 1, 1)) * 2 + 6
        smooth = np.cumsum(rng.standard_normal((1, 8, 10, 10)) * 0.1, axis=3)
        out.append((base + smooth).astype(np.float32))
    return out


def _output_of(model, node_name):
    return next(n for n in model.graph if n.name == node_name).outputs[0].name


def test_gptq_rounding_lowers_the_quantized_models_error_on_held_out_inputs():
    rng = np.random.default_rng(2)
    model = _depthwise_model(rng)
    calib, held_out = _inputs(rng, 8), _inputs(rng, 8)
    # bias_correction "off": the sequential correction would take the mean error out of both
    near = qnnx.quantize(model, calib, QuantConfig(progress=False, speed_fallback="off", weight_rounding="nearest",
                                                   bias_correction="off"))
    gptq = qnnx.quantize(model, calib, QuantConfig(progress=False, speed_fallback="off", weight_rounding="gptq",
                                                   bias_correction="off"))

    def mse(qm):
        return np.mean([(run_ort(model, {"x": x})[0] - run_ort(qm.qdq, {"x": x})[0]) ** 2 for x in held_out])

    assert mse(gptq) < 0.8 * mse(near)
    # The depthwise conv's own output (before its QuantizeLinear): the mean error per channel is what the
    # bias correction takes out, with the right sign (flipped, it measured 0.034 instead of 0.008).
    fm = ir.from_proto(model)
    float_dw = runtime.session(fm, outputs=[_output_of(fm, "dw")], optimize=False)

    def dw_mean_error(qm):
        sess = runtime.session(qm.qdq, outputs=[_output_of(qm.qdq, "dw")], optimize=False)
        errs = [float_dw.run([_output_of(fm, "dw")], {"x": x})[0] - sess.run([_output_of(qm.qdq, "dw")], {"x": x})[0]
                for x in held_out]
        return np.abs(np.mean(errs, axis=(0, 1, 3, 4))).max()

    assert dw_mean_error(gptq) < 0.2 * dw_mean_error(near)  # measured 0.008 vs 0.081
    assert not near.report.record("weight_rounding")
    dw, pw = gptq.report.record("weight_rounding").layers
    assert (dw.node, dw.channels, dw.taps, dw.depthwise, dw.bias_corrected) == ("dw", 8, 9, True, True)
    assert (pw.node, pw.channels, pw.taps, pw.depthwise, pw.reason) == ("pw", 4, 8, False, "")
    assert dw.gain_db > 0 and pw.gain_db >= 0
    assert "2 conv(s) (1 depthwise) rounded for their output error" in gptq.report.summary()
    # The depthwise conv's int8 weights moved, on the same scales.
    (q_near, s_near), (q_gptq, s_gptq) = _int8_weights(near, "dw"), _int8_weights(gptq, "dw")
    np.testing.assert_array_equal(s_near, s_gptq)
    assert not np.array_equal(q_near, q_gptq) and np.abs(q_near.astype(int) - q_gptq).max() <= 2


def test_a_depthwise_conv_with_a_weight_zero_point_is_left_with_its_reason():
    rng = np.random.default_rng(3)
    model = _depthwise_model(rng)
    qm = qnnx.quantize(model, _inputs(rng, 2), QuantConfig(progress=False, speed_fallback="off",
                                                           weight_rounding="nearest"))
    dw = next(n for n in qm.qdq.graph if n.name == "dw")
    w_dq = dw.inputs[1].producer()
    zp = w_dq.inputs[2]
    zp.const_value = ir.tensor(np.ones(const_array(zp).shape, np.int8), name=zp.name)
    before = const_array(w_dq.inputs[0]).copy()
    float_model = ir.from_proto(model)
    record, pw = wr.round_conv_weights(float_model, qm.qdq, [{"x": x} for x in _inputs(rng, 2)])
    assert record.node == "dw" and record.reason == "weight zero point is not 0" and record.gain_db == 0
    assert pw.node == "pw" and not pw.reason
    np.testing.assert_array_equal(const_array(w_dq.inputs[0]), before)


def test_weight_rounding_is_validated():
    with pytest.raises(QnnxError, match="weight_rounding must be one of nearest, gptq, gptq_all"):
        QuantConfig(weight_rounding="adaround")


def test_int8_weights_that_are_not_the_float_ones_rounded_are_left_with_their_reason():
    rng = np.random.default_rng(6)
    model = _depthwise_model(rng)
    qm = qnnx.quantize(model, _inputs(rng, 2), QuantConfig(progress=False, speed_fallback="off",
                                                           weight_rounding="nearest"))
    w_dq = next(n for n in qm.qdq.graph if n.name == "dw").inputs[1].producer()
    q = w_dq.inputs[0]
    flipped = -const_array(q)  # as if a fold had negated the filter after the float model was taken
    q.const_value = ir.tensor(flipped, name=q.name)
    record, _ = wr.round_conv_weights(ir.from_proto(model), qm.qdq, [{"x": x} for x in _inputs(rng, 2)])
    assert record.node == "dw" and record.reason == "int8 weights are not the float weights rounded (a fold changed them)"
    np.testing.assert_array_equal(const_array(q), flipped)


def test_progress_lines_for_the_rounding_and_the_correction(capsys):
    rng = np.random.default_rng(7)
    qnnx.quantize(_depthwise_model(rng), _inputs(rng, 2), QuantConfig(progress=True, speed_fallback="off"))
    err = capsys.readouterr().err
    assert "weight rounding: layer 2/2" in err and "bias correction: stage 2/2" in err


# --------------------------------------------------------------------------- MatMul and Gemm layers


def _token_inputs(rng, n, rows=24, k=16):
    """Sequences whose channels are strongly correlated (a few latent factors plus noise, as a transformer's
    hidden states are): rounding errors of correlated input channels can cancel. One mix for every call:
    calibration and held-out sequences come from the same distribution."""
    mix = np.random.default_rng(0).standard_normal((3, k))
    return [(rng.standard_normal((1, rows, 3)) @ mix + 0.2 * rng.standard_normal((1, rows, k))).astype(np.float32)
            for _ in range(n)]


def _linear_model(rng, k=16, n=12):
    """MatMul (K, N) -> Add bias, then Gemm with transB (N', K) and a bias, then Gemm without transB."""
    g = Graph()
    x = g.input("x", [1, "t", k])
    w1 = (rng.standard_normal((k, n)) * 0.3).astype(np.float32)
    h = g.node("Add", [g.node("MatMul", [x, g.const(w1, "w_mm")], name="mm"),
                       g.const(np.full(n, 0.1, np.float32), "b_mm")], name="mm_bias")
    flat = g.node("Reshape", [h, g.const(np.array([-1, n], np.int64))])
    w2 = (rng.standard_normal((10, n)) * 0.3).astype(np.float32)
    y2 = g.node("Gemm", [flat, g.const(w2, "w_gemm_t"), g.const(np.full(10, -0.2, np.float32), "b_gemm_t")],
                name="gemm_t", transB=1)
    w3 = (rng.standard_normal((10, 6)) * 0.3).astype(np.float32)
    g.node("Gemm", [y2, g.const(w3, "w_gemm"), g.const(np.zeros(6, np.float32) + 0.05, "b_gemm")], name="gemm",
           out="y")
    return g.model("y")


def _int8_weights(qm, name):
    dq = next(n for n in qm.qdq.graph if n.name == name).inputs[1].producer()
    return const_array(dq.inputs[0]), const_array(dq.inputs[1])


def test_gptq_rounds_matmul_and_gemm_weights_for_their_output_error_on_held_out_inputs():
    rng = np.random.default_rng(11)
    model = _linear_model(rng)
    calib, held_out = _token_inputs(rng, 16), _token_inputs(rng, 16)
    options = dict(progress=False, speed_fallback="off", bias_correction="off")
    convs = qnnx.quantize(model, calib, QuantConfig(weight_rounding="gptq", **options))
    near = qnnx.quantize(model, calib, QuantConfig(weight_rounding="nearest", **options))
    gptq = qnnx.quantize(model, calib, QuantConfig(weight_rounding="gptq_all", **options))
    for name in ("mm", "gemm_t", "gemm"):  # "gptq" (the default) leaves MatMul/Gemm weights at nearest rounding
        np.testing.assert_array_equal(_int8_weights(convs, name)[0], _int8_weights(near, name)[0])
    assert not convs.report.record("weight_rounding").layers

    def mse(qm):
        return np.mean([(run_ort(model, {"x": x})[0] - run_ort(qm.qdq, {"x": x})[0]) ** 2 for x in held_out])

    assert mse(gptq) < 0.8 * mse(near)
    records = {r.node: r for r in gptq.report.record("weight_rounding").layers}
    assert set(records) == {"mm", "gemm_t", "gemm"}
    assert all(r.matmul and not r.depthwise and not r.reason and r.gain_db > 0 for r in records.values())
    assert (records["mm"].channels, records["mm"].taps) == (12, 16)  # (N, K): one row per output channel
    assert (records["gemm_t"].channels, records["gemm_t"].taps) == (10, 12)
    assert (records["gemm"].channels, records["gemm"].taps) == (6, 10)
    # Gemm biases take the mean correction; a MatMul's bias is a separate Add and keeps its value
    assert records["gemm_t"].bias_corrected and not records["mm"].bias_corrected
    assert "0 conv(s) (0 depthwise) and 3 matmul(s) rounded for their output error" in gptq.report.summary()
    for name in ("mm", "gemm_t", "gemm"):  # the same scales and layout, weights moved by a few steps
        (q_near, s_near), (q_gptq, s_gptq) = _int8_weights(near, name), _int8_weights(gptq, name)
        np.testing.assert_array_equal(s_near, s_gptq)
        assert q_near.shape == q_gptq.shape and not np.array_equal(q_near, q_gptq)
        assert np.abs(q_near.astype(int) - q_gptq).max() <= 3


def test_matmul_moments_come_from_every_calibration_sample_read_once():
    """The convs' moments come from the refinement samples; a MatMul's from the whole calibration stream,
    which a one-shot iterator gives once."""
    rng = np.random.default_rng(12)
    model = _linear_model(rng)
    calib = _token_inputs(rng, 12, rows=5)
    near = qnnx.quantize(model, calib, QuantConfig(progress=False, weight_rounding="nearest", bias_correction="off"))
    fm = ir.from_proto(model)
    layers = wr._matmul_layers(fm, near.qdq, [])
    wr._gather_statistics(near.qdq, layers, iter([{"x": x} for x in calib]))
    assert [layer.count for layer in layers] == [60, 60, 60]  # 12 samples x 5 rows, not the first 8
    x = np.concatenate([x.reshape(-1, 16) for x in calib]).astype(np.float64)  # the MatMul's rows, before uint8
    np.testing.assert_allclose(layers[0].h, x.T @ x, rtol=0.02, atol=0.5)
    records = wr.round_matmul_weights(fm, near.qdq, iter([{"x": x} for x in calib]))
    assert [r.node for r in records if not r.reason] == ["mm", "gemm_t", "gemm"]


def test_matmuls_with_too_few_rows_keep_nearest_rounding_with_their_reason():
    rng = np.random.default_rng(13)
    model = _linear_model(rng)
    calib = _token_inputs(rng, 2, rows=1)  # 2 rows for 16 input channels: below a quarter of a row each
    qm = qnnx.quantize(model, calib, QuantConfig(progress=False, weight_rounding="gptq_all", bias_correction="off"))
    near = qnnx.quantize(model, calib, QuantConfig(progress=False, weight_rounding="nearest", bias_correction="off"))
    records = {r.node: r for r in qm.report.record("weight_rounding").layers}
    assert records["mm"].reason == "2 input rows for 16 input channels: too few to rank roundings by"
    np.testing.assert_array_equal(_int8_weights(qm, "mm")[0], _int8_weights(near, "mm")[0])


def test_matmuls_on_a_pair_limited_grid_are_rounded_within_the_pair_limit():
    """weight_bits "pairs" (OpenVINO): MatMul/Gemm weights are rounded for their output error on the 8-bit
    pair-limited grid, every pair of adjacent input channels still within the limit its scale was set for."""
    rng = np.random.default_rng(13)
    model = _linear_model(rng)
    calib, held_out = _token_inputs(rng, 16), _token_inputs(rng, 16)
    options = dict(progress=False, speed_fallback="off", bias_correction="off", target="openvino", weight_bits="pairs")
    pairs = qnnx.quantize(model, calib, QuantConfig(weight_rounding="gptq_all", **options))
    pairs_near = qnnx.quantize(model, calib, QuantConfig(weight_rounding="nearest", **options))
    records = {r.node: r for r in pairs.report.record("weight_rounding").layers}
    assert set(records) == {"mm", "gemm_t", "gemm"} and not any(r.reason for r in records.values())
    for name, k_axis in (("mm", 0), ("gemm_t", 1), ("gemm", 0)):  # stored (K, N), or (N, K) with transB
        (q, s), (q_near, s_near) = _int8_weights(pairs, name), _int8_weights(pairs_near, name)
        np.testing.assert_array_equal(s, s_near)  # the same pair-limited scales
        assert not np.array_equal(q, q_near)
        assert numerics.same_sign_pair_sums(q, k_axis).max() <= numerics.U8S8_PAIR_LIMIT
        assert np.abs(q.astype(int)).max() > 64  # the 8-bit grid, not the 7-bit one

    def mse(qm):
        return np.mean([(run_ort(model, {"x": x})[0] - run_ort(qm.qdq, {"x": x})[0]) ** 2 for x in held_out])

    assert mse(pairs) < 0.9 * mse(pairs_near)  # activations' uint8 error is most of what is left at 8 bits


def test_matmul_weights_not_the_float_ones_rounded_are_left_with_their_reason():
    rng = np.random.default_rng(14)
    model = _linear_model(rng)
    calib = _token_inputs(rng, 4)
    qm = qnnx.quantize(model, calib, QuantConfig(progress=False, weight_rounding="nearest", bias_correction="off"))
    w_dq = next(n for n in qm.qdq.graph if n.name == "mm").inputs[1].producer()
    flipped = -const_array(w_dq.inputs[0])
    w_dq.inputs[0].const_value = ir.tensor(flipped, name=w_dq.inputs[0].name)
    records = {r.node: r for r in wr.round_matmul_weights(ir.from_proto(model), qm.qdq, [{"x": x} for x in calib])}
    assert records["mm"].reason == "int8 weights are not the float weights rounded (a fold changed them)"
    np.testing.assert_array_equal(const_array(w_dq.inputs[0]), flipped)
    assert not records["gemm_t"].reason
