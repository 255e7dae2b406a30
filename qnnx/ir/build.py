"""Building nodes and constants into an onnx-ir graph with unique names."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import onnx_ir as ir


def _all_names(graph: ir.Graph) -> set[str]:
    names = {v.name for v in graph.inputs} | set(graph.initializers)
    for node in ir.traversal.RecursiveGraphIterator(graph):
        names.update(v.name for v in node.outputs if v.name)
        if node.name:
            names.add(node.name)
    return names


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The numpy value of an initializer or Constant-produced value, else None."""
    if value is None:
        return None
    if value.const_value is not None:
        return value.const_value.numpy()
    node = value.producer()
    if node is not None and node.op_type == "Constant" and node.domain == "" and "value" in node.attributes:
        return node.attributes["value"].as_tensor().numpy()
    return None


class Builder:
    """Creates nodes (kept in ``self.nodes`` for the caller to insert) and initializers
    (registered in the graph at once), naming everything ``<prefix>/<hint>`` uniquely."""

    def __init__(self, graph: ir.Graph, prefix: str = "qnnx"):
        self.graph = graph
        self.prefix = prefix or "qnnx"
        self.nodes: list[ir.Node] = []
        # One name set per graph, shared by every Builder of every pass (collecting it per
        # node made passes quadratic). Names only ever get added, so it never goes stale
        # for uniqueness purposes.
        if "qnnx.names" not in graph.meta:
            graph.meta["qnnx.names"] = _all_names(graph)
        self._taken = graph.meta["qnnx.names"]
        self._counter = itertools.count()

    def name(self, hint: str) -> str:
        base = f"{self.prefix}/{hint}"
        candidate = base
        while candidate in self._taken:
            candidate = f"{base}_{next(self._counter)}"
        self._taken.add(candidate)
        return candidate

    def const(self, array, hint: str, dtype: ir.DataType | None = None) -> ir.Value:
        arr = np.asarray(array)
        name = self.name(hint)
        tensor = ir.tensor(arr, dtype=dtype, name=name)
        value = ir.Value(name=name, type=ir.TensorType(tensor.dtype), shape=ir.Shape(arr.shape),
                         const_value=tensor)
        self.graph.register_initializer(value)
        return value

    def op(self, op_type: str, inputs, *, domain: str = "", outputs: int = 1, hint: str | None = None,
           **attributes: Any):
        attrs = ir.convenience.convert_attributes({k: v for k, v in attributes.items() if v is not None})
        node = ir.Node(domain, op_type, list(inputs), attrs, num_outputs=outputs,
                       name=self.name(hint or op_type))
        for i, out in enumerate(node.outputs):
            out.name = self.name(f"{hint or op_type}_out{i}" if outputs > 1 else (hint or op_type) + "_out")
        self.nodes.append(node)
        return node.outputs[0] if outputs == 1 else tuple(node.outputs)


def replace_value(graph: ir.Graph, old: ir.Value, new: ir.Value) -> None:
    """Every use of ``old`` moves to ``new``; a graph output keeps its name (``new`` takes it)."""
    if old.is_graph_output():
        name = old.name
        for idx, out in enumerate(list(graph.outputs)):
            if out is old:
                graph.outputs[idx] = new
        old.name = f"{name}_replaced"
        new.name = name
    ir.convenience.replace_all_uses_with(old, new, replace_graph_outputs=False)


def drop_unused_initializers(graph: ir.Graph) -> None:
    """Remove initializers nothing reads (graph inputs and outputs are kept)."""
    for name, init in list(graph.initializers.items()):
        if not init.uses() and not init.is_graph_output() and not init.is_graph_input():
            graph.initializers.pop(name)


def replace_node(graph: ir.Graph, node: ir.Node, new_nodes: list[ir.Node], new_values) -> None:
    """Put ``new_nodes`` where ``node`` was; its outputs' users (graph outputs included) move to
    ``new_values``, which take over the old names, types and shapes."""
    for old, new in zip(node.outputs, new_values):
        new.type = old.type if old.type is not None and old.dtype is not None else new.type
        new.shape = old.shape if old.shape is not None else new.shape
    graph.insert_before(node, new_nodes)
    ir.convenience.replace_all_uses_with(list(node.outputs), list(new_values), replace_graph_outputs=True)
    names = [o.name for o in node.outputs]
    graph.remove(node, safe=True)
    for new, name in zip(new_values, names):
        new.name = name
