"""OpenVINO's CPU plugin against ONNX Runtime on tiny QDQ models: conv -> SiLU -> quantize (int8 with zero
point 0, or uint8 with zero point 128: the same grid) -> a variant. Found on an AVX2 host with OpenVINO
2026.4.1: a Concat of int8 inputs that then feeds a conv, or that is concatenated with a float value, gives
wrong results (relative error ~0.17); the uint8 form of the same grid is exact, and so are int8 inputs into
a conv, a depthwise conv, an Add, or a Split. This is why ``--target openvino`` keeps uint8 activations
(docs/benchmarks.md).

    python bench/ov_int8_concat.py
"""
import numpy as np, onnx, tempfile, os
from onnx import helper as h, numpy_helper as nh, TensorProto as T
import onnxruntime as ort, openvino as ov
rng = np.random.default_rng(0)
def qdq(name, x, scale, zp, dtype, nodes, inits):
    inits += [nh.from_array(np.array(scale, np.float32), name + "_s"), nh.from_array(np.array(zp, dtype), name + "_z")]
    nodes += [h.make_node("QuantizeLinear", [x, name + "_s", name + "_z"], [name + "_q"]),
              h.make_node("DequantizeLinear", [name + "_q", name + "_s", name + "_z"], [name + "_dq"])]
    return name + "_dq"
def wq(name, w, nodes, inits):  # 7-bit symmetric per-channel weights
    s = np.abs(w).reshape(w.shape[0], -1).max(1) / 63.5
    q = np.clip(np.round(w / s[:, None, None, None]), -64, 64).astype(np.int8)
    inits += [nh.from_array(q, name + "_wq"), nh.from_array(s.astype(np.float32), name + "_ws"), nh.from_array(np.zeros(len(s), np.int8), name + "_wz")]
    nodes.append(h.make_node("DequantizeLinear", [name + "_wq", name + "_ws", name + "_wz"], [name + "_w"], axis=0))
    return name + "_w"
def build(variant, act_dtype):
    nodes, inits = [], []
    x = qdq("in", "x", 1 / 50, 128, np.uint8, nodes, inits)
    w1 = wq("c1", rng.normal(size=(8, 3, 3, 3)).astype(np.float32) * 0.3, nodes, inits)
    nodes += [h.make_node("Conv", [x, w1], ["c1"], pads=[1, 1, 1, 1]), h.make_node("Sigmoid", ["c1"], ["s1"]), h.make_node("Mul", ["c1", "s1"], ["a1"])]
    if act_dtype == "int8":
        a = qdq("a1", "a1", 6 / 127.5, 0, np.int8, nodes, inits)
    else:
        a = qdq("a1", "a1", 6 / 127.5, 128, np.uint8, nodes, inits)
    if variant == "conv":
        w2 = wq("c2", rng.normal(size=(4, 8, 3, 3)).astype(np.float32) * 0.2, nodes, inits)
        nodes.append(h.make_node("Conv", [a, w2], ["y"], pads=[1, 1, 1, 1]))
    elif variant == "split_conv_concat":
        inits.append(nh.from_array(np.array([4, 4], np.int64), "sp"))
        nodes.append(h.make_node("Split", [a, "sp"], ["p", "r"], axis=1))
        w2 = wq("c2", rng.normal(size=(4, 4, 3, 3)).astype(np.float32) * 0.2, nodes, inits)
        nodes += [h.make_node("Conv", ["r", w2], ["c2"], pads=[1, 1, 1, 1]), h.make_node("Concat", ["p", "c2"], ["y"], axis=1)]
    elif variant == "split_concat":
        inits.append(nh.from_array(np.array([4, 4], np.int64), "sp"))
        nodes += [h.make_node("Split", [a, "sp"], ["p", "r"], axis=1), h.make_node("Concat", ["r", "p"], ["y"], axis=1)]
    elif variant == "split_conv":
        inits.append(nh.from_array(np.array([4, 4], np.int64), "sp"))
        nodes.append(h.make_node("Split", [a, "sp"], ["p", "r"], axis=1))
        w2 = wq("c2", rng.normal(size=(4, 4, 3, 3)).astype(np.float32) * 0.2, nodes, inits)
        nodes += [h.make_node("Conv", ["r", w2], ["c2"], pads=[1, 1, 1, 1]), h.make_node("Add", ["c2", "p"], ["y"])]
    elif variant == "concat_conv":
        w2 = wq("c2", rng.normal(size=(4, 16, 3, 3)).astype(np.float32) * 0.2, nodes, inits)
        nodes += [h.make_node("Concat", [a, a], ["cc"], axis=1), h.make_node("Conv", ["cc", w2], ["y"], pads=[1, 1, 1, 1])]
    elif variant == "add":
        w2 = wq("c2", rng.normal(size=(8, 8, 3, 3)).astype(np.float32) * 0.2, nodes, inits)
        nodes.append(h.make_node("Conv", [a, w2], ["c2"], pads=[1, 1, 1, 1]))
        c2 = qdq("c2q", "c2", 4 / 127.5, 0 if act_dtype == "int8" else 128, np.int8 if act_dtype == "int8" else np.uint8, nodes, inits)
        nodes.append(h.make_node("Add", [a, c2], ["y"]))
    elif variant == "depthwise":
        w2 = wq("c2", rng.normal(size=(8, 1, 3, 3)).astype(np.float32) * 0.3, nodes, inits)
        nodes.append(h.make_node("Conv", [a, w2], ["y"], pads=[1, 1, 1, 1], group=8))
    g = h.make_graph(nodes, "m", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 16, 16])], [h.make_empty_tensor_value_info("y")], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9)
x = (rng.normal(size=(1, 3, 16, 16)) * 1.5).astype(np.float32)
core = ov.Core()
for variant in ("conv", "depthwise", "add", "split_concat", "split_conv", "split_conv_concat", "concat_conv"):
    for dt in ("uint8", "int8"):
        m = build(variant, dt)
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "m.onnx"); onnx.save(m, p)
            ref = ort.InferenceSession(p, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
            c = core.compile_model(core.read_model(p), "CPU", {"INFERENCE_NUM_THREADS": "1", "INFERENCE_PRECISION_HINT": "f32"})
            got = np.array(c({"x": x})[c.outputs[0]])
        print(f"{variant:10s} {dt:6s} max |ov - ort| / max|ort| = {np.abs(got - ref).max() / np.abs(ref).max():.4f}")
