"""Small float graphs of the autoquant and target tests (``Graph`` builder, the shared
conv/relu/add/sigmoid*x/maxpool/globalavgpool/matmul model) and ways to run them.

A plain module beside ``tests/conftest.py`` (whose directory pytest puts on ``sys.path``), so the
tests of every subdirectory (autoquant/, autoquant/refinements/, targets/onnxruntime/) import it by
name; not a second ``conftest.py``, which would shadow ``tests/conftest.py``, imported by name too.

Everything is synthetic (onnx.helper, opset 13-21, ir_version 9/10) and a few calibration
samples: the whole autoquant suite stays within seconds.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
from onnx import helper, numpy_helper

import qnnx


class Graph:
    """A float graph under construction; values are names, node names are given or generated."""

    def __init__(self, opset: int = 17, ir_version: int = 9):
        self.opset, self.ir_version = opset, ir_version
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.extra_opsets: dict[str, int] = {}
        self._n = 0

    def _name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def input(self, name: str, shape, dtype=np.float32) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                                         list(shape)))
        return name

    def const(self, array, name: str | None = None) -> str:
        name = name or self._name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, op_type: str, inputs, *, name: str | None = None, outputs: int = 1, domain: str = "",
             out: str | None = None, **attrs):
        if name is None:
            name = self._name(op_type)  # "" is kept: an unnamed node
        if out and outputs == 1:
            outs = [out]
        else:
            outs = [self._name(f"{name or op_type}_out") for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, domain=domain, **attrs))
        if domain and domain not in ("", "ai.onnx"):
            self.extra_opsets.setdefault(domain, 1)
        return outs[0] if outputs == 1 else outs

    def model(self, *outputs: str) -> onnx.ModelProto:
        """A checked model with graph outputs ``outputs`` (their types come from shape inference)."""
        g = helper.make_graph(self.nodes, "autoquant_test", self.inputs,
                              [helper.make_empty_tensor_value_info(v) for v in outputs],
                              self.inits)
        opsets = [helper.make_opsetid("", self.opset)] + [helper.make_opsetid(d, v)
                                                          for d, v in self.extra_opsets.items()]
        m = helper.make_model(g, opset_imports=opsets, ir_version=self.ir_version)
        ig = onnx.shape_inference.infer_shapes(m).graph
        inferred = {vi.name: vi for vi in [*ig.value_info, *ig.output] if vi.type.tensor_type.HasField("shape")}
        for out in m.graph.output:
            if out.name in inferred:
                out.CopyFrom(inferred[out.name])
        if not self.extra_opsets:  # the checker rejects custom domains it does not know
            onnx.checker.check_model(m)
        return m


def conv_weight(rng, c_out, c_in, k=3, std=0.3):
    return (rng.standard_normal((c_out, c_in, k, k)) * std).astype(np.float32)


def main_model(opset: int = 17) -> onnx.ModelProto:
    """x[1,3,8,8] -> conv1+relu -> conv2 -> add(residual) -> a*sigmoid(a) -> maxpool -> globalavgpool
    -> transpose -> reshape -> matmul -> y[1,5]. Node names: conv1 relu1 conv2 add1 sig1 mul1 pool1
    gap1 transpose1 reshape1 mm1."""
    rng = np.random.default_rng(0)
    g = Graph(opset)
    x = g.input("x", [1, 3, 8, 8])
    b1 = g.const(rng.normal(0, .1, 8).astype(np.float32), "b1")
    c1 = g.node("Conv", [x, g.const(conv_weight(rng, 8, 3), "w1"), b1],
                name="conv1", pads=[1, 1, 1, 1], out="c1")
    r1 = g.node("Relu", [c1], name="relu1", out="r1")
    c2 = g.node("Conv", [r1, g.const(conv_weight(rng, 8, 8, std=0.2), "w2"),
                         g.const(rng.normal(0, .1, 8).astype(np.float32), "b2")], name="conv2", pads=[1, 1, 1, 1],
                out="c2")
    a1 = g.node("Add", [c2, r1], name="add1", out="a1")
    s1 = g.node("Sigmoid", [a1], name="sig1", out="s1")
    m1 = g.node("Mul", [a1, s1], name="mul1", out="m1")
    p1 = g.node("MaxPool", [m1], name="pool1", kernel_shape=[2, 2], strides=[2, 2], out="p1")
    g1 = g.node("GlobalAveragePool", [p1], name="gap1", out="g1")
    t1 = g.node("Transpose", [g1], name="transpose1", perm=[0, 2, 3, 1], out="t1")
    f1 = g.node("Reshape", [t1, g.const(np.array([1, 8], np.int64), "shape")], name="reshape1", out="f1")
    g.node("MatMul", [f1, g.const((rng.standard_normal((8, 5)) * 0.3).astype(np.float32), "wm")], name="mm1",
           out="y")
    return g.model("y")


def squeeze_excitation_model(average: str = "GlobalAveragePool") -> onnx.ModelProto:
    """x -> conv a -> hard-swish h -> (``average`` -> conv -> Relu -> conv -> HardSigmoid: gate) -> h * gate
    (node "scale") -> conv c -> y: a squeeze-excitation block as PP-LCNet writes it. ``average``
    "ReduceMean" averages over the spatial axes, "ReduceMean channels" over the channels (a spatial gate,
    not a squeeze-excitation), "Sigmoid" gates h by a function of itself (no average)."""
    rng = np.random.default_rng(3)
    g = Graph()
    x = g.input("x", [1, 4, 8, 8])
    a = g.node("Conv", [x, g.const(conv_weight(rng, 8, 4), "wa")], name="a", pads=[1, 1, 1, 1], out="a_out")
    h = g.node("HardSwish", [a], name="hswish", out="h_out")
    if average == "Sigmoid":
        gate = g.node("Sigmoid", [h], name="gate", out="gate_out")
    else:
        if average == "GlobalAveragePool":
            p = g.node("GlobalAveragePool", [h], name="pool", out="pool_out")
        else:
            axes = [2, 3] if average == "ReduceMean" else [1]
            p = g.node("ReduceMean", [h], name="pool", axes=axes, keepdims=1, out="pool_out")
        c_in = 8 if average != "ReduceMean channels" else 1
        s = g.node("Conv", [p, g.const(conv_weight(rng, 2, c_in, k=1), "ws1")], name="squeeze", out="s_out")
        r = g.node("Relu", [s], name="relu", out="r_out")
        e = g.node("Conv", [r, g.const(conv_weight(rng, 8, 2, k=1), "ws2")], name="excite", out="e_out")
        gate = g.node("HardSigmoid", [e], name="gate", alpha=1 / 6, beta=0.5, out="gate_out")
    m = g.node("Mul", [h, gate], name="scale", out="scaled")
    g.node("Conv", [m, g.const(conv_weight(rng, 4, 8), "wc")], name="c", pads=[1, 1, 1, 1], out="y")
    return g.model("y")


def samples(n: int, shape=(1, 3, 8, 8), seed: int = 1, scale: float = 1.0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape) * scale).astype(np.float32) for _ in range(n)]


def proto(model) -> onnx.ModelProto:
    return model if isinstance(model, onnx.ModelProto) else ir.to_proto(model)


def run_ort(model, feeds, *, optimize: bool = True) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(proto(model).SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def run_ref(model, feeds) -> list[np.ndarray]:
    return qnnx.ReferenceEvaluator(proto(model)).run(None, feeds)


def nodes_by_name(model) -> dict[str, ir.Node]:
    return {n.name: n for n in model.graph}


def qdq_of(model, value_name: str) -> tuple[ir.Node, ir.Node]:
    """The QuantizeLinear consuming ``value_name`` in a QDQ model, and its DequantizeLinear."""
    q = [n for n in model.graph if n.op_type == "QuantizeLinear" and n.inputs[0].name == value_name]
    assert len(q) == 1, f"{value_name}: {len(q)} QuantizeLinear"
    dq = [u.node for u in q[0].outputs[0].uses()]
    assert len(dq) == 1 and dq[0].op_type == "DequantizeLinear"
    return q[0], dq[0]


def qparams_of(node: ir.Node) -> tuple[np.ndarray, np.ndarray]:
    return node.inputs[1].const_value.numpy(), node.inputs[2].const_value.numpy()
